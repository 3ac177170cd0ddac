//! The engine as one node of a cluster: writes are committed by the shard groups' raft logs
//! instead of the local log, and come back, in each shard's log order, through
//! [`Engine::apply_replicated`] on every replica (log -> apply -> ack, with the raft log as
//! the log). Catalog changes are committed by the metadata group and installed on every node
//! by [`Engine::install_catalog`].
//!
//! Persisting: each partition keeps every shard's rows apart ([`crate::store::state::ShardRows`],
//! their LSNs being the shard's log indexes). A shard's leader writes a partition's rows of
//! the shard as a Parquet file on the shared store ([`Engine::flush_shards`]) and commits
//! the file through the metadata group; every node installs it in the metadata log's order
//! ([`Engine::install_file_change`]), dropping the rows the file holds from its buffers, so
//! all replicas agree which rows are in files. A shard's snapshot is then just a log
//! position ([`Engine::shard_persisted_through`]): everything up to it is in files the
//! manifest names, so the log behind it can be purged and a lagging node catches up from
//! the shared store ([`Engine::restore_shard`]).

use super::Engine;
use crate::error::{Error, Result};
use crate::log::WriteLog;
use crate::log::wal::record::WriteRecord;
use crate::store::state::TableState;
use crate::store::storage::FileMeta;
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// How long a shard's apply waits for the catalog change that created its table, when the
/// shard's log got ahead of the metadata group's on this node.
const CATALOG_WAIT: Duration = Duration::from_secs(30);

/// A Parquet file holding one partition's rows of one shard, as the metadata group
/// commits it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ShardFile {
    /// The table.
    pub table_id: u64,
    /// The partition key.
    pub partition: u64,
    /// The shard.
    pub shard: u32,
    /// The rows are those of the shard's log entries after this index (the partition's
    /// persisted index when they were taken) ...
    pub after: u64,
    /// ... up to this one.
    pub through: u64,
    /// The file.
    pub file: FileMeta,
    /// The rollups of the table whose partial rows of these rows are in `rollup_files`
    /// (every rollup the table has when the change is installed must be among them).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rolled: Vec<u64>,
    /// Those partial rows: files of the rollup tables.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rollup_files: Vec<RollupFile>,
}

/// A rollup's file of partial rows, committed with the rows of its source it folds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RollupFile {
    /// The rollup table.
    pub table_id: u64,
    /// Its partition key.
    pub partition: u64,
    /// The file.
    pub file: FileMeta,
}

/// Small files of one partition merged into one, as the metadata group commits it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MergedFiles {
    /// The table.
    pub table_id: u64,
    /// The partition key.
    pub partition: u64,
    /// The files merged (their paths).
    pub replaced: Vec<String>,
    /// The file holding their rows.
    pub file: FileMeta,
}

/// A partition its table's TTL expired, as the metadata group commits it: its files and,
/// per shard, the rows up to a log index leave it on every node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExpiredPartition {
    /// The table.
    pub table_id: u64,
    /// The partition key.
    pub partition: u64,
    /// Per shard: its rows in the partition up to this log index are dropped (later ones,
    /// late data, stay).
    pub through: std::collections::BTreeMap<u32, u64>,
    /// The partition's files (deleted from the store by the node that committed this).
    pub files: Vec<String>,
}

/// A change to the files on the shared store, committed through the metadata group and
/// installed by every node in that group's order ([`Engine::install_file_change`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum FileChange {
    /// Shard rows a shard's leader wrote ([`Engine::flush_shards`]).
    Flushed(Vec<ShardFile>),
    /// Files the metadata group's leader merged ([`Engine::compact_shared`]).
    Merged(Vec<MergedFiles>),
    /// Partitions the metadata group's leader found expired ([`Engine::expired_shared`]).
    Expired(Vec<ExpiredPartition>),
}

impl FileChange {
    /// The files the change adds.
    fn new_paths(&self) -> Vec<String> {
        match self {
            Self::Flushed(f) => (f.iter())
                .flat_map(|f| {
                    let rollups = f.rollup_files.iter().map(|r| r.file.path.clone());
                    std::iter::once(f.file.path.clone()).chain(rollups)
                })
                .collect(),
            Self::Merged(m) => m.iter().map(|m| m.file.path.clone()).collect(),
            Self::Expired(_) => Vec::new(),
        }
    }

    /// The shards whose rows the change persists.
    pub fn shards(&self) -> Vec<u32> {
        match self {
            Self::Flushed(f) => f.iter().map(|f| f.shard).collect(),
            Self::Merged(_) | Self::Expired(_) => Vec::new(),
        }
    }

    /// Whether it changes nothing.
    pub fn is_empty(&self) -> bool {
        match self {
            Self::Flushed(f) => f.is_empty(),
            Self::Merged(m) => m.is_empty(),
            Self::Expired(e) => e.is_empty(),
        }
    }
}

/// Sleeps a moment from synchronous code, without stalling other tasks when on a runtime.
fn pause() {
    let wait = || std::thread::sleep(Duration::from_millis(5));
    match tokio::runtime::Handle::try_current() {
        Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(wait)
        }
        _ => wait(),
    }
}

impl Engine {
    /// Makes this engine a cluster node: writes go to `log` (the shard groups), catalog
    /// changes to `catalog` (the metadata group). Set once, before the listeners open.
    pub fn join_cluster(
        &self,
        log: Arc<dyn WriteLog>,
        catalog: Arc<dyn crate::store::catalog::CatalogLog>,
        reader: Arc<dyn crate::store::remote::ShardReader>,
    ) {
        let _ = self.store.reader.set(reader);
        let l = log.clone();
        self.alerts
            .set_active(Arc::new(move || l.evaluates_alerts()));
        let _ = self.log.set(log);
        self.store.catalog.replicate_through(catalog);
    }

    /// The catalog's version (it grows by one with every change).
    pub fn catalog_version(&self) -> u64 {
        self.store.catalog.snapshot().version
    }

    /// Whether this engine is a cluster node.
    pub fn clustered(&self) -> bool {
        self.config.cluster.is_some()
    }

    /// Applies the writes of the entry committed at `index` of shard `shard`'s log (each
    /// payload made by [`encode_record`]) and returns the rows applied, with the first error
    /// met (a write that fails is skipped; the others are applied). Every replica applies
    /// the same entries in the same order. Rows of a table this node's catalog does not have
    /// yet wait for it (the metadata group may be behind the shard here); rows of a dropped
    /// table, and rows already in a file, are skipped. Consecutive writes to one table are
    /// applied under one lock of it.
    pub fn apply_replicated(
        &self,
        shard: u32,
        index: u64,
        payloads: &[&[u8]],
    ) -> (u64, Option<Error>) {
        let mut error = None;
        let mut failed = |e: Error| {
            tracing::error!(shard, index, error = %e, "a committed write could not be applied");
            error.get_or_insert(e);
        };
        let mut records = Vec::with_capacity(payloads.len());
        for payload in payloads {
            let record = payload
                .split_first()
                .and_then(|(kind, body)| WriteRecord::decode(*kind, body));
            let Some(record) = record else {
                failed(Error::Corrupt {
                    what: "write from a shard log".into(),
                    reason: "the record does not decode".into(),
                });
                continue;
            };
            let known = records
                .last()
                .is_some_and(|r: &WriteRecord| r.table_id == record.table_id);
            if !known && let Err(e) = self.await_table(record.table_id) {
                failed(e);
                continue;
            }
            records.push(record);
        }
        // A bridged message's origin, so that its redelivery (to whichever node runs the
        // bridge then) is recognised: in the order this node applies them.
        for o in records.iter().filter_map(|r| r.origin.as_ref()) {
            self.store.origins.remember_next(o);
        }
        self.store.tables.apply_shard(shard, index, &records);
        let rows = records.iter().map(|r| r.rows.len() as u64).sum();
        self.shard_rows_applied.fetch_add(rows, Ordering::Relaxed);
        (rows, error)
    }

    /// Table `id`, which another node asks about: its catalog may be ahead of this one's (a
    /// table just created), so this waits for it ([`Engine::await_table`]).
    pub(crate) fn table_asked(&self, id: u64) -> Result<Arc<crate::store::state::TableState>> {
        self.await_table(id)?;
        self.store.tables.get(id).ok_or_else(|| Error::Replication {
            reason: format!("table {id} is not known on this node"),
        })
    }

    /// Waits until this node's catalog has table `id` (made or dropped), at most
    /// `CATALOG_WAIT`.
    pub(crate) fn await_table(&self, id: u64) -> Result<()> {
        let mut started = None;
        while self.store.tables.get(id).is_none() && !self.store.catalog.snapshot().allocated(id) {
            // The clock is read only here: it cost 7% of a replica's apply when read per write.
            if started.get_or_insert_with(Instant::now).elapsed() > CATALOG_WAIT {
                return Err(Error::invalid(format!(
                    "table {id} is not in this node's catalog after {} s",
                    CATALOG_WAIT.as_secs()
                )));
            }
            pause();
        }
        Ok(())
    }

    /// Writes the buffered rows of the shards in `led` (the ones this node leads) that are
    /// due (too many, too old, or the largest while memory is over budget) as Parquet files
    /// on the shared store, one per partition and shard. The files count only once
    /// committed through the metadata group and installed ([`Engine::install_file_change`]);
    /// if that fails, [`Engine::discard_files`] removes them.
    pub async fn flush_shards(&self, led: &[u32]) -> Result<Vec<ShardFile>> {
        let max_rows = self.config.buffer.partition_max_rows;
        let max_age = sluice_conf::Config::duration(&self.config.buffer.max_age);
        let (mut due, mut sizes, mut total) = (Vec::new(), Vec::new(), 0usize);
        for t in self.store.tables.all() {
            for (k, p) in t.parts.read().iter() {
                total += p.buffered_bytes();
                for (s, rows) in &p.shards {
                    let b = &rows.buffer;
                    if !led.contains(s) || b.is_empty() {
                        continue;
                    }
                    if b.rows >= max_rows || b.since.is_some_and(|at| at.elapsed() >= max_age) {
                        due.push((t.clone(), *k, *s));
                    } else {
                        sizes.push((b.bytes, t.clone(), *k, *s));
                    }
                }
            }
        }
        sizes.sort_by_key(|s| std::cmp::Reverse(s.0));
        for (bytes, t, k, s) in sizes {
            if total <= self.config.buffer.total_max_bytes {
                break;
            }
            total -= bytes;
            due.push((t, k, s));
        }
        let mut out = Vec::new();
        for (t, key, shard) in due {
            // One partition failing (the store, say) does not hold back the others; its rows
            // stay buffered and in the log, and are tried again on the next round.
            match self.flush_shard_rows(&t, key, shard).await {
                Ok(Some(f)) => out.push(f),
                Ok(None) => {}
                Err(e) => tracing::warn!(
                    table = %t.def().name,
                    partition = key,
                    shard,
                    error = %e,
                    "writing a shard's rows failed; they stay buffered"
                ),
            }
        }
        Ok(out)
    }

    /// Every buffered row of table `table_id` in the shards this node leads (`led`),
    /// written as files now (`FLUSH TABLE` on a cluster). On a failure the files written
    /// before it are removed (no commit will name them) and the failure is returned.
    pub async fn flush_table_shards(&self, table_id: u64, led: &[u32]) -> Result<Vec<ShardFile>> {
        let Some(t) = self.store.tables.get(table_id) else {
            return Ok(Vec::new());
        };
        let due: Vec<(u64, u32)> = (t.parts.read().iter())
            .flat_map(|(k, p)| {
                (p.shards.iter())
                    .filter(|(s, r)| led.contains(s) && !r.buffer.is_empty())
                    .map(|(s, _)| (*k, *s))
                    .collect::<Vec<_>>()
            })
            .collect();
        let mut out = Vec::new();
        for (key, shard) in due {
            match self.flush_shard_rows(&t, key, shard).await {
                Ok(f) => out.extend(f),
                Err(e) => {
                    self.discard_files(&FileChange::Flushed(out)).await;
                    return Err(e);
                }
            }
        }
        Ok(out)
    }

    /// Writes one partition's buffered rows of one shard as a Parquet file on the shared
    /// store (`None`: nothing buffered there any more).
    async fn flush_shard_rows(
        &self,
        t: &Arc<TableState>,
        key: u64,
        shard: u32,
    ) -> Result<Option<ShardFile>> {
        let def = t.def();
        let schema = t.schema();
        let taken = {
            let parts = t.parts.read();
            (parts.get(&key).and_then(|p| p.shards.get(&shard)))
                .map(|r| (r.flushed, r.buffer.max_lsn, r.buffer.snapshot(&schema)))
        };
        let Some((after, through, batches)) = taken else {
            return Ok(None);
        };
        let stem = format!("s{shard}-{through:020}");
        let file = self.write_file(t, key, &stem, batches.clone()).await?;
        let (rolled, files) = self.roll_up(t, &batches, &stem).await?;
        let rollup_files = (files.into_iter())
            .map(|r| RollupFile {
                table_id: r.table.def().id,
                partition: r.key,
                file: r.file,
            })
            .collect();
        Ok(Some(ShardFile {
            table_id: def.id,
            partition: key,
            shard,
            after,
            through,
            file,
            rolled,
            rollup_files,
        }))
    }

    /// How often to look for files to merge; `None` when compaction is off.
    pub fn compaction_every(&self) -> Option<Duration> {
        let c = &self.config.compaction;
        c.enabled
            .then(|| sluice_conf::Config::duration(&c.interval))
    }

    /// Merges the small files of partitions on the shared store (as [`Engine::compact_all`]
    /// does on a single node), each partition's into one new file. They replace the old
    /// ones only once committed through the metadata group and installed
    /// ([`Engine::install_file_change`]); run by that group's leader alone.
    pub async fn compact_shared(&self) -> Result<Vec<MergedFiles>> {
        let mut out = Vec::new();
        for t in self.store.tables.all() {
            let def = t.def();
            for (key, small) in self.compaction_candidates(&t) {
                let file = self.merge_files(&t, key, &small, "merged").await?;
                out.push(MergedFiles {
                    table_id: def.id,
                    partition: key,
                    replaced: small.into_iter().map(|f| f.path).collect(),
                    file,
                });
            }
        }
        Ok(out)
    }

    /// Removes the files a change would have added, when it was refused.
    pub async fn discard_files(&self, change: &FileChange) {
        let paths = change.new_paths();
        self.store.hot.remove(&paths);
        if let Err(e) = self.store.storage.delete(&paths).await {
            tracing::warn!(error = %e, "could not remove files whose commit failed");
        }
    }

    /// After a merge committed: the files it replaced are deleted from the shared store once
    /// queries on any node that may still read them are done. Called on the node that
    /// merged them only.
    pub fn retire_replaced(&self, change: &FileChange) {
        match change {
            FileChange::Merged(merged) => {
                self.retire(merged.iter().flat_map(|m| m.replaced.clone()).collect())
            }
            FileChange::Expired(expired) => {
                self.retire(expired.iter().flat_map(|e| e.files.clone()).collect())
            }
            FileChange::Flushed(_) => {}
        }
    }

    /// How long a file on the shared store that no live table names is kept, and how often
    /// the metadata group's leader looks for such files (a quarter of that, at least every
    /// retention interval).
    pub fn orphan_grace(&self) -> (Duration, Duration) {
        let grace = sluice_conf::Config::duration(&self.config.retention.orphan_grace);
        (grace, (grace / 4).max(self.retention_every()))
    }

    /// Forgets which files were seen unnamed (this node no longer leads the metadata
    /// group: a later look starts afresh).
    pub fn forget_orphans(&self) {
        self.orphans.lock().clear();
    }

    /// On the metadata group's leader: deletes the files on the shared store that no live
    /// table's manifest names (a dropped table's, a flush or merge whose commit failed or
    /// never came). A file goes once it is older than the grace (no write still on its way
    /// to a commit loses its file) and was seen unnamed by an earlier look at least a
    /// minute before (or the grace, if shorter), so that queries on any node that planned
    /// it are done. Returns how many were deleted.
    pub async fn collect_shared_orphans(&self) -> Result<usize> {
        let (grace, _) = self.orphan_grace();
        let listed = self.store.storage.list_aged("tables").await?;
        let unnamed: Vec<String> = {
            let m = self.manifest.lock().await;
            let live: std::collections::HashSet<&str> = (m.tables.iter())
                .filter(|(id, _)| self.store.tables.get(**id).is_some())
                .flat_map(|(_, t)| t.values())
                .flat_map(|p| p.files.iter().map(|f| f.path.as_str()))
                .collect();
            (listed.into_iter())
                .filter(|(path, age)| {
                    *age >= grace && !live.contains(path.strip_suffix(".groups").unwrap_or(path))
                })
                .map(|(path, _)| path)
                .collect()
        };
        let due: Vec<String> = {
            let mut seen = self.orphans.lock();
            let now = Instant::now();
            let mut next = std::collections::HashMap::with_capacity(unnamed.len());
            for path in unnamed {
                let since = seen.get(&path).copied().unwrap_or(now);
                next.insert(path, since);
            }
            *seen = next;
            let settle = grace.min(super::maintenance::GRAVE_TIME);
            (seen.iter())
                .filter(|(_, since)| since.elapsed() >= settle)
                .map(|(path, _)| path.clone())
                .collect()
        };
        if due.is_empty() {
            return Ok(0);
        }
        self.store.hot.remove(&due);
        self.store.storage.delete(&due).await?;
        let mut seen = self.orphans.lock();
        for path in &due {
            seen.remove(path);
        }
        tracing::info!(
            files = due.len(),
            "removed files on the shared store that no live table names"
        );
        Ok(due.len())
    }

    /// How often the metadata group's leader looks for expired partitions.
    pub fn retention_every(&self) -> Duration {
        sluice_conf::Config::duration(&self.config.retention.interval)
    }

    /// The partitions whose newest row is older than their table's TTL (on the metadata
    /// group's leader, as this node sees them): their files, and per shard the last log
    /// index of the rows this node holds in them.
    pub fn expired_shared(&self) -> Vec<ExpiredPartition> {
        let now = super::now_micros();
        let mut out = Vec::new();
        for t in self.store.tables.all() {
            let def = t.def();
            let Some(ttl) = def.ttl_secs else {
                continue;
            };
            let cutoff = now - (ttl as i64).saturating_mul(1_000_000);
            for (key, p) in t.parts.read().iter() {
                if p.time_range().is_none_or(|(_, hi)| hi >= cutoff) {
                    continue;
                }
                let through = (p.shards.iter())
                    .map(|(s, r)| (*s, r.buffer.max_lsn.max(r.flushed)))
                    .collect();
                out.push(ExpiredPartition {
                    table_id: def.id,
                    partition: *key,
                    through,
                    files: p.files.iter().map(|f| f.path.clone()).collect(),
                });
            }
        }
        out
    }

    /// Installs a file change committed at `raft_index` of the metadata group, and returns
    /// whether it fitted; the same decision is taken on every node. An index already
    /// installed is skipped (`Ok(true)`). Called from the metadata group's apply (a runtime
    /// worker thread).
    ///
    /// Flushed files: each joins its partition and the rows it holds leave the buffers, in
    /// one step, so a query sees each row once. All or none: if any file's rows were
    /// meanwhile persisted by another (a former leader of the shard), none is installed.
    ///
    /// Merged files: each replaces the files it merged, if they are all still live (none was
    /// merged or dropped meanwhile); all or none.
    pub fn install_file_change(&self, raft_index: u64, change: &FileChange) -> Result<bool> {
        let handle = tokio::runtime::Handle::current();
        tokio::task::block_in_place(|| handle.block_on(self.install_at(raft_index, change)))
    }

    async fn install_at(&self, raft_index: u64, change: &FileChange) -> Result<bool> {
        let mut m = self.manifest.lock().await;
        if raft_index <= m.raft_index {
            return Ok(true);
        }
        // Files of tables dropped meanwhile are left out (and do not block the rest).
        let live = |table_id: u64| self.store.tables.get(table_id);
        let fits = match change {
            // ... and it folds the rows into every rollup the table has now (one made
            // since the leader wrote it: the leader writes it again).
            FileChange::Flushed(files) => files.iter().all(|f| {
                let cat = self.store.catalog.snapshot();
                let rollups = cat.rollups_of(f.table_id);
                let rolled = rollups.iter().all(|(id, _)| f.rolled.contains(id));
                rolled
                    && live(f.table_id).is_none_or(|t| {
                        let parts = t.parts.read();
                        let shard = parts.get(&f.partition).and_then(|p| p.shards.get(&f.shard));
                        shard.map_or(0, |r| r.flushed) == f.after
                    })
            }),
            FileChange::Merged(merged) => merged.iter().all(|f| {
                live(f.table_id).is_none_or(|t| {
                    let parts = t.parts.read();
                    let files = parts.get(&f.partition).map_or(&[][..], |p| &p.files[..]);
                    (f.replaced.iter()).all(|r| files.iter().any(|x| x.path == *r))
                })
            }),
            // The partition's files are still those the leader saw (a flush or merge
            // installed since: the leader looks again later).
            FileChange::Expired(expired) => expired.iter().all(|e| {
                live(e.table_id).is_none_or(|t| {
                    let parts = t.parts.read();
                    let files = parts.get(&e.partition).map_or(&[][..], |p| &p.files[..]);
                    files.len() == e.files.len() && files.iter().all(|x| e.files.contains(&x.path))
                })
            }),
        };
        let expired: Vec<&ExpiredPartition> = match change {
            FileChange::Expired(e) if fits => {
                e.iter().filter(|e| live(e.table_id).is_some()).collect()
            }
            _ => Vec::new(),
        };
        let (flushed, merged): (Vec<&ShardFile>, Vec<&MergedFiles>) = match change {
            _ if !fits => Default::default(),
            FileChange::Flushed(f) => (
                f.iter().filter(|f| live(f.table_id).is_some()).collect(),
                vec![],
            ),
            FileChange::Merged(m) => (
                vec![],
                m.iter().filter(|f| live(f.table_id).is_some()).collect(),
            ),
            FileChange::Expired(_) => Default::default(),
        };
        self.change_manifest(&mut m, |next| {
            next.raft_index = raft_index;
            for f in &flushed {
                let pm = next.partition(f.table_id, f.partition);
                pm.files.push(f.file.clone());
                pm.shards.insert(f.shard, f.through);
                for r in f.rollup_files.iter().filter(|r| live(r.table_id).is_some()) {
                    next.partition(r.table_id, r.partition)
                        .files
                        .push(r.file.clone());
                }
            }
            for f in &merged {
                let pm = next.partition(f.table_id, f.partition);
                pm.files.retain(|x| !f.replaced.contains(&x.path));
                pm.files.push(f.file.clone());
            }
            for e in &expired {
                let pm = next.partition(e.table_id, e.partition);
                pm.files.clear();
                for (s, through) in &e.through {
                    let at = pm.shards.entry(*s).or_default();
                    *at = (*at).max(*through);
                }
            }
        })
        .await?;
        for e in expired {
            let Some(t) = live(e.table_id) else { continue };
            let mut parts = t.parts.write();
            let p = t.partition_mut(&mut parts, e.partition);
            p.files.clear();
            let mut released = 0;
            for (s, through) in &e.through {
                released += t.shard_rows(p, *s).persisted(*through);
            }
            drop(parts);
            self.store.tables.release(released);
            self.store.hot.remove(&e.files);
            t.rows_removed();
            tracing::info!(
                table = t.def().name,
                partition = e.partition,
                files = e.files.len(),
                "partition expired"
            );
        }
        for f in flushed {
            let Some(t) = live(f.table_id) else { continue };
            let mut parts = t.parts.write();
            // Under the source's lock, as a rollup's query reads both.
            for r in &f.rollup_files {
                let Some(rt) = live(r.table_id) else { continue };
                let mut rparts = rt.parts.write();
                rt.partition_mut(&mut rparts, r.partition)
                    .files
                    .push(r.file.clone());
            }
            let p = t.partition_mut(&mut parts, f.partition);
            p.files.push(f.file.clone());
            let released = t.shard_rows(p, f.shard).persisted(f.through);
            drop(parts);
            self.store.tables.release(released);
            t.changed();
            self.flushes.fetch_add(1, Ordering::Relaxed);
        }
        for f in merged {
            let Some(t) = live(f.table_id) else { continue };
            if let Some(p) = t.parts.write().get_mut(&f.partition) {
                p.files.retain(|x| !f.replaced.contains(&x.path));
                p.files.push(f.file.clone());
            }
            self.store.hot.remove(&f.replaced);
            t.changed();
            tracing::info!(
                table = t.def().name,
                partition = f.partition,
                files = f.replaced.len(),
                rows = f.file.rows,
                "merged files installed"
            );
        }
        // Last: a node that waited for this index reads these files and flushed indexes.
        self.manifest_index.send_replace(raft_index);
        Ok(fits)
    }

    /// The metadata group's log index of the last file change installed here.
    pub fn manifest_index(&self) -> u64 {
        *self.manifest_index.borrow()
    }

    /// The last log index of `shard` whose rows are all in installed files, as far as this
    /// node's buffers tell (`None`: every entry applied here is).
    pub fn shard_persisted_through(&self, shard: u32) -> Option<u64> {
        self.store.tables.shard_persisted_through(shard)
    }

    /// Takes a shard's snapshot: every entry up to `through` is in files the metadata group
    /// had installed by its index `manifest_index`. Waits (up to 30 s) for this node's
    /// metadata group to get there, then drops the shard's buffered rows up to `through`.
    pub fn restore_shard(&self, shard: u32, through: u64, manifest_index: u64) -> Result<()> {
        let started = Instant::now();
        while self.manifest_index() < manifest_index {
            if started.elapsed() > CATALOG_WAIT {
                return Err(Error::Replication {
                    reason: format!(
                        "shard {shard}'s snapshot needs the metadata group's entry \
                         {manifest_index}, not applied here after {} s",
                        CATALOG_WAIT.as_secs()
                    ),
                });
            }
            pause();
        }
        self.store.tables.drop_shard_through(shard, through);
        Ok(())
    }

    /// Drops every buffered row of `shard`: this node's replica of it left (the shard's
    /// files stay, and its rows are on its other replicas).
    pub fn forget_shard(&self, shard: u32) {
        self.store.tables.drop_shard_through(shard, u64::MAX);
    }

    /// Answers another node's query for this node's replica of a shard (after its read
    /// barrier): the shard's buffered rows of the table and partitions `request` names, as
    /// [`crate::store::remote::RowsAnswer::encode`] writes them. Blocks while this node's
    /// catalog does not know the table yet (run it off the runtime's threads).
    pub fn shard_rows(&self, request: &crate::store::remote::RowsRequest) -> Result<Vec<u8>> {
        let table = self.table_asked(request.table_id)?;
        if request.latest {
            let reader = self.store.reader().ok_or_else(|| Error::Replication {
                reason: "not a cluster node".into(),
            })?;
            let index = self.manifest_index();
            return match crate::store::remote::serve_latest(&table, request, &**reader, index) {
                Ok(answer) => answer.encode(&table.schema()),
                Err(fill) => {
                    if let Some(generation) = fill {
                        let def = table.def();
                        let task = self.background_task(&def.database)?;
                        let t = crate::query::provider::SluiceTable::new(table, self.store.clone());
                        tokio::spawn(crate::query::latest::fill(Arc::new(t), generation, task));
                    }
                    Err(Error::Replication {
                        reason: "this replica's last-value cache is not complete".into(),
                    })
                }
            };
        }
        let answer = crate::store::remote::serve(&table, request, || self.manifest_index())?;
        answer.encode(&table.schema())
    }

    /// The shards' buffered rows this node holds changed (a replica caught up): the
    /// last-value caches, kept while it held only some of them, start over.
    pub fn shards_changed(&self) {
        for t in self.store.tables.all() {
            t.rows_removed();
        }
    }

    /// Installs a catalog change committed at `raft_index` of the metadata group, bringing
    /// the live table states and the alerts in line with it. `Ok(false)`: already installed.
    pub fn install_catalog(&self, raft_index: u64, next: &[u8]) -> Result<bool> {
        if !self.store.catalog.install(raft_index, next)? {
            return Ok(false);
        }
        self.follow_catalog();
        Ok(true)
    }

    /// Brings the live table states and the alerts in line with the catalog.
    pub(super) fn follow_catalog(&self) {
        let cat = self.store.catalog.snapshot();
        let mut live: std::collections::HashSet<u64> = std::collections::HashSet::new();
        for def in cat.tables() {
            live.insert(def.id);
            match self.store.tables.get(def.id) {
                None => {
                    (self.store.tables.by_id.write())
                        .insert(def.id, Arc::new(TableState::new(def.clone())));
                }
                Some(t) if t.def() != *def => t.alter(def.clone()),
                Some(_) => {}
            }
        }
        for t in self.store.tables.all() {
            let id = t.def().id;
            if !live.contains(&id) {
                self.store.tables.remove(id);
            }
        }
        self.alerts.sync(cat.alerts.values());
    }
}
