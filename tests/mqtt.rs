//! The broker end to end: the real binary, real MQTT clients (rumqttc 3.1.1 and 5.0,
//! mosquitto_pub/mosquitto_sub), rows checked over SQL.

mod common;

use common::{Server, eventually};
use rumqttc::{AsyncClient, Event, MqttOptions, Packet, QoS};
use std::collections::HashMap;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::sync::mpsc::{UnboundedReceiver, unbounded_channel};

/// A 3.1.1 client whose event loop runs on its own task, events forwarded to `events`.
struct V4 {
    client: AsyncClient,
    events: UnboundedReceiver<Event>,
    task: tokio::task::JoinHandle<()>,
}

fn v4_options(s: &Server, id: &str, clean: bool) -> MqttOptions {
    let mut o = MqttOptions::new(id, "127.0.0.1", s.mqtt_port());
    o.set_clean_session(clean);
    o.set_keep_alive(Duration::from_secs(30));
    o
}

async fn v4(opts: MqttOptions) -> V4 {
    let (client, mut el) = AsyncClient::new(opts, 1000);
    let (tx, events) = unbounded_channel();
    let task = tokio::spawn(async move {
        while let Ok(ev) = el.poll().await {
            if tx.send(ev).is_err() {
                break;
            }
        }
    });
    let mut c = V4 {
        client,
        events,
        task,
    };
    c.wait(|e| matches!(e, Event::Incoming(Packet::ConnAck(_))))
        .await;
    c
}

impl V4 {
    /// The next event satisfying `pred` (others are skipped), within 20 s.
    async fn wait(&mut self, mut pred: impl FnMut(&Event) -> bool) -> Event {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            let ev = tokio::time::timeout_at(deadline, self.events.recv())
                .await
                .expect("timed out waiting for an MQTT event")
                .expect("client event loop ended");
            if pred(&ev) {
                return ev;
            }
        }
    }

    /// Payloads of the next `n` PUBLISH packets received.
    async fn receive(&mut self, n: usize) -> Vec<(String, String)> {
        let mut out = Vec::new();
        while out.len() < n {
            if let Event::Incoming(Packet::Publish(p)) = self
                .wait(|e| matches!(e, Event::Incoming(Packet::Publish(_))))
                .await
            {
                out.push((p.topic, String::from_utf8_lossy(&p.payload).into_owned()));
            }
        }
        out
    }

    /// Publishes at QoS 1, not retained.
    async fn publish1(&self, topic: impl Into<String>, payload: impl Into<Vec<u8>>) {
        self.client
            .publish(topic, QoS::AtLeastOnce, false, payload)
            .await
            .unwrap();
    }

    async fn subscribe(&mut self, filter: &str, qos: QoS) {
        self.client.subscribe(filter, qos).await.unwrap();
        self.wait(|e| matches!(e, Event::Incoming(Packet::SubAck(_))))
            .await;
    }
}

async fn iot_table(s: &Server) {
    s.sql_ok("CREATE DATABASE iot").await;
    s.sql_ok(
        "CREATE TABLE iot.t (ts TIMESTAMP, dev STRING NOT NULL, v DOUBLE) PARTITION BY yyyymmdd(ts)",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn every_qos_is_stored_and_acked_only_when_durable() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), &[]);
    iot_table(&s).await;
    let mut c = v4(v4_options(&s, "dev-1", true)).await;
    for (i, qos) in [QoS::AtMostOnce, QoS::AtLeastOnce, QoS::ExactlyOnce]
        .into_iter()
        .enumerate()
    {
        for j in 0..10 {
            let body = format!(r#"{{"dev":"q{i}","v":{j}}}"#);
            c.client.publish("/iot/t", qos, false, body).await.unwrap();
        }
    }
    let (mut acks, mut comps) = (0, 0);
    while acks < 10 || comps < 10 {
        match c
            .wait(|e| {
                matches!(
                    e,
                    Event::Incoming(Packet::PubAck(_)) | Event::Incoming(Packet::PubComp(_))
                )
            })
            .await
        {
            Event::Incoming(Packet::PubAck(_)) => acks += 1,
            _ => comps += 1,
        }
    }
    // Acked means stored, and a client's messages are stored in order, so the QoS 0
    // messages sent before are there too: no waiting.
    let rows = s
        .rows("SELECT dev, count(*) AS n, sum(v) AS s FROM iot.t GROUP BY dev ORDER BY dev")
        .await;
    assert_eq!(
        rows,
        vec![
            serde_json::json!({"dev": "q0", "n": 10, "s": 45.0}),
            serde_json::json!({"dev": "q1", "n": 10, "s": 45.0}),
            serde_json::json!({"dev": "q2", "n": 10, "s": 45.0}),
        ]
    );
    // A row without a time got its arrival time.
    assert_eq!(
        s.count("SELECT count(*) FROM iot.t WHERE ts > now() - INTERVAL '1 hour'")
            .await,
        30
    );

    // MQTT 5 stores the same way; CSV payloads are sniffed.
    let mut o = rumqttc::v5::MqttOptions::new("dev-5", "127.0.0.1", s.mqtt_port());
    o.set_keep_alive(Duration::from_secs(30));
    let (c5, mut el) = rumqttc::v5::AsyncClient::new(o, 10);
    c5.publish(
        "/iot/t",
        rumqttc::v5::mqttbytes::QoS::AtLeastOnce,
        false,
        "2026-11-21T10:00:00Z,five,5.5",
    )
    .await
    .unwrap();
    loop {
        if let rumqttc::v5::Event::Incoming(rumqttc::v5::mqttbytes::v5::Packet::PubAck(a)) =
            el.poll().await.unwrap()
        {
            assert_eq!(a.reason, rumqttc::v5::mqttbytes::v5::PubAckReason::Success);
            break;
        }
    }
    assert_eq!(
        s.rows("SELECT ts, v FROM iot.t WHERE dev = 'five'").await,
        vec![serde_json::json!({"ts": "2026-11-21T10:00:00", "v": 5.5})]
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_bad_payload_gets_0x99_and_a_dead_letter() {
    use rumqttc::v5::mqttbytes::v5::{Packet as P5, PubAckReason};
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), &[]);
    iot_table(&s).await;
    let mut o = rumqttc::v5::MqttOptions::new("bad-5", "127.0.0.1", s.mqtt_port());
    o.set_keep_alive(Duration::from_secs(30));
    let (c5, mut el) = rumqttc::v5::AsyncClient::new(o, 10);
    c5.publish(
        "/iot/t",
        rumqttc::v5::mqttbytes::QoS::AtLeastOnce,
        false,
        r#"{"dev":"a","v":"warm"}"#,
    )
    .await
    .unwrap();
    let ack = loop {
        if let rumqttc::v5::Event::Incoming(P5::PubAck(a)) = el.poll().await.unwrap() {
            break a;
        }
    };
    assert_eq!(ack.reason, PubAckReason::PayloadFormatInvalid);
    let reason = ack
        .properties
        .and_then(|p| p.reason_string)
        .unwrap_or_default();
    assert!(reason.contains("'v'"), "{reason}");

    // 3.1.1 has no negative ack: the message is acked, logged and kept all the same.
    let mut c = v4(v4_options(&s, "bad-4", true)).await;
    c.publish1("/iot/t", "not,enough").await;
    c.wait(|e| matches!(e, Event::Incoming(Packet::PubAck(_))))
        .await;
    let letters = s
        .rows("SELECT client_id, topic, payload_text, reason_code FROM system.dead_letters ORDER BY time")
        .await;
    assert_eq!(
        letters,
        vec![
            serde_json::json!({"client_id": "bad-5", "topic": "/iot/t", "payload_text": r#"{"dev":"a","v":"warm"}"#, "reason_code": 153}),
            serde_json::json!({"client_id": "bad-4", "topic": "/iot/t", "payload_text": "not,enough", "reason_code": 153}),
        ]
    );
    assert_eq!(s.count("SELECT count(*) FROM iot.t").await, 0);
    // Dead letters are durable.
    let dir_path = s.dir.clone();
    s.kill9();
    let s = Server::start(&dir_path, &[]);
    assert_eq!(s.count("SELECT count(*) FROM system.dead_letters").await, 2);
    assert!(s.log_text().is_empty() || !s.log_text().contains("panicked"));
}

#[tokio::test(flavor = "multi_thread")]
async fn kill_9_during_qos1_ingest_loses_and_duplicates_no_acked_message() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), &[]);
    s.sql_ok(
        "CREATE TABLE k (ts TIMESTAMP, c INT NOT NULL, seq INT NOT NULL) PARTITION BY yyyymmdd(ts)",
    )
    .await;
    const CLIENTS: usize = 8;
    const PER_CLIENT: usize = 5_000;
    let acked: Vec<Arc<AtomicU64>> = (0..CLIENTS).map(|_| Arc::new(AtomicU64::new(0))).collect();
    let mut loops = Vec::new();
    for (c, count) in acked.iter().enumerate() {
        let mut o = v4_options(&s, &format!("k{c}"), true);
        o.set_inflight(64);
        let (client, mut el) = AsyncClient::new(o, 100);
        let count = count.clone();
        loops.push(tokio::spawn(async move {
            // Acks come in publish order, so the first `count` messages are the acked ones.
            while let Ok(ev) = el.poll().await {
                if let Event::Incoming(Packet::PubAck(_)) = ev {
                    count.fetch_add(1, Ordering::SeqCst);
                }
            }
        }));
        tokio::spawn(async move {
            for seq in 0..PER_CLIENT {
                let body = format!(r#"{{"c":{c},"seq":{seq}}}"#);
                if client
                    .publish("/default/k", QoS::AtLeastOnce, false, body)
                    .await
                    .is_err()
                {
                    break;
                }
            }
        });
    }
    let total = || acked.iter().map(|a| a.load(Ordering::SeqCst)).sum::<u64>();
    eventually("a few thousand acks", 120, || {
        let t = total();
        async move { t >= 3_000 }
    })
    .await;
    let dir_path = s.dir.clone();
    s.kill9();
    for l in loops {
        let _ = tokio::time::timeout(Duration::from_secs(30), l).await;
    }
    let acked: Vec<u64> = acked.iter().map(|a| a.load(Ordering::SeqCst)).collect();
    assert!(
        acked.iter().sum::<u64>() < (CLIENTS * PER_CLIENT) as u64,
        "killed too late"
    );

    let s = Server::start(&dir_path, &[]);
    let rows = s
        .rows("SELECT c, count(*) AS n, count(DISTINCT seq) AS d, max(seq) AS mx FROM k GROUP BY c ORDER BY c")
        .await;
    let by_client: HashMap<u64, (u64, u64)> = rows
        .iter()
        .map(|r| {
            (
                r["c"].as_u64().unwrap(),
                (r["n"].as_u64().unwrap(), r["d"].as_u64().unwrap()),
            )
        })
        .collect();
    for (c, &a) in acked.iter().enumerate() {
        let (n, d) = by_client.get(&(c as u64)).copied().unwrap_or((0, 0));
        assert_eq!(n, d, "client {c}: duplicated rows");
        let present = s
            .count(&format!(
                "SELECT count(*) FROM k WHERE c = {c} AND seq < {a}"
            ))
            .await;
        assert_eq!(
            present, a,
            "client {c}: {a} messages acked, {present} of them stored"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn retained_messages_and_clearing_them_with_mosquitto_clients() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), &[]);
    iot_table(&s).await;
    let publish = |args: &[&str]| {
        let out = s.mosquitto("mosquitto_pub", args);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let subscribe_one = |filter: &str| {
        let out = s.mosquitto("mosquitto_sub", &["-t", filter, "-C", "1", "-W", "2", "-v"]);
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    publish(&["-t", "site/a/status", "-r", "-m", "online"]);
    assert_eq!(subscribe_one("site/+/status"), "site/a/status online");
    // A retained message to a table topic is stored as a row and retained.
    publish(&[
        "-t",
        "/iot/t",
        "-r",
        "-q",
        "1",
        "-m",
        r#"{"dev":"r","v":1}"#,
    ]);
    assert_eq!(subscribe_one("/iot/#"), r#"/iot/t {"dev":"r","v":1}"#);
    assert_eq!(
        s.count("SELECT count(*) FROM iot.t WHERE dev = 'r'").await,
        1
    );
    // An empty retained payload clears it, on a table topic too (no row, no dead letter).
    publish(&["-t", "site/a/status", "-r", "-n"]);
    assert_eq!(subscribe_one("site/+/status"), "");
    publish(&["-V", "mqttv5", "-t", "/iot/t", "-r", "-q", "1", "-n"]);
    assert_eq!(subscribe_one("/iot/#"), "");
    assert_eq!(s.count("SELECT count(*) FROM iot.t").await, 1);
    assert_eq!(s.count("SELECT count(*) FROM system.dead_letters").await, 0);
    // `$` topics are not matched by a leading wildcard.
    publish(&["-t", "$internal/x", "-r", "-m", "hidden"]);
    assert_eq!(subscribe_one("#"), "");
    assert_eq!(subscribe_one("$internal/#"), "$internal/x hidden");
}

#[tokio::test(flavor = "multi_thread")]
async fn subscribers_receive_table_messages_as_stored_and_wills_on_abnormal_close() {
    let dir = tempfile::tempdir().unwrap();
    // Three connection threads: the subscriber, the devices and the probe are dealt to
    // different ones, so deliveries cross threads.
    let s = Server::start(dir.path(), &[("SLUICE_MQTT_THREADS", "3")]);
    iot_table(&s).await;
    let mut sub = v4(v4_options(&s, "watcher", true)).await;
    sub.subscribe("/iot/#", QoS::AtLeastOnce).await;
    sub.subscribe("status/#", QoS::AtLeastOnce).await;

    let mut o = v4_options(&s, "device-7", true);
    o.set_last_will(rumqttc::LastWill::new(
        "status/device-7",
        "gone",
        QoS::AtLeastOnce,
        false,
    ));
    let dev = v4(o).await;
    dev.publish1("/iot/t", r#"{"dev":"d7","v":7}"#).await;
    dev.publish1("/iot/t", r#"{"dev":"d7","v":"bad"}"#).await;
    assert_eq!(
        sub.receive(1).await,
        vec![("/iot/t".to_string(), r#"{"dev":"d7","v":7}"#.to_string())]
    );
    // Rows written over HTTP reach the table topic's subscribers too; refused ones do not.
    let rows = "{\"dev\":\"d9\",\"v\":9}\n{\"dev\":\"d9\",\"v\":10}";
    s.write_ok("iot", "t", "application/json", rows).await;
    assert_eq!(
        sub.receive(1).await,
        vec![("/iot/t".to_string(), rows.to_string())]
    );
    let r = s
        .write("iot", "t", "application/json", r#"{"v":"bad"}"#)
        .await;
    assert_eq!(r.status, 400, "{}", r.body);
    // The connection drops without DISCONNECT: the will goes out.
    dev.task.abort();
    drop(dev);
    // The refused message was not routed: the next message is the will.
    assert_eq!(
        sub.receive(1).await,
        vec![("status/device-7".to_string(), "gone".to_string())]
    );
    // A clean DISCONNECT sends no will.
    let mut o = v4_options(&s, "device-8", true);
    o.set_last_will(rumqttc::LastWill::new(
        "status/device-8",
        "gone",
        QoS::AtLeastOnce,
        false,
    ));
    let dev = v4(o).await;
    dev.client.disconnect().await.unwrap();
    let mut probe = v4(v4_options(&s, "probe", true)).await;
    probe
        .client
        .publish("status/probe", QoS::AtLeastOnce, false, "here")
        .await
        .unwrap();
    assert_eq!(
        sub.receive(1).await,
        vec![("status/probe".to_string(), "here".to_string())]
    );
    probe
        .wait(|e| matches!(e, Event::Incoming(Packet::PubAck(_))))
        .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_persistent_session_gets_what_was_published_while_it_was_away() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), &[]);
    let mut away = v4(v4_options(&s, "away", false)).await;
    away.subscribe("news/#", QoS::AtLeastOnce).await;
    away.client.disconnect().await.unwrap();
    let _ = away.task.await;

    let mut p = v4(v4_options(&s, "pub", true)).await;
    for i in 0..5 {
        p.publish1(format!("news/{i}"), format!("n{i}")).await;
    }
    for _ in 0..5 {
        p.wait(|e| matches!(e, Event::Incoming(Packet::PubAck(_))))
            .await;
    }
    let mut back = v4(v4_options(&s, "away", false)).await;
    let got = back.receive(5).await;
    let payloads: Vec<&str> = got.iter().map(|(_, p)| p.as_str()).collect();
    assert_eq!(payloads, vec!["n0", "n1", "n2", "n3", "n4"]);

    // A clean session starts empty.
    back.client.disconnect().await.unwrap();
    let _ = back.task.await;
    p.publish1("news/x", "late").await;
    p.wait(|e| matches!(e, Event::Incoming(Packet::PubAck(_))))
        .await;
    let mut clean = v4(v4_options(&s, "away", true)).await;
    clean.subscribe("probe", QoS::AtLeastOnce).await;
    p.publish1("probe", "p").await;
    assert_eq!(
        clean.receive(1).await,
        vec![("probe".to_string(), "p".to_string())]
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_shared_subscription_gives_each_message_to_one_member() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), &[]);
    let mut a = v4(v4_options(&s, "worker-a", true)).await;
    let mut b = v4(v4_options(&s, "worker-b", true)).await;
    a.subscribe("$share/workers/jobs/+", QoS::AtLeastOnce).await;
    b.subscribe("$share/workers/jobs/+", QoS::AtLeastOnce).await;
    let p = v4(v4_options(&s, "boss", true)).await;
    for i in 0..20 {
        p.publish1(format!("jobs/{i}"), format!("{i}")).await;
    }
    let (mut got_a, mut got_b) = (Vec::new(), Vec::new());
    let all_arrived = async {
        while got_a.len() + got_b.len() < 20 {
            tokio::select! {
                Some(e) = a.events.recv() => if let Event::Incoming(Packet::Publish(m)) = e {
                    got_a.push(m.topic)
                },
                Some(e) = b.events.recv() => if let Event::Incoming(Packet::Publish(m)) = e {
                    got_b.push(m.topic)
                },
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(20), all_arrived)
        .await
        .expect("all 20 jobs within 20 s");
    assert!(
        !got_a.is_empty() && !got_b.is_empty(),
        "a: {got_a:?}, b: {got_b:?}"
    );
    let mut all: Vec<String> = got_a.into_iter().chain(got_b).collect();
    all.sort();
    all.dedup();
    assert_eq!(all.len(), 20);
}

#[tokio::test(flavor = "multi_thread")]
async fn topic_rules_fill_columns_from_named_wildcards() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start_with_config(
        dir.path(),
        "[[topic]]\nfilter = \"factory/+site/+device/telemetry\"\ntable = \"plant.telemetry\"\nformat = \"json\"\n",
    );
    s.sql_ok("CREATE DATABASE plant").await;
    s.sql_ok("CREATE TABLE plant.telemetry (site STRING, device STRING, ts TIMESTAMP, temp DOUBLE) PARTITION BY yyyymmdd(ts)")
        .await;
    let mut c = v4(v4_options(&s, "gw", true)).await;
    c.publish1("factory/berlin/press-3/telemetry", r#"{"temp":71.5}"#)
        .await;
    c.wait(|e| matches!(e, Event::Incoming(Packet::PubAck(_))))
        .await;
    assert_eq!(
        s.rows("SELECT site, device, temp FROM plant.telemetry")
            .await,
        vec![serde_json::json!({"site": "berlin", "device": "press-3", "temp": 71.5})]
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_malformed_packet_closes_only_its_connection() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), &[("SLUICE_MQTT_MAX_PACKET_SIZE", "4096")]);
    let mut good = v4(v4_options(&s, "good", true)).await;
    good.subscribe("t", QoS::AtLeastOnce).await;

    // MQTT 5 CONNECT, then a PUBLISH whose topic length runs past the packet.
    let mut raw = tokio::net::TcpStream::connect(&s.mqtt).await.unwrap();
    let connect = common::v5_connect("raw", None);
    raw.write_all(&connect).await.unwrap();
    let mut buf = vec![0u8; 256];
    let n = raw.read(&mut buf).await.unwrap();
    assert_eq!(buf[0], 0x20, "CONNACK expected, got {:?}", &buf[..n]);
    raw.write_all(&[0x30, 0x04, 0x00, 0x09, b'a', b'b'])
        .await
        .unwrap();
    let mut rest = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), raw.read_to_end(&mut rest)).await;
    assert_eq!(
        rest.first(),
        Some(&0xE0),
        "DISCONNECT expected, got {rest:?}"
    );
    assert!(
        rest.contains(&0x81),
        "reason 0x81 malformed packet expected: {rest:?}"
    );

    // Too large for mqtt.max_packet_size: DISCONNECT 0x95.
    let mut raw = tokio::net::TcpStream::connect(&s.mqtt).await.unwrap();
    raw.write_all(&connect).await.unwrap();
    let _ = raw.read(&mut buf).await.unwrap();
    let mut big = bytes::BytesMut::new();
    rumqttc::v5::mqttbytes::v5::Packet::Publish(rumqttc::v5::mqttbytes::v5::Publish::new(
        "t",
        rumqttc::v5::mqttbytes::QoS::AtMostOnce,
        vec![b'x'; 10_000],
        None,
    ))
    .write(&mut big, None)
    .unwrap();
    let _ = raw.write_all(&big).await;
    let mut rest = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), raw.read_to_end(&mut rest)).await;
    assert!(
        rest.first() == Some(&0xE0) && rest.contains(&0x95),
        "{rest:?}"
    );

    // CONNECT with its reserved flag set [MQTT-3.1.2-3]: closed, no CONNACK.
    let mut raw = tokio::net::TcpStream::connect(&s.mqtt).await.unwrap();
    let mut bad = connect.clone();
    bad[9] |= 1; // after 0x10, the length, "\0\x04MQTT" and the level: the flags
    raw.write_all(&bad).await.unwrap();
    let mut rest = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), raw.read_to_end(&mut rest)).await;
    assert!(rest.is_empty(), "closed without CONNACK expected: {rest:?}");

    // SUBSCRIBE with header flags 0b0000 instead of 0b0010 [MQTT-3.8.1-1]: DISCONNECT 0x81.
    let mut raw = tokio::net::TcpStream::connect(&s.mqtt).await.unwrap();
    raw.write_all(&connect).await.unwrap();
    let _ = raw.read(&mut buf).await.unwrap();
    let subscribe = [0x80, 0x07, 0x00, 0x01, 0x00, 0x00, 0x01, b't', 0x01];
    raw.write_all(&subscribe).await.unwrap();
    let mut rest = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), raw.read_to_end(&mut rest)).await;
    assert!(
        rest.starts_with(&[0xE0]) && rest.contains(&0x81),
        "{rest:?}"
    );

    // The other connection is untouched.
    good.publish1("t", "still here").await;
    assert_eq!(
        good.receive(1).await,
        vec![("t".to_string(), "still here".to_string())]
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn mqtt_over_tls_with_mosquitto_clients() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    let out = Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "2",
            "-subj",
            "/CN=localhost",
        ])
        .args([
            "-addext",
            "subjectAltName=DNS:localhost,IP:127.0.0.1",
            "-keyout",
        ])
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .output()
        .expect("openssl");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (c, k) = (cert.to_str().unwrap(), key.to_str().unwrap());
    let s = Server::start(
        dir.path(),
        &[
            ("SLUICE_MQTT_TLS_LISTEN", "127.0.0.1:0"),
            ("SLUICE_MQTT_TLS_CERT", c),
            ("SLUICE_MQTT_TLS_KEY", k),
        ],
    );
    let port = s.tls_port().expect("an mqtts line on stdout").to_string();
    iot_table(&s).await;
    let out = Command::new("mosquitto_pub")
        .args([
            "-h",
            "localhost",
            "-p",
            &port,
            "--cafile",
            c,
            "-q",
            "1",
            "-t",
            "/iot/t",
            "-m",
            r#"{"dev":"tls","v":1}"#,
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        s.count("SELECT count(*) FROM iot.t WHERE dev = 'tls'")
            .await,
        1
    );
    // A plain-text client on the TLS port fails its handshake and nothing else happens.
    let out = Command::new("mosquitto_pub")
        .args([
            "-h",
            "127.0.0.1",
            "-p",
            &port,
            "-q",
            "1",
            "-t",
            "/iot/t",
            "-m",
            "x",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert_eq!(s.count("SELECT count(*) FROM system.dead_letters").await, 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn mqtt_over_websocket_on_the_http_port() {
    use rumqttc::mqttbytes::v4;
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), &[]);
    iot_table(&s).await;
    let mut req = format!("ws://{}/mqtt", s.addr)
        .into_client_request()
        .unwrap();
    req.headers_mut()
        .insert("sec-websocket-protocol", "mqtt".parse().unwrap());
    let (mut ws, resp) = tokio_tungstenite::connect_async(req)
        .await
        .expect("websocket upgrade");
    assert_eq!(resp.headers()["sec-websocket-protocol"], "mqtt");
    let payload = r#"{"dev":"ws","v":2}"#;
    let packets = common::publish_over_websocket(&mut ws, None, "/iot/t", payload).await;
    assert!(matches!(packets[0], v4::Packet::ConnAck(_)), "{packets:?}");
    assert_eq!(packets[1], v4::Packet::PubAck(v4::PubAck { pkid: 7 }));
    assert_eq!(
        s.count("SELECT count(*) FROM iot.t WHERE dev = 'ws'").await,
        1
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn exceeding_the_receive_maximum_gets_0x93() {
    use rumqttc::v5::mqttbytes::v5::{Packet as P5, Publish};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), &[("SLUICE_MQTT_RECEIVE_MAXIMUM", "2")]);
    iot_table(&s).await;
    let mut raw = tokio::net::TcpStream::connect(&s.mqtt).await.unwrap();
    let mut out = common::v5_connect("greedy", None);
    // Three QoS 1 messages in one write: the third is over the announced maximum of 2.
    for pkid in 1..=3 {
        let mut p = Publish::new(
            "/iot/t",
            rumqttc::v5::mqttbytes::QoS::AtLeastOnce,
            r#"{"dev":"g","v":1}"#,
            None,
        );
        p.pkid = pkid;
        P5::Publish(p).write(&mut out, None).unwrap();
    }
    raw.write_all(&out).await.unwrap();
    let mut got = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), raw.read_to_end(&mut got)).await;
    // The connection ends with DISCONNECT (0xE0) reason 0x93.
    assert!(
        got.windows(3).any(|w| w[0] == 0xE0 && w[2] == 0x93),
        "{got:02x?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn disconnect_with_will_message_publishes_the_will() {
    use rumqttc::v5::mqttbytes::v5::LastWill;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), &[]);
    let mut sub = v4(v4_options(&s, "listener", true)).await;
    sub.subscribe("wills/#", QoS::AtLeastOnce).await;
    let mut raw = tokio::net::TcpStream::connect(&s.mqtt).await.unwrap();
    let will = LastWill::new(
        "wills/a",
        "bye",
        rumqttc::v5::mqttbytes::QoS::AtLeastOnce,
        false,
        None,
    );
    let out = common::v5_connect("leaver", Some(will));
    raw.write_all(&out).await.unwrap();
    let mut buf = [0u8; 64];
    let _ = raw.read(&mut buf).await.unwrap();
    // DISCONNECT, reason 0x04 "disconnect with will message", no properties.
    raw.write_all(&[0xE0, 0x01, 0x04]).await.unwrap();
    assert_eq!(
        sub.receive(1).await,
        vec![("wills/a".to_string(), "bye".to_string())]
    );
}
