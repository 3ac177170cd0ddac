//! Queries on a node that holds replicas of only some shards (placement is the truth: a
//! node keeps the shards placed on it, nothing else). The engine asks [`Cluster`], as its
//! [`ShardReader`], which shards it does not hold and reads their buffered rows from one of
//! their replicas ([`SHARD_ROWS`]), or asks that replica for the partial aggregate or the
//! synopses of those rows (and of a share of the files, which are on the shared store).
//!
//! A shard counts as held once this node is one of its replicas and a read barrier on it
//! succeeded (the replica caught up); it stops counting before the replica is closed.

use crate::cluster::{Cluster, replication};
use crate::raft::net::{Frame, SHARD_ROWS};
use crate::raft::types::GroupId;
use arrow::array::{AsArray, RecordBatch};
use async_trait::async_trait;
use bytes::Bytes;
use openraft::async_runtime::WatchReceiver;
use sluice_engine::types::{ColumnType, Value};
use sluice_engine::{PartialAnswer, RowsAnswer, RowsRequest, ShardReader, SummaryAnswer, TableDef};
use std::collections::BTreeSet;
use std::time::Duration;

/// How long this node waits for its metadata group to install the file changes a replica's
/// rows were cut by.
const MANIFEST_WAIT: Duration = Duration::from_secs(10);
/// How long a replica that answers probes has to answer before the next one is asked (the
/// last one asked gets the whole write deadline: its read barrier may wait out an
/// election).
const TRY_NEXT_AFTER: Duration = Duration::from_secs(4);

impl Cluster {
    /// Whether this node is one of `shard`'s replicas (a voter, or a learner catching up).
    pub(crate) fn replica_here(&self, shard: u32) -> bool {
        let me = self.node.id();
        (self.node.group(GroupId::Shard(shard))).is_some_and(|r| {
            let m = r.metrics().borrow_watched().membership_config.clone();
            m.membership().nodes().any(|(id, _)| *id == me)
        })
    }

    /// A read barrier on these shards succeeded: their rows here are the shards' rows. A
    /// replica opened since the start that caught up makes the engine's last-value caches
    /// start over (they missed its rows while another node held them); one that was only
    /// behind for a moment (an election) does not.
    pub(crate) fn caught_up(&self, shards: &[u32]) {
        self.ready.lock().extend(shards);
        let mut fresh = self.fresh.lock();
        let gained = shards.iter().fold(false, |g, s| fresh.remove(s) | g);
        drop(fresh);
        if gained && let Some(engine) = self.engine.upgrade() {
            engine.shards_changed();
        }
    }

    /// This node's replica of `shard` is about to close: its rows stop counting.
    pub(crate) fn released(&self, shard: u32) {
        self.ready.lock().remove(&shard);
    }

    /// Answers a [`SHARD_ROWS`] request from another node: once this replica of the shard
    /// has applied everything its group had committed, the rows asked for.
    pub(crate) async fn serve_rows(&self, body: Bytes) -> Result<Vec<u8>, String> {
        let request: RowsRequest = crate::from_cbor(&body).map_err(|e| e.to_string())?;
        let group = GroupId::Shard(request.shard);
        (self.node.read_barrier(group).await).map_err(|e| e.to_string())?;
        let engine = self.engine.upgrade().ok_or("the node is stopping")?;
        (engine.serve_shard(request).await).map_err(|e| e.to_string())
    }

    /// The other nodes holding `shard`, in the order to ask them: the leader it prefers
    /// first (it leads unless it failed), then the others; a node that lately failed a
    /// probe last.
    fn holders_to_ask(&self, shard: u32) -> Vec<u64> {
        let t = self.topology();
        let me = self.node.id();
        let preferred = t
            .placement
            .get(shard as usize)
            .map(|p| self.preferred_leader(p));
        let mut holders: Vec<u64> = t.holders(shard).into_iter().filter(|n| *n != me).collect();
        holders.sort_by_key(|n| (self.node.silent_lately(*n), Some(*n) != preferred));
        holders
    }

    /// `request` answered by a replica of its shard (the leader first, then the others),
    /// once this node's metadata group has installed the answer's manifest index (which
    /// `decode` reads with the answer). With `refusal_ends`, a replica that answers with an
    /// error (it cannot aggregate or summarize the query: the others would not either) ends
    /// the asking: the caller reads the rows instead, from any replica.
    async fn ask<T>(
        &self,
        request: &RowsRequest,
        what: &str,
        refusal_ends: bool,
        decode: impl Fn(&[u8]) -> sluice_engine::Result<(u64, T)>,
    ) -> sluice_engine::Result<T> {
        let shard = request.shard;
        let holders = self.holders_to_ask(shard);
        // The replica lists the part it runs as asked by this node (`system.queries`).
        let request = &RowsRequest {
            asked_by: Some(self.node.id()),
            ..request.clone()
        };
        let mut failures = Vec::new();
        let last = holders.len().saturating_sub(1);
        for (i, node) in holders.into_iter().enumerate() {
            let frame = Frame::cbor(SHARD_ROWS, request, 64).map_err(replication)?;
            let timeout = match i == last {
                true => crate::WRITE_DEADLINE + Duration::from_secs(5),
                false => TRY_NEXT_AFTER,
            };
            // A frozen or cut-off replica is passed over once it fails a probe (about 0.9 s),
            // not after the whole `timeout`.
            let probe_at = tokio::time::Instant::now() + crate::raft::node::PROBE_AFTER;
            match (self
                .node
                .call_while_answering(node, frame, timeout, probe_at))
            .await
            {
                Ok(bytes) => {
                    let (index, answer) = decode(&bytes)?;
                    self.installed(index).await?;
                    return Ok(answer);
                }
                Err(e) => {
                    let refused = matches!(e, crate::raft::net::CallError::Remote(..));
                    failures.push(format!("node {node}: {e}"));
                    if refused && refusal_ends {
                        break;
                    }
                }
            }
        }
        if failures.is_empty() {
            failures.push("it has no replica on another node".into());
        }
        Err(replication(format!(
            "shard {shard}'s {what} could not be read: {}",
            failures.join("; ")
        )))
    }

    /// Waits until the metadata group has installed its entry `index` here.
    async fn installed(&self, index: u64) -> sluice_engine::Result<()> {
        let engine = (self.engine.upgrade()).ok_or_else(|| replication("stopping"))?;
        let mut installed = engine.manifest_watch();
        drop(engine);
        let reached = installed.wait_for(|i| *i >= index);
        match tokio::time::timeout(MANIFEST_WAIT, reached).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(_)) => Err(replication("stopping")),
            Err(_) => Err(replication(format!(
                "the metadata group's entry {index} was not installed here after {} s",
                MANIFEST_WAIT.as_secs()
            ))),
        }
    }
}

#[async_trait]
impl ShardReader for Cluster {
    fn remote_shards(&self) -> BTreeSet<u32> {
        let ready = self.ready.lock().clone();
        (0..self.shards)
            .filter(|s| !(ready.contains(s) && self.replica_here(*s)))
            .collect()
    }

    fn me(&self) -> u64 {
        self.node.id()
    }

    fn asked_first(&self, shard: u32) -> Option<u64> {
        self.holders_to_ask(shard).first().copied()
    }

    async fn read(&self, request: RowsRequest) -> sluice_engine::Result<RowsAnswer> {
        let decode = |b: &[u8]| RowsAnswer::decode(b).map(|a| (a.manifest_index, a));
        self.ask(&request, "unflushed rows", false, decode).await
    }

    async fn partial(&self, request: RowsRequest) -> sluice_engine::Result<PartialAnswer> {
        let decode = |b: &[u8]| PartialAnswer::decode(b).map(|a| (a.manifest_index, a));
        self.ask(&request, "partial aggregate", true, decode).await
    }

    async fn summary(&self, request: RowsRequest) -> sluice_engine::Result<SummaryAnswer> {
        let decode = |b: &[u8]| SummaryAnswer::decode(b).map(|a| (a.manifest_index, a));
        self.ask(&request, "synopses", true, decode).await
    }

    async fn versions(&self) -> Option<Vec<(u32, u64)>> {
        let reads = self.remote_shards().into_iter().map(|shard| {
            let holders = self.holders_to_ask(shard);
            async move {
                let index = self.node.read_index_of(GroupId::Shard(shard), &holders);
                index.await.map(|i| (shard, i))
            }
        });
        futures::future::join_all(reads).await.into_iter().collect()
    }

    fn shards_of(&self, def: &TableDef, keys: &[usize], batch: &RecordBatch) -> Option<Vec<u32>> {
        let column = crate::writes::shard_key_column(def)?;
        if keys != [column] || def.columns[column].ty != ColumnType::String {
            return None;
        }
        let strings = batch.column(column).as_string_opt::<i32>()?;
        let mut key = Vec::new();
        let shards = strings.iter().map(|s| {
            key.clear();
            let v = s.map_or(Value::Null, |s| Value::Str(s.into()));
            crate::writes::key_bytes(&v, &mut key);
            crate::placement::shard_of(&key, self.shards)
        });
        Some(shards.collect())
    }
}
