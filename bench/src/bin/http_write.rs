//! End-to-end write benchmark: N single-row HTTP writes from C concurrent connections into a
//! real `sluice serve` (fsync durability), then PostgreSQL doing N single-row durable INSERTs
//! from C connections (pgbench, fsync and synchronous_commit on) on the same machine, in the
//! same run. Prints both figures and the ratio.
//!
//! `cargo run --release -p sluice-bench --bin http_write -- --rows 200000 --connections 32`

use anyhow::{Context, Result, bail};
use clap::Parser;
use sluice_bench::{Killer, Sluice};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[derive(Parser, Debug)]
struct Args {
    /// Rows to write in total.
    #[arg(long, default_value_t = 100_000)]
    rows: usize,
    /// Concurrent connections (each one HTTP keep-alive connection / one PostgreSQL session).
    #[arg(long, default_value_t = 32)]
    connections: usize,
    /// The sluice binary (default: target/release/sluice next to this runner).
    #[arg(long)]
    sluice: Option<PathBuf>,
    /// Skip PostgreSQL.
    #[arg(long)]
    no_postgres: bool,
    /// Rounds, alternating Sluice and PostgreSQL; the median round of each is reported
    /// (disk write-back from one run disturbs the next, so one round is noisy).
    #[arg(long, default_value_t = 3)]
    rounds: usize,
}

fn main() -> Result<()> {
    let args = Args::parse();
    let dir = tempfile::tempdir()?;
    // PostgreSQL runs as its own user when we are root: let it reach the per-round dirs.
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )?;
    let sluice = Sluice::binary(args.sluice.as_deref())?;
    let rt = sluice_bench::runtime()?;
    let mut ours = Vec::new();
    let mut theirs = Vec::new();
    for round in 0..args.rounds.max(1) {
        let round_dir = dir.path().join(format!("round{round}"));
        std::fs::create_dir_all(&round_dir)?;
        let s = rt.block_on(run_sluice(&sluice, &round_dir, &args))?;
        eprintln!("round {round}: Sluice {:.0} rows/s", s.0);
        ours.push(s);
        if !args.no_postgres {
            let p = run_postgres(&round_dir, &args)?;
            eprintln!("round {round}: PostgreSQL {:.0} rows/s", p.0);
            theirs.push(p);
        }
    }
    let median = |v: &mut Vec<(f64, f64, f64)>| {
        v.sort_by(|a, b| a.0.total_cmp(&b.0));
        v[v.len() / 2]
    };
    let ours = median(&mut ours);
    println!();
    println!("| system | rows/s | p50 ms | p99 ms |");
    println!("|---|---|---|---|");
    println!(
        "| Sluice HTTP, 1 row/request, fsync | {:.0} | {:.2} | {:.2} |",
        ours.0, ours.1, ours.2
    );
    if !theirs.is_empty() {
        let pg = median(&mut theirs);
        println!(
            "| PostgreSQL INSERT, 1 row/txn, fsync | {:.0} | {:.2} (avg) | - |",
            pg.0, pg.1
        );
        println!(
            "\nratio Sluice / PostgreSQL: {:.2}x  ({} rows, {} connections, median of {} rounds)",
            ours.0 / pg.0,
            args.rows,
            args.connections,
            args.rounds.max(1)
        );
    }
    Ok(())
}

async fn run_sluice(bin: &Path, dir: &Path, args: &Args) -> Result<(f64, f64, f64)> {
    let sluice = Sluice::start(bin, dir)?;
    sluice.sql("CREATE DATABASE bench").await?;
    sluice
        .sql("CREATE TABLE bench.readings (ts TIMESTAMP, device VARCHAR, temp DOUBLE) PARTITION BY ymdh(ts)")
        .await?;
    let addr = &sluice.http;
    let url = format!("http://{addr}/v1/write/bench/readings");
    let per = args.rows / args.connections;
    let start = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..args.connections {
        let url = url.clone();
        tasks.push(tokio::spawn(async move {
            // One client per task: one keep-alive connection each, like one device gateway.
            let client = reqwest::Client::builder()
                .pool_max_idle_per_host(1)
                .build()
                .expect("client");
            let mut lat = Vec::with_capacity(per);
            for i in 0..per {
                let body = format!(
                    "2024-05-01 10:{:02}:{:02},dev-{c},{}.5",
                    (i / 60) % 60,
                    i % 60,
                    i % 40
                );
                let t = Instant::now();
                let r = client
                    .post(&url)
                    .header("content-type", "text/csv")
                    .body(body)
                    .send()
                    .await?;
                if r.status() != 204 {
                    bail!("write failed: {} {}", r.status(), r.text().await?);
                }
                lat.push(t.elapsed());
            }
            Ok::<_, anyhow::Error>(lat)
        }));
    }
    let mut lat: Vec<Duration> = Vec::with_capacity(args.rows);
    for t in tasks {
        lat.extend(t.await??);
    }
    let secs = start.elapsed().as_secs_f64();
    let r = sluice
        .sql("SELECT count(*) AS n FROM bench.readings")
        .await?;
    if !r.contains(&format!("{}", per * args.connections)) {
        bail!("row count mismatch: {r}");
    }
    lat.sort();
    let pct =
        |p: f64| lat[((lat.len() as f64 * p) as usize).min(lat.len() - 1)].as_secs_f64() * 1000.0;
    Ok(((per * args.connections) as f64 / secs, pct(0.5), pct(0.99)))
}

fn pg_bin() -> Result<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .context("PostgreSQL is not installed (apt-get install postgresql)")?
        .filter_map(|e| e.ok().map(|e| e.path().join("bin")))
        .filter(|p| p.join("pgbench").exists())
        .collect();
    dirs.sort();
    dirs.pop()
        .context("no PostgreSQL bin directory with pgbench")
}

fn run_postgres(dir: &Path, args: &Args) -> Result<(f64, f64, f64)> {
    let bin = pg_bin()?;
    let data = dir.join("pg");
    std::fs::create_dir_all(&data)?;
    // PostgreSQL refuses to run as root; run it as the postgres user when we are root.
    let as_pg = |prog: &str| -> Command {
        let is_root = unsafe_geteuid() == 0;
        if is_root {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(bin.join(prog));
            c
        } else {
            Command::new(bin.join(prog))
        }
    };
    if unsafe_geteuid() == 0 {
        Command::new("chown")
            .args(["-R", "postgres"])
            .arg(dir)
            .status()?;
        Command::new("chmod").args(["755"]).arg(dir).status()?;
    }
    let ok = as_pg("initdb")
        .args(["-D"])
        .arg(&data)
        .args(["-A", "trust", "-U", "postgres"])
        .stdout(Stdio::null())
        .status()?;
    if !ok.success() {
        bail!("initdb failed");
    }
    let port = free_port()?;
    let server = as_pg("postgres")
        .arg("-D")
        .arg(&data)
        .args(["-p", &port.to_string(), "-k"])
        .arg(&data)
        .args([
            "-c",
            "listen_addresses=127.0.0.1",
            "-c",
            "fsync=on",
            "-c",
            "synchronous_commit=on",
            "-c",
            "max_connections=200",
            "-c",
            "shared_buffers=256MB",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
    let _guard = Killer(server);
    let psql = |sql: &str| -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let s = as_pg("psql")
                .args([
                    "-h",
                    "127.0.0.1",
                    "-p",
                    &port.to_string(),
                    "-U",
                    "postgres",
                    "-q",
                    "-c",
                    sql,
                ])
                .stderr(Stdio::null())
                .status()?;
            if s.success() {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("psql failed: {sql}");
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    };
    psql("CREATE TABLE readings (ts timestamp, device text, temp double precision)")?;
    let script = data.join("insert.sql");
    std::fs::write(
        &script,
        "\\set i random(0, 59)\nINSERT INTO readings VALUES (timestamp '2024-05-01 10:00:00' + :i * interval '1 second', 'dev-' || :client_id, :i + 0.5);\n",
    )?;
    let per = args.rows / args.connections;
    let out = as_pg("pgbench")
        .args([
            "-n",
            "-h",
            "127.0.0.1",
            "-p",
            &port.to_string(),
            "-U",
            "postgres",
            "-c",
            &args.connections.to_string(),
            "-j",
            "2",
            "-t",
            &per.to_string(),
            "-f",
        ])
        .arg(&script)
        .arg("postgres")
        .output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let tps = text
        .lines()
        .find(|l| l.starts_with("tps = "))
        .and_then(|l| l.split_whitespace().nth(2))
        .and_then(|v| v.parse::<f64>().ok())
        .with_context(|| {
            format!(
                "pgbench output: {text}{}",
                String::from_utf8_lossy(&out.stderr)
            )
        })?;
    let latency = text
        .lines()
        .find(|l| l.starts_with("latency average = "))
        .and_then(|l| l.split_whitespace().nth(3))
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or(f64::NAN);
    Ok((tps, latency, f64::NAN))
}

fn unsafe_geteuid() -> u32 {
    // Avoid a libc dependency: the effective uid is in /proc.
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(2)?.parse().ok())
        })
        .unwrap_or(u32::MAX)
}

fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}
