//! A node's raft groups: opened from their directories, each with its log on the node's one
//! writer and its network on the node's one pool, and answering the requests peers send.

use crate::log::{LogStore, LogWriter};
use crate::net::{self, GroupNetwork, Handler, Pool, SnapshotRequest, ToGroup};
use crate::sm::{Apply, StateMachine};
use crate::types::{Command, GroupId, Response, Tc, from_cbor, to_cbor};
use bytes::Bytes;
use openraft::type_config::alias::SnapshotOf;
use openraft::{Config, Raft, SnapshotPolicy};
use parking_lot::RwLock;
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The state machine every group uses: what it applies to is chosen per group.
pub type GroupMachine = StateMachine<DynApply>;

/// Any [`Apply`] (a shard's tables, the catalog).
#[derive(Clone)]
pub struct DynApply(pub Arc<dyn Apply>);

impl std::fmt::Debug for DynApply {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DynApply")
    }
}
/// One group's raft.
pub type GroupRaft = Raft<Tc, GroupMachine>;

impl Apply for DynApply {
    fn apply(&self, index: u64, command: &Command) -> Response {
        self.0.apply(index, command)
    }
    fn snapshot(&self) -> io::Result<Bytes> {
        self.0.snapshot()
    }
    fn restore(&self, data: &[u8]) -> io::Result<()> {
        self.0.restore(data)
    }
}

/// Raft timing: a leader that stops is replaced in about 1.2–1.5 s (at most about 2.5 s,
/// when the first election fails), well inside the 3 s failover goal; Pre-Vote keeps a node
/// that comes back from a partition from deposing a healthy leader.
pub fn raft_config(name: &str) -> io::Result<Config> {
    Config {
        cluster_name: name.to_string(),
        heartbeat_interval: 200,
        election_timeout_min: 800,
        election_timeout_max: 1200,
        enable_pre_vote: Some(true),
        // Data shards are snapshotted when their rows are in Parquet, not every N entries.
        snapshot_policy: SnapshotPolicy::Never,
        ..Config::default()
    }
    .validate()
    .map_err(io::Error::other)
}

/// This node's groups.
pub struct Node {
    id: u64,
    dir: PathBuf,
    pool: Arc<Pool>,
    writer: Arc<LogWriter>,
    groups: RwLock<HashMap<GroupId, GroupRaft>>,
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node").field("id", &self.id).finish()
    }
}

impl Node {
    /// A node with no groups yet, keeping them under `dir`.
    pub fn new(id: u64, dir: &Path) -> io::Result<Arc<Self>> {
        Ok(Arc::new(Self {
            id,
            dir: dir.to_path_buf(),
            pool: Pool::new(),
            writer: LogWriter::start()?,
            groups: RwLock::new(HashMap::new()),
        }))
    }

    /// This node's id.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Opens `group` (its log and snapshot from disk, if any), applying to `apply`, and
    /// starts its raft.
    pub async fn open_group(&self, group: GroupId, apply: Arc<dyn Apply>) -> io::Result<GroupRaft> {
        let dir = self.dir.join(group.to_string());
        let log = LogStore::open(&dir.join("log"), self.writer.clone())?;
        let sm = StateMachine::open(&dir.join("sm"), DynApply(apply))?;
        let config = Arc::new(raft_config(&group.to_string())?);
        let network = GroupNetwork::new(self.pool.clone(), group);
        let raft = Raft::new(self.id, config, network, log, sm)
            .await
            .map_err(io::Error::other)?;
        self.groups.write().insert(group, raft.clone());
        Ok(raft)
    }

    /// The raft of `group`, if this node has it.
    pub fn group(&self, group: GroupId) -> Option<GroupRaft> {
        self.groups.read().get(&group).cloned()
    }

    /// Stops every group (their logs stay on disk).
    pub async fn shutdown(&self) {
        let groups: Vec<_> = self.groups.write().drain().collect();
        for (g, raft) in groups {
            if let Err(e) = raft.shutdown().await {
                tracing::warn!(group = %g, error = %e, "stopping a raft group");
            }
        }
    }
}

/// Decodes a request to a group, runs it on the group's raft, encodes the answer.
async fn on_group<Req, Resp, E, F, Fut>(node: &Node, body: &[u8], f: F) -> Result<Vec<u8>, String>
where
    Req: DeserializeOwned,
    Resp: Serialize,
    E: std::fmt::Display,
    F: FnOnce(GroupRaft, Req) -> Fut,
    Fut: std::future::Future<Output = Result<Resp, E>>,
{
    let req: ToGroup<Req> = (from_cbor(body)).map_err(|e| {
        format!(
            "node {}: a {} request that does not decode: {e}",
            node.id,
            std::any::type_name::<Req>()
        )
    })?;
    let raft = node
        .group(req.group)
        .ok_or_else(|| format!("node {} has no group {}", node.id, req.group))?;
    let resp = f(raft, req.message).await.map_err(|e| e.to_string())?;
    to_cbor(&resp).map_err(|e| e.to_string())
}

impl Handler for Node {
    async fn handle(&self, kind: u8, body: Bytes) -> Result<Vec<u8>, String> {
        match kind {
            net::APPEND => {
                on_group(self, &body, |r, q| async move { r.append_entries(q).await }).await
            }
            net::VOTE => on_group(self, &body, |r, q| async move { r.vote(q).await }).await,
            net::PRE_VOTE => on_group(self, &body, |r, q| async move { r.pre_vote(q).await }).await,
            net::TRANSFER_LEADER => {
                on_group(self, &body, |r, q| async move {
                    r.handle_transfer_leader(q).await
                })
                .await
            }
            net::SNAPSHOT => {
                on_group(self, &body, |r, q: SnapshotRequest| async move {
                    let snapshot = SnapshotOf::<Tc, Bytes> {
                        meta: q.meta,
                        snapshot: q.data,
                    };
                    r.install_full_snapshot(q.vote, snapshot).await
                })
                .await
            }
            k => Err(format!("unknown request kind {k}")),
        }
    }
}
