//! Replicated durable writes against the single-node log, and failover.
//!
//! Three cluster nodes run in this process, each with its own directory, log writer and TCP
//! listener on 127.0.0.1, and replicate one shard group. C concurrent writers commit N
//! writes through the leader, each one engine log record of one reading (what one MQTT
//! message becomes), acknowledged once a quorum has it durable and it is applied. In the same
//! run, alternating, the same records go through the single-node write-ahead log
//! (`Wal::append`, C concurrent writers). Prints both rates, the ratio and p99 ack latencies.
//! Then the leader is stopped and failover is timed: from the stop to the first write the
//! new leader acknowledges.
//!
//! This measures the raft layer the shards use (`sluice-cluster`'s generic groups), with a
//! state machine that only counts; `mqtt_load --cluster 3` measures the cluster as devices
//! see it.
//!
//! `cargo bench -p sluice-cluster --bench raft_load -- --writes 50000 --writers 64`

use anyhow::{Context, Result, bail};
use bytes::Bytes;
use clap::Parser;
use openraft::BasicNode;
use openraft::async_runtime::WatchReceiver;
use sluice_cluster::{Command, GroupId, GroupRaft, GroupState, Node, Response, serve};
use sluice_conf::WalConfig;
use sluice_engine::WriteRecord;
use sluice_engine::internals::{RecordSink, Wal};
use sluice_engine::types::Value;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// The server's allocator, so the figures are the server's.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser, Debug, Clone)]
struct Args {
    /// Passed by `cargo bench`; nothing to do with this runner.
    #[arg(long, hide = true)]
    bench: bool,
    /// Writes per round.
    #[arg(long, default_value_t = 50_000)]
    writes: usize,
    /// Concurrent writers.
    #[arg(long, default_value_t = 64)]
    writers: usize,
    /// Records per write: one raft entry (their encodings concatenated) against one
    /// `Wal::append_all` (as a bridge stores what it has received).
    #[arg(long, default_value_t = 1)]
    batch: usize,
    /// Rounds of each (alternating); medians are reported.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
}

/// Counts what is applied (both paths apply nothing else).
#[derive(Debug, Default)]
struct Count(AtomicU64);

impl RecordSink for Count {
    fn apply(&self, _lsn: u64, _record: &WriteRecord) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
}

impl GroupState for Count {
    fn apply(&self, _index: u64, _command: &Command) -> Response {
        self.0.fetch_add(1, Ordering::Relaxed);
        Response {
            rows: 1,
            error: None,
        }
    }
    fn snapshot(&self) -> std::io::Result<(Option<u64>, Bytes)> {
        Ok((
            None,
            Bytes::from(self.0.load(Ordering::Relaxed).to_string()),
        ))
    }
    fn restore(&self, data: &[u8]) -> std::io::Result<()> {
        let n = std::str::from_utf8(data).map_err(std::io::Error::other)?;
        self.0
            .store(n.parse().map_err(std::io::Error::other)?, Ordering::Relaxed);
        Ok(())
    }
}

/// One reading as the engine logs it: device, time, temperature.
fn record(i: usize) -> Arc<WriteRecord> {
    Arc::new(WriteRecord {
        table_id: 1,
        ncols: 3,
        rows: vec![vec![
            Value::Str(format!("device-{}", i % 200)),
            Value::Int(1_700_000_000_000_000 + i as i64),
            Value::Float(20.0 + (i % 100) as f64 / 10.0),
        ]],
        origin: None,
    })
}

fn main() -> Result<()> {
    let args = Args::parse();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(run(args))
}

async fn run(args: Args) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let (mut single, mut replicated) = (Vec::new(), Vec::new());
    let mut failover = None;
    for round in 0..args.rounds.max(1) {
        let d = dir.path().join(format!("round{round}"));
        let s = single_node(&d.join("wal"), &args).await?;
        let last = round + 1 == args.rounds.max(1);
        let (r, f) = three_nodes(&d.join("raft"), &args, last).await?;
        eprintln!(
            "round {round}: single-node log {:.0} writes/s (p99 {:.2} ms), replicated {:.0} writes/s (p99 {:.2} ms), ratio {:.2}x",
            s.0,
            s.1,
            r.0,
            r.1,
            r.0 / s.0
        );
        single.push(s);
        replicated.push(r);
        failover = failover.or(f);
    }
    let median = |v: &mut Vec<(f64, f64)>| {
        v.sort_by(|a, b| a.0.total_cmp(&b.0));
        v[v.len() / 2]
    };
    let (s, r) = (median(&mut single), median(&mut replicated));
    println!(
        "\n{} writes of {} reading(s) each, {} concurrent writers, median of {} rounds\n",
        args.writes,
        args.batch.max(1),
        args.writers,
        args.rounds.max(1)
    );
    println!("| path | writes/s | p99 ack ms |");
    println!("|---|---|---|");
    println!(
        "| single-node log (Wal::append, fdatasync) | {:.0} | {:.2} |",
        s.0, s.1
    );
    println!(
        "| 3 raft replicas on this box (quorum durable, applied) | {:.0} | {:.2} |",
        r.0, r.1
    );
    println!("\nratio replicated / single-node: {:.2}x", r.0 / s.0);
    if let Some(f) = failover {
        println!(
            "failover (leader stopped -> first write acknowledged by the new leader): {f:.0} ms"
        );
    }
    Ok(())
}

/// Runs `writes` writes from `writers` tasks, each calling `write(i)`; returns (writes/s,
/// p99 latency in ms).
async fn drive<F, Fut>(args: &Args, write: F) -> Result<(f64, f64)>
where
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<()>> + Send + 'static,
{
    let write = Arc::new(write);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for w in 0..args.writers {
        let (write, n, step) = (write.clone(), args.writes, args.writers);
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            for i in (w..n).step_by(step) {
                let t = Instant::now();
                write(i).await?;
                lat.push(t.elapsed());
            }
            anyhow::Ok(lat)
        }));
    }
    let mut lat = Vec::with_capacity(args.writes);
    for t in tasks {
        lat.extend(t.await??);
    }
    let rate = args.writes as f64 / started.elapsed().as_secs_f64();
    lat.sort();
    let p99 = lat[(lat.len() * 99 / 100).min(lat.len() - 1)];
    Ok((rate, p99.as_secs_f64() * 1000.0))
}

async fn single_node(dir: &std::path::Path, args: &Args) -> Result<(f64, f64)> {
    std::fs::create_dir_all(dir)?;
    let count = Arc::new(Count::default());
    let wal = Arc::new(Wal::start(
        dir,
        &WalConfig::default(),
        1,
        4096,
        count.clone(),
    )?);
    let w = wal.clone();
    let args_batch = args.batch.max(1);
    let r = drive(args, move |i| {
        let w = w.clone();
        async move {
            match args_batch {
                1 => w.append_waiting(record(i)).await?,
                k => {
                    w.append_all((0..k).map(|j| record(i * k + j)).collect(), true)
                        .await?
                }
            };
            Ok(())
        }
    })
    .await?;
    wal.close();
    anyhow::ensure!(count.0.load(Ordering::Relaxed) == (args.writes * args_batch) as u64);
    Ok(r)
}

struct Running {
    node: Arc<Node>,
    raft: GroupRaft,
    stop: CancellationToken,
}

/// The replicated rounds; with `failover`, also stops the leader and times the takeover.
async fn three_nodes(
    dir: &std::path::Path,
    args: &Args,
    failover: bool,
) -> Result<((f64, f64), Option<f64>)> {
    let mut members = BTreeMap::new();
    let mut nodes = BTreeMap::new();
    let mut listeners = Vec::new();
    for id in 1..=3u64 {
        let l = TcpListener::bind("127.0.0.1:0").await?;
        members.insert(id, BasicNode::new(l.local_addr()?.to_string()));
        listeners.push((id, l));
    }
    let counts: Vec<Arc<Count>> = (0..3).map(|_| Arc::new(Count::default())).collect();
    for ((id, l), count) in listeners.into_iter().zip(&counts) {
        let node = Node::new(id, &dir.join(format!("n{id}")))?;
        let raft = node
            .open_group(GroupId::Shard(0), count.clone(), None)
            .await?;
        let stop = CancellationToken::new();
        tokio::spawn(serve(l, node.clone(), stop.clone()));
        nodes.insert(id, Running { node, raft, stop });
    }
    nodes[&1].raft.initialize(members).await?;
    let first = leader(&nodes, None).await?;
    let raft = nodes[&first].raft.clone();
    let k = args.batch.max(1);
    let r = drive(args, move |i| {
        let raft = raft.clone();
        async move {
            let bytes: Vec<u8> = (0..k).flat_map(|j| record(i * k + j).encode()).collect();
            let bytes = Bytes::from(bytes);
            raft.client_write(Command::Write(bytes))
                .await
                .context("replicated write")?;
            Ok(())
        }
    })
    .await?;
    let mut took = None;
    if failover {
        let t = Instant::now();
        let old = nodes.remove(&first).context("leader")?;
        old.stop.cancel();
        old.node.shutdown().await;
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let new = leader(&nodes, Some(first)).await?;
            let w = Command::Write(Bytes::from(record(0).encode()));
            if tokio::time::timeout(Duration::from_secs(1), nodes[&new].raft.client_write(w))
                .await
                .is_ok_and(|r| r.is_ok())
            {
                took = Some(t.elapsed().as_secs_f64() * 1000.0);
                break;
            }
            if Instant::now() > deadline {
                bail!("no write acknowledged after the leader stopped");
            }
        }
    }
    for (_, r) in nodes {
        r.stop.cancel();
        r.node.shutdown().await;
    }
    Ok((r, took))
}

/// The node every running node agrees leads (other than `not`).
async fn leader(nodes: &BTreeMap<u64, Running>, not: Option<u64>) -> Result<u64> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let seen: Vec<Option<u64>> = (nodes.values())
            .map(|r| r.raft.metrics().borrow_watched().current_leader)
            .collect();
        if let Some(Some(l)) = seen.first()
            && seen.iter().all(|s| *s == Some(*l))
            && nodes.contains_key(l)
            && Some(*l) != not
        {
            return Ok(*l);
        }
        if Instant::now() > deadline {
            bail!("no agreed leader: {seen:?}");
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
