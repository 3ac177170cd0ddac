//! Tests of rollups: kept exact through late rows, flushes, compaction and a restart, and
//! answered as the same query over the raw rows answers.

use crate::engine::Engine;
use crate::ports::{QueryOptions, QueryPort};
use futures::TryStreamExt;
use std::sync::Arc;

/// A new engine with the table `t.m` (time, device, temp).
async fn fresh() -> (tempfile::TempDir, Arc<Engine>) {
    let dir = tempfile::tempdir().unwrap();
    let e = open(dir.path()).await;
    ok(
        &e,
        "CREATE TABLE t.m (time TIMESTAMP, device STRING, temp DOUBLE) PARTITION BY yyyymmdd(time)",
    )
    .await;
    (dir, e)
}

async fn open(dir: &std::path::Path) -> Arc<Engine> {
    let mut config = sluice_conf::Config {
        data_dir: dir.to_path_buf(),
        ..Default::default()
    };
    config.compaction.min_files = 2;
    Engine::open(config).await.unwrap()
}

async fn run(e: &Engine, sql: &str) -> crate::error::Result<String> {
    let options = QueryOptions {
        no_result_cache: true,
        ..Default::default()
    };
    let out = QueryPort::query(e, sql, &options).await?;
    let batches: Vec<_> = out.stream.try_collect().await.unwrap();
    Ok(
        datafusion::arrow::util::pretty::pretty_format_batches(&batches)
            .unwrap()
            .to_string(),
    )
}

async fn ok(e: &Engine, sql: &str) -> String {
    run(e, sql)
        .await
        .unwrap_or_else(|err| panic!("{sql}: {err}"))
}

/// Rows of devices `a` and `b` at `(minute, second, temp)`, 2024-05-01 10:mm:ss.
async fn insert(e: &Engine, rows: &[(&str, u32, u32, Option<f64>)]) {
    let values: Vec<String> = (rows.iter())
        .map(|(d, m, s, t)| {
            let t = t.map_or("NULL".to_string(), |t| t.to_string());
            format!("('2024-05-01 10:{m:02}:{s:02}', '{d}', {t})")
        })
        .collect();
    let sql = format!("INSERT INTO t.m VALUES {}", values.join(", "));
    ok(e, &sql).await;
}

const ROLLUP: &str =
    "SELECT bucket, device, avg_temp, min_temp, max_temp, count FROM t.m1 ORDER BY 1, 2";
const RAW: &str = "SELECT date_bin(INTERVAL '1 minute', time) AS bucket, device, avg(temp) AS avg_temp, \
    min(temp) AS min_temp, max(temp) AS max_temp, count(*) AS count FROM t.m GROUP BY 1, 2 ORDER BY 1, 2";

#[tokio::test]
async fn a_rollup_stays_exact_through_late_rows_flushes_compaction_and_restarts() {
    let (dir, e) = fresh().await;
    // Rows persisted before the rollup exists are folded when it is made.
    insert(
        &e,
        &[
            ("a", 0, 5, Some(1.0)),
            ("a", 0, 50, Some(3.0)),
            ("b", 0, 10, None),
        ],
    )
    .await;
    ok(&e, "FLUSH TABLE t.m").await;
    insert(&e, &[("a", 1, 0, Some(10.0))]).await;
    ok(
        &e,
        "CREATE ROLLUP t.m1 AS SELECT date_bin('1 minute', time) AS bucket, device, avg(temp), \
        min(temp), max(temp), count(*) FROM t.m GROUP BY 1, 2 WITH (ttl = '1 year')",
    )
    .await;
    let want = "\
+---------------------+--------+----------+----------+----------+-------+
| bucket              | device | avg_temp | min_temp | max_temp | count |
+---------------------+--------+----------+----------+----------+-------+
| 2024-05-01T10:00:00 | a      | 2.0      | 1.0      | 3.0      | 2     |
| 2024-05-01T10:00:00 | b      |          |          |          | 1     |
| 2024-05-01T10:01:00 | a      | 10.0     | 10.0     | 10.0     | 1     |
+---------------------+--------+----------+----------+----------+-------+";
    assert_eq!(ok(&e, ROLLUP).await, want);
    assert_eq!(ok(&e, RAW).await, want);
    // A late row corrects its bucket at once, and after the flush that persists it.
    insert(&e, &[("a", 0, 30, Some(8.0)), ("b", 1, 59, Some(-2.0))]).await;
    let want = "\
+---------------------+--------+----------+----------+----------+-------+
| bucket              | device | avg_temp | min_temp | max_temp | count |
+---------------------+--------+----------+----------+----------+-------+
| 2024-05-01T10:00:00 | a      | 4.0      | 1.0      | 8.0      | 3     |
| 2024-05-01T10:00:00 | b      |          |          |          | 1     |
| 2024-05-01T10:01:00 | a      | 10.0     | 10.0     | 10.0     | 1     |
| 2024-05-01T10:01:00 | b      | -2.0     | -2.0     | -2.0     | 1     |
+---------------------+--------+----------+----------+----------+-------+";
    assert_eq!(ok(&e, ROLLUP).await, want);
    ok(&e, "FLUSH TABLE t.m").await;
    assert_eq!(ok(&e, ROLLUP).await, want);
    insert(&e, &[("a", 0, 1, Some(0.0))]).await;
    ok(&e, "FLUSH TABLE t.m").await;
    let stats = "SELECT source_table, bucket_seconds, keys, ttl_seconds, files, stored_rows FROM system.rollups";
    assert!(
        ok(&e, stats).await.contains(
            "| m            | 60             | device | 31536000    | 3     | 6           |"
        ),
        "{}",
        ok(&e, stats).await
    );
    // Compaction folds the partial rows of a bucket and key into one.
    assert!(e.compact_all().await.unwrap() >= 1);
    assert!(
        ok(&e, stats).await.contains("| 1     | 4           |"),
        "{}",
        ok(&e, stats).await
    );
    let want = ok(&e, RAW).await;
    assert!(
        want.contains("| 2024-05-01T10:00:00 | a      | 3.0      | 0.0      | 8.0      | 4     |")
    );
    assert_eq!(ok(&e, ROLLUP).await, want);
    // Filters on the bucket and keys; rows only in memory, then a restart (replayed).
    insert(&e, &[("b", 2, 0, Some(7.0))]).await;
    let one = "SELECT device, max_temp FROM t.m1 WHERE device = 'b' AND bucket >= '2024-05-01T10:01:00' ORDER BY bucket";
    assert!(
        ok(&e, one)
            .await
            .contains("| b      | -2.0     |\n| b      | 7.0      |")
    );
    e.shutdown().await.unwrap();
    drop(e);
    let e = open(dir.path()).await;
    assert_eq!(ok(&e, ROLLUP).await, ok(&e, RAW).await);
    assert!(ok(&e, one).await.contains("| b      | 7.0      |"));
    // DESCRIBE shows what queries answer; SHOW CREATE TABLE the statement that makes it.
    let described = ok(&e, "DESCRIBE t.m1").await;
    assert!(
        described.contains("| avg_temp    | Float64   |"),
        "{described}"
    );
    assert!(!described.contains("__sum"), "{described}");
    let shown = ok(&e, "SHOW CREATE TABLE t.m1").await;
    assert!(
        shown.contains("CREATE ROLLUP t.m1 AS SELECT date_bin('1 minute', time) AS bucket"),
        "{shown}"
    );
    assert!(shown.contains("WITH (ttl = '31536000s')"), "{shown}");
    // A rollup is written only by its source, and outlives nothing it depends on.
    let refused = run(
        &e,
        "INSERT INTO t.m1 VALUES ('2024-05-01 10:00:00', 'a', 1.0, 1, 1.0, 1.0, 1)",
    )
    .await;
    assert!(refused.unwrap_err().to_string().contains("is a rollup"));
    let refused = run(&e, "DROP TABLE t.m").await.unwrap_err().to_string();
    assert!(refused.contains("has rollup 'm1'"), "{refused}");
    ok(&e, "DROP ROLLUP t.m1").await;
    ok(&e, "DROP TABLE t.m").await;
    e.shutdown().await.unwrap();
}

#[tokio::test]
async fn bad_rollups_are_refused_with_reasons() {
    let (_dir, e) = fresh().await;
    let cases = [
        (
            "SELECT device, avg(temp) FROM t.m GROUP BY 1",
            "needs a bucket",
        ),
        (
            "SELECT date_bin('1 month', time), avg(temp) FROM t.m GROUP BY 1",
            "fixed width",
        ),
        (
            "SELECT date_bin('1 minute', time), device, avg(temp) FROM t.m GROUP BY 1",
            "every key",
        ),
        (
            "SELECT date_bin('1 minute', time), avg(device) FROM t.m GROUP BY 1",
            "String column",
        ),
        (
            "SELECT date_bin('1 minute', time), avg(temp) FROM t.m WHERE temp > 0 GROUP BY 1",
            "no WHERE",
        ),
        (
            "SELECT date_bin('1 minute', time), avg(nope) FROM t.m GROUP BY 1",
            "no column 'nope'",
        ),
        (
            "SELECT date_bin('1 hour', time, 'soon'), avg(temp) FROM t.m GROUP BY 1",
            "the origin is a timestamp",
        ),
    ];
    for (q, why) in cases {
        let err = run(&e, &format!("CREATE ROLLUP t.bad AS {q}"))
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains(why), "{q}: {err}");
    }
    // time_bucket counts from TimescaleDB's origin; the rollup is named by its aliases.
    // The source named as queries name it (`m` is `t.m`, the one table of that name).
    // No keys; a time's newest value kept as a time, through a flush and a merge.
    ok(&e, "CREATE ROLLUP t.w AS SELECT time_bucket(INTERVAL '7 days', time) AS week, sum(temp) AS total, max(time) AS last_seen FROM m GROUP BY week").await;
    insert(&e, &[("a", 0, 0, Some(2.5))]).await;
    ok(&e, "FLUSH TABLE t.m").await;
    insert(&e, &[("b", 3, 9, Some(1.0)), ("a", 1, 0, None)]).await;
    // An origin shifts the buckets.
    ok(&e, "CREATE ROLLUP t.h AS SELECT date_bin('1 hour', time, '2024-05-01 00:30:00') AS hour, count(*) AS n FROM t.m GROUP BY 1").await;
    assert!(
        ok(&e, "SELECT * FROM t.h")
            .await
            .contains("| 2024-05-01T09:30:00 | 3 |")
    );
    let want = "| 2024-04-29T00:00:00 | 3.5   | 2024-05-01T10:03:09 |";
    assert!(
        ok(&e, "SELECT * FROM t.w").await.contains(want),
        "{}",
        ok(&e, "SELECT * FROM t.w").await
    );
    e.shutdown().await.unwrap();
}
