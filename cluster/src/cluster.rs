//! This node of the cluster ([`Cluster`]): its start (the metadata group on every node, the
//! data shards placed on it, the engine joined to them), the flushes of the shards it leads,
//! and what the other rooms share (the topology, leaderships, groups).

use crate::error::{Error, Result};
use crate::meta::{MetaLog, MetaStateMachine};
use crate::placement::ShardPlacement;
use crate::raft::net::serve;
use crate::raft::node::{GroupRaft, Node};
use crate::raft::types::{Command, GroupId, Response, Tc};
use crate::shard::ShardStateMachine;
use crate::topology::{SharedTopology, Topology};
use crate::writes::{Queued, ship};
use openraft::BasicNode;
use openraft::RaftMetrics;
use openraft::async_runtime::WatchReceiver;
use parking_lot::Mutex;
use sluice_conf::ClusterConfig;
use sluice_engine::{Engine, FileChange, IngestPort, SystemRows};
use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// How often a node looks for due rows of the shards it leads.
const FLUSH_CHECK: Duration = Duration::from_millis(500);

/// This node of the cluster.
pub struct Cluster {
    pub(crate) node: Arc<Node>,
    pub(crate) engine: Weak<Engine>,
    /// Data shards (fixed for the cluster's life).
    pub(crate) shards: u32,
    pub(crate) topology: SharedTopology,
    /// This process's start, in microseconds: with the node id it tells this run's writes
    /// from an earlier run's.
    pub(crate) incarnation: u64,
    pub(crate) seq: AtomicU64,
    /// Per shard: writes waiting to be shipped ([`ship`]).
    pub(crate) queues: Vec<mpsc::UnboundedSender<Queued>>,
    /// Shards whose preferred leader an operator set (`ClusterAdmin::move_leader`), as the
    /// metadata group applied it.
    pub(crate) preferred: Arc<Mutex<BTreeMap<u32, u64>>>,
    /// Delivery across nodes.
    pub(crate) relay: Arc<crate::relay::Relay>,
    /// Shards whose replica here has caught up (`crate::reads`).
    pub(crate) ready: Mutex<BTreeSet<u32>>,
    /// Shards whose replica was opened here after the start and has not caught up yet: the
    /// last-value caches missed their rows while another node held them.
    pub(crate) fresh: Mutex<BTreeSet<u32>>,
    /// Writes to a table this node does not know wait for the metadata group through it.
    pub(crate) catalog_barrier: crate::writes::Coalesced,
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster")
            .field("node", &self.node.id())
            .finish()
    }
}

/// The raft members `ids`, at the addresses `peers` gives.
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

/// A write or catalog change the cluster did not commit.
pub(crate) fn replication(reason: impl std::fmt::Display) -> sluice_engine::Error {
    sluice_engine::Error::Replication {
        reason: reason.to_string(),
    }
}

/// Runs `f` to completion from synchronous code on a runtime worker.
pub(crate) fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::task::block_in_place(|| tokio::runtime::Handle::current().block_on(f))
}

impl Cluster {
    /// Opens this node's groups under `<data_dir>/cluster`, starts answering peers on
    /// `cfg.listen`, joins `engine` to the cluster (its writes go to the shard groups, its
    /// catalog changes to the metadata group) and serves `system.nodes` and `system.shards`
    /// through it. Returns once the metadata group has applied what this node's log had
    /// committed (so the catalog is current before any shard applies rows). A joining node
    /// (`cfg.join`) first waits until a member adds it.
    pub async fn start(
        cfg: &ClusterConfig,
        data_dir: &std::path::Path,
        engine: &Arc<Engine>,
        cancel: CancellationToken,
    ) -> Result<Arc<Self>> {
        let peers = cfg.nodes();
        let ids: Vec<u64> = peers.keys().copied().collect();
        let dir = data_dir.join("cluster");
        let node = Node::new(cfg.node_id, &dir)
            .map_err(|e| Error::io(format!("cluster directory {}", dir.display()), e))?;
        node.set_peers(peers.clone());
        let listener = tokio::net::TcpListener::bind(cfg.listen)
            .await
            .map_err(|e| Error::io(format!("binding the cluster listener on {}", cfg.listen), e))?;
        tokio::spawn(serve(listener, node.clone(), cancel.clone()));

        let preferred = Arc::new(Mutex::new(BTreeMap::new()));
        let topology: SharedTopology =
            Arc::new(Mutex::new((!cfg.join).then(|| Topology::initial(cfg))));
        let meta_state = MetaStateMachine {
            engine: Arc::downgrade(engine),
            node: Arc::downgrade(&node),
            preferred: preferred.clone(),
            topology: topology.clone(),
            applied: Default::default(),
        };
        let meta = node
            .open_group(
                GroupId::Meta,
                Arc::new(meta_state),
                Some(cfg.meta_snapshot_entries),
            )
            .await
            .map_err(|e| Error::io("opening the metadata group", e))?;
        if !cfg.join && cfg.node_id == ids[0] {
            initialize(GroupId::Meta, &meta, members(&ids, &peers)).await?;
        }
        let mut waited = Instant::now();
        while cfg.join
            && !(topology.lock().as_ref()).is_some_and(|t| t.nodes.contains_key(&cfg.node_id))
        {
            if (topology.lock().as_ref()).is_some_and(|t| t.removed.contains(&cfg.node_id)) {
                return Err(Error::Removed { node: cfg.node_id });
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
                _ = cancel.cancelled() => return Err(Error::Stopped),
                _ = tokio::time::sleep(Duration::from_millis(50)) => {}
            }
        }
        wait_applied(&meta, "metadata").await;
        if !(topology.lock().as_ref()).is_some_and(|t| t.nodes.contains_key(&cfg.node_id)) {
            return Err(Error::Removed { node: cfg.node_id });
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
        let incarnation = sluice_engine::now_micros() as u64;
        let relay =
            crate::relay::Relay::start(node.clone(), topology.clone(), incarnation, cancel.clone());
        let cluster = Arc::new(Self {
            node: node.clone(),
            engine: Arc::downgrade(engine),
            shards,
            topology,
            incarnation,
            seq: AtomicU64::new(0),
            queues,
            preferred,
            relay,
            ready: Mutex::new(BTreeSet::new()),
            fresh: Mutex::new(BTreeSet::new()),
            catalog_barrier: Default::default(),
        });
        let server = Arc::downgrade(&cluster);
        let _ = cluster.relay.rows_server.set(Arc::new(move |body| {
            let c = server.upgrade();
            Box::pin(async move {
                match c {
                    Some(c) => c.serve_rows(body).await,
                    None => Err("the node is stopping".into()),
                }
            })
        }));
        let flusher = Arc::downgrade(&cluster);
        let _ = cluster.relay.flusher.set(Arc::new(move |table| {
            let c = flusher.upgrade();
            Box::pin(async move {
                match c {
                    Some(c) => c.flush_led_table(table).await,
                    None => Err("the node is stopping".into()),
                }
            })
        }));
        engine.join_cluster(
            cluster.clone(),
            Arc::new(MetaLog {
                cluster: Arc::downgrade(&cluster),
                engine: Arc::downgrade(engine),
            }),
            cluster.clone(),
        );
        let t = cluster.topology();
        for p in &t.placement {
            if !t.keeps(p.shard, cfg.node_id) {
                continue;
            }
            let raft = cluster
                .open_shard(p.shard)
                .await
                .map_err(|e| Error::io(format!("opening shard {}", p.shard), e))?;
            // Groups of the cluster's first placement are formed by their preferred leader;
            // later ones exist already and take new replicas as learners.
            if t.version == 0 && p.replicas[0] == cfg.node_id {
                initialize(GroupId::Shard(p.shard), &raft, members(&p.replicas, &peers)).await?;
            }
        }
        let (nodes, shards) = (cluster.clone(), cluster.clone());
        engine.add_system_table("nodes", SystemRows(Arc::new(move || nodes.nodes_table())));
        engine.add_system_table(
            "shards",
            SystemRows(Arc::new(move || shards.shards_table())),
        );
        tokio::spawn(cluster.clone().reconcile(cancel.clone()));
        tokio::spawn(cluster.clone().flush_led_shards(cancel));
        Ok(cluster)
    }

    /// The topology (set before [`Cluster::start`] returns).
    pub(crate) fn topology(&self) -> Topology {
        (self.topology.lock().clone()).expect("the topology is known once the node started")
    }

    /// Opens this node's replica of `shard`.
    pub(crate) async fn open_shard(&self, shard: u32) -> io::Result<GroupRaft> {
        let apply = Arc::new(ShardStateMachine::new(shard, self.engine.clone()));
        self.node
            .open_group(GroupId::Shard(shard), apply, None)
            .await
    }

    /// Writes the due rows of the shards this node leads as Parquet on the shared store and
    /// commits the files through the metadata group; every node then installs them, drops
    /// those rows from its buffers and snapshots the shards ([`MetaStateMachine`]). On the metadata
    /// group's leader, also merges small files now and then (`[compaction]`), drops the
    /// partitions tables' TTLs expired and deletes files no live table names once past
    /// their grace (`[retention]`).
    async fn flush_led_shards(self: Arc<Self>, cancel: CancellationToken) {
        let mut last_compact = tokio::time::Instant::now();
        let mut last_retain = tokio::time::Instant::now();
        let mut last_orphans = tokio::time::Instant::now();
        let collecting = Arc::new(std::sync::atomic::AtomicBool::new(false));
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
                    Ok(f) => {
                        self.commit_files(&engine, FileChange::Flushed(f)).await;
                    }
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
                    Ok(m) => {
                        self.commit_files(&engine, FileChange::Merged(m)).await;
                    }
                    Err(e) => tracing::warn!(error = %e, "compaction failed"),
                }
            }
            // Retention: the metadata group's leader commits the expired partitions, every
            // node drops them, and the leader deletes their files.
            if last_retain.elapsed() >= engine.retention_every() && leads(GroupId::Meta) {
                last_retain = tokio::time::Instant::now();
                let expired = engine.expired_shared();
                self.commit_files(&engine, FileChange::Expired(expired))
                    .await;
            }
            // Files no live table names (dropped tables', failed commits'), past their grace:
            // on a task of its own (listing a large store takes a while), and only once a
            // read barrier proved this node leads a quorum and has applied every file change
            // committed before it.
            if !leads(GroupId::Meta) {
                engine.forget_orphans();
            } else if last_orphans.elapsed() >= engine.orphan_grace().1
                && !collecting.swap(true, std::sync::atomic::Ordering::AcqRel)
            {
                last_orphans = tokio::time::Instant::now();
                let (node, collecting) = (self.node.clone(), collecting.clone());
                tokio::spawn(async move {
                    let r = match node.read_barrier(GroupId::Meta).await {
                        Ok(()) => engine.collect_shared_orphans().await.map(|_| ()),
                        Err(e) => Err(sluice_engine::Error::Replication {
                            reason: e.to_string(),
                        }),
                    };
                    if let Err(e) = r {
                        tracing::warn!(error = %e, "could not collect orphaned files");
                    }
                    collecting.store(false, std::sync::atomic::Ordering::Release);
                });
            }
        }
    }

    /// `FLUSH TABLE` here: table `table`'s buffered rows of the shards this node leads,
    /// written as files and committed; the files installed.
    pub(crate) async fn flush_led_table(&self, table: u64) -> std::result::Result<u64, String> {
        let engine = self.engine.upgrade().ok_or("the node is stopping")?;
        let led: Vec<u32> = (0..self.shards)
            .filter(|s| (self.node.group(GroupId::Shard(*s))).is_some_and(|r| self.leads(&r)))
            .collect();
        let files = (engine.flush_table_shards(table, &led).await).map_err(|e| e.to_string())?;
        let n = files.len() as u64;
        match self.commit_files(&engine, FileChange::Flushed(files)).await {
            true => Ok(n),
            false => Err("the files written were not committed; run FLUSH TABLE again".into()),
        }
    }

    /// Commits a file change through the metadata group (returns whether it was: nothing
    /// to commit counts). Refused (alike on every node), its new files are removed;
    /// committed, the files a merge replaced are retired.
    async fn commit_files(&self, engine: &Engine, change: FileChange) -> bool {
        if change.is_empty() {
            return true;
        }
        let text = match serde_json::to_string(&change) {
            Ok(t) => t,
            Err(e) => {
                tracing::error!(error = %e, "a file change does not serialize");
                engine.discard_files(&change).await;
                return false;
            }
        };
        let all = self.node_ids();
        match (self.node)
            .write(GroupId::Meta, Command::Files(text), &all)
            .await
        {
            Ok(Response { error: None, .. }) => {
                engine.retire_replaced(&change);
                true
            }
            Ok(Response { error: Some(e), .. }) => {
                // Refused alike on every node: no manifest names them.
                tracing::info!(reason = %e, "new files not installed; removing them");
                engine.discard_files(&change).await;
                false
            }
            // The outcome is unknown (the entry may yet commit): the files stay.
            Err(e) => {
                tracing::warn!(error = %e, "committing a file change failed");
                false
            }
        }
    }

    /// The cluster's nodes.
    pub(crate) fn node_ids(&self) -> Vec<u64> {
        (self.topology.lock().as_ref())
            .map(|t| t.nodes.keys().copied().collect())
            .unwrap_or_default()
    }

    /// Every group this node has, with the replicas it should have.
    pub(crate) fn groups(&self) -> Vec<(GroupId, Vec<u64>, GroupRaft)> {
        let t = self.topology();
        std::iter::once((GroupId::Meta, t.nodes.keys().copied().collect()))
            .chain((t.placement.iter()).map(|p| (GroupId::Shard(p.shard), p.replicas.clone())))
            .filter_map(|(g, r)| Some((g, r, self.node.group(g)?)))
            .collect()
    }

    /// The replica that should lead `shard`: the one an operator chose if it still holds
    /// one, else the placement's first.
    pub(crate) fn preferred_leader(&self, p: &ShardPlacement) -> u64 {
        (self.preferred.lock().get(&p.shard).copied())
            .filter(|n| p.replicas.contains(n))
            .unwrap_or(p.replicas[0])
    }

    /// Whether this node leads the group of `raft`.
    pub(crate) fn leads(&self, raft: &GroupRaft) -> bool {
        raft.metrics().borrow_watched().current_leader == Some(self.node.id())
    }

    /// Hands a shard's leadership (held here) to `to` once it has every entry.
    pub(crate) async fn hand_over(&self, shard: u32, raft: &GroupRaft, to: u64) {
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

    /// The metadata group's voters, as this node knows them.
    pub(crate) fn meta_voters(&self) -> BTreeSet<u64> {
        (self.node.group(GroupId::Meta)).map_or_else(BTreeSet::new, |m| voters(&m))
    }

    /// Stops this node's groups.
    pub async fn shutdown(&self) {
        self.node.shutdown().await;
    }
}

/// On a group's leader: the last log index `node` is known to have (from the replication
/// metrics).
pub(crate) fn matched(m: &RaftMetrics<Tc>, node: u64) -> Option<u64> {
    (m.replication.as_ref())
        .and_then(|r| r.get(&node).cloned().flatten())
        .map(|l| l.index)
}

/// A group's voters, as this node knows them.
pub(crate) fn voters(raft: &GroupRaft) -> BTreeSet<u64> {
    (raft.metrics().borrow_watched())
        .membership_config
        .membership()
        .voter_ids()
        .collect()
}

/// Forms `group` with `members`, unless it is formed already.
async fn initialize(
    group: GroupId,
    raft: &GroupRaft,
    members: BTreeMap<u64, BasicNode>,
) -> Result<()> {
    let failed = |e: &dyn std::fmt::Display| Error::Initialize {
        group,
        reason: e.to_string(),
    };
    if raft.is_initialized().await.map_err(|e| failed(&e))? {
        return Ok(());
    }
    match raft.initialize(members).await {
        Ok(()) => Ok(()),
        // Another start got there first: the group is formed.
        Err(e) if e.api_error().is_some() => Ok(()),
        Err(e) => Err(failed(&e)),
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
