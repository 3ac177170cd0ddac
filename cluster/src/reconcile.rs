//! Bringing this node's part of the cluster in line with the committed topology, every
//! second: replicas opened and closed, learners added and promoted, voters committed to the
//! metadata group, leaderships handed to their preferred replicas.

use crate::cluster::{Cluster, matched, voters};
use crate::placement::ShardPlacement;
use crate::raft::node::GroupRaft;
use crate::raft::types::{Command, GroupId};
use crate::topology::Topology;
use openraft::BasicNode;
use openraft::async_runtime::WatchReceiver;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// A learner this close to its leader's last entry is made a voter.
const CAUGHT_UP: u64 = 64;

impl Cluster {
    /// Brings this node's part of the cluster in line with the topology, every second:
    /// opens the shards placed here and closes those that left; on a shard's leader, adds
    /// the new replicas as learners, makes them voters once they have caught up (dropping
    /// the replicas that are no longer placed) and commits the result to the metadata group;
    /// on that group's leader, the same for the nodes. Hands leaderships to their preferred
    /// replicas (after a failover, or at start when another replica won the first election).
    /// Each step is decided from the state at that moment, so a step interrupted by a crash
    /// or a leader change is taken again by whoever leads next.
    pub(crate) async fn reconcile(self: Arc<Self>, cancel: CancellationToken) {
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
                        match self.open_shard(p.shard).await {
                            Ok(_) => {
                                self.fresh.lock().insert(p.shard);
                            }
                            Err(e) => {
                                tracing::warn!(shard = p.shard, error = %e, "opening a shard")
                            }
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
        // No replicas beyond the placement: other nodes read the shard's rows from here.
        let learners = BTreeSet::new();
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
        self.released(shard);
        if let Err(e) = self.node.close_group(GroupId::Shard(shard)).await {
            tracing::warn!(shard, error = %e, "removing a closed shard's log");
        }
        if let Some(engine) = self.engine.upgrade() {
            engine.forget_shard(shard);
        }
    }
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
