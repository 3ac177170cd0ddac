//! Chaos runner for a three-node cluster, the way issue 7 is judged: three `sluice serve`
//! nodes on 127.0.0.1; devices publish numbered QoS 1 (`--qos 2`: QoS 2, acknowledged by
//! PUBREC) readings (MQTT 5, a window of
//! unacknowledged messages each) through every node while, cycle after cycle, one node is
//! killed with SIGKILL and restarted and another is frozen with SIGSTOP and resumed. At the
//! end, every node's SQL must hold each message acknowledged with success exactly once, no
//! message twice, and no message the cluster refused (a failure PUBACK) or never heard of.
//!
//! A device whose connection breaks, or goes 5 s (`--stall`) without an acknowledgement (its node died
//! or froze), connects to the next node and goes on with new numbers. The messages it had
//! not had acknowledged are "in doubt": each may be stored or not, but at most once.
//!
//! Lasting subscribers (`--subscribers`, one per node in turn) must each receive every
//! acknowledged message, wherever it was published ([`subscribers`]).
//!
//! `cargo build --release -p sluice -p sluice-bench --bins`, then
//! `~/.cache/sluice-target/release/cluster_chaos --cycles 3`

#[path = "cluster_chaos/subscribers.rs"]
mod subscribers;

use anyhow::{Context, Result, bail};
use bytes::BytesMut;
use clap::Parser;
use parking_lot::Mutex;
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::mqttbytes::v5::{
    ConnAck, Connect, ConnectReturnCode, Disconnect, DisconnectReasonCode, Packet, PubAck,
    PubAckReason, PubRecReason, PubRel, Publish,
};
use sluice_bench::Sluice;
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

#[derive(Parser, Debug)]
struct Args {
    /// Cycles; each kills and restarts one node, then freezes and resumes another.
    #[arg(long, default_value_t = 3)]
    cycles: usize,
    /// Devices publishing at once, spread over the nodes.
    #[arg(long, default_value_t = 6)]
    devices: usize,
    /// Unacknowledged messages per device.
    #[arg(long, default_value_t = 16)]
    window: usize,
    /// Seconds between faults, and how long a node stays dead or frozen.
    #[arg(long, default_value_t = 3)]
    pause: u64,
    /// The faults of each cycle, in order: `kill` (node `cycle % 3 + 1`, then restarted)
    /// and `freeze` (the next node, then resumed).
    #[arg(long, value_enum, value_delimiter = ',', default_value = "kill,freeze")]
    faults: Vec<Fault>,
    /// Seconds a device waits for an acknowledgement before it gives up its connection (its
    /// node is dead or frozen) and connects to the next node.
    #[arg(long, default_value_t = 5)]
    stall: u64,
    /// Lasting subscribers of the devices' topic, one per node in turn.
    #[arg(long, default_value_t = 3)]
    subscribers: usize,
    /// A subscriber whose connection breaks connects to the next node (its session follows
    /// it), not to its own node again.
    #[arg(long)]
    roam: bool,
    /// After the cycles, kill -9 one more node and leave it dead: what the other nodes had
    /// for its subscribers must reach them without it (with `--roam`); its rows are not
    /// checked.
    #[arg(long)]
    kill_for_good: bool,
    /// The QoS devices publish and subscribers subscribe at (1 or 2); at QoS 2 a copy at a
    /// subscriber fails the run.
    #[arg(long, default_value_t = 1)]
    qos: u8,
    /// The sluice binary (default: next to this runner).
    #[arg(long)]
    sluice: Option<PathBuf>,
}

/// What happens to a node in a cycle.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
enum Fault {
    /// SIGKILL, then started again.
    Kill,
    /// SIGSTOP, then SIGCONT.
    Freeze,
}

/// Nodes in the cluster.
const NODES: usize = 3;

/// What one device saw.
#[derive(Debug, Default)]
struct Outcome {
    /// Acknowledged with success: stored exactly once.
    acked: Vec<u64>,
    /// Acknowledged with a failure reason: not stored.
    refused: Vec<(u64, PubAckReason)>,
    /// Sent on a connection that ended before their acknowledgement: stored at most once.
    in_doubt: Vec<u64>,
    /// Connections made.
    connections: u64,
    /// Waits of over [`WAIT_NOTED`] between two acknowledgements on one connection, and the
    /// waits of connections given up.
    waits: Vec<Wait>,
    /// When the last acknowledgement came (seconds into the run).
    last_ack: f64,
}

/// A wait between two acknowledgements: the node the connection went to, when it began and
/// when it ended (seconds into the run), and whether the device gave the connection up.
type Wait = (usize, f64, f64, bool);

/// Waits noted.
const WAIT_NOTED: Duration = Duration::from_millis(200);

/// When the run started.
static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();

/// Seconds since the run started.
fn now() -> f64 {
    START.get_or_init(Instant::now).elapsed().as_secs_f64()
}

/// A node of the cluster: its directory and config, and its process while it runs.
struct Node {
    dir: PathBuf,
    config: String,
    server: Option<Sluice>,
}

impl Node {
    fn server(&self) -> Result<&Sluice> {
        self.server.as_ref().context("the node is not running")
    }
}

fn main() -> Result<()> {
    let args = Args::parse();
    let dir = tempfile::tempdir()?;
    let bin = Sluice::binary(args.sluice.as_deref())?;
    sluice_bench::runtime()?.block_on(run(&bin, dir.path(), &args))
}

/// Starts a node (returns once it listens; it may not have joined its groups yet).
async fn start(bin: &Path, dir: &Path, config: &str) -> Result<Sluice> {
    let (bin, dir, config) = (bin.to_path_buf(), dir.to_path_buf(), config.to_string());
    tokio::task::spawn_blocking(move || Sluice::start_with_config(&bin, &dir, Some(&config)))
        .await?
}

fn signal(s: &Sluice, sig: i32) {
    // SAFETY: kill(2) on a child process this runner started and has not reaped.
    unsafe { libc::kill(s.pid() as i32, sig) };
}

async fn run(bin: &Path, dir: &Path, args: &Args) -> Result<()> {
    // The server's default receive maximum: more in flight and it ends the connection.
    let qos = match args.qos {
        1 => QoS::AtLeastOnce,
        2 => QoS::ExactlyOnce,
        q => bail!("--qos {q}: 1 or 2"),
    };
    if !(1..=1024).contains(&args.window) {
        bail!("--window must be 1 to 1024");
    }
    let mut nodes = Vec::new();
    for (i, config) in sluice_bench::cluster_configs(dir, NODES)?
        .into_iter()
        .enumerate()
    {
        // A subscriber whose node is down for seconds misses more than the default queue
        // (10,000) at these rates: its session keeps them all.
        let config = config + "[mqtt]\nmax_queued_messages = 2000000\n";
        let node_dir = dir.join(format!("node{}", i + 1));
        let server = Some(start(bin, &node_dir, &config).await?);
        nodes.push(Node {
            dir: node_dir,
            config,
            server,
        });
    }
    for n in &nodes {
        n.server()?.await_leaders(Duration::from_secs(30)).await?;
    }
    let first = nodes[0].server()?;
    first.sql("CREATE DATABASE bench").await?;
    first
        .sql("CREATE TABLE bench.chaos (ts TIMESTAMP, device STRING, seq BIGINT) PARTITION BY ymdh(ts)")
        .await?;
    for n in &nodes {
        n.server()?.sql("DESCRIBE bench.chaos").await?;
    }

    let addrs: Vec<String> = (nodes.iter())
        .map(|n| Ok(n.server()?.mqtt.clone()))
        .collect::<Result<_>>()?;
    let addrs = Arc::new(Mutex::new(addrs));
    let acked = Arc::new(AtomicU64::new(0));
    let stop = CancellationToken::new();
    let (mut subs, mut listening) = (Vec::new(), Vec::new());
    let unsubscribe = CancellationToken::new();
    for i in 0..args.subscribers {
        let (got, task) =
            subscribers::start(i, addrs.clone(), unsubscribe.clone(), (args.roam, qos)).await?;
        subs.push(got);
        listening.push(task);
    }
    let devices: Vec<_> = (0..args.devices)
        .map(|d| {
            let (addrs, acked, stop) = (addrs.clone(), acked.clone(), stop.clone());
            let to = (args.window, Duration::from_secs(args.stall), qos);
            tokio::spawn(device(d, addrs, acked, stop, to))
        })
        .collect();

    let pause = Duration::from_secs(args.pause);
    let started = *START.get_or_init(Instant::now);
    // Acknowledgements per half second, to see each fault's gap.
    let ticker = {
        let (acked, stop) = (acked.clone(), stop.clone());
        tokio::spawn(async move {
            let mut last = 0;
            let mut tick = tokio::time::interval(Duration::from_millis(500));
            while !stop.is_cancelled() {
                tick.tick().await;
                let now = acked.load(Ordering::Relaxed);
                eprintln!(
                    "{:6.1} s  {} acknowledged in the last 0.5 s",
                    started.elapsed().as_secs_f64(),
                    now - last
                );
                last = now;
            }
        })
    };
    let say = |what: String| {
        eprintln!(
            "{:6.1} s  {what} ({} acknowledged so far)",
            started.elapsed().as_secs_f64(),
            acked.load(Ordering::Relaxed)
        )
    };
    // (fault, node, from, to): seconds into the run.
    let mut faults: Vec<(&str, usize, f64, f64)> = Vec::new();
    for cycle in 0..args.cycles {
        for &fault in &args.faults {
            tokio::time::sleep(pause).await;
            let (what, node) = match fault {
                Fault::Kill => ("kill -9", cycle % NODES),
                Fault::Freeze => ("SIGSTOP", (cycle + 1) % NODES),
            };
            let other = nodes[(node + 1) % NODES].server()?;
            say(format!(
                "cycle {cycle}: {what} node {}; leaders before: {}",
                node + 1,
                leaders(other).await
            ));
            let from = now();
            match fault {
                Fault::Kill => {
                    drop(nodes[node].server.take());
                    tokio::time::sleep(pause).await;
                    let n = &mut nodes[node];
                    let server = start(bin, &n.dir, &n.config).await?;
                    server.await_leaders(Duration::from_secs(30)).await?;
                    addrs.lock()[node] = server.mqtt.clone();
                    n.server = Some(server);
                }
                Fault::Freeze => {
                    signal(nodes[node].server()?, libc::SIGSTOP);
                    tokio::time::sleep(pause).await;
                    signal(nodes[node].server()?, libc::SIGCONT);
                }
            }
            faults.push((what, node, from, now()));
            say(format!("cycle {cycle}: node {} back", node + 1));
        }
    }
    if args.kill_for_good {
        tokio::time::sleep(pause).await;
        let node = args.cycles % NODES;
        say(format!("kill -9 node {} for good", node + 1));
        let from = now();
        drop(nodes[node].server.take());
        tokio::time::sleep(pause).await;
        faults.push(("kill -9 for good", node, from, now()));
    }
    tokio::time::sleep(pause).await;
    say("stopping the devices".into());
    stop.cancel();
    ticker.abort();
    let mut all = Outcome::default();
    let mut last_acks = Vec::new();
    for d in devices {
        let o = d.await?;
        all.waits.extend(o.waits);
        last_acks.push(o.last_ack);
        all.acked.extend(o.acked);
        all.refused.extend(o.refused);
        all.in_doubt.extend(o.in_doubt);
        all.connections += o.connections;
    }
    let acked: HashSet<u64> = all.acked.iter().copied().collect();
    let in_doubt: HashSet<u64> = all.in_doubt.iter().copied().collect();
    println!(
        "{} cycles, {} devices (window {}): {} acknowledged, {} refused, {} in doubt, {} connections",
        args.cycles,
        args.devices,
        args.window,
        acked.len(),
        all.refused.len(),
        in_doubt.len(),
        all.connections
    );
    // Each fault's failover as devices on the other nodes saw it: their longest wait
    // between two acknowledgements that overlaps the fault. A device that gave a healthy
    // node up waited at least as long as it took to give up.
    for (what, node, from, to) in &faults {
        let (mut longest, mut gave_up) = (0.0, false);
        for (n, start, end, given_up) in &all.waits {
            if n != node && *end >= *from && *start <= *to && end - start >= longest {
                (longest, gave_up) = (end - start, *given_up);
            }
        }
        println!(
            "{what} of node {} at {from:.1} s: longest wait between acknowledgements through \
             the other nodes {}{longest:.2} s; longest delivery gap of subscribers on the \
             other nodes {:.2} s",
            node + 1,
            if gave_up { "at least " } else { "" },
            subscribers::longest_gap(&subs, *node, (*from, *to)),
        );
    }
    let mut failed = false;
    if let Some((seq, reason)) = all.refused.first() {
        println!(
            "FAILED: {} refused; the first: message {seq}, {reason:?}",
            all.refused.len()
        );
        failed = true;
    }
    // The cluster must take writes again once the faults are over: every device had one
    // acknowledged after the last fault ended.
    let healed = faults.last().map_or(0.0, |f| f.3);
    let idle = last_acks.iter().filter(|t| **t <= healed).count();
    if idle > 0 {
        println!("FAILED: {idle} devices had nothing acknowledged after the last fault");
        failed = true;
    }
    // Every node must hold the same messages (in doubt ones included).
    let mut first: Option<HashSet<u64>> = None;
    for (i, n) in nodes.iter().enumerate() {
        let Some(s) = n.server.as_ref() else {
            println!("node {}: dead (--kill-for-good), not checked", i + 1);
            continue;
        };
        let dups = s
            .sql("SELECT seq, count(*) AS copies FROM bench.chaos GROUP BY seq HAVING count(*) > 1 LIMIT 5")
            .await?;
        let stored: Vec<serde_json::Value> =
            serde_json::from_str(&s.sql("SELECT seq FROM bench.chaos").await?)?;
        let stored: Vec<u64> = stored.iter().filter_map(|r| r["seq"].as_u64()).collect();
        let set: HashSet<u64> = stored.iter().copied().collect();
        let missing = acked.difference(&set).count();
        let doubtful = set.intersection(&in_doubt).count();
        let refused = (all.refused.iter())
            .filter(|(s, _)| set.contains(s))
            .count();
        let stray = (set.iter())
            .filter(|s| !acked.contains(s) && !in_doubt.contains(s))
            .count();
        let copies = stored.len() - set.len();
        println!(
            "node {}: {} rows; acknowledged missing {missing}, extra copies {copies}, refused but \
             stored {refused}, in doubt stored {doubtful}, never sent {stray}",
            i + 1,
            stored.len()
        );
        if missing + copies + refused > 0 || stray > 0 || dups.trim() != "[]" {
            println!("node {}: FAILED; duplicated: {dups}", i + 1);
            failed = true;
        }
        match &first {
            None => first = Some(set),
            Some(f) if *f != set => {
                let differ = f.symmetric_difference(&set).count();
                println!(
                    "node {}: FAILED; {differ} messages differ from node 1's",
                    i + 1
                );
                failed = true;
            }
            Some(_) => {}
        }
    }
    if !subscribers::report(&subs, &acked, Duration::from_secs(30)).await {
        println!("FAILED: a subscriber lacks acknowledged messages after 30 s without progress");
        failed = true;
    }
    let copies: u64 = subs.iter().map(|s| s.lock().copies).sum();
    if qos == QoS::ExactlyOnce && copies > 0 {
        println!("FAILED: {copies} messages delivered twice to QoS 2 subscribers");
        failed = true;
    }
    unsubscribe.cancel();
    for t in listening {
        let _ = t.await;
    }
    if failed {
        bail!("the cluster lost, duplicated or refused messages, or stopped taking them");
    }
    println!("every node holds every acknowledged message exactly once");
    Ok(())
}

/// Which node leads each group, as `node` sees it.
async fn leaders(node: &Sluice) -> String {
    (node
        .sql("SELECT shard, leader FROM system.shards ORDER BY shard")
        .await)
        .unwrap_or_else(|e| e.to_string())
}

/// Publishes numbered messages (`d * 10^9` onwards) through node after node until `stop`.
async fn device(
    d: usize,
    addrs: Arc<Mutex<Vec<String>>>,
    acked: Arc<AtomicU64>,
    stop: CancellationToken,
    (window, stall, qos): (usize, Duration, QoS),
) -> Outcome {
    let mut out = Outcome::default();
    let mut next = d as u64 * 1_000_000_000;
    // Every connection tries the device's own node first, then the others in turn.
    let mut tries = 0;
    while !stop.is_cancelled() {
        let node = (d + tries) % NODES;
        let addr = addrs.lock()[node].clone();
        let id = format!("chaos-{d}");
        let Ok(Ok(s)) = tokio::time::timeout(Duration::from_secs(2), connect(&addr, &id)).await
        else {
            tries += 1;
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        out.connections += 1;
        let to = (node, window, stall, qos);
        let lost = session(s, d, &mut next, to, &stop, &acked, &mut out).await;
        out.in_doubt.extend(lost);
        // Back to the device's own node, unless that is the one that failed.
        tries = usize::from(node == d % NODES);
    }
    out
}

async fn connect(addr: &str, id: &str) -> Result<TcpStream> {
    let mut s = TcpStream::connect(addr).await?;
    s.set_nodelay(true)?;
    let mut buf = BytesMut::new();
    let connect = Connect {
        keep_alive: 30,
        client_id: id.to_string(),
        clean_start: true,
        properties: None,
    };
    Packet::Connect(connect, None, None).write(&mut buf, None)?;
    s.write_all(&buf).await?;
    buf.clear();
    loop {
        match Packet::read(&mut buf, None) {
            Ok(Packet::ConnAck(ConnAck {
                code: ConnectReturnCode::Success,
                ..
            })) => return Ok(s),
            Ok(other) => bail!("expected a successful CONNACK, got {other:?}"),
            Err(rumqttc::v5::mqttbytes::Error::InsufficientBytes(_)) => {
                if s.read_buf(&mut buf).await? == 0 {
                    bail!("connection closed before CONNACK");
                }
            }
            Err(e) => bail!("{e}"),
        }
    }
}

/// Publishes on one connection until it breaks or stalls, or `stop` (then until every
/// message is acknowledged); returns the messages left unacknowledged and the longest wait
/// between two acknowledgements (with the connection's first one counted from its start).
async fn session(
    s: TcpStream,
    d: usize,
    next: &mut u64,
    (node, window, stall, qos): (usize, usize, Duration, QoS),
    stop: &CancellationToken,
    acked: &AtomicU64,
    out: &mut Outcome,
) -> Vec<u64> {
    let (mut rd, mut wr) = s.into_split();
    let mut pending: HashMap<u16, u64> = HashMap::new();
    let mut pkid = 0u16;
    let mut buf = BytesMut::with_capacity(4096);
    let mut progress = Instant::now();
    // A connection given up: its wait ends now, unfinished.
    let lost = |pending: HashMap<u16, u64>, progress: Instant, out: &mut Outcome| {
        let end = now();
        out.waits
            .push((node, end - progress.elapsed().as_secs_f64(), end, true));
        pending.into_values().collect()
    };
    loop {
        let mut send = BytesMut::new();
        while !stop.is_cancelled() && pending.len() < window {
            pkid = pkid % u16::MAX + 1;
            let seq = *next;
            *next += 1;
            let payload = format!("2026-11-24 10:00:00,dev-{d},{seq}");
            let mut p = Publish::new("/bench/chaos", qos, payload, None);
            p.pkid = pkid;
            if Packet::Publish(p).write(&mut send, None).is_err() {
                return lost(pending, progress, out);
            }
            pending.insert(pkid, seq);
        }
        if !send.is_empty() && wr.write_all(&send).await.is_err() {
            return lost(pending, progress, out);
        }
        if stop.is_cancelled() && pending.is_empty() {
            let mut bye = BytesMut::new();
            let d = Disconnect::new(DisconnectReasonCode::NormalDisconnection);
            if Packet::Disconnect(d).write(&mut bye, None).is_ok() {
                let _ = wr.write_all(&bye).await;
            }
            return Vec::new();
        }
        // QoS 2: the PUBREC says it is stored (released at once, its PUBCOMP not awaited).
        let answer = match Packet::read(&mut buf, None) {
            Ok(Packet::PubRec(r)) => {
                let mut rel = BytesMut::new();
                let released = Packet::PubRel(PubRel::new(r.pkid, None)).write(&mut rel, None);
                if released.is_err() || wr.write_all(&rel).await.is_err() {
                    return lost(pending, progress, out);
                }
                let reason = match r.reason {
                    PubRecReason::Success => PubAckReason::Success,
                    PubRecReason::NoMatchingSubscribers => PubAckReason::NoMatchingSubscribers,
                    _ => PubAckReason::UnspecifiedError,
                };
                let (pkid, properties) = (r.pkid, None);
                Ok(Packet::PubAck(PubAck {
                    pkid,
                    reason,
                    properties,
                }))
            }
            other => other,
        };
        match answer {
            Ok(Packet::PubAck(a)) => {
                if let Some(seq) = pending.remove(&a.pkid) {
                    let waited = progress.elapsed();
                    if waited > WAIT_NOTED {
                        let end = now();
                        out.waits
                            .push((node, end - waited.as_secs_f64(), end, false));
                    }
                    progress = Instant::now();
                    match a.reason {
                        PubAckReason::Success | PubAckReason::NoMatchingSubscribers => {
                            out.acked.push(seq);
                            out.last_ack = now();
                            acked.fetch_add(1, Ordering::Relaxed);
                        }
                        r => out.refused.push((seq, r)),
                    }
                }
            }
            Ok(_) => {}
            Err(rumqttc::v5::mqttbytes::Error::InsufficientBytes(_)) => {
                let left = stall.saturating_sub(progress.elapsed());
                match tokio::time::timeout(left, rd.read_buf(&mut buf)).await {
                    Ok(Ok(n)) if n > 0 => {}
                    // Closed, failed or stalled: the node is gone or frozen.
                    _ => return lost(pending, progress, out),
                }
            }
            Err(_) => return lost(pending, progress, out),
        }
    }
}
