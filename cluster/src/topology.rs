//! The cluster's nodes and shard placement as the metadata group committed them: every
//! node holds the same [`Topology`] at the same metadata index, and brings its replicas in
//! line with it (`reconcile.rs`).

use crate::placement::ShardPlacement;
use parking_lot::Mutex;
use sluice_conf::ClusterConfig;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

/// The cluster's nodes and shard placement, as the metadata group applied them: every node
/// holds the same one at the same metadata index. Before any node was added or removed it is
/// the one the config gives ([`Topology::initial`]); a joining node has none until its
/// metadata group brings the first change.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub(crate) struct Topology {
    /// Topologies applied: a proposal names the next, so one made from a stale view is
    /// refused.
    pub(crate) version: u64,
    /// The cluster's nodes and their node-to-node addresses.
    pub(crate) nodes: BTreeMap<u64, String>,
    pub(crate) replication_factor: usize,
    /// Where each shard's replicas should be, the preferred leader first.
    pub(crate) placement: Vec<ShardPlacement>,
    /// Each shard's voters as its group last committed them ([`crate::raft::types::Command::Members`]).
    pub(crate) members: BTreeMap<u32, Vec<u64>>,
    /// The shard group's log index of the membership `members` reports.
    #[serde(default)]
    pub(crate) members_at: BTreeMap<u32, u64>,
    /// Nodes removed from the cluster: their ids are not used again.
    #[serde(default)]
    pub(crate) removed: BTreeSet<u64>,
}

impl Topology {
    /// The topology of a cluster formed from `cfg`'s peers.
    pub(crate) fn initial(cfg: &ClusterConfig) -> Self {
        let nodes = cfg.nodes();
        let ids: BTreeSet<u64> = nodes.keys().copied().collect();
        let placement = crate::placement::place(&ids, cfg.shard_count(), cfg.replication_factor);
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
    pub(crate) fn with_nodes(&self, nodes: BTreeMap<u64, String>) -> Self {
        let ids: BTreeSet<u64> = nodes.keys().copied().collect();
        let mut removed = self.removed.clone();
        removed.extend(self.nodes.keys().filter(|n| !ids.contains(n)));
        Self {
            version: self.version + 1,
            placement: crate::placement::rebalance(&self.placement, &ids, self.replication_factor),
            nodes,
            removed,
            ..self.clone()
        }
    }

    /// Whether `node` keeps a replica of `shard`: where the placement puts one, and while
    /// it is still one of the shard's voters (moving away). Other nodes read the shard's
    /// unflushed rows from its replicas (`crate::reads`).
    pub(crate) fn keeps(&self, shard: u32, node: u64) -> bool {
        self.holders(shard).contains(&node)
    }

    /// The nodes that are or should be `shard`'s voters (the committed ones first): where
    /// its leader is.
    pub(crate) fn holders(&self, shard: u32) -> Vec<u64> {
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
    pub(crate) fn settled(&self) -> bool {
        let set = |v: &[u64]| v.iter().copied().collect::<BTreeSet<u64>>();
        (self.placement.iter())
            .all(|p| self.members.get(&p.shard).map(|m| set(m)) == Some(set(&p.replicas)))
    }
}

/// The topology, shared by the metadata group's state machine and the node.
pub(crate) type SharedTopology = Arc<Mutex<Option<Topology>>>;
