//! A headless Chromium driven over WebDriver (chromedriver, spoken to with plain HTTP and
//! JSON), for the console tests. Screenshots go to `<target>/tmp/console/`.

use serde_json::{Value, json};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The W3C name of an element reference in JSON.
pub const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

pub fn which(names: &[&str]) -> Option<PathBuf> {
    let path = std::env::var("PATH").unwrap_or_default();
    names.iter().find_map(|n| {
        let p = PathBuf::from(n);
        if p.is_absolute() {
            return p.exists().then_some(p);
        }
        std::env::split_paths(&path)
            .map(|d| d.join(n))
            .find(|p| p.exists())
    })
}

pub fn screenshots() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("console");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A chromedriver process and one browser session.
pub struct Browser {
    driver: Child,
    base: String,
    http: reqwest::Client,
    _profile: tempfile::TempDir,
}

impl Browser {
    pub async fn start() -> Browser {
        let chromedriver = which(&["chromedriver", "/usr/bin/chromedriver"]).expect(
            "chromedriver not found: install chromium and chromium-driver (scripts/test.sh does)",
        );
        let chromium = which(&["chromium", "/usr/bin/chromium", "chromium-browser"])
            .expect("chromium not found: install chromium (scripts/test.sh does)");
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        // Its own process group: the browsers it starts are in it too, so that dropping the
        // Browser (even when a test fails before ending the session) stops them all.
        let driver = Command::new(chromedriver)
            .arg(format!("--port={port}"))
            .process_group(0)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start chromedriver");
        let http = reqwest::Client::new();
        let base = format!("http://127.0.0.1:{port}");
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut poll = tokio::time::interval(Duration::from_millis(100));
        loop {
            poll.tick().await;
            if let Ok(r) = http.get(format!("{base}/status")).send().await
                && r.status().is_success()
            {
                break;
            }
            assert!(Instant::now() < deadline, "chromedriver did not start");
        }
        let profile = tempfile::tempdir().unwrap();
        let mut b = Browser {
            driver,
            base,
            http,
            _profile: profile,
        };
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": chromium,
                "args": [
                    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                    "--disable-quic", "--no-first-run", "--disable-background-networking",
                    "--disable-component-update", "--disable-sync", "--window-size=1400,1000",
                    format!("--user-data-dir={}", b._profile.path().display()),
                ]
            }
        }}});
        let r = b.call("POST", "/session", caps).await;
        let id = r["sessionId"].as_str().expect("a session id").to_string();
        b.base = format!("{}/session/{id}", b.base);
        b
    }

    /// One WebDriver command; its `value`. A WebDriver error fails the test with its message.
    pub async fn call(&self, method: &str, path: &str, body: Value) -> Value {
        let url = format!("{}{path}", self.base);
        let req = match method {
            "GET" => self.http.get(url),
            "DELETE" => self.http.delete(url),
            _ => self
                .http
                .post(url)
                .header("content-type", "application/json")
                .body(body.to_string()),
        };
        let text = req
            .send()
            .await
            .expect("webdriver request")
            .text()
            .await
            .unwrap();
        let v: Value = serde_json::from_str(&text).unwrap_or_else(|_| panic!("webdriver: {text}"));
        let value = v["value"].clone();
        if let Some(e) = value.get("error") {
            panic!("webdriver {method} {path}: {e}: {}", value["message"]);
        }
        value
    }

    pub async fn go(&self, url: &str) {
        self.call("POST", "/url", json!({"url": url})).await;
    }

    /// Runs `script` (a function body) with `args`; its return value.
    pub async fn js(&self, script: &str, args: Value) -> Value {
        self.call(
            "POST",
            "/execute/sync",
            json!({"script": script, "args": args}),
        )
        .await
    }

    /// Waits until `script` returns something truthy; returns it.
    pub async fn until(&self, what: &str, script: &str) -> Value {
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut poll = tokio::time::interval(Duration::from_millis(100));
        loop {
            poll.tick().await;
            let v = self.js(script, json!([])).await;
            if !(v.is_null() || v == false || v == "" || v == 0) {
                return v;
            }
            if Instant::now() > deadline {
                self.screenshot(&format!("timeout-{}", what.replace(' ', "-")))
                    .await;
                let body = self.js("return document.body.innerText", json!([])).await;
                panic!("timed out waiting for {what}; the page says:\n{body}");
            }
        }
    }

    pub async fn element(&self, css: &str) -> String {
        let v = self
            .call(
                "POST",
                "/element",
                json!({"using": "css selector", "value": css}),
            )
            .await;
        v[ELEMENT].as_str().expect("an element").to_string()
    }

    pub async fn click(&self, css: &str) {
        let e = self.element(css).await;
        self.call("POST", &format!("/element/{e}/click"), json!({}))
            .await;
    }

    pub async fn type_into(&self, css: &str, text: &str) {
        let e = self.element(css).await;
        self.call("POST", &format!("/element/{e}/clear"), json!({}))
            .await;
        self.call(
            "POST",
            &format!("/element/{e}/value"),
            json!({"text": text}),
        )
        .await;
    }

    /// Sets a form control's value the way a user's choice would (for selects and checkboxes).
    pub async fn set(&self, css: &str, value: Value) {
        self.js(
            "const e = document.querySelector(arguments[0]);
             if (e.type === 'checkbox') e.checked = arguments[1]; else e.value = arguments[1];
             e.dispatchEvent(new Event('input', {bubbles: true}));
             e.dispatchEvent(new Event('change', {bubbles: true}));",
            json!([css, value]),
        )
        .await;
    }

    pub async fn text(&self, css: &str) -> String {
        let v = self
            .js(
                "const e = document.querySelector(arguments[0]); return e ? e.innerText : null;",
                json!([css]),
            )
            .await;
        v.as_str().unwrap_or_default().to_string()
    }

    pub async fn screenshot(&self, name: &str) {
        use base64::Engine;
        let v = self.call("GET", "/screenshot", Value::Null).await;
        let png = base64::engine::general_purpose::STANDARD
            .decode(v.as_str().unwrap_or_default())
            .unwrap();
        std::fs::write(screenshots().join(format!("{name}.png")), png).unwrap();
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        // chromedriver, and every Chromium process it started (same process group).
        unsafe { libc::kill(-(self.driver.id() as i32), libc::SIGKILL) };
        let _ = self.driver.wait();
    }
}

pub async fn end(b: Browser) {
    b.call("DELETE", "", Value::Null).await;
}
