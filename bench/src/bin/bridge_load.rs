//! Bridged ingest: how fast Sluice drains a backlog of QoS 1 messages that Mosquitto queued
//! for its bridge's persistent session (each stored durably before it is acknowledged), next
//! to how fast Mosquitto delivers the same backlog to a plain `mosquitto_sub -q 1` subscriber
//! (which acknowledges at once and writes to /dev/null), in the same run. Prints both rates
//! and the ratio.
//!
//! Both sessions are subscribed first, then N messages are published once (so both have the
//! same N queued), then each drains: `mosquitto_sub -c -C N` is timed until it exits;
//! Sluice's bridge is added through the admin API and timed until its stored-rows counter
//! (`/metrics`) reaches N; `count(*)` is then checked to be N.
//!
//! `cargo build --release -p sluice -p sluice-bench --bins`, then
//! `~/.cache/sluice-target/release/bridge_load --messages 100000`

use anyhow::{Context, Result, bail};
use clap::Parser;
use sluice_bench::Sluice;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[derive(Parser, Debug, Clone)]
struct Args {
    /// Messages queued for each subscriber per round.
    #[arg(long, default_value_t = 100_000)]
    messages: usize,
    /// Rounds; the median of each side is reported.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Mosquitto's `max_inflight_messages` (unacknowledged QoS 1 messages per subscriber).
    #[arg(long, default_value_t = 100)]
    inflight: usize,
    /// The sluice binary (default: next to this runner).
    #[arg(long)]
    sluice: Option<PathBuf>,
}

fn main() -> Result<()> {
    let args = Args::parse();
    let dir = tempfile::tempdir()?;
    let bin = Sluice::binary(args.sluice.as_deref())?;
    let rt = sluice_bench::runtime()?;
    let (mut ours, mut theirs) = (Vec::new(), Vec::new());
    for round in 0..args.rounds.max(1) {
        let round_dir = dir.path().join(format!("round{round}"));
        std::fs::create_dir_all(&round_dir)?;
        let (s, m) = rt.block_on(run(&bin, &round_dir, &args))?;
        eprintln!(
            "round {round}: Sluice bridge {s:.0} msg/s, mosquitto_sub {m:.0} msg/s, ratio {:.2}x",
            s / m
        );
        ours.push(s);
        theirs.push(m);
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    // Both sides of a round run back to back, so a round's ratio is less moved by what else
    // the box is doing than the two medians taken apart.
    let mut ratios: Vec<f64> = ours.iter().zip(&theirs).map(|(s, m)| s / m).collect();
    let ratio = median(&mut ratios);
    let (s, m) = (median(&mut ours), median(&mut theirs));
    println!(
        "\nbacklog of {} QoS 1 messages, Mosquitto max_inflight_messages {}, median of {} rounds\n",
        args.messages,
        args.inflight,
        args.rounds.max(1)
    );
    println!("| subscriber | messages/s |");
    println!("|---|---|");
    println!("| Sluice bridge (each message stored durably, then acked) | {s:.0} |");
    println!("| mosquitto_sub -q 1 (acks at once, output discarded) | {m:.0} |");
    println!(
        "\nratio Sluice / mosquitto_sub: {:.2}x (of the medians); median of the rounds' ratios: {ratio:.2}x",
        s / m
    );
    Ok(())
}

/// One round: (Sluice msg/s, mosquitto_sub msg/s).
async fn run(bin: &Path, dir: &Path, args: &Args) -> Result<(f64, f64)> {
    let (_mosquitto, port) = sluice_bench::start_mosquitto(
        dir,
        &format!(
            "max_queued_messages 0\nmax_inflight_messages {}\n",
            args.inflight
        ),
    )?;
    let port_s = port.to_string();
    let sub = |extra: &[&str]| {
        Command::new("mosquitto_sub")
            .args([
                "-h",
                "127.0.0.1",
                "-p",
                &port_s,
                "-q",
                "1",
                "-c",
                "-i",
                "base",
            ])
            .args(["-t", "/bench/#"])
            .args(extra)
            .stdout(Stdio::null())
            .status()
            .context("mosquitto_sub (apt-get install mosquitto-clients)")
    };
    // The plain subscriber's session: subscribed, then gone (exits after 1 s of silence).
    sub(&["-W", "1"])?;

    let sluice = Sluice::start(bin, dir)?;
    sluice
        .sql("CREATE TABLE bench.readings (ts TIMESTAMP, device STRING, seq BIGINT, temp DOUBLE) PARTITION BY ymdh(ts)")
        .await?;
    let bridge = serde_json::json!({
        "name": "load",
        "address": format!("127.0.0.1:{port}"),
        "topics": [{"filter": "/bench/#", "qos": 1}],
        "window": 1024,
    });
    let http = reqwest::Client::new();
    let admin = format!("http://{}/v1/bridges", sluice.http);
    let r = http.post(&admin).body(bridge.to_string()).send().await?;
    anyhow::ensure!(
        r.status().is_success(),
        "adding the bridge: {}",
        r.text().await?
    );
    wait_for(
        &sluice,
        "SELECT count(*) AS n FROM system.bridges WHERE connected",
        1,
    )
    .await?;
    // Its session stays at Mosquitto, subscribed, while the bridge is removed.
    let r = http.delete(format!("{admin}/load")).send().await?;
    anyhow::ensure!(r.status().is_success(), "removing the bridge");

    publish(port, args.messages).await?;

    let t = Instant::now();
    sub(&["-C", &args.messages.to_string()])?;
    let theirs = args.messages as f64 / t.elapsed().as_secs_f64();

    let t = Instant::now();
    let r = http.post(&admin).body(bridge.to_string()).send().await?;
    anyhow::ensure!(r.status().is_success(), "adding the bridge again");
    // Timed on the stored-rows counter (cheap to read: polling SQL every few ms would take
    // CPU from the bridge being measured), then checked by SQL.
    let deadline = Instant::now() + Duration::from_secs(600);
    while sluice.metric("sluice_mqtt_rows_stored_total").await? < args.messages as f64 {
        anyhow::ensure!(
            Instant::now() < deadline,
            "the bridge never stored every message"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let ours = args.messages as f64 / t.elapsed().as_secs_f64();
    wait_for(
        &sluice,
        "SELECT count(*) AS n FROM bench.readings",
        args.messages,
    )
    .await?;
    Ok((ours, theirs))
}

/// Polls `sql` (one count named `n`) until it reaches `n`, for at most 10 minutes.
async fn wait_for(sluice: &Sluice, sql: &str, n: usize) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(600);
    let want = format!("\"n\":{n}");
    loop {
        if sluice.sql(sql).await?.contains(&want) {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("{sql} never reached {n}");
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Publishes `n` readings at QoS 1 to Mosquitto from one connection with 200 in flight.
async fn publish(port: u16, n: usize) -> Result<()> {
    use rumqttc::{AsyncClient, Event, MqttOptions, Packet, QoS};
    let mut o = MqttOptions::new("bench-pub", "127.0.0.1", port);
    o.set_inflight(200);
    let (client, mut el) = AsyncClient::new(o, 1000);
    let sender = tokio::spawn(async move {
        for i in 0..n {
            let payload = format!(
                "2026-01-01T00:00:00Z,dev-{},{i},{:.1}",
                i % 100,
                (i % 400) as f64 / 10.0
            );
            client
                .publish("/bench/readings", QoS::AtLeastOnce, false, payload)
                .await?;
        }
        anyhow::Ok(client)
    });
    let mut acked = 0;
    while acked < n {
        if let Event::Incoming(Packet::PubAck(_)) = el.poll().await? {
            acked += 1;
        }
    }
    let client = sender.await??;
    client.disconnect().await?;
    Ok(())
}
