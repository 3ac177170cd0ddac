//! DataFusion over the catalog: a catalog provider whose schemas are Sluice databases (plus
//! `system`), and a table provider per table that unions the table's Parquet files with its
//! in-memory buffers, skipping partitions that the filters rule out.

mod filters;
mod scan;

use filters::placed;
pub(crate) use filters::{KeyFilter, key_filter, row_filter};
use scan::ScanMetrics;
pub(crate) use scan::{Scan, ScanExec, write_elsewhere};

use crate::query::groups::Answer;
use crate::query::parts::PartsSpec;
use crate::query::synopsis::ColumnSynopsis;
use crate::store::Store;
use crate::store::catalog::{CatalogData, DEFAULT_DATABASE, SYSTEM_DATABASE, TableDef};
use crate::store::chunk::{Chunk, Pick, RowFilter};
use crate::store::remote::Remote;
use crate::store::state::{Partition, TableState};
use crate::store::storage::{FileMeta, Storage};
use crate::types::Value;
use async_trait::async_trait;
use datafusion::arrow::datatypes::{DataType, SchemaRef};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::catalog::{CatalogProvider, SchemaProvider, Session};
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{DFSchema, ScalarValue};
use datafusion::datasource::listing::PartitionedFile;
use datafusion::datasource::memory::MemorySourceConfig;
use datafusion::datasource::physical_plan::{FileGroup, FileScanConfigBuilder, ParquetSource};
use datafusion::datasource::source::DataSourceExec;
use datafusion::datasource::{MemTable, TableProvider, TableType};
use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::logical_expr::utils::{conjunction, split_binary, split_conjunction};
use datafusion::logical_expr::{BinaryExpr, Expr, Operator, TableProviderFilterPushDown};
use datafusion::physical_expr::EquivalenceProperties;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::metrics::{
    Count, ExecutionPlanMetricsSet, MetricBuilder, MetricsSet,
};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::union::UnionExec;
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, Partitioning, PlanProperties};
use futures::StreamExt;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

/// The `sluice` catalog: one schema per database, plus `system`.
#[derive(Debug)]
pub(crate) struct SluiceCatalog {
    /// Engine state.
    pub store: Arc<Store>,
}

impl CatalogProvider for SluiceCatalog {
    fn schema_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .store
            .catalog
            .snapshot()
            .databases
            .keys()
            .cloned()
            .collect();
        names.push(SYSTEM_DATABASE.into());
        names
    }

    fn schema(&self, name: &str) -> Option<Arc<dyn SchemaProvider>> {
        if name == SYSTEM_DATABASE {
            return Some(Arc::new(crate::query::system::SystemSchema {
                store: self.store.clone(),
            }));
        }
        self.store
            .catalog
            .snapshot()
            .databases
            .contains_key(name)
            .then(|| {
                Arc::new(DatabaseSchema {
                    store: self.store.clone(),
                    database: name.to_string(),
                }) as Arc<dyn SchemaProvider>
            })
    }
}

#[derive(Debug)]
struct DatabaseSchema {
    store: Arc<Store>,
    database: String,
}

#[async_trait]
impl SchemaProvider for DatabaseSchema {
    fn table_names(&self) -> Vec<String> {
        self.store
            .catalog
            .snapshot()
            .databases
            .get(&self.database)
            .map(|t| t.keys().cloned().collect())
            .unwrap_or_default()
    }

    async fn table(&self, name: &str) -> DfResult<Option<Arc<dyn TableProvider>>> {
        let cat = self.store.catalog.snapshot();
        let (name, parts) = PartsSpec::split_name(name);
        let Some(def) = resolve(&cat, &self.database, name) else {
            return Ok(None);
        };
        let Some(state) = self.store.tables.get(def.id) else {
            return Ok(None);
        };
        if let Some(rollup) = cat.rollups.get(&def.id) {
            let source = self.store.tables.get(rollup.source);
            let table = SluiceTable::new(state, self.store.clone());
            return source
                .map(|s| crate::query::rollup::view(table, s, rollup.clone()))
                .transpose();
        }
        Ok(Some(Arc::new(SluiceTable {
            schema: state.schema(),
            def: state.def(),
            state,
            store: self.store.clone(),
            parts,
        })))
    }

    fn table_exist(&self, name: &str) -> bool {
        let (name, _) = PartsSpec::split_name(name);
        resolve(&self.store.catalog.snapshot(), &self.database, name).is_some()
    }
}

/// The table an unqualified or qualified name means: `database.table`, else, when `database`
/// is the default one and lacks it, the one table of that name in any database (so OIDBS's
/// `FROM nyct_lite` finds `benchmark.nyct_lite`).
pub(crate) fn resolve<'a>(
    cat: &'a CatalogData,
    database: &str,
    table: &str,
) -> Option<&'a Arc<TableDef>> {
    if let Ok(def) = cat.table(database, table) {
        return Some(def);
    }
    if database != DEFAULT_DATABASE {
        return None;
    }
    let mut found = cat.databases.values().filter_map(|t| t.get(table));
    match (found.next(), found.next()) {
        (Some(def), None) => Some(def),
        _ => None,
    }
}

/// One table as DataFusion sees it.
#[derive(Debug, Clone)]
pub(crate) struct SluiceTable {
    def: Arc<TableDef>,
    schema: SchemaRef,
    state: Arc<TableState>,
    store: Arc<Store>,
    /// The `WHERE PARTS` list the query gave this reference.
    parts: Option<PartsSpec>,
}

tokio::task_local! {
    /// Set while a replica plans another node's partial aggregate
    /// (`crate::query::split`): its scans make no input when planned (they would read the
    /// table and warm its files for nothing).
    pub(crate) static FOR_A_REPLICA: ();
}

/// What a scan reads, taken under the partition lock.
#[derive(Debug, Default)]
pub(crate) struct ScanSet {
    /// Parquet files not in the hot cache: path and size.
    pub files: Vec<(String, u64)>,
    /// In-memory rows.
    pub batches: Vec<RecordBatch>,
    /// The flushed index of each (partition, shard) read, for the shards `remote` names.
    pub flushed: Cut,
    /// Files left to other nodes (`remote.files`) that the scan came across.
    pub skipped: usize,
}

/// The flushed index of each (partition, shard) a scan read.
pub(crate) type Cut = BTreeMap<(u64, u32), u64>;

/// Rows picked from indexed chunks, gathered into batches at the end.
#[derive(Default)]
pub(crate) struct Picker {
    picked: Vec<RecordBatch>,
    at: Vec<(usize, usize)>,
}

impl Picker {
    pub(crate) fn take(&mut self, pick: Pick, batches: &mut Vec<RecordBatch>) {
        match pick {
            Pick::Nothing => {}
            Pick::Whole(b) => batches.push(b),
            Pick::Rows(b, rows) => {
                (self.at).extend(rows.iter().map(|r| (self.picked.len(), *r as usize)));
                self.picked.push(b);
            }
        }
    }

    /// The picked rows into `batches`, in batches of a chunk's size: bounded copies, spread
    /// over the lanes.
    pub(crate) fn finish(self, batches: &mut Vec<RecordBatch>) -> DfResult<()> {
        for rows in self.at.chunks(crate::store::buffer::SEAL_ROWS) {
            batches.push(crate::store::chunk::gather(&self.picked, rows)?);
        }
        Ok(())
    }
}

impl SluiceTable {
    /// The whole table `state` (no `WHERE PARTS` list).
    pub(crate) fn new(state: Arc<TableState>, store: Arc<Store>) -> Self {
        Self {
            schema: state.schema(),
            def: state.def(),
            state,
            store,
            parts: None,
        }
    }

    /// The table's definition.
    pub(crate) fn def(&self) -> Arc<TableDef> {
        self.def.clone()
    }

    /// The table's live state.
    pub(crate) fn state(&self) -> &Arc<TableState> {
        &self.state
    }

    /// The engine's stores.
    pub(crate) fn store(&self) -> &Arc<Store> {
        &self.store
    }

    /// The partitions the time bounds of `filter` admit, as a `RowsRequest` names them;
    /// `None` when it has a bound the synopses cannot use.
    pub(crate) fn key_bounds(&self, filter: &RowFilter) -> Option<(u64, u64, Option<Vec<u64>>)> {
        Some(self.time_bounds(filter)?.2.request_bounds())
    }

    /// Whether this reference picks the newest partitions (`WHERE PARTS last n`).
    pub(crate) fn counts_newest(&self) -> bool {
        (self.parts.as_ref()).is_some_and(|p| {
            (p.items.iter()).any(|i| matches!(i, crate::query::parts::PartsItem::Last(_)))
        })
    }

    /// Whether this reference reads the whole table (no `WHERE PARTS` list).
    pub(crate) fn whole(&self) -> bool {
        self.parts.is_none()
    }

    /// The partitions that `filter` and the `WHERE PARTS` list admit.
    fn selected<'a>(
        &self,
        parts: &'a BTreeMap<u64, Partition>,
        filter: &KeyFilter,
    ) -> Vec<(u64, &'a Partition)> {
        let admits = self.admitted(parts, filter, &BTreeSet::new());
        in_range(parts, &admits)
    }

    /// Which partition keys `filter` and the `WHERE PARTS` list admit, among this node's
    /// partitions and `remote` (keys with rows only on other nodes: a `last n` counts them).
    fn admitted<'f>(
        &self,
        parts: &BTreeMap<u64, Partition>,
        filter: &'f KeyFilter,
        remote: &BTreeSet<u64>,
    ) -> Admitted<'f> {
        let selector = self.parts.as_ref().map(|spec| {
            let local = parts.iter().filter(|(_, p)| p.rows() > 0).map(|(k, _)| *k);
            let mut keys: BTreeSet<u64> = local.collect();
            keys.extend(remote);
            spec.selector(keys.into_iter())
        });
        Admitted { filter, selector }
    }

    /// Collects the files and buffered rows of the partitions that `filter` admits.
    /// In-memory rows (hot files and buffers) are narrowed by `rows`: chunks that cannot
    /// match are skipped, indexed ones give only their matching rows.
    /// In-memory rows come with the columns of `projection` only.
    pub(crate) fn scan_set(
        &self,
        filter: &KeyFilter,
        rows: &RowFilter,
        projection: Option<&[usize]>,
        remote: &Remote,
    ) -> DfResult<ScanSet> {
        let parts = self.state.parts.read();
        let mut set = ScanSet::default();
        let mut picker = Picker::default();
        let admits = self.admitted(&parts, filter, &remote.keys());
        for (key, p) in in_range(&parts, &admits) {
            for s in &remote.shards {
                let flushed = p.shards.get(s).map_or(0, |r| r.flushed);
                set.flushed.insert((key, *s), flushed);
            }
            for f in &p.files {
                if remote.files.contains(&f.path) {
                    set.skipped += 1;
                    continue;
                }
                self.file_into(&mut set, &mut picker, (&f.path, f.bytes), rows, projection);
            }
            for c in p.unflushed_chunks_of(&self.schema, &|s| remote.holds(s)) {
                picker.take(rows.pick(&c, projection), &mut set.batches);
            }
        }
        let projected = match projection {
            Some(p) => Arc::new(self.schema.project(p)?),
            None => self.schema.clone(),
        };
        let fetched = remote.rows_of(&parts, |k| admits.admits(k), &projected, projection);
        set.batches
            .extend(fetched.map_err(|e| DataFusionError::External(Box::new(e)))?);
        picker.finish(&mut set.batches)?;
        Ok(set)
    }

    /// Adds file `path` (of `bytes`) to `set`: its rows that `rows` picks when the hot
    /// cache holds it, else the file to read.
    pub(crate) fn file_into(
        &self,
        set: &mut ScanSet,
        picker: &mut Picker,
        (path, bytes): (&str, u64),
        rows: &RowFilter,
        projection: Option<&[usize]>,
    ) {
        match self.store.hot.get(path) {
            Some(chunks) => {
                for c in chunks {
                    let widened = crate::store::buffer::widen(&c.batch, &self.schema);
                    let pick = rows.pick(&c.with_batch(widened), projection);
                    picker.take(pick, &mut set.batches);
                }
            }
            None => set.files.push((path.to_string(), bytes)),
        }
    }

    /// Rows and synopses of `answer.columns` per combination of values of `answer.keys`
    /// over the rows `filter` admits (see [`SluiceTable::synopsis_where`]): files wholly
    /// inside the time bounds from their group synopses ([`crate::query::groups`]), chunks from
    /// theirs or from their rows. `None` when that cannot be done: a file without group
    /// synopses by those columns that is not in the hot cache, a filter they cannot decide.
    pub(crate) fn groups_where(
        &self,
        answer: &mut Answer,
        filter: &RowFilter,
        remote: &Remote,
    ) -> Option<()> {
        let (lo, hi, keys) = self.time_bounds(filter)?;
        // What to read, taken under the lock; the grouping (which may take a while) after
        // it, so that rows being applied do not wait for it.
        let mut files = Vec::new();
        let mut chunks = Vec::new();
        {
            let parts = self.state.parts.read();
            let admits = self.admitted(&parts, &keys, &remote.keys());
            for (_, p) in in_range(&parts, &admits) {
                for f in &p.files {
                    let Some(inside) = placed(f, !filter.time.is_empty(), lo, hi)? else {
                        continue;
                    };
                    let groups = f.groups.get().and_then(Option::clone);
                    files.push((inside, groups, f.path.clone()));
                }
                chunks.extend(p.unflushed_chunks_of(&self.schema, &|s| remote.holds(s)));
            }
            let fetched = remote.rows_of(&parts, |k| admits.admits(k), &self.schema, None);
            chunks.extend(fetched.ok()?.into_iter().map(Chunk::plain));
        }
        let widened = |c: Chunk| c.with_batch(crate::store::buffer::widen(&c.batch, &self.schema));
        if answer.budget == u64::MAX {
            // Grouping every chunk (the background priming): the groups of the chunks (and
            // of hot files without group synopses that decide) are made and kept on all
            // cores first, then added up below in order, as ever.
            let mut all: Vec<Chunk> = (files.iter())
                .filter(|(inside, groups, _)| !(*inside && groups.is_some()))
                .filter_map(|(_, _, path)| self.store.hot.get(path))
                .flatten()
                .map(widened)
                .collect();
            all.extend(chunks.iter().cloned());
            let lanes = std::thread::available_parallelism().map_or(1, |n| n.get());
            std::thread::scope(|scope| {
                for part in all.chunks(all.len().div_ceil(lanes).max(1)) {
                    let (keys, columns) = (answer.keys.clone(), answer.columns.clone());
                    scope.spawn(move || {
                        let mut kept = Answer::new(keys, columns);
                        for c in part {
                            if c.groups_into(&mut kept, filter).is_none() {
                                return;
                            }
                        }
                    });
                }
            });
        }
        for (inside, groups, path) in files {
            if inside && groups.is_some_and(|g| answer.add(&g, filter)) {
                continue;
            }
            for c in self.store.hot.get(&path)? {
                widened(c).groups_into(answer, filter)?;
            }
        }
        for c in chunks {
            c.groups_into(answer, filter)?;
        }
        for a in &remote.summaries {
            answer.add_answered(&a.groups);
        }
        Some(())
    }

    /// Reads the group synopses of the files of the partitions `filter` admits that this
    /// process has not yet read (files it did not write: after a restart, or another
    /// node's), several at a time.
    pub(crate) async fn load_groups(&self, filter: &RowFilter) {
        let Some((_, _, keys)) = self.time_bounds(filter) else {
            return;
        };
        let unread: Vec<FileMeta> = {
            let parts = self.state.parts.read();
            (self.selected(&parts, &keys).into_iter())
                .flat_map(|(_, p)| p.files.iter())
                .filter(|f| f.groups.get().is_none())
                .cloned()
                .collect()
        };
        // A file's copy shares its cell: what is read is kept for the file itself.
        let reads = unread.into_iter().map(|f| {
            let storage = self.store.storage.clone();
            async move { storage.groups(&f).await.is_some() }
        });
        futures::stream::iter(reads)
            .buffer_unordered(8)
            .for_each(|_| async {})
            .await;
    }

    /// The time bounds of `filter` (on the partition column only) and the partitions they
    /// admit.
    fn time_bounds(&self, filter: &RowFilter) -> Option<(i64, i64, KeyFilter)> {
        let col = self.def.partition_column;
        let (mut lo, mut hi) = (i64::MIN, i64::MAX);
        for &(c, a, b) in &filter.time {
            if c != col {
                return None;
            }
            (lo, hi) = (lo.max(a), hi.min(b));
        }
        let key = |t: i64| self.def.partition.key(&Value::Timestamp(t));
        let keys = match self.def.partition.is_monotonic() && lo <= hi {
            true => KeyFilter {
                lo: if lo == i64::MIN { 0 } else { key(lo) },
                hi: if hi == i64::MAX { u64::MAX } else { key(hi) },
                only: None,
            },
            false => KeyFilter::all(),
        };
        Some((lo, hi, keys))
    }

    /// Row count and the synopses of `columns` over the rows of the partitions the `WHERE
    /// PARTS` list admits that `filter` admits: bounds on the
    /// partition column (a timestamp) and string equalities. Files and chunks wholly inside
    /// the bounds, unfiltered otherwise, answer from their synopses; those wholly outside are
    /// skipped; the others are filtered, from their chunk indexes where they have them (a
    /// file then must be in the hot cache). `None` when that cannot be done: a file without
    /// synopsis or time range, or one to filter that is not hot, or a bound on another
    /// column.
    pub(crate) fn synopsis_where(
        &self,
        columns: &[usize],
        filter: &RowFilter,
        remote: &Remote,
    ) -> Option<(u64, Vec<ColumnSynopsis>)> {
        let (lo, hi, keys) = self.time_bounds(filter)?;
        let parts = self.state.parts.read();
        let admits = self.admitted(&parts, &keys, &remote.keys());
        let mut rows = 0;
        let mut out = vec![ColumnSynopsis::default(); columns.len()];
        let mut add = |n: u64, syn: &[ColumnSynopsis]| {
            rows += n;
            for (o, s) in out.iter_mut().zip(syn) {
                o.merge(s);
            }
        };
        for (_, p) in in_range(&parts, &admits) {
            for f in &p.files {
                let Some(inside) = placed(f, !filter.time.is_empty(), lo, hi)? else {
                    continue;
                };
                if inside && filter.equal.is_empty() {
                    let syn = f.synopsis.as_ref()?;
                    // Files older than an ADD COLUMN lack it: all NULL there.
                    let none = ColumnSynopsis::default();
                    let of = |c: usize| syn.get(c).unwrap_or(&none);
                    // Number comparisons decided for the whole file by its synopsis.
                    let decided: Vec<_> = (filter.value.iter())
                        .map(|&(c, op, v)| crate::store::chunk::decide(of(c), f.rows, op, v))
                        .collect();
                    if decided.contains(&Some(false)) {
                        continue;
                    }
                    if decided.iter().all(|d| *d == Some(true)) {
                        let syn: Vec<_> = columns.iter().map(|c| of(*c).clone()).collect();
                        add(f.rows, &syn);
                        continue;
                    }
                }
                for c in self.store.hot.get(&f.path)? {
                    let widened = c.with_batch(crate::store::buffer::widen(&c.batch, &self.schema));
                    let (n, syn) = widened.synopsis_where(columns, filter)?;
                    add(n, &syn);
                }
            }
            for c in p.unflushed_chunks_of(&self.schema, &|s| remote.holds(s)) {
                let (n, syn) = c.synopsis_where(columns, filter)?;
                add(n, &syn);
            }
        }
        let fetched = remote.rows_of(&parts, |k| admits.admits(k), &self.schema, None);
        for b in fetched.ok()? {
            let (n, syn) = Chunk::plain(b).synopsis_where(columns, filter)?;
            add(n, &syn);
        }
        for (_, n, syn) in remote.summaries.iter().flat_map(|a| &a.groups) {
            add(*n, syn);
        }
        Some((rows, out))
    }
}

#[async_trait]
impl TableProvider for SluiceTable {
    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    fn table_type(&self) -> TableType {
        TableType::Base
    }

    fn supports_filters_pushdown(
        &self,
        filters: &[&Expr],
    ) -> DfResult<Vec<TableProviderFilterPushDown>> {
        // Filters prune partitions, row groups and pages, but are re-checked on the rows.
        Ok(vec![TableProviderFilterPushDown::Inexact; filters.len()])
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        let keys = key_filter(&self.def, filters);
        // What EXPLAIN shows: the partitions as planned (a run reads them afresh).
        let (shown, of) = {
            let parts = self.state.parts.read();
            let shown = self
                .selected(&parts, &keys)
                .iter()
                .map(|(k, _)| *k)
                .collect();
            (shown, parts.len())
        };
        let (predicate, projected) =
            predicate_and_schema(state, &self.schema, filters, projection)?;
        let lanes = state.config().target_partitions().max(1);
        let properties = PlanProperties::new(
            EquivalenceProperties::new(projected.clone()),
            Partitioning::UnknownPartitioning(lanes),
            EmissionType::Incremental,
            Boundedness::Bounded,
        );
        let scan = Arc::new(Scan {
            table: self.clone(),
            keys,
            rows: row_filter(&self.def, filters),
            predicate,
            projection: projection.cloned(),
            projected,
            limit,
            lanes,
        });
        let metrics = ExecutionPlanMetricsSet::new();
        // The rows other nodes hold are read when the scan runs (`EXPLAIN` then shows no
        // input).
        let elsewhere: Vec<(u32, Option<u64>)> = (self.store.reader())
            .map(|r| {
                (r.remote_shards().into_iter())
                    .map(|s| (s, r.asked_first(s)))
                    .collect()
            })
            .unwrap_or_default();
        let planned = match elsewhere.is_empty() && FOR_A_REPLICA.try_with(|_| ()).is_err() {
            false => None,
            true => Some(scan.input(&ScanMetrics::new(&metrics), &Remote::default())?),
        };
        Ok(Arc::new(ScanExec {
            planned,
            scan,
            shown,
            of,
            elsewhere,
            properties: Arc::new(properties),
            input: Default::default(),
            making: Default::default(),
            metrics,
            split: None,
        }))
    }
}

/// The partitions of `parts` that `admits` takes.
fn in_range<'a>(
    parts: &'a BTreeMap<u64, Partition>,
    admits: &Admitted<'_>,
) -> Vec<(u64, &'a Partition)> {
    let (lo, hi) = admits.bounds();
    if lo > hi {
        return Vec::new();
    }
    (parts.range(lo..=hi))
        .filter(|(k, _)| admits.admits(**k))
        .map(|(k, p)| (*k, p))
        .collect()
}

/// The partition keys a table reference admits: its filters' and its `WHERE PARTS` list's.
struct Admitted<'f> {
    filter: &'f KeyFilter,
    selector: Option<crate::query::parts::PartsSelector>,
}

impl Admitted<'_> {
    /// The lowest and highest key admitted (`lo > hi`: none; contradictory bounds, or no
    /// partition named).
    fn bounds(&self) -> (u64, u64) {
        let (mut lo, mut hi) = (self.filter.lo, self.filter.hi);
        if let Some(s) = &self.selector {
            let (a, b) = s.bounds();
            lo = lo.max(a);
            hi = hi.min(b);
        }
        (lo, hi)
    }

    fn admits(&self, k: u64) -> bool {
        let (lo, hi) = self.bounds();
        (lo..=hi).contains(&k)
            && self.filter.admits(k)
            && self.selector.as_ref().is_none_or(|s| s.admits(k))
    }
}

/// A scan's `filters` as one physical predicate over `schema` (for Parquet's statistics
/// and page index), and the schema its `projection` gives.
pub(crate) fn predicate_and_schema(
    state: &dyn Session,
    schema: &SchemaRef,
    filters: &[Expr],
    projection: Option<&Vec<usize>>,
) -> DfResult<(Option<Arc<dyn PhysicalExpr>>, SchemaRef)> {
    let predicate = match conjunction(filters.to_vec()) {
        Some(expr) => {
            let df_schema = DFSchema::try_from(schema.clone())?;
            Some(state.create_physical_expr(expr, &df_schema)?)
        }
        None => None,
    };
    let projected = match projection {
        Some(p) => Arc::new(schema.project(p)?),
        None => schema.clone(),
    };
    Ok((predicate, projected))
}

/// A read-only in-memory table (system tables, SHOW results).
pub(crate) fn mem_table(batch: RecordBatch) -> DfResult<Arc<dyn TableProvider>> {
    Ok(Arc::new(MemTable::try_new(
        batch.schema(),
        vec![vec![batch]],
    )?))
}
