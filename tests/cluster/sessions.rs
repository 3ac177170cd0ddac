//! A lasting session on a cluster node: what its node PUBACKed for it is delivered after
//! that node is killed and started again (the node keeps its broker's journal in its own
//! log; the rows themselves are in the shards' raft logs).

use super::Cluster;
use super::delivery::options;
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
