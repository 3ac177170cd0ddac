//! Alert evaluation cost: N alerts evaluated every second on the newest partitions of a table
//! receiving R messages/s over MQTT. Measures the server's CPU (utime + stime from
//! `/proc/<pid>/stat`) over a window with the ingest alone, then over the same window with
//! the alerts running, and prints evaluations/s, both CPU figures and their difference: the
//! cost of the alerts, in cores (the goal: under half a core for 1,000 alerts at
//! 10k msg/s).
//!
//! The alerts are of the kinds people write: per-device thresholds on the newest partition
//! (`max(temp)` of one device), fleet-wide maxima and counts over the last seconds, and
//! "any rows" on out-of-range readings; every query text is distinct (no two alerts share a
//! result).
//!
//! `cargo build --release -p sluice -p sluice-bench --bins`, then
//! `~/.cache/sluice-target/release/alert_load --alerts 1000 --rate 10000 --seconds 20`

use anyhow::{Context, Result};
use clap::Parser;
use rumqttc::{AsyncClient, MqttOptions, QoS};
use sluice_bench::Sluice;
use std::path::PathBuf;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

#[derive(Parser, Debug, Clone)]
struct Args {
    /// Alerts, each evaluated every second.
    #[arg(long, default_value_t = 1000)]
    alerts: usize,
    /// Messages per second published (QoS 0, one reading each, from 4 connections).
    #[arg(long, default_value_t = 10_000)]
    rate: usize,
    /// Length of each measured window.
    #[arg(long, default_value_t = 20)]
    seconds: u64,
    /// Devices the readings (and per-device alerts) spread over.
    #[arg(long, default_value_t = 200)]
    devices: usize,
    /// Only alerts of this kind (`device`, `fleet` or `cold`), to see what each costs;
    /// default the mix.
    #[arg(long)]
    only: Option<String>,
    /// The sluice binary (default: next to this runner).
    #[arg(long)]
    sluice: Option<PathBuf>,
}

fn main() -> Result<()> {
    let args = Args::parse();
    let dir = tempfile::tempdir()?;
    let bin = Sluice::binary(args.sluice.as_deref())?;
    sluice_bench::runtime()?.block_on(run(&bin, dir.path(), &args))
}

/// CPU seconds (user + system) the process has used.
fn cpu_seconds(pid: u32) -> Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the parenthesised name; utime and stime are the 14th and 15th fields.
    let rest = &stat[stat.rfind(')').context("odd /proc stat")? + 2..];
    let f: Vec<&str> = rest.split(' ').collect();
    let ticks: f64 = f[11].parse::<f64>()? + f[12].parse::<f64>()?;
    // SAFETY: sysconf only reads a constant of the system.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    Ok(ticks / hz)
}

async fn run(bin: &std::path::Path, dir: &std::path::Path, args: &Args) -> Result<()> {
    let sluice = Sluice::start(bin, dir)?;
    sluice
        .sql("CREATE TABLE plant.readings (ts TIMESTAMP, device STRING, temp DOUBLE) PARTITION BY ymdh(ts)")
        .await?;
    let stop = CancellationToken::new();
    let publishers = publish(&sluice, args, stop.clone());
    // Warm-up: the ingest runs a while before the baseline (buffers fill, first flushes).
    tokio::time::sleep(Duration::from_secs(3)).await;

    let pid = sluice.pid();
    let window = Duration::from_secs(args.seconds);
    let (base_cpu, base_wall) = measure(pid, window).await?;
    let base = base_cpu / base_wall;
    let rows_before = count(&sluice, "SELECT count(*) AS n FROM plant.readings").await?;

    for i in 0..args.alerts {
        let kind = match args.only.as_deref() {
            None => i % 4,
            Some("device") => 0,
            Some("fleet") => 2,
            Some("cold") => 3,
            Some(other) => anyhow::bail!("--only takes device, fleet or cold, not {other}"),
        };
        let sql = alert_sql(i, kind, args.devices);
        sluice.sql(&sql).await?;
    }
    // Every alert runs once before measuring.
    let deadline = Instant::now() + Duration::from_secs(60);
    let never = "SELECT count(*) AS n FROM system.alerts WHERE evaluations = 0";
    while count(&sluice, never).await? > 0 {
        anyhow::ensure!(Instant::now() < deadline, "some alerts never ran in 60 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let evals = "SELECT sum(evaluations) AS n FROM system.alerts";
    let errors = count(
        &sluice,
        "SELECT count(*) AS n FROM system.alerts WHERE state = 'error'",
    )
    .await?;
    anyhow::ensure!(
        errors == 0,
        "{errors} alerts are in error: {}",
        sluice
            .sql("SELECT name, error FROM system.alerts WHERE state = 'error' LIMIT 3")
            .await?
    );
    let e0 = count(&sluice, evals).await?;
    let (cpu, wall) = measure(pid, window).await?;
    let e1 = count(&sluice, evals).await?;
    let with_alerts = cpu / wall;
    stop.cancel();
    let published = publishers.await??;
    let rows_after = count(&sluice, "SELECT count(*) AS n FROM plant.readings").await?;
    let firing = count(
        &sluice,
        "SELECT count(*) AS n FROM system.alerts WHERE state = 'firing'",
    )
    .await?;
    let rate = (e1 - e0) as f64 / wall;
    println!(
        "\n{} alerts (each every 1 s) on plant.readings receiving {} msg/s (QoS 0, {} devices); windows of {} s\n",
        args.alerts, args.rate, args.devices, args.seconds
    );
    println!("| figure | value |");
    println!("|---|---|");
    println!("| messages published | {published} |");
    println!(
        "| rows stored during the run | {} |",
        rows_after.saturating_sub(rows_before)
    );
    println!("| evaluations/s | {rate:.0} |");
    println!("| alerts firing at the end | {firing} |");
    println!("| Sluice CPU, ingest only | {base:.2} cores |");
    println!("| Sluice CPU, ingest + alerts | {with_alerts:.2} cores |");
    println!(
        "| cost of the alerts | {:.2} cores ({:.0} µs CPU per evaluation) |",
        with_alerts - base,
        (with_alerts - base) * 1e6 / rate.max(1.0)
    );
    println!("\ngoal: under 0.5 cores for 1,000 alerts/s");
    Ok(())
}

/// The i-th alert, of `kind` (0 and 1 per device, 2 fleet, 3 cold; `i % 4` makes the mix), every
/// query text distinct.
fn alert_sql(i: usize, kind: usize, devices: usize) -> String {
    let d = i % devices;
    match kind {
        // Per-device threshold on the newest partition.
        0 | 1 => format!(
            "CREATE ALERT dev_{i} WHEN t > {} AS SELECT max(temp) AS t FROM plant.readings WHERE PARTS last WHERE device = 'dev-{d}'",
            90 + i % 7
        ),
        // Fleet maximum over the last seconds.
        2 => format!(
            "CREATE ALERT fleet_{i} WHEN t > {} AS SELECT max(temp) AS t FROM plant.readings WHERE PARTS last WHERE ts > now() - INTERVAL '{} seconds'",
            95 + i % 5,
            5 + i % 50
        ),
        // Out-of-range readings of a device.
        _ => format!(
            "CREATE ALERT cold_{i} WHEN ANY ROWS AS SELECT ts, temp FROM plant.readings WHERE PARTS last WHERE device = 'dev-{d}' AND temp < {}",
            -20 - (i % 10) as i64
        ),
    }
}

async fn count(s: &Sluice, sql: &str) -> Result<u64> {
    let text = s.sql(sql).await?;
    let v: serde_json::Value = serde_json::from_str(&text)?;
    Ok(v[0]["n"].as_u64().unwrap_or(0))
}

/// (CPU seconds, wall seconds) of `pid` over `window`.
async fn measure(pid: u32, window: Duration) -> Result<(f64, f64)> {
    let (c0, t0) = (cpu_seconds(pid)?, Instant::now());
    tokio::time::sleep(window).await;
    Ok((cpu_seconds(pid)? - c0, t0.elapsed().as_secs_f64()))
}

/// Publishes readings at `rate` per second from 4 connections until stopped; returns how
/// many were sent.
fn publish(
    sluice: &Sluice,
    args: &Args,
    stop: CancellationToken,
) -> tokio::task::JoinHandle<Result<u64>> {
    let (host, port) = sluice
        .mqtt
        .rsplit_once(':')
        .unwrap_or(("127.0.0.1", "1883"));
    let (host, port) = (host.to_string(), port.parse::<u16>().unwrap_or(1883));
    let (rate, devices) = (args.rate, args.devices);
    tokio::spawn(async move {
        let mut tasks = Vec::new();
        for c in 0..4 {
            let (host, stop) = (host.clone(), stop.clone());
            tasks.push(tokio::spawn(async move {
                let mut o = MqttOptions::new(format!("load-{c}"), host, port);
                o.set_keep_alive(Duration::from_secs(60));
                let (client, mut el) = AsyncClient::new(o, 10_000);
                tokio::spawn(async move { while el.poll().await.is_ok() {} });
                // Sends in 10 ms slices to hold the rate without a timer per message.
                let per_slice = (rate / 4 / 100).max(1);
                let mut tick = tokio::time::interval(Duration::from_millis(10));
                let mut sent = 0u64;
                while !stop.is_cancelled() {
                    tick.tick().await;
                    let ts = chrono::Utc::now().format("%Y-%m-%d %H:%M:%S%.6f");
                    for _ in 0..per_slice {
                        let d = (sent as usize * 4 + c) % devices;
                        let temp = 20.0 + (sent % 600) as f64 / 10.0;
                        let payload = format!("{ts},dev-{d},{temp:.1}");
                        client
                            .publish("/plant/readings", QoS::AtMostOnce, false, payload)
                            .await?;
                        sent += 1;
                    }
                }
                let _ = client.disconnect().await;
                anyhow::Ok(sent)
            }));
        }
        let mut total = 0;
        for t in tasks {
            total += t.await??;
        }
        Ok(total)
    })
}
