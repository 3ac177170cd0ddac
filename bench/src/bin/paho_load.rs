//! Devices as they are: Eclipse Paho for Go (`bench/paho`, built by this runner with `go
//! build`), one message in flight per connection, against a real `sluice serve` (every
//! message stored, acknowledged once durable) and Mosquitto (no persistence) in the same run,
//! alternating which goes first each round. Loads:
//!
//! - `burst8`, `burst64`: 8 / 64 connections, QoS 1, each waiting for its PUBACK;
//! - `qos0`: 8 connections at QoS 0 (each connection's last message at QoS 1, so the run
//!   ends once everything before it was handled);
//! - `fleet2000`, `fleet10000`: 2,000 connections publishing once a second / 10,000 once
//!   every 10 s, QoS 1; the memory each server holds per idle connection is read from
//!   `/proc/PID/status` (VmRSS) once the fleet is connected and before it publishes.
//!
//! For each it prints messages/s, mean, p50 and p99 publish-to-PUBACK, each server's CPU per
//! message (user + system time from `/proc/PID/stat`) and the ratios; before the loads, the
//! fdatasync latency of the data directory's disk. Sluice's stored rows are counted against
//! the acknowledged messages after every load. It also prints the CPU time one write +
//! fdatasync costs on that disk (the floor of a message stored alone) and, for the fleets,
//! Sluice's CPU per message beyond it. `SLUICE_WAL_DURABILITY=none` in the runner's
//! environment starts Sluice without fdatasync, to compare the rest of its path with
//! Mosquitto's.
//!
//! `cargo build --release -p sluice -p sluice-bench --bins`, then
//! `~/.cache/sluice-target/release/paho_load --rounds 3`

use anyhow::{Context, Result, bail};
use clap::Parser;
use sluice_bench::{Killer, Sluice, cpu_secs};
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[derive(Parser, Debug, Clone)]
struct Args {
    /// Rounds; each runs every load on both servers, alternating which goes first.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Loads to run, of burst8, burst64, qos0, fleet2000, fleet10000.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "burst8,burst64,qos0,fleet2000,fleet10000"
    )]
    loads: Vec<String>,
    /// Messages per burst load (split evenly over its connections).
    #[arg(long, default_value_t = 60_000)]
    messages: usize,
    /// How long a fleet publishes, in seconds.
    #[arg(long, default_value_t = 20)]
    fleet_secs: u64,
    /// The sluice binary (default: next to this runner).
    #[arg(long)]
    sluice: Option<PathBuf>,
    /// Only Sluice (no Mosquitto side).
    #[arg(long)]
    no_mosquitto: bool,
}

/// One load's shape.
#[derive(Debug, Clone, Copy)]
struct Load {
    name: &'static str,
    conns: usize,
    qos: u8,
    /// Fleet mode: one message per connection every this many seconds.
    every_secs: u64,
}

const LOADS: [Load; 5] = [
    Load {
        name: "burst8",
        conns: 8,
        qos: 1,
        every_secs: 0,
    },
    Load {
        name: "burst64",
        conns: 64,
        qos: 1,
        every_secs: 0,
    },
    Load {
        name: "qos0",
        conns: 8,
        qos: 0,
        every_secs: 0,
    },
    Load {
        name: "fleet2000",
        conns: 2000,
        qos: 1,
        every_secs: 1,
    },
    Load {
        name: "fleet10000",
        conns: 10_000,
        qos: 1,
        every_secs: 10,
    },
];

/// What the Go client reports (its last line), plus the server's side.
#[derive(Debug, Clone, Default, serde::Deserialize)]
struct Figures {
    sent: u64,
    acked: u64,
    errors: u64,
    rate: f64,
    mean_ms: f64,
    p50_ms: f64,
    p99_ms: f64,
    #[serde(default)]
    first_error: Option<String>,
    /// Server CPU seconds over the publishing.
    #[serde(skip)]
    cpu_secs: f64,
    /// Server memory per connected, idle client (fleets), in KiB.
    #[serde(skip)]
    kib_per_conn: Option<f64>,
    /// Sluice: records per group commit (one fdatasync) over the load.
    #[serde(skip)]
    per_sync: Option<f64>,
}

impl Figures {
    fn cpu_us_per_msg(&self) -> f64 {
        self.cpu_secs * 1e6 / self.sent.max(1) as f64
    }
}

fn main() -> Result<()> {
    let args = Args::parse();
    let loads: Vec<Load> = (args.loads.iter())
        .map(|n| {
            LOADS
                .iter()
                .find(|l| l.name == n)
                .copied()
                .with_context(|| format!("unknown load {n}"))
        })
        .collect::<Result<_>>()?;
    let dir = tempfile::tempdir()?;
    let client = build_client(dir.path())?;
    let sluice_bin = Sluice::binary(args.sluice.as_deref())?;
    let (sync_p50, sync_mean, sync_cpu) = fdatasync_latency(dir.path())?;
    eprintln!(
        "fdatasync on the data directory's disk: p50 {sync_p50:.0} µs, mean {sync_mean:.0} µs; \
         {sync_cpu:.1} µs of CPU per write + fdatasync"
    );
    let rt = sluice_bench::runtime()?;
    // Per load name, each side's rounds.
    let mut ours: BTreeMap<&str, Vec<Figures>> = BTreeMap::new();
    let mut theirs: BTreeMap<&str, Vec<Figures>> = BTreeMap::new();
    for round in 0..args.rounds.max(1) {
        let round_dir = dir.path().join(format!("round{round}"));
        std::fs::create_dir_all(&round_dir)?;
        let sluice_first = round % 2 == 0 || args.no_mosquitto;
        for side in 0..2 {
            let is_sluice = (side == 0) == sluice_first;
            if !is_sluice && args.no_mosquitto {
                continue;
            }
            let figures = if is_sluice {
                rt.block_on(run_sluice(&sluice_bin, &round_dir, &client, &loads, &args))?
            } else {
                run_mosquitto(&round_dir, &client, &loads, &args)?
            };
            for (load, f) in loads.iter().zip(figures) {
                eprintln!(
                    "round {round}: {} {}: {:.0} msg/s, mean {:.3} ms, p99 {:.3} ms, {:.1} µs CPU/msg{}{}",
                    if is_sluice { "Sluice" } else { "Mosquitto" },
                    load.name,
                    f.rate,
                    f.mean_ms,
                    f.p99_ms,
                    f.cpu_us_per_msg(),
                    f.kib_per_conn
                        .map(|k| format!(", {k:.1} KiB/conn"))
                        .unwrap_or_default(),
                    f.per_sync
                        .map(|r| format!(", {r:.2} records per fdatasync"))
                        .unwrap_or_default()
                );
                let into = if is_sluice { &mut ours } else { &mut theirs };
                into.entry(load.name).or_default().push(f);
            }
        }
    }
    report(
        &loads,
        &mut ours,
        &mut theirs,
        (sync_p50, sync_cpu),
        args.rounds.max(1),
    );
    Ok(())
}

/// Prints each load's medians (by rate) and the ratios.
fn report(
    loads: &[Load],
    ours: &mut BTreeMap<&str, Vec<Figures>>,
    theirs: &mut BTreeMap<&str, Vec<Figures>>,
    (sync_p50, sync_cpu): (f64, f64),
    rounds: usize,
) {
    let median = |v: Option<&mut Vec<Figures>>| {
        let v = v?;
        v.sort_by(|a, b| a.rate.total_cmp(&b.rate));
        v.get(v.len() / 2).cloned()
    };
    println!(
        "\nEclipse Paho (Go), one message in flight per connection; Sluice acks when durable \
         (fsync p50 {sync_p50:.0} µs), Mosquitto without persistence; median of {rounds} rounds\n"
    );
    println!("| load | server | msg/s | mean ms | p50 ms | p99 ms | CPU µs/msg | KiB/idle conn |");
    println!("|---|---|---|---|---|---|---|---|");
    let mut ratios = Vec::new();
    for l in loads {
        let (a, b) = (median(ours.get_mut(l.name)), median(theirs.get_mut(l.name)));
        for (name, f) in [("Sluice", &a), ("Mosquitto", &b)] {
            if let Some(f) = f {
                println!(
                    "| {} ({} conns, QoS {}{}) | {name} | {:.0} | {:.3} | {:.3} | {:.3} | {:.1} | {} |",
                    l.name,
                    l.conns,
                    l.qos,
                    if l.every_secs > 0 {
                        format!(", 1 msg/{} s each", l.every_secs)
                    } else {
                        String::new()
                    },
                    f.rate,
                    f.mean_ms,
                    f.p50_ms,
                    f.p99_ms,
                    f.cpu_us_per_msg(),
                    f.kib_per_conn
                        .map(|k| format!("{k:.1}"))
                        .unwrap_or("-".into())
                );
            }
        }
        if let (Some(a), Some(b)) = (a, b) {
            ratios.push(format!(
                "{}: rate {:.2}x, CPU per message {:.2}x{}",
                l.name,
                a.rate / b.rate,
                a.cpu_us_per_msg() / b.cpu_us_per_msg(),
                match (a.kib_per_conn, b.kib_per_conn) {
                    (Some(x), Some(y)) => format!(", memory per idle connection {:.1}x", x / y),
                    _ => String::new(),
                }
            ));
            if l.every_secs > 0 {
                // Its share of the syncs: one write + fdatasync over the records it went with.
                let per_sync = a.per_sync.unwrap_or(1.0).max(1.0);
                let share = sync_cpu / per_sync;
                ratios.push(format!(
                    "{}: {per_sync:.2} records per fdatasync; Sluice's CPU per message beyond its \
                     share of one write + fdatasync ({sync_cpu:.1} µs / {per_sync:.2} = \
                     {share:.1} µs): {:.1} µs, {:.2}x Mosquitto's",
                    l.name,
                    a.cpu_us_per_msg() - share,
                    (a.cpu_us_per_msg() - share) / b.cpu_us_per_msg()
                ));
            }
            if l.name == "burst8" {
                ratios.push(format!(
                    "burst8: Sluice's mean PUBACK is fdatasync + {:.0} µs",
                    a.mean_ms * 1000.0 - sync_p50
                ));
            }
        }
    }
    println!("\nSluice / Mosquitto:");
    for r in ratios {
        println!("- {r}");
    }
}

/// Builds the Go client into `dir`.
fn build_client(dir: &Path) -> Result<PathBuf> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("paho");
    let out = dir.join("paho-load");
    let status = Command::new("go")
        .args(["build", "-o"])
        .arg(&out)
        .arg(".")
        .current_dir(&src)
        .status()
        .context("running `go build` (Go is needed for the Paho client)")?;
    anyhow::ensure!(status.success(), "go build of {} failed", src.display());
    Ok(out)
}

/// Median and mean fdatasync latency (µs) of a 100-byte overwrite in a file under `dir`,
/// and the CPU time (user + system, µs) of one overwrite and its fdatasync: what a message
/// stored alone costs at least, whatever the server does around it.
fn fdatasync_latency(dir: &Path) -> Result<(f64, f64, f64)> {
    use std::os::unix::fs::FileExt;
    let path = dir.join("fsync-probe");
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .read(true)
        .write(true)
        .open(&path)?;
    f.write_all_at(&vec![0u8; 1 << 20], 0)?;
    f.sync_all()?;
    let cpu_before = thread_cpu_us();
    let mut times: Vec<f64> = (0..500u64)
        .map(|i| {
            f.write_all_at(&[b'x'; 100], (i * 100) % (1 << 20))?;
            let t = Instant::now();
            f.sync_data()?;
            Ok(t.elapsed().as_secs_f64() * 1e6)
        })
        .collect::<std::io::Result<_>>()?;
    let cpu = (thread_cpu_us() - cpu_before) / times.len() as f64;
    std::fs::remove_file(&path)?;
    times.sort_by(f64::total_cmp);
    let mean = times.iter().sum::<f64>() / times.len() as f64;
    Ok((times[times.len() / 2], mean, cpu))
}

/// User + system CPU time of the calling thread, in µs.
fn thread_cpu_us() -> f64 {
    // SAFETY: an all-zero rusage is valid, and getrusage only writes into it.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `u` is a valid rusage for the call to fill.
    unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut u) };
    let us = |t: libc::timeval| t.tv_sec as f64 * 1e6 + t.tv_usec as f64;
    us(u.ru_utime) + us(u.ru_stime)
}

/// Resident memory of process `pid`, in KiB.
fn rss_kib(pid: u32) -> Result<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let line = (status.lines())
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .context("no VmRSS")?;
    Ok(line.trim().trim_end_matches("kB").trim().parse()?)
}

/// Runs one load of the Go client against `addr`, with the server's CPU (and, for a fleet,
/// its memory per idle connection) measured from `pid`.
fn run_load(client: &Path, addr: &str, pid: u32, load: &Load, args: &Args) -> Result<Figures> {
    let mut cmd = Command::new(client);
    cmd.arg("-broker")
        .arg(format!("tcp://{addr}"))
        .arg("-conns")
        .arg(load.conns.to_string())
        .arg("-qos")
        .arg(load.qos.to_string())
        .arg("-messages")
        .arg(args.messages.to_string());
    if load.every_secs > 0 {
        cmd.arg("-interval")
            .arg(format!("{}s", load.every_secs))
            .arg("-duration")
            .arg(format!("{}s", args.fleet_secs.max(load.every_secs)));
    }
    let rss_before = rss_kib(pid)?;
    let child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .context("starting the Paho client")?;
    let mut child = Killer(child);
    let mut stdin = child.0.stdin.take().context("no stdin")?;
    let mut lines = BufReader::new(child.0.stdout.take().context("no stdout")?).lines();
    let connected = lines.next().context("client ended before connecting")??;
    let up: usize = (connected.strip_prefix("connected "))
        .and_then(|n| n.trim().parse().ok())
        .with_context(|| format!("client said {connected:?}"))?;
    if up < load.conns {
        bail!("only {up} of {} connections opened", load.conns);
    }
    let mut kib_per_conn = None;
    if load.every_secs > 0 {
        // Let the last CONNACKs' work settle before reading the idle fleet's memory.
        std::thread::sleep(Duration::from_millis(500));
        kib_per_conn = Some((rss_kib(pid)? - rss_before) / load.conns as f64);
    }
    let cpu0 = cpu_secs(pid)?;
    writeln!(stdin)?;
    let last = lines.last().context("client printed no result")??;
    let cpu1 = cpu_secs(pid)?;
    let _ = child.0.wait();
    let mut f: Figures =
        serde_json::from_str(&last).with_context(|| format!("client said {last:?}"))?;
    if f.errors > 0 {
        bail!(
            "{}: {} client errors, first: {:?}",
            load.name,
            f.errors,
            f.first_error
        );
    }
    // At QoS 0 only each connection's last message is acknowledged.
    let expect_acked = if load.qos == 0 { up as u64 } else { f.sent };
    if f.acked != expect_acked {
        bail!("{}: {} of {expect_acked} acknowledged", load.name, f.acked);
    }
    f.cpu_secs = cpu1 - cpu0;
    f.kib_per_conn = kib_per_conn;
    Ok(f)
}

/// Every load against one `sluice serve`; after each, the stored rows must match what was
/// sent.
async fn run_sluice(
    bin: &Path,
    dir: &Path,
    client: &Path,
    loads: &[Load],
    args: &Args,
) -> Result<Vec<Figures>> {
    let sluice = Sluice::start(bin, dir)?;
    sluice.sql("CREATE DATABASE bench").await?;
    sluice
        .sql("CREATE TABLE bench.readings (ts TIMESTAMP, device STRING, seq BIGINT, temp DOUBLE) PARTITION BY ymdh(ts)")
        .await?;
    let mut all = Vec::new();
    let mut stored = 0;
    let groups = async || -> Result<(f64, f64)> {
        Ok((
            sluice.metric("sluice_wal_group_records_sum").await?,
            sluice.metric("sluice_wal_group_records_count").await?,
        ))
    };
    for load in loads {
        let (client, addr, pid) = (client.to_path_buf(), sluice.mqtt.clone(), sluice.pid());
        let (load2, args2) = (*load, args.clone());
        let before = groups().await?;
        let mut f =
            tokio::task::spawn_blocking(move || run_load(&client, &addr, pid, &load2, &args2))
                .await??;
        let after = groups().await?;
        f.per_sync = Some((after.0 - before.0) / (after.1 - before.1).max(1.0));
        stored += f.sent;
        let count = sluice
            .sql("SELECT count(*) AS n FROM bench.readings")
            .await?;
        let n: serde_json::Value = serde_json::from_str(&count)?;
        if n[0]["n"].as_u64() != Some(stored) {
            bail!(
                "after {}: Sluice stored {count}, expected {stored} rows",
                load.name
            );
        }
        all.push(f);
    }
    Ok(all)
}

/// Every load against one Mosquitto (Debian's package, no persistence) on 127.0.0.1.
fn run_mosquitto(dir: &Path, client: &Path, loads: &[Load], args: &Args) -> Result<Vec<Figures>> {
    let (guard, port) = sluice_bench::start_mosquitto(dir, "max_queued_messages 100000\n")?;
    let addr = format!("127.0.0.1:{port}");
    (loads.iter())
        .map(|l| run_load(client, &addr, guard.0.id(), l, args))
        .collect()
}
