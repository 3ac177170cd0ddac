//! The web console in a real browser: headless Chromium driven over WebDriver (chromedriver,
//! spoken to with plain HTTP and JSON), against the real binary. It runs a query and sees
//! its rows, opens the catalog and the live page, creates an alert, publishes data over
//! MQTT that trips it, sees it fire in the page and receives `$alerts/<name>` with an MQTT
//! client; with users, it logs in first. Screenshots go to `<target>/tmp/console/`.
//!
//! Needs Debian's `chromium` and `chromium-driver` (`scripts/test.sh` installs them).

mod common;

use common::Server;
use common::browser::{Browser, end};
use rumqttc::{AsyncClient, MqttOptions, QoS};
use serde_json::json;
use std::time::Duration;

/// The WebDriver key code of Enter and Control.
const ENTER: &str = "\u{E007}";
const CONTROL: &str = "\u{E009}";

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
    s.sql_ok("CREATE USER ops WITH PASSWORD 'w4tch' ADMIN")
        .await;
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
