//! A `sluice serve` with a `[cluster]` section: this node's raft groups (the metadata group
//! on every node, the data shards placed on it), wired to the engine. Writes are split by
//! shard key and committed by each shard's leader (here or forwarded); every replica applies
//! them to its buffers. Catalog changes are committed by the metadata group. The node with
//! the lowest id initializes the metadata group, and each shard's preferred leader its shard,
//! so leaders start spread; leadership moves back to the preferred node when it returns.
//!
//! Each shard's leader writes its due rows as Parquet on the shared store and commits the
//! files through the metadata group ([`Cluster::flush_led_shards`]); every node installs them
//! in that group's order ([`MetaApply`]) and then snapshots the shards, which purges their
//! logs. A shard's snapshot ([`ShardSnapshot`]) is a log position whose rows are all in
//! files, so a node that missed purged entries catches up from the shared store.

use anyhow::Context;
use arrow::array::{ArrayRef, BooleanArray, StringArray, UInt64Array};
use arrow::datatypes::{DataType, Field, Schema};
use arrow::record_batch::RecordBatch;
use async_trait::async_trait;
use bytes::Bytes;
use openraft::BasicNode;
use openraft::RaftMetrics;
use openraft::async_runtime::WatchReceiver;
use parking_lot::Mutex;
use sluice_cluster::{Apply, Command, GroupId, GroupRaft, Node, Response, ShardPlacement, Tc};
use sluice_conf::ClusterConfig;
use sluice_engine::catalog::{CatalogData, CatalogLog, TableDef};
use sluice_engine::types::Value;
use sluice_engine::wal::record::WriteRecord;
use sluice_engine::{Engine, Error, FileChange, Replicator};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};
use tokio::sync::{Semaphore, mpsc, oneshot};
use tokio_util::sync::CancellationToken;

/// A shard entry carries writes, each `[length u32][write id][engine record]`; the write id
/// is the writer node, its incarnation and a sequence number.
/// Bytes of the write id.
const WRITE_HEADER: usize = 24;
/// How many recent write ids a shard remembers per writer to drop re-sent copies (a
/// multiple of 64).
const DEDUP_WINDOW: u64 = 1 << 20;
/// Incarnations (runs) of one writer node whose write ids a shard remembers.
const INCARNATIONS_KEPT: usize = 4;
/// How often a node looks for due rows of the shards it leads.
const FLUSH_CHECK: Duration = Duration::from_millis(500);
/// A shard entry stops taking more writes past this size.
const MAX_BATCH_BYTES: usize = 1 << 20;
/// Entries a node has in flight per shard; writes queued meanwhile form the next one.
const BATCHES_IN_FLIGHT: usize = 4;

/// This node of the cluster.
pub(crate) struct Cluster {
    node: Arc<Node>,
    placement: Vec<ShardPlacement>,
    /// This process's start, in microseconds: with the node id it tells this run's writes
    /// from an earlier run's.
    incarnation: u64,
    seq: AtomicU64,
    /// Per shard: writes waiting to be shipped ([`ship`]).
    queues: Vec<mpsc::UnboundedSender<Queued>>,
    /// Shards whose preferred leader an operator set ([`Cluster::move_leader`]), as the
    /// metadata group applied it.
    preferred: Arc<Mutex<BTreeMap<u32, u64>>>,
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster")
            .field("node", &self.node.id())
            .finish()
    }
}

fn members(ids: &[u64], peers: &BTreeMap<u64, String>) -> BTreeMap<u64, BasicNode> {
    ids.iter()
        .map(|id| {
            (
                *id,
                BasicNode::new(peers.get(id).cloned().unwrap_or_default()),
            )
        })
        .collect()
}

fn replication(reason: impl std::fmt::Display) -> Error {
    Error::Replication {
        reason: reason.to_string(),
    }
}

/// Runs `f` to completion from synchronous code on a runtime worker.
fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::task::block_in_place(|| tokio::runtime::Handle::current().block_on(f))
}

impl Cluster {
    /// Opens this node's groups under `<data_dir>/cluster`, starts answering peers on
    /// `cfg.listen`, and joins `engine` to the cluster. Returns once the metadata group has
    /// applied what this node's log had committed (so the catalog is current before any
    /// shard applies rows).
    pub(crate) async fn start(
        cfg: &ClusterConfig,
        data_dir: &std::path::Path,
        engine: &Arc<Engine>,
        cancel: CancellationToken,
    ) -> anyhow::Result<Arc<Self>> {
        let peers = cfg.nodes();
        let ids: Vec<u64> = peers.keys().copied().collect();
        let node =
            Node::new(cfg.node_id, &data_dir.join("cluster")).context("cluster directory")?;
        node.set_peers(peers.clone());
        let listener = tokio::net::TcpListener::bind(cfg.listen)
            .await
            .with_context(|| format!("binding the cluster listener on {}", cfg.listen))?;
        tokio::spawn(sluice_cluster::serve(
            listener,
            node.clone(),
            cancel.clone(),
        ));

        let preferred = Arc::new(Mutex::new(BTreeMap::new()));
        let meta_apply = MetaApply {
            engine: Arc::downgrade(engine),
            node: Arc::downgrade(&node),
            preferred: preferred.clone(),
        };
        let meta = node
            .open_group(GroupId::Meta, Arc::new(meta_apply))
            .await
            .context("opening the metadata group")?;
        if cfg.node_id == ids[0] {
            initialize(&meta, members(&ids, &peers)).await?;
        }
        let set: BTreeSet<u64> = ids.iter().copied().collect();
        let placement = sluice_cluster::place(&set, cfg.shard_count(), cfg.replication_factor);
        let queues = (placement.iter())
            .map(|p| {
                let (tx, rx) = mpsc::unbounded_channel();
                tokio::spawn(ship(node.clone(), p.shard, p.replicas.clone(), rx));
                tx
            })
            .collect();
        let cluster = Arc::new(Self {
            node: node.clone(),
            placement: placement.clone(),
            incarnation: sluice_engine::now_micros() as u64,
            seq: AtomicU64::new(0),
            queues,
            preferred,
        });
        engine.join_cluster(
            cluster.clone(),
            Arc::new(MetaLog {
                cluster: Arc::downgrade(&cluster),
                engine: Arc::downgrade(engine),
            }),
        );
        wait_applied(&meta, "metadata").await;
        for p in &placement {
            if !p.replicas.contains(&cfg.node_id) {
                continue;
            }
            let apply = Arc::new(ShardApply::new(p.shard, Arc::downgrade(engine)));
            let raft = node
                .open_group(GroupId::Shard(p.shard), apply)
                .await
                .with_context(|| format!("opening shard {}", p.shard))?;
            if p.replicas[0] == cfg.node_id {
                initialize(&raft, members(&p.replicas, &peers)).await?;
            }
        }
        tokio::spawn(cluster.clone().keep_preferred_leaders(cancel.clone()));
        tokio::spawn(
            cluster
                .clone()
                .flush_led_shards(Arc::downgrade(engine), cancel),
        );
        Ok(cluster)
    }

    /// Writes the due rows of the shards this node leads as Parquet on the shared store and
    /// commits the files through the metadata group; every node then installs them, drops
    /// those rows from its buffers and snapshots the shards ([`MetaApply`]). On the metadata
    /// group's leader, also merges small files now and then (`[compaction]`).
    async fn flush_led_shards(self: Arc<Self>, engine: Weak<Engine>, cancel: CancellationToken) {
        let mut last_compact = tokio::time::Instant::now();
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(FLUSH_CHECK) => {}
            }
            let Some(engine) = engine.upgrade() else {
                return;
            };
            let leads = |g: GroupId| {
                (self.node.group(g)).is_some_and(|r| {
                    r.metrics().borrow_watched().current_leader == Some(self.node.id())
                })
            };
            let led: Vec<u32> = (self.placement.iter())
                .map(|p| p.shard)
                .filter(|s| leads(GroupId::Shard(*s)))
                .collect();
            if !led.is_empty() {
                match engine.flush_shards(&led).await {
                    Ok(f) => self.commit_files(&engine, FileChange::Flushed(f)).await,
                    Err(e) => tracing::warn!(
                        error = %e,
                        "flush failed; rows stay in the log and will be retried"
                    ),
                }
            }
            let due = (engine.compaction_every()).is_some_and(|e| last_compact.elapsed() >= e);
            if due && leads(GroupId::Meta) {
                last_compact = tokio::time::Instant::now();
                match engine.compact_shared().await {
                    Ok(m) => self.commit_files(&engine, FileChange::Merged(m)).await,
                    Err(e) => tracing::warn!(error = %e, "compaction failed"),
                }
            }
        }
    }

    /// Commits a file change through the metadata group. Refused (alike on every node), its
    /// new files are removed; committed, the files a merge replaced are retired.
    async fn commit_files(&self, engine: &Engine, change: FileChange) {
        if change.is_empty() {
            return;
        }
        let text = match serde_json::to_string(&change) {
            Ok(t) => t,
            Err(e) => {
                tracing::error!(error = %e, "a file change does not serialize");
                return engine.discard_files(&change).await;
            }
        };
        let all: Vec<u64> = self.node.peers().keys().copied().collect();
        match (self.node)
            .write(GroupId::Meta, Command::Files(text), &all)
            .await
        {
            Ok(Response { error: None, .. }) => engine.retire_replaced(&change),
            Ok(Response { error: Some(e), .. }) => {
                // Refused alike on every node: no manifest names them.
                tracing::info!(reason = %e, "new files not installed; removing them");
                engine.discard_files(&change).await;
            }
            // The outcome is unknown (the entry may yet commit): the files stay.
            Err(e) => tracing::warn!(error = %e, "committing a file change failed"),
        }
    }

    /// Every group this node has, with its replicas.
    fn groups(&self) -> Vec<(GroupId, Vec<u64>, GroupRaft)> {
        let all: Vec<u64> = self.node.peers().keys().copied().collect();
        std::iter::once((GroupId::Meta, all))
            .chain((self.placement.iter()).map(|p| (GroupId::Shard(p.shard), p.replicas.clone())))
            .filter_map(|(g, r)| Some((g, r, self.node.group(g)?)))
            .collect()
    }

    /// The replica that should lead `shard`: the one an operator chose, else the
    /// placement's first.
    fn preferred_leader(&self, p: &ShardPlacement) -> u64 {
        (self.preferred.lock().get(&p.shard).copied()).unwrap_or(p.replicas[0])
    }

    /// Makes `node` the preferred leader of data shard `shard` (committed through the
    /// metadata group, so every node agrees and it outlives restarts) and waits up to
    /// `wait` for the shard's leadership to move there. Returns the leader seen at the end
    /// (`None` if this node has no replica of the shard and cannot tell).
    pub(crate) async fn move_leader(
        &self,
        shard: u32,
        node: u64,
        wait: Duration,
    ) -> Result<Option<u64>, MoveError> {
        let p = (self.placement.iter().find(|p| p.shard == shard))
            .ok_or(MoveError::NoShard(shard, self.placement.len()))?;
        if !p.replicas.contains(&node) {
            return Err(MoveError::NotReplica {
                shard,
                node,
                replicas: p.replicas.clone(),
            });
        }
        let all: Vec<u64> = self.node.peers().keys().copied().collect();
        let committed = (self.node)
            .write(GroupId::Meta, Command::Leader { shard, node }, &all)
            .await
            .map_err(|e| MoveError::Failed(e.to_string()))?;
        if let Some(e) = committed.error {
            return Err(MoveError::Failed(e));
        }
        let Some(raft) = self.node.group(GroupId::Shard(shard)) else {
            return Ok(None);
        };
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let m = raft.metrics().borrow_watched().clone();
            if m.current_leader == Some(node) || tokio::time::Instant::now() >= deadline {
                return Ok(m.current_leader);
            }
            if m.current_leader == Some(self.node.id()) {
                self.hand_over(shard, &raft, node).await;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Hands a shard's leadership (held here) to `to` once it has every entry.
    async fn hand_over(&self, shard: u32, raft: &GroupRaft, to: u64) {
        let m = raft.metrics().borrow_watched().clone();
        let matched = (m.replication.as_ref())
            .and_then(|r| r.get(&to).cloned().flatten())
            .map(|l| l.index);
        if matched.is_some() && matched == m.last_log_index {
            tracing::info!(
                shard,
                to,
                "moving shard leadership to its preferred replica"
            );
            let _ = raft.trigger().transfer_leader(to).await;
        }
    }

    /// Hands a shard's leadership back to its preferred replica once that one has caught up
    /// (after a failover, or at start when another replica won the first election).
    async fn keep_preferred_leaders(self: Arc<Self>, cancel: CancellationToken) {
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(Duration::from_secs(2)) => {}
            }
            for p in &self.placement {
                let Some(raft) = self.node.group(GroupId::Shard(p.shard)) else {
                    continue;
                };
                let leader = raft.metrics().borrow_watched().current_leader;
                let preferred = self.preferred_leader(p);
                if leader == Some(self.node.id()) && preferred != self.node.id() {
                    self.hand_over(p.shard, &raft, preferred).await;
                }
            }
        }
    }

    /// This node's id.
    pub(crate) fn node_id(&self) -> u64 {
        self.node.id()
    }

    /// `system.nodes`: every node, whether it is this one, and what it leads as seen here.
    pub(crate) fn nodes_table(&self) -> RecordBatch {
        let groups = self.groups();
        let leaders: Vec<Option<u64>> = (groups.iter())
            .map(|(_, _, r)| r.metrics().borrow_watched().current_leader)
            .collect();
        let peers = self.node.peers();
        let (mut id, mut addr, mut this, mut led) = (vec![], vec![], vec![], vec![]);
        for (n, a) in &peers {
            id.push(*n);
            addr.push(a.clone());
            this.push(*n == self.node.id());
            led.push(leaders.iter().filter(|l| **l == Some(*n)).count() as u64);
        }
        batch(vec![
            ("node_id", Arc::new(UInt64Array::from(id)) as ArrayRef),
            ("address", Arc::new(StringArray::from(addr))),
            ("this_node", Arc::new(BooleanArray::from(this))),
            ("groups_led", Arc::new(UInt64Array::from(led))),
        ])
    }

    /// `system.shards`: every group this node has a replica of, as this node sees it.
    pub(crate) fn shards_table(&self) -> RecordBatch {
        type Row = (String, String, RaftMetrics<Tc>, Option<u64>);
        let rows: Vec<Row> = (self.groups().into_iter())
            .map(|(g, replicas, raft)| {
                let m = raft.metrics().borrow_watched().clone();
                // On the leader: how far the slowest replica is behind its log.
                let last = m.last_log_index.unwrap_or(0);
                let lag = m.replication.as_ref().map(|r| {
                    (r.values())
                        .map(|l| last.saturating_sub(l.as_ref().map_or(0, |l| l.index)))
                        .max()
                        .unwrap_or(0)
                });
                let replicas: Vec<String> = replicas.iter().map(u64::to_string).collect();
                (g.to_string(), replicas.join(","), m, lag)
            })
            .collect();
        let text = |f: fn(&Row) -> &str| -> ArrayRef {
            Arc::new(StringArray::from_iter_values(rows.iter().map(f)))
        };
        let index = |f: &dyn Fn(&RaftMetrics<Tc>) -> Option<u64>| -> ArrayRef {
            Arc::new(UInt64Array::from_iter(rows.iter().map(|r| f(&r.2))))
        };
        batch(vec![
            ("shard", text(|r| &r.0)),
            ("replicas", text(|r| &r.1)),
            ("leader", index(&|m| m.current_leader)),
            (
                "preferred_leader",
                Arc::new(UInt64Array::from_iter(rows.iter().map(|r| {
                    let shard = r.0.strip_prefix("shard-")?.parse::<u32>().ok()?;
                    let p = self.placement.iter().find(|p| p.shard == shard)?;
                    Some(self.preferred_leader(p))
                }))),
            ),
            ("term", index(&|m| Some(m.current_term))),
            (
                "state",
                Arc::new(StringArray::from_iter_values(
                    (rows.iter()).map(|r| format!("{:?}", r.2.state).to_lowercase()),
                )),
            ),
            ("last_log_index", index(&|m| m.last_log_index)),
            (
                "commit_index",
                index(&|m| m.cluster_committed.map(|l| l.index)),
            ),
            ("applied_index", index(&|m| m.last_applied.map(|l| l.index))),
            ("snapshot_index", index(&|m| m.snapshot.map(|l| l.index))),
            ("purged_index", index(&|m| m.purged.map(|l| l.index))),
            (
                "lag",
                Arc::new(UInt64Array::from_iter(rows.iter().map(|r| r.3))),
            ),
        ])
    }

    /// Stops this node's groups.
    pub(crate) async fn shutdown(&self) {
        self.node.shutdown().await;
    }

    /// Queues `record` for shard `s` under a new write id; the receiver says how it went.
    fn enqueue(
        &self,
        s: u32,
        record: &WriteRecord,
    ) -> sluice_engine::Result<oneshot::Receiver<Result<(), String>>> {
        let seq = self.seq.fetch_add(1, Ordering::Relaxed);
        let mut entry = Vec::with_capacity(WRITE_HEADER + 32 + record.rows.len() * 64);
        entry.extend_from_slice(&self.node.id().to_le_bytes());
        entry.extend_from_slice(&self.incarnation.to_le_bytes());
        entry.extend_from_slice(&seq.to_le_bytes());
        sluice_engine::encode_record(record, &mut entry);
        let (tx, rx) = oneshot::channel();
        self.queues[s as usize]
            .send((entry, tx))
            .map_err(|_| Error::ShuttingDown)?;
        Ok(rx)
    }
}

fn batch(cols: Vec<(&str, ArrayRef)>) -> RecordBatch {
    let fields: Vec<Field> = (cols.iter())
        .map(|(n, a)| Field::new(*n, a.data_type().clone(), true))
        .collect();
    RecordBatch::try_new(
        Arc::new(Schema::new(fields)),
        cols.into_iter().map(|(_, a)| a).collect(),
    )
    .unwrap_or_else(|_| {
        RecordBatch::new_empty(Arc::new(Schema::new(vec![Field::new(
            "error",
            DataType::Utf8,
            true,
        )])))
    })
}

async fn initialize(raft: &GroupRaft, members: BTreeMap<u64, BasicNode>) -> anyhow::Result<()> {
    if raft
        .is_initialized()
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?
    {
        return Ok(());
    }
    match raft.initialize(members).await {
        Ok(()) => Ok(()),
        // Another start got there first: the group is formed.
        Err(e) if e.api_error().is_some() => Ok(()),
        Err(e) => Err(anyhow::anyhow!("initializing a raft group: {e}")),
    }
}

/// Waits (up to 30 s) until `raft` has applied what this node knew to be committed.
async fn wait_applied(raft: &GroupRaft, what: &str) {
    let committed = raft.metrics().borrow_watched().local_committed;
    let Some(target) = committed.map(|l| l.index) else {
        return;
    };
    let waited = (raft.wait(Some(Duration::from_secs(30))))
        .applied_index_at_least(Some(target), what)
        .await;
    if let Err(e) = waited {
        tracing::warn!(group = what, target, error = %e, "log not applied after 30 s; going on");
    }
}

/// The column whose value is a row's shard key: a table's first text column (the device
/// or topic) when it has one, else its time column; none: the whole row.
fn shard_key_column(def: &TableDef) -> Option<usize> {
    (def.columns.iter())
        .position(|c| c.ty == sluice_engine::types::ColumnType::String)
        .or_else(|| def.time_column())
}

/// The shard of `row`, its key built in `key`.
fn shard_of_row(column: Option<usize>, row: &[Value], shards: u32, key: &mut Vec<u8>) -> u32 {
    key.clear();
    match column.and_then(|i| row.get(i)) {
        Some(v) => key_bytes(v, key),
        None => row.iter().for_each(|v| key_bytes(v, key)),
    }
    sluice_cluster::shard_of(key, shards)
}

fn key_bytes(v: &Value, out: &mut Vec<u8>) {
    match v {
        Value::Null => {}
        Value::Bool(b) => out.push(*b as u8),
        Value::Int(i) | Value::Timestamp(i) => out.extend_from_slice(&i.to_le_bytes()),
        Value::UInt(u) => out.extend_from_slice(&u.to_le_bytes()),
        Value::Float(f) => out.extend_from_slice(&f.to_bits().to_le_bytes()),
        Value::Str(s) => out.extend_from_slice(s.as_bytes()),
        Value::Bytes(b) => out.extend_from_slice(b),
        Value::Date(d) => out.extend_from_slice(&d.to_le_bytes()),
    }
}

#[async_trait]
impl Replicator for Cluster {
    async fn commit(
        &self,
        def: &TableDef,
        records: Vec<Arc<WriteRecord>>,
    ) -> sluice_engine::Result<()> {
        let shards = self.placement.len() as u32;
        let column = shard_key_column(def);
        let mut key = Vec::new();
        let mut waiting = Vec::with_capacity(records.len());
        for rec in records {
            let mut at = (rec.rows.iter()).map(|r| shard_of_row(column, r, shards, &mut key));
            let first = at.next().unwrap_or(0);
            if at.all(|s| s == first) {
                // The usual case (a message is one reading): the record goes whole.
                waiting.push(self.enqueue(first, &rec)?);
                continue;
            }
            let mut split: BTreeMap<u32, Vec<Vec<Value>>> = BTreeMap::new();
            let rec = Arc::unwrap_or_clone(rec);
            for row in rec.rows {
                let s = shard_of_row(column, &row, shards, &mut key);
                split.entry(s).or_default().push(row);
            }
            for (s, rows) in split {
                let part = WriteRecord {
                    table_id: rec.table_id,
                    ncols: rec.ncols,
                    rows,
                    origin: rec.origin.clone(),
                };
                waiting.push(self.enqueue(s, &part)?);
            }
        }
        for rx in waiting {
            rx.await
                .map_err(|_| Error::ShuttingDown)?
                .map_err(replication)?;
        }
        Ok(())
    }

    fn evaluates_alerts(&self) -> bool {
        (self.node.group(GroupId::Meta))
            .is_some_and(|m| m.metrics().borrow_watched().current_leader == Some(self.node.id()))
    }

    async fn read_barrier(&self) -> sluice_engine::Result<()> {
        let shards = (self.placement.iter())
            .filter(|p| p.replicas.contains(&self.node.id()))
            .map(|p| GroupId::Shard(p.shard));
        let groups = std::iter::once(GroupId::Meta).chain(shards);
        futures::future::try_join_all(groups.map(|g| self.node.read_barrier(g)))
            .await
            .map(|_| ())
            .map_err(replication)
    }
}

/// A write waiting to be shipped to its shard: its entry (write id, then the engine
/// record) and where to say how it went.
type Queued = (Vec<u8>, oneshot::Sender<Result<(), String>>);

/// Ships a shard's queued writes in batches: every write queued while earlier batches are
/// in flight goes in the next one, a raft entry carrying many writes (each keeping its own
/// id), so that the entry's costs (encoding, replication, the apply hand-off) are shared, as
/// the single-node log shares one fsync among the writes of a group commit.
async fn ship(
    node: Arc<Node>,
    shard: u32,
    replicas: Vec<u64>,
    mut rx: mpsc::UnboundedReceiver<Queued>,
) {
    let in_flight = Arc::new(Semaphore::new(BATCHES_IN_FLIGHT));
    while let Some(first) = rx.recv().await {
        let Ok(permit) = in_flight.clone().acquire_owned().await else {
            return;
        };
        let (mut body, mut waiters) = (Vec::new(), Vec::new());
        let mut next = Some(first);
        while let Some((entry, tx)) = next.take() {
            body.extend_from_slice(&(entry.len() as u32).to_le_bytes());
            body.extend_from_slice(&entry);
            waiters.push(tx);
            if body.len() < MAX_BATCH_BYTES {
                next = rx.try_recv().ok();
            }
        }
        let (node, replicas) = (node.clone(), replicas.clone());
        tokio::spawn(async move {
            let command = Command::Write(Bytes::from(body));
            let out = match node.write(GroupId::Shard(shard), command, &replicas).await {
                Ok(Response { error: None, .. }) => Ok(()),
                Ok(Response { error: Some(e), .. }) => Err(format!("shard {shard}: {e}")),
                Err(e) => Err(e.to_string()),
            };
            drop(permit);
            for w in waiters {
                let _ = w.send(out.clone());
            }
        });
    }
}

/// Catalog changes through the metadata group.
struct MetaLog {
    cluster: Weak<Cluster>,
    engine: Weak<Engine>,
}

impl CatalogLog for MetaLog {
    fn commit(&self, next: &CatalogData) -> sluice_engine::Result<()> {
        let (Some(cluster), Some(engine)) = (self.cluster.upgrade(), self.engine.upgrade()) else {
            return Err(Error::ShuttingDown);
        };
        let text = serde_json::to_string(next).map_err(replication)?;
        let all: Vec<u64> = cluster.node.peers().keys().copied().collect();
        let r = block_on(
            cluster
                .node
                .write(GroupId::Meta, Command::Catalog(text), &all),
        )
        .map_err(replication)?;
        if let Some(message) = r.error {
            return Err(Error::InvalidDefinition { message });
        }
        // Committed and applied on the leader; wait until this node has it too.
        let deadline = Instant::now() + Duration::from_secs(10);
        while engine.catalog_version() < next.version {
            if Instant::now() > deadline {
                return Err(replication(
                    "the catalog change is committed but not yet applied on this node",
                ));
            }
            block_on(tokio::time::sleep(Duration::from_millis(2)));
        }
        Ok(())
    }
}

/// Why a shard's leadership could not be moved.
#[derive(Debug)]
pub(crate) enum MoveError {
    /// No such shard (and how many there are).
    NoShard(u32, usize),
    /// The node holds no replica of the shard.
    NotReplica {
        shard: u32,
        node: u64,
        replicas: Vec<u64>,
    },
    /// The metadata group did not commit the change.
    Failed(String),
}

impl std::fmt::Display for MoveError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::NoShard(s, n) => write!(f, "no shard {s}: there are {n}, numbered from 0"),
            Self::NotReplica {
                shard,
                node,
                replicas,
            } => write!(
                f,
                "node {node} holds no replica of shard {shard} (its replicas: {replicas:?})"
            ),
            Self::Failed(e) => write!(f, "the metadata group did not commit the move: {e}"),
        }
    }
}

/// The metadata group's state: the catalog, the manifest of Parquet files and the
/// preferred leaders operators chose.
struct MetaApply {
    engine: Weak<Engine>,
    node: Weak<Node>,
    preferred: Arc<Mutex<BTreeMap<u32, u64>>>,
}

fn refused(e: impl std::fmt::Display) -> Response {
    Response {
        rows: 0,
        error: Some(e.to_string()),
    }
}

impl Apply for MetaApply {
    fn apply(&self, index: u64, command: &Command) -> Response {
        let Some(engine) = self.engine.upgrade() else {
            return Response::default();
        };
        match command {
            Command::Catalog(text) => match engine.install_catalog(index, text.as_bytes()) {
                Ok(_) => Response::default(),
                Err(e) => refused(e),
            },
            Command::Files(text) => {
                let change: FileChange = match serde_json::from_str(text) {
                    Ok(f) => f,
                    Err(e) => return refused(format!("a file change that does not decode: {e}")),
                };
                match engine.install_file_change(index, &change) {
                    Ok(true) => {
                        self.snapshot_shards(change.shards().into_iter());
                        Response::default()
                    }
                    Ok(false) => refused("the files it replaces changed meanwhile"),
                    Err(e) => refused(e),
                }
            }
            Command::Leader { shard, node } => {
                self.preferred.lock().insert(*shard, *node);
                Response::default()
            }
            Command::Write(_) => Response::default(),
        }
    }
    fn snapshot(&self) -> io::Result<(Option<u64>, Bytes)> {
        // Never asked: the metadata group is not snapshotted (its log is small and kept
        // whole), and an error here would stop the group.
        Ok((Some(0), Bytes::new()))
    }
    fn restore(&self, _: &[u8]) -> io::Result<()> {
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "the metadata group has no snapshots; its log is kept whole",
        ))
    }
}

impl MetaApply {
    /// Asks openraft to snapshot the local replicas of `shards`, now that more of their
    /// rows are in files: the log behind is then purged.
    fn snapshot_shards(&self, shards: impl Iterator<Item = u32>) {
        let Some(node) = self.node.upgrade() else {
            return;
        };
        let shards: BTreeSet<u32> = shards.collect();
        for s in shards {
            if let Some(raft) = node.group(GroupId::Shard(s)) {
                tokio::spawn(async move {
                    let _ = raft.trigger().snapshot().await;
                });
            }
        }
    }
}

/// What a shard's snapshot holds: its log up to `through` is in files the metadata group
/// had installed by its entry `manifest_index`. With it, the duplicate filter as of entry
/// `applied` (at or after `through`) and the copies it dropped after `through`: the entries
/// after `through` are applied again after a restore, and must drop the same copies.
#[derive(serde::Serialize, serde::Deserialize)]
struct ShardSnapshot {
    through: u64,
    manifest_index: u64,
    applied: u64,
    seen: Vec<((u64, u64), Recent)>,
    dropped: Vec<(u64, [u8; WRITE_HEADER])>,
}

/// After a restore, until entry `upto`: the copies to drop are known (`dropped`, by log
/// index and write header), and the filter already holds every write up to `upto`.
struct Replay {
    upto: u64,
    dropped: HashSet<(u64, [u8; WRITE_HEADER])>,
}

/// A data shard's state: its rows, in the engine's buffers and files.
struct ShardApply {
    shard: u32,
    engine: Weak<Engine>,
    /// The last log index applied.
    applied: AtomicU64,
    /// (writer node, incarnation) -> the writes of it applied recently.
    seen: Mutex<HashMap<(u64, u64), Recent>>,
    /// Copies dropped since the last snapshot's position: (log index, write header).
    dropped: Mutex<Vec<(u64, [u8; WRITE_HEADER])>>,
    /// Set by a restore, while the entries the snapshot's filter already holds come again.
    replay: Mutex<Option<Replay>>,
    /// Whether `replay` is set: read per write, so the lock is taken only after a restore.
    replaying: AtomicBool,
}

/// One writer incarnation's recent write ids: a bit per sequence number in the window
/// below the highest seen (128 KiB), decided from the log alone so every replica drops the
/// same copies.
#[derive(Clone, serde::Serialize, serde::Deserialize)]
struct Recent {
    max: u64,
    bits: Vec<u64>,
}

impl Recent {
    fn new(first: u64) -> Self {
        let mut r = Self {
            max: first,
            bits: vec![0; (DEDUP_WINDOW / 64) as usize],
        };
        r.flip(first);
        r
    }

    fn slot(seq: u64) -> (usize, u64) {
        let i = seq % DEDUP_WINDOW;
        ((i / 64) as usize, 1 << (i % 64))
    }

    fn flip(&mut self, seq: u64) {
        let (w, b) = Self::slot(seq);
        self.bits[w] ^= b;
    }

    /// Records `seq`; whether it was recorded before. A sequence number older than the
    /// window is taken as new: a duplicate row is better than a lost one.
    fn insert(&mut self, seq: u64) -> bool {
        if seq > self.max {
            if seq - self.max >= DEDUP_WINDOW {
                self.bits.fill(0);
            } else {
                for s in self.max + 1..=seq {
                    let (w, b) = Self::slot(s);
                    self.bits[w] &= !b;
                }
            }
            self.max = seq;
            self.flip(seq);
            return false;
        }
        if self.max - seq >= DEDUP_WINDOW {
            return false;
        }
        let (w, b) = Self::slot(seq);
        let seen = self.bits[w] & b != 0;
        self.bits[w] |= b;
        seen
    }
}

impl ShardApply {
    fn new(shard: u32, engine: Weak<Engine>) -> Self {
        Self {
            shard,
            engine,
            applied: AtomicU64::new(0),
            seen: Mutex::new(HashMap::new()),
            dropped: Mutex::new(Vec::new()),
            replay: Mutex::new(None),
            replaying: AtomicBool::new(false),
        }
    }

    /// Whether the write with this header, in the entry at `index`, is a copy of one
    /// applied before; remembered until a snapshot covers `index`.
    fn is_copy(&self, index: u64, header: &[u8; WRITE_HEADER]) -> bool {
        let replayed = if self.replaying.load(Ordering::Acquire) {
            let mut replay = self.replay.lock();
            match replay.as_ref() {
                Some(r) if index <= r.upto => Some(r.dropped.contains(&(index, *header))),
                _ => {
                    *replay = None;
                    self.replaying.store(false, Ordering::Release);
                    None
                }
            }
        } else {
            None
        };
        let copy = replayed.unwrap_or_else(|| self.seen_before(header));
        if copy {
            self.dropped.lock().push((index, *header));
        }
        copy
    }

    /// The snapshot of this shard for entries up to `through`.
    fn snapshot_at(&self, through: u64, manifest_index: u64) -> ShardSnapshot {
        let replay = self.replay.lock();
        let mut dropped = self.dropped.lock();
        dropped.retain(|(i, _)| *i > through);
        let mut all = dropped.clone();
        let mut applied = self.applied.load(Ordering::Acquire);
        if let Some(r) = replay.as_ref() {
            // Mid-replay the filter is at `upto`, and the copies still to come are known.
            applied = applied.max(r.upto);
            let pending = r.dropped.iter().filter(|(i, _)| *i > through);
            all.extend(pending.filter(|d| !dropped.contains(d)));
        }
        let seen = self.seen.lock();
        ShardSnapshot {
            through,
            manifest_index,
            applied,
            seen: seen.iter().map(|(k, r)| (*k, r.clone())).collect(),
            dropped: all,
        }
    }

    /// Takes the duplicate filter of a snapshot.
    fn restore_filter(&self, snap: &ShardSnapshot) {
        *self.seen.lock() = snap.seen.iter().cloned().collect();
        *self.dropped.lock() = snap.dropped.clone();
        *self.replay.lock() = Some(Replay {
            upto: snap.applied,
            dropped: snap.dropped.iter().copied().collect(),
        });
        self.replaying.store(true, Ordering::Release);
        self.applied.store(snap.through, Ordering::Release);
    }

    /// Whether the write with this header was applied before (a re-sent copy).
    fn seen_before(&self, header: &[u8]) -> bool {
        let word = |i: usize| u64::from_le_bytes(header[i..i + 8].try_into().unwrap_or_default());
        let (writer, seq) = ((word(0), word(8)), word(16));
        let mut seen = self.seen.lock();
        if let Some(r) = seen.get_mut(&writer) {
            return r.insert(seq);
        }
        // A writer's new incarnation (it restarted): forget all but its latest few.
        let mut older: Vec<u64> = (seen.keys())
            .filter(|(node, _)| *node == writer.0)
            .map(|(_, inc)| *inc)
            .collect();
        older.sort_unstable();
        while older.len() >= INCARNATIONS_KEPT {
            seen.remove(&(writer.0, older.remove(0)));
        }
        seen.insert(writer, Recent::new(seq));
        false
    }
}

impl Apply for ShardApply {
    fn apply(&self, index: u64, command: &Command) -> Response {
        self.applied.store(index, Ordering::Release);
        let Command::Write(body) = command else {
            return Response::default();
        };
        let Some(engine) = self.engine.upgrade() else {
            return Response::default();
        };
        let (mut rows, mut error) = (0, None);
        let mut rest = &body[..];
        while let Some((len, tail)) = rest.split_first_chunk::<4>() {
            let len = u32::from_le_bytes(*len) as usize;
            let Some((entry, tail)) = tail.split_at_checked(len) else {
                error = Some("a truncated write in a shard entry".to_string());
                break;
            };
            rest = tail;
            let Some((header, _)) = entry.split_first_chunk::<WRITE_HEADER>() else {
                continue;
            };
            if self.is_copy(index, header) {
                continue;
            }
            match engine.apply_replicated(self.shard, index, &entry[WRITE_HEADER..]) {
                Ok(n) => rows += n,
                Err(e) => {
                    tracing::error!(error = %e, "a committed write could not be applied");
                    error.get_or_insert(e.to_string());
                }
            }
        }
        Response { rows, error }
    }

    /// The position up to which the shard's rows are all in installed files.
    fn snapshot(&self) -> io::Result<(Option<u64>, Bytes)> {
        let applied = self.applied.load(Ordering::Acquire);
        let (through, manifest_index) = match self.engine.upgrade() {
            Some(e) => (
                e.shard_persisted_through(self.shard).unwrap_or(applied),
                e.manifest_index(),
            ),
            None => (0, 0),
        };
        let data = sluice_cluster::to_cbor(&self.snapshot_at(through, manifest_index))?;
        Ok((Some(through), Bytes::from(data)))
    }

    /// Catching up from the shared store: the files (named by the manifest the metadata
    /// group brings) hold the shard's rows up to the snapshot; only later entries follow.
    fn restore(&self, data: &[u8]) -> io::Result<()> {
        let snap: ShardSnapshot = sluice_cluster::from_cbor(data)?;
        let engine = self
            .engine
            .upgrade()
            .ok_or_else(|| io::Error::other("shutting down"))?;
        engine
            .restore_shard(self.shard, snap.through, snap.manifest_index)
            .map_err(io::Error::other)?;
        self.restore_filter(&snap);
        tracing::info!(
            shard = self.shard,
            through = snap.through,
            "shard restored from the shared store"
        );
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(writer: u64, seq: u64) -> [u8; WRITE_HEADER] {
        let mut h = [0; WRITE_HEADER];
        h[..8].copy_from_slice(&writer.to_le_bytes());
        h[8..16].copy_from_slice(&1u64.to_le_bytes());
        h[16..].copy_from_slice(&seq.to_le_bytes());
        h
    }

    /// A shard restored from a snapshot whose position is behind the entries its filter
    /// had seen drops exactly the copies the original dropped, when those entries come again
    /// and after them (also when the snapshot is taken again mid-replay).
    #[test]
    fn a_restored_shard_drops_the_same_copies() {
        // Re-sent copies: entry 3 of 1's write, 5 of 2's (straddling the snapshot at 2), 7
        // of 3's (after everything the snapshot saw), 8 of 1's again.
        let log: Vec<(u64, [u8; WRITE_HEADER])> = [(1, 1), (2, 2), (3, 1), (4, 3), (5, 2)]
            .into_iter()
            .chain([(6, 4), (7, 3), (8, 1), (9, 5)])
            .map(|(i, seq)| (i, header(7, seq)))
            .collect();
        let original = ShardApply::new(0, Weak::new());
        let want: Vec<bool> = log.iter().map(|(i, h)| original.is_copy(*i, h)).collect();
        assert_eq!(
            want,
            [false, false, true, false, true, false, true, true, false]
        );

        let source = ShardApply::new(0, Weak::new());
        for (i, h) in &log[..5] {
            source.is_copy(*i, h);
        }
        source.applied.store(5, Ordering::Release);
        let snap = source.snapshot_at(2, 0);
        let bytes = sluice_cluster::to_cbor(&snap).unwrap();
        let restored = ShardApply::new(0, Weak::new());
        restored.restore_filter(&sluice_cluster::from_cbor(&bytes).unwrap());
        let got: Vec<bool> = log[2..]
            .iter()
            .map(|(i, h)| restored.is_copy(*i, h))
            .collect();
        assert_eq!(got, want[2..]);

        // Again, from a snapshot taken after replaying entry 3 only.
        let again = ShardApply::new(0, Weak::new());
        again.restore_filter(&snap);
        again.is_copy(log[2].0, &log[2].1);
        again.applied.store(3, Ordering::Release);
        let snap = again.snapshot_at(3, 0);
        let last = ShardApply::new(0, Weak::new());
        last.restore_filter(&snap);
        let got: Vec<bool> = log[3..].iter().map(|(i, h)| last.is_copy(*i, h)).collect();
        assert_eq!(got, want[3..]);
    }

    #[test]
    fn recent_write_ids_drop_copies_within_the_window() {
        let mut r = Recent::new(10);
        assert!(r.insert(10), "the first one again");
        assert!(!r.insert(12));
        assert!(!r.insert(11), "an earlier one arriving late is new");
        assert!(r.insert(11) && r.insert(12));
        // Far ahead: everything before is forgotten, and bits reused by the ring are clear.
        let far = 12 + DEDUP_WINDOW;
        assert!(!r.insert(far));
        assert!(!r.insert(far - 1));
        assert!(r.insert(far - 1));
        assert!(
            !r.insert(12),
            "older than the window: kept rather than lost"
        );
        assert!(!r.insert(far + 100));
        assert!(!r.insert(far + 50), "a slot cleared by moving ahead");
    }
}
