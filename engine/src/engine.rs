//! The engine: opens the catalog, the manifest and the log, replays, and then serves writes
//! (decode -> log -> apply -> ack) and SQL, while a background task persists buffers,
//! compacts files and applies retention. On a cluster node the log is the cluster's
//! ([`Engine::join_cluster`]) and `engine/replicated.rs` holds the cluster-facing half.

use crate::alerts::{AlertDef, AlertSink, Alerts};
use crate::error::{Error, Result};
use crate::ingest::decode::{Format, decode_message};
use crate::ingest::origin::{Origin, Origins};
use crate::log::WriteLog;
use crate::log::wal::record::WriteRecord;
use crate::log::wal::{self, Journal, Wal};
use crate::ports::{DeadLetter, IngestPort, Logins, Publication, QueryPort, WriteReceipt};
use crate::store::Store;
use crate::store::catalog::{Catalog, TableDef};
use crate::store::state::{TableState, Tables};
use crate::store::storage::{Manifest, Storage};
use async_trait::async_trait;
use sluice_conf::Config;
use std::sync::Arc;
use std::time::Instant;
use tokio_util::sync::CancellationToken;

/// How long a write waits for flushes to make room in full buffers before it is refused.
const BUFFERS_FULL_WAIT: std::time::Duration = std::time::Duration::from_secs(10);
/// How many writes may wait for room in full buffers at a time; more are refused at once.
const ROOM_WAITERS: usize = 64;

mod maintenance;
mod meta_state;
mod query_port;
mod read_ahead;
mod replicated;
mod rollups;

pub use replicated::{ExpiredPartition, FileChange, MergedFiles, RollupFile, ShardFile};

/// The engine. Cheap to share behind an `Arc`.
pub struct Engine {
    pub(crate) config: Config,
    pub(crate) store: Arc<Store>,
    /// The local write-ahead log (a single node's [`WriteLog`]; unused in a cluster).
    pub(crate) wal: Arc<Wal>,
    /// Where writes become durable: `wal` on a single node, the shard groups in a cluster
    /// (set by [`Engine::join_cluster`]).
    pub(crate) log: std::sync::OnceLock<Arc<dyn WriteLog>>,
    pub(crate) planner: crate::query::planner::Planner,
    /// The current manifest; its lock also serialises flush, compaction, retention and DDL
    /// that touches files.
    pub(crate) manifest: tokio::sync::Mutex<Manifest>,
    /// Files replaced by compaction, deleted once queries that may read them are done.
    pub(crate) graveyard: parking_lot::Mutex<Vec<(Instant, Vec<String>)>>,
    /// In a cluster: files on the shared store no live table names, since when seen so.
    pub(crate) orphans: parking_lot::Mutex<std::collections::HashMap<String, Instant>>,
    /// The alerts' states; the catalog holds their definitions.
    pub(crate) alerts: Arc<Alerts>,
    /// Users, roles, grants and rules: who may do what.
    pub(crate) access: crate::access::Access,
    /// Buffers written to Parquet since start.
    pub(crate) flushes: std::sync::atomic::AtomicU64,
    /// Rows applied from the shard logs this node replicates (a cluster node).
    pub(crate) shard_rows_applied: std::sync::atomic::AtomicU64,
    /// Cluster queries whose read barrier, taken alongside them, found this node up to
    /// date (`reads_ahead`) or behind, so that they ran again after it (`reads_again`).
    pub(crate) reads_ahead: std::sync::atomic::AtomicU64,
    pub(crate) reads_again: std::sync::atomic::AtomicU64,
    /// When a query that ran ahead last found this node behind (`read_ahead::steady_micros`;
    /// 0: never).
    pub(crate) read_behind_at: std::sync::atomic::AtomicI64,
    /// Where the manifest is kept: the file store itself on a single node; the node's own
    /// data directory in a cluster (the files are on the shared store, each node's copy of
    /// the manifest is its own).
    pub(crate) manifests: Storage,
    /// The manifest's `raft_index` (in a cluster), readable without its lock.
    pub(crate) manifest_index: tokio::sync::watch::Sender<u64>,
    /// Journal records found by the WAL replay at start, until the broker takes them.
    pub(crate) journal_replay: parking_lot::Mutex<Vec<(u64, Vec<u8>)>>,
    /// The first LSN the journal's owner still needs: WAL truncation keeps it.
    pub(crate) journal_floor: std::sync::atomic::AtomicU64,
    /// What Sparkplug B edge nodes announced, and which are online.
    pub(crate) sparkplug: Arc<crate::ingest::sparkplug::Sparkplug>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("data_dir", &self.config.data_dir)
            .finish()
    }
}

/// Now, in microseconds since the Unix epoch (0 if the clock is before it).
pub fn now_micros() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros() as i64)
        .unwrap_or(0)
}

impl Engine {
    /// Opens (or creates) the data directory, recovers, and starts the log.
    pub async fn open(config: Config) -> Result<Arc<Self>> {
        let dir = config.data_dir.clone();
        std::fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
        let catalog = Catalog::open(&dir)?;
        let (storage, manifests) = match &config.cluster {
            Some(c) => {
                let shared_store = sluice_conf::StorageConfig {
                    url: c.shared_store.clone(),
                    ..config.storage.clone()
                };
                let local = sluice_conf::StorageConfig {
                    url: String::new(),
                    ..config.storage.clone()
                };
                (
                    Storage::open(&shared_store, &dir)?,
                    Storage::open(&local, &dir)?,
                )
            }
            None => {
                let s = Storage::open(&config.storage, &dir)?;
                (s.clone(), s)
            }
        };
        let mut manifest = manifests.load_manifest().await?;
        let cat = catalog.snapshot();
        let tables = Arc::new(Tables::default());
        // Files of tables dropped before a crash finished deleting them.
        let known: std::collections::HashSet<u64> = cat.tables().map(|t| t.id).collect();
        let dropped: Vec<u64> = manifest
            .tables
            .keys()
            .filter(|id| !known.contains(id))
            .copied()
            .collect();
        let mut max_flushed = 0;
        for def in cat.tables() {
            let state = TableState::new(def.clone());
            {
                let mut parts = state.parts.write();
                for (key, pm) in manifest.tables.get(&def.id).into_iter().flatten() {
                    let p = state.partition_mut(&mut parts, *key);
                    p.files = pm.files.clone();
                    p.flushed_lsn = pm.flushed_lsn;
                    for (shard, through) in &pm.shards {
                        state.shard_rows(p, *shard).flushed = *through;
                    }
                    max_flushed = max_flushed.max(pm.flushed_lsn);
                }
            }
            tables.by_id.write().insert(def.id, Arc::new(state));
        }
        if !dropped.is_empty() {
            for id in &dropped {
                manifest.tables.remove(id);
            }
            manifests.save_manifest(&mut manifest).await?;
        }
        // Parquet files the manifest does not name: a flush or compaction cut short. Not in
        // a cluster: the shared store holds every node's files.
        let live: std::collections::HashSet<&str> = manifest
            .tables
            .values()
            .flat_map(|t| t.values())
            .flat_map(|p| p.files.iter().map(|f| f.path.as_str()))
            .collect();
        let orphans: Vec<String> = match config.cluster {
            None => (storage.list("tables").await?.into_iter())
                .filter(|p| !live.contains(p.strip_suffix(".groups").unwrap_or(p)))
                .collect(),
            // The shared store holds every node's files: none is this node's to remove.
            Some(_) => Vec::new(),
        };
        if !orphans.is_empty() {
            tracing::info!(files = orphans.len(), "removing files no manifest names");
            storage.delete(&orphans).await?;
        }

        let wal_dir = dir.join("wal");
        let sink = Arc::new(BufferSink {
            tables: tables.clone(),
            origins: Arc::new(Origins::open(&dir)?),
        });
        let replay = sink.clone();
        let started = Instant::now();
        let (report, journal) = tokio::task::spawn_blocking(move || {
            let mut journal = Vec::new();
            let report = wal::replay(
                &wal_dir,
                |lsn, rec| crate::log::wal::RecordSink::apply(&*replay, lsn, rec),
                |lsn, bytes| journal.push((lsn, bytes.to_vec())),
            )?;
            Ok::<_, Error>((report, journal))
        })
        .await
        .map_err(|e| Error::io("wal replay", std::io::Error::other(e)))??;
        tracing::info!(
            records = report.records,
            next_lsn = report.next_lsn,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "WAL replayed"
        );
        let next_lsn = report.next_lsn.max(max_flushed + 1);
        let wal = Arc::new(Wal::start(
            &dir.join("wal"),
            &config.wal,
            next_lsn,
            config.http.max_pending_writes,
            sink.clone(),
        )?);
        let log = std::sync::OnceLock::new();
        if config.cluster.is_none() {
            let local: Arc<dyn WriteLog> = wal.clone();
            let _ = log.set(local);
        }

        let store = Arc::new(Store {
            catalog,
            tables,
            storage,
            dead_letters: crate::ingest::dead_letter::DeadLetters::open(&dir)?,
            hot: crate::store::hot::HotCache::new(
                config.query.hot_cache_bytes.bytes().unwrap_or(0),
            ),
            origins: sink.origins.clone(),
            extra_system: Default::default(),
            reader: Default::default(),
            remote_rows: Default::default(),
            remote_aggregated: Default::default(),
            queries: Default::default(),
        });
        let alerts = Arc::new(Alerts::open(&dir));
        alerts.sync(cat.alerts.values());
        let rows = Arc::downgrade(&alerts);
        store.extra_system.write().insert(
            "alerts".into(),
            crate::ports::SystemRows(Arc::new(move || {
                rows.upgrade().unwrap_or_default().system_table()
            })),
        );
        let sparkplug = Arc::new(crate::ingest::sparkplug::Sparkplug::default());
        let rows = Arc::downgrade(&sparkplug);
        store.extra_system.write().insert(
            "sparkplug_nodes".into(),
            crate::ports::SystemRows(Arc::new(move || {
                rows.upgrade().unwrap_or_default().system_table()
            })),
        );
        let manifest_index = manifest.raft_index;
        let journal_floor = journal.first().map_or(u64::MAX, |(lsn, _)| *lsn);
        let access = crate::access::Access::new(&config.user, &config.acl)?;
        Ok(Arc::new(Self {
            access,
            config,
            store,
            wal,
            log,
            planner: crate::query::planner::Planner::default(),
            manifest: tokio::sync::Mutex::new(manifest),
            graveyard: parking_lot::Mutex::new(Vec::new()),
            orphans: Default::default(),
            alerts,
            flushes: Default::default(),
            shard_rows_applied: Default::default(),
            reads_ahead: Default::default(),
            reads_again: Default::default(),
            read_behind_at: Default::default(),
            manifests,
            manifest_index: tokio::sync::watch::Sender::new(manifest_index),
            journal_replay: parking_lot::Mutex::new(journal),
            // Until the broker says what it still needs, every journal record is kept.
            journal_floor: journal_floor.into(),
            sparkplug,
        }))
    }

    /// Evaluates the alerts until `cancel` fires, telling `sink` (the broker) of changes.
    pub fn start_alerts(
        self: &Arc<Self>,
        sink: Arc<dyn AlertSink>,
        cancel: CancellationToken,
    ) -> tokio::task::JoinHandle<()> {
        let db: Arc<dyn QueryPort> = self.clone();
        tokio::spawn(self.alerts.clone().run(db, sink, cancel))
    }

    /// Makes an alert after checking that its query plans.
    pub async fn create_alert(&self, def: AlertDef, if_not_exists: bool) -> Result<()> {
        def.validate()?;
        if self.store.catalog.snapshot().alerts.contains_key(&def.name) {
            return if if_not_exists {
                Ok(())
            } else {
                Err(Error::AlreadyExists {
                    what: "alert",
                    name: def.name,
                })
            };
        }
        if def.webhook.is_some() {
            let what = crate::access::Need::Admin("make alerts that call webhooks");
            self.authorize(def.owner.as_deref(), what)?;
        }
        // Planned with its creator's rights: it may read only what its creator may.
        (self.check_query(&def.database, &def.query, def.owner.as_deref())).await?;
        let name = def.name.clone();
        // Checked again under the catalog's lock: another CREATE may have won meanwhile.
        let created = self.store.catalog.change(|d| {
            if d.alerts.contains_key(&name) {
                return if if_not_exists {
                    Ok(false)
                } else {
                    Err(Error::AlreadyExists {
                        what: "alert",
                        name: name.clone(),
                    })
                };
            }
            d.alerts.insert(name.clone(), def);
            Ok(true)
        })?;
        if !created {
            return Ok(());
        }
        tracing::info!(alert = %name, "alert created");
        // From the newest catalog, so concurrent changes cannot leave an older set running.
        self.alerts
            .sync(self.store.catalog.snapshot().alerts.values());
        Ok(())
    }

    /// Removes an alert.
    pub fn drop_alert(&self, name: &str, if_exists: bool, user: Option<&str>) -> Result<()> {
        let dropped = self.store.catalog.change(|d| match d.alerts.get(name) {
            // A plain user drops only its own alerts.
            Some(a) if a.owner.as_deref() != user && !self.is_admin(user) => {
                let what = crate::access::Need::Admin("drop other users' alerts");
                self.authorize(user, what).map(|_| false)
            }
            Some(_) => Ok(d.alerts.remove(name).is_some()),
            None if if_exists => Ok(false),
            None => Err(Error::UnknownAlert { name: name.into() }),
        })?;
        if dropped {
            tracing::info!(alert = %name, "alert dropped");
            self.alerts
                .sync(self.store.catalog.snapshot().alerts.values());
        }
        Ok(())
    }

    /// Runs flushing, compaction and retention until `cancel` fires.
    pub fn spawn_background(
        self: &Arc<Self>,
        cancel: CancellationToken,
    ) -> tokio::task::JoinHandle<()> {
        let engine = self.clone();
        tokio::spawn(async move { engine.background(cancel).await })
    }

    /// Stops accepting writes, waits for every queued write to be durable and applied, and
    /// persists all buffers so the next start replays nothing.
    pub async fn shutdown(&self) -> Result<()> {
        self.wal.close();
        self.store.tables.close();
        if self.clustered() {
            // The raft logs keep the rows; the buffers are rebuilt from them at start.
            return Ok(());
        }
        self.flush_all().await?;
        self.bury(true).await;
        Ok(())
    }

    /// The table definition for `database.table`.
    pub fn table(&self, database: &str, table: &str) -> Result<Arc<TableDef>> {
        self.store
            .catalog
            .snapshot()
            .table(database, table)
            .cloned()
    }

    /// [`Engine::table`] for a write: on a cluster, a table (or database) this node does not
    /// know is looked up again after the catalog's barrier ([`WriteLog::catalog_barrier`]),
    /// since the metadata group may not have brought another node's `CREATE` here yet; a
    /// message to it must not be taken for one to a missing table and go unstored.
    pub async fn table_to_write(&self, database: &str, table: &str) -> Result<Arc<TableDef>> {
        match self.table(database, table) {
            Err(Error::UnknownTable { .. } | Error::UnknownDatabase { .. }) if self.clustered() => {
                if let Some(log) = self.log.get() {
                    log.catalog_barrier().await?;
                }
                self.table(database, table)
            }
            found => found,
        }
    }

    /// Appends already-decoded rows for a table (what [`QueryPort::write`] does after
    /// decoding); `overloaded` when the log's queue is full.
    pub async fn append_rows(
        &self,
        def: &TableDef,
        rows: Vec<Vec<crate::types::Value>>,
    ) -> Result<WriteReceipt> {
        self.append(def, rows, false, None).await
    }

    pub(crate) async fn append(
        &self,
        def: &TableDef,
        rows: Vec<Vec<crate::types::Value>>,
        wait: bool,
        origin: Option<Origin>,
    ) -> Result<WriteReceipt> {
        self.append_journaled(def, rows, wait, origin, Vec::new())
            .await
    }

    /// [`Engine::append`] with journal records logged in the same group, after the rows.
    pub(crate) async fn append_journaled(
        &self,
        def: &TableDef,
        rows: Vec<Vec<crate::types::Value>>,
        wait: bool,
        origin: Option<Origin>,
        journal: Vec<Journal>,
    ) -> Result<WriteReceipt> {
        self.room_in_buffers().await?;
        let n = rows.len();
        let record = write_record(def, rows, origin);
        let lsn = self.log_records(def, vec![record], wait, journal).await?;
        Ok(WriteReceipt {
            rows: n,
            lsn: lsn.unwrap_or(0),
        })
    }

    /// The one place writes go to the log ([`WriteLog::append`]): the local WAL, or the
    /// shard groups once a cluster node has joined its cluster (refused before that).
    /// Journal records go into the same group commit on the local WAL; on a cluster node
    /// they go to its local WAL once the rows are committed.
    async fn log_records(
        &self,
        def: &TableDef,
        records: Vec<Arc<WriteRecord>>,
        wait: bool,
        journal: Vec<Journal>,
    ) -> Result<Option<u64>> {
        if self.store.catalog.is_rollup(def.id) {
            return Err(Error::invalid(format!(
                "'{}' is a rollup: its rows come from its source table",
                def.name
            )));
        }
        let log = self.log.get().ok_or_else(|| Error::Replication {
            reason: "this node has not joined its cluster yet".into(),
        })?;
        if journal.is_empty() {
            return log.append(def, records, wait).await;
        }
        if !self.clustered() {
            return self
                .wal
                .append_entries(records, journal, wait)
                .await
                .map(Some);
        }
        // A cluster node keeps its broker's journal in its own local WAL, which holds no
        // rows there: the records follow the rows, each durable before the caller goes on.
        let lsn = log.append(def, records, wait).await?;
        self.wal.append_entries(Vec::new(), journal, wait).await?;
        Ok(lsn)
    }

    /// Holds writes back while the buffers hold twice their budget (flushing has fallen
    /// behind): a write waits for flushes to make room, up to `BUFFERS_FULL_WAIT`, and is
    /// refused after that (the store or disk is failing, or the load outruns them for long).
    /// Once a wait ran out, writes are refused at once until there is room again, and at
    /// most `ROOM_WAITERS` writes wait at a time (each holds its decoded rows meanwhile).
    async fn room_in_buffers(&self) -> Result<()> {
        let limit = 2 * self.config.buffer.total_max_bytes as u64;
        let tables = &self.store.tables;
        let bytes = tables.buffered_bytes();
        if bytes <= limit {
            return Ok(());
        }
        let bytes = match tables.room_waiter(ROOM_WAITERS) {
            Some(_place) => {
                let deadline = tokio::time::Instant::now() + BUFFERS_FULL_WAIT;
                tables.wait_below(limit, deadline).await
            }
            None => bytes,
        };
        if tables.closing() {
            return Err(Error::ShuttingDown);
        }
        match bytes > limit {
            true => Err(Error::BuffersFull { bytes, limit }),
            false => Ok(()),
        }
    }
}

/// The log record of `rows` for table `def`.
fn write_record(
    def: &TableDef,
    rows: Vec<Vec<crate::types::Value>>,
    origin: Option<Origin>,
) -> Arc<WriteRecord> {
    Arc::new(WriteRecord {
        table_id: def.id,
        ncols: def.columns.len(),
        rows,
        origin,
    })
}

/// The apply step, live and on replay: a bridged message's origin is remembered, its rows go
/// to the buffers.
struct BufferSink {
    tables: Arc<Tables>,
    origins: Arc<Origins>,
}

impl crate::log::wal::RecordSink for BufferSink {
    fn apply(&self, lsn: u64, record: &WriteRecord) {
        if let Some(o) = &record.origin {
            self.origins.remember(lsn, o);
        }
        self.tables.apply(lsn, record);
    }
}

/// Column indexes for values captured from a topic; a name the table lacks is a bad row.
fn fixed_columns(def: &TableDef, fixed: &[(String, String)]) -> Result<Vec<(usize, String)>> {
    fixed
        .iter()
        .map(|(name, text)| {
            let i = def.column_index(name).ok_or_else(|| Error::BadRow {
                line: 1,
                column: name.clone(),
                reason: format!(
                    "the topic names a column {}.{} lacks",
                    def.database, def.name
                ),
            })?;
            Ok((i, text.clone()))
        })
        .collect()
}

#[async_trait]
impl IngestPort for Engine {
    async fn latest_rows(
        &self,
        database: &str,
        table: &str,
    ) -> Result<Option<crate::ports::LatestRows>> {
        self.latest_rows_of(database, table).await
    }

    fn ask_rebirth(&self, group: &str, edge: &str) -> bool {
        self.sparkplug.ask_rebirth(group, edge)
    }

    async fn publish_journaled(
        &self,
        p: Publication<'_>,
        journal: Option<Journal>,
    ) -> Result<Option<WriteReceipt>> {
        // The rare paths' futures are boxed: inline, the largest would size every
        // message's future (Sparkplug's is several KiB).
        if p.format == Format::Sparkplug {
            return Box::pin(self.publish_sparkplug(p, journal)).await;
        }
        // Line protocol in an auto-create database: each measurement is a table, made and
        // widened as InfluxDB's write API does; the message is stored whole or refused.
        if p.auto_create && p.format == Format::LineProtocol && p.fixed.is_empty() {
            let text = std::str::from_utf8(p.payload)
                .map_err(|_| Error::invalid("line protocol must be UTF-8"))?;
            let w = Box::pin(self.write_line_protocol(None, p.database, text, 1, false)).await?;
            let lsn = match journal {
                Some(j) => self.journal(vec![j], true).await?,
                None => 0,
            };
            return Ok(Some(WriteReceipt { rows: w.rows, lsn }));
        }
        let def = match self.table_to_write(p.database, p.table).await {
            Ok(def) => def,
            Err(Error::UnknownTable { .. }) if p.auto_create && p.format == Format::Json => {
                self.table_for_json(p.database, p.table, p.payload).await?
            }
            Err(Error::UnknownTable { .. } | Error::UnknownDatabase { .. }) => {
                // No rows to store; the journal record is logged alone.
                if let Some(j) = journal {
                    self.journal(vec![j], true).await?;
                }
                return Ok(None);
            }
            Err(e) => return Err(e),
        };
        let fixed = fixed_columns(&def, p.fixed)?;
        let origin = p.origin.cloned();
        let now = now_micros();
        let rows = match decode_message(&def, p.format, p.payload, now, &fixed) {
            // A new field in an auto-created database widens the table, then decodes again.
            Err(Error::BadRow { .. }) if p.auto_create && p.format == Format::Json => {
                let def = self.table_for_json(p.database, p.table, p.payload).await?;
                let fixed = fixed_columns(&def, p.fixed)?;
                let rows = decode_message(&def, p.format, p.payload, now, &fixed)?;
                let journal = journal.into_iter().collect();
                return (self.append_journaled(&def, rows, true, origin, journal))
                    .await
                    .map(Some);
            }
            other => other?,
        };
        let journal = journal.into_iter().collect();
        (self.append_journaled(&def, rows, true, origin, journal))
            .await
            .map(Some)
    }

    fn journals(&self) -> bool {
        true
    }

    fn set_journal_tap(&self, tap: Arc<dyn crate::JournalTap>) {
        self.wal.set_tap(tap);
    }

    fn runs_singletons(&self) -> bool {
        match self.clustered() {
            false => true,
            true => self.log.get().is_some_and(|l| l.evaluates_alerts()),
        }
    }

    fn singletons_node(&self) -> Option<u64> {
        self.log.get().and_then(|l| l.singletons_node())
    }

    async fn journal(&self, entries: Vec<Journal>, wait: bool) -> Result<u64> {
        self.wal.append_entries(Vec::new(), entries, wait).await
    }

    fn take_journal(&self) -> Vec<(u64, Vec<u8>)> {
        std::mem::take(&mut *self.journal_replay.lock())
    }

    fn journal_checkpoint(&self, f: &mut dyn FnMut(u64)) {
        self.wal.checkpoint(f)
    }

    fn keep_journal_from(&self, lsn: u64) {
        (self.journal_floor).store(lsn, std::sync::atomic::Ordering::Release);
    }

    async fn publish_batch(&self, pubs: Vec<Publication<'_>>) -> Result<Vec<Option<WriteReceipt>>> {
        let mut out = vec![None; pubs.len()];
        if self.room_in_buffers().await.is_err() {
            return Ok(out);
        }
        let now = now_micros();
        let (mut records, mut slots) = (Vec::new(), Vec::new());
        let mut first_def: Option<Arc<TableDef>> = None;
        for (i, p) in pubs.iter().enumerate() {
            let Ok(def) = self.table(p.database, p.table) else {
                continue;
            };
            // In a cluster a batch goes to the shards of one table; other tables' messages
            // are stored alone by the caller.
            if self.clustered() && first_def.as_ref().is_some_and(|d| d.id != def.id) {
                continue;
            }
            first_def.get_or_insert_with(|| def.clone());
            let fixed = fixed_columns(&def, p.fixed);
            let Ok(rows) = fixed.and_then(|f| decode_message(&def, p.format, p.payload, now, &f))
            else {
                continue;
            };
            slots.push((i, rows.len()));
            records.push(write_record(&def, rows, p.origin.cloned()));
        }
        if records.is_empty() {
            return Ok(out);
        }
        let Some(def) = first_def else {
            return Ok(out);
        };
        let last = self.log_records(&def, records, true, Vec::new()).await?;
        // Consecutive positions on the local log; none where each shard counts its own.
        let first = last.map(|last| last + 1 - slots.len() as u64);
        for (n, (i, rows)) in slots.into_iter().enumerate() {
            let lsn = first.map_or(0, |f| f + n as u64);
            out[i] = Some(WriteReceipt { rows, lsn });
        }
        Ok(out)
    }

    async fn dead_letter(&self, letter: DeadLetter) -> Result<()> {
        self.store.dead_letters.add(letter).await
    }

    fn is_stored(&self, origin: &Origin) -> bool {
        self.store.origins.is_stored(origin)
    }

    fn api_bridges(&self) -> Option<crate::ApiBridges> {
        self.clustered()
            .then(|| self.store.catalog.snapshot().bridges.clone())
    }

    fn change_api_bridges(&self, change: &mut dyn FnMut(&mut crate::ApiBridges)) -> Result<()> {
        self.store.catalog.change(|d| {
            change(&mut d.bridges);
            Ok(())
        })
    }

    fn forget_origins(&self, source: &str) -> Result<()> {
        self.store.origins.forget(source)
    }

    fn add_system_table(&self, name: &str, rows: crate::ports::SystemRows) {
        self.store
            .extra_system
            .write()
            .insert(name.to_string(), rows);
    }

    fn relay(&self) -> Option<Arc<dyn crate::Relay>> {
        self.log.get().and_then(|l| l.relay())
    }
}
