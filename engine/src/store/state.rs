//! Live table state: per partition, the unflushed buffer, a buffer being flushed (still
//! visible to queries) and the Parquet files. This is the engine's "apply" target: the
//! [`RecordSink`] implementation here is the one step both the live log and replay run.

use crate::log::wal::RecordSink;
use crate::log::wal::record::WriteRecord;
use crate::store::buffer::PartitionBuffer;
use crate::store::catalog::TableDef;
use crate::store::chunk::Chunk;
use crate::store::storage::FileMeta;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::record_batch::RecordBatch;
use parking_lot::RwLock;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

/// Rows taken out of a buffer for a flush; queries see them until the file replaces them.
#[derive(Debug)]
pub struct Frozen {
    /// The rows, as the buffer's sealed chunks (their indexes kept: queries still read
    /// them while the file is written).
    pub chunks: Vec<Chunk>,
    /// Row count.
    pub rows: usize,
    /// Approximate bytes.
    pub bytes: usize,
    /// First LSN among them.
    pub min_lsn: u64,
    /// Last LSN among them: once persisted, the partition's `flushed_lsn`.
    pub max_lsn: u64,
    /// Time range.
    pub time_range: Option<(i64, i64)>,
}

/// One partition.
#[derive(Debug)]
pub struct Partition {
    /// Rows not yet persisted.
    pub buffer: PartitionBuffer,
    /// Rows being persisted (or whose persisting failed and will be retried).
    pub frozen: Option<Arc<Frozen>>,
    /// Live Parquet files.
    pub files: Vec<FileMeta>,
    /// Log records up to this LSN are persisted (or dropped); replay skips them here.
    pub flushed_lsn: u64,
    /// In a cluster: each shard's rows not yet persisted, by shard (the single-node
    /// `buffer`, `frozen` and `flushed_lsn` stay empty there).
    pub shards: BTreeMap<u32, ShardRows>,
}

/// One shard's rows of a partition, in a cluster. Their LSNs are the shard's raft log
/// indexes, so every replica holds the same rows under the same LSNs.
#[derive(Debug)]
pub struct ShardRows {
    /// Rows not yet persisted, in log order.
    pub buffer: PartitionBuffer,
    /// The shard's log entries up to this index are in the partition's files.
    pub flushed: u64,
}

impl ShardRows {
    /// The shard's entries up to `through` are in the partition's files (or dropped): moves
    /// `flushed` up to it and drops those rows from the buffer; returns the bytes freed.
    pub fn persisted(&mut self, through: u64) -> usize {
        self.flushed = self.flushed.max(through);
        self.buffer.drop_through(through)
    }
}

impl Partition {
    /// Rows in the partition, persisted or not.
    pub fn rows(&self) -> u64 {
        self.files.iter().map(|f| f.rows).sum::<u64>() + self.buffered_rows()
    }

    /// Rows only in memory (buffers and frozen), not yet in Parquet.
    pub fn buffered_rows(&self) -> u64 {
        let shards: usize = self.shards.values().map(|s| s.buffer.rows).sum();
        (self.buffer.rows + self.frozen.as_ref().map_or(0, |f| f.rows) + shards) as u64
    }

    /// Bytes held in memory (buffers and frozen).
    pub fn buffered_bytes(&self) -> usize {
        let shards: usize = self.shards.values().map(|s| s.buffer.bytes).sum();
        self.buffer.bytes + self.frozen.as_ref().map_or(0, |f| f.bytes) + shards
    }

    /// The rows only in memory (frozen, buffered, and every shard's), as batches of
    /// `schema`.
    pub fn unflushed_batches(&self, schema: &SchemaRef) -> Vec<RecordBatch> {
        let chunks = self.unflushed_chunks(schema).into_iter();
        chunks.map(|c| c.batch).collect()
    }

    /// The same rows as [`Partition::unflushed_batches`], as chunks (for a scan, which can
    /// use the sealed chunks' indexes).
    pub fn unflushed_chunks(&self, schema: &SchemaRef) -> Vec<Chunk> {
        self.unflushed_chunks_of(schema, &|_| true)
    }

    /// The same, with only the rows of the shards `holds` takes (a cluster node's rows of
    /// a shard whose replica it closed, or whose replica is catching up, do not count).
    pub fn unflushed_chunks_of(
        &self,
        schema: &SchemaRef,
        holds: &dyn Fn(u32) -> bool,
    ) -> Vec<Chunk> {
        let frozen = self.frozen.iter().flat_map(|f| f.chunks.iter());
        let widened = frozen.map(|c| c.with_batch(crate::store::buffer::widen(&c.batch, schema)));
        let mut out: Vec<Chunk> = widened.collect();
        out.extend(self.buffer.chunks(schema));
        for (_, s) in self.shards.iter().filter(|(s, _)| holds(**s)) {
            out.extend(s.buffer.chunks(schema));
        }
        out
    }

    /// Time range over files and buffers.
    pub fn time_range(&self) -> Option<(i64, i64)> {
        let ranges = self
            .files
            .iter()
            .filter_map(|f| Some((f.min_time?, f.max_time?)))
            .chain(self.frozen.as_ref().and_then(|f| f.time_range))
            .chain(self.buffer.time_range)
            .chain(self.shards.values().filter_map(|s| s.buffer.time_range));
        ranges.reduce(|a, b| (a.0.min(b.0), a.1.max(b.1)))
    }

    /// Smallest LSN still only in the log (not persisted), if any.
    pub fn unpersisted_lsn(&self) -> Option<u64> {
        let f = self.frozen.as_ref().map(|f| f.min_lsn);
        let b = (!self.buffer.is_empty()).then_some(self.buffer.min_lsn);
        match (f, b) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

/// One table's live state.
#[derive(Debug)]
pub struct TableState {
    /// Definition and Arrow schema, replaced together by ALTER.
    pub def: RwLock<(Arc<TableDef>, SchemaRef)>,
    /// Partition key -> partition.
    pub parts: RwLock<BTreeMap<u64, Partition>>,
    /// Set (under the `parts` lock) when the table is dropped: nothing is applied or
    /// flushed after that, and its memory is released exactly once.
    pub dropped: std::sync::atomic::AtomicBool,
    /// Grows whenever the table's rows change (apply, retention): kept query results are
    /// valid while it stands still.
    changes: AtomicU64,
    /// The newest row of each key (device).
    pub latest: super::latest::Latest,
}

impl TableState {
    /// A table with no rows.
    pub fn new(def: Arc<TableDef>) -> Self {
        let schema = def.arrow_schema();
        Self {
            latest: super::latest::Latest::new(&def),
            def: RwLock::new((def, schema)),
            parts: RwLock::new(BTreeMap::new()),
            dropped: std::sync::atomic::AtomicBool::new(false),
            changes: AtomicU64::new(0),
        }
    }

    /// How many times the rows have changed.
    pub fn changes(&self) -> u64 {
        self.changes.load(Ordering::Acquire)
    }

    /// Records that rows changed (after the change is visible).
    pub fn changed(&self) {
        self.changes.fetch_add(1, Ordering::Release);
    }

    /// The current definition.
    pub fn def(&self) -> Arc<TableDef> {
        self.def.read().0.clone()
    }

    /// The current Arrow schema.
    pub fn schema(&self) -> SchemaRef {
        self.def.read().1.clone()
    }

    /// Replaces the definition after ALTER, widening every buffer first.
    pub fn alter(&self, def: Arc<TableDef>) {
        let schema = def.arrow_schema();
        let types: Vec<_> = def.columns.iter().map(|c| c.ty).collect();
        let mut parts = self.parts.write();
        for p in parts.values_mut() {
            p.buffer.widen(schema.clone(), &types);
            for s in p.shards.values_mut() {
                s.buffer.widen(schema.clone(), &types);
            }
        }
        self.latest.redefine(&def);
        *self.def.write() = (def, schema);
    }

    /// Rows left the table (a partition expired, files replaced by a snapshot's): the
    /// last-value cache starts over, and queries see the change.
    pub fn rows_removed(&self) {
        self.latest.forget();
        self.changed();
    }

    fn new_partition(&self, flushed_lsn: u64) -> Partition {
        let (def, schema) = &*self.def.read();
        let types: Vec<_> = def.columns.iter().map(|c| c.ty).collect();
        Partition {
            buffer: PartitionBuffer::new(schema.clone(), &types),
            frozen: None,
            files: Vec::new(),
            flushed_lsn,
            shards: BTreeMap::new(),
        }
    }

    /// Shard `shard`'s rows of `part`, created empty (nothing flushed) if absent.
    pub fn shard_rows<'a>(&self, part: &'a mut Partition, shard: u32) -> &'a mut ShardRows {
        part.shards.entry(shard).or_insert_with(|| {
            let (def, schema) = &*self.def.read();
            let types: Vec<_> = def.columns.iter().map(|c| c.ty).collect();
            ShardRows {
                buffer: PartitionBuffer::with_marks(schema.clone(), &types),
                flushed: 0,
            }
        })
    }

    /// The partition for `key`, created empty if absent.
    pub fn partition_mut<'a>(
        &self,
        parts: &'a mut BTreeMap<u64, Partition>,
        key: u64,
    ) -> &'a mut Partition {
        parts.entry(key).or_insert_with(|| self.new_partition(0))
    }
}

/// Every table's live state, by id.
#[derive(Debug, Default)]
pub(crate) struct Tables {
    /// Table id -> state.
    pub by_id: RwLock<HashMap<u64, Arc<TableState>>>,
    /// Bytes held in buffers (unpersisted), kept exact by apply, flush, retention and drop.
    buffered: AtomicU64,
    /// Woken whenever bytes leave the buffers (writes waiting for room listen).
    released: tokio::sync::Notify,
    /// Writes waiting for room now.
    room_waiters: AtomicUsize,
    /// A wait for room ran out and no room came since: writes are refused without waiting.
    gave_up: AtomicBool,
    /// The engine is shutting down: nobody waits for room any more.
    closing: AtomicBool,
}

/// A write's place among those waiting for room in the buffers.
#[derive(Debug)]
pub(crate) struct RoomWaiter<'a>(&'a AtomicUsize);

impl Drop for RoomWaiter<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Tables {
    /// Bytes held in memory, not yet persisted.
    pub(crate) fn buffered_bytes(&self) -> u64 {
        self.buffered.load(Ordering::Relaxed)
    }

    /// Records that `bytes` left memory (persisted or dropped).
    pub(crate) fn release(&self, bytes: usize) {
        self.buffered.fetch_sub(bytes as u64, Ordering::Relaxed);
        self.gave_up.store(false, Ordering::Relaxed);
        self.released.notify_waiters();
    }

    /// Stops every wait for room (the engine is shutting down).
    pub(crate) fn close(&self) {
        self.closing.store(true, Ordering::Release);
        self.released.notify_waiters();
    }

    /// Whether [`Tables::close`] was called.
    pub(crate) fn closing(&self) -> bool {
        self.closing.load(Ordering::Acquire)
    }

    /// A place among the writes waiting for room, if fewer than `max` wait and no wait ran
    /// out since there was last room.
    pub(crate) fn room_waiter(&self, max: usize) -> Option<RoomWaiter<'_>> {
        if self.gave_up.load(Ordering::Relaxed) || self.closing() {
            return None;
        }
        let was = self.room_waiters.fetch_add(1, Ordering::Relaxed);
        let waiter = RoomWaiter(&self.room_waiters);
        (was < max).then_some(waiter)
    }

    /// Waits until the buffers hold at most `limit` bytes, or `deadline` passes; returns
    /// the bytes they hold then. Running out marks the buffers given up on (see
    /// [`Tables::room_waiter`]) until there is room again.
    pub(crate) async fn wait_below(&self, limit: u64, deadline: tokio::time::Instant) -> u64 {
        loop {
            let released = self.released.notified();
            let bytes = self.buffered_bytes();
            if bytes <= limit || self.closing() {
                return bytes;
            }
            tokio::select! {
                _ = released => {}
                _ = tokio::time::sleep_until(deadline) => {
                    self.gave_up.store(true, Ordering::Relaxed);
                    return self.buffered_bytes();
                }
            }
        }
    }

    /// Removes a table, releasing its buffered bytes.
    pub(crate) fn remove(&self, id: u64) {
        let removed = self.by_id.write().remove(&id);
        if let Some(t) = removed {
            let parts = t.parts.write();
            t.dropped.store(true, Ordering::Relaxed);
            let held: usize = parts.values().map(Partition::buffered_bytes).sum();
            self.release(held);
        }
    }

    /// A table's state.
    pub(crate) fn get(&self, id: u64) -> Option<Arc<TableState>> {
        self.by_id.read().get(&id).cloned()
    }

    /// Every table.
    pub(crate) fn all(&self) -> Vec<Arc<TableState>> {
        self.by_id.read().values().cloned().collect()
    }

    /// The smallest LSN still needed by some unpersisted row.
    pub(crate) fn min_unpersisted_lsn(&self) -> Option<u64> {
        self.min_over_partitions(Partition::unpersisted_lsn)
    }

    /// The smallest value `f` gives over every partition of every table.
    fn min_over_partitions(&self, f: impl Fn(&Partition) -> Option<u64>) -> Option<u64> {
        (self.all().iter())
            .filter_map(|t| t.parts.read().values().filter_map(&f).min())
            .min()
    }
}

impl Tables {
    /// Applies the writes of the entry committed at `index` of shard `shard`'s log (a
    /// cluster's apply): rows of a partition whose files already hold that entry are skipped.
    pub(crate) fn apply_shard(&self, shard: u32, index: u64, records: &[WriteRecord]) {
        self.apply_rows(index, records, Some(shard));
    }

    /// Adds records' rows to the buffers: the single-node ones (`shard` None, `lsn` the
    /// WAL's) or a shard's (`lsn` its log index). Rows of a partition whose files already
    /// hold that LSN are skipped (a replay), as are those of a dropped table. Consecutive
    /// records of one table take its lock once.
    fn apply_rows(&self, lsn: u64, records: &[WriteRecord], shard: Option<u32>) {
        for run in records.chunk_by(|a, b| a.table_id == b.table_id) {
            let Some(table) = self.get(run[0].table_id) else {
                continue;
            };
            let def = table.def();
            let time_col = def.time_column();
            let pc = def.partition_column;
            let mut parts = table.parts.write();
            if table.dropped.load(Ordering::Relaxed) {
                continue;
            }
            let mut added = 0;
            for row in run.iter().flat_map(|r| &r.rows) {
                let key = row.get(pc).map_or(0, |v| def.partition.key(v));
                let part = table.partition_mut(&mut parts, key);
                let (flushed, buffer) = match shard {
                    None => (part.flushed_lsn, &mut part.buffer),
                    Some(s) => {
                        let rows = table.shard_rows(part, s);
                        (rows.flushed, &mut rows.buffer)
                    }
                };
                if lsn <= flushed {
                    continue;
                }
                added += buffer.push(lsn, row, time_col);
            }
            // Also the rows files already hold (a replay): they are the table's rows.
            (table.latest).observe(run.iter().flat_map(|r| &r.rows).map(Vec::as_slice));
            self.buffered.fetch_add(added as u64, Ordering::Relaxed);
            drop(parts);
            table.changed();
        }
    }

    /// Drops shard `shard`'s buffered rows up to log index `through` from every partition
    /// (they are in files: a snapshot of the shard was installed here).
    pub(crate) fn drop_shard_through(&self, shard: u32, through: u64) {
        for t in self.all() {
            let mut parts = t.parts.write();
            let mut released = 0;
            for p in parts.values_mut() {
                // `flushed` stays: it moves only with the metadata group's file changes, so
                // that every node decides those alike.
                if let Some(s) = p.shards.get_mut(&shard) {
                    released += s.buffer.drop_through(through);
                }
            }
            drop(parts);
            if released > 0 {
                self.release(released);
                t.changed();
            }
        }
    }

    /// The last log index of shard `shard` whose rows are all persisted, as far as the
    /// buffers tell: one before the oldest buffered row's, or `None` when the shard has no
    /// rows buffered (everything applied is persisted).
    pub(crate) fn shard_persisted_through(&self, shard: u32) -> Option<u64> {
        self.min_over_partitions(|p| {
            (p.shards.get(&shard))
                .filter(|s| !s.buffer.is_empty())
                .map(|s| s.buffer.min_lsn - 1)
        })
    }
}

impl RecordSink for Tables {
    fn apply(&self, lsn: u64, record: &WriteRecord) {
        self.apply_rows(lsn, std::slice::from_ref(record), None);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use tokio::time::{Duration, Instant};

    #[tokio::test]
    async fn writes_wait_for_room_and_give_up_in_time() {
        let tables = Arc::new(Tables::default());
        tables.buffered.store(1_000, Ordering::Relaxed);
        // Room comes: a waiter wakes when a release brings the buffers under the limit.
        let t = tables.clone();
        // The test's runtime has one thread: the releaser runs while the waiter waits, and
        // each yield hands the thread back to the waiter.
        let releaser = tokio::spawn(async move {
            t.release(300); // still over the limit: the waiter keeps waiting
            tokio::task::yield_now().await;
            t.release(300);
        });
        let far = Instant::now() + Duration::from_secs(30);
        let waiter = tables.room_waiter(2).expect("a place");
        assert_eq!(tables.wait_below(500, far).await, 400);
        drop(waiter);
        releaser.await.unwrap();
        // No room comes: the wait runs out, and later writes are refused without waiting
        // until some bytes leave the buffers.
        let soon = Instant::now() + Duration::from_millis(50);
        assert_eq!(tables.wait_below(100, soon).await, 400);
        assert!(tables.room_waiter(2).is_none());
        tables.release(10);
        assert!(tables.room_waiter(2).is_some());
        // At most `max` wait at a time.
        let (a, b) = (tables.room_waiter(2), tables.room_waiter(2));
        assert!(a.is_some() && b.is_some());
        assert!(tables.room_waiter(2).is_none());
        drop(a);
        assert!(tables.room_waiter(2).is_some());
        // Shutting down ends a wait at once.
        let t = tables.clone();
        let wait = tokio::spawn(async move { t.wait_below(100, far).await });
        tokio::task::yield_now().await; // the waiter now waits
        tables.close();
        assert_eq!(wait.await.unwrap(), 390);
        assert!(tables.room_waiter(2).is_none());
    }
}
