//! MQTT payload formats end to end: JSON mappings with `*`, InfluxDB line protocol, tables
//! created from the first JSON message; plus state that outlives a restart, the metrics, and
//! MQTT 5 flow control.

mod common;

use common::{Server, eventually};
use std::process::Command;

fn pub_msg(s: &Server, args: &[&str]) -> std::process::Output {
    s.mosquitto("mosquitto_pub", &[&["-q", "1"], args].concat())
}

fn publish(s: &Server, topic: &str, payload: &str) {
    let out = pub_msg(s, &["-t", topic, "-m", payload]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn json_mappings_flatten_one_array_into_rows() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), &[]);
    s.sql_ok("CREATE DATABASE iot").await;
    s.sql_ok(
        "CREATE TABLE iot.sensors (dev_id STRING, sensor_id INT, value DOUBLE, ts TIMESTAMP) \
         PARTITION BY yyyymmdd(ts) \
         WITH (json_mappings = 'sensor_id <- /data/*/0, value <- /data/*/1, ts <- /meta/time')",
    )
    .await;
    publish(
        &s,
        "/iot/sensors",
        r#"{"dev_id":"id-01","meta":{"time":"2026-11-21T08:00:00Z"},"data":[[1,25.1],[2,25.5],[3,25.9]]}"#,
    );
    assert_eq!(
        s.rows("SELECT dev_id, sensor_id, value, ts FROM iot.sensors ORDER BY sensor_id")
            .await,
        vec![
            serde_json::json!({"dev_id": "id-01", "sensor_id": 1, "value": 25.1, "ts": "2026-11-21T08:00:00"}),
            serde_json::json!({"dev_id": "id-01", "sensor_id": 2, "value": 25.5, "ts": "2026-11-21T08:00:00"}),
            serde_json::json!({"dev_id": "id-01", "sensor_id": 3, "value": 25.9, "ts": "2026-11-21T08:00:00"}),
        ]
    );
    // A mapping naming a column the table lacks is refused when it is set.
    let r = s
        .sql("ALTER TABLE iot.sensors SET (json_mappings = 'nope <- /a')")
        .await;
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(r.body.contains("nope"), "{}", r.body);
}

#[tokio::test(flavor = "multi_thread")]
async fn influx_line_protocol_is_stored() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), &[]);
    s.sql_ok("CREATE DATABASE iot").await;
    s.sql_ok("CREATE TABLE iot.cpu (ts TIMESTAMP, host STRING, usage DOUBLE, cores INT) PARTITION BY yyyymmdd(ts)")
        .await;
    publish(
        &s,
        "/iot/cpu",
        "cpu,host=a usage=0.5,cores=8i 1763712000000000000\ncpu,host=b usage=0.25,cores=4i 1763712001000000000",
    );
    assert_eq!(
        s.rows("SELECT ts, host, usage, cores FROM iot.cpu ORDER BY host")
            .await,
        vec![
            serde_json::json!({"ts": "2025-11-21T08:00:00", "host": "a", "usage": 0.5, "cores": 8}),
            serde_json::json!({"ts": "2025-11-21T08:00:01", "host": "b", "usage": 0.25, "cores": 4}),
        ]
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn the_first_json_message_creates_the_table_in_an_auto_create_database() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), &[("SLUICE_MQTT_AUTO_CREATE_DATABASES", "auto")]);
    s.sql_ok("CREATE DATABASE auto").await;
    s.sql_ok("CREATE DATABASE manual").await;
    publish(
        &s,
        "/auto/weather",
        r#"{"station":"s1","temp":21.5,"ok":true}"#,
    );
    publish(
        &s,
        "/auto/weather",
        r#"{"station":"s2","temp":19,"humidity":40}"#,
    );
    assert_eq!(
        s.rows("SELECT station, temp, ok, humidity FROM auto.weather ORDER BY station")
            .await,
        vec![
            serde_json::json!({"station": "s1", "temp": 21.5, "ok": true, "humidity": null}),
            serde_json::json!({"station": "s2", "temp": 19.0, "ok": null, "humidity": 40}),
        ]
    );
    // Arrival time filled the added time column.
    assert_eq!(
        s.count("SELECT count(*) FROM auto.weather WHERE ts > now() - INTERVAL '1 hour'")
            .await,
        2
    );
    // Elsewhere a topic without a table is plain publish/subscribe: nothing is created.
    publish(&s, "/manual/weather", r#"{"station":"s1"}"#);
    let r = s.sql("SELECT * FROM manual.weather").await;
    assert_eq!(r.status, 404, "{}", r.body);
}

/// Line protocol over MQTT in an auto-create database: each measurement is a table, made
/// from its first line and widened by new fields, as over InfluxDB's write API.
#[tokio::test(flavor = "multi_thread")]
async fn line_protocol_over_mqtt_makes_a_table_per_measurement() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), &[("SLUICE_MQTT_AUTO_CREATE_DATABASES", "auto")]);
    s.sql_ok("CREATE DATABASE auto").await;
    let first = "cpu,host=a usage=1.5 1700000000000000000\nmem,host=a free=10i 1700000000000000000";
    publish(&s, "/auto/telegraf", first);
    publish(
        &s,
        "/auto/telegraf",
        "cpu,host=b usage=2,temp=20.5 1700000001000000000",
    );
    assert_eq!(
        s.rows("SELECT CAST(time AS VARCHAR) AS t, host, usage, temp FROM auto.cpu ORDER BY host")
            .await,
        vec![
            serde_json::json!({"t": "2023-11-14T22:13:20", "host": "a", "usage": 1.5, "temp": null}),
            serde_json::json!({"t": "2023-11-14T22:13:21", "host": "b", "usage": 2.0, "temp": 20.5}),
        ]
    );
    assert_eq!(
        s.rows("SELECT host, free FROM auto.mem").await,
        vec![serde_json::json!({"host": "a", "free": 10})]
    );
    // A line that cannot be stored refuses its whole message (a dead letter).
    publish(
        &s,
        "/auto/telegraf",
        "cpu,host=c usage=3\ncpu,host=d usage=\"high\"",
    );
    let q = "SELECT count(*) FROM auto.cpu WHERE host IN ('c', 'd')";
    assert_eq!(s.count(q).await, 0);
    assert_eq!(s.count("SELECT count(*) FROM system.dead_letters").await, 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn sessions_and_retained_messages_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), &[]);
    // A persistent subscriber (clean session off) that goes away.
    let out = s.mosquitto(
        "mosquitto_sub",
        &["-i", "keeper", "-c", "-q", "1", "-t", "alerts/#", "-E"],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    publish(&s, "alerts/boiler", "hot");
    let out = pub_msg(&s, &["-t", "config/rate", "-r", "-m", "10s"]);
    assert!(out.status.success());
    assert_eq!(s.terminate(), 0);

    let s = Server::start(dir.path(), &[]);
    // The restored state, as SQL: the offline session with its queued message, its
    // subscription, the retained message.
    assert_eq!(
        s.rows("SELECT client_id, connected, node, subscriptions, queued, inflight FROM system.sessions")
            .await,
        vec![
            serde_json::json!({"client_id": "keeper", "connected": false, "node": null,
            "subscriptions": 1, "queued": 1, "inflight": 0})
        ]
    );
    assert_eq!(
        s.rows("SELECT client_id, filter, share_group, qos FROM system.subscriptions")
            .await,
        vec![
            serde_json::json!({"client_id": "keeper", "filter": "alerts/#",
            "share_group": null, "qos": 1})
        ]
    );
    assert_eq!(
        s.rows("SELECT topic, payload, bytes FROM system.retained WHERE topic NOT LIKE '$SYS/%'")
            .await,
        vec![serde_json::json!({"topic": "config/rate", "payload": "10s", "bytes": 3})]
    );
    // And in /metrics.
    let text = (s.client().get(s.url("/metrics")).send().await.unwrap())
        .text()
        .await
        .unwrap();
    for figure in [
        "sluice_mqtt_sessions 1",
        "sluice_mqtt_sessions_online 0",
        "sluice_mqtt_subscriptions 1",
        "sluice_mqtt_queued_messages 1",
    ] {
        assert!(text.contains(figure), "{figure} expected:\n{text}");
    }
    let out = s.mosquitto(
        "mosquitto_sub",
        &[
            "-i", "keeper", "-c", "-q", "1", "-t", "alerts/#", "-C", "1", "-W", "10", "-v",
        ],
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "alerts/boiler hot"
    );
    let out = s.mosquitto(
        "mosquitto_sub",
        &["-t", "config/#", "-C", "1", "-W", "10", "-v"],
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "config/rate 10s"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn metrics_on_http_and_as_sys_topics() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), &[]);
    s.sql_ok("CREATE TABLE m (ts TIMESTAMP, v DOUBLE) PARTITION BY ymdh(ts)")
        .await;
    // Two writes, three rows: two records made durable by the log.
    s.write_ok(
        "default",
        "m",
        "text/csv",
        "2026-01-01 00:00:00,1\n2026-01-01 00:00:01,2",
    )
    .await;
    s.write_ok("default", "m", "text/csv", "2026-01-01 00:00:02,3")
        .await;
    publish(&s, "plain/topic", "x");
    let text = s
        .client()
        .get(s.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        text.contains("sluice_mqtt_messages_received_total 1"),
        "{text}"
    );
    assert!(
        text.contains("sluice_mqtt_ack_latency_seconds_count 1"),
        "{text}"
    );
    // The engine's own figures: the log's appends and group commits, each synced (the
    // default durability), applied, and the rows waiting in buffers.
    let figure = |name: &str| -> u64 {
        (text.lines())
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or_else(|| panic!("no {name} in /metrics:\n{text}"))
    };
    assert_eq!(figure("sluice_wal_appends_total"), 2);
    let groups = figure("sluice_wal_group_records_count");
    assert!((1..=2).contains(&groups), "{groups} group commits");
    assert_eq!(
        figure("sluice_wal_group_records_bucket{le=\"+Inf\"}"),
        groups
    );
    assert_eq!(figure("sluice_wal_fsync_seconds_count"), groups);
    assert_eq!(figure("sluice_wal_apply_seconds_count"), groups);
    assert!(figure("sluice_wal_bytes_total") > 0);
    assert_eq!(figure("sluice_buffered_rows"), 3);
    assert!(figure("sluice_buffered_bytes") > 0);
    let mut got = String::new();
    eventually("$SYS/broker/messages_received_total", 30, || {
        let out = s.mosquitto(
            "mosquitto_sub",
            &[
                "-t",
                "$SYS/broker/messages_received_total",
                "-C",
                "1",
                "-W",
                "3",
            ],
        );
        got = String::from_utf8_lossy(&out.stdout).trim().to_string();
        // Published every 10 s: the first value may predate the message above.
        let ok = got.parse::<u64>().is_ok_and(|n| n >= 1);
        async move { ok }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn users_and_acl_rules() {
    use rumqttc::v5::mqttbytes::v5::{Packet as P5, PubAckReason, SubscribeReasonCode};
    use std::io::Write;
    let dir = tempfile::tempdir().unwrap();
    let mut hasher = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .arg("hash-password")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    hasher.stdin.take().unwrap().write_all(b"s3cret\n").unwrap();
    let out = hasher.wait_with_output().unwrap();
    let hash = String::from_utf8(out.stdout).unwrap().trim().to_string();
    assert!(hash.starts_with("$argon2id$"), "{hash}");
    let s = Server::start_with_config(
        dir.path(),
        &format!(
            r#"
[[user]]
name = "gw"
password_hash = "{hash}"

[[acl]]
user = "*"
action = "subscribe"
filter = "test/nosubscribe"
allow = false

[[acl]]
user = "*"
action = "publish"
filter = "locked/#"
allow = false

[[acl]]
user = "*"
action = "subscribe"
filter = "secret/#"
allow = false
"#
        ),
    );
    let sub = |extra: &[&str]| s.mosquitto("mosquitto_sub", &[&["-t", "x", "-E"], extra].concat());
    // No credentials, a wrong password: refused at CONNECT.
    assert!(!sub(&[]).status.success());
    assert!(!sub(&["-u", "gw", "-P", "wrong"]).status.success());
    assert!(sub(&["-u", "gw", "-P", "s3cret"]).status.success());

    let mut o = rumqttc::v5::MqttOptions::new("acl-5", "127.0.0.1", s.mqtt_port());
    o.set_credentials("gw", "s3cret");
    let (c, mut el) = rumqttc::v5::AsyncClient::new(o, 10);
    c.subscribe("test/nosubscribe", rumqttc::v5::mqttbytes::QoS::AtLeastOnce)
        .await
        .unwrap();
    c.publish(
        "locked/door",
        rumqttc::v5::mqttbytes::QoS::AtLeastOnce,
        false,
        "open",
    )
    .await
    .unwrap();
    let (mut suback, mut puback) = (None, None);
    while suback.is_none() || puback.is_none() {
        match el.poll().await.unwrap() {
            rumqttc::v5::Event::Incoming(P5::SubAck(a)) => suback = Some(a.return_codes),
            rumqttc::v5::Event::Incoming(P5::PubAck(a)) => puback = Some(a.reason),
            _ => {}
        }
    }
    assert_eq!(suback.unwrap(), vec![SubscribeReasonCode::NotAuthorized]);
    assert_eq!(puback.unwrap(), PubAckReason::NotAuthorized);
    s.login(Some(("gw", "s3cret")));
    assert_eq!(
        s.rows("SELECT topic, reason_code FROM system.dead_letters")
            .await,
        vec![serde_json::json!({"topic": "locked/door", "reason_code": 135})]
    );
    // 3.1.1: SUBACK 0x80.
    let out = s.mosquitto(
        "mosquitto_sub",
        &[
            "-u",
            "gw",
            "-P",
            "s3cret",
            "-t",
            "test/nosubscribe",
            "-E",
            "-d",
        ],
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("SUBACK") && text.contains("128"), "{text}");

    // Read rules hold per delivered message: `#` gets nothing under a denied `secret/#`,
    // neither retained nor live.
    let publish = |topic: &str, extra: &[&str]| {
        let args = [
            &[
                "-u", "gw", "-P", "s3cret", "-q", "1", "-t", topic, "-m", "m",
            ],
            extra,
        ];
        assert!(
            s.mosquitto("mosquitto_pub", &args.concat())
                .status
                .success()
        );
    };
    publish("secret/launch-codes", &["-r"]);
    publish("open/news", &["-r"]);
    c.subscribe("#", rumqttc::v5::mqttbytes::QoS::AtLeastOnce)
        .await
        .unwrap();
    let mut got = Vec::new();
    let mut subscribed = false;
    while !got.contains(&"open/live".to_string()) {
        match el.poll().await.unwrap() {
            rumqttc::v5::Event::Incoming(P5::SubAck(_)) if !subscribed => {
                subscribed = true;
                publish("secret/live", &[]);
                publish("open/live", &[]);
            }
            rumqttc::v5::Event::Incoming(P5::Publish(p)) => {
                got.push(String::from_utf8_lossy(&p.topic).to_string())
            }
            _ => {}
        }
    }
    got.sort();
    assert_eq!(got, vec!["open/live", "open/news"]);
    // Each refusal is counted: one publish, two subscriptions, two deliveries withheld.
    let metrics = s.authorized(s.client().get(s.url("/metrics")));
    let text = metrics.send().await.unwrap().text().await.unwrap();
    for (action, n) in [
        ("publish", 1),
        ("subscribe", 2),
        ("insert", 0),
        ("deliver", 2),
    ] {
        let line = format!("sluice_access_refusals_total{{action=\"{action}\"}} {n}");
        assert!(text.contains(&line), "{line} expected:\n{text}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn users_made_with_sql_log_in() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), &[]);
    let sub = |extra: &[&str]| {
        s.mosquitto("mosquitto_sub", &[&["-t", "x", "-E"], extra].concat())
            .status
            .success()
    };
    assert!(sub(&[]), "no users yet: anonymous is fine");
    s.sql_ok("CREATE USER sensor WITH PASSWORD 'pa55' ADMIN")
        .await;
    // With a user, HTTP wants credentials too: the same user.
    assert_eq!(s.sql("SHOW USERS").await.status, 401);
    s.login(Some(("sensor", "nope")));
    assert_eq!(s.sql("SHOW USERS").await.status, 401);
    s.login(Some(("sensor", "pa55")));
    assert_eq!(
        s.rows("SHOW USERS").await,
        vec![serde_json::json!({"user_name": "sensor", "admin": true})]
    );
    // The catalog keeps a hash, never the password.
    let catalog = std::fs::read_to_string(dir.path().join("data/catalog.json")).unwrap();
    assert!(catalog.contains("$argon2id$") && !catalog.contains("pa55"));
    assert!(!sub(&[]), "with a user, anonymous is refused");
    assert!(!sub(&["-u", "sensor", "-P", "nope"]));
    assert!(sub(&["-u", "sensor", "-P", "pa55"]));
    s.sql_ok("ALTER USER sensor PASSWORD 'n3w'").await;
    assert!(!sub(&["-u", "sensor", "-P", "pa55"]));
    assert!(sub(&["-u", "sensor", "-P", "n3w"]));
    // The old password, verified a moment ago, no longer opens HTTP either.
    assert_eq!(s.sql("SHOW USERS").await.status, 401);
    s.login(Some(("sensor", "n3w")));
    s.sql_ok("DROP USER sensor").await;
    assert!(sub(&[]));
    s.login(None);
    s.sql_ok("SHOW USERS").await;
}

/// MQTT 5 flow control (§4.9): a QoS 2 publish holds its receive-maximum slot until its
/// PUBCOMP, and a client that sends past the maximum is disconnected with 0x93.
#[tokio::test(flavor = "multi_thread")]
async fn qos2_holds_a_receive_maximum_slot_until_pubcomp() {
    use bytes::BytesMut;
    use rumqttc::v5::mqttbytes::QoS;
    use rumqttc::v5::mqttbytes::v5::{Packet, PubRel, PubRelReason, Publish};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), &[("SLUICE_MQTT_RECEIVE_MAXIMUM", "4")]);
    let mut raw = tokio::net::TcpStream::connect(&s.mqtt).await.unwrap();
    raw.write_all(&common::v5_connect("flow", None))
        .await
        .unwrap();
    let mut buf = BytesMut::new();
    // The next packet from the server (None once the connection is closed).
    async fn next(raw: &mut tokio::net::TcpStream, buf: &mut BytesMut) -> Option<Packet> {
        loop {
            if let Ok(p) = Packet::read(buf, None) {
                return Some(p);
            }
            if raw.read_buf(buf).await.ok()? == 0 {
                return None;
            }
        }
    }
    assert!(matches!(
        next(&mut raw, &mut buf).await,
        Some(Packet::ConnAck(_))
    ));
    let send = |pkid: u16| {
        let mut p = Publish::new("plain/flow", QoS::ExactlyOnce, "x", None);
        p.pkid = pkid;
        let mut out = BytesMut::new();
        Packet::Publish(p).write(&mut out, None).unwrap();
        out
    };
    // Four publishes and their PUBRELs: every slot comes back at its PUBCOMP.
    for pkid in 1..=4 {
        raw.write_all(&send(pkid)).await.unwrap();
        assert!(matches!(
            next(&mut raw, &mut buf).await,
            Some(Packet::PubRec(_))
        ));
    }
    for pkid in 1..=4 {
        let mut out = BytesMut::new();
        let rel = PubRel {
            pkid,
            reason: PubRelReason::Success,
            properties: None,
        };
        Packet::PubRel(rel).write(&mut out, None).unwrap();
        raw.write_all(&out).await.unwrap();
        assert!(matches!(
            next(&mut raw, &mut buf).await,
            Some(Packet::PubComp(_))
        ));
    }
    // Four more, never released, hold all four slots: a fifth is one too many.
    for pkid in 5..=8 {
        raw.write_all(&send(pkid)).await.unwrap();
        assert!(matches!(
            next(&mut raw, &mut buf).await,
            Some(Packet::PubRec(_))
        ));
    }
    // A resent one (same id, no PUBREL yet) takes no new slot: PUBREC again.
    raw.write_all(&send(8)).await.unwrap();
    assert!(matches!(
        next(&mut raw, &mut buf).await,
        Some(Packet::PubRec(_))
    ));
    raw.write_all(&send(9)).await.unwrap();
    match next(&mut raw, &mut buf).await {
        Some(Packet::Disconnect(d)) => assert_eq!(d.reason_code as u8, 0x93, "{d:?}"),
        other => panic!("DISCONNECT 0x93 expected, got {other:?}"),
    }
}

/// `mqtt.max_keep_alive`: an MQTT 5 client asking for more is told the server's keep-alive
/// in CONNACK; a 3.1.1 client (Mosquitto's tools) asking for more is refused.
#[tokio::test(flavor = "multi_thread")]
async fn max_keep_alive_is_told_or_enforced() {
    use bytes::BytesMut;
    use rumqttc::v5::mqttbytes::v5::{Connect, Packet};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), &[("SLUICE_MQTT_MAX_KEEP_ALIVE", "30")]);
    let mut raw = tokio::net::TcpStream::connect(&s.mqtt).await.unwrap();
    let mut out = BytesMut::new();
    let connect = Connect {
        keep_alive: 600,
        client_id: "ka".into(),
        clean_start: true,
        properties: None,
    };
    Packet::Connect(connect, None, None)
        .write(&mut out, None)
        .unwrap();
    raw.write_all(&out).await.unwrap();
    let mut buf = BytesMut::new();
    let connack = loop {
        if let Ok(p) = Packet::read(&mut buf, None) {
            break p;
        }
        assert!(raw.read_buf(&mut buf).await.unwrap() > 0, "closed");
    };
    let Packet::ConnAck(ack) = connack else {
        panic!("CONNACK expected: {connack:?}")
    };
    assert_eq!(ack.properties.and_then(|p| p.server_keep_alive), Some(30));
    let publish = |keep_alive: &str| {
        let args = ["-k", keep_alive, "-t", "ka/x", "-m", "1", "-q", "1"];
        s.mosquitto("mosquitto_pub", &args)
    };
    let refused = publish("120");
    assert!(
        !refused.status.success(),
        "a 3.1.1 keep-alive of 120 s was accepted"
    );
    let out = publish("20");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The retained messages `mosquitto_sub` gets on subscribing to `filter` (it stops after
/// `count`): (topic, payload as JSON), sorted by topic; each must carry the retain flag.
fn retained(s: &Server, filter: &str, count: usize) -> Vec<(String, serde_json::Value)> {
    let n = count.to_string();
    let out = s.mosquitto(
        "mosquitto_sub",
        &[
            "-t", filter, "-q", "1", "-C", &n, "-W", "10", "-F", "%r %t %p",
        ],
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let mut got: Vec<(String, serde_json::Value)> = (text.lines())
        .map(|l| {
            let mut parts = l.splitn(3, ' ');
            assert_eq!(parts.next(), Some("1"), "not flagged retained: {l}");
            let topic = parts.next().unwrap().to_string();
            (topic, serde_json::from_str(parts.next().unwrap()).unwrap())
        })
        .collect();
    got.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(got.len(), count, "{text}");
    got
}

#[tokio::test(flavor = "multi_thread")]
async fn retained_messages_of_a_table_topic_are_its_newest_rows() {
    let dir = tempfile::tempdir().unwrap();
    let config = "[[topic]]\nfilter = \"factory/+site/+device/telemetry\"\ntable = \"plant.telemetry\"\nformat = \"json\"\nretain = \"latest\"\n";
    let s = Server::start_with_config(dir.path(), config);
    s.sql_ok("CREATE DATABASE plant").await;
    s.sql_ok(
        "CREATE TABLE plant.telemetry (site STRING, device STRING, ts TIMESTAMP, temp DOUBLE, \
         note STRING) PARTITION BY yyyymmdd(ts) WITH (last_value_key = 'device')",
    )
    .await;
    let readings = [
        (
            "berlin/d1",
            r#"{"ts":"2026-11-21T10:00:00Z","temp":1.5}"#,
            false,
        ),
        // Late and out of order: older than d1's reading above, so not its newest.
        (
            "berlin/d1",
            r#"{"ts":"2026-11-21T09:00:00Z","temp":0.5}"#,
            true,
        ),
        (
            "berlin/d2",
            r#"{"ts":"2026-11-21T10:00:00Z","temp":2.5,"note":"x"}"#,
            true,
        ),
        (
            "hamburg/d3",
            r#"{"ts":"2026-11-21T11:00:00Z","temp":3.5}"#,
            false,
        ),
    ];
    for (at, payload, retain) in readings {
        let topic = format!("factory/{at}/telemetry");
        let mut args = vec!["-t", &topic, "-m", payload];
        if retain {
            args.push("-r");
        }
        let out = pub_msg(&s, &args);
        assert!(out.status.success());
    }
    let want = |t: &str, ts: &str, temp: f64| {
        let (ts, topic) = (
            format!("2026-11-21T{ts}:00"),
            format!("factory/{t}/telemetry"),
        );
        (topic, serde_json::json!({"ts": ts, "temp": temp}))
    };
    let mut all = vec![
        want("berlin/d1", "10:00", 1.5),
        want("berlin/d2", "10:00", 2.5),
        want("hamburg/d3", "11:00", 3.5),
    ];
    all[1].1["note"] = "x".into();
    assert_eq!(retained(&s, "factory/+/+/telemetry", 3), all);
    assert_eq!(retained(&s, "#", 3), all);
    assert_eq!(retained(&s, "factory/berlin/#", 2), all[..2]);
    assert_eq!(retained(&s, "factory/+/d3/telemetry", 1), all[2..]);
    // The broker keeps no copy of its own: the table is the store.
    assert_eq!(
        s.count("SELECT count(*) FROM system.retained WHERE topic LIKE 'factory/%'")
            .await,
        0
    );
    // A payload received republished to its topic is the same reading.
    publish(&s, &all[2].0, &all[2].1.to_string());
    assert_eq!(
        s.count("SELECT count(*) FROM plant.telemetry WHERE device = 'd3' AND temp = 3.5")
            .await,
        2
    );
    // Through a flush and a restart: the cache is made again from the table.
    s.sql_ok("FLUSH TABLE plant.telemetry").await;
    assert_eq!(retained(&s, "factory/+/+/telemetry", 3), all);
    assert_eq!(s.terminate(), 0);
    let s = Server::start_with_config(dir.path(), config);
    assert_eq!(retained(&s, "factory/+/+/telemetry", 3), all);
    // A newer reading is the new retained message at once.
    publish(
        &s,
        "factory/berlin/d1/telemetry",
        r#"{"ts":"2026-11-21T12:00:00Z","temp":9.5}"#,
    );
    all[0] = want("berlin/d1", "12:00", 9.5);
    assert_eq!(retained(&s, "factory/+/+/telemetry", 3), all);
}
