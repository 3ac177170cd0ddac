//! Files in a cluster: `FLUSH TABLE` writes a table's buffered rows on every shard's
//! leader; a table's TTL drops its expired partitions (files on the shared store and rows
//! still in the shards' buffers) on every node, and keeps the others, while a rollup of the
//! table keeps its counts.
//! (Set after the rows are in, so that they are seen stored first.) Then the table is
//! dropped: its files leave the shared store, as does a file no table names (a flush whose
//! commit never came), while a live table's files stay.

use super::{Cluster, eventually_eq};
use std::path::Path;

pub(crate) async fn ttl_expires_on_every_node(c: &Cluster) {
    let ids: Vec<u64> = c.nodes.keys().copied().collect();
    c.node(ids[0])
        .sql_ok(
            "CREATE TABLE iot.ttl (ts TIMESTAMP, device VARCHAR, seq BIGINT) \
             PARTITION BY ymdh(ts)",
        )
        .await;
    // A rollup made on one node is kept by every shard's leader and read on every node.
    c.node(ids[1])
        .sql_ok(
            "CREATE ROLLUP iot.ttl_hourly AS SELECT date_bin('1 hour', ts) AS hour, device, \
             count(*) AS n, max(seq) AS top FROM iot.ttl GROUP BY 1, 2",
        )
        .await;
    for id in &ids {
        super::eventually(
            "the TTL table and its rollup reach every node",
            20,
            || async { c.node(*id).sql("DESCRIBE iot.ttl_hourly").await.status == 200 },
        )
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
    let rolled = "SELECT sum(n) AS n, max(top) AS top, count(*) AS groups FROM iot.ttl_hourly";
    let rolled = |id: u64| async move {
        let r = c.node(id).rows(rolled).await;
        (
            r[0]["n"].as_u64(),
            r[0]["top"].as_u64(),
            r[0]["groups"].as_u64(),
        )
    };
    assert_eq!(rolled(ids[0]).await, (Some(35), Some(34), Some(35)));
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
    let files = "SELECT files FROM system.rollups WHERE rollup_name = 'ttl_hourly'";
    for id in &ids {
        assert!(c.node(*id).rows(files).await[0]["files"].as_u64() > Some(0));
        assert_eq!(
            rolled(*id).await,
            (Some(35), Some(34), Some(35)),
            "node {id}"
        );
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
        // The rollup keeps the expired rows' counts.
        assert_eq!(
            rolled(*id).await,
            (Some(35), Some(34), Some(35)),
            "node {id}"
        );
    }
}

/// Files under `dir`, at any depth.
fn files_under(dir: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    (entries.flatten())
        .map(|e| match e.path().is_dir() {
            true => files_under(&e.path()),
            false => 1,
        })
        .sum()
}

pub(crate) async fn dropped_and_orphaned_files_go(c: &Cluster, shared: &Path) {
    let ids: Vec<u64> = c.nodes.keys().copied().collect();
    let first = ids[0];
    let id_of = |table: &'static str| async move {
        let q = format!(
            "SELECT table_id FROM system.tables WHERE database_name = 'iot' AND table_name = '{table}'"
        );
        c.node(first).rows(&q).await[0]["table_id"]
            .as_u64()
            .unwrap()
    };
    let (dropped, kept) = (id_of("ttl").await, id_of("r").await);
    let dir = |id: u64| shared.join(format!("tables/{id}"));
    assert!(files_under(&dir(dropped)) > 0, "FLUSH TABLE wrote no file");
    assert!(files_under(&dir(kept)) > 0, "iot.r has no file");
    let kept_rows = c.node(ids[2]).count("SELECT count(*) FROM iot.r").await;
    let stray = shared.join("tables/999999/7/stray-1.parquet");
    std::fs::create_dir_all(stray.parent().unwrap()).unwrap();
    std::fs::write(&stray, b"not a parquet file").unwrap();
    c.node(ids[1]).sql_ok("DROP ROLLUP iot.ttl_hourly").await;
    c.node(ids[1]).sql_ok("DROP TABLE iot.ttl").await;
    super::eventually(
        "the dropped table's files and the stray file go",
        30,
        || async { files_under(&dir(dropped)) == 0 && !stray.exists() },
    )
    .await;
    assert!(files_under(&dir(kept)) > 0, "a live table lost its files");
    for id in &ids {
        eventually_eq(
            &format!("node {id} reads iot.r whole"),
            10,
            &kept_rows,
            || c.node(*id).count("SELECT count(*) FROM iot.r"),
        )
        .await;
    }
}
