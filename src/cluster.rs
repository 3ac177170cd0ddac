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
//!
//! Nodes join and leave through the metadata group: a [`Topology`] (nodes, each shard's
//! placed replicas, each shard's committed voters) is committed there, and every node
//! brings its part in line with it ([`Cluster::reconcile`]): group leaders add learners,
//! promote them once caught up and drop replicas no longer placed; nodes open and close
//! their replicas.

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
/// A learner this close to its leader's last entry is made a voter.
const CAUGHT_UP: u64 = 64;

/// The cluster's nodes and shard placement, as the metadata group applied them: every node
/// holds the same one at the same metadata index. Before any node was added or removed it is
/// the one the config gives ([`Topology::initial`]); a joining node has none until its
/// metadata group brings the first change.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub(crate) struct Topology {
    /// Topologies applied: a proposal names the next, so one made from a stale view is
    /// refused.
    version: u64,
    /// The cluster's nodes and their node-to-node addresses.
    nodes: BTreeMap<u64, String>,
    replication_factor: usize,
    /// Where each shard's replicas should be, the preferred leader first.
    placement: Vec<ShardPlacement>,
    /// Each shard's voters as its group last committed them ([`Command::Members`]).
    members: BTreeMap<u32, Vec<u64>>,
    /// The shard group's log index of the membership `members` reports.
    #[serde(default)]
    members_at: BTreeMap<u32, u64>,
    /// Nodes removed from the cluster: their ids are not used again.
    #[serde(default)]
    removed: BTreeSet<u64>,
}

impl Topology {
    /// The topology of a cluster formed from `cfg`'s peers.
    fn initial(cfg: &ClusterConfig) -> Self {
        let nodes = cfg.nodes();
        let ids: BTreeSet<u64> = nodes.keys().copied().collect();
        let placement = sluice_cluster::place(&ids, cfg.shard_count(), cfg.replication_factor);
        Self {
            version: 0,
            members: (placement.iter())
                .map(|p| (p.shard, p.replicas.clone()))
                .collect(),
            nodes,
            replication_factor: cfg.replication_factor,
            placement,
            members_at: BTreeMap::new(),
            removed: BTreeSet::new(),
        }
    }

    /// The next topology with `nodes` as the cluster's nodes.
    fn with_nodes(&self, nodes: BTreeMap<u64, String>) -> Self {
        let ids: BTreeSet<u64> = nodes.keys().copied().collect();
        let mut removed = self.removed.clone();
        removed.extend(self.nodes.keys().filter(|n| !ids.contains(n)));
        Self {
            version: self.version + 1,
            placement: sluice_cluster::rebalance(&self.placement, &ids, self.replication_factor),
            nodes,
            removed,
            ..self.clone()
        }
    }

    /// Whether `node` keeps a replica of `shard`: every node of the cluster does (a voter
    /// where the placement puts one, else a learner, so that every node's SQL sees every
    /// shard's unflushed rows), and so does a node that left while it is still a voter.
    fn keeps(&self, shard: u32, node: u64) -> bool {
        self.nodes.contains_key(&node) || self.holders(shard).contains(&node)
    }

    /// The nodes that are or should be `shard`'s voters (the committed ones first): where
    /// its leader is.
    fn holders(&self, shard: u32) -> Vec<u64> {
        let mut out = self.members.get(&shard).cloned().unwrap_or_default();
        if let Some(p) = self.placement.get(shard as usize) {
            for r in &p.replicas {
                if !out.contains(r) {
                    out.push(*r);
                }
            }
        }
        out
    }

    /// Whether every shard's voters are where the placement wants them.
    fn settled(&self) -> bool {
        let set = |v: &[u64]| v.iter().copied().collect::<BTreeSet<u64>>();
        (self.placement.iter())
            .all(|p| self.members.get(&p.shard).map(|m| set(m)) == Some(set(&p.replicas)))
    }
}

/// The topology, shared by the metadata group's apply and the node.
type SharedTopology = Arc<Mutex<Option<Topology>>>;

/// This node of the cluster.
pub(crate) struct Cluster {
    node: Arc<Node>,
    engine: Weak<Engine>,
    /// Data shards (fixed for the cluster's life).
    shards: u32,
    topology: SharedTopology,
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
    /// shard applies rows). A joining node (`cfg.join`) first waits until a member adds it.
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
        let topology: SharedTopology =
            Arc::new(Mutex::new((!cfg.join).then(|| Topology::initial(cfg))));
        let meta_apply = MetaApply {
            engine: Arc::downgrade(engine),
            node: Arc::downgrade(&node),
            preferred: preferred.clone(),
            topology: topology.clone(),
        };
        let meta = node
            .open_group(GroupId::Meta, Arc::new(meta_apply))
            .await
            .context("opening the metadata group")?;
        if !cfg.join && cfg.node_id == ids[0] {
            initialize(&meta, members(&ids, &peers)).await?;
        }
        let mut waited = Instant::now();
        while cfg.join
            && !(topology.lock().as_ref()).is_some_and(|t| t.nodes.contains_key(&cfg.node_id))
        {
            if (topology.lock().as_ref()).is_some_and(|t| t.removed.contains(&cfg.node_id)) {
                anyhow::bail!(
                    "node {} was removed from the cluster (a node id is not used again)",
                    cfg.node_id
                );
            }
            if waited.elapsed() > Duration::from_secs(10) {
                waited = Instant::now();
                tracing::info!(
                    "node {} waits to be added: POST /v1/cluster/nodes \
                     {{\"node\": {}, \"address\": \"{}\"}} on a member",
                    cfg.node_id,
                    cfg.node_id,
                    cfg.listen
                );
            }
            tokio::select! {
                _ = cancel.cancelled() => anyhow::bail!("stopped before joining the cluster"),
                _ = tokio::time::sleep(Duration::from_millis(50)) => {}
            }
        }
        wait_applied(&meta, "metadata").await;
        if !(topology.lock().as_ref()).is_some_and(|t| t.nodes.contains_key(&cfg.node_id)) {
            anyhow::bail!(
                "node {} was removed from the cluster (a node id is not used again)",
                cfg.node_id
            );
        }
        // The cluster's shards: a joining node learns their number from the topology.
        let shards =
            (topology.lock().as_ref()).map_or(cfg.shard_count(), |t| t.placement.len() as u32);
        let queues = (0..shards)
            .map(|shard| {
                let (tx, rx) = mpsc::unbounded_channel();
                tokio::spawn(ship(node.clone(), shard, topology.clone(), rx));
                tx
            })
            .collect();
        let cluster = Arc::new(Self {
            node: node.clone(),
            engine: Arc::downgrade(engine),
            shards,
            topology,
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
        let t = cluster.topology();
        for p in &t.placement {
            if !t.keeps(p.shard, cfg.node_id) {
                continue;
            }
            let raft = cluster
                .open_shard(p.shard)
                .await
                .with_context(|| format!("opening shard {}", p.shard))?;
            // Groups of the cluster's first placement are formed by their preferred leader;
            // later ones exist already and take new replicas as learners.
            if t.version == 0 && p.replicas[0] == cfg.node_id {
                initialize(&raft, members(&p.replicas, &peers)).await?;
            }
        }
        tokio::spawn(cluster.clone().reconcile(cancel.clone()));
        tokio::spawn(cluster.clone().flush_led_shards(cancel));
        Ok(cluster)
    }

    /// The topology (set before [`Cluster::start`] returns).
    fn topology(&self) -> Topology {
        (self.topology.lock().clone()).expect("the topology is known once the node started")
    }

    /// Opens this node's replica of `shard`.
    async fn open_shard(&self, shard: u32) -> io::Result<GroupRaft> {
        let apply = Arc::new(ShardApply::new(shard, self.engine.clone()));
        self.node.open_group(GroupId::Shard(shard), apply).await
    }

    /// Writes the due rows of the shards this node leads as Parquet on the shared store and
    /// commits the files through the metadata group; every node then installs them, drops
    /// those rows from its buffers and snapshots the shards ([`MetaApply`]). On the metadata
    /// group's leader, also merges small files now and then (`[compaction]`).
    async fn flush_led_shards(self: Arc<Self>, cancel: CancellationToken) {
        let mut last_compact = tokio::time::Instant::now();
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(FLUSH_CHECK) => {}
            }
            let Some(engine) = self.engine.upgrade() else {
                return;
            };
            let leads = |g: GroupId| self.node.group(g).is_some_and(|r| self.leads(&r));
            let led: Vec<u32> = (0..self.shards)
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
        let all = self.node_ids();
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

    /// The cluster's nodes.
    pub(crate) fn node_ids(&self) -> Vec<u64> {
        (self.topology.lock().as_ref())
            .map(|t| t.nodes.keys().copied().collect())
            .unwrap_or_default()
    }

    /// Every group this node has, with the replicas it should have.
    fn groups(&self) -> Vec<(GroupId, Vec<u64>, GroupRaft)> {
        let t = self.topology();
        std::iter::once((GroupId::Meta, t.nodes.keys().copied().collect()))
            .chain((t.placement.iter()).map(|p| (GroupId::Shard(p.shard), p.replicas.clone())))
            .filter_map(|(g, r)| Some((g, r, self.node.group(g)?)))
            .collect()
    }

    /// The replica that should lead `shard`: the one an operator chose if it still holds
    /// one, else the placement's first.
    fn preferred_leader(&self, p: &ShardPlacement) -> u64 {
        (self.preferred.lock().get(&p.shard).copied())
            .filter(|n| p.replicas.contains(n))
            .unwrap_or(p.replicas[0])
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
        let t = self.topology();
        let p = (t.placement.iter().find(|p| p.shard == shard))
            .ok_or(MoveError::NoShard(shard, t.placement.len()))?;
        // A replica placed there that is not a voter yet (a move under way) cannot lead.
        let voters = t.members.get(&shard).cloned().unwrap_or_default();
        if !p.replicas.contains(&node) || !voters.contains(&node) {
            return Err(MoveError::NotReplica {
                shard,
                node,
                replicas: (p.replicas.iter())
                    .filter(|r| voters.contains(r))
                    .copied()
                    .collect(),
            });
        }
        let all = self.node_ids();
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

    /// Whether this node leads the group of `raft`.
    fn leads(&self, raft: &GroupRaft) -> bool {
        raft.metrics().borrow_watched().current_leader == Some(self.node.id())
    }

    /// Hands a shard's leadership (held here) to `to` once it has every entry.
    async fn hand_over(&self, shard: u32, raft: &GroupRaft, to: u64) {
        let m = raft.metrics().borrow_watched().clone();
        let matched = matched(&m, to);
        if matched.is_some() && matched == m.last_log_index {
            tracing::info!(
                shard,
                to,
                "moving shard leadership to its preferred replica"
            );
            let _ = raft.trigger().transfer_leader(to).await;
        }
    }

    /// Brings this node's part of the cluster in line with the topology, every second:
    /// opens the shards placed here and closes those that left; on a shard's leader, adds
    /// the new replicas as learners, makes them voters once they have caught up (dropping
    /// the replicas that are no longer placed) and commits the result to the metadata group;
    /// on that group's leader, the same for the nodes. Hands leaderships to their preferred
    /// replicas (after a failover, or at start when another replica won the first election).
    /// Each step is decided from the state at that moment, so a step interrupted by a crash
    /// or a leader change is taken again by whoever leads next.
    async fn reconcile(self: Arc<Self>, cancel: CancellationToken) {
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
            let t = self.topology();
            let me = self.node.id();
            if let Some(meta) = self.node.group(GroupId::Meta)
                && self.leads(&meta)
            {
                self.lead_meta(&t, &meta).await;
            }
            for p in &t.placement {
                let wanted = t.keeps(p.shard, me);
                match self.node.group(GroupId::Shard(p.shard)) {
                    None if wanted => {
                        tracing::info!(shard = p.shard, "a replica of the shard is placed here");
                        if let Err(e) = self.open_shard(p.shard).await {
                            tracing::warn!(shard = p.shard, error = %e, "opening a shard");
                        }
                    }
                    Some(_) if !wanted => self.close_shard(p.shard).await,
                    Some(raft) if self.leads(&raft) => {
                        self.lead_shard(&t, p, &raft).await;
                    }
                    _ => {}
                }
            }
        }
    }

    /// On the leader of a group: moves its voters toward `target` by one step, with
    /// `learners` (not in `target`) as learners. New nodes are added as learners; once every
    /// new voter has caught up, the voters become `target` (voters that leave stay learners
    /// until they are neither wanted nor placed). Returns the log index of the membership
    /// once the voters are `target` and that membership is committed and applied here.
    async fn change_voters(
        &self,
        group: GroupId,
        raft: &GroupRaft,
        target: &BTreeSet<u64>,
        wanted_learners: &BTreeSet<u64>,
        addresses: &BTreeMap<u64, String>,
    ) -> Option<u64> {
        let m = raft.metrics().borrow_watched().clone();
        let membership = m.membership_config.membership();
        let voters: BTreeSet<u64> = membership.voter_ids().collect();
        let learners: BTreeSet<u64> = membership.learner_ids().collect();
        for n in wanted_learners.difference(&voters) {
            if !learners.contains(n) && !target.contains(n) {
                self.add_learner(group, raft, *n, addresses).await;
            }
        }
        if voters == *target && membership.get_joint_config().len() == 1 {
            let stale: BTreeSet<u64> = (learners.iter())
                .filter(|l| !target.contains(l) && !wanted_learners.contains(l))
                .copied()
                .collect();
            if !stale.is_empty() {
                let remove =
                    raft.change_membership(openraft::ChangeMembers::RemoveNodes(stale), false);
                within(group, "removing learners", remove).await;
            }
            // Committed: applied here (metrics show the effective membership, which may be
            // an uncommitted entry a new leader inherited).
            let at = m.membership_config.log_id().as_ref().map_or(0, |l| l.index);
            let applied = m.last_applied.map_or(0, |l| l.index);
            return (at <= applied).then_some(at);
        }
        let mut behind = false;
        for n in target.difference(&voters) {
            if !learners.contains(n) {
                if !self.add_learner(group, raft, *n, addresses).await {
                    return None;
                }
                behind = true;
                continue;
            }
            let last = m.last_log_index.unwrap_or(0);
            behind |= matched(&m, *n).is_none_or(|i| last.saturating_sub(i) > CAUGHT_UP);
        }
        if behind {
            return None;
        }
        tracing::info!(%group, from = ?voters, to = ?target, "changing the voters");
        let change = raft.change_membership(target.clone(), true);
        within(group, "changing the voters", change).await?;
        // The next round reports it, once applied here.
        None
    }

    /// Adds `node` to `group` as a learner (its log follows the leader's); whether it was.
    async fn add_learner(
        &self,
        group: GroupId,
        raft: &GroupRaft,
        node: u64,
        addresses: &BTreeMap<u64, String>,
    ) -> bool {
        let addr = (addresses.get(&node).cloned())
            .or_else(|| self.node.peers().get(&node).cloned())
            .unwrap_or_default();
        tracing::info!(%group, node, "adding a replica (a learner)");
        let add = raft.add_learner(node, BasicNode::new(addr), false);
        within(group, "adding a learner", add).await.is_some()
    }

    /// On a shard's leader: its voters toward the placement, the result committed to the
    /// metadata group; its leadership to the preferred replica.
    async fn lead_shard(&self, t: &Topology, p: &ShardPlacement, raft: &GroupRaft) {
        let target: BTreeSet<u64> = p.replicas.iter().copied().collect();
        let group = GroupId::Shard(p.shard);
        let learners: BTreeSet<u64> = t.nodes.keys().copied().collect();
        let Some(at) = (self.change_voters(group, raft, &target, &learners, &t.nodes)).await else {
            return;
        };
        let committed: Option<BTreeSet<u64>> =
            (t.members.get(&p.shard)).map(|m| m.iter().copied().collect());
        if committed.as_ref() != Some(&target) {
            let command = Command::Members {
                shard: p.shard,
                replicas: p.replicas.clone(),
                at,
            };
            let all = self.node_ids();
            let write = (self.node).write(GroupId::Meta, command, &all);
            if let Some(r) = within(GroupId::Meta, "committing a shard's voters", write).await {
                let refused = r.error;
                tracing::info!(shard = p.shard, replicas = ?p.replicas, ?refused, "shard moved");
            }
            return;
        }
        let preferred = self.preferred_leader(p);
        if preferred != self.node.id() {
            self.hand_over(p.shard, raft, preferred).await;
        }
    }

    /// On the metadata group's leader: its voters toward the cluster's nodes. A node that
    /// left stays a voter until no shard has it among its voters, so that it learns of its
    /// shards' moves.
    async fn lead_meta(&self, t: &Topology, meta: &GroupRaft) {
        let held = |n: &u64| t.members.values().any(|m| m.contains(n));
        let target: BTreeSet<u64> = (t.nodes.keys().copied())
            .chain(voters(meta).into_iter().filter(held))
            .collect();
        (self.change_voters(GroupId::Meta, meta, &target, &BTreeSet::new(), &t.nodes)).await;
    }

    /// Closes this node's replica of a shard that left it: the group stops, its log is
    /// deleted and its rows leave this node's buffers (files keep them).
    async fn close_shard(&self, shard: u32) {
        tracing::info!(shard, "the shard's replica left this node; closing it");
        if let Err(e) = self.node.close_group(GroupId::Shard(shard)).await {
            tracing::warn!(shard, error = %e, "removing a closed shard's log");
        }
        if let Some(engine) = self.engine.upgrade() {
            engine.forget_shard(shard);
        }
    }

    /// Adds node `id` at `address` (`Some`) or removes it (`None`): commits the new
    /// topology through the metadata group, then waits up to `wait` for the shards and the
    /// metadata group to have moved (the move goes on after that; `system.shards` shows
    /// it). Returns the topology seen at the end and whether it has settled.
    pub(crate) async fn change_node(
        &self,
        id: u64,
        address: Option<String>,
        wait: Duration,
    ) -> Result<(Topology, bool), NodeError> {
        let mut tries = 0;
        loop {
            let t = self.topology();
            let mut nodes = t.nodes.clone();
            match (&address, nodes.get(&id)) {
                (Some(a), Some(known)) if a != known => {
                    return Err(NodeError::Conflict(format!(
                        "node {id} is already a member, at {known}"
                    )));
                }
                (Some(_), Some(_)) | (None, None) => break,
                (Some(a), None) => {
                    if let Some((other, _)) = t.nodes.iter().find(|(_, addr)| *addr == a) {
                        return Err(NodeError::Conflict(format!(
                            "node {other} is at {a} already"
                        )));
                    }
                    if t.removed.contains(&id) {
                        return Err(NodeError::Conflict(format!(
                            "node {id} was a member and was removed; a node id is not used again"
                        )));
                    }
                    nodes.insert(id, a.clone());
                }
                (None, Some(_)) if nodes.len() == 1 => {
                    return Err(NodeError::Invalid(
                        "the last node of a cluster cannot be removed".into(),
                    ));
                }
                (None, Some(_)) => {
                    nodes.remove(&id);
                }
            }
            let next = t.with_nodes(nodes);
            let text =
                serde_json::to_string(&next).map_err(|e| NodeError::Failed(e.to_string()))?;
            let r = (self.node)
                .write(GroupId::Meta, Command::Topology(text), &self.node_ids())
                .await
                .map_err(|e| NodeError::Failed(e.to_string()))?;
            match r.error {
                None => {
                    tracing::info!(node = id, added = address.is_some(), "topology changed");
                    break;
                }
                Some(e) if tries < 5 => {
                    tries += 1;
                    tracing::info!(reason = %e, "topology proposal refused; trying again");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Some(e) => return Err(NodeError::Failed(e)),
            }
        }
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let t = self.topology();
            let voters = self.meta_voters();
            let done = t.settled() && voters.iter().eq(t.nodes.keys());
            if done || tokio::time::Instant::now() >= deadline {
                return Ok((t, done));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The metadata group's voters, as this node knows them.
    fn meta_voters(&self) -> BTreeSet<u64> {
        (self.node.group(GroupId::Meta)).map_or_else(BTreeSet::new, |m| voters(&m))
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
        let t = self.topology();
        let meta_voters = self.meta_voters();
        // Members, and nodes that left but still hold replicas.
        let ids: BTreeSet<u64> = (t.nodes.keys().copied())
            .chain(t.members.values().flatten().copied())
            .collect();
        let peers = self.node.peers();
        let (mut id, mut addr, mut this, mut led) = (vec![], vec![], vec![], vec![]);
        let (mut state, mut replicas) = (vec![], vec![]);
        for n in ids {
            id.push(n);
            addr.push((t.nodes.get(&n).or(peers.get(&n)).cloned()).unwrap_or_default());
            this.push(n == self.node.id());
            led.push(leaders.iter().filter(|l| **l == Some(n)).count() as u64);
            let holds = t.members.values().filter(|m| m.contains(&n)).count() as u64;
            let placed = (t.placement.iter())
                .filter(|p| p.replicas.contains(&n))
                .count() as u64;
            replicas.push(holds);
            state.push(if !t.nodes.contains_key(&n) {
                "leaving"
            } else if !meta_voters.contains(&n) || holds != placed {
                "joining"
            } else {
                "member"
            });
        }
        batch(vec![
            ("node_id", Arc::new(UInt64Array::from(id)) as ArrayRef),
            ("address", Arc::new(StringArray::from(addr))),
            ("this_node", Arc::new(BooleanArray::from(this))),
            ("state", Arc::new(StringArray::from(state))),
            ("replicas", Arc::new(UInt64Array::from(replicas))),
            ("groups_led", Arc::new(UInt64Array::from(led))),
        ])
    }

    /// `system.shards`: every group this node has a replica of, as this node sees it.
    pub(crate) fn shards_table(&self) -> RecordBatch {
        type Row = (String, String, RaftMetrics<Tc>, Option<u64>);
        let t = self.topology();
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
            (
                "voters",
                Arc::new(StringArray::from_iter_values(rows.iter().map(|r| {
                    let v: Vec<String> = (r.2.membership_config.membership().voter_ids())
                        .map(|v| v.to_string())
                        .collect();
                    v.join(",")
                }))),
            ),
            ("leader", index(&|m| m.current_leader)),
            (
                "preferred_leader",
                Arc::new(UInt64Array::from_iter(rows.iter().map(|r| {
                    let shard = r.0.strip_prefix("shard-")?.parse::<u32>().ok()?;
                    Some(self.preferred_leader(t.placement.get(shard as usize)?))
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

/// How long one step of [`Cluster::reconcile`] may wait (a leader cut off from its
/// quorum would otherwise hold the loop).
const RECONCILE_STEP: Duration = Duration::from_secs(10);

/// Runs one step of the reconciliation: its value, or `None` (logged) if it failed or
/// took longer than [`RECONCILE_STEP`].
async fn within<T, E: std::fmt::Display>(
    group: GroupId,
    what: &str,
    step: impl std::future::Future<Output = Result<T, E>>,
) -> Option<T> {
    match tokio::time::timeout(RECONCILE_STEP, step).await {
        Ok(Ok(v)) => Some(v),
        Ok(Err(e)) => {
            tracing::warn!(%group, error = %e, "{what}");
            None
        }
        Err(_) => {
            tracing::warn!(%group, secs = RECONCILE_STEP.as_secs(), "{what}: no answer in time");
            None
        }
    }
}

/// On a group's leader: the last log index `node` is known to have (from the replication
/// metrics).
fn matched(m: &RaftMetrics<Tc>, node: u64) -> Option<u64> {
    (m.replication.as_ref())
        .and_then(|r| r.get(&node).cloned().flatten())
        .map(|l| l.index)
}

/// A group's voters, as this node knows them.
fn voters(raft: &GroupRaft) -> BTreeSet<u64> {
    (raft.metrics().borrow_watched())
        .membership_config
        .membership()
        .voter_ids()
        .collect()
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
        let shards = self.shards;
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
        (self.node.group(GroupId::Meta)).is_some_and(|m| self.leads(&m))
    }

    async fn read_barrier(&self) -> sluice_engine::Result<()> {
        // Every shard this node keeps a replica of (a voter or a learner; not one whose
        // leader has not added this node yet).
        let me = self.node.id();
        let shards: Vec<GroupId> = (0..self.shards)
            .map(GroupId::Shard)
            .filter(|g| {
                (self.node.group(*g)).is_some_and(|r| {
                    let m = r.metrics().borrow_watched().membership_config.clone();
                    m.membership().nodes().any(|(id, _)| *id == me)
                })
            })
            .collect();
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
    topology: SharedTopology,
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
        let node = node.clone();
        let replicas = (topology.lock().as_ref()).map_or_else(Vec::new, |t| t.holders(shard));
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
        let all = cluster.node_ids();
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

/// Why a node could not be added or removed.
#[derive(Debug)]
pub(crate) enum NodeError {
    /// The request contradicts the cluster (an id taken, or used before).
    Conflict(String),
    /// The request cannot be done (the last node).
    Invalid(String),
    /// The metadata group did not commit the change.
    Failed(String),
}

impl std::fmt::Display for NodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Conflict(e) | Self::Invalid(e) => f.write_str(e),
            Self::Failed(e) => write!(f, "the metadata group did not commit the change: {e}"),
        }
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
    topology: SharedTopology,
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
                tracing::info!(index, shard, node, "preferred leader set");
                self.preferred.lock().insert(*shard, *node);
                Response::default()
            }
            Command::Topology(text) => {
                let next: Topology = match serde_json::from_str(text) {
                    Ok(t) => t,
                    Err(e) => return refused(format!("a topology that does not decode: {e}")),
                };
                let mut topology = self.topology.lock();
                let version = topology.as_ref().map_or(0, |t| t.version);
                if next.version != version + 1 {
                    return refused(format!(
                        "the topology changed meanwhile (version {version}, not {})",
                        next.version.saturating_sub(1)
                    ));
                }
                if let Some(node) = self.node.upgrade() {
                    node.add_peers(&next.nodes);
                }
                let mut next = next;
                if let Some(current) = topology.take() {
                    // The voters are facts the shards reported, not part of the proposal.
                    next.members = current.members;
                    next.members_at = current.members_at;
                }
                *topology = Some(next);
                Response::default()
            }
            Command::Members {
                shard,
                replicas,
                at,
            } => {
                let mut topology = self.topology.lock();
                let Some(t) = topology.as_mut() else {
                    return refused("no topology yet");
                };
                // A late copy from a former leader must not undo a later change.
                if t.members_at.get(shard).is_some_and(|a| a >= at) {
                    return refused(format!("shard {shard}'s voters changed after entry {at}"));
                }
                t.members.insert(*shard, replicas.clone());
                t.members_at.insert(*shard, *at);
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
        let (mut writes, mut error) = (Vec::new(), None);
        let mut rest = &body[..];
        while let Some((len, tail)) = rest.split_first_chunk::<4>() {
            let len = u32::from_le_bytes(*len) as usize;
            let Some((entry, tail)) = tail.split_at_checked(len) else {
                error = Some("a truncated write in a shard entry".to_string());
                break;
            };
            rest = tail;
            let Some((header, payload)) = entry.split_first_chunk::<WRITE_HEADER>() else {
                continue;
            };
            if !self.is_copy(index, header) {
                writes.push(payload);
            }
        }
        let (rows, failed) = engine.apply_replicated(self.shard, index, &writes);
        if let Some(e) = failed {
            error.get_or_insert(e.to_string());
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
