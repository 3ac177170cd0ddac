//! Files in a cluster: `FLUSH TABLE` writes a table's buffered rows on every shard's
//! leader; a table's TTL drops its expired partitions (files on the shared store and rows
//! still in the shards' buffers) on every node, and keeps the others.
//! (Set after the rows are in, so that they are seen stored first.)

use super::{Cluster, eventually_eq};

pub(crate) async fn ttl_expires_on_every_node(c: &Cluster) {
    let ids: Vec<u64> = c.nodes.keys().copied().collect();
    c.node(ids[0])
        .sql_ok(
            "CREATE TABLE iot.ttl (ts TIMESTAMP, device VARCHAR, seq BIGINT) \
             PARTITION BY ymdh(ts)",
        )
        .await;
    for id in &ids {
        super::eventually("the TTL table reaches every node", 20, || async {
            c.node(*id).sql("DESCRIBE iot.ttl").await.status == 200
        })
        .await;
    }
    let now = chrono::Utc::now().format("%Y-%m-%dT%H:%M:%SZ").to_string();
    let row = |ts: &str, i: usize| format!(r#"{{"ts": "{ts}", "device": "d{i}", "seq": {i}}}"#);
    let mut rows: Vec<String> = (0..30).map(|i| row("2020-01-01T00:00:00Z", i)).collect();
    rows.extend((30..35).map(|i| row(&now, i)));
    let rows = rows
        .into_iter()
        .map(|r| ("/iot/ttl".to_string(), r))
        .collect();
    super::delivery::publish_each(c.node(ids[1]).mqtt_port(), "ttl-pub", rows, false).await;
    let q = "SELECT count(*) FILTER (WHERE seq < 30) AS old, count(*) FILTER (WHERE seq >= 30) \
             AS new FROM iot.ttl";
    let count = |id: u64| async move {
        let r = c.node(id).rows(q).await;
        (r[0]["old"].as_u64(), r[0]["new"].as_u64())
    };
    assert_eq!(count(ids[2]).await, (Some(30), Some(5)));
    // FLUSH TABLE: each shard's leader writes what it buffers and commits the files (with
    // buffers written after a second here, it may find them written already).
    let r = c.node(ids[0]).rows("FLUSH TABLE iot.ttl").await;
    assert!(r[0]["files_written"].as_u64().is_some(), "{r:?}");
    let q2 = "SELECT sum(buffered_rows) AS n FROM system.partitions WHERE table_name = 'ttl'";
    for id in &ids {
        eventually_eq(
            &format!("node {id} holds the table in files"),
            10,
            &Some(0),
            || async { c.node(*id).rows(q2).await[0]["n"].as_u64() },
        )
        .await;
    }
    // With a TTL the old partition goes on every node (its rows, whether in files or
    // buffers); the current one stays.
    c.node(ids[2])
        .sql_ok("ALTER TABLE iot.ttl SET (ttl = '1 hour')")
        .await;
    for id in &ids {
        eventually_eq(
            &format!("node {id} drops the expired partition"),
            30,
            &(Some(0), Some(5)),
            || count(*id),
        )
        .await;
    }
}
