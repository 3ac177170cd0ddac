//! `[cluster]`: this node's id, its peers and how shards are replicated among them.

use crate::{Error, Result, is_host_port};
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;

/// This node's place in a cluster: every node runs `sluice serve` with its own `[cluster]`
/// (same `peers`, `shards` and `replication_factor`, its own `node_id` and `listen`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterConfig {
    /// This node's id (positive, unique in the cluster).
    pub node_id: u64,
    /// Node-to-node address (raft and forwarded writes), e.g. `10.0.0.1:7000`.
    pub listen: SocketAddr,
    /// Every node of the cluster, this one included: node id (a TOML key, so written as a
    /// string: `"2" = "10.0.0.2:7000"`) to its node-to-node address.
    pub peers: std::collections::BTreeMap<String, String>,
    /// Object store every node shares for Parquet files: `file:///abs/path` on one machine,
    /// `s3://bucket/prefix` (with the `[storage]` `s3_*` keys) for real.
    pub shared_store: String,
    /// Replicas of each shard (capped by the node count).
    #[serde(default = "three")]
    pub replication_factor: usize,
    /// Data shards; 0: twice the node count.
    #[serde(default)]
    pub shards: u32,
    /// This node joins a running cluster (`POST /v1/cluster/nodes` on a member adds it):
    /// it forms no group itself and takes the cluster's shards and replication factor from
    /// the metadata group. `peers` must name at least one member.
    #[serde(default)]
    pub join: bool,
    /// The metadata group (catalog, manifest, topology) is snapshotted every this many
    /// entries, and its log behind the snapshot purged (but for the last 256 entries, or
    /// this many if fewer).
    #[serde(default = "thousand")]
    pub meta_snapshot_entries: u64,
    /// Keep a standby copy of this node's lasting MQTT sessions on another node (its
    /// journal shipped there before each write returns), so that a client whose node died
    /// resumes elsewhere with what was queued for it. On by default; off saves the copy's
    /// cost (fan-out through the cluster about 0.75x, docs/benchmarks.md, stop 47), and a
    /// session whose node never comes back then resumes with its subscriptions only.
    #[serde(default = "yes")]
    pub standby_copy: bool,
}

fn yes() -> bool {
    true
}

fn three() -> usize {
    3
}

fn thousand() -> u64 {
    1000
}

impl ClusterConfig {
    /// Every node (this one included), by id, with its node-to-node address; valid after
    /// [`Config::validate`](crate::Config::validate).
    pub fn nodes(&self) -> std::collections::BTreeMap<u64, String> {
        let mut out: std::collections::BTreeMap<u64, String> = (self.peers.iter())
            .filter_map(|(id, addr)| Some((id.parse().ok()?, addr.clone())))
            .collect();
        out.entry(self.node_id)
            .or_insert_with(|| self.listen.to_string());
        out
    }

    /// The number of data shards.
    pub fn shard_count(&self) -> u32 {
        match self.shards {
            0 => 2 * self.nodes().len() as u32,
            n => n,
        }
    }

    pub(crate) fn validate(&self) -> Result<()> {
        let bad = |key: &str, reason: String| Error::Invalid {
            key: format!("cluster.{key}"),
            reason,
        };
        if self.node_id == 0 {
            return Err(bad("node_id", "must be greater than 0".into()));
        }
        for (id, addr) in &self.peers {
            match id.parse::<u64>() {
                Ok(n) if n > 0 => {}
                _ => {
                    return Err(bad(
                        "peers",
                        format!("{id:?}: a node id is a positive integer"),
                    ));
                }
            }
            if !is_host_port(addr) {
                return Err(bad(
                    &format!("peers.{id}"),
                    format!("{addr:?}: expected host:port"),
                ));
            }
        }
        if let Some(own) = self.peers.get(&self.node_id.to_string())
            && own.parse::<SocketAddr>().ok() != Some(self.listen)
        {
            return Err(bad(
                "peers",
                format!(
                    "node {} is listed at {own} but listens on {}",
                    self.node_id, self.listen
                ),
            ));
        }
        if self.join && !self.nodes().keys().any(|id| *id != self.node_id) {
            return Err(bad(
                "peers",
                "a joining node must name at least one member of the cluster".into(),
            ));
        }
        if self.replication_factor == 0 {
            return Err(bad("replication_factor", "must be greater than 0".into()));
        }
        let url = self.shared_store.as_str();
        if !(url.starts_with("file:///") || url.starts_with("s3://")) {
            return Err(bad(
                "shared_store",
                format!("{url:?}: expected file:///absolute/path or s3://bucket/prefix"),
            ));
        }
        Ok(())
    }
}
