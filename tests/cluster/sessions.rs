//! A lasting session on a cluster node: what its node PUBACKed for it is delivered after
//! that node is killed and started again (the node keeps its broker's journal in its own
//! log; the rows themselves are in the shards' raft logs). The wills of a killed node's
//! clients are published by another node, once.

use super::Cluster;
use super::common::eventually;
use super::delivery::{once_in_order, options, publish_at, subscriber_at, take};
use rumqttc::{AsyncClient, Event, Packet, QoS};
use std::collections::HashSet;
use std::time::Duration;

/// Subscribes the lasting session `lasting` to `/iot/s` and `alarms/#` on `port`, then
/// leaves.
async fn subscribe_and_leave(port: u16) {
    let (client, mut el) = AsyncClient::new(options(port, "lasting", false), 10);
    client.subscribe("/iot/s", QoS::AtLeastOnce).await.unwrap();
    client
        .subscribe("alarms/#", QoS::AtLeastOnce)
        .await
        .unwrap();
    let mut subacks = 0;
    while subacks < 2 {
        if let Event::Incoming(Packet::SubAck(_)) = el.poll().await.unwrap() {
            subacks += 1;
        }
    }
    client.disconnect().await.unwrap();
    while el.poll().await.is_ok() {}
}

/// Publishes `n` messages to each topic at QoS 1 and returns once all are PUBACKed.
async fn publish(port: u16, n: u64) {
    let mut all = Vec::new();
    for i in 0..n {
        let seq = 4_000_000 + i;
        let body = format!(r#"{{"ts": "2026-11-23T14:00:00Z", "device": "s", "seq": {seq}}}"#);
        all.extend(["/iot/s", "alarms/x"].map(|t| (t.to_string(), body.clone())));
    }
    super::delivery::publish_each(port, "lasting-pub", all, false).await;
}

pub(crate) async fn lasting_session_survives_its_node(c: &mut Cluster) {
    const N: u64 = 100;
    let node = *c.nodes.keys().last().unwrap();
    c.node(node)
        .sql_ok(
            "CREATE TABLE iot.s (ts TIMESTAMP, device VARCHAR, seq BIGINT) PARTITION BY ymdh(ts)",
        )
        .await;
    subscribe_and_leave(c.node(node).mqtt_port()).await;
    publish(c.node(node).mqtt_port(), N).await;
    c.nodes.remove(&node).unwrap().kill9();
    c.restart(node);
    c.node(node).login(Some(("root", "r")));
    c.settled().await;

    let (client, mut el) =
        AsyncClient::new(options(c.node(node).mqtt_port(), "lasting", false), 10);
    let mut got: HashSet<(String, bytes::Bytes)> = HashSet::new();
    while (got.len() as u64) < 2 * N {
        let Ok(ev) = tokio::time::timeout(Duration::from_secs(30), el.poll()).await else {
            panic!("{} of {} messages after 30 s", got.len(), 2 * N);
        };
        let ev = ev.unwrap();
        if let Event::Incoming(Packet::Publish(p)) = ev {
            got.insert((p.topic, p.payload));
        }
    }
    drop(client);
    let q = "SELECT count(*) AS n, count(DISTINCT seq) AS d FROM iot.s";
    let r = c.node(node).rows(q).await;
    assert_eq!((r[0]["n"].as_u64(), r[0]["d"].as_u64()), (Some(N), Some(N)));
    // The session ends (a clean session), so later messages are not queued for it.
    let (_, mut el) = AsyncClient::new(options(c.node(node).mqtt_port(), "lasting", true), 10);
    while !matches!(el.poll().await, Ok(Event::Incoming(Packet::ConnAck(_)))) {}
}

/// Connects `id` to `port` with MQTT 5, a session lasting 600 s and a QoS 1 will to
/// `wills/<id>` delayed `delay` s; returns once connected (the event loop, left unpolled,
/// keeps the connection).
async fn with_will(port: u16, id: &str, delay: u32) -> rumqttc::v5::EventLoop {
    use rumqttc::v5::mqttbytes::v5::Packet as P5;
    let mut o = rumqttc::v5::MqttOptions::new(id, "127.0.0.1", port);
    o.set_credentials("root", "r");
    o.set_clean_start(false);
    o.set_session_expiry_interval(Some(600));
    o.set_keep_alive(Duration::from_secs(60));
    o.set_last_will(super::common::delayed_will(
        &format!("wills/{id}"),
        "{}",
        delay,
    ));
    let (_, mut el) = rumqttc::v5::AsyncClient::new(o, 10);
    while !matches!(
        el.poll().await.unwrap(),
        rumqttc::v5::Event::Incoming(P5::ConnAck(_))
    ) {}
    el
}

/// The wills of a node's clients outlive it: killed with its clients connected, another
/// node publishes each will once after its delay (a clean session's, which no journal
/// holds, and a lasting session's), but not the will of a client that came back on another
/// node within its delay; started again, the node learns which wills went out and does not
/// publish them a second time from its journal.
pub(crate) async fn wills_outlive_their_node(c: &mut Cluster) {
    let ids: Vec<u64> = c.nodes.keys().copied().collect();
    let (first, middle, node) = (ids[0], ids[1], *ids.last().unwrap());
    let port = |c: &Cluster, id: u64| c.node(id).mqtt_port();
    let (_w, mut got) =
        super::delivery::subscriber(port(c, first), "will-watch", true, &["wills/#"]).await;
    let mut o = options(port(c, node), "clean", true);
    o.set_last_will(rumqttc::LastWill::new(
        "wills/clean",
        "{}",
        QoS::AtLeastOnce,
        false,
    ));
    let (_clean, mut clean) = AsyncClient::new(o, 10);
    while !matches!(clean.poll().await, Ok(Event::Incoming(Packet::ConnAck(_)))) {}
    let lasting = with_will(port(c, node), "lasting-will", 1).await;
    let back = with_will(port(c, node), "back", 8).await;

    c.nodes.remove(&node).unwrap().kill9();
    let killed = tokio::time::Instant::now();
    drop((clean, lasting, back));
    // Back within its delay, on another node: its will is not due any more.
    let _back = with_will(port(c, middle), "back", 8).await;
    // The two due come about 3 s after the kill (waited for, 30 s at most); the third
    // would come 8 s after it, so the watch goes on until 11 s.
    let mut wills: Vec<String> = Vec::new();
    while wills.len() < 2 {
        match tokio::time::timeout(Duration::from_secs(30), got.recv()).await {
            Ok(Some((topic, _))) => wills.push(topic),
            _ => panic!("wills after 30 s: {wills:?}"),
        }
    }
    let until = killed + Duration::from_secs(11);
    while let Ok(Some((topic, _))) = tokio::time::timeout_at(until, got.recv()).await {
        wills.push(topic);
    }
    wills.sort();
    assert_eq!(wills, ["wills/clean", "wills/lasting-will"]);

    c.restart(node);
    c.node(node).login(Some(("root", "r")));
    c.settled().await;
    eventually("the restarted node claims its wills", 30, || async {
        (c.node(node).log_text()).contains("published_elsewhere=2")
    })
    .await;
    // Its journal's will of `lasting-will` (delay 1 s from the claim) is not published
    // again: a message published now on the same node comes (waited for, 30 s at most),
    // and nothing else in the 3 s from the claim on.
    let claimed = tokio::time::Instant::now();
    let marker = vec![("wills/marker".to_string(), "{}".to_string())];
    super::delivery::publish_each(port(c, node), "will-marker", marker, false).await;
    let mut after = Vec::new();
    while !after.iter().any(|t| t == "wills/marker") {
        match tokio::time::timeout(Duration::from_secs(30), got.recv()).await {
            Ok(Some((topic, _))) => after.push(topic),
            _ => panic!("no marker after 30 s: {after:?}"),
        }
    }
    let until = claimed + Duration::from_secs(3);
    while let Ok(Some((topic, _))) = tokio::time::timeout_at(until, got.recv()).await {
        after.push(topic);
    }
    assert_eq!(after, ["wills/marker"], "after the node's restart");
}

/// A lasting session whose node is killed resumes on another node, with what its node had
/// queued for it: from the standby copy of that node's journal on another node, before the
/// killed node is back (it might never be); and with what the other nodes relayed to the
/// killed node after it died, before the session moved (their queues for it: pulled). What
/// is published next goes to it there and is also kept for the killed node; once back, that
/// node gives what it received to the session's new node (only what it logged after the
/// standby copy's point), which takes only what it had not delivered: at QoS 2, each message
/// once.
pub(crate) async fn given_back_once(c: &mut Cluster) {
    const N: u64 = 20;
    let ids: Vec<u64> = c.nodes.keys().copied().collect();
    let (first, middle, node) = (ids[0], ids[1], *ids.last().unwrap());
    let port = |c: &Cluster, id: u64| c.node(id).mqtt_port();
    let (topic, q) = (["roam/x".to_string()], QoS::ExactlyOnce);
    let (s, mut got) = subscriber_at(port(c, node), "roamer", false, &["roam/#"], q).await;
    s.disconnect().await.unwrap();
    while got.recv().await.is_some() {}
    // Queued on the session's node, which is then killed.
    publish_at(port(c, first), "before", &topic, N, false, q).await;
    c.nodes.remove(&node).unwrap().kill9();
    // Relayed to the killed node (queued for it on the first node and on the middle one).
    publish_at(port(c, first), "down", &topic, N, false, q).await;
    publish_at(port(c, middle), "down-here", &topic, N, false, q).await;
    let (_s, mut got) = subscriber_at(port(c, middle), "roamer", false, &[], q).await;
    let queued = "a session resumed from the standby copy of its node, which is down";
    let queued = take(&mut got, 3 * N as usize, queued).await;
    let devices: Vec<String> = (queued.iter())
        .map(|(_, body)| serde_json::from_slice::<serde_json::Value>(body).unwrap())
        .map(|v| v["device"].as_str().unwrap().to_string())
        .collect();
    let (copied, kept) = devices.split_at(N as usize);
    assert!(copied.iter().all(|d| d == "before"), "{devices:?}");
    assert!(kept.iter().all(|d| d.starts_with("down")), "{devices:?}");
    publish_at(port(c, first), "meanwhile", &topic, N, false, q).await;
    publish_at(port(c, middle), "local", &topic, N, false, q).await;
    // Delivered there (from the second node at once; from the first, once it knows the
    // route, else from the killed node when it is back), each once, whatever the killed
    // node also kept and gives back.
    let who = "a session resumed while its node was down";
    c.restart(node);
    c.node(node).login(Some(("root", "r")));
    c.settled().await;
    let all = [queued, take(&mut got, 2 * N as usize, who).await].concat();
    eventually("the restarted node gives what it held", 30, || async {
        (c.node(node).log_text()).contains("gave what a moved session held")
    })
    .await;
    // What it gave is queued here before the give is answered: a marker published now
    // comes after any copy of it, and nothing comes before the marker.
    publish_at(port(c, middle), "marker", &topic, 1, false, q).await;
    let mut before = Vec::new();
    loop {
        let m = tokio::time::timeout(Duration::from_secs(30), got.recv()).await;
        let (t, body) = m.ok().flatten().expect("the marker within 30 s");
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        if v["device"] == "marker" {
            break;
        }
        before.push((t, body));
    }
    assert!(
        before.is_empty(),
        "{who}: copies came after all: {before:?}"
    );
    once_in_order(&all, who);
    // The restarted node keeps its copy of the session (withdrawn: the client left it) for
    // its grace period. Now the session's node dies, holding messages for it: the client,
    // back on the first node, finds that copy answering and still gets what the dead node
    // held (from its standby copy) and what was relayed to it (pulled), each once.
    // (Once the marker's QoS 2 exchange is over: a PUBREL still due would go to the next
    // client, which as a new rumqttc client does not know the packet id.)
    let q_done = "SELECT inflight FROM system.sessions WHERE client_id = 'roamer'";
    eventually("the marker's PUBCOMP", 30, || async {
        c.node(middle)
            .rows(q_done)
            .await
            .first()
            .is_some_and(|r| r["inflight"] == 0)
    })
    .await;
    _s.disconnect().await.unwrap();
    while got.recv().await.is_some() {}
    publish_at(port(c, first), "held", &topic, N, false, q).await;
    c.nodes.remove(&middle).unwrap().kill9();
    publish_at(port(c, node), "held-down", &topic, N, false, q).await;
    let (_s, mut got) = subscriber_at(port(c, first), "roamer", false, &[], q).await;
    let who = "a session whose node died, with a copy left on a restarted node";
    let held = take(&mut got, 2 * N as usize, who).await;
    assert!(
        (c.node(node).log_text()).contains("session taken over by another node"),
        "{who}: the restarted node's copy did not answer"
    );
    // The dead node comes back and gives what it kept (what was relayed to it while it was
    // down came to it too): nothing comes twice.
    c.restart(middle);
    c.node(middle).login(Some(("root", "r")));
    c.settled().await;
    eventually("the node that came back gives what it held", 30, || async {
        (c.node(middle).log_text()).contains("gave what a moved session held")
    })
    .await;
    publish_at(port(c, node), "marker", &topic, 1, false, q).await;
    let after = take(&mut got, 1, who).await;
    let v: serde_json::Value = serde_json::from_slice(&after[0].1).unwrap();
    assert_eq!(v["device"], "marker", "{who}: {after:?}");
    once_in_order(&held, who);
}

/// QoS 2 messages a client got and did not acknowledge on one node are sent again by the
/// node it connects to next (its session handed over), under the same packet ids with DUP
/// set, so that the client's own QoS 2 state keeps each once (MQTT 3.1.1 §4.4).
pub(crate) async fn in_flight_moves_under_its_packet_ids(c: &Cluster) {
    const N: usize = 5;
    let ids: Vec<u64> = c.nodes.keys().copied().collect();
    let (a, z) = (ids[0], ids[1]);
    let port = |id: u64| c.node(id).mqtt_port();
    let connect = |id: u64| {
        let mut o = options(port(id), "in-flight", false);
        o.set_manual_acks(true);
        AsyncClient::new(o, 10)
    };
    let (client, mut el) = connect(a);
    client
        .subscribe("inflight/#", QoS::ExactlyOnce)
        .await
        .unwrap();
    while !matches!(el.poll().await, Ok(Event::Incoming(Packet::SubAck(_)))) {}
    let topics = ["inflight/x".to_string()];
    publish_at(
        port(z),
        "in-flight-pub",
        &topics,
        N as u64,
        false,
        QoS::ExactlyOnce,
    )
    .await;
    let received = |mut el: rumqttc::EventLoop| async move {
        let mut got = Vec::new();
        while got.len() < N {
            let ev = tokio::time::timeout(Duration::from_secs(30), el.poll()).await;
            match ev.expect("a message within 30 s").unwrap() {
                Event::Incoming(Packet::Publish(p)) => got.push(p),
                Event::Incoming(Packet::ConnAck(a)) => assert!(a.session_present),
                _ => {}
            }
        }
        (el, got)
    };
    // Received, neither PUBREC nor anything else sent back; then the client moves.
    let (_first, first) = received(el).await;
    let (moved, el) = connect(z);
    let (mut el, again) = received(el).await;
    let key = |p: &rumqttc::Publish| (p.pkid, p.payload.clone());
    assert_eq!(
        again.iter().map(key).collect::<Vec<_>>(),
        first.iter().map(key).collect::<Vec<_>>(),
        "sent again under the same packet ids"
    );
    assert!(again.iter().all(|p| p.dup), "sent again with DUP set");
    for p in &again {
        moved.ack(p).await.unwrap();
    }
    let mut released = 0;
    while released < N {
        let ev = tokio::time::timeout(Duration::from_secs(30), el.poll()).await;
        if let Event::Incoming(Packet::PubRel(_)) = ev.expect("a PUBREL within 30 s").unwrap() {
            released += 1;
        }
    }
    // The session ends, so that nothing more is queued for it.
    drop((moved, el));
    let (_, mut el) = AsyncClient::new(options(port(z), "in-flight", true), 10);
    while !matches!(el.poll().await, Ok(Event::Incoming(Packet::ConnAck(_)))) {}
}
