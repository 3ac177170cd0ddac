//! Tests of `messages`.

use super::*;
use crate::ports::QueryPort;
use datafusion::arrow::util::pretty::pretty_format_batches;
use futures::TryStreamExt;

async fn open(dir: &std::path::Path) -> Arc<Engine> {
    let config = sluice_conf::Config {
        data_dir: dir.to_path_buf(),
        ..Default::default()
    };
    Engine::open(config).await.unwrap()
}

async fn query(e: &Engine, sql: &str) -> String {
    let out = e.execute(sql).await.unwrap();
    let batches: Vec<_> = out.stream.try_collect().await.unwrap();
    pretty_format_batches(&batches).unwrap().to_string()
}

#[tokio::test]
async fn json_mappings_option_from_create_to_write() {
    let dir = tempfile::tempdir().unwrap();
    let e = open(dir.path()).await;
    e.execute(
        "CREATE TABLE iot.s (ts TIMESTAMP, dev_id String, sensor_id Int32, value DOUBLE) \
         PARTITION BY yyyymmdd(ts) \
         WITH (json_mappings = 'sensor_id <- ''/data/*/0'', value <- /data/*/1')",
    )
    .await
    .unwrap();
    let def = e.table("iot", "s").unwrap();
    let body = br#"{"dev_id":"id-01","data":[[1,25.1],[2,25.5],[3,25.9]]}"#;
    let r = e
        .write_message(&def, Format::Json, body, &[], None)
        .await
        .unwrap();
    assert_eq!(r.rows, 3);
    let got = query(
        &e,
        "SELECT dev_id, sensor_id, value FROM iot.s ORDER BY sensor_id",
    )
    .await;
    assert!(got.contains("| id-01  | 3         | 25.9  |"), "{got}");
    let shown = query(&e, "SHOW CREATE TABLE iot.s").await;
    assert!(
        shown.contains("json_mappings = 'sensor_id <- ''/data/*/0''"),
        "{shown}"
    );

    // Checked when created and when changed; a refused change changes nothing.
    let bad = e
        .execute("CREATE TABLE iot.t (ts TIMESTAMP, v DOUBLE) PARTITION BY yyyymmdd(ts) WITH (json_mappings = 'w <- /v')")
        .await
        .unwrap_err();
    assert!(matches!(bad, Error::InvalidDefinition { .. }), "{bad}");
    assert_eq!(
        bad.to_string(),
        "invalid json_mappings: 'w' is not a column of iot.t"
    );
    assert!(matches!(
        e.table("iot", "t"),
        Err(Error::UnknownTable { .. })
    ));
    let bad = e
        .execute("ALTER TABLE iot.s SET (json_mappings = 'value <- /a/*/0, sensor_id <- /b/*/0')")
        .await
        .unwrap_err();
    assert!(
        bad.to_string().contains("flatten different arrays"),
        "{bad}"
    );
    assert_eq!(e.table("iot", "s").unwrap(), def);

    // Double quotes spare the doubled single quotes; the new mapping is used at once.
    e.execute(r#"ALTER TABLE iot.s SET (json_mappings = "value <- '/reading/v', sensor_id <- /reading/id")"#)
        .await
        .unwrap();
    let def = e.table("iot", "s").unwrap();
    let body = br#"{"dev_id":"id-02","reading":{"id":9,"v":1.5}}"#;
    e.write_message(&def, Format::Json, body, &[], None)
        .await
        .unwrap();
    let got = query(&e, "SELECT dev_id, value FROM iot.s WHERE sensor_id = 9").await;
    assert!(got.contains("| id-02  | 1.5   |"), "{got}");
    // An empty value removes the option.
    e.execute("ALTER TABLE iot.s SET (json_mappings = '')")
        .await
        .unwrap();
    assert!(e.table("iot", "s").unwrap().options.is_empty());
    e.shutdown().await.unwrap();
}

#[tokio::test]
async fn write_message_with_topic_columns() {
    let dir = tempfile::tempdir().unwrap();
    let e = open(dir.path()).await;
    e.execute("CREATE TABLE iot.t (site String, device String, ts TIMESTAMP, temp DOUBLE) PARTITION BY yyyymmdd(ts)")
        .await
        .unwrap();
    let def = e.table("iot", "t").unwrap();
    let fixed = [(0, "plant-a".to_string()), (1, "d7".to_string())];
    let r = e
        .write_message(
            &def,
            Format::Csv,
            b"2026-01-01T00:00:00Z,21.5",
            &fixed,
            None,
        )
        .await
        .unwrap();
    assert_eq!(r.rows, 1);
    e.write_message(
        &def,
        Format::LineProtocol,
        b"m temp=22 1767225601000000000",
        &fixed,
        None,
    )
    .await
    .unwrap();
    let got = query(&e, "SELECT site, device, ts, temp FROM iot.t ORDER BY ts").await;
    assert!(
        got.contains("| plant-a | d7     | 2026-01-01T00:00:01 | 22.0 |"),
        "{got}"
    );
    let err = e
        .write_message(&def, Format::LineProtocol, b"m temp=1i,hum=3", &fixed, None)
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "line 1, column 'hum': no such column in iot.t"
    );
    e.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn table_for_json_creates_and_widens() {
    let dir = tempfile::tempdir().unwrap();
    let e = open(dir.path()).await;
    let body =
        br#"{"device":"d1","temp":21.5,"ok":true,"at":"2026-01-01T00:00:00Z","extra":{"a":[1]}}"#;
    let err = e.table_for_json("nodb", "t", body).await.unwrap_err();
    assert!(matches!(err, Error::UnknownDatabase { .. }), "{err}");
    e.execute("CREATE DATABASE iot").await.unwrap();

    // Many first messages at once: one table, every caller sees it.
    let calls = (0..8).map(|_| {
        let e = e.clone();
        tokio::spawn(async move { e.table_for_json("iot", "auto", body).await })
    });
    for call in futures::future::join_all(calls).await {
        call.unwrap().unwrap();
    }
    let def = e.table("iot", "auto").unwrap();
    let cols: Vec<(&str, ColumnType)> = def
        .columns
        .iter()
        .map(|c| (c.name.as_str(), c.ty))
        .collect();
    assert_eq!(
        cols,
        [
            ("ts", ColumnType::Timestamp),
            ("device", ColumnType::String),
            ("temp", ColumnType::Float64),
            ("ok", ColumnType::Bool),
            ("at", ColumnType::Timestamp),
            ("extra", ColumnType::String),
        ]
    );
    assert_eq!(def.partition, PartitionFn::Yyyymmdd { days: 1 });
    assert_eq!(def.partition_column, 0);
    e.write_message(&def, Format::Json, body, &[], None)
        .await
        .unwrap();
    let got = query(
        &e,
        "SELECT device, extra, ts IS NOT NULL AS has_ts FROM iot.auto",
    )
    .await;
    assert!(got.contains(r#"| d1     | {"a":[1]} | true   |"#), "{got}");

    // A later message with a new field widens the table; known fields stay as they are.
    let def = e
        .table_for_json("iot", "auto", br#"{"device":"d2","hum":40}"#)
        .await
        .unwrap();
    assert_eq!(def.columns.len(), 7);
    assert_eq!(def.columns[6].name, "hum");
    assert!(def.columns[6].nullable);
    let same = e
        .table_for_json("iot", "auto", br#"{"hum":41}"#)
        .await
        .unwrap();
    assert_eq!(same, def);

    // A `ts` (or `time`, `timestamp`) field holding a time or an epoch is the time column.
    let def = e
        .table_for_json("iot", "epoch", br#"[{"time":1767225600,"v":1}]"#)
        .await
        .unwrap();
    assert_eq!(def.columns[def.partition_column].name, "time");
    assert_eq!(def.columns[0].ty, ColumnType::Timestamp);
    // A `ts` that is not a time leaves the name to the payload.
    let def = e
        .table_for_json("iot", "named", br#"{"ts":"soon","v":1}"#)
        .await
        .unwrap();
    assert_eq!(def.columns[def.partition_column].name, "time");
    let err = e
        .table_for_json("iot", "bad", br#"{"temp-c":1}"#)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::InvalidDefinition { .. }), "{err}");
    e.shutdown().await.unwrap();
}
