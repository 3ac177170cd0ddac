//! A full disk refuses writes with 507 and a clear reason, loses nothing acknowledged, and
//! writing resumes once space is back. The data directory is a small tmpfs mounted by the
//! test (the test command runs as root, as CI does).

mod common;

use common::Server;
use std::path::{Path, PathBuf};
use std::process::Command;

struct Mount(PathBuf);
impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

fn mount_tmpfs(dir: &Path, size: &str) -> Mount {
    std::fs::create_dir_all(dir).unwrap();
    let out = Command::new("mount")
        .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
        .arg(dir)
        .output()
        .expect("run mount");
    assert!(
        out.status.success(),
        "mounting a tmpfs needs root (scripts/test.sh and CI run as root): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Mount(dir.to_path_buf())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_disk_refuses_writes_and_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let _mount = mount_tmpfs(&data, "1m");
    let s = Server::start(dir.path(), &[]);
    s.sql_ok("CREATE DATABASE iot").await;
    assert_eq!(
        s.sql(
            "CREATE TABLE iot.r (ts TIMESTAMP, device VARCHAR, note VARCHAR) PARTITION BY ymdh(ts)"
        )
        .await
        .status,
        200
    );
    let note = "x".repeat(2000);
    let mut acked = 0u64;
    let mut refused = None;
    for i in 0..2000 {
        let r = s
            .write(
                "iot",
                "r",
                "text/csv",
                format!("2024-05-01 10:00:00,d{i},{note}"),
            )
            .await;
        match r.status {
            204 => acked += 1,
            507 => {
                refused = Some(r.json());
                break;
            }
            other => panic!("unexpected {other}: {}", r.body),
        }
    }
    let refused = refused.expect("a 1 MiB disk fills up");
    assert_eq!(refused["error"]["code"], "disk_full");
    assert!(acked > 0);
    // Still serving, and every acknowledged row is there.
    assert_eq!(s.count("SELECT count(*) FROM iot.r").await, acked);
    // Space comes back: writing resumes without a restart.
    let ok = Command::new("mount")
        .args(["-o", "remount,size=16m"])
        .arg(&data)
        .status()
        .unwrap();
    assert!(ok.success());
    s.write_ok("iot", "r", "text/csv", "2024-05-01 10:00:00,after,y")
        .await;
    s.kill9();
    let s = Server::start(dir.path(), &[]);
    assert_eq!(s.count("SELECT count(*) FROM iot.r").await, acked + 1);
    assert_eq!(s.terminate(), 0);
}
