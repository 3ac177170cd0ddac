//! Alerts, the live stream and HTTP logins end to end: the real binary, SQL and the HTTP API,
//! an MQTT subscriber on `$alerts/#` and a webhook receiver on loopback.

mod common;

use common::{Server, eventually_eq};
use rumqttc::{AsyncClient, MqttOptions, QoS};
use std::time::Duration;
use tokio::sync::mpsc::{UnboundedReceiver, unbounded_channel};

async fn plant(s: &Server) {
    s.sql_ok(
        "CREATE TABLE plant.readings (ts TIMESTAMP, device STRING, temp DOUBLE) PARTITION BY ymdh(ts)",
    )
    .await;
}

fn now_iso() -> String {
    chrono::Utc::now().format("%Y-%m-%d %H:%M:%S").to_string()
}

async fn next<T>(rx: &mut UnboundedReceiver<T>, what: &str) -> T {
    tokio::time::timeout(Duration::from_secs(30), rx.recv())
        .await
        .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
        .unwrap()
}

/// A webhook receiver on loopback: each POST body, as JSON.
async fn webhook() -> (u16, UnboundedReceiver<serde_json::Value>) {
    let (tx, rx) = unbounded_channel();
    let app = axum::Router::new().route(
        "/hook",
        axum::routing::post(move |body: axum::body::Bytes| {
            let tx = tx.clone();
            async move {
                let _ = tx.send(serde_json::from_slice(&body).unwrap_or_default());
                axum::http::StatusCode::NO_CONTENT
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (port, rx)
}

async fn alert_field(s: &Server, name: &str, field: &str) -> serde_json::Value {
    let rows = s
        .rows(&format!(
            "SELECT {field} FROM system.alerts WHERE name = '{name}'"
        ))
        .await;
    rows.first().map(|r| r[field].clone()).unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread")]
async fn an_alert_fires_publishes_calls_its_webhook_and_reports_errors() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), &[]);
    plant(&s).await;
    let (port, mut hooks) = webhook().await;
    let (_sub, mut published) = s.subscriber("$alerts/#").await;
    s.sql_ok(&format!(
        "CREATE ALERT hot EVERY 200 ms WHEN t > 90 WEBHOOK 'http://127.0.0.1:{port}/hook' \
         AS SELECT max(temp) AS t FROM plant.readings WHERE PARTS last"
    ))
    .await;
    // No rows yet: max is NULL, which does not fire.
    eventually_eq("ok on an empty table", 20, &serde_json::json!("ok"), || {
        alert_field(&s, "hot", "state")
    })
    .await;
    let now = now_iso();
    s.write_ok("plant", "readings", "text/csv", format!("{now},d1,20.5\n"))
        .await;
    eventually_eq("the value is read", 20, &serde_json::json!(20.5), || {
        alert_field(&s, "hot", "last_value")
    })
    .await;
    assert_eq!(alert_field(&s, "hot", "state").await, "ok");

    // A device publishes over MQTT; the alert fires.
    let mut o = MqttOptions::new("device-1", "127.0.0.1", s.mqtt_port());
    o.set_keep_alive(Duration::from_secs(30));
    let (device, mut el) = AsyncClient::new(o, 10);
    device
        .publish(
            "/plant/readings",
            QoS::AtLeastOnce,
            false,
            format!(r#"{{"ts": "{now}", "device": "d2", "temp": 95.5}}"#),
        )
        .await
        .unwrap();
    tokio::spawn(async move { while el.poll().await.is_ok() {} });
    let (topic, m) = next(&mut published, "the firing message").await;
    assert_eq!(topic, "$alerts/hot");
    assert_eq!(m["alert"], "hot");
    assert_eq!(m["state"], "firing");
    assert_eq!(m["previous"], "ok");
    assert_eq!(m["value"], 95.5);
    assert_eq!(m["condition"], "t > 90");
    let hook = next(&mut hooks, "the webhook").await;
    assert_eq!(
        (hook["state"].clone(), hook["value"].clone()),
        (m["state"].clone(), m["value"].clone())
    );
    assert_eq!(alert_field(&s, "hot", "state").await, "firing");
    assert_eq!(alert_field(&s, "hot", "notifications").await, 1);

    // The table goes away: the alert is in error with the reason, and says so.
    s.sql_ok("DROP TABLE plant.readings").await;
    let (_, m) = next(&mut published, "the error message").await;
    assert_eq!(m["state"], "error");
    assert!(
        m["error"].as_str().unwrap().contains("does not exist"),
        "{m}"
    );
    let error = alert_field(&s, "hot", "error").await;
    assert!(
        error.as_str().unwrap().contains("plant.readings"),
        "{error}"
    );
    // The evaluator keeps going: the table comes back, the alert recovers.
    plant(&s).await;
    let (_, m) = next(&mut published, "the recovery").await;
    assert_eq!(
        (m["previous"].as_str(), m["state"].as_str()),
        (Some("error"), Some("ok"))
    );

    s.sql_ok("DROP ALERT hot").await;
    assert!(s.rows("SELECT * FROM system.alerts").await.is_empty());
    assert_eq!(s.sql("DROP ALERT hot").await.status, 404);
    s.sql_ok("DROP ALERT IF EXISTS hot").await;
}

/// `GET /v1/alerts`.
async fn list(s: &Server) -> serde_json::Value {
    let r = s.client().get(s.url("/v1/alerts")).send().await.unwrap();
    serde_json::from_str(&r.text().await.unwrap()).unwrap()
}

/// Waits until the first alert is in state `want`.
async fn first_state_becomes(s: &Server, want: &str, what: &str) {
    eventually_eq(what, 20, &serde_json::json!(want), || async {
        list(s).await[0]["state"].clone()
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_alerts_api_checks_definitions_and_alerts_outlive_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), &[]);
    plant(&s).await;
    let post = |body: serde_json::Value| {
        let r = (s.client().post(s.url("/v1/alerts")))
            .header("content-type", "application/json")
            .body(body.to_string())
            .send();
        async move {
            let r = r.await.unwrap();
            (r.status().as_u16(), r.text().await.unwrap())
        }
    };
    let cold = serde_json::json!({
        "name": "cold",
        "query": "SELECT * FROM plant.readings WHERE temp < 0",
        "condition": "any rows",
        "interval_ms": 200,
    });
    assert_eq!(post(cold.clone()).await.0, 201);
    let (status, body) = post(cold.clone()).await;
    assert_eq!(status, 409, "{body}");
    let mut bad = cold.clone();
    bad["name"] = "bad".into();
    bad["condition"] = "t >> 1".into();
    let (status, body) = post(bad.clone()).await;
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("Expected"), "{body}");
    bad["condition"] = "any rows".into();
    bad["query"] = "SELECT * FROM plant.nothing".into();
    let (status, body) = post(bad.clone()).await;
    assert_eq!(status, 404, "{body}");
    assert!(body.contains("plant.nothing"), "{body}");
    bad["query"] = "DROP TABLE plant.readings".into();
    assert_eq!(post(bad).await.0, 400);
    // SQL errors point at the token.
    let r = s.sql("CREATE ALERT x EVERY 1 s WHEN t > AS SELECT 1").await;
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(r.body.contains("Column"), "{}", r.body);

    let alerts = list(&s).await;
    assert_eq!(alerts[0]["name"], "cold");
    assert_eq!(alerts[0]["condition"], "any rows");
    first_state_becomes(&s, "ok", "evaluated").await;
    s.write_ok(
        "plant",
        "readings",
        "text/csv",
        format!("{},d1,-4\n", now_iso()),
    )
    .await;
    first_state_becomes(&s, "firing", "any rows fires").await;
    assert_eq!(list(&s).await[0]["last_value"], 1.0);

    // The definition is in the catalog and the state in alerts.json: still firing after a
    // restart.
    assert_eq!(s.terminate(), 0);
    let s = Server::start(dir.path(), &[]);
    first_state_becomes(&s, "firing", "firing again after restart").await;
    let delete = || async {
        let r = s.client().delete(s.url("/v1/alerts/cold")).send().await;
        r.unwrap().status().as_u16()
    };
    assert_eq!(delete().await, 204);
    assert_eq!(delete().await, 404);
    assert_eq!(list(&s).await, serde_json::json!([]));
}

/// `$ sluice hash-password` for `password`.
fn hash(password: &str) -> String {
    use std::io::Write;
    let mut hasher = std::process::Command::new(env!("CARGO_BIN_EXE_sluice"))
        .arg("hash-password")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = hasher.stdin.take().unwrap();
    writeln!(stdin, "{password}").unwrap();
    drop(stdin);
    let out = hasher.wait_with_output().unwrap();
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

#[tokio::test(flavor = "multi_thread")]
async fn with_users_the_http_api_wants_credentials() {
    let dir = tempfile::tempdir().unwrap();
    let config = format!(
        "[[user]]\nname = \"ops\"\npassword_hash = \"{}\"\n",
        hash("w4tch")
    );
    let s = Server::start_with_config(dir.path(), &config);
    let http = reqwest::Client::new();
    let json = |r: reqwest::Response| async move {
        serde_json::from_str::<serde_json::Value>(&r.text().await.unwrap()).unwrap()
    };
    // The console's page and the login endpoint are open; the API is not.
    let page = http.get(s.url("/")).send().await.unwrap();
    assert_eq!(page.status().as_u16(), 200);
    assert!(page.text().await.unwrap().contains("/assets/app.js"));
    let r = s.sql("SELECT 1").await;
    assert_eq!(r.status, 401, "{}", r.body);
    for path in ["/v1/alerts", "/v1/bridges", "/metrics", "/v1/live"] {
        let r = http.get(s.url(path)).send().await.unwrap();
        assert_eq!(r.status().as_u16(), 401, "{path}");
        assert!(r.headers().contains_key("www-authenticate"), "{path}");
    }
    let me = json(http.get(s.url("/v1/session")).send().await.unwrap()).await;
    assert_eq!(me, serde_json::json!({"auth_required": true, "user": null}));
    // HTTP Basic.
    s.login(Some(("ops", "nope")));
    assert_eq!(s.sql("SELECT 1").await.status, 401);
    s.login(Some(("ops", "w4tch")));
    s.sql_ok("SELECT 1").await;
    // The console's login: a cookie.
    let login = |password: &str| {
        http.post(s.url("/v1/session"))
            .header("content-type", "application/json")
            .body(serde_json::json!({"user": "ops", "password": password}).to_string())
            .send()
    };
    assert_eq!(login("nope").await.unwrap().status().as_u16(), 401);
    let r = login("w4tch").await.unwrap();
    assert_eq!(r.status().as_u16(), 204);
    let cookie = r.headers()["set-cookie"]
        .to_str()
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_string();
    assert!(cookie.starts_with("sluice_session="), "{cookie}");
    let with_cookie = |path: &str| {
        http.get(s.url(path))
            .header("cookie", cookie.clone())
            .send()
    };
    assert_eq!(
        with_cookie("/v1/alerts").await.unwrap().status().as_u16(),
        200
    );
    let me = json(with_cookie("/v1/session").await.unwrap()).await;
    assert_eq!(me["user"], "ops");
    let r = http
        .delete(s.url("/v1/session"))
        .header("cookie", cookie.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 204);
    assert_eq!(
        with_cookie("/v1/alerts").await.unwrap().status().as_u16(),
        401
    );
    // Another site's page cannot use credentials the browser remembers to change anything.
    let forged = http
        .post(s.url("/v1/sql"))
        .basic_auth("ops", Some("w4tch"))
        .header("sec-fetch-site", "cross-site")
        .body("DROP DATABASE plant")
        .send()
        .await
        .unwrap();
    assert_eq!(forged.status().as_u16(), 403);
    let read = http
        .get(s.url("/v1/alerts"))
        .basic_auth("ops", Some("w4tch"))
        .header("sec-fetch-site", "cross-site")
        .send()
        .await
        .unwrap();
    assert_eq!(read.status().as_u16(), 200);
}

#[tokio::test(flavor = "multi_thread")]
async fn the_live_stream_sends_figures_every_second() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), &[]);
    plant(&s).await;
    s.write_ok(
        "plant",
        "readings",
        "text/csv",
        format!("{},d1,1\n", now_iso()),
    )
    .await;
    let mut r = s.client().get(s.url("/v1/live")).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 200);
    assert!(
        r.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/event-stream")
    );
    let mut text = String::new();
    let mut events = Vec::new();
    while events.len() < 2 {
        let chunk = tokio::time::timeout(Duration::from_secs(10), r.chunk())
            .await
            .expect("an event within 10 s")
            .unwrap()
            .expect("the stream goes on");
        text.push_str(std::str::from_utf8(&chunk).unwrap());
        while let Some(end) = text.find("\n\n") {
            let event: String = text.drain(..end + 2).collect();
            if let Some(data) = event.lines().find_map(|l| l.strip_prefix("data:")) {
                events.push(serde_json::from_str::<serde_json::Value>(data.trim()).unwrap());
            }
        }
    }
    let e = &events[1];
    assert!(e["time_ms"].as_u64().unwrap() > events[0]["time_ms"].as_u64().unwrap());
    assert!(e["engine"]["applied_lsn"].as_u64().unwrap() >= 1, "{e}");
    assert_eq!(e["engine"]["buffered_rows"], 1, "{e}");
    assert_eq!(e["mqtt"]["connections"], 0, "{e}");
    assert!(e["mqtt"]["messages_in"].is_u64(), "{e}");
    assert_eq!(
        e["alerts"],
        serde_json::json!({"pending": 0, "ok": 0, "firing": 0, "error": 0})
    );
    assert_eq!(e["bridges"], serde_json::json!([]));
    // The server still stops cleanly with a stream open, and the stream ends.
    assert_eq!(s.terminate(), 0);
    let rest = tokio::time::timeout(Duration::from_secs(10), async {
        while let Ok(Some(_)) = r.chunk().await {}
    });
    assert!(rest.await.is_ok(), "the stream ended with the server");
}
