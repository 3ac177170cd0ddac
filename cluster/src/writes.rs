//! Writes through the cluster ([`WriteLog`] for the engine): each record's rows go to the
//! shard their key hashes to, under a write id (writer node, incarnation, sequence) that
//! lets every replica drop a re-sent copy; each shard's queued writes are shipped in
//! batches, one raft entry carrying many writes.

use crate::cluster::{Cluster, replication};
use crate::placement::shard_of;
use crate::raft::node::{Node, WriteError};
use crate::raft::types::{Command, GroupId, Response};
use crate::topology::SharedTopology;
use async_trait::async_trait;
use bytes::Bytes;
use openraft::async_runtime::WatchReceiver;
use sluice_engine::types::{ColumnType, Value};
use sluice_engine::{Error, TableDef, WriteLog, WriteRecord, encode_record};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use tokio::sync::{Semaphore, mpsc, oneshot};

/// A shard entry carries writes, each `[length u32][write id][engine record]`; the write id
/// is the writer node, its incarnation and a sequence number.
/// Bytes of the write id.
pub(crate) const WRITE_HEADER: usize = 24;
/// A shard entry stops taking more writes past this size.
const MAX_BATCH_BYTES: usize = 1 << 20;
/// Entries a node has in flight per shard; writes queued meanwhile form the next one.
const BATCHES_IN_FLIGHT: usize = 4;

impl Cluster {
    /// Queues `record` for shard `s` under a new write id; the receiver says how it went.
    pub(crate) fn enqueue(
        &self,
        s: u32,
        record: &WriteRecord,
    ) -> sluice_engine::Result<oneshot::Receiver<Result<(), ShipError>>> {
        let seq = self.seq.fetch_add(1, Ordering::Relaxed);
        let mut entry = Vec::with_capacity(WRITE_HEADER + 32 + record.rows.len() * 64);
        entry.extend_from_slice(&self.node.id().to_le_bytes());
        entry.extend_from_slice(&self.incarnation.to_le_bytes());
        entry.extend_from_slice(&seq.to_le_bytes());
        encode_record(record, &mut entry);
        let (tx, rx) = oneshot::channel();
        self.queues[s as usize]
            .send((entry, tx))
            .map_err(|_| Error::ShuttingDown)?;
        Ok(rx)
    }
}

/// The column whose value is a row's shard key: a table's first text column (the device
/// or topic) when it has one, else its time column; none: the whole row.
pub(crate) fn shard_key_column(def: &TableDef) -> Option<usize> {
    (def.columns.iter())
        .position(|c| c.ty == ColumnType::String)
        .or_else(|| def.time_column())
}

/// The shard of `row`, its key built in `key`.
fn shard_of_row(column: Option<usize>, row: &[Value], shards: u32, key: &mut Vec<u8>) -> u32 {
    key.clear();
    match column.and_then(|i| row.get(i)) {
        Some(v) => key_bytes(v, key),
        None => row.iter().for_each(|v| key_bytes(v, key)),
    }
    shard_of(key, shards)
}

pub(crate) fn key_bytes(v: &Value, out: &mut Vec<u8>) {
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
impl WriteLog for Cluster {
    /// Returns once every record is committed by a quorum of its shard's replicas and
    /// applied by its leader; `wait` does not apply (shard queues are not bounded here: the
    /// engine's buffers and the raft groups push back).
    async fn append(
        &self,
        def: &TableDef,
        records: Vec<Arc<WriteRecord>>,
        _wait: bool,
    ) -> sluice_engine::Result<Option<u64>> {
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
        // Each shard counts its own positions: there is no one position for the writes.
        Ok(None)
    }

    fn read_ahead(&self) -> Option<futures::future::BoxFuture<'_, bool>> {
        // The groups `read_barrier` would wait for, each replica here caught up already
        // (else the barrier is what marks it so).
        let mut groups = vec![GroupId::Meta];
        {
            let ready = self.ready.lock();
            for s in (0..self.shards).filter(|s| self.replica_here(*s)) {
                if !ready.contains(&s) {
                    return None;
                }
                groups.push(GroupId::Shard(s));
            }
        }
        let applied = (groups.into_iter())
            .map(|g| Some((g, self.node.applied_index(g)?)))
            .collect::<Option<Vec<_>>>()?;
        Some(Box::pin(async move {
            let each = (applied.into_iter()).map(|(g, at)| async move {
                match self.node.applied_covers(g, at).await {
                    true => Ok(()),
                    false => Err(()),
                }
            });
            futures::future::try_join_all(each).await.is_ok()
        }))
    }

    async fn catalog_barrier(&self) -> sluice_engine::Result<()> {
        let meta = || self.node.read_barrier(GroupId::Meta);
        self.catalog_barrier.run(meta).await.map_err(replication)
    }

    fn evaluates_alerts(&self) -> bool {
        (self.node.group(GroupId::Meta)).is_some_and(|m| self.leads(&m))
    }

    fn relay(&self) -> Option<Arc<dyn sluice_engine::Relay>> {
        Some(self.relay.clone())
    }

    async fn flush_table(&self, table_id: u64) -> sluice_engine::Result<u64> {
        // Every node writes the shards it leads, here and through FLUSH calls.
        let me = self.node.id();
        let calls = self.node_ids().into_iter().map(|n| async move {
            match n == me {
                true => self.flush_led_table(table_id).await,
                false => self.relay.flush_on(n, table_id).await,
            }
            .map_err(|e| format!("node {n}: {e}"))
        });
        let mut files = 0;
        for r in futures::future::join_all(calls).await {
            files += r.map_err(crate::cluster::replication)?;
        }
        Ok(files)
    }

    fn singletons_node(&self) -> Option<u64> {
        (self.node.group(GroupId::Meta)).and_then(|m| m.metrics().borrow_watched().current_leader)
    }

    async fn read_barrier(&self) -> sluice_engine::Result<()> {
        // Every shard this node is a replica of (a voter or a learner; not one whose
        // leader has not added this node yet). A shard whose barrier fails here (its replica
        // closing, or cut off) is read from its other replicas instead, as the shards this
        // node holds no replica of are (`crate::reads`).
        let shards: Vec<u32> = (0..self.shards).filter(|s| self.replica_here(*s)).collect();
        let meta = self.node.read_barrier(GroupId::Meta);
        let each = shards.iter().map(|s| async move {
            match self.node.read_barrier(GroupId::Shard(*s)).await {
                Ok(()) => Some(*s),
                Err(e) => {
                    tracing::debug!(shard = s, error = %e, "read barrier failed; reading it elsewhere");
                    self.released(*s);
                    None
                }
            }
        });
        let (meta, held) = futures::future::join(meta, futures::future::join_all(each)).await;
        meta.map_err(replication)?;
        let held: Vec<u32> = held.into_iter().flatten().collect();
        self.caught_up(&held);
        Ok(())
    }
}

/// Barriers shared by the callers that wait together: a caller is answered by the first
/// barrier that began after it arrived (one that began before may have read the leader's
/// position before the change the caller must see), so that callers arriving while one
/// runs share the next one; at most one runs at a time. A flood of messages to a table
/// that exists nowhere costs one metadata read-index round at a time, not one each.
#[derive(Default)]
pub(crate) struct Coalesced {
    /// Callers that arrived so far.
    arrived: AtomicU64,
    /// Callers answered: every caller numbered below it.
    answered: AtomicU64,
    running: tokio::sync::Mutex<()>,
}

impl Coalesced {
    /// Waits for a barrier `barrier` makes that began after this call.
    pub(crate) async fn run<F, Fut, E>(&self, barrier: F) -> Result<(), E>
    where
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = Result<(), E>>,
    {
        let me = self.arrived.fetch_add(1, Ordering::AcqRel);
        let _turn = self.running.lock().await;
        if self.answered.load(Ordering::Acquire) > me {
            return Ok(());
        }
        let covers = self.arrived.load(Ordering::Acquire);
        barrier().await?;
        self.answered.fetch_max(covers, Ordering::AcqRel);
        Ok(())
    }
}

/// A write waiting to be shipped to its shard: its entry (write id, then the engine
/// record) and where to say how it went.
pub(crate) type Queued = (Vec<u8>, oneshot::Sender<Result<(), ShipError>>);

/// Why a shard did not commit a batch of writes (each write of the batch gets a copy).
#[derive(Debug, Clone, thiserror::Error)]
pub(crate) enum ShipError {
    /// The shard's state machine refused the entry.
    #[error("shard {shard}: {reason}")]
    Refused {
        /// The shard.
        shard: u32,
        /// Its reason, as the replicas' apply gave it.
        reason: String,
    },
    /// The entry was not committed (no leader in time, the group stopped).
    #[error("shard {shard}: {source}")]
    NotCommitted {
        /// The shard.
        shard: u32,
        /// Why.
        #[source]
        source: Arc<WriteError>,
    },
}

/// Ships a shard's queued writes in batches: every write queued while earlier batches are
/// in flight goes in the next one, a raft entry carrying many writes (each keeping its own
/// id), so that the entry's costs (encoding, replication, the apply hand-off) are shared, as
/// the single-node log shares one fsync among the writes of a group commit.
pub(crate) async fn ship(
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
                Ok(Response {
                    error: Some(reason),
                    ..
                }) => Err(ShipError::Refused { shard, reason }),
                Err(e) => Err(ShipError::NotCommitted {
                    shard,
                    source: Arc::new(e),
                }),
            };
            drop(permit);
            for w in waiters {
                let _ = w.send(out.clone());
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::Coalesced;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};
    use tokio::sync::Semaphore;

    /// Callers arriving while a barrier runs share the next one; none is answered by a
    /// barrier that began before it arrived.
    #[tokio::test]
    async fn callers_share_the_next_barrier() {
        let c = Arc::new(Coalesced::default());
        let (made, gate) = (Arc::new(AtomicU64::new(0)), Arc::new(Semaphore::new(0)));
        let call = |c: Arc<Coalesced>| {
            let (made, gate) = (made.clone(), gate.clone());
            tokio::spawn(async move {
                let barrier = || async {
                    let n = made.fetch_add(1, Ordering::SeqCst) + 1;
                    gate.acquire().await.unwrap().forget();
                    Ok::<u64, ()>(n)
                };
                c.run(|| async { barrier().await.map(|_| ()) }).await
            })
        };
        let first = call(c.clone());
        while made.load(Ordering::SeqCst) == 0 {
            tokio::task::yield_now().await;
        }
        let later: Vec<_> = (0..8).map(|_| call(c.clone())).collect();
        for _ in 0..50 {
            tokio::task::yield_now().await;
        }
        assert_eq!(
            made.load(Ordering::SeqCst),
            1,
            "the later callers wait their turn"
        );
        gate.add_permits(1);
        first.await.unwrap().unwrap();
        while made.load(Ordering::SeqCst) < 2 {
            tokio::task::yield_now().await;
        }
        gate.add_permits(1);
        for h in later {
            h.await.unwrap().unwrap();
        }
        assert_eq!(
            made.load(Ordering::SeqCst),
            2,
            "eight callers shared one barrier"
        );
        // A caller after them gets a barrier of its own.
        gate.add_permits(1);
        call(c).await.unwrap().unwrap();
        assert_eq!(made.load(Ordering::SeqCst), 3);
    }
}
