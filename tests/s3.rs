//! Parquet on an S3-compatible store: moto's S3 server (PyPI `moto[server]`, installed by the
//! test command) started on 127.0.0.1, and the real binary configured with `s3://`.

mod common;

use common::Server;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

struct Moto(Child);
impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_moto() -> (Moto, u16) {
    let deadline = Instant::now() + Duration::from_secs(30);
    // A port found free may be taken before moto binds it (another test picks ports too):
    // then moto exits, and another port is tried.
    loop {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = Command::new("moto_server")
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect(
                "moto_server is needed (pip install 'moto[server]'; scripts/test.sh installs it)",
            );
        let mut moto = Moto(child);
        let left = deadline
            .saturating_duration_since(Instant::now())
            .as_secs()
            .max(1);
        let mut exited = false;
        common::wait_until(
            left,
            || "moto_server did not start".into(),
            || {
                exited = moto.0.try_wait().unwrap().is_some();
                exited || std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
            },
        );
        if !exited {
            return (moto, port);
        }
    }
}

/// moto with a bucket `sluice-test`, and the `SLUICE_*` settings that point Sluice at it.
async fn bucket(prefix: &str) -> (Moto, String, Vec<(String, String)>) {
    let (moto, port) = start_moto();
    let endpoint = format!("http://127.0.0.1:{port}");
    // Retried while moto finishes starting (its port may answer before it serves).
    let created = common::poll(30, || async {
        let put = reqwest::Client::new().put(format!("{endpoint}/sluice-test"));
        put.send().await.map_err(|e| e.to_string())
    })
    .await;
    let r = created.unwrap_or_else(|e| panic!("create bucket: {e}"));
    assert!(r.status().is_success(), "create bucket: {}", r.status());
    let env = [
        ("SLUICE_STORAGE_URL", format!("s3://sluice-test/{prefix}")),
        ("SLUICE_STORAGE_S3_ENDPOINT", endpoint.clone()),
        ("SLUICE_STORAGE_S3_ALLOW_HTTP", "true".into()),
        ("SLUICE_STORAGE_S3_ACCESS_KEY_ID", "test".into()),
        ("SLUICE_STORAGE_S3_SECRET_ACCESS_KEY", "test".into()),
    ];
    (
        moto,
        endpoint,
        env.into_iter().map(|(k, v)| (k.to_string(), v)).collect(),
    )
}

fn as_env(env: &[(String, String)]) -> Vec<(&str, &str)> {
    env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parquet_and_manifest_live_on_s3() {
    let (_moto, endpoint, owned) = bucket("warehouse").await;
    let env = as_env(&owned);
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), &env);
    s.sql_ok("CREATE DATABASE iot").await;
    s.sql_ok("CREATE TABLE iot.r (ts TIMESTAMP, v DOUBLE) PARTITION BY yyyymmdd(ts)")
        .await;
    s.write_ok(
        "iot",
        "r",
        "text/csv",
        "2024-05-01 10:00:00,1\n2024-05-02 10:00:00,2",
    )
    .await;
    let r = s.sql("FLUSH TABLE iot.r").await;
    assert_eq!(r.status, 200, "{}", r.body);
    s.write_ok("iot", "r", "text/csv", "2024-05-02 11:00:00,3")
        .await;
    assert_eq!(
        s.count("SELECT count(*) FROM system.files WHERE table_name = 'r'")
            .await,
        2
    );
    // The objects are really in the bucket, under the prefix.
    let listing = reqwest::get(format!(
        "{endpoint}/sluice-test?list-type=2&prefix=warehouse/"
    ))
    .await
    .unwrap()
    .text()
    .await
    .unwrap();
    assert!(listing.contains("warehouse/tables/"), "{listing}");
    assert!(listing.contains("warehouse/manifest/"), "{listing}");
    assert!(
        !dir.path().join("data/objects").exists(),
        "nothing on local disk"
    );
    s.kill9();
    let s = Server::start(dir.path(), &env);
    assert_eq!(s.rows("SELECT sum(v) AS s FROM iot.r").await[0]["s"], 6.0);
    assert_eq!(
        s.count("SELECT count(*) FROM iot.r WHERE ts >= '2024-05-02 00:00:00'")
            .await,
        2
    );
}

/// When the object store goes away, flushes fail, rows stay safe in the log and memory, and
/// once too much waits, writes are refused with 503 `buffers_full` instead of growing memory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_store_refuses_writes_visibly() {
    let (moto, _endpoint, mut owned) = bucket("w").await;
    owned.push(("SLUICE_BUFFER_TOTAL_MAX_BYTES".into(), "20000".into()));
    owned.push(("SLUICE_BUFFER_CHECK_INTERVAL".into(), "50ms".into()));
    let env = as_env(&owned);
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), &env);
    s.sql_ok("CREATE TABLE iot.r (ts TIMESTAMP, note VARCHAR) PARTITION BY ymdh(ts)")
        .await;
    drop(moto);
    let note = "n".repeat(1000);
    let mut acked = 0u64;
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let refusal = loop {
        assert!(
            std::time::Instant::now() < deadline,
            "writes were never refused"
        );
        let r = s
            .write(
                "iot",
                "r",
                "text/csv",
                format!("2024-05-01 10:00:00,{note}"),
            )
            .await;
        match r.status {
            204 => acked += 1,
            503 => break r.json(),
            other => panic!("{other}: {}", r.body),
        }
    };
    assert_eq!(refusal["error"]["code"], "buffers_full");
    assert_eq!(s.count("SELECT count(*) FROM iot.r").await, acked);
}
