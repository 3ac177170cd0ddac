//! The web console in a real browser: headless Chromium driven over WebDriver (chromedriver,
//! spoken to with plain HTTP and JSON), against the real binary. It runs a query and sees
//! its rows, opens the catalog and the live page, creates an alert, publishes data over
//! MQTT that trips it, sees it fire in the page and receives `$alerts/<name>` with an MQTT
//! client; with users, it logs in first. Screenshots go to `<target>/tmp/console/`.
//!
//! Needs Debian's `chromium` and `chromium-driver` (`scripts/test.sh` installs them).

mod common;

use common::Server;
use rumqttc::{AsyncClient, MqttOptions, QoS};
use serde_json::{Value, json};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The WebDriver key code of Enter and Control.
const ENTER: &str = "\u{E007}";
const CONTROL: &str = "\u{E009}";
/// The W3C name of an element reference in JSON.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

fn which(names: &[&str]) -> Option<PathBuf> {
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

fn screenshots() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("console");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A chromedriver process and one browser session.
struct Browser {
    driver: Child,
    base: String,
    http: reqwest::Client,
    _profile: tempfile::TempDir,
}

impl Browser {
    async fn start() -> Browser {
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
        let driver = Command::new(chromedriver)
            .arg(format!("--port={port}"))
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
    async fn call(&self, method: &str, path: &str, body: Value) -> Value {
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

    async fn go(&self, url: &str) {
        self.call("POST", "/url", json!({"url": url})).await;
    }

    /// Runs `script` (a function body) with `args`; its return value.
    async fn js(&self, script: &str, args: Value) -> Value {
        self.call(
            "POST",
            "/execute/sync",
            json!({"script": script, "args": args}),
        )
        .await
    }

    /// Waits until `script` returns something truthy; returns it.
    async fn until(&self, what: &str, script: &str) -> Value {
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

    async fn element(&self, css: &str) -> String {
        let v = self
            .call(
                "POST",
                "/element",
                json!({"using": "css selector", "value": css}),
            )
            .await;
        v[ELEMENT].as_str().expect("an element").to_string()
    }

    async fn click(&self, css: &str) {
        let e = self.element(css).await;
        self.call("POST", &format!("/element/{e}/click"), json!({}))
            .await;
    }

    async fn type_into(&self, css: &str, text: &str) {
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
    async fn set(&self, css: &str, value: Value) {
        self.js(
            "const e = document.querySelector(arguments[0]);
             if (e.type === 'checkbox') e.checked = arguments[1]; else e.value = arguments[1];
             e.dispatchEvent(new Event('input', {bubbles: true}));
             e.dispatchEvent(new Event('change', {bubbles: true}));",
            json!([css, value]),
        )
        .await;
    }

    async fn text(&self, css: &str) -> String {
        let v = self
            .js(
                "const e = document.querySelector(arguments[0]); return e ? e.innerText : null;",
                json!([css]),
            )
            .await;
        v.as_str().unwrap_or_default().to_string()
    }

    async fn screenshot(&self, name: &str) {
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
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

async fn end(b: Browser) {
    b.call("DELETE", "", Value::Null).await;
}

/// Runs `sql` in the SQL page's editor with Ctrl+Enter and waits for its row count.
async fn run_sql(b: &Browser, sql: &str) -> String {
    b.type_into("#sql-editor", sql).await;
    // Cleared first, so the wait below sees this statement's answer, not the last one's.
    b.js(
        "for (const id of ['#sql-row-count', '#sql-error']) {
           const e = document.querySelector(id); if (e) e.textContent = '';
         }",
        json!([]),
    )
    .await;
    b.call(
        "POST",
        "/actions",
        json!({"actions": [{"type": "key", "id": "kb", "actions": [
            {"type": "keyDown", "value": CONTROL},
            {"type": "keyDown", "value": ENTER},
            {"type": "keyUp", "value": ENTER},
            {"type": "keyUp", "value": CONTROL}
        ]}]}),
    )
    .await;
    b.until(
        "the result",
        "const c = document.querySelector('#sql-row-count');
         const err = document.querySelector('#sql-error');
         return (c && c.innerText.trim()) || (err && err.offsetParent !== null && err.innerText.trim());",
    )
    .await
    .as_str()
    .unwrap_or_default()
    .to_string()
}

fn now_text() -> String {
    chrono::Utc::now().format("%Y-%m-%d %H:%M:%S").to_string()
}

#[tokio::test(flavor = "multi_thread")]
async fn console_query_catalog_live_and_an_alert_that_fires() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), &[]);
    s.sql_ok(
        "CREATE TABLE plant.readings (ts TIMESTAMP, device STRING, temp DOUBLE) PARTITION BY ymdh(ts)",
    )
    .await;
    let now = now_text();
    let rows: String = (0..40)
        .map(|i| format!("{now},press-{},{}\n", i % 4, 20 + i % 7))
        .collect();
    s.write_ok("plant", "readings", "text/csv", rows).await;

    let b = Browser::start().await;
    b.go(&s.url("/")).await;
    b.until(
        "the SQL page",
        "return document.querySelector('#sql-editor')",
    )
    .await;

    // A query: its rows, their count and a bar chart of the grouped result.
    let count = run_sql(
        &b,
        "SELECT device, avg(temp) AS avg_temp, count(*) AS n\nFROM plant.readings\nGROUP BY device ORDER BY device",
    )
    .await;
    assert!(count.contains('4'), "row count: {count}");
    let table = b.text("#sql-results").await;
    for d in ["press-0", "press-3", "avg_temp"] {
        assert!(table.contains(d), "{d} missing from:\n{table}");
    }
    assert!(b.text("#sql-elapsed").await.contains("ms"));
    b.until(
        "the chart",
        "const c = document.querySelector('#sql-chart'); return c && c.offsetParent !== null && c.width > 0",
    )
    .await;
    b.screenshot("1-sql").await;

    // A mistake shows where it is.
    let error = run_sql(&b, "SELECT device FROM plant.readings WHERE PARTS 1..").await;
    assert!(error.to_lowercase().contains("column"), "error: {error}");
    b.screenshot("2-sql-error").await;

    // The catalog: the table, then its partitions.
    b.click("a[href='#/catalog']").await;
    b.until(
        "the table list",
        "return document.body.innerText.includes('readings')",
    )
    .await;
    b.click("[data-table='plant.readings']").await;
    b.until(
        "the partitions",
        "return document.body.innerText.includes('device') && /20\\d{8}/.test(document.body.innerText)",
    )
    .await;
    b.screenshot("3-catalog").await;

    // The live page fills in from the event stream.
    b.click("a[href='#/live']").await;
    b.until(
        "live rates (two events)",
        "const v = document.querySelector('#live-messages-in .tile-value');
         return v && /\\d/.test(v.innerText)",
    )
    .await;

    // An alert made in the page, tripped by a device over MQTT.
    let (_watcher, mut alerts) = s.subscriber("$alerts/#").await;
    b.screenshot("4-live").await;

    b.click("a[href='#/alerts']").await;
    b.until(
        "the alert form",
        "return document.querySelector('#alert-create')",
    )
    .await;
    b.type_into("#alert-name", "overheat").await;
    b.type_into(
        "#alert-query",
        "SELECT max(temp) AS t FROM plant.readings WHERE PARTS last",
    )
    .await;
    b.set("#alert-kind", json!("threshold")).await;
    b.type_into("#alert-column", "t").await;
    b.set("#alert-op", json!(">")).await;
    b.type_into("#alert-threshold", "90").await;
    b.type_into("#alert-interval", "1").await;
    b.set("#alert-publish", json!(true)).await;
    b.click("#alert-create").await;
    let state =
        "return (document.querySelector(\"tr[data-alert='overheat'] .state\") || {}).innerText";
    let ok = b
        .until("the alert to be ok", &format!("{state} === 'ok' && 'ok'"))
        .await;
    assert_eq!(ok, "ok");

    let mut o = MqttOptions::new("press-9", "127.0.0.1", s.mqtt_port());
    o.set_keep_alive(Duration::from_secs(30));
    let (device, mut el) = AsyncClient::new(o, 10);
    tokio::spawn(async move { while el.poll().await.is_ok() {} });
    device
        .publish(
            "/plant/readings",
            QoS::AtLeastOnce,
            false,
            format!(r#"{{"ts": "{now}", "device": "press-9", "temp": 97.25}}"#),
        )
        .await
        .unwrap();
    b.until("the alert to fire", &format!("{state} === 'firing'"))
        .await;
    assert!(b.text("tr[data-alert='overheat']").await.contains("97.25"));
    b.screenshot("5-alert-firing").await;
    let (topic, m) = tokio::time::timeout(Duration::from_secs(20), alerts.recv())
        .await
        .expect("the $alerts message")
        .unwrap();
    assert_eq!(topic, "$alerts/overheat");
    assert_eq!(
        (m["state"].as_str(), m["value"].as_f64()),
        (Some("firing"), Some(97.25))
    );
    end(b).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn console_asks_for_a_login_when_users_exist() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), &[]);
    s.sql_ok("CREATE USER ops WITH PASSWORD 'w4tch'").await;
    let b = Browser::start().await;
    b.go(&s.url("/")).await;
    b.until(
        "the login form",
        "return document.querySelector('#login-user')",
    )
    .await;
    b.screenshot("6-login").await;
    b.type_into("#login-user", "ops").await;
    b.type_into("#login-password", "wrong").await;
    b.click("#login-submit").await;
    b.until(
        "a refusal",
        "return document.body.innerText.toLowerCase().includes('wrong user or password')",
    )
    .await;
    b.type_into("#login-password", "w4tch").await;
    b.click("#login-submit").await;
    b.until(
        "the SQL page",
        "return document.querySelector('#sql-editor')",
    )
    .await;
    let count = run_sql(&b, "SHOW USERS").await;
    assert!(count.contains('1'), "{count}");
    assert!(b.text("#sql-results").await.contains("ops"));
    end(b).await;
}
