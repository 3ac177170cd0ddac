//! The cluster's system tables as this node sees them: `system.nodes` and `system.shards`.

use crate::cluster::Cluster;
use crate::raft::types::Tc;
use arrow::array::{ArrayRef, BooleanArray, StringArray, UInt64Array};
use arrow::datatypes::{DataType, Field, Schema};
use arrow::record_batch::RecordBatch;
use openraft::RaftMetrics;
use openraft::async_runtime::WatchReceiver;
use std::collections::BTreeSet;
use std::sync::Arc;

impl Cluster {
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
