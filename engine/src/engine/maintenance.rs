//! Background work: buffers -> Parquet (flush), small files -> large ones (compaction),
//! expired partitions dropped (retention), and the WAL truncated behind what is persisted.
//! All of it runs under the manifest lock, one job at a time.

use super::Engine;
use crate::error::{Error, Result};
use crate::store::state::{Frozen, TableState};
use crate::store::storage::{FileMeta, Manifest, PartitionManifest, Storage};
use sluice_conf::Config;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// How long replaced files stay readable for queries that started before the swap.
pub(crate) const GRAVE_TIME: Duration = Duration::from_secs(60);

impl Engine {
    /// The figures of [`crate::QueryPort::health`].
    pub(crate) fn health_now(&self) -> crate::Health {
        let mut h = crate::Health {
            applied_lsn: self.wal.applied_lsn(),
            wal_segments: self.wal.segments().0,
            buffered_rows: 0,
            buffered_bytes: 0,
            flushing: 0,
            flushes: self.flushes.load(std::sync::atomic::Ordering::Relaxed),
            partitions: 0,
            files: 0,
            dead_letters: self.store.dead_letters.len() as u64,
        };
        for t in self.store.tables.all() {
            for p in t.parts.read().values() {
                h.buffered_rows += p.buffered_rows();
                h.buffered_bytes += p.buffered_bytes() as u64;
                h.flushing += u64::from(p.frozen.is_some());
                h.partitions += 1;
                h.files += p.files.len() as u64;
            }
        }
        h
    }

    pub(crate) async fn background(self: Arc<Self>, cancel: CancellationToken) {
        let tick = Config::duration(&self.config.buffer.check_interval);
        let compact_every = self.compaction_every();
        let retain_every = Config::duration(&self.config.retention.interval);
        let (mut last_compact, mut last_retain) = (Instant::now(), Instant::now());
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(tick) => {}
            }
            if self.clustered() {
                // Shard leaders persist replicated rows and the metadata group's leader
                // compacts (see `replicated`); here only replaced files are deleted, and the
                // local WAL (the broker's journal alone) cut at what the broker needs.
                self.bury(false).await;
                let applied = self.wal.applied_lsn();
                let floor = self
                    .journal_floor
                    .load(std::sync::atomic::Ordering::Acquire);
                if let Err(e) = self.wal.truncate_before(floor.min(applied + 1)) {
                    tracing::warn!(error = %e, "cutting the local log failed");
                }
                continue;
            }
            if let Err(e) = self.flush_due().await {
                tracing::warn!(error = %e, "flush failed; rows stay in the log and will be retried");
            }
            if compact_every.is_some_and(|e| last_compact.elapsed() >= e) {
                last_compact = Instant::now();
                if let Err(e) = self.compact_all().await {
                    tracing::warn!(error = %e, "compaction failed");
                }
            }
            if last_retain.elapsed() >= retain_every {
                last_retain = Instant::now();
                if let Err(e) = self.apply_retention().await {
                    tracing::warn!(error = %e, "retention failed");
                }
            }
            self.bury(false).await;
        }
    }

    /// Flushes partitions that are too big or too old, and the largest ones while the
    /// total buffered bytes exceed the budget.
    pub async fn flush_due(&self) -> Result<()> {
        let max_rows = self.config.buffer.partition_max_rows;
        let max_age = Config::duration(&self.config.buffer.max_age);
        let mut due = Vec::new();
        let mut sizes = Vec::new();
        let mut total = 0usize;
        for t in self.store.tables.all() {
            for (k, p) in t.parts.read().iter() {
                if p.frozen.is_some()
                    || p.buffer.rows >= max_rows
                    || p.buffer.since.is_some_and(|s| s.elapsed() >= max_age)
                {
                    due.push((t.clone(), *k));
                } else if !p.buffer.is_empty() {
                    sizes.push((p.buffer.bytes, t.clone(), *k));
                }
                total += p.buffered_bytes();
            }
        }
        sizes.sort_by_key(|s| std::cmp::Reverse(s.0));
        for (bytes, t, k) in sizes {
            if total <= self.config.buffer.total_max_bytes {
                break;
            }
            total -= bytes;
            due.push((t, k));
        }
        if due.is_empty() {
            return Ok(());
        }
        let mut m = self.manifest.lock().await;
        // One failing partition must not keep the others in memory.
        let mut first_error = None;
        for (t, k) in due {
            if let Err(e) = self.flush_partition(&mut m, &t, k).await {
                tracing::warn!(table = %t.def().name, partition = k, error = %e, "flush failed; will retry");
                first_error.get_or_insert(e);
            }
        }
        drop(m);
        self.truncate_wal()?;
        first_error.map_or(Ok(()), Err)
    }

    /// Persists every buffer of every table.
    pub async fn flush_all(&self) -> Result<()> {
        let tables = self.store.tables.all();
        let mut m = self.manifest.lock().await;
        for t in &tables {
            let keys: Vec<u64> = t.parts.read().keys().copied().collect();
            for k in keys {
                self.flush_partition(&mut m, t, k).await?;
            }
        }
        drop(m);
        self.truncate_wal()
    }

    /// Persists every buffer of one table.
    pub async fn flush_table(&self, t: &Arc<TableState>) -> Result<usize> {
        let mut m = self.manifest.lock().await;
        let keys: Vec<u64> = t.parts.read().keys().copied().collect();
        let mut files = 0;
        for k in keys {
            files += usize::from(self.flush_partition(&mut m, t, k).await?);
        }
        drop(m);
        self.truncate_wal()?;
        Ok(files)
    }

    /// Writes one partition's buffer as a Parquet file and records it in the manifest.
    /// Queries keep seeing the rows (as `frozen`) until the file replaces them.
    async fn flush_partition(
        &self,
        m: &mut Manifest,
        t: &Arc<TableState>,
        key: u64,
    ) -> Result<bool> {
        let def = t.def();
        let frozen = {
            let mut parts = t.parts.write();
            if t.dropped.load(std::sync::atomic::Ordering::Relaxed) {
                return Ok(false);
            }
            let Some(p) = parts.get_mut(&key) else {
                return Ok(false);
            };
            match &p.frozen {
                Some(f) => f.clone(),
                None if p.buffer.is_empty() => return Ok(false),
                None => {
                    let (min_lsn, max_lsn, rows, bytes, time_range) = (
                        p.buffer.min_lsn,
                        p.buffer.max_lsn,
                        p.buffer.rows,
                        p.buffer.bytes,
                        p.buffer.time_range,
                    );
                    let f = Arc::new(Frozen {
                        chunks: p.buffer.take(),
                        rows,
                        bytes,
                        min_lsn,
                        max_lsn,
                        time_range,
                    });
                    p.frozen = Some(f.clone());
                    f
                }
            }
        };
        // Encoded against the current schema, the one `time_column` indexes (frozen rows
        // may predate an ALTER).
        let stem = format!("{:020}", frozen.max_lsn);
        let batches: Vec<_> = frozen.chunks.iter().map(|c| c.batch.clone()).collect();
        let meta = (self.write_file(t, key, &stem, batches.clone())).await?;
        let rows = meta.rows;
        // The rollups' partial rows of these rows, committed with them.
        let (_, rolled) = self.roll_up(t, &batches, &stem).await?;
        self.change_manifest(m, |next| {
            let pm = next.partition(def.id, key);
            pm.files.push(meta.clone());
            pm.flushed_lsn = pm.flushed_lsn.max(frozen.max_lsn);
            for r in &rolled {
                next.partition(r.table.def().id, r.key)
                    .files
                    .push(r.file.clone());
            }
        })
        .await?;
        let mut parts = t.parts.write();
        // Under the source's lock, as a rollup's query reads both (`crate::query::rollup`).
        for r in rolled {
            let mut rparts = r.table.parts.write();
            r.table.partition_mut(&mut rparts, r.key).files.push(r.file);
        }
        if let Some(p) = parts.get_mut(&key) {
            p.files.push(meta);
            p.flushed_lsn = p.flushed_lsn.max(frozen.max_lsn);
            p.frozen = None;
        }
        self.store.tables.release(frozen.bytes);
        self.flushes
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        tracing::debug!(table = %def.name, partition = key, rows, "flushed");
        Ok(true)
    }

    /// Deletes WAL segments whose every record is persisted.
    pub(crate) fn truncate_wal(&self) -> Result<()> {
        // Read the applied position before scanning: a record applied during the scan has a
        // larger LSN, so it is never cut.
        let applied = self.wal.applied_lsn();
        let needed = self
            .store
            .tables
            .min_unpersisted_lsn()
            .map_or(applied + 1, |l| l.min(applied + 1))
            .min(
                self.journal_floor
                    .load(std::sync::atomic::Ordering::Acquire),
            );
        // Bridged messages' origins must outlive the segments that hold them.
        if self.wal.removable_before(needed) > 0 {
            self.store.origins.save()?;
        }
        let removed = self.wal.truncate_before(needed)?;
        if removed > 0 {
            tracing::debug!(removed, needed, "WAL segments removed");
        }
        Ok(())
    }

    /// Merges each partition's small files once there are enough of them.
    pub async fn compact_all(&self) -> Result<usize> {
        let mut m = self.manifest.lock().await;
        let mut merged = 0;
        for t in self.store.tables.all() {
            let def = t.def();
            for (key, small) in self.compaction_candidates(&t) {
                let flushed = t.parts.read().get(&key).map_or(0, |p| p.flushed_lsn);
                let meta = self
                    .merge_files(&t, key, &small, &format!("{flushed:020}"))
                    .await?;
                let rows = meta.rows;
                let old: Vec<String> = small.iter().map(|f| f.path.clone()).collect();
                self.change_manifest(&mut m, |next| {
                    let pm = next.partition(def.id, key);
                    pm.files.retain(|f| !old.contains(&f.path));
                    pm.files.push(meta.clone());
                })
                .await?;
                if let Some(p) = t.parts.write().get_mut(&key) {
                    p.files.retain(|f| !old.contains(&f.path));
                    p.files.push(meta);
                }
                tracing::info!(table = %def.name, partition = key, files = old.len(), rows, "compacted");
                self.retire(old);
                merged += 1;
            }
        }
        Ok(merged)
    }

    /// Each partition of `t` with enough small files to merge, and those files.
    pub(crate) fn compaction_candidates(&self, t: &TableState) -> Vec<(u64, Vec<FileMeta>)> {
        let cfg = &self.config.compaction;
        (t.parts.read().iter())
            .filter_map(|(k, p)| {
                let small: Vec<FileMeta> = (p.files.iter())
                    .filter(|f| f.bytes < cfg.target_file_bytes)
                    .cloned()
                    .collect();
                (small.len() >= cfg.min_files).then_some((*k, small))
            })
            .collect()
    }

    /// Writes the rows of `files` (of partition `key` of `t`) as one new file, named with
    /// `stem`, kept in the hot cache. The caller makes it replace them.
    pub(crate) async fn merge_files(
        &self,
        t: &TableState,
        key: u64,
        files: &[FileMeta],
        stem: &str,
    ) -> Result<FileMeta> {
        let mut batches = Vec::new();
        for f in files {
            let bytes = self.store.storage.get(&f.path).await?;
            batches.extend(blocking(move || Storage::decode_parquet(bytes)).await?);
        }
        // A rollup's partial rows of one bucket and key become one.
        let def = t.def();
        if let Some(r) = self.store.catalog.snapshot().rollups.get(&def.id).cloned() {
            batches = blocking(move || super::rollups::fold_partials(&r, &def, &batches)).await?;
        }
        self.write_file(t, key, stem, batches).await
    }

    /// Writes `batches` (rows of partition `key` of `t`) as a Parquet file named with `stem`,
    /// encoded against the table's current schema (the one `time_column` indexes: older
    /// rows may predate an ALTER), and keeps its decoded rows in the hot cache.
    pub(crate) async fn write_file(
        &self,
        t: &TableState,
        key: u64,
        stem: &str,
        batches: Vec<datafusion::arrow::record_batch::RecordBatch>,
    ) -> Result<FileMeta> {
        let def = t.def();
        let schema = t.schema();
        let storage = self.store.storage.clone();
        let time_col = def.time_column();
        let encoded = blocking(move || storage.encode_parquet(&schema, &batches, time_col)).await?;
        let batch = encoded.batch.clone();
        let meta = (self.store.storage)
            .put_file(file_path(def.id, key, stem), encoded)
            .await?;
        self.store.hot.insert(&meta.path, &batch);
        Ok(meta)
    }

    /// Files no longer live (replaced, expired, dropped): out of the hot cache now, deleted
    /// from the store once queries that may still read them are done.
    pub(crate) fn retire(&self, files: Vec<String>) {
        self.store.hot.remove(&files);
        self.graveyard.lock().push((Instant::now(), files));
    }

    /// Drops partitions whose newest row is older than their table's TTL.
    pub async fn apply_retention(&self) -> Result<usize> {
        let now = super::now_micros();
        let mut m = self.manifest.lock().await;
        let mut dropped = 0;
        for t in self.store.tables.all() {
            let def = t.def();
            let Some(ttl) = def.ttl_secs else {
                continue;
            };
            let cutoff = now - (ttl as i64).saturating_mul(1_000_000);
            let expired: Vec<u64> = t
                .parts
                .read()
                .iter()
                .filter(|(_, p)| p.time_range().is_some_and(|(_, hi)| hi < cutoff))
                .map(|(k, _)| *k)
                .collect();
            let rolled_up = !self.store.catalog.snapshot().rollups_of(def.id).is_empty();
            for key in expired {
                if rolled_up {
                    // The rows still in memory go to the rollups before they go.
                    self.flush_partition(&mut m, &t, key).await?;
                }
                // The tombstone LSN covers every record applied to the partition, so replay
                // does not bring the dropped rows back.
                let (files, lsn) = {
                    let parts = t.parts.read();
                    let Some(p) = parts.get(&key) else { continue };
                    let lsn = p
                        .flushed_lsn
                        .max(p.buffer.max_lsn)
                        .max(p.frozen.as_ref().map_or(0, |f| f.max_lsn));
                    (
                        p.files.iter().map(|f| f.path.clone()).collect::<Vec<_>>(),
                        lsn,
                    )
                };
                self.change_manifest(&mut m, |next| {
                    *next.partition(def.id, key) = PartitionManifest {
                        flushed_lsn: lsn,
                        files: Vec::new(),
                        shards: Default::default(),
                    };
                })
                .await?;
                {
                    let mut parts = t.parts.write();
                    if let Some(p) = parts.get_mut(&key) {
                        if p.buffer.max_lsn <= lsn {
                            self.store.tables.release(p.buffer.bytes);
                            p.buffer.take();
                        }
                        if let Some(f) = p.frozen.take() {
                            self.store.tables.release(f.bytes);
                        }
                        p.files.clear();
                        p.flushed_lsn = lsn;
                    }
                }
                t.rows_removed();
                tracing::info!(table = %def.name, partition = key, files = files.len(), "partition expired");
                self.retire(files);
                dropped += 1;
            }
        }
        drop(m);
        self.truncate_wal()?;
        self.forget_tombstones().await?;
        Ok(dropped)
    }

    /// Removes empty partitions (retention tombstones) whose `flushed_lsn` the log has been
    /// truncated past: no record they guard against can be replayed any more.
    async fn forget_tombstones(&self) -> Result<()> {
        let (_, first_lsn) = self.wal.segments();
        let mut m = self.manifest.lock().await;
        let mut gone = Vec::new();
        for t in self.store.tables.all() {
            let id = t.def().id;
            t.parts.write().retain(|key, p| {
                let dead = p.files.is_empty()
                    && p.buffer.is_empty()
                    && p.frozen.is_none()
                    && p.flushed_lsn < first_lsn;
                if dead {
                    gone.push((id, *key));
                }
                !dead
            });
        }
        let stale = |m: &Manifest, id: u64, key: u64| {
            m.tables
                .get(&id)
                .and_then(|t| t.get(&key))
                .is_some_and(|p| p.files.is_empty() && p.flushed_lsn < first_lsn)
        };
        if gone.iter().any(|(id, key)| stale(&m, *id, *key)) {
            self.change_manifest(&mut m, |next| {
                for (id, key) in &gone {
                    if stale(next, *id, *key)
                        && let Some(t) = next.tables.get_mut(id)
                    {
                        t.remove(key);
                    }
                }
                next.tables.retain(|_, parts| !parts.is_empty());
            })
            .await?;
        }
        Ok(())
    }

    /// Deletes replaced files once no query can still be reading them (`now`: all of them).
    pub(crate) async fn bury(&self, now: bool) {
        let due: Vec<String> = {
            let mut g = self.graveyard.lock();
            let (old, keep): (Vec<_>, Vec<_>) = g
                .drain(..)
                // In a cluster other nodes may still be reading them: they wait their time.
                .partition(|(t, _)| (now && !self.clustered()) || t.elapsed() >= GRAVE_TIME);
            *g = keep;
            old.into_iter().flat_map(|(_, f)| f).collect()
        };
        if let Err(e) = self.store.storage.delete(&due).await {
            tracing::warn!(error = %e, "could not delete replaced files; retrying later");
            self.graveyard.lock().push((Instant::now(), due));
        }
    }
}

/// Runs CPU-bound work (Parquet encoding and decoding) off the async runtime.
pub(crate) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T> + Send + 'static,
) -> Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| Error::io("blocking task", std::io::Error::other(e)))?
}

impl Engine {
    /// Applies `change` to a copy of the manifest, stores it as the next version, and only
    /// then makes it current.
    pub(crate) async fn change_manifest(
        &self,
        m: &mut Manifest,
        change: impl FnOnce(&mut Manifest),
    ) -> Result<()> {
        let mut next = m.clone();
        change(&mut next);
        self.manifests.save_manifest(&mut next).await?;
        *m = next;
        Ok(())
    }
}

/// A new file's object path; `stem` (the last LSN it holds) keeps names ordered.
pub(crate) fn file_path(table_id: u64, key: u64, stem: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!("tables/{table_id}/{key}/{stem}-{nanos}.parquet")
}
