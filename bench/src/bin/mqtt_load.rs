//! MQTT load generator: C connections publishing one reading per PUBLISH at QoS 0 or 1 with
//! an in-flight window, against a real `sluice serve` (every message stored, QoS 1 acked only
//! once durable) and against Mosquitto (Debian's package, started on 127.0.0.1, no
//! persistence) under the same load in the same run. Prints messages/s, p50/p99
//! publish-to-PUBACK latency for both, and the ratio.
//!
//! At QoS 0 each connection's last message is sent at QoS 1 and the run ends when that one
//! is acknowledged: both brokers handle a connection's packets in order, so by then every
//! earlier message has been handled (for Sluice: stored, which the runner checks with SQL).
//!
//! With `--cluster N`, the peer is a single Sluice node instead of Mosquitto: the same load
//! goes to an N-node cluster (connections spread over the nodes, each message acknowledged
//! once its shard's quorum has it on disk) and to one node, alternating, and the ratio is
//! cluster / single node.
//!
//! `cargo build --release -p sluice -p sluice-bench --bins`, then
//! `~/.cache/sluice-target/release/mqtt_load --qos 1 --connections 8 --messages 200000`

use anyhow::{Context, Result, bail};
use bytes::BytesMut;
use clap::Parser;
use rumqttc::mqttbytes::QoS;
use rumqttc::mqttbytes::v4::{Connect, Packet, Publish};
use sluice_bench::Sluice;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::Semaphore;

#[derive(Parser, Debug, Clone)]
struct Args {
    /// Messages in total (split evenly over the connections).
    #[arg(long, default_value_t = 200_000)]
    messages: usize,
    /// Concurrent connections.
    #[arg(long, default_value_t = 8)]
    connections: usize,
    /// QoS of the messages: 0 or 1.
    #[arg(long, default_value_t = 1)]
    qos: u8,
    /// Unacknowledged QoS 1 messages per connection; a list (`64,256,1024`) measures each
    /// window in turn on the same servers, and with `--cluster` also compares the two sides'
    /// peak rates (each side's best window).
    #[arg(long, value_delimiter = ',', default_value = "64")]
    inflight: Vec<usize>,
    /// The window of the load being run (one of `inflight`).
    #[arg(skip)]
    window: usize,
    /// Payload: csv, json or lp (line protocol): a time, a device, a sequence number and a
    /// temperature; csv16, json16 or lp16: the same with 12 more float fields (16 columns).
    #[arg(long, default_value = "csv")]
    payload: String,
    /// Rounds, alternating Sluice and Mosquitto; the median of each is reported.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// The sluice binary (default: next to this runner).
    #[arg(long)]
    sluice: Option<PathBuf>,
    /// Measure an N-node cluster (all on this machine) against one node, instead of
    /// Sluice against Mosquitto.
    #[arg(long, default_value_t = 0)]
    cluster: usize,
    /// Skip Mosquitto.
    #[arg(long)]
    no_mosquitto: bool,
    /// Measure Sluice with one rollup on the loaded table (1-minute buckets per device:
    /// avg, min, max and count of temp) against Sluice without, alternating, instead of
    /// against Mosquitto. Each load's CPU then also counts a `FLUSH TABLE` after it, where
    /// the rollup's rows are folded.
    #[arg(long)]
    rollup: bool,
}

/// messages/s, p50 ms, p99 ms, server CPU µs per message (all servers' together).
type Figures = (f64, f64, f64, f64);

fn main() -> Result<()> {
    let args = Args::parse();
    if args.qos > 1 {
        bail!("--qos must be 0 or 1");
    }
    if args.inflight.is_empty() || args.inflight.iter().any(|w| !(1..=60_000).contains(w)) {
        bail!("--inflight takes windows of 1 to 60000");
    }
    let dir = tempfile::tempdir()?;
    let sluice = Sluice::binary(args.sluice.as_deref())?;
    let rt = sluice_bench::runtime()?;
    let windows = args.inflight.len();
    // Per window, each round's figures.
    let (mut ours, mut theirs) = (vec![Vec::new(); windows], vec![Vec::new(); windows]);
    let mut failovers = Vec::new();
    for round in 0..args.rounds.max(1) {
        let round_dir = dir.path().join(format!("round{round}"));
        std::fs::create_dir_all(&round_dir)?;
        let sides: Vec<(&str, Vec<Figures>)> = if args.cluster > 1 {
            let (c, stall) = rt.block_on(run_cluster(&sluice, &round_dir, &args))?;
            failovers.push(stall);
            let s = rt.block_on(run_sluice(&sluice, &round_dir, &args, false))?;
            vec![("cluster", c), ("single node", s)]
        } else if args.rollup {
            // Which goes first alternates between rounds.
            let (a, b) = (round % 2 == 1, round % 2 == 0);
            let first = rt.block_on(run_sluice(&sluice, &round_dir.join("a"), &args, a))?;
            let second = rt.block_on(run_sluice(&sluice, &round_dir.join("b"), &args, b))?;
            let (with, without) = if a { (first, second) } else { (second, first) };
            vec![("with rollup", with), ("without", without)]
        } else {
            let s = rt.block_on(run_sluice(&sluice, &round_dir, &args, false))?;
            let mut sides = vec![("Sluice", s)];
            if !args.no_mosquitto {
                sides.push(("Mosquitto", rt.block_on(run_mosquitto(&round_dir, &args))?));
            }
            sides
        };
        for (side, (name, figures)) in sides.into_iter().enumerate() {
            for (w, f) in figures.into_iter().enumerate() {
                eprintln!(
                    "round {round}, window {}: {name} {:.0} msg/s (p50 {:.2} ms, p99 {:.2} ms, {:.1} µs CPU/msg)",
                    args.inflight[w], f.0, f.1, f.2, f.3
                );
                let per_window = if side == 0 { &mut ours } else { &mut theirs };
                per_window[w].push(f);
            }
        }
    }
    let median = |v: &mut Vec<Figures>| {
        v.sort_by(|a, b| a.0.total_cmp(&b.0));
        v.get(v.len() / 2).copied()
    };
    let ours: Vec<Figures> = ours.iter_mut().filter_map(median).collect();
    let theirs: Vec<Figures> = theirs.iter_mut().filter_map(median).collect();
    let (us, them) = if args.rollup {
        ("Sluice with a rollup".to_string(), "Sluice without")
    } else if args.cluster > 1 {
        (
            format!(
                "{}-node cluster, replication factor {}",
                args.cluster,
                args.cluster.min(3)
            ),
            "single node",
        )
    } else if args.qos == 1 {
        (
            "Sluice (acked when durable, fsync)".to_string(),
            "Mosquitto (no persistence)",
        )
    } else {
        (
            "Sluice (every message stored)".to_string(),
            "Mosquitto (no persistence)",
        )
    };
    println!(
        "\nQoS {}, {} connections, {} payloads, {} messages per window, median of {} rounds\n",
        args.qos,
        args.connections,
        args.payload,
        args.messages,
        args.rounds.max(1)
    );
    println!("| Sluice | window | messages/s | p50 ms | p99 ms | server CPU µs/msg |");
    println!("|---|---|---|---|---|---|");
    for (name, figures) in [(us.as_str(), &ours), (them, &theirs)] {
        for (w, f) in figures.iter().enumerate() {
            println!(
                "| {name} | {} | {:.0} | {:.2} | {:.2} | {:.1} |",
                args.inflight[w], f.0, f.1, f.2, f.3
            );
        }
    }
    if let (Some(lo), Some(hi)) = (failovers.iter().min(), failovers.iter().max()) {
        println!(
            "\nfailover (node 1 killed, longest PUBACK wait after it): {:.0}-{:.0} ms over {} rounds",
            lo.as_secs_f64() * 1000.0,
            hi.as_secs_f64() * 1000.0,
            failovers.len()
        );
    }
    if theirs.is_empty() {
        return Ok(());
    }
    println!();
    for (w, (a, b)) in ours.iter().zip(&theirs).enumerate() {
        println!(
            "window {}: ratio {us} / {them}: {:.2}x rate, {:.2}x CPU per message",
            args.inflight[w],
            a.0 / b.0,
            a.3 / b.3
        );
    }
    if windows > 1 {
        // Each side's durable rate: the most it acknowledged at any window.
        let peak = |v: &[Figures]| {
            (v.iter().enumerate())
                .max_by(|a, b| a.1.0.total_cmp(&b.1.0))
                .map(|(w, f)| (args.inflight[w], *f))
                .unwrap_or((0, (f64::NAN, f64::NAN, f64::NAN, f64::NAN)))
        };
        let ((wa, a), (wb, b)) = (peak(&ours), peak(&theirs));
        println!(
            "peak rates: {us} {:.0} msg/s (window {wa}, p99 {:.2} ms), {them} {:.0} msg/s \
             (window {wb}, p99 {:.2} ms): ratio {:.2}x",
            a.0,
            a.2,
            b.0,
            b.2,
            a.0 / b.0
        );
    }
    Ok(())
}

/// Each window's load against one `sluice serve` (on the same server in turn); checks every
/// message was stored.
async fn run_sluice(bin: &Path, dir: &Path, args: &Args, rollup: bool) -> Result<Vec<Figures>> {
    let sluice = Sluice::start(bin, dir)?;
    sluice.sql("CREATE DATABASE bench").await?;
    sluice.sql(&create_table(&args.payload)).await?;
    if rollup {
        sluice
            .sql(
                "CREATE ROLLUP bench.per_minute AS SELECT date_bin('1 minute', ts) AS bucket, \
                 device, avg(temp), min(temp), max(temp), count(*) FROM bench.readings GROUP BY 1, 2",
            )
            .await?;
    }
    let mut all = Vec::new();
    for (w, args) in windows(args).enumerate() {
        let cpu0 = sluice_bench::cpu_secs(sluice.pid())?;
        let mut f = load(&sluice.mqtt, sluice.pid(), &args).await?;
        if args.rollup {
            // The flush folds the rollup's rows: counted with the load.
            sluice.sql("FLUSH TABLE bench.readings").await?;
            let messages = (args.messages / args.connections) * args.connections;
            f.3 = (sluice_bench::cpu_secs(sluice.pid())? - cpu0) * 1e6 / messages as f64;
        }
        all.push(f);
        let count = sluice
            .sql("SELECT count(*) AS n FROM bench.readings")
            .await?;
        let stored = stored_after(&args, w);
        if counted(&count) != Some(stored) {
            bail!("Sluice stored {count}, expected {stored} rows");
        }
    }
    Ok(all)
}

/// The runs of `args`, one per window.
fn windows(args: &Args) -> impl Iterator<Item = Args> + '_ {
    (args.inflight.iter()).map(|&window| Args {
        window,
        ..args.clone()
    })
}

/// The `n` of a `SELECT count(*) AS n` answer.
fn counted(answer: &str) -> Option<usize> {
    let rows: serde_json::Value = serde_json::from_str(answer).ok()?;
    rows.get(0)?.get("n")?.as_u64().map(|n| n as usize)
}

/// Rows stored once the load of window number `w` (counting from 0) is done.
fn stored_after(args: &Args, w: usize) -> usize {
    (args.messages / args.connections) * args.connections * (w + 1)
}

/// Starts an `args.cluster`-node cluster under `dir`, loads it through all its nodes, and
/// checks every node stored every message.
async fn run_cluster(bin: &Path, dir: &Path, args: &Args) -> Result<(Vec<Figures>, Duration)> {
    let nodes =
        sluice_bench::start_cluster(bin, dir, args.cluster, Duration::from_secs(30)).await?;
    nodes[0].sql("CREATE DATABASE bench").await?;
    nodes[0].sql(&create_table(&args.payload)).await?;
    let addrs: Vec<String> = nodes.iter().map(|n| n.mqtt.clone()).collect();
    let pids: Vec<u32> = nodes.iter().map(Sluice::pid).collect();
    let cpu0 = (pids.iter().map(|p| sluice_bench::cpu_secs(*p))).collect::<Result<Vec<_>>>()?;
    let mut figures = Vec::new();
    for (w, args) in windows(args).enumerate() {
        figures.push(load_spread(&addrs, &pids, &args).await?);
        let stored = stored_after(&args, w);
        for (i, n) in nodes.iter().enumerate() {
            let deadline = Instant::now() + Duration::from_secs(30);
            loop {
                let count = n.sql("SELECT count(*) AS n FROM bench.readings").await?;
                if counted(&count) == Some(stored) {
                    break;
                }
                if Instant::now() > deadline {
                    bail!("node {} stored {count}, expected {stored} rows", i + 1);
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
    let stored = stored_after(args, windows(args).count() - 1) as u64;
    per_node(&nodes, &pids, &cpu0, stored).await?;
    let (stall, total) = failover(&nodes).await?;
    eprintln!(
        "failover: node 1 killed; longest PUBACK wait after it {:.0} ms, {FAILOVER_MESSAGES} \
         messages acknowledged in {:.0} ms",
        stall.as_secs_f64() * 1000.0,
        total.as_secs_f64() * 1000.0
    );
    Ok((figures, stall))
}

/// Prints each node's share of the work of the loads: rows it applied from the shard logs
/// it replicates (each node keeps only the shards placed on it), its CPU, resident memory,
/// the rows its SQL read from other nodes' replicas for the checks (and those replicas
/// aggregated for it), and how long two grouped queries take there, computed (median of
/// 5): one synopses answer, one only DataFusion's aggregate does (`stddev`).
async fn per_node(nodes: &[Sluice], pids: &[u32], cpu0: &[f64], stored: u64) -> Result<()> {
    let grouped = [
        "SELECT device, count(*) AS n, max(temp) AS t FROM bench.readings GROUP BY device",
        "SELECT device, count(*) AS n, round(stddev(temp), 6) AS s FROM bench.readings \
         GROUP BY device",
    ];
    // Before the queries below: what the loads (and the row checks) sent between nodes.
    let mut sent = Vec::new();
    for n in nodes {
        sent.push(n.metric("sluice_node_bytes_sent_total").await?);
    }
    let mut answers = vec![Vec::new(); grouped.len()];
    for (i, (n, pid)) in nodes.iter().zip(pids).enumerate() {
        for (q, sql) in grouped.iter().enumerate() {
            let mut times = Vec::new();
            for _ in 0..5 {
                let t = Instant::now();
                let answer = n.sql_uncached(&format!("{sql} ORDER BY device")).await?;
                times.push(t.elapsed().as_secs_f64() * 1000.0);
                answers[q].push(answer);
            }
            times.sort_by(f64::total_cmp);
            let what = ["synopses", "stddev"][q];
            eprintln!("node {}: grouped query ({what}) {:.1} ms", i + 1, times[2]);
        }
        let applied = n.metric("sluice_shard_rows_applied_total").await?;
        let remote = n.metric("sluice_remote_rows_read_total").await?;
        let aggregated = n.metric("sluice_remote_rows_aggregated_total").await?;
        let cpu = sluice_bench::cpu_secs(*pid)? - cpu0[i];
        let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
        let rss = (status.lines())
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
            .unwrap_or(0.0);
        eprintln!(
            "node {}: applied {applied:.0} rows ({:.2} per stored row), CPU {cpu:.2} s \
             ({:.1} µs per stored row), RSS {:.0} MiB, sent {:.0} bytes per stored row to \
             other nodes, {remote:.0} rows read from other nodes, {aggregated:.0} aggregated \
             there",
            i + 1,
            applied / stored as f64,
            cpu * 1e6 / stored as f64,
            rss / 1024.0,
            sent[i] / stored as f64
        );
    }
    for mut a in answers {
        a.dedup();
        if a.len() != 1 {
            bail!("the nodes answered a grouped query differently: {a:?}");
        }
    }
    Ok(())
}

/// Messages published one at a time through node 2 after node 1 is killed.
const FAILOVER_MESSAGES: usize = 128;

/// Kills node 1 (it leads the metadata group and its preferred shards) with SIGKILL while a
/// device publishes to node 2 one message at a time, devices cycling so every shard is
/// written; returns the longest wait for a PUBACK after the kill (the time until the shards
/// node 1 led take writes again) and the time to acknowledge them all.
async fn failover(nodes: &[Sluice]) -> Result<(Duration, Duration)> {
    let mut s = connect(&nodes[1].mqtt, "failover").await?;
    let mut buf = BytesMut::new();
    let mut send = async |s: &mut TcpStream, seq: usize| -> Result<Duration> {
        let mut p = Publish::new(
            "/bench/readings",
            QoS::AtLeastOnce,
            format!("2026-11-21 11:00:00,fo-{},{seq},1.0", seq % 64),
        );
        p.pkid = (seq % 65_535) as u16 + 1;
        let mut out = BytesMut::new();
        Packet::Publish(p).write(&mut out, 1 << 20)?;
        let t = Instant::now();
        s.write_all(&out).await?;
        loop {
            match Packet::read(&mut buf, 1 << 20) {
                Ok(Packet::PubAck(_)) => return Ok(t.elapsed()),
                Ok(_) => {}
                Err(rumqttc::mqttbytes::Error::InsufficientBytes(_)) => {
                    let n = tokio::time::timeout(Duration::from_secs(30), s.read_buf(&mut buf))
                        .await
                        .context("no PUBACK within 30 s")??;
                    if n == 0 {
                        bail!("node 2 closed the connection");
                    }
                }
                Err(e) => bail!("{e}"),
            }
        }
    };
    for seq in 0..64 {
        send(&mut s, seq).await?;
    }
    // SAFETY: kill(2) on a child process this runner started.
    unsafe { libc::kill(nodes[0].pid() as i32, libc::SIGKILL) };
    let killed = Instant::now();
    let mut stall = Duration::ZERO;
    for seq in 64..64 + FAILOVER_MESSAGES {
        stall = stall.max(send(&mut s, seq).await?);
    }
    Ok((stall, killed.elapsed()))
}

async fn run_mosquitto(dir: &Path, args: &Args) -> Result<Vec<Figures>> {
    let (guard, port) = sluice_bench::start_mosquitto(dir, "max_queued_messages 100000\n")?;
    let addr = format!("127.0.0.1:{port}");
    let mut all = Vec::new();
    for args in windows(args) {
        all.push(load(&addr, guard.0.id(), &args).await?);
    }
    Ok(all)
}

/// Runs the load against `addr`, served by process `pid`; returns messages/s, ack latency
/// percentiles and the server's CPU per message.
async fn load(addr: &str, pid: u32, args: &Args) -> Result<Figures> {
    load_spread(&[addr.to_string()], &[pid], args).await
}

/// Runs the load with connection `c` to `addrs[c % addrs.len()]`; the CPU per message is
/// that of all of `pids` together.
async fn load_spread(addrs: &[String], pids: &[u32], args: &Args) -> Result<Figures> {
    let cpu = || -> Result<f64> { pids.iter().map(|p| sluice_bench::cpu_secs(*p)).sum() };
    let cpu0 = cpu()?;
    let per = args.messages / args.connections;
    let mut conns = Vec::new();
    for c in 0..args.connections {
        conns.push(connect(&addrs[c % addrs.len()], &format!("load-{c}")).await?);
    }
    let start = Instant::now();
    let mut tasks = Vec::new();
    for (c, stream) in conns.into_iter().enumerate() {
        let args = args.clone();
        tasks.push(tokio::spawn(
            async move { publish(stream, c, per, &args).await },
        ));
    }
    let mut lat = Vec::with_capacity(args.messages);
    for t in tasks {
        lat.extend(t.await??);
    }
    let secs = start.elapsed().as_secs_f64();
    lat.sort();
    let pct = |p: f64| {
        lat.get(((lat.len() as f64 * p) as usize).min(lat.len().saturating_sub(1)))
            .map(|d| d.as_secs_f64() * 1000.0)
            .unwrap_or(f64::NAN)
    };
    let cpu_us = (cpu()? - cpu0) * 1e6 / (per * args.connections) as f64;
    Ok((
        (per * args.connections) as f64 / secs,
        pct(0.5),
        pct(0.99),
        cpu_us,
    ))
}

async fn connect(addr: &str, id: &str) -> Result<TcpStream> {
    let mut s = TcpStream::connect(addr).await?;
    s.set_nodelay(true)?;
    let mut buf = BytesMut::new();
    let mut connect = Connect::new(id);
    connect.keep_alive = 60;
    Packet::Connect(connect).write(&mut buf, 1 << 20)?;
    s.write_all(&buf).await?;
    let mut rbuf = BytesMut::new();
    loop {
        match Packet::read(&mut rbuf, 1 << 20) {
            Ok(Packet::ConnAck(_)) => return Ok(s),
            Ok(other) => bail!("expected CONNACK, got {other:?}"),
            Err(rumqttc::mqttbytes::Error::InsufficientBytes(_)) => {
                if s.read_buf(&mut rbuf).await? == 0 {
                    bail!("connection closed before CONNACK");
                }
            }
            Err(e) => bail!("{e}"),
        }
    }
}

/// The table the payloads of `kind` fill.
fn create_table(kind: &str) -> String {
    let extra: String = match kind.ends_with("16") {
        true => (1..=12).map(|i| format!(", f{i} DOUBLE")).collect(),
        false => String::new(),
    };
    format!(
        "CREATE TABLE bench.readings (ts TIMESTAMP, device STRING, seq BIGINT, temp DOUBLE{extra}) \
         PARTITION BY ymdh(ts)"
    )
}

fn payload(kind: &str, c: usize, seq: usize) -> String {
    let (min, sec, us) = (
        (seq / 60_000_000) % 60,
        (seq / 1_000_000) % 60,
        seq % 1_000_000,
    );
    let temp = 20.0 + (seq % 100) as f64 / 10.0;
    // The 12 more fields of the 16-column payloads.
    let more = |i: usize| 100.0 + ((seq * 7 + i * 13) % 1000) as f64 / 10.0;
    let wide = kind.ends_with("16");
    let n = if wide { 12 } else { 0 };
    match kind.trim_end_matches("16") {
        "json" => {
            let extra: String = (1..=n).map(|i| format!(r#","f{i}":{}"#, more(i))).collect();
            format!(
                r#"{{"ts":"2026-11-21T10:{min:02}:{sec:02}.{us:06}Z","device":"dev-{c}","seq":{seq},"temp":{temp}{extra}}}"#
            )
        }
        "lp" => {
            // 2026-11-21T10:00:00Z is 1795255200 s after the epoch.
            let ns =
                (1_795_255_200_000_000 + (min * 60_000_000 + sec * 1_000_000 + us) as i64) * 1000;
            let extra: String = (1..=n).map(|i| format!(",f{i}={}", more(i))).collect();
            format!("readings,device=dev-{c} seq={seq}i,temp={temp}{extra} {ns}")
        }
        _ => {
            let extra: String = (1..=n).map(|i| format!(",{}", more(i))).collect();
            format!("2026-11-21 10:{min:02}:{sec:02}.{us:06},dev-{c},{seq},{temp}{extra}")
        }
    }
}

/// Publishes `n` messages on one connection; returns the ack latencies of QoS 1 messages.
async fn publish(stream: TcpStream, c: usize, n: usize, args: &Args) -> Result<Vec<Duration>> {
    let (mut rd, mut wr) = stream.into_split();
    let window = Arc::new(Semaphore::new(args.window));
    let sent: Arc<parking_lot::Mutex<Vec<Option<Instant>>>> =
        Arc::new(parking_lot::Mutex::new(vec![None; 65_536]));
    let acks_expected = if args.qos == 1 { n } else { 1 };
    let reader = {
        let (window, sent) = (window.clone(), sent.clone());
        tokio::spawn(async move {
            let mut lat = Vec::with_capacity(acks_expected);
            let mut buf = BytesMut::with_capacity(64 * 1024);
            while lat.len() < acks_expected {
                match Packet::read(&mut buf, 1 << 20) {
                    Ok(Packet::PubAck(a)) => {
                        if let Some(t) = sent.lock()[a.pkid as usize].take() {
                            lat.push(t.elapsed());
                        }
                        window.add_permits(1);
                    }
                    Ok(_) => {}
                    Err(rumqttc::mqttbytes::Error::InsufficientBytes(_)) => {
                        if rd.read_buf(&mut buf).await? == 0 {
                            bail!("broker closed the connection");
                        }
                    }
                    Err(e) => bail!("{e}"),
                }
            }
            Ok::<_, anyhow::Error>(lat)
        })
    };
    let mut out = BytesMut::with_capacity(64 * 1024);
    let topic = "/bench/readings";
    for seq in 0..n {
        let qos1 = args.qos == 1 || seq + 1 == n;
        let mut p = Publish::new(
            topic,
            if qos1 {
                QoS::AtLeastOnce
            } else {
                QoS::AtMostOnce
            },
            payload(&args.payload, c, seq),
        );
        if qos1 {
            let permit = match window.try_acquire() {
                Ok(p) => p,
                Err(_) => {
                    // Window full: send what is buffered, then wait for an ack.
                    if !out.is_empty() {
                        wr.write_all(&out).await?;
                        out.clear();
                    }
                    window.acquire().await?
                }
            };
            permit.forget();
            p.pkid = (seq % 65_535) as u16 + 1;
            sent.lock()[p.pkid as usize] = Some(Instant::now());
        }
        Packet::Publish(p).write(&mut out, 1 << 20)?;
        if out.len() >= 32 * 1024 {
            wr.write_all(&out).await?;
            out.clear();
        }
    }
    if !out.is_empty() {
        wr.write_all(&out).await?;
    }
    let lat = reader.await??;
    let mut bye = BytesMut::new();
    Packet::Disconnect.write(&mut bye, 1 << 20)?;
    let _ = wr.write_all(&bye).await;
    Ok(if args.qos == 1 { lat } else { Vec::new() })
}
