//! Durable broker state, measured against Mosquitto with persistence on (its database file,
//! autosaved every 30 minutes as packaged, and at a clean stop), in the same run.
//!
//! - `--probe N`: the kill -9 probe, N times for a plain topic and N times for a table's. A
//!   lasting session (clean session off) subscribes at QoS 1 and goes away; 1,000 QoS 1
//!   messages are published and all PUBACKed; the server is killed (SIGKILL) at once and
//!   started again on the same data; the session comes back and counts what it gets.
//! - fan-out (the default): `--subscribers` lasting sessions, online, subscribed at QoS 1 to
//!   one topic and acknowledging each message; `--publishers` connections publish
//!   `--messages` QoS 1 messages to it with `--inflight` unacknowledged each. Reports
//!   published messages/s until every subscriber had every message, deliveries/s, and the
//!   server's CPU per delivery (`/proc`), rounds alternating.
//!
//! `cargo build --release -p sluice -p sluice-bench --bins`, then
//! `~/.cache/sluice-target/release/session_load --probe 20` and
//! `~/.cache/sluice-target/release/session_load --subscribers 100 --messages 20000` (add
//! `--cluster` for the same fan-out across a three-node cluster)

use anyhow::{Context, Result, bail};
use bytes::BytesMut;
use clap::Parser;
use rumqttc::mqttbytes::QoS;
use rumqttc::mqttbytes::v4::{Connect, Packet, PubAck, Publish, Subscribe, SubscribeFilter};
use sluice_bench::{Killer, Sluice};
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};

#[derive(Parser, Debug, Clone)]
struct Args {
    /// Run the kill -9 probe this many times per topic kind instead of the fan-out load.
    #[arg(long, default_value_t = 0)]
    probe: usize,
    /// Lasting subscribers of the fan-out topic.
    #[arg(long, default_value_t = 100)]
    subscribers: usize,
    /// Publishing connections.
    #[arg(long, default_value_t = 4)]
    publishers: usize,
    /// Messages published in all (each delivered to every subscriber).
    #[arg(long, default_value_t = 20_000)]
    messages: usize,
    /// Unacknowledged messages per publisher.
    #[arg(long, default_value_t = 64)]
    inflight: usize,
    /// Fan-out rounds, alternating the brokers; medians reported.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// The sluice binary (default: next to this runner).
    #[arg(long)]
    sluice: Option<PathBuf>,
    /// Skip Mosquitto.
    #[arg(long)]
    no_mosquitto: bool,
    /// Also run the fan-out through a three-node cluster each round: publishers on node 1,
    /// subscribers alternately on nodes 2 and 3 (every message crosses nodes), against the
    /// single node in the same round. CPU is the three nodes' together.
    #[arg(long)]
    cluster: bool,
}

fn main() -> Result<()> {
    let args = Args::parse();
    let bin = Sluice::binary(args.sluice.as_deref())?;
    let rt = sluice_bench::runtime()?;
    let tmp = tempfile::tempdir()?;
    if args.probe > 0 {
        return rt.block_on(probes(&bin, tmp.path(), &args));
    }
    let mut sluice = Vec::new();
    let mut mosquitto = Vec::new();
    let mut cluster = Vec::new();
    for round in 0..args.rounds {
        let dir = tmp.path().join(format!("round{round}"));
        std::fs::create_dir_all(&dir)?;
        let s = Sluice::start(&bin, &dir)?;
        let one = std::slice::from_ref(&s.mqtt);
        let f = rt.block_on(fan_out(one, &s.mqtt, &[s.pid()], &args))?;
        println!("round {round} Sluice:    {}", show(f));
        sluice.push(f);
        drop(s);
        if args.cluster {
            let f = rt.block_on(through_cluster(&bin, &dir.join("cluster"), &args))?;
            println!("round {round} cluster:   {}", show(f));
            cluster.push(f);
        }
        if !args.no_mosquitto {
            let (m, port) = mosquitto_persistent(&dir)?;
            let addr = format!("127.0.0.1:{port}");
            let f = rt.block_on(fan_out(
                std::slice::from_ref(&addr),
                &addr,
                &[m.0.id()],
                &args,
            ))?;
            println!("round {round} Mosquitto: {}", show(f));
            mosquitto.push(f);
        }
    }
    let s = median(&sluice);
    println!("Sluice    (median): {}", show(s));
    // Each ratio is Sluice's way round: the cluster against the single node, the single
    // node against Mosquitto.
    for (name, runs, ours) in [
        ("cluster", &cluster, true),
        ("Mosquitto", &mosquitto, false),
    ] {
        if runs.is_empty() {
            continue;
        }
        let o = median(runs);
        println!("{name:<9} (median): {}", show(o));
        let (label, a, b) = match ours {
            true => ("cluster/single node", o, s),
            false => ("Sluice/Mosquitto", s, o),
        };
        println!(
            "ratio {label}: {:.2}x messages/s, {:.2}x CPU per delivery",
            a.0 / b.0,
            a.2 / b.2
        );
    }
    Ok(())
}

/// Published messages/s, deliveries/s, server CPU µs per delivery.
type Figures = (f64, f64, f64);

fn show(f: Figures) -> String {
    format!(
        "{:.0} msg/s published, {:.0} deliveries/s, {:.2} µs CPU per delivery",
        f.0, f.1, f.2
    )
}

fn median(v: &[Figures]) -> Figures {
    let pick = |k: fn(&Figures) -> f64| {
        let mut x: Vec<f64> = v.iter().map(k).collect();
        x.sort_by(f64::total_cmp);
        x[x.len() / 2]
    };
    (pick(|f| f.0), pick(|f| f.1), pick(|f| f.2))
}

/// Mosquitto with persistence on, its database under `dir` (kept across restarts there).
fn mosquitto_persistent(dir: &Path) -> Result<(Killer, u16)> {
    let db = dir.join("mosquitto-db/");
    std::fs::create_dir_all(&db)?;
    let lines = format!(
        "persistence true\npersistence_location {}\nmax_queued_messages 100000\nmax_inflight_messages 1024\n",
        db.display()
    );
    sluice_bench::start_mosquitto_conf(dir, &lines)
}

async fn probes(bin: &Path, tmp: &Path, args: &Args) -> Result<()> {
    const N: u64 = 1000;
    for (kind, topic) in [
        ("plain topic", "probe/x"),
        ("table topic", "/default/probe"),
    ] {
        let mut sluice = Vec::new();
        let mut mosquitto = Vec::new();
        for run in 0..args.probe {
            let dir = tmp.join(format!("probe-{}-{run}", kind.replace(' ', "-")));
            std::fs::create_dir_all(&dir)?;
            let s = Sluice::start(bin, &dir)?;
            s.sql("CREATE TABLE IF NOT EXISTS probe (ts TIMESTAMP, seq BIGINT) PARTITION BY yyyymmdd(ts)")
                .await?;
            let addr = s.mqtt.clone();
            let got = probe(
                &addr,
                topic,
                N,
                || {
                    drop(s);
                    Ok(())
                },
                || {
                    let s = Sluice::start(bin, &dir)?;
                    let addr = s.mqtt.clone();
                    Ok((Box::new(s) as Box<dyn std::any::Any>, addr))
                },
            )
            .await?;
            sluice.push(got);
            if !args.no_mosquitto {
                let (m, port) = mosquitto_persistent(&dir)?;
                let got = probe(
                    &format!("127.0.0.1:{port}"),
                    topic,
                    N,
                    || {
                        drop(m);
                        Ok(())
                    },
                    || {
                        let (m, port) = mosquitto_persistent(&dir)?;
                        Ok((
                            Box::new(m) as Box<dyn std::any::Any>,
                            format!("127.0.0.1:{port}"),
                        ))
                    },
                )
                .await?;
                mosquitto.push(got);
            }
        }
        let full = |v: &[u64]| v.iter().filter(|g| **g == N).count();
        println!(
            "kill -9 probe, {kind}: Sluice delivered {N}/{N} in {} of {} runs (each: {sluice:?})",
            full(&sluice),
            sluice.len()
        );
        if !mosquitto.is_empty() {
            println!(
                "kill -9 probe, {kind}: Mosquitto (persistence on) {N}/{N} in {} of {} runs (each: {mosquitto:?})",
                full(&mosquitto),
                mosquitto.len()
            );
        }
    }
    Ok(())
}

/// One probe: returns how many of the `n` acknowledged messages the session got after the
/// kill. `kill` SIGKILLs the server (dropping its [`Killer`]); `restart` starts it again.
async fn probe(
    addr: &str,
    topic: &str,
    n: u64,
    kill: impl FnOnce() -> Result<()>,
    restart: impl FnOnce() -> Result<(Box<dyn std::any::Any>, String)>,
) -> Result<u64> {
    let (mut rd, mut wr) = connect(addr, "probe-sub", false)
        .await
        .context("subscriber")?;
    subscribe(&mut rd, &mut wr, topic)
        .await
        .context("subscribing")?;
    disconnect(&mut wr).await?;
    let stream = TcpStream::connect(addr).await?;
    let (rd, wr) = connected(stream, "probe-pub", true)
        .await
        .context("publisher")?;
    publish(rd, wr, topic, n as usize, 64)
        .await
        .context("publishing")?;
    kill()?;
    let (_server, addr) = restart()?;
    let (mut rd, mut wr) = connect(&addr, "probe-sub", false)
        .await
        .context("subscriber after the restart")?;
    let mut seen = HashSet::new();
    let mut buf = BytesMut::new();
    while (seen.len() as u64) < n {
        let next = tokio::time::timeout(Duration::from_secs(3), read(&mut rd, &mut buf)).await;
        let Ok(Ok(p)) = next else { break };
        if let Packet::Publish(p) = p {
            seen.insert(p.payload.clone());
            ack(&mut wr, &p).await?;
        }
    }
    Ok(seen.len() as u64)
}

/// A three-node cluster under `dir` for one fan-out: publishers on node 1, subscribers on
/// nodes 2 and 3 in turn.
async fn through_cluster(bin: &Path, dir: &Path, args: &Args) -> Result<Figures> {
    let mut nodes = Vec::new();
    for (i, config) in sluice_bench::cluster_configs(dir, 3)?
        .into_iter()
        .enumerate()
    {
        let (bin, dir) = (bin.to_path_buf(), dir.join(format!("node{}", i + 1)));
        std::fs::create_dir_all(&dir)?;
        nodes.push(tokio::task::spawn_blocking(move || {
            Sluice::start_with_config(&bin, &dir, Some(&config))
        }));
    }
    let mut started = Vec::new();
    for n in nodes {
        started.push(n.await??);
    }
    for n in &started {
        n.await_leaders(Duration::from_secs(60)).await?;
    }
    let subs = [started[1].mqtt.clone(), started[2].mqtt.clone()];
    let pids: Vec<u32> = started.iter().map(|n| n.pid()).collect();
    fan_out(&subs, &started[0].mqtt, &pids, args).await
}

/// Subscribers connect to `subs` in turn, publishers to `publish_to`; CPU is `pids`'.
async fn fan_out(subs: &[String], publish_to: &str, pids: &[u32], args: &Args) -> Result<Figures> {
    let topic = "fan/x";
    let received = Arc::new(AtomicU64::new(0));
    let mut readers = Vec::new();
    for i in 0..args.subscribers {
        let addr = &subs[i % subs.len()];
        let (mut rd, mut wr) = connect(addr, &format!("fan-{i}"), false).await?;
        subscribe(&mut rd, &mut wr, topic).await?;
        let received = received.clone();
        let want = args.messages as u64;
        readers.push(tokio::spawn(async move {
            let mut buf = BytesMut::with_capacity(64 * 1024);
            let mut acks = BytesMut::new();
            let mut got = 0u64;
            while got < want {
                loop {
                    match Packet::read(&mut buf, 1 << 20) {
                        Ok(Packet::Publish(p)) => {
                            got += 1;
                            Packet::PubAck(PubAck::new(p.pkid)).write(&mut acks, 1 << 20)?;
                        }
                        Ok(_) => {}
                        Err(rumqttc::mqttbytes::Error::InsufficientBytes(_)) => break,
                        Err(e) => bail!("{e}"),
                    }
                }
                if !acks.is_empty() {
                    wr.write_all(&acks).await?;
                    acks.clear();
                }
                if got >= want {
                    break;
                }
                if rd.read_buf(&mut buf).await? == 0 {
                    bail!("broker closed a subscriber");
                }
            }
            received.fetch_add(got, Ordering::Relaxed);
            disconnect(&mut wr).await?;
            Ok::<_, anyhow::Error>(())
        }));
    }
    let cpu = || -> Result<f64> { pids.iter().map(|p| sluice_bench::cpu_secs(*p)).sum() };
    let cpu0 = cpu()?;
    let started = Instant::now();
    let per = args.messages / args.publishers;
    let mut pubs = Vec::new();
    for p in 0..args.publishers {
        let n = per + usize::from(p < args.messages % args.publishers);
        let stream = TcpStream::connect(publish_to).await?;
        let (rd, wr) = connected(stream, &format!("fan-pub-{p}"), true).await?;
        let window = args.inflight;
        pubs.push(tokio::spawn(async move {
            publish(rd, wr, topic, n, window).await
        }));
    }
    for p in pubs {
        p.await??;
    }
    for r in readers {
        tokio::time::timeout(Duration::from_secs(600), r)
            .await
            .context("subscribers did not get every message in 10 minutes")???;
    }
    let secs = started.elapsed().as_secs_f64();
    let cpu = cpu()? - cpu0;
    let deliveries = received.load(Ordering::Relaxed) as f64;
    Ok((
        args.messages as f64 / secs,
        deliveries / secs,
        cpu * 1e6 / deliveries,
    ))
}

async fn connect(addr: &str, id: &str, clean: bool) -> Result<(OwnedReadHalf, OwnedWriteHalf)> {
    connected(TcpStream::connect(addr).await?, id, clean).await
}

async fn connected(s: TcpStream, id: &str, clean: bool) -> Result<(OwnedReadHalf, OwnedWriteHalf)> {
    s.set_nodelay(true)?;
    let (mut rd, mut wr) = s.into_split();
    let mut c = Connect::new(id);
    c.keep_alive = 60;
    c.clean_session = clean;
    send(&mut wr, Packet::Connect(c)).await?;
    match read(&mut rd, &mut BytesMut::new()).await? {
        Packet::ConnAck(_) => Ok((rd, wr)),
        other => bail!("expected CONNACK, got {other:?}"),
    }
}

async fn subscribe(rd: &mut OwnedReadHalf, wr: &mut OwnedWriteHalf, filter: &str) -> Result<()> {
    let mut s = Subscribe::new_many([SubscribeFilter::new(filter.into(), QoS::AtLeastOnce)]);
    s.pkid = 1;
    send(wr, Packet::Subscribe(s)).await?;
    match read(rd, &mut BytesMut::new()).await? {
        Packet::SubAck(_) => Ok(()),
        other => bail!("expected SUBACK, got {other:?}"),
    }
}

async fn disconnect(wr: &mut OwnedWriteHalf) -> Result<()> {
    send(wr, Packet::Disconnect).await?;
    let _ = wr.shutdown().await;
    Ok(())
}

async fn send(wr: &mut OwnedWriteHalf, p: Packet) -> Result<()> {
    let mut out = BytesMut::new();
    p.write(&mut out, 1 << 20)?;
    wr.write_all(&out).await?;
    Ok(())
}

async fn ack(wr: &mut OwnedWriteHalf, p: &Publish) -> Result<()> {
    if p.qos == QoS::AtLeastOnce {
        send(wr, Packet::PubAck(PubAck::new(p.pkid))).await?;
    }
    Ok(())
}

async fn read(rd: &mut OwnedReadHalf, buf: &mut BytesMut) -> Result<Packet> {
    loop {
        match Packet::read(buf, 1 << 20) {
            Ok(p) => return Ok(p),
            Err(rumqttc::mqttbytes::Error::InsufficientBytes(_)) => {
                if rd.read_buf(buf).await? == 0 {
                    bail!("connection closed");
                }
            }
            Err(e) => bail!("{e}"),
        }
    }
}

/// Publishes `n` numbered QoS 1 messages with `window` unacknowledged; returns once all are
/// acknowledged.
async fn publish(
    mut rd: OwnedReadHalf,
    mut wr: OwnedWriteHalf,
    topic: &str,
    n: usize,
    window: usize,
) -> Result<()> {
    let mut buf = BytesMut::with_capacity(64 * 1024);
    let mut out = BytesMut::new();
    let (mut sent, mut acked) = (0usize, 0usize);
    while acked < n {
        while sent < n && sent - acked < window {
            let mut p = Publish::new(
                topic,
                QoS::AtLeastOnce,
                format!(r#"{{"ts":{},"seq":{sent}}}"#, sluice_now_ms()),
            );
            p.pkid = (sent % 65_535) as u16 + 1;
            Packet::Publish(p).write(&mut out, 1 << 20)?;
            sent += 1;
        }
        if !out.is_empty() {
            wr.write_all(&out).await?;
            out.clear();
        }
        if let Packet::PubAck(_) = read(&mut rd, &mut buf).await? {
            acked += 1;
        }
    }
    Ok(())
}

fn sluice_now_ms() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0)
}
