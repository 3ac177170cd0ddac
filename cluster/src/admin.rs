//! The cluster as its operators manage it ([`ClusterAdmin`], served over HTTP by the web
//! crate): nodes added and removed through a new topology, shard leaderships moved.

use crate::cluster::Cluster;
use crate::raft::types::{Command, GroupId};
use arrow::record_batch::RecordBatch;
use async_trait::async_trait;
use openraft::async_runtime::WatchReceiver;
use sluice_engine::{ClusterAdmin, LeaderMoveError, NodeChangeError};
use std::time::Duration;

#[async_trait]
impl ClusterAdmin for Cluster {
    fn node_id(&self) -> u64 {
        self.node.id()
    }

    fn node_ids(&self) -> Vec<u64> {
        Cluster::node_ids(self)
    }

    fn nodes_table(&self) -> RecordBatch {
        Cluster::nodes_table(self)
    }

    fn shards_table(&self) -> RecordBatch {
        Cluster::shards_table(self)
    }

    /// The preferred leader is committed through the metadata group, so every node agrees
    /// and it outlives restarts.
    async fn move_leader(
        &self,
        shard: u32,
        node: u64,
        wait: Duration,
    ) -> Result<Option<u64>, LeaderMoveError> {
        let t = self.topology();
        let p =
            (t.placement.iter().find(|p| p.shard == shard)).ok_or(LeaderMoveError::NoShard {
                shard,
                shards: t.placement.len(),
            })?;
        // A replica placed there that is not a voter yet (a move under way) cannot lead.
        let voters = t.members.get(&shard).cloned().unwrap_or_default();
        if !p.replicas.contains(&node) || !voters.contains(&node) {
            return Err(LeaderMoveError::NotReplica {
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
            .map_err(|e| LeaderMoveError::NotCommitted(e.to_string()))?;
        if let Some(e) = committed.error {
            return Err(LeaderMoveError::NotCommitted(e));
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

    /// Commits the new topology through the metadata group, then waits (`system.shards`
    /// shows the move going on after that).
    async fn change_node(
        &self,
        id: u64,
        address: Option<String>,
        wait: Duration,
    ) -> Result<(serde_json::Value, bool), NodeChangeError> {
        let mut tries = 0;
        loop {
            // Decided on the topology as committed now, not on this node's view of it (a
            // node that was frozen or cut off may not have applied the last change yet:
            // it would take a removed node for a member).
            (self.node.read_barrier(GroupId::Meta).await)
                .map_err(|e| NodeChangeError::NotCommitted(e.to_string()))?;
            let t = self.topology();
            let mut nodes = t.nodes.clone();
            match (&address, nodes.get(&id)) {
                (Some(a), Some(known)) if a != known => {
                    return Err(NodeChangeError::Conflict(format!(
                        "node {id} is already a member, at {known}"
                    )));
                }
                (Some(_), Some(_)) | (None, None) => break,
                (Some(a), None) => {
                    if let Some((other, _)) = t.nodes.iter().find(|(_, addr)| *addr == a) {
                        return Err(NodeChangeError::Conflict(format!(
                            "node {other} is at {a} already"
                        )));
                    }
                    if t.removed.contains(&id) {
                        return Err(NodeChangeError::Conflict(format!(
                            "node {id} was a member and was removed; a node id is not used again"
                        )));
                    }
                    nodes.insert(id, a.clone());
                }
                (None, Some(_)) if nodes.len() == 1 => {
                    return Err(NodeChangeError::Invalid(
                        "the last node of a cluster cannot be removed".into(),
                    ));
                }
                (None, Some(_)) => {
                    nodes.remove(&id);
                }
            }
            let next = t.with_nodes(nodes);
            let text = serde_json::to_string(&next)
                .map_err(|e| NodeChangeError::NotCommitted(e.to_string()))?;
            let r = (self.node)
                .write(GroupId::Meta, Command::Topology(text), &self.node_ids())
                .await
                .map_err(|e| NodeChangeError::NotCommitted(e.to_string()))?;
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
                Some(e) => return Err(NodeChangeError::NotCommitted(e)),
            }
        }
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let t = self.topology();
            let voters = self.meta_voters();
            let done = t.settled() && voters.iter().eq(t.nodes.keys());
            if done || tokio::time::Instant::now() >= deadline {
                let topology = serde_json::to_value(&t)
                    .map_err(|e| NodeChangeError::NotCommitted(e.to_string()))?;
                return Ok((topology, done));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}
