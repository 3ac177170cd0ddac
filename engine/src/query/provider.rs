//! DataFusion over the catalog: a catalog provider whose schemas are Sluice databases (plus
//! `system`), and a table provider per table that unions the table's Parquet files with its
//! in-memory buffers, skipping partitions that the filters rule out.

use crate::query::groups::Answer;
use crate::query::parts::PartsSpec;
use crate::query::synopsis::ColumnSynopsis;
use crate::store::Store;
use crate::store::catalog::{CatalogData, DEFAULT_DATABASE, SYSTEM_DATABASE, TableDef};
use crate::store::chunk::{Pick, RowFilter};
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
use parking_lot::Mutex;
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

/// Which partition keys can hold rows matching the filters.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct KeyFilter {
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
    pub(crate) fn admits(&self, k: u64) -> bool {
        k >= self.lo && k <= self.hi && self.only.as_ref().is_none_or(|s| s.contains(&k))
    }
}

/// Derives key bounds from predicates on the partition column (`col op literal`).
pub(crate) fn key_filter(def: &TableDef, filters: &[Expr]) -> KeyFilter {
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

/// The predicates among `filters` that chunk indexes answer ([`RowFilter`]): a string
/// column equal to a literal or in a list of literals, and a timestamp column compared with
/// one (also through the cast the planner adds to compare with `now()`).
pub(crate) fn row_filter(def: &TableDef, filters: &[Expr]) -> RowFilter {
    use crate::types::ColumnType;
    let mut f = RowFilter::default();
    let column = |e: &Expr| -> Option<(usize, ColumnType)> {
        let (name, cast) = match e {
            Expr::Column(c) => (c.name.as_str(), None),
            Expr::Cast(c) => (column_of(&c.expr)?, Some(c.field.data_type())),
            _ => return None,
        };
        let i = def.columns.iter().position(|c| c.name == name)?;
        let ty = def.columns[i].ty;
        match cast {
            // A cast that keeps every instant as it is (to compare with `now()`): not one to
            // seconds or milliseconds (which rounds), nor to another zone (which shifts); or
            // one that keeps every number (`CAST(f32 AS DOUBLE) < 0.5`, as DataFusion
            // coerces a FLOAT column compared with a literal).
            Some(to) if !instant_preserving(to) && !widening(ty, to) => None,
            _ => Some((i, ty)),
        }
    };
    let text = |e: &Expr| match e {
        Expr::Literal(ScalarValue::Utf8(Some(s)) | ScalarValue::Utf8View(Some(s)), _) => {
            Some(s.clone())
        }
        _ => None,
    };
    for e in filters.iter().flat_map(split_conjunction) {
        match e {
            // A short IN list, as the optimizer writes it: `d = 'a' OR d = 'b'`.
            Expr::BinaryExpr(BinaryExpr {
                op: Operator::Or, ..
            }) => {
                let mut at = None;
                let mut values = Vec::new();
                // Each side exactly one equality on the same column, nothing else (`d = 'a'
                // AND x` would read as `d = 'a'`: too wide for a synopsis).
                let all = split_binary(e, Operator::Or).into_iter().all(|d| {
                    let one = row_filter(def, std::slice::from_ref(d));
                    let single = split_conjunction(d).len() == 1;
                    match (&one.equal[..], &one.time[..], &one.value[..], single) {
                        ([(c, v)], [], [], true) if at.is_none_or(|a| a == *c) => {
                            at = Some(*c);
                            values.extend(v.iter().cloned());
                            true
                        }
                        _ => false,
                    }
                });
                if let (true, Some(c)) = (all, at) {
                    f.equal.push((c, values));
                }
            }
            Expr::BinaryExpr(BinaryExpr { left, op, right }) => {
                let (c, op, lit) = match (column(left), column(right)) {
                    (Some(c), None) => (c, *op, right.as_ref()),
                    (None, Some(c)) => match op.swap() {
                        Some(op) => (c, op, left.as_ref()),
                        None => continue,
                    },
                    _ => continue,
                };
                match c.1 {
                    ColumnType::Int8
                    | ColumnType::Int16
                    | ColumnType::Int32
                    | ColumnType::Int64
                    | ColumnType::UInt8
                    | ColumnType::UInt16
                    | ColumnType::UInt32
                    | ColumnType::UInt64
                    | ColumnType::Float32
                    | ColumnType::Float64 => {
                        use Operator::*;
                        if let (Some(n), Lt | LtEq | Gt | GtEq | Eq) = (number(lit), op) {
                            f.value.push((c.0, op, n));
                        }
                    }
                    ColumnType::String if op == Operator::Eq => {
                        if let Some(v) = text(lit) {
                            f.equal.push((c.0, vec![v]));
                        }
                    }
                    ColumnType::Timestamp => {
                        // The literal in whole microseconds, rounded down, and whether that
                        // was exact: the bounds below are then exact in microseconds.
                        let (t, exact) = match lit {
                            Expr::Literal(ScalarValue::TimestampNanosecond(Some(v), _), _) => {
                                (v.div_euclid(1_000), v.rem_euclid(1_000) == 0)
                            }
                            _ => match literal_value(lit, c.1).and_then(|v| v.as_micros()) {
                                Some(t) => (t, true),
                                None => continue,
                            },
                        };
                        let up = |t: i64| t.saturating_add(1);
                        let (lo, hi) = match op {
                            Operator::Eq if exact => (t, t),
                            // Between two microseconds: no stored time equals it.
                            Operator::Eq => (i64::MAX, i64::MIN),
                            Operator::Gt => (up(t), i64::MAX),
                            Operator::GtEq => (if exact { t } else { up(t) }, i64::MAX),
                            Operator::Lt => (i64::MIN, if exact { t.saturating_sub(1) } else { t }),
                            Operator::LtEq => (i64::MIN, t),
                            _ => continue,
                        };
                        f.time.push((c.0, lo, hi));
                    }
                    _ => {}
                }
            }
            Expr::InList(l) if !l.negated => {
                let Some((i, ColumnType::String)) = column(&l.expr) else {
                    continue;
                };
                if let Some(values) = l.list.iter().map(text).collect::<Option<Vec<_>>>() {
                    f.equal.push((i, values));
                }
            }
            _ => {}
        }
    }
    f
}

/// Where file `f` lies against the time bounds `lo..=hi` (when `bounded`): `Some(None)`
/// wholly outside them, else `Some(Some(inside))` (whether wholly inside); `None` when the
/// bounds need a time range the file does not have.
fn placed(f: &FileMeta, bounded: bool, lo: i64, hi: i64) -> Option<Option<bool>> {
    if !bounded {
        return Some(Some(true));
    }
    let (a, b) = (f.min_time?, f.max_time?);
    Some((b >= lo && a <= hi).then_some(lo <= a && b <= hi))
}

/// A number literal as a synopsis number (not NaN, which no synopsis bound orders).
fn number(e: &Expr) -> Option<crate::query::synopsis::Num> {
    use crate::query::synopsis::Num;
    let Expr::Literal(v, _) = e else {
        return None;
    };
    Some(match v {
        ScalarValue::Int8(Some(v)) => Num::Int((*v).into()),
        ScalarValue::Int16(Some(v)) => Num::Int((*v).into()),
        ScalarValue::Int32(Some(v)) => Num::Int((*v).into()),
        ScalarValue::Int64(Some(v)) => Num::Int((*v).into()),
        ScalarValue::UInt8(Some(v)) => Num::Int((*v).into()),
        ScalarValue::UInt16(Some(v)) => Num::Int((*v).into()),
        ScalarValue::UInt32(Some(v)) => Num::Int((*v).into()),
        ScalarValue::UInt64(Some(v)) => Num::Int((*v).into()),
        ScalarValue::Float32(Some(v)) if !v.is_nan() => Num::Float((*v).into()),
        ScalarValue::Float64(Some(v)) if !v.is_nan() => Num::Float(*v),
        _ => return None,
    })
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

/// Whether casting a number column of type `from` to `to` keeps every value (and its order).
fn widening(from: crate::types::ColumnType, to: &DataType) -> bool {
    use crate::types::ColumnType::*;
    match to {
        DataType::Float64 => matches!(from, Float32 | Float64),
        DataType::Int64 => matches!(from, Int8 | Int16 | Int32 | Int64 | UInt8 | UInt16 | UInt32),
        DataType::Int32 => matches!(from, Int8 | Int16 | Int32 | UInt8 | UInt16),
        DataType::Int16 => matches!(from, Int8 | Int16 | UInt8),
        DataType::UInt64 => matches!(from, UInt8 | UInt16 | UInt32 | UInt64),
        DataType::UInt32 => matches!(from, UInt8 | UInt16 | UInt32),
        DataType::UInt16 => matches!(from, UInt8 | UInt16),
        _ => false,
    }
}

/// Whether casting a microsecond timestamp without zone to `ty` keeps its instant.
fn instant_preserving(ty: &DataType) -> bool {
    use datafusion::arrow::datatypes::TimeUnit;
    match ty {
        DataType::Timestamp(TimeUnit::Microsecond | TimeUnit::Nanosecond, tz) => tz
            .as_deref()
            .is_none_or(|z| matches!(z, "+00:00" | "+00" | "UTC" | "Z" | "utc")),
        _ => false,
    }
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
                return crate::ingest::decode::parse_text(crate::types::ColumnType::Timestamp, s)
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
pub(crate) struct ScanSet {
    /// Parquet files not in the hot cache: path and size.
    pub files: Vec<(String, u64)>,
    /// In-memory rows.
    pub batches: Vec<RecordBatch>,
}

impl SluiceTable {
    /// The table's definition.
    pub(crate) fn def(&self) -> Arc<TableDef> {
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
    /// In-memory rows (hot files and buffers) are narrowed by `rows`: chunks that cannot
    /// match are skipped, indexed ones give only their matching rows.
    /// In-memory rows come with the columns of `projection` only.
    pub(crate) fn scan_set(
        &self,
        filter: &KeyFilter,
        rows: &RowFilter,
        projection: Option<&[usize]>,
    ) -> DfResult<ScanSet> {
        let parts = self.state.parts.read();
        let mut set = ScanSet::default();
        // Rows picked from indexed chunks, gathered into one batch at the end.
        let (mut picked, mut at) = (Vec::new(), Vec::new());
        let mut take = |pick: Pick, batches: &mut Vec<RecordBatch>| match pick {
            Pick::Nothing => {}
            Pick::Whole(b) => batches.push(b),
            Pick::Rows(b, rows) => {
                at.extend(rows.iter().map(|r| (picked.len(), *r as usize)));
                picked.push(b);
            }
        };
        for (_, p) in self.selected(&parts, filter) {
            for f in &p.files {
                match self.store.hot.get(&f.path) {
                    Some(chunks) => {
                        for c in chunks {
                            let widened = crate::store::buffer::widen(&c.batch, &self.schema);
                            take(
                                rows.pick(&c.with_batch(widened), projection),
                                &mut set.batches,
                            );
                        }
                    }
                    None => set.files.push((f.path.clone(), f.bytes)),
                }
            }
            for c in p.unflushed_chunks(&self.schema) {
                take(rows.pick(&c, projection), &mut set.batches);
            }
        }
        // In batches of a chunk's size: bounded copies, spread over the lanes.
        for rows in at.chunks(crate::store::buffer::SEAL_ROWS) {
            set.batches
                .push(crate::store::chunk::gather(&picked, rows)?);
        }
        Ok(set)
    }

    /// Rows and synopses of `answer.columns` per combination of values of `answer.keys`
    /// over the rows `filter` admits (see [`SluiceTable::synopsis_where`]): files wholly
    /// inside the time bounds from their group synopses ([`crate::query::groups`]), chunks from
    /// theirs or from their rows. `None` when that cannot be done: a file without group
    /// synopses by those columns that is not in the hot cache, a filter they cannot decide.
    pub(crate) fn groups_where(&self, answer: &mut Answer, filter: &RowFilter) -> Option<()> {
        let (lo, hi, keys) = self.time_bounds(filter)?;
        let parts = self.state.parts.read();
        for (_, p) in self.selected(&parts, &keys) {
            for f in &p.files {
                let Some(inside) = placed(f, !filter.time.is_empty(), lo, hi)? else {
                    continue;
                };
                let groups = f.groups.get().and_then(Option::as_ref);
                if inside && groups.is_some_and(|g| answer.add(g, filter)) {
                    continue;
                }
                for c in self.store.hot.get(&f.path)? {
                    let widened = c.with_batch(crate::store::buffer::widen(&c.batch, &self.schema));
                    widened.groups_into(answer, filter)?;
                }
            }
            for c in p.unflushed_chunks(&self.schema) {
                c.groups_into(answer, filter)?;
            }
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
    ) -> Option<(u64, Vec<ColumnSynopsis>)> {
        let (lo, hi, keys) = self.time_bounds(filter)?;
        let parts = self.state.parts.read();
        let mut rows = 0;
        let mut out = vec![ColumnSynopsis::default(); columns.len()];
        let mut add = |n: u64, syn: &[ColumnSynopsis]| {
            rows += n;
            for (o, s) in out.iter_mut().zip(syn) {
                o.merge(s);
            }
        };
        for (_, p) in self.selected(&parts, &keys) {
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
            for c in p.unflushed_chunks(&self.schema) {
                let (n, syn) = c.synopsis_where(columns, filter)?;
                add(n, &syn);
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
        let predicate = match conjunction(filters.to_vec()) {
            Some(expr) => {
                let df_schema = DFSchema::try_from(self.schema.clone())?;
                Some(state.create_physical_expr(expr, &df_schema)?)
            }
            None => None,
        };
        let lanes = state.config().target_partitions().max(1);
        let projected = match projection {
            Some(p) => Arc::new(self.schema.project(p)?),
            None => self.schema.clone(),
        };
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
        Ok(Arc::new(ScanExec {
            planned: Some(scan.input(&ScanMetrics::new(&metrics))?),
            scan,
            shown,
            of,
            properties: Arc::new(properties),
            input: Mutex::new(None),
            metrics,
        }))
    }
}

/// What a scan reads, decided when it is planned; the rows are taken when it runs.
#[derive(Debug)]
struct Scan {
    table: SluiceTable,
    keys: KeyFilter,
    rows: RowFilter,
    /// The filters, for Parquet's statistics and page index.
    predicate: Option<Arc<dyn PhysicalExpr>>,
    projection: Option<Vec<usize>>,
    /// The table's schema with the projection applied.
    projected: SchemaRef,
    limit: Option<usize>,
    /// Output partitions.
    lanes: usize,
}

impl Scan {
    /// The plan reading what the table holds now: its Parquet files and its in-memory rows
    /// (hot files and buffers, narrowed by the chunk indexes). Each output partition of the
    /// scan is one or more of this plan's partitions.
    fn input(&self, metrics: &ScanMetrics) -> DfResult<Arc<dyn ExecutionPlan>> {
        let t = &self.table;
        let set = t.scan_set(&self.keys, &self.rows, self.projection.as_deref())?;
        for (path, bytes) in &set.files {
            t.warm(path, *bytes);
        }
        metrics.files.add(set.files.len());
        metrics
            .memory_rows
            .add(set.batches.iter().map(|b| b.num_rows()).sum());
        let lanes = self.lanes;
        let mut inputs: Vec<Arc<dyn ExecutionPlan>> = Vec::new();
        if !set.files.is_empty() {
            let mut source = ParquetSource::new(t.schema.clone())
                .with_enable_page_index(true)
                .with_pushdown_filters(false);
            if let Some(p) = &self.predicate {
                source = source.with_predicate(p.clone());
            }
            let mut groups: Vec<Vec<PartitionedFile>> =
                vec![Vec::new(); lanes.min(set.files.len())];
            let n = groups.len();
            for (i, (path, size)) in set.files.into_iter().enumerate() {
                groups[i % n].push(PartitionedFile::new(path, size));
            }
            let conf = FileScanConfigBuilder::new(t.store.storage.url.clone(), Arc::new(source))
                .with_file_groups(groups.into_iter().map(FileGroup::new).collect())
                .with_projection_indices(self.projection.clone())?
                .with_limit(self.limit)
                .build();
            inputs.push(DataSourceExec::from_data_source(conf));
        }
        if !set.batches.is_empty() || inputs.is_empty() {
            let n = lanes.min(set.batches.len()).max(1);
            let mut parts: Vec<Vec<RecordBatch>> = vec![Vec::new(); n];
            for (i, b) in set.batches.into_iter().enumerate() {
                parts[i % n].push(b);
            }
            // The batches have the projected columns already.
            let schema = self.projected.clone();
            inputs.push(MemorySourceConfig::try_new_exec(&parts, schema, None)?);
        }
        UnionExec::try_new(inputs)
    }
}

/// A scan's counters, shown by `EXPLAIN ANALYZE`.
#[derive(Debug)]
struct ScanMetrics {
    /// Parquet files read from the object store (not in the hot cache).
    files: Count,
    /// In-memory rows passed on after the chunk indexes narrowed them.
    memory_rows: Count,
}

impl ScanMetrics {
    fn new(set: &ExecutionPlanMetricsSet) -> Self {
        Self {
            files: MetricBuilder::new(set).global_counter("files_read"),
            memory_rows: MetricBuilder::new(set).global_counter("memory_rows"),
        }
    }
}

impl SluiceTable {
    /// Loads a file the hot cache missed into it in the background, if there is room.
    fn warm(&self, path: &str, bytes: u64) {
        // Decoded columns take a few times the compressed size.
        let estimate = usize::try_from(bytes)
            .unwrap_or(usize::MAX)
            .saturating_mul(5);
        if !self.store.hot.claim(path, estimate) {
            return;
        }
        let store = self.store.clone();
        let path = path.to_string();
        tokio::spawn(async move {
            let loaded = async {
                let bytes = store.storage.get(&path).await?;
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
                Ok(Some(batch)) => store.hot.insert(&path, &batch),
                Ok(None) => store.hot.abandon(&path),
                Err(e) => {
                    store.hot.abandon(&path);
                    tracing::debug!(error = %e, path, "hot cache: could not load file");
                }
            }
        });
    }
}

/// A table's scan. Its first run reads the table as it was when planned (the input `EXPLAIN`
/// shows: partitions, files, pruning); [`ExecutionPlan::reset_state`] readies it for another
/// run, which reads the table as it is then, so a plan kept for a repeated query (an alert)
/// sees every row applied since. Each run takes one snapshot, shared by its output
/// partitions.
#[derive(Debug)]
pub(crate) struct ScanExec {
    scan: Arc<Scan>,
    shown: Vec<u64>,
    of: usize,
    properties: Arc<PlanProperties>,
    /// The input made when planned, for the first run.
    planned: Option<Arc<dyn ExecutionPlan>>,
    /// A later run's input, made by the first partition executed.
    input: Mutex<Option<Arc<dyn ExecutionPlan>>>,
    metrics: ExecutionPlanMetricsSet,
}

impl DisplayAs for ScanExec {
    fn fmt_as(&self, _: DisplayFormatType, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        const SHOWN: usize = 16;
        let def = &self.scan.table.def;
        write!(
            f,
            "SluiceScan: {}.{} partitions={} of {} [",
            def.database,
            def.name,
            self.shown.len(),
            self.of
        )?;
        for (i, k) in self.shown.iter().take(SHOWN).enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{k}")?;
        }
        if self.shown.len() > SHOWN {
            write!(f, ", ... {} more", self.shown.len() - SHOWN)?;
        }
        f.write_str("]")
    }
}

impl ExecutionPlan for ScanExec {
    fn name(&self) -> &'static str {
        "SluiceScan"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        self.planned.iter().collect()
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
        if children.len() != self.planned.iter().len() {
            return Err(DataFusionError::Internal(
                "SluiceScan keeps the inputs it was planned with".into(),
            ));
        }
        Ok(Arc::new(Self {
            scan: self.scan.clone(),
            shown: self.shown.clone(),
            of: self.of,
            properties: self.properties.clone(),
            planned: children.pop(),
            input: Mutex::new(None),
            metrics: self.metrics.clone(),
        }))
    }

    fn reset_state(self: Arc<Self>) -> DfResult<Arc<dyn ExecutionPlan>> {
        Ok(Arc::new(Self {
            scan: self.scan.clone(),
            shown: self.shown.clone(),
            of: self.of,
            properties: self.properties.clone(),
            planned: None,
            input: Mutex::new(None),
            metrics: ExecutionPlanMetricsSet::new(),
        }))
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> DfResult<SendableRecordBatchStream> {
        let input = {
            let mut input = self.input.lock();
            match self.planned.as_ref().or(input.as_ref()) {
                Some(i) => i.clone(),
                None => {
                    let made = self.scan.input(&ScanMetrics::new(&self.metrics))?;
                    *input = Some(made.clone());
                    made
                }
            }
        };
        let n = input.properties().partitioning.partition_count();
        let lanes = self.scan.lanes;
        let streams = (partition..n)
            .step_by(lanes)
            .map(|j| input.execute(j, context.clone()))
            .collect::<DfResult<Vec<_>>>()?;
        let schema = self.properties.eq_properties.schema().clone();
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            schema,
            futures::stream::iter(streams).flatten(),
        )))
    }
}

/// A read-only in-memory table (system tables, SHOW results).
pub(crate) fn mem_table(batch: RecordBatch) -> DfResult<Arc<dyn TableProvider>> {
    Ok(Arc::new(MemTable::try_new(
        batch.schema(),
        vec![vec![batch]],
    )?))
}
