//! The cluster as one broker: a message published on any node reaches the matching
//! subscriptions on every node, once per subscription and in order per publisher; a shared
//! group with members on two nodes gets each message once; a retained message is kept by
//! every node; a lasting session's messages published while its node was down (kill -9)
//! are delivered once it is back; a session follows its client to another node (what it
//! held comes along, the old connection is closed).

use super::Cluster;
use rumqttc::{AsyncClient, Event, MqttOptions, Packet, QoS};
use std::collections::{BTreeMap, HashSet};
use std::time::Duration;
use tokio::sync::mpsc::UnboundedReceiver;

type Got = UnboundedReceiver<(String, bytes::Bytes)>;

/// A client's options (users exist by now: see `page`).
pub(crate) fn options(port: u16, id: &str, clean: bool) -> MqttOptions {
    let mut o = MqttOptions::new(id, "127.0.0.1", port);
    o.set_keep_alive(Duration::from_secs(30));
    o.set_clean_session(clean);
    o.set_inflight(64);
    o.set_credentials("root", "r");
    o
}

/// Connects `id` to `port`, subscribes `filters` at QoS 1 and returns once they are
/// acknowledged, with what it receives from then on.
pub(crate) async fn subscriber(
    port: u16,
    id: &str,
    clean: bool,
    filters: &[&str],
) -> (AsyncClient, Got) {
    subscriber_at(port, id, clean, filters, QoS::AtLeastOnce).await
}

/// [`subscriber`] at `qos`.
pub(crate) async fn subscriber_at(
    port: u16,
    id: &str,
    clean: bool,
    filters: &[&str],
    qos: QoS,
) -> (AsyncClient, Got) {
    let (client, mut el) = AsyncClient::new(options(port, id, clean), 100);
    for f in filters {
        client.subscribe(*f, qos).await.unwrap();
    }
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let (subscribed, wait) = tokio::sync::oneshot::channel::<()>();
    let (mut subscribed, want) = (Some(subscribed), filters.len() + 1);
    tokio::spawn(async move {
        // The CONNACK, then a SUBACK per filter.
        let mut acks = 0;
        while let Ok(ev) = el.poll().await {
            match ev {
                Event::Incoming(Packet::ConnAck(_) | Packet::SubAck(_)) => {
                    acks += 1;
                    if acks == want
                        && let Some(s) = subscribed.take()
                    {
                        let _ = s.send(());
                    }
                }
                Event::Incoming(Packet::Publish(p))
                    if tx.send((p.topic.clone(), p.payload.clone())).is_err() =>
                {
                    return;
                }
                _ => {}
            }
        }
    });
    tokio::time::timeout(Duration::from_secs(30), wait)
        .await
        .expect("a SUBACK within 30 s")
        .unwrap();
    (client, rx)
}

/// Publishes `n` numbered messages from `id` on `port` to each of `topics` at QoS 1 (the
/// payload names the publisher and the number), returning once all are PUBACKed.
async fn publish(port: u16, id: &str, topics: &[String], n: u64, retain: bool) {
    publish_at(port, id, topics, n, retain, QoS::AtLeastOnce).await;
}

/// [`publish`] at `qos`.
pub(crate) async fn publish_at(
    port: u16,
    id: &str,
    topics: &[String],
    n: u64,
    retain: bool,
    qos: QoS,
) {
    let mut all = Vec::new();
    for seq in 0..n {
        let body = format!(r#"{{"ts": "2026-11-26T10:00:00Z", "device": "{id}", "seq": {seq}}}"#);
        all.extend(topics.iter().map(|t| (t.clone(), body.clone())));
    }
    publish_each_at(port, id, all, retain, qos).await;
}

/// Publishes each (topic, payload) from client `id` on `port` at QoS 1, in order; returns
/// once all are PUBACKed.
pub(crate) async fn publish_each(port: u16, id: &str, all: Vec<(String, String)>, retain: bool) {
    publish_each_at(port, id, all, retain, QoS::AtLeastOnce).await;
}

/// [`publish_each`] at `qos` (QoS 2: returns once all are PUBCOMPed).
async fn publish_each_at(port: u16, id: &str, all: Vec<(String, String)>, retain: bool, qos: QoS) {
    let (client, mut el) = AsyncClient::new(options(port, id, true), 100);
    let n = all.len();
    tokio::spawn(async move {
        for (t, body) in all {
            (client.publish(t, qos, retain, body)).await.unwrap();
        }
    });
    let mut acked = 0;
    while acked < n {
        let ev = tokio::time::timeout(Duration::from_secs(30), el.poll())
            .await
            .expect("a PUBACK within 30 s")
            .unwrap();
        if let Event::Incoming(Packet::PubAck(_) | Packet::PubComp(_)) = ev {
            acked += 1;
        }
    }
}

/// Takes `n` messages from `got` (failing after 30 s without one), then checks that no
/// more come within a short while.
pub(crate) async fn take(got: &mut Got, n: usize, who: &str) -> Vec<(String, bytes::Bytes)> {
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        match tokio::time::timeout(Duration::from_secs(30), got.recv()).await {
            Ok(Some(m)) => out.push(m),
            _ => panic!("{who}: {} of {n} messages after 30 s", out.len()),
        }
    }
    if let Ok(Some(m)) = tokio::time::timeout(Duration::from_millis(300), got.recv()).await {
        panic!("{who}: a message more than the {n} published: {m:?}");
    }
    out
}

/// Each message once, and per (topic, publisher) in the order published.
pub(crate) fn once_in_order(got: &[(String, bytes::Bytes)], who: &str) {
    let distinct: HashSet<_> = got.iter().collect();
    assert_eq!(distinct.len(), got.len(), "{who} got a message twice");
    let mut last: BTreeMap<(String, String), i64> = BTreeMap::new();
    for (topic, body) in got {
        let v: serde_json::Value = serde_json::from_slice(body).unwrap();
        let key = (topic.clone(), v["device"].as_str().unwrap().to_string());
        let seq = v["seq"].as_i64().unwrap();
        let before = last.insert(key.clone(), seq).unwrap_or(-1);
        assert!(seq > before, "{who}: {key:?} {seq} after {before}");
    }
}

/// A lasting session moves with its client: queued messages come along, later ones follow
/// it, and the connection it left is closed; at QoS 1 and at QoS 2 (subscription and
/// messages), each message once.
async fn session_moves(c: &Cluster, (a, b, z): (u64, u64, u64), qos: QoS) {
    const N: u64 = 20;
    let port = |id: u64| c.node(id).mqtt_port();
    let (id, topic) = (format!("mover-{qos:?}"), format!("move/{qos:?}"));
    let filter = format!("{topic}/#");
    let topics = [format!("{topic}/x")];
    let (mover, mut first) = subscriber_at(port(a), &id, false, &[&filter], qos).await;
    mover.disconnect().await.unwrap();
    while first.recv().await.is_some() {}
    publish_at(port(b), &format!("pub-{id}"), &topics, N, false, qos).await;
    // On node z now: the N queued on node a come along, and what is published next follows.
    let (_m, mut there) = subscriber_at(port(z), &id, false, &[], qos).await;
    publish_at(port(a), &format!("pub2-{id}"), &topics, N, false, qos).await;
    let who = format!("a session moved to another node at {qos:?}");
    let got = take(&mut there, 2 * N as usize, &who).await;
    once_in_order(&got, &who);
    // Back on node a: the connection on node z is closed.
    let (_m, mut back) = subscriber_at(port(a), &id, false, &[], qos).await;
    let closed = tokio::time::timeout(Duration::from_secs(10), there.recv()).await;
    assert!(
        matches!(closed, Ok(None)),
        "the connection taken over stays open: {closed:?}"
    );
    publish_at(port(b), &format!("pub3-{id}"), &topics, 1, false, qos).await;
    take(&mut back, 1, "a session moved back").await;
}

pub(crate) async fn one_broker_across_nodes(c: &mut Cluster) {
    const N: u64 = 40;
    let ids: Vec<u64> = c.nodes.keys().copied().collect();
    let (a, b, z) = (ids[0], ids[1], ids[2]);
    let port = |c: &Cluster, id: u64| c.node(id).mqtt_port();
    c.node(a)
        .sql_ok(
            "CREATE TABLE iot.d (ts TIMESTAMP, device VARCHAR, seq BIGINT) PARTITION BY ymdh(ts)",
        )
        .await;
    // No waiting for the table to reach nodes b and z: a node that does not know it yet
    // looks again after the metadata group's barrier before it takes a message to
    // `/iot/d` for one to a missing table (which would be routed but not stored).

    let (_sub, mut all) = subscriber(port(c, z), "z-all", true, &["/iot/d", "plain/#"]).await;
    let (_sa, mut group_a) = subscriber(port(c, a), "g-a", true, &["$share/g/plain/#"]).await;
    let (_sz, mut group_z) = subscriber(port(c, z), "g-z", true, &["$share/g/plain/#"]).await;
    let topics = |n: u64| vec!["/iot/d".to_string(), format!("plain/{n}")];
    let (ta, tb) = (topics(a), topics(b));
    tokio::join!(
        publish(port(c, a), "pub-a", &ta, N, false),
        publish(port(c, b), "pub-b", &tb, N, false),
    );
    let got = take(&mut all, 4 * N as usize, "a subscriber on another node").await;
    once_in_order(&got, "a subscriber on another node");
    let q = "SELECT count(*) AS n FROM iot.d";
    assert_eq!(c.node(z).rows(q).await[0]["n"].as_u64(), Some(2 * N));
    // Node z's queries ran alongside their read barriers (kept, or run again after it).
    let text = c.node(z).metrics().await;
    let ahead = crate::common::metric(&text, "sluice_queries_read_ahead_total");
    let again = crate::common::metric(&text, "sluice_queries_read_again_total");
    assert!(
        ahead + again > 0,
        "no query on node z read ahead of its barrier"
    );

    // The shared group's two members share the plain messages, each once.
    let (mut ga, mut gz) = (Vec::new(), Vec::new());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while ga.len() + gz.len() < 2 * N as usize {
        tokio::select! {
            Some(m) = group_a.recv() => ga.push(m),
            Some(m) = group_z.recv() => gz.push(m),
            _ = tokio::time::sleep_until(deadline) => {
                panic!("the shared group got {} of {} after 30 s", ga.len() + gz.len(), 2 * N)
            }
        }
    }
    assert!(
        !ga.is_empty() && !gz.is_empty(),
        "{} / {}",
        ga.len(),
        gz.len()
    );
    let both: HashSet<_> = ga.iter().chain(gz.iter()).collect();
    assert_eq!(
        both.len(),
        2 * N as usize,
        "a shared message went to both members"
    );

    // A retained message published on one node is there for a new subscriber on another.
    publish(port(c, b), "pub-r", &["plain/status".to_string()], 1, true).await;
    let (_sr, mut retained) = subscriber(port(c, z), "z-retained", true, &["plain/status"]).await;
    take(&mut retained, 1, "a new subscriber to a retained topic").await;
    // The other subscribers got the live copy; the shared group once.
    take(&mut all, 1, "a subscriber on another node").await;
    tokio::select! {
        _ = group_a.recv() => take(&mut group_z, 0, "the shared group").await,
        _ = group_z.recv() => take(&mut group_a, 0, "the shared group").await,
    };

    // Rows written over HTTP on one node reach the table topic's subscriber on another.
    let rows = r#"{"ts": "2026-01-01T00:00:00Z", "device": "http", "seq": 0}"#;
    c.node(a)
        .write_ok("iot", "d", "application/json", rows)
        .await;
    let got = take(&mut all, 1, "a subscriber to a table written over HTTP").await;
    assert_eq!(got, vec![("/iot/d".to_string(), bytes::Bytes::from(rows))]);

    session_moves(c, (a, b, z), QoS::AtLeastOnce).await;
    session_moves(c, (a, b, z), QoS::ExactlyOnce).await;

    // A lasting session on node z: z is killed, messages are published on node a meanwhile,
    // and it gets them once z is back. Another goes to node a while z is down: its
    // subscriptions resume there at once, and what z held (or was sent while down) follows
    // once z is back (QoS 1: copies allowed).
    let (lasting, mut first) = subscriber(port(c, z), "z-lasting", false, &["later/#"]).await;
    lasting.disconnect().await.unwrap();
    while first.recv().await.is_some() {}
    let (away, mut first) = subscriber(port(c, z), "z-away", false, &["away/#"]).await;
    away.disconnect().await.unwrap();
    while first.recv().await.is_some() {}
    c.nodes.remove(&z).unwrap().kill9();
    publish(port(c, a), "pub-later", &["later/x".to_string()], N, false).await;
    publish(port(c, a), "pub-away", &["away/x".to_string()], N, false).await;
    let (_w, mut moved) = subscriber(port(c, a), "z-away", false, &[]).await;
    publish(port(c, b), "pub-away2", &["away/x".to_string()], N, false).await;
    let mut seen = HashSet::new();
    while seen.len() < N as usize {
        let m = tokio::time::timeout(Duration::from_secs(30), moved.recv()).await;
        seen.insert(m.expect("a moved session's new messages").unwrap());
    }
    c.restart(z);
    c.node(z).login(Some(("root", "r")));
    c.settled().await;
    let (_l, mut later) = subscriber(port(c, z), "z-lasting", false, &[]).await;
    let got = take(
        &mut later,
        N as usize,
        "a lasting session whose node was killed",
    )
    .await;
    once_in_order(&got, "a lasting session whose node was killed");
    while seen.len() < 2 * N as usize {
        let Ok(Some(m)) = tokio::time::timeout(Duration::from_secs(30), moved.recv()).await else {
            for id in [a, z] {
                let log = c.node(id).log_text();
                let lines: Vec<&str> = (log.lines())
                    .filter(|l| l.contains("took") || l.contains("session") || l.contains("WARN"))
                    .collect();
                eprintln!("node {id}:\n{}", lines.join("\n"));
            }
            panic!(
                "what z held for a moved session: {} of {}",
                seen.len(),
                2 * N
            );
        };
        seen.insert(m);
    }
}
