//! End-to-end: the real binary, real HTTP, real crashes.

mod common;

use common::{Server, eventually};
use std::collections::HashSet;

const NYCT: &str = "CREATE TABLE benchmark.nyct_lite(vendor_id String, pickup_datetime DateTime, dropoff_datetime DateTime, passenger_count Int8, trip_distance Float32, pickup_longitude Float32, pickup_latitude Float32, rate_code Int8, dropoff_longitude Float32, dropoff_latitude Float32, payment_type Int8, fare_amount Float32, extra Float32, mta_tax Float32, tip_amount Float32, tolls_amount Float32, improvement_surcharge Float32, total_amount Float32) PARTITION BY ymdh12(pickup_datetime)";

async fn readings(s: &Server) {
    s.sql_ok("CREATE DATABASE iot").await;
    let r = s
        .sql("CREATE TABLE iot.readings (ts TIMESTAMP, device VARCHAR, temp DOUBLE) PARTITION BY ymdh(ts)")
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_write_query_and_catalog() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), &[]);
    readings(&s).await;
    let w = s
        .write(
            "iot",
            "readings",
            "text/csv",
            "2024-05-01 10:00:00,d1,20.5\n2024-05-01 11:30:00,d2,21\n",
        )
        .await;
    assert_eq!(w.status, 204, "{}", w.body);
    let w = s
        .write(
            "iot",
            "readings",
            "application/json",
            r#"[{"ts":"2024-05-01T10:15:00Z","device":"d1","temp":20.7},{"ts":"2024-05-01 12:00:00","device":"d3"}]"#,
        )
        .await;
    assert_eq!(w.status, 204, "{}", w.body);
    let w = s
        .write(
            "iot",
            "readings",
            "application/x-ndjson",
            "{\"ts\":1714557600,\"device\":\"d4\",\"temp\":1}\n{\"device\":\"d5\",\"temp\":2}\n",
        )
        .await;
    assert_eq!(w.status, 204, "{}", w.body);

    // Visible at once, before any Parquet exists.
    assert_eq!(s.count("SELECT count(*) AS n FROM iot.readings").await, 6);
    let rows = s
        .rows("SELECT device, temp FROM iot.readings WHERE ts >= '2024-05-01 11:00:00' AND ts < '2024-05-01 12:00:00'")
        .await;
    assert_eq!(
        rows,
        vec![serde_json::json!({"device": "d2", "temp": 21.0})]
    );
    assert_eq!(
        s.count("SELECT count(*) AS n FROM iot.readings WHERE temp IS NULL")
            .await,
        1
    );

    // SHOW / DESCRIBE / system tables.
    let dbs = s.rows("SHOW DATABASES").await;
    assert!(dbs.contains(&serde_json::json!({"database_name": "iot"})));
    assert!(dbs.contains(&serde_json::json!({"database_name": "default"})));
    assert_eq!(
        s.rows("SHOW TABLES IN iot").await,
        vec![serde_json::json!({"database_name": "iot", "table_name": "readings"})]
    );
    let desc = s.rows("DESCRIBE iot.readings").await;
    assert_eq!(desc[0]["column_name"], "ts");
    assert_eq!(desc[0]["data_type"], "DateTime");
    assert_eq!(desc[0]["partition_key"], "ymdh(ts)");
    let parts = s
        .rows("SELECT partition, rows FROM system.partitions WHERE table_name = 'readings' AND partition = 2024050110")
        .await;
    assert_eq!(
        parts,
        vec![serde_json::json!({"partition": 2024050110u64, "rows": 3})]
    );

    // FLUSH writes Parquet that system.files shows, and queries give the same answers.
    s.sql_ok("FLUSH TABLE iot.readings").await;
    let files = s
        .rows("SELECT path, rows, bytes FROM system.files WHERE database_name = 'iot'")
        .await;
    assert!(!files.is_empty());
    assert_eq!(
        files
            .iter()
            .map(|f| f["rows"].as_u64().unwrap())
            .sum::<u64>(),
        6
    );
    assert!(
        files
            .iter()
            .all(|f| f["path"].as_str().unwrap().ends_with(".parquet"))
    );
    assert_eq!(s.count("SELECT count(*) AS n FROM iot.readings").await, 6);
    let rows = s
        .rows("SELECT device FROM iot.readings WHERE ts >= '2024-05-01 11:00:00' AND ts < '2024-05-01 12:00:00'")
        .await;
    assert_eq!(rows, vec![serde_json::json!({"device": "d2"})]);
    // Mixed: new rows in buffers plus files.
    s.write_ok("iot", "readings", "text/csv", "2024-05-01 10:59:59,d9,1")
        .await;
    assert_eq!(
        s.count("SELECT count(*) AS n FROM iot.readings WHERE ts < '2024-05-01 11:00:00'")
            .await,
        4
    );

    // The other output formats.
    for (format, ct) in [
        ("csv", "text/csv"),
        ("jsonl", "application/x-ndjson"),
        ("arrow", "application/vnd.apache.arrow.stream"),
        ("parquet", "application/vnd.apache.parquet"),
    ] {
        let r = s
            .sql_fmt("SELECT device FROM iot.readings ORDER BY device", format)
            .await;
        assert_eq!(r.status, 200, "{format}");
        let _ = ct;
        if format == "csv" {
            assert!(r.body.starts_with("device\nd1\nd1\nd2"), "{}", r.body);
        }
        if format == "jsonl" {
            assert_eq!(r.body.lines().count(), 7);
        }
    }

    // ALTER TABLE ADD COLUMN: old rows read NULL, new rows carry it.
    s.sql_ok("ALTER TABLE iot.readings ADD COLUMN humidity Float32")
        .await;
    s.write_ok(
        "iot",
        "readings",
        "application/json",
        r#"{"ts":"2024-05-01 10:00:01","device":"h","humidity":40.5}"#,
    )
    .await;
    assert_eq!(
        s.count("SELECT count(humidity) AS n FROM iot.readings")
            .await,
        1
    );
    assert_eq!(s.count("SELECT count(*) AS n FROM iot.readings").await, 8);

    // INSERT ... VALUES goes through the same durable write path.
    let r = s
        .sql("INSERT INTO iot.readings (device, ts) VALUES ('ins1', TIMESTAMP '2024-05-01 10:00:02'), ('ins2', '2024-05-01 10:00:03')")
        .await;
    assert_eq!(r.json(), serde_json::json!([{"rows": 2}]));
    assert_eq!(
        s.count("SELECT count(*) FROM iot.readings WHERE device LIKE 'ins%' AND humidity IS NULL AND temp IS NULL").await,
        2
    );

    // DROP TABLE.
    s.sql_ok("DROP TABLE iot.readings").await;
    assert_eq!(s.sql("SELECT * FROM iot.readings").await.status, 404);
    assert_eq!(
        s.write("iot", "readings", "text/csv", "2024-05-01 10:00:00,d1,1")
            .await
            .status,
        404
    );
    assert_eq!(s.terminate(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oidbs_ddl_runs_as_written() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), &[]);
    // As written, on a fresh server: the database comes with its first table.
    let r = s.sql(NYCT).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let line = "CMT,2016-01-31 13:45:00,2016-01-31 14:00:00,1,2.5,-73.9,40.7,1,-73.95,40.75,1,12.5,0.5,0.5,2,0,0.3,15.8";
    let w = s
        .write(
            "benchmark",
            "nyct_lite",
            "text/csv",
            format!("{line}\n{line}"),
        )
        .await;
    assert_eq!(w.status, 204, "{}", w.body);
    let parts = s
        .rows("SELECT partition FROM system.partitions WHERE table_name = 'nyct_lite'")
        .await;
    assert_eq!(parts, vec![serde_json::json!({"partition": 2016013112u64})]);
    assert_eq!(
        s.count("SELECT count(passenger_count) FROM benchmark.nyct_lite")
            .await,
        2
    );
    assert_eq!(
        s.sql(NYCT).await.status,
        409,
        "creating it twice is a conflict"
    );
}

/// 8 clients write rows with unique ids; `kill -9` right after the last 204; every
/// acknowledged row is back exactly once after restart, with and without earlier flushes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill9_loses_and_duplicates_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let env = [("SLUICE_WAL_SEGMENT_BYTES", "65536")];
    let s = Server::start(dir.path(), &env);
    s.sql_ok("CREATE DATABASE iot").await;
    assert_eq!(
        s.sql(
            "CREATE TABLE iot.events (ts TIMESTAMP, client Int32, seq Int64) PARTITION BY ymdh(ts)"
        )
        .await
        .status,
        200
    );
    let mut acked = HashSet::new();
    for round in 0..2 {
        let mut tasks = Vec::new();
        for c in 0..8 {
            let client = s.client();
            let url = s.url("/v1/write/iot/events");
            tasks.push(tokio::spawn(async move {
                let mut ok = Vec::new();
                for i in 0..150i64 {
                    let hour = (i % 5) + round * 5;
                    let body = format!(
                        "2024-01-01 {hour:02}:00:{:02},{c},{}",
                        i % 60,
                        round * 100_000 + i
                    );
                    let r = client
                        .post(&url)
                        .header("content-type", "text/csv")
                        .body(body)
                        .send()
                        .await
                        .unwrap();
                    assert_eq!(r.status(), 204);
                    ok.push((c, round * 100_000 + i));
                }
                ok
            }));
        }
        for t in tasks {
            acked.extend(t.await.unwrap());
        }
        if round == 0 {
            // Half the rows are in Parquet before the crash, half only in the log.
            s.sql_ok("FLUSH TABLE iot.events").await;
        }
    }
    s.kill9();
    let s = Server::start(dir.path(), &env);
    let rows = s.rows("SELECT client, seq FROM iot.events").await;
    let got: Vec<(i64, i64)> = rows
        .iter()
        .map(|r| (r["client"].as_i64().unwrap(), r["seq"].as_i64().unwrap()))
        .collect();
    let unique: HashSet<(i64, i64)> = got.iter().copied().collect();
    assert_eq!(got.len(), unique.len(), "no row twice");
    let acked: HashSet<(i64, i64)> = acked.into_iter().map(|(c, s)| (c as i64, s)).collect();
    assert_eq!(unique, acked, "every acknowledged row, nothing else");
    // A second crash right after recovery changes nothing either.
    s.kill9();
    let s = Server::start(dir.path(), &env);
    assert_eq!(s.count("SELECT count(*) FROM iot.events").await, 2400);
    assert_eq!(s.terminate(), 0);
    // After a clean stop everything is in Parquet and the log replays nothing.
    let s = Server::start(dir.path(), &env);
    assert_eq!(s.count("SELECT count(*) FROM iot.events").await, 2400);
    assert!(s.log_text().contains("records=0"), "{}", s.log_text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn torn_wal_tail_is_cut_and_reported() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), &[]);
    readings(&s).await;
    for i in 0..20 {
        s.write_ok(
            "iot",
            "readings",
            "text/csv",
            format!("2024-05-01 10:00:{i:02},d,{i}"),
        )
        .await;
    }
    s.kill9();
    // A crash in the middle of a write leaves half a record at the end of the last segment.
    let wal = dir.path().join("data/wal");
    let mut segs: Vec<_> = std::fs::read_dir(&wal)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    segs.sort();
    let last = segs.last().unwrap();
    let mut bytes = std::fs::read(last).unwrap();
    bytes.extend_from_slice(&[0x40, 0, 0, 0, 0xde, 0xad, 0xbe, 0xef, 1, 1, 7]);
    std::fs::write(last, &bytes).unwrap();
    let s = Server::start(dir.path(), &[]);
    assert_eq!(s.count("SELECT count(*) FROM iot.readings").await, 20);
    assert!(s.log_text().contains("WAL tail cut"), "{}", s.log_text());
    // Writing on goes on normally and survives another crash.
    s.write_ok("iot", "readings", "text/csv", "2024-05-01 10:01:00,d,99")
        .await;
    s.kill9();
    let s = Server::start(dir.path(), &[]);
    assert_eq!(s.count("SELECT count(*) FROM iot.readings").await, 21);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_drops_expired_partitions() {
    let dir = tempfile::tempdir().unwrap();
    let env = [
        ("SLUICE_RETENTION_INTERVAL", "200ms"),
        ("SLUICE_BUFFER_CHECK_INTERVAL", "100ms"),
    ];
    let s = Server::start(dir.path(), &env);
    s.sql_ok("CREATE DATABASE iot").await;
    let r = s.sql("CREATE TABLE iot.r (ts TIMESTAMP, v DOUBLE) PARTITION BY yyyymmdd(ts) WITH (ttl = '30 days')").await;
    assert_eq!(r.status, 200, "{}", r.body);
    // Old rows, some persisted and some only buffered, plus a fresh row (no ts: arrival time).
    s.write_ok(
        "iot",
        "r",
        "text/csv",
        "2016-01-01 00:00:00,1\n2016-01-02 00:00:00,2",
    )
    .await;
    s.sql_ok("FLUSH TABLE iot.r").await;
    s.write_ok("iot", "r", "text/csv", "2016-01-03 00:00:00,3")
        .await;
    s.write_ok("iot", "r", "application/json", r#"{"v": 4}"#)
        .await;
    eventually("expired partitions dropped", 30, || async {
        s.count("SELECT count(*) FROM iot.r").await == 1
    })
    .await;
    assert_eq!(
        s.rows("SELECT v FROM iot.r").await,
        vec![serde_json::json!({"v": 4.0})]
    );
    assert_eq!(
        s.count("SELECT count(*) FROM system.files WHERE table_name = 'r'")
            .await,
        0
    );
    // They stay dropped across a crash (the log still holds them).
    s.kill9();
    let s = Server::start(dir.path(), &env);
    assert_eq!(s.count("SELECT count(*) FROM iot.r").await, 1);
    // Once the log no longer holds their records, the tombstones leave the manifest.
    s.sql_ok("FLUSH TABLE iot.r").await;
    let manifests = dir.path().join("data/objects/manifest");
    let newest = || {
        let mut names: Vec<_> = std::fs::read_dir(&manifests)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        names.sort();
        std::fs::read_to_string(names.last().unwrap()).unwrap()
    };
    eventually("tombstones forgotten", 30, || async {
        !newest().contains("\"2016")
    })
    .await;
    assert_eq!(s.count("SELECT count(*) FROM iot.r").await, 1);
    s.kill9();
    let s = Server::start(dir.path(), &env);
    assert_eq!(s.count("SELECT count(*) FROM iot.r").await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compaction_merges_small_files() {
    let dir = tempfile::tempdir().unwrap();
    let env = [
        ("SLUICE_COMPACTION_MIN_FILES", "3"),
        ("SLUICE_COMPACTION_INTERVAL", "200ms"),
        ("SLUICE_BUFFER_CHECK_INTERVAL", "100ms"),
    ];
    let s = Server::start(dir.path(), &env);
    readings(&s).await;
    for i in 0..3 {
        s.write_ok(
            "iot",
            "readings",
            "text/csv",
            format!("2024-05-01 10:00:0{i},d{i},{i}\n2024-05-01 10:30:0{i},e{i},{i}"),
        )
        .await;
        s.sql_ok("FLUSH TABLE iot.readings").await;
    }
    eventually("files compacted", 30, || async {
        s.count("SELECT count(*) FROM system.files WHERE table_name = 'readings'")
            .await
            == 1
    })
    .await;
    assert_eq!(s.count("SELECT count(*) FROM iot.readings").await, 6);
    let ts: Vec<String> = s
        .rows("SELECT ts FROM iot.readings")
        .await
        .iter()
        .map(|r| r["ts"].as_str().unwrap().to_string())
        .collect();
    let mut sorted = ts.clone();
    sorted.sort();
    assert_eq!(ts, sorted, "the merged file is sorted by time");
    s.kill9();
    let s = Server::start(dir.path(), &env);
    assert_eq!(s.count("SELECT count(*) FROM iot.readings").await, 6);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_clear_errors_and_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), &[("SLUICE_HTTP_MAX_BODY_BYTES", "4096")]);
    readings(&s).await;
    s.write_ok("iot", "readings", "text/csv", "2024-05-01 10:00:00,d1,20")
        .await;

    // A bad row: 400 naming line and column; the good rows of the same request are not stored.
    let r = s
        .write(
            "iot",
            "readings",
            "text/csv",
            "2024-05-01 10:00:00,d1,20\n2024-05-01 10:00:01,d1,warm\n",
        )
        .await;
    assert_eq!(r.status, 400);
    let e = r.json();
    assert_eq!(e["error"]["code"], "bad_row");
    assert_eq!(
        e["error"]["message"],
        "line 2, column 'temp': 'warm' is not a number"
    );
    let r = s
        .write(
            "iot",
            "readings",
            "application/json",
            "{\"device\":\"a\"}\n{\"device\":\"b\",\"temp\":\"x\"}",
        )
        .await;
    assert_eq!(r.status, 400);
    assert!(
        r.json()["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("line 2, column 'temp'")
    );
    let r = s
        .write(
            "iot",
            "readings",
            "application/json",
            r#"{"ts":"yesterday","device":"a"}"#,
        )
        .await;
    assert_eq!(r.status, 400);
    assert!(
        r.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("column 'ts'")
    );
    let r = s
        .write("iot", "readings", "application/json", r#"{"device": "#)
        .await;
    assert_eq!(
        (r.status, r.json()["error"]["code"].as_str().unwrap()),
        (400, "bad_payload")
    );
    let r = s.write("iot", "readings", "text/csv", "1,2").await;
    assert!(
        r.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("expected 3 fields")
    );
    let r = s.write("iot", "readings", "text/csv", "").await;
    assert_eq!(r.status, 400);
    assert_eq!(s.count("SELECT count(*) FROM iot.readings").await, 1);

    // Unknown table or database: 404.
    let r = s.write("iot", "nope", "text/csv", "x").await;
    assert_eq!(
        (r.status, r.json()["error"]["code"].as_str().unwrap()),
        (404, "unknown_table")
    );
    assert_eq!(s.write("nodb", "t", "text/csv", "x").await.status, 404);

    // Too large: 413.
    let big = "2024-05-01 10:00:00,d1,20\n".repeat(400);
    let r = s.write("iot", "readings", "text/csv", big).await;
    assert_eq!(
        (r.status, r.json()["error"]["code"].as_str().unwrap()),
        (413, "too_large")
    );

    // Bad SQL: 400 with the position.
    let r = s.sql("SELEC 1").await;
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["error"]["code"], "bad_sql");
    let r = s.sql("CREATE TABLE iot.x (a Int9) PARTITION BY a").await;
    assert!(
        r.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("Line: 1, Column: 23"),
        "{}",
        r.body
    );
    let r = s.sql("SELECT nope FROM iot.readings").await;
    assert_eq!(r.status, 400, "{}", r.body);
    let r = s.sql("SELECT * FROM iot.missing").await;
    assert_eq!(
        (r.status, r.json()["error"]["code"].as_str().unwrap()),
        (404, "unknown_table")
    );
    assert!(r.body.contains("iot.missing"));
    let r = s
        .sql("SELECT count(*) FROM nodb.t JOIN iot.readings ON true")
        .await;
    assert_eq!(
        (r.status, r.json()["error"]["code"].as_str().unwrap()),
        (404, "unknown_database")
    );
    assert_eq!(s.sql("SELECT * FROM system.nope").await.status, 404);
    // Names inside string literals are not table references.
    s.sql_ok("SELECT 'FROM iot.missing' AS x").await;
    assert_eq!(s.sql("").await.status, 400);
    assert_eq!(s.sql_fmt("SELECT 1", "xml").await.status, 400);
    let r = s
        .sql("CREATE TABLE iot.y (a Int8) PARTITION BY ymdh(a)")
        .await;
    assert_eq!(
        (r.status, r.json()["error"]["code"].as_str().unwrap()),
        (400, "invalid_definition")
    );
    let r = s
        .sql("INSERT INTO iot.readings VALUES (now(), 'x', 1)")
        .await;
    assert_eq!(r.status, 400, "only literals in VALUES: {}", r.body);
    assert!(r.body.contains("a literal"), "{}", r.body);
    let r = s.sql("UPDATE iot.readings SET temp = 1").await;
    assert_eq!(r.status, 400, "other DML is refused: {}", r.body);
    let r = s
        .sql("INSERT INTO iot.readings (ts, temp) VALUES ('2024-05-01 10:00:00', 1), ('2024-05-01 10:00:01', 'hot')")
        .await;
    assert_eq!(
        r.json()["error"]["message"],
        "line 2, column 'temp': 'hot' is not a number"
    );
    let health = reqwest::get(s.url("/health")).await.unwrap();
    assert_eq!(health.status(), 200);
    assert_eq!(reqwest::get(s.url("/nope")).await.unwrap().status(), 404);
    assert_eq!(s.terminate(), 0);
}

/// With a tiny write queue, a burst is refused with 503 rather than queued without bound,
/// and every row that got a 204 is stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overload_is_refused_with_503() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), &[("SLUICE_HTTP_MAX_PENDING_WRITES", "1")]);
    readings(&s).await;
    let mut tasks = Vec::new();
    for i in 0..200 {
        let client = s.client();
        let url = s.url("/v1/write/iot/readings");
        tasks.push(tokio::spawn(async move {
            let r = client
                .post(&url)
                .header("content-type", "text/csv")
                .body(format!("2024-05-01 10:00:00,d{i},1"))
                .send()
                .await
                .unwrap();
            let status = r.status().as_u16();
            let body = r.text().await.unwrap();
            if status == 503 {
                assert!(body.contains("\"overloaded\""), "{body}");
            } else {
                assert_eq!(status, 204, "{body}");
            }
            status
        }));
    }
    let mut ok = 0;
    for t in tasks {
        if t.await.unwrap() == 204 {
            ok += 1;
        }
    }
    assert_eq!(s.count("SELECT count(*) FROM iot.readings").await, ok);
}

/// File < environment < flags, and a config file that names unknown keys is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn configuration_layers() {
    let dir = tempfile::tempdir().unwrap();
    let conf = dir.path().join("sluice.toml");
    let from_file = dir.path().join("from-file");
    let from_env = dir.path().join("from-env");
    let from_flag = dir.path().join("from-flag");
    std::fs::write(
        &conf,
        format!(
            "data_dir = {:?}\n[http]\nlisten = \"127.0.0.1:0\"\n",
            from_file.display().to_string()
        ),
    )
    .unwrap();
    let args = |extra: &[&str]| {
        let mut a = vec!["--config".to_string(), conf.display().to_string()];
        a.extend(extra.iter().map(|s| s.to_string()));
        a
    };
    let env_dir = vec![(
        "SLUICE_DATA_DIR".to_string(),
        from_env.display().to_string(),
    )];
    let s = Server::start_args(dir.path(), &args(&[]), vec![]);
    s.sql_ok("CREATE DATABASE a").await;
    assert_eq!(s.terminate(), 0);
    assert!(from_file.join("catalog.json").exists());
    let s = Server::start_args(dir.path(), &args(&[]), env_dir.clone());
    assert_eq!(s.terminate(), 0);
    assert!(from_env.join("catalog.json").exists());
    let flag = from_flag.display().to_string();
    let s = Server::start_args(dir.path(), &args(&["--data-dir", &flag]), env_dir);
    assert_eq!(s.terminate(), 0);
    assert!(from_flag.join("catalog.json").exists());

    std::fs::write(&conf, "[http]\nlistne = \"127.0.0.1:0\"\n").unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["serve", "--config"])
        .arg(&conf)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("listne"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Predicates on the partition column skip whole partitions: the plan names only the files
/// of the partitions that can match, and the answers equal those of an unpruned scan. (The
/// hot cache is off, or the files would be read from memory and not named.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partition_pruning_skips_files() {
    let dir = tempfile::tempdir().unwrap();
    // DataFusion's settings come from `DATAFUSION_*` variables (three lanes here).
    let env = [
        ("SLUICE_QUERY_HOT_CACHE_BYTES", "0"),
        ("DATAFUSION_EXECUTION_TARGET_PARTITIONS", "3"),
    ];
    let s = Server::start(dir.path(), &env);
    readings(&s).await;
    for h in 10..14 {
        let body = format!("2024-05-01 {h}:05:00,a,{h}\n2024-05-01 {h}:55:00,b,{h}.5");
        s.write_ok("iot", "readings", "text/csv", body).await;
    }
    s.sql_ok("FLUSH TABLE iot.readings").await;
    let files_in_plan = |plan: Vec<serde_json::Value>| -> usize {
        plan.iter()
            .map(|r| r["plan"].as_str().unwrap_or("").matches(".parquet").count())
            .sum()
    };
    let all = s
        .rows("EXPLAIN SELECT temp FROM iot.readings WHERE temp > 0")
        .await;
    assert_eq!(files_in_plan(all), 4);
    let window =
        "EXPLAIN SELECT lag(temp) OVER (PARTITION BY device ORDER BY ts) FROM iot.readings";
    let plan = format!("{:?}", s.rows(window).await);
    let lanes = plan.contains("Hash([device@") && plan.contains("], 3)");
    assert!(lanes, "{plan}");
    let q = "FROM iot.readings WHERE ts >= '2024-05-01 11:00:00' AND ts < '2024-05-01 12:30:00'";
    // (Rows, not a count: a count is answered from synopses where it can be.)
    let pruned = s.rows(&format!("EXPLAIN SELECT temp {q}")).await;
    assert_eq!(files_in_plan(pruned), 2, "hours 11 and 12 only");
    assert_eq!(s.count(&format!("SELECT count(*) {q}")).await, 3);
    // The same answer without pruning (the predicate hidden from the partition column).
    let unpruned = "SELECT count(*) FROM iot.readings WHERE ts + INTERVAL '1 hour' >= TIMESTAMP '2024-05-01 12:00:00' AND ts + INTERVAL '1 hour' < TIMESTAMP '2024-05-01 13:30:00'";
    assert_eq!(s.count(unpruned).await, 3);
    // Contradictory bounds match nothing (and must not upset the scan).
    assert_eq!(
        s.count("SELECT count(*) FROM iot.readings WHERE ts >= '2024-05-01 13:00:00' AND ts < '2024-05-01 11:00:00'").await,
        0
    );
    // A rem() divisor beyond i64 and the most negative key do not overflow.
    let r = s
        .sql("CREATE TABLE iot.k (k Int64, v Int64) PARTITION BY rem(k, 18446744073709551615)")
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    let r = s
        .sql("INSERT INTO iot.k VALUES (-9223372036854775808, 1)")
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(
        s.count("SELECT count(*) FROM iot.k WHERE k = -9223372036854775808")
            .await,
        1
    );
    let eq = s
        .rows("EXPLAIN SELECT * FROM iot.readings WHERE ts = '2024-05-01 13:55:00'")
        .await;
    assert_eq!(files_in_plan(eq), 1);
}

/// Results larger than one batch stream out whole in every format.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_results_stream_in_every_format() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), &[]);
    readings(&s).await;
    let n = 30_000;
    let body: String = (0..n)
        .map(|i| {
            format!(
                "2024-05-01 {:02}:{:02}:{:02},d{},{i}\n",
                10 + i / 3600 % 10,
                i / 60 % 60,
                i % 60,
                i % 7
            )
        })
        .collect();
    s.write_ok("iot", "readings", "text/csv", body).await;
    let q = "SELECT device, temp FROM iot.readings ORDER BY temp";
    // A result of one batch (an alert's row) goes out whole, with its length; a longer one
    // streams (chunked).
    for (sql, whole) in [("SELECT count(*) FROM iot.readings", true), (q, false)] {
        let r = s.client().post(s.url("/v1/sql")).body(sql).send().await;
        let r = r.unwrap();
        assert_eq!(r.status(), 200);
        let length = r.headers().get("content-length").is_some();
        assert_eq!(length, whole, "{sql}: content-length");
    }
    let json = s.rows(q).await;
    assert_eq!(json.len(), n);
    assert_eq!(
        json[n - 1],
        serde_json::json!({"device": format!("d{}", (n - 1) % 7), "temp": (n - 1) as f64})
    );
    let csv = s.sql_fmt(q, "csv").await;
    assert_eq!(
        csv.body.lines().count(),
        n + 1,
        "header once, then every row"
    );
    assert_eq!(csv.body.lines().filter(|l| *l == "device,temp").count(), 1);
    let jsonl = s.sql_fmt(q, "jsonl").await;
    assert_eq!(jsonl.body.lines().count(), n);
    for format in ["arrow", "parquet"] {
        let r = s
            .client()
            .post(s.url(&format!("/v1/sql?format={format}")))
            .body(q)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        let bytes = r.bytes().await.unwrap();
        let magic: &[u8] = if format == "parquet" {
            b"PAR1"
        } else {
            &[0xff, 0xff, 0xff, 0xff]
        };
        assert!(bytes.starts_with(magic), "{format}");
        assert!(bytes.len() > n, "{format}: {} bytes", bytes.len());
    }
    // Empty results are still well-formed.
    assert_eq!(
        s.sql("SELECT * FROM iot.readings WHERE temp < 0")
            .await
            .body,
        "[]"
    );
    // An error found while running (not planning) still gets a status and a JSON error.
    let r = s.sql("SELECT CAST(device AS INT) FROM iot.readings").await;
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(r.json()["error"]["message"].as_str().is_some());
}
