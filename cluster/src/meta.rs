//! The metadata group's state machine ([`MetaStateMachine`]: the catalog, the manifest of
//! Parquet files, the topology and the preferred leaders) and catalog changes committed
//! through it ([`MetaLog`]). Snapshotted every `[cluster] meta_snapshot_entries` entries
//! ([`MetaSnapshot`]), so its log is purged; a node whose log starts after a snapshot
//! installs it (`Engine::install_meta_state`).

use crate::cluster::{Cluster, block_on, replication};
use crate::raft::node::Node;
use crate::raft::sm::GroupState;
use crate::raft::types::{Command, GroupId, Response};
use crate::topology::{SharedTopology, Topology};
use bytes::Bytes;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use sluice_engine::{CatalogData, CatalogLog, Engine, Error, FileChange};
use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

/// Catalog changes through the metadata group.
pub(crate) struct MetaLog {
    pub(crate) cluster: Weak<Cluster>,
    pub(crate) engine: Weak<Engine>,
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

/// The metadata group's state: the catalog, the manifest of Parquet files and the
/// preferred leaders operators chose.
pub(crate) struct MetaStateMachine {
    pub(crate) engine: Weak<Engine>,
    pub(crate) node: Weak<Node>,
    pub(crate) preferred: Arc<Mutex<BTreeMap<u32, u64>>>,
    pub(crate) topology: SharedTopology,
    /// The index of the last entry applied.
    pub(crate) applied: AtomicU64,
}

/// The metadata group's snapshot: everything its entries built, at entry `index`.
#[derive(Serialize, Deserialize)]
struct MetaSnapshot {
    index: u64,
    /// The engine's catalog and manifest (JSON).
    catalog: String,
    manifest: String,
    topology: Option<Topology>,
    preferred: BTreeMap<u32, u64>,
}

fn refused(e: impl std::fmt::Display) -> Response {
    Response {
        rows: 0,
        error: Some(e.to_string()),
    }
}

impl GroupState for MetaStateMachine {
    fn apply(&self, index: u64, command: &Command) -> Response {
        self.applied.store(index, Ordering::Release);
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
        let engine = self.engine.upgrade().ok_or_else(stopping)?;
        let (catalog, manifest) = engine.meta_state().map_err(io::Error::other)?;
        let snap = MetaSnapshot {
            index: self.applied.load(Ordering::Acquire),
            catalog,
            manifest,
            topology: self.topology.lock().clone(),
            preferred: self.preferred.lock().clone(),
        };
        Ok((None, Bytes::from(serde_json::to_vec(&snap)?)))
    }

    fn restore(&self, data: &[u8]) -> io::Result<()> {
        let snap: MetaSnapshot = serde_json::from_slice(data)?;
        let engine = self.engine.upgrade().ok_or_else(stopping)?;
        engine
            .install_meta_state(snap.index, &snap.catalog, &snap.manifest)
            .map_err(io::Error::other)?;
        if let (Some(t), Some(node)) = (&snap.topology, self.node.upgrade()) {
            node.add_peers(&t.nodes);
        }
        *self.topology.lock() = snap.topology;
        *self.preferred.lock() = snap.preferred;
        self.applied.store(snap.index, Ordering::Release);
        Ok(())
    }
}

fn stopping() -> io::Error {
    io::Error::other("the node is stopping")
}

impl MetaStateMachine {
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
