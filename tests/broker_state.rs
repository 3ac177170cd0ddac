//! The broker's own state survives `kill -9`: sessions, their subscriptions and queued
//! messages, messages in flight (sent again with DUP, in order) and QoS 2 exactly once.
//! A PUBACK promises delivery to every lasting session subscribed at that moment.
//!
//! The subscribers here speak MQTT 3.1.1 over a raw socket with rumqttc's codec, as a
//! careful client does (QoS 2 "method B": a packet id is remembered from PUBLISH to PUBREL,
//! across reconnections, and a PUBREL is always answered): rumqttc's own client forgets its
//! QoS 2 ids on reconnecting and refuses a PUBREL it no longer knows.

mod common;

use bytes::BytesMut;
use common::{Server, eventually};
use rumqttc::mqttbytes::QoS;
use rumqttc::mqttbytes::v4::{
    Connect, LastWill, Packet, PubAck, PubComp, PubRec, Subscribe, SubscribeFilter,
};
use rumqttc::{AsyncClient, Event, MqttOptions};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A raw MQTT 3.1.1 client on one connection.
struct Raw {
    stream: TcpStream,
    buf: BytesMut,
}

impl Raw {
    /// Connects as `id` with a lasting session (clean session off); returns whether the
    /// server had the session.
    async fn connect(server: &Server, id: &str) -> (Raw, bool) {
        Self::connect_with_will(server, id, None).await
    }

    async fn connect_with_will(server: &Server, id: &str, will: Option<LastWill>) -> (Raw, bool) {
        let stream = TcpStream::connect(&server.mqtt).await.unwrap();
        let mut raw = Raw {
            stream,
            buf: BytesMut::new(),
        };
        let mut c = Connect::new(id);
        c.clean_session = false;
        c.keep_alive = 60;
        c.last_will = will;
        raw.send(Packet::Connect(c)).await;
        match raw.next().await {
            Some(Packet::ConnAck(a)) => (raw, a.session_present),
            other => panic!("no CONNACK: {other:?}"),
        }
    }

    async fn send(&mut self, p: Packet) {
        let mut out = BytesMut::new();
        p.write(&mut out, 1 << 20).unwrap();
        self.stream.write_all(&out).await.unwrap();
    }

    /// The next packet, or `None` when the connection ends.
    async fn next(&mut self) -> Option<Packet> {
        loop {
            match Packet::read(&mut self.buf, 1 << 20) {
                Ok(p) => return Some(p),
                Err(rumqttc::mqttbytes::Error::InsufficientBytes(_)) => {}
                Err(e) => panic!("bad packet from the server: {e}"),
            }
            match self.stream.read_buf(&mut self.buf).await {
                Ok(0) | Err(_) => return None,
                Ok(_) => {}
            }
        }
    }

    async fn subscribe(&mut self, filter: &str, qos: QoS) {
        let mut s = Subscribe::new_many([SubscribeFilter::new(filter.into(), qos)]);
        s.pkid = 1;
        self.send(Packet::Subscribe(s)).await;
        match self.next().await {
            Some(Packet::SubAck(_)) => {}
            other => panic!("no SUBACK: {other:?}"),
        }
    }
}

/// What a subscriber received, kept across its connections.
#[derive(Default)]
struct Received {
    /// Times each sequence number was handed to the application.
    seqs: HashMap<u64, u32>,
    /// QoS 2 packet ids received and not yet released (PUBLISH with one of them is a DUP).
    unreleased: HashSet<u16>,
    /// (sequence, dup flag) in arrival order, every PUBLISH.
    arrivals: Vec<(u64, bool)>,
}

fn seq_of(payload: &[u8]) -> u64 {
    let v: serde_json::Value = serde_json::from_slice(payload).unwrap();
    v["seq"].as_u64().unwrap()
}

impl Received {
    /// Reads until `done` holds or the connection ends or `secs` pass, acknowledging as
    /// a correct client does unless `ack` is false.
    async fn read(&mut self, raw: &mut Raw, ack: bool, secs: u64, done: impl Fn(&Self) -> bool) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
        while !done(self) {
            let Ok(Some(p)) = tokio::time::timeout_at(deadline, raw.next()).await else {
                return;
            };
            match p {
                Packet::Publish(p) => {
                    let seq = seq_of(&p.payload);
                    self.arrivals.push((seq, p.dup));
                    let fresh = p.qos != QoS::ExactlyOnce || self.unreleased.insert(p.pkid);
                    if fresh {
                        *self.seqs.entry(seq).or_default() += 1;
                    }
                    if !ack {
                        continue;
                    }
                    match p.qos {
                        QoS::AtLeastOnce => raw.send(Packet::PubAck(PubAck::new(p.pkid))).await,
                        QoS::ExactlyOnce => raw.send(Packet::PubRec(PubRec::new(p.pkid))).await,
                        QoS::AtMostOnce => {}
                    }
                }
                Packet::PubRel(r) => {
                    self.unreleased.remove(&r.pkid);
                    raw.send(Packet::PubComp(PubComp::new(r.pkid))).await;
                }
                _ => {}
            }
        }
    }
}

/// A lasting session subscribed to `filter`, then gone.
async fn subscribe_and_leave(s: &Server, id: &str, filter: &str, qos: QoS) {
    let (mut raw, _) = Raw::connect(s, id).await;
    raw.subscribe(filter, qos).await;
    raw.send(Packet::Disconnect).await;
}

/// Publishes messages `{"seq": i}` for each `i` of `seqs` to each topic at `qos` with 64 in
/// flight; returns the number acknowledged (PUBACK, or PUBREC for QoS 2: stored), which are
/// the first ones. Stops when the server goes away.
fn publisher(
    s: &Server,
    id: &str,
    topics: &[&str],
    seqs: std::ops::Range<u64>,
    qos: rumqttc::QoS,
) -> (Arc<AtomicU64>, tokio::task::JoinHandle<()>) {
    let mut o = MqttOptions::new(id, "127.0.0.1", s.mqtt_port());
    o.set_inflight(64);
    o.set_keep_alive(Duration::from_secs(30));
    let (client, mut el) = AsyncClient::new(o, 100);
    let acked = Arc::new(AtomicU64::new(0));
    let count = acked.clone();
    let topics: Vec<String> = topics.iter().map(|t| t.to_string()).collect();
    tokio::spawn(async move {
        for seq in seqs {
            for t in &topics {
                let body = format!(r#"{{"seq":{seq}}}"#);
                if client.publish(t, qos, false, body).await.is_err() {
                    return;
                }
            }
        }
    });
    let events = tokio::spawn(async move {
        while let Ok(ev) = el.poll().await {
            if let Event::Incoming(rumqttc::Packet::PubAck(_) | rumqttc::Packet::PubRec(_)) = ev {
                count.fetch_add(1, Ordering::SeqCst);
            }
        }
    });
    (acked, events)
}

/// Publishes `seqs` at QoS 1 to a plain topic and a table's and waits for every PUBACK.
async fn publish_all(s: &Server, seqs: std::ops::Range<u64>) {
    let want = 2 * (seqs.end - seqs.start);
    let (acked, events) = publisher(
        s,
        "pub",
        &["plain/a", "/default/r"],
        seqs,
        rumqttc::QoS::AtLeastOnce,
    );
    eventually("every message acknowledged", 120, || {
        let a = acked.load(Ordering::SeqCst);
        async move { a == want }
    })
    .await;
    events.abort();
}

/// The offline-session probe: QoS 1 messages to a plain topic and to a table's, all
/// PUBACKed; half before a clean restart (so a snapshot holds them, each message once for
/// the sessions), half after it and then `kill -9` at once (so the journal holds them).
/// After the restart each lasting session gets all of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn offline_sessions_get_every_acked_message_after_kill_9() {
    const N: u64 = 1000;
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), &[]);
    s.sql_ok("CREATE TABLE r (ts TIMESTAMP, seq INT NOT NULL) PARTITION BY yyyymmdd(ts)")
        .await;
    subscribe_and_leave(&s, "plain-sub", "plain/#", QoS::AtLeastOnce).await;
    subscribe_and_leave(&s, "table-sub", "/default/r", QoS::AtLeastOnce).await;
    subscribe_and_leave(&s, "both-sub", "#", QoS::ExactlyOnce).await;
    publish_all(&s, 0..N / 2).await;
    let path = s.dir.clone();
    assert_eq!(s.terminate(), 0);
    let snapshot = std::fs::read_to_string(path.join("data/broker/state.json")).unwrap();
    let state: serde_json::Value = serde_json::from_str(&snapshot).unwrap();
    assert_eq!(
        state["messages"].as_array().unwrap().len() as u64,
        N,
        "each queued message saved once"
    );
    let s = Server::start(&path, &[]);
    publish_all(&s, N / 2..N).await;
    s.kill9();

    let s = Server::start(&path, &[]);
    assert_eq!(s.count("SELECT count(*) FROM r").await, N);
    let all: HashSet<u64> = (0..N).collect();
    for (id, per_seq) in [("plain-sub", 1), ("table-sub", 1), ("both-sub", 2)] {
        let (mut raw, present) = Raw::connect(&s, id).await;
        assert!(present, "{id}: session lost");
        let mut got = Received::default();
        got.read(&mut raw, true, 60, |r| {
            r.seqs.len() as u64 == N && r.seqs.values().all(|c| *c >= per_seq)
        })
        .await;
        let seqs: HashSet<u64> = got.seqs.keys().copied().collect();
        let missing: Vec<&u64> = all.difference(&seqs).take(10).collect();
        assert!(
            missing.is_empty(),
            "{id}: {} of {N} missing, e.g. {missing:?}",
            N - seqs.len() as u64
        );
    }
}

/// QoS 2 end to end across `kill -9` at a moment of its own: every message the publisher
/// got a PUBREC for reaches the online lasting subscriber exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn qos2_reaches_a_lasting_subscriber_exactly_once_across_kill_9() {
    const N: u64 = 20_000;
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), &[]);
    let (mut raw, _) = Raw::connect(&s, "q2-sub").await;
    raw.subscribe("q2/#", QoS::ExactlyOnce).await;
    let (acked, events) = publisher(&s, "q2-pub", &["q2/x"], 0..N, rumqttc::QoS::ExactlyOnce);
    let mut got = Received::default();
    // Receive while the publisher runs; kill once a good part is through.
    let kill_at = 1500 + std::process::id() as u64 % 1000;
    got.read(&mut raw, true, 120, |_| {
        acked.load(Ordering::SeqCst) >= kill_at
    })
    .await;
    let path = s.dir.clone();
    s.kill9();
    let _ = events.await;
    let acked = acked.load(Ordering::SeqCst);
    assert!(acked < N, "killed too late");

    let s = Server::start(&path, &[]);
    let (mut raw, present) = Raw::connect(&s, "q2-sub").await;
    assert!(present, "session lost");
    got.read(&mut raw, true, 60, |r| {
        (0..acked).all(|q| r.seqs.contains_key(&q))
    })
    .await;
    let missing: Vec<u64> = (0..acked)
        .filter(|q| !got.seqs.contains_key(q))
        .take(10)
        .collect();
    assert!(
        missing.is_empty(),
        "{acked} acknowledged; missing e.g. {missing:?}"
    );
    let twice: Vec<(&u64, &u32)> = got.seqs.iter().filter(|(_, c)| **c > 1).take(10).collect();
    assert!(twice.is_empty(), "delivered more than once: {twice:?}");
}

/// Messages in flight when the server died are sent again with DUP set, in the order they
/// were first sent, before anything else: a retained message sent for the subscription,
/// then those published.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_in_flight_are_resent_with_dup_in_order_after_kill_9() {
    const N: u64 = 30;
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), &[]);
    let out = s.mosquitto(
        "mosquitto_pub",
        &["-t", "slow/r", "-m", r#"{"seq":100}"#, "-q", "1", "-r"],
    );
    assert!(out.status.success(), "{out:?}");
    let (mut raw, _) = Raw::connect(&s, "slow-sub").await;
    raw.subscribe("slow/#", QoS::AtLeastOnce).await;
    let (acked, events) = publisher(&s, "slow-pub", &["slow/x"], 0..N, rumqttc::QoS::AtLeastOnce);
    eventually("every message acknowledged", 60, || {
        let a = acked.load(Ordering::SeqCst);
        async move { a == N }
    })
    .await;
    // Received and never acknowledged.
    let mut first = Received::default();
    first
        .read(&mut raw, false, 30, |r| r.arrivals.len() as u64 == N)
        .await;
    assert_eq!(first.arrivals.len() as u64, N);
    let path = s.dir.clone();
    s.kill9();
    let _ = events.await;

    let s = Server::start(&path, &[]);
    let (mut raw, present) = Raw::connect(&s, "slow-sub").await;
    assert!(present, "session lost");
    let mut again = Received::default();
    again
        .read(&mut raw, true, 30, |r| r.arrivals.len() as u64 == N)
        .await;
    let want: Vec<(u64, bool)> = first.arrivals.iter().map(|(q, _)| (*q, true)).collect();
    assert_eq!(again.arrivals, want, "resent in order, DUP set");
}

/// A lasting session's will is in the journal with it: the will of a connection that the
/// kill ended is published once the server is back, and only once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_will_of_a_connection_the_kill_ended_is_published_once_after_the_restart() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), &[]);
    s.sql_ok("CREATE TABLE wills (ts TIMESTAMP, seq INT NOT NULL) PARTITION BY yyyymmdd(ts)")
        .await;
    subscribe_and_leave(&s, "will-watch", "/default/wills", QoS::AtLeastOnce).await;
    let will = LastWill::new("/default/wills", r#"{"seq":7}"#, QoS::AtLeastOnce, false);
    let (_device, _) = Raw::connect_with_will(&s, "device", Some(will)).await;
    // The periodic snapshot (every 5 s) covers the device's session and will: the restart
    // finds the will there, not in the journal records after it.
    let path = s.dir.clone();
    let snapshot = path.join("data/broker/state.json");
    eventually("a snapshot with the device's will", 30, || {
        let text = std::fs::read_to_string(&snapshot).unwrap_or_default();
        let state: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
        let has_will = (state["sessions"].as_array().into_iter().flatten())
            .any(|s| s["id"] == "device" && !s["will"].is_null());
        async move { has_will }
    })
    .await;
    s.kill9();

    let s = Server::start(&path, &[]);
    let (mut raw, present) = Raw::connect(&s, "will-watch").await;
    assert!(present, "session lost");
    let mut got = Received::default();
    got.read(&mut raw, true, 30, |r| r.seqs.contains_key(&7))
        .await;
    assert_eq!(
        got.seqs.get(&7),
        Some(&1),
        "the will reached the lasting watcher"
    );
    assert_eq!(s.count("SELECT count(*) FROM wills").await, 1);
    let path = s.dir.clone();
    s.kill9();

    // Published: not again after the next start. A message stored after the start marks
    // the point by which a will still pending would have been published (at once).
    let s = Server::start(&path, &[]);
    let (acked, events) = publisher(
        &s,
        "marker",
        &["/default/wills"],
        0..1,
        rumqttc::QoS::AtLeastOnce,
    );
    eventually("the marker acknowledged", 30, || {
        let a = acked.load(Ordering::SeqCst);
        async move { a == 1 }
    })
    .await;
    events.abort();
    assert_eq!(s.count("SELECT count(*) FROM wills WHERE seq = 7").await, 1);
}

/// A delayed will is published when its session ends, if that comes first (MQTT 5
/// §3.1.3.2.2): here the client comes back with a clean start, which ends the old session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delayed_will_goes_out_when_a_clean_start_ends_its_session() {
    use rumqttc::v5::{AsyncClient as Client5, MqttOptions as Options5};
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), &[]);
    let (_watch, mut wills) = s.subscriber("wills/#").await;
    let options = |clean: bool| {
        let mut o = Options5::new("delayed", "127.0.0.1", s.mqtt_port());
        o.set_clean_start(clean);
        o.set_session_expiry_interval(Some(600));
        o
    };
    let mut o = options(false);
    o.set_last_will(common::delayed_will(
        "wills/delayed",
        r#"{"gone":true}"#,
        300,
    ));
    let (_client, mut el) = Client5::new(o, 10);
    // Connected, then the connection drops without a DISCONNECT.
    loop {
        if let rumqttc::v5::Event::Incoming(rumqttc::v5::mqttbytes::v5::Packet::ConnAck(_)) =
            el.poll().await.unwrap()
        {
            break;
        }
    }
    drop(el);
    assert!(
        tokio::time::timeout(Duration::from_secs(2), wills.recv())
            .await
            .is_err(),
        "the will waits for its delay"
    );
    let (_again, mut el) = Client5::new(options(true), 10);
    tokio::spawn(async move { while el.poll().await.is_ok() {} });
    let (topic, body) = tokio::time::timeout(Duration::from_secs(20), wills.recv())
        .await
        .expect("the will once the clean start ended the session")
        .unwrap();
    assert_eq!(
        (topic.as_str(), body["gone"].as_bool()),
        ("wills/delayed", Some(true))
    );
}

/// A client that comes back with a smaller receive maximum gets what was in flight sent
/// again only as far as that window goes (MQTT 5 §4.9), the rest as it acknowledges: the
/// SUBACK to a SUBSCRIBE sent once two came arrives before any third.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_sent_again_keep_to_a_smaller_receive_maximum() {
    use rumqttc::v5::mqttbytes::QoS as QoS5;
    use rumqttc::v5::mqttbytes::v5::{Packet as Packet5, Publish};
    use rumqttc::v5::{AsyncClient as Client5, Event as Event5, MqttOptions as Options5};
    const N: usize = 5;
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), &[]);
    let options = |receive_maximum: u16| {
        let mut o = Options5::new("narrowing", "127.0.0.1", s.mqtt_port());
        o.set_clean_start(false);
        o.set_session_expiry_interval(Some(600));
        o.set_receive_maximum(Some(receive_maximum));
        o.set_manual_acks(true);
        o
    };
    let (client, mut el) = Client5::new(options(10), 10);
    client
        .subscribe("narrow/q", QoS5::AtLeastOnce)
        .await
        .unwrap();
    while !matches!(next(&mut el).await, Event5::Incoming(Packet5::SubAck(_))) {}
    let (acked, events) = publisher(
        &s,
        "narrow-pub",
        &["narrow/q"],
        0..N as u64,
        rumqttc::QoS::AtLeastOnce,
    );
    let mut first: Vec<Publish> = Vec::new();
    while first.len() < N {
        if let Event5::Incoming(Packet5::Publish(p)) = next(&mut el).await {
            first.push(p);
        }
    }
    drop(acked);
    events.abort();
    // Gone without acknowledging; back with room for two.
    drop((client, el));
    let (client, mut el) = Client5::new(options(2), 10);
    let mut again: Vec<Publish> = Vec::new();
    let mut marked = false;
    while !marked {
        match next(&mut el).await {
            Event5::Incoming(Packet5::SubAck(_)) => marked = true,
            Event5::Incoming(Packet5::Publish(p)) => {
                again.push(p);
                if again.len() == 2 {
                    // Answered after whatever was sent at the CONNACK.
                    client
                        .subscribe("narrow/other", QoS5::AtMostOnce)
                        .await
                        .unwrap();
                }
            }
            _ => {}
        }
    }
    assert_eq!(again.len(), 2, "two in flight, as the client allows");
    // Each acknowledgement lets one more through, in the order first sent.
    while again.len() < N {
        client.ack(&again[again.len() - 2]).await.unwrap();
        let before = again.len();
        while again.len() == before {
            if let Event5::Incoming(Packet5::Publish(p)) = next(&mut el).await {
                again.push(p);
            }
        }
    }
    let key = |p: &Publish| (p.pkid, p.payload.clone());
    assert_eq!(
        again.iter().map(key).collect::<Vec<_>>(),
        first.iter().map(key).collect::<Vec<_>>()
    );
    assert!(again.iter().all(|p| p.dup));
}

/// The next event of a v5 client, within 30 s.
async fn next(el: &mut rumqttc::v5::EventLoop) -> rumqttc::v5::Event {
    let ev = tokio::time::timeout(Duration::from_secs(30), el.poll()).await;
    ev.expect("an event within 30 s").unwrap()
}
