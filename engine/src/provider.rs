//! DataFusion over the catalog: a catalog provider whose schemas are Sluice databases (plus
//! `system`), and a table provider per table that unions the table's Parquet files with its
//! in-memory buffers, skipping partitions that the filters rule out.

use crate::catalog::{CatalogData, DEFAULT_DATABASE, SYSTEM_DATABASE, TableDef};
use crate::parts::PartsSpec;
use crate::state::{Partition, TableState, Tables};
use crate::storage::Storage;
use crate::synopsis::ColumnSynopsis;
use crate::types::Value;
use async_trait::async_trait;
use datafusion::arrow::datatypes::SchemaRef;
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
use datafusion::logical_expr::utils::{conjunction, split_conjunction};
use datafusion::logical_expr::{BinaryExpr, Expr, Operator, TableProviderFilterPushDown};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::union::UnionExec;
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, PlanProperties};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

/// What the SQL layer needs of the engine.
#[derive(Debug)]
pub struct Shared {
    /// The catalog.
    pub catalog: crate::catalog::Catalog,
    /// Live state.
    pub tables: Arc<Tables>,
    /// Object store.
    pub storage: Storage,
    /// Refused messages.
    pub dead_letters: crate::dead_letter::DeadLetters,
    /// Decoded Parquet files.
    pub hot: crate::hot::HotCache,
    /// The last stored message per bridge and packet id.
    pub origins: Arc<crate::origin::Origins>,
    /// `system` tables other layers serve (the broker's `system.bridges`).
    pub extra_system:
        parking_lot::RwLock<std::collections::HashMap<String, crate::api::SystemRows>>,
}

/// The `sluice` catalog: one schema per database, plus `system`.
#[derive(Debug)]
pub struct SluiceCatalog {
    /// Engine state.
    pub shared: Arc<Shared>,
}

impl CatalogProvider for SluiceCatalog {
    fn schema_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .shared
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
            return Some(Arc::new(crate::system::SystemSchema {
                shared: self.shared.clone(),
            }));
        }
        self.shared
            .catalog
            .snapshot()
            .databases
            .contains_key(name)
            .then(|| {
                Arc::new(DatabaseSchema {
                    shared: self.shared.clone(),
                    database: name.to_string(),
                }) as Arc<dyn SchemaProvider>
            })
    }
}

#[derive(Debug)]
struct DatabaseSchema {
    shared: Arc<Shared>,
    database: String,
}

#[async_trait]
impl SchemaProvider for DatabaseSchema {
    fn table_names(&self) -> Vec<String> {
        self.shared
            .catalog
            .snapshot()
            .databases
            .get(&self.database)
            .map(|t| t.keys().cloned().collect())
            .unwrap_or_default()
    }

    async fn table(&self, name: &str) -> DfResult<Option<Arc<dyn TableProvider>>> {
        let cat = self.shared.catalog.snapshot();
        let (name, parts) = PartsSpec::split_name(name);
        let Some(def) = resolve(&cat, &self.database, name) else {
            return Ok(None);
        };
        let Some(state) = self.shared.tables.get(def.id) else {
            return Ok(None);
        };
        Ok(Some(Arc::new(SluiceTable {
            schema: state.schema(),
            def: state.def(),
            state,
            shared: self.shared.clone(),
            parts,
        })))
    }

    fn table_exist(&self, name: &str) -> bool {
        let (name, _) = PartsSpec::split_name(name);
        resolve(&self.shared.catalog.snapshot(), &self.database, name).is_some()
    }
}

/// The table an unqualified or qualified name means: `database.table`, else, when `database`
/// is the default one and lacks it, the one table of that name in any database (so OIDBS's
/// `FROM nyct_lite` finds `benchmark.nyct_lite`).
pub fn resolve<'a>(cat: &'a CatalogData, database: &str, table: &str) -> Option<&'a Arc<TableDef>> {
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
#[derive(Debug)]
pub struct SluiceTable {
    def: Arc<TableDef>,
    schema: SchemaRef,
    state: Arc<TableState>,
    shared: Arc<Shared>,
    /// The `WHERE PARTS` list the query gave this reference.
    parts: Option<PartsSpec>,
}

/// Which partition keys can hold rows matching the filters.
#[derive(Debug, Clone, PartialEq)]
pub struct KeyFilter {
    /// Inclusive lower bound.
    pub lo: u64,
    /// Inclusive upper bound.
    pub hi: u64,
    /// When equality pinned the key to a set.
    pub only: Option<BTreeSet<u64>>,
}

impl KeyFilter {
    fn all() -> Self {
        Self {
            lo: 0,
            hi: u64::MAX,
            only: None,
        }
    }

    /// True if partition `k` may match.
    pub fn admits(&self, k: u64) -> bool {
        k >= self.lo && k <= self.hi && self.only.as_ref().is_none_or(|s| s.contains(&k))
    }
}

/// Derives key bounds from predicates on the partition column (`col op literal`).
pub fn key_filter(def: &TableDef, filters: &[Expr]) -> KeyFilter {
    let mut f = KeyFilter::all();
    let col_name = &def.columns[def.partition_column].name;
    let ty = def.columns[def.partition_column].ty;
    for filter in filters {
        for e in split_conjunction(filter) {
            let Expr::BinaryExpr(BinaryExpr { left, op, right }) = e else {
                continue;
            };
            let (op, lit) = match (column_of(left), column_of(right)) {
                (Some(c), None) if c == col_name => (*op, right.as_ref()),
                (None, Some(c)) if c == col_name => match op.swap() {
                    Some(op) => (op, left.as_ref()),
                    None => continue,
                },
                _ => continue,
            };
            let Some(v) = literal_value(lit, ty) else {
                continue;
            };
            let k = def.partition.key(&v);
            if !def.partition.is_monotonic() {
                if op == Operator::Eq {
                    let set = f.only.get_or_insert_with(|| BTreeSet::from([k]));
                    set.retain(|x| *x == k);
                }
                continue;
            }
            match op {
                Operator::Eq => {
                    f.lo = f.lo.max(k);
                    f.hi = f.hi.min(k);
                }
                Operator::GtEq => f.lo = f.lo.max(k),
                Operator::LtEq => f.hi = f.hi.min(k),
                // Strict bounds: the key of the next (previous) value, so `ts < '12:00'`
                // does not read the partition that starts at 12:00.
                // (At the ends of the type no step exists; the bound is then not used.)
                Operator::Gt => {
                    if let Some(next) = step(&v, 1) {
                        f.lo = f.lo.max(def.partition.key(&next));
                    }
                }
                Operator::Lt => {
                    if let Some(prev) = step(&v, -1) {
                        f.hi = f.hi.min(def.partition.key(&prev));
                    }
                }
                _ => {}
            }
        }
    }
    f
}

/// The value one unit (1 microsecond, 1) after (`delta` 1) or before (-1) `v`; `None` past
/// the end of its type.
fn step(v: &Value, delta: i64) -> Option<Value> {
    Some(match v {
        Value::Timestamp(t) => Value::Timestamp(t.checked_add(delta)?),
        Value::Int(i) => Value::Int(i.checked_add(delta)?),
        Value::UInt(u) => Value::UInt(u.checked_add_signed(delta)?),
        _ => return None,
    })
}

fn column_of(e: &Expr) -> Option<&str> {
    match e {
        Expr::Column(c) => Some(c.name.as_str()),
        _ => None,
    }
}

fn literal_value(e: &Expr, ty: crate::types::ColumnType) -> Option<Value> {
    let scalar = match e {
        Expr::Literal(s, _) => s.clone(),
        Expr::Cast(c) => match c.expr.as_ref() {
            Expr::Literal(s, _) => s.cast_to(c.field.data_type()).ok()?,
            _ => return None,
        },
        _ => return None,
    };
    if scalar.is_null() {
        return None;
    }
    let micros = |s: &ScalarValue| -> Option<i64> {
        Some(match s {
            ScalarValue::TimestampSecond(Some(v), _) => v.checked_mul(1_000_000)?,
            ScalarValue::TimestampMillisecond(Some(v), _) => v.checked_mul(1_000)?,
            ScalarValue::TimestampMicrosecond(Some(v), _) => *v,
            ScalarValue::TimestampNanosecond(Some(v), _) => v.div_euclid(1_000),
            ScalarValue::Date32(Some(d)) => i64::from(*d).checked_mul(86_400_000_000)?,
            ScalarValue::Utf8(Some(s))
            | ScalarValue::LargeUtf8(Some(s))
            | ScalarValue::Utf8View(Some(s)) => {
                return crate::decode::parse_text(crate::types::ColumnType::Timestamp, s)
                    .ok()?
                    .as_micros();
            }
            _ => return None,
        })
    };
    if ty.is_time() {
        return micros(&scalar).map(Value::Timestamp);
    }
    match scalar {
        ScalarValue::Int8(Some(v)) => Some(Value::Int(v.into())),
        ScalarValue::Int16(Some(v)) => Some(Value::Int(v.into())),
        ScalarValue::Int32(Some(v)) => Some(Value::Int(v.into())),
        ScalarValue::Int64(Some(v)) => Some(Value::Int(v)),
        ScalarValue::UInt8(Some(v)) => Some(Value::UInt(v.into())),
        ScalarValue::UInt16(Some(v)) => Some(Value::UInt(v.into())),
        ScalarValue::UInt32(Some(v)) => Some(Value::UInt(v.into())),
        ScalarValue::UInt64(Some(v)) => Some(Value::UInt(v)),
        _ => None,
    }
}

/// What a scan reads, taken under the partition lock.
#[derive(Debug, Default)]
pub struct ScanSet {
    /// Keys of the partitions scanned.
    pub keys: Vec<u64>,
    /// Partitions the table has.
    pub of: usize,
    /// Parquet files not in the hot cache: path and size.
    pub files: Vec<(String, u64)>,
    /// In-memory rows.
    pub batches: Vec<RecordBatch>,
}

impl SluiceTable {
    /// The table's definition.
    pub fn def(&self) -> Arc<TableDef> {
        self.def.clone()
    }

    /// The partitions that `filter` and the `WHERE PARTS` list admit, and how many there are.
    fn selected<'a>(
        &self,
        parts: &'a BTreeMap<u64, Partition>,
        filter: &KeyFilter,
    ) -> Vec<(u64, &'a Partition)> {
        let (mut lo, mut hi) = (filter.lo, filter.hi);
        let selector = self
            .parts
            .as_ref()
            .map(|spec| spec.selector(parts.iter().filter(|(_, p)| p.rows() > 0).map(|(k, _)| *k)));
        if let Some(s) = &selector {
            let (a, b) = s.bounds();
            lo = lo.max(a);
            hi = hi.min(b);
        }
        if lo > hi {
            // Contradictory bounds, or no partition named: nothing can match.
            return Vec::new();
        }
        parts
            .range(lo..=hi)
            .filter(|(k, _)| filter.admits(**k) && selector.as_ref().is_none_or(|s| s.admits(**k)))
            .map(|(k, p)| (*k, p))
            .collect()
    }

    /// Collects the files and buffered rows of the partitions that `filter` admits.
    pub fn scan_set(&self, filter: &KeyFilter) -> ScanSet {
        let parts = self.state.parts.read();
        let mut set = ScanSet {
            of: parts.len(),
            ..ScanSet::default()
        };
        for (k, p) in self.selected(&parts, filter) {
            set.keys.push(k);
            for f in &p.files {
                match self.shared.hot.get(&f.path) {
                    Some(batches) => set.batches.extend(
                        batches
                            .iter()
                            .map(|b| crate::buffer::widen(b, &self.schema)),
                    ),
                    None => set.files.push((f.path.clone(), f.bytes)),
                }
            }
            set.batches.extend(p.unflushed_batches(&self.schema));
        }
        set
    }

    /// Row count and the synopses of `columns` over every partition the `WHERE PARTS` list
    /// admits: files from their stored synopses, buffered rows computed now. `None` if a
    /// file has no synopsis.
    pub fn synopsis(&self, columns: &[usize]) -> Option<(u64, Vec<ColumnSynopsis>)> {
        let parts = self.state.parts.read();
        let mut rows = 0;
        let mut out = vec![ColumnSynopsis::default(); columns.len()];
        for (_, p) in self.selected(&parts, &KeyFilter::all()) {
            for f in &p.files {
                let syn = f.synopsis.as_ref()?;
                rows += f.rows;
                for (o, c) in out.iter_mut().zip(columns) {
                    // Files older than an ADD COLUMN lack it: all NULL there.
                    if let Some(s) = syn.get(*c) {
                        o.merge(s);
                    }
                }
            }
            for b in p.unflushed_batches(&self.schema) {
                rows += b.num_rows() as u64;
                for (o, c) in out.iter_mut().zip(columns) {
                    if let Some(a) = b.columns().get(*c) {
                        o.merge(&ColumnSynopsis::of(a));
                    }
                }
            }
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
        let filter = key_filter(&self.def, filters);
        let mut set = self.scan_set(&filter);
        let keys = std::mem::take(&mut set.keys);
        let of = set.of;
        for (path, bytes) in &set.files {
            self.warm(path, *bytes);
        }
        let lanes = state.config().target_partitions().max(1);
        let mut inputs: Vec<Arc<dyn ExecutionPlan>> = Vec::new();
        if !set.files.is_empty() {
            let mut source = ParquetSource::new(self.schema.clone())
                .with_enable_page_index(true)
                .with_pushdown_filters(false);
            if let Some(expr) = conjunction(filters.to_vec()) {
                let df_schema = DFSchema::try_from(self.schema.clone())?;
                source = source.with_predicate(state.create_physical_expr(expr, &df_schema)?);
            }
            let mut groups: Vec<Vec<PartitionedFile>> =
                vec![Vec::new(); lanes.min(set.files.len())];
            let n = groups.len();
            for (i, (path, size)) in set.files.into_iter().enumerate() {
                groups[i % n].push(PartitionedFile::new(path, size));
            }
            let conf =
                FileScanConfigBuilder::new(self.shared.storage.url.clone(), Arc::new(source))
                    .with_file_groups(groups.into_iter().map(FileGroup::new).collect())
                    .with_projection_indices(projection.cloned())?
                    .with_limit(limit)
                    .build();
            inputs.push(DataSourceExec::from_data_source(conf));
        }
        if !set.batches.is_empty() || inputs.is_empty() {
            let n = lanes.min(set.batches.len()).max(1);
            let mut parts: Vec<Vec<RecordBatch>> = vec![Vec::new(); n];
            for (i, b) in set.batches.into_iter().enumerate() {
                parts[i % n].push(b);
            }
            inputs.push(MemorySourceConfig::try_new_exec(
                &parts,
                self.schema.clone(),
                projection.cloned(),
            )?);
        }
        Ok(Arc::new(ScanExec {
            table: format!("{}.{}", self.def.database, self.def.name),
            keys,
            of,
            input: UnionExec::try_new(inputs)?,
        }))
    }
}

impl SluiceTable {
    /// Loads a file the hot cache missed into it in the background, if there is room.
    fn warm(&self, path: &str, bytes: u64) {
        // Decoded columns take a few times the compressed size.
        let estimate = usize::try_from(bytes)
            .unwrap_or(usize::MAX)
            .saturating_mul(5);
        if !self.shared.hot.claim(path, estimate) {
            return;
        }
        let shared = self.shared.clone();
        let path = path.to_string();
        tokio::spawn(async move {
            let loaded = async {
                let bytes = shared.storage.get(&path).await?;
                tokio::task::spawn_blocking(move || -> crate::error::Result<_> {
                    let batches = Storage::decode_parquet(bytes)?;
                    match batches.first() {
                        Some(b) => Ok(Some(datafusion::arrow::compute::concat_batches(
                            &b.schema(),
                            &batches,
                        )?)),
                        None => Ok(None),
                    }
                })
                .await
                .map_err(|e| crate::error::Error::io("hot cache load", std::io::Error::other(e)))?
            };
            match loaded.await {
                Ok(Some(batch)) => shared.hot.insert(&path, &batch),
                Ok(None) => shared.hot.abandon(&path),
                Err(e) => {
                    shared.hot.abandon(&path);
                    tracing::debug!(error = %e, path, "hot cache: could not load file");
                }
            }
        });
    }
}

/// The root of a table's scan: shows in `EXPLAIN` which partitions it reads, and runs its
/// input unchanged.
#[derive(Debug)]
pub struct ScanExec {
    table: String,
    keys: Vec<u64>,
    of: usize,
    input: Arc<dyn ExecutionPlan>,
}

impl DisplayAs for ScanExec {
    fn fmt_as(&self, _: DisplayFormatType, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        const SHOWN: usize = 16;
        write!(
            f,
            "SluiceScan: {} partitions={} of {} [",
            self.table,
            self.keys.len(),
            self.of
        )?;
        for (i, k) in self.keys.iter().take(SHOWN).enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{k}")?;
        }
        if self.keys.len() > SHOWN {
            write!(f, ", ... {} more", self.keys.len() - SHOWN)?;
        }
        f.write_str("]")
    }
}

impl ExecutionPlan for ScanExec {
    fn name(&self) -> &'static str {
        "SluiceScan"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        self.input.properties()
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    fn maintains_input_order(&self) -> Vec<bool> {
        vec![true]
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> DfResult<TreeNodeRecursion>,
    ) -> DfResult<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn with_new_children(
        self: Arc<Self>,
        mut children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        if children.len() != 1 {
            return Err(DataFusionError::Internal(
                "SluiceScan takes one input".into(),
            ));
        }
        Ok(Arc::new(Self {
            table: self.table.clone(),
            keys: self.keys.clone(),
            of: self.of,
            input: children.swap_remove(0),
        }))
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> DfResult<SendableRecordBatchStream> {
        self.input.execute(partition, context)
    }
}

/// A read-only in-memory table (system tables, SHOW results).
pub fn mem_table(batch: RecordBatch) -> DfResult<Arc<dyn TableProvider>> {
    Ok(Arc::new(MemTable::try_new(
        batch.schema(),
        vec![vec![batch]],
    )?))
}
