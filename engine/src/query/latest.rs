//! Latest row per key, from the last-value cache ([`crate::store::latest`]). The forms
//! people write for "the latest reading of every device" all become, after DataFusion's
//! own rules, one aggregate grouped by the key columns:
//!
//! - `SELECT DISTINCT ON (device) ... ORDER BY device, ts DESC` (each column a
//!   `first_value(c ORDER BY device, ts DESC)`),
//! - `last_value(c ORDER BY ts)` / `first_value(c ORDER BY ts DESC)` and `max(ts)`,
//!   `GROUP BY device`,
//! - QuestDB's `LATEST ON ts PARTITION BY device` (rewritten to `DISTINCT ON`,
//!   [`crate::query::dialect`]).
//!
//! Such an aggregate over one Sluice table (the whole table: no `WHERE PARTS`), filtered
//! only by conditions on the key columns and lower bounds on the time column, becomes a
//! [`LatestNode`]. A lower bound keeps its meaning on the newest rows: a key whose newest
//! row is older has no row in the range. When it runs, it filters the cache's rows; when
//! the cache is not complete (after a start, or after rows left the table), it runs the
//! aggregate it replaced, and the first such run fills the cache from the table in the
//! background ([`crate::query::kept`] runs it).

use crate::query::kept::Answering;
use crate::query::optimizer::{of_the_moment, run_replaced};
use crate::query::provider::SluiceTable;
use crate::store::catalog::TableDef;
use crate::types::Value;
use async_trait::async_trait;
use chrono::Utc;
use datafusion::arrow::array::AsArray;
use datafusion::arrow::compute::{cast, filter_record_batch};
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::common::{DFSchema, DFSchemaRef, ScalarValue};
use datafusion::datasource::{provider_as_source, source_as_provider};
use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::execution::session_state::SessionState;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::functions_aggregate::expr_fn::last_value;
use datafusion::logical_expr::expr::{
    AggregateFunction, NullTreatment, Sort, WindowFunctionDefinition,
};
use datafusion::logical_expr::simplify::SimplifyContext;
use datafusion::logical_expr::utils::{conjunction, split_conjunction};
use datafusion::logical_expr::{
    Aggregate, Expr, Filter, LogicalPlan, LogicalPlanBuilder, Operator, col,
};
use datafusion::optimizer::simplify_expressions::ExprSimplifier;
use datafusion::physical_expr::{PhysicalExpr, create_physical_expr};
use futures::TryStreamExt;
use std::sync::{Arc, OnceLock};

/// One output column of the aggregate, from the newest row of a key.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Out {
    /// A column's value (a key, or `first_value`/`last_value` of a column).
    Column(usize),
    /// `max(time)`: the time column, which must then be set in every row.
    MaxTime,
    /// `row_number() ... = 1`: one.
    One,
}

/// What a matched plan reads: the table (its scan) and the filters above and in the scan.
struct Source<'a> {
    table: SluiceTable,
    scan: &'a datafusion::logical_expr::TableScan,
    filters: Vec<&'a Expr>,
    keys: Vec<usize>,
    time: usize,
}

/// The table scan under `input` (through aliases, plain projections and one filter), when
/// it reads a whole table that keeps a last-value cache.
fn source(mut input: &LogicalPlan) -> Option<Source<'_>> {
    let mut filter = None;
    loop {
        input = match input {
            LogicalPlan::SubqueryAlias(a) => a.input.as_ref(),
            LogicalPlan::Projection(p) if p.expr.iter().all(|e| matches!(e, Expr::Column(_))) => {
                p.input.as_ref()
            }
            LogicalPlan::Filter(f) if filter.is_none() => {
                filter = Some(&f.predicate);
                f.input.as_ref()
            }
            _ => break,
        };
    }
    let LogicalPlan::TableScan(scan) = input else {
        return None;
    };
    let provider = source_as_provider(&scan.source).ok()?;
    let table = provider.downcast_ref::<SluiceTable>()?.clone();
    if scan.fetch.is_some() || !table.whole() {
        return None;
    }
    let (keys, time) = table.state().latest.shape()?;
    let filters = (filter.into_iter().chain(&scan.filters))
        .flat_map(split_conjunction)
        .collect();
    Some(Source {
        table,
        scan,
        filters,
        keys,
        time,
    })
}

/// Whether `sorts`, the key columns aside, are exactly the time column in the order of
/// `asc` with NULL times as the newest (NULLS FIRST when descending, LAST when ascending).
fn by_time(sorts: &[Sort], def: &TableDef, keys: &[usize], time: usize, asc: bool) -> bool {
    let order: Vec<&Sort> = (sorts.iter())
        .filter(|s| column_of(&s.expr, def).is_none_or(|c| !keys.contains(&c)))
        .collect();
    matches!(&order[..], [s] if column_of(&s.expr, def) == Some(time)
        && s.asc == asc && s.nulls_first != asc)
}

/// Whether `exprs` are exactly the key columns, each once; their columns.
fn the_keys(exprs: &[Expr], def: &TableDef, keys: &[usize]) -> Option<Vec<usize>> {
    let mut out = Vec::with_capacity(exprs.len());
    for e in exprs {
        let c = column_of(e, def).filter(|c| keys.contains(c))?;
        if out.contains(&c) {
            return None;
        }
        out.push(c);
    }
    (out.len() == keys.len()).then_some(out)
}

/// An aggregate answered from the last-value cache (see the module docs).
#[derive(Debug, Clone)]
pub(crate) struct LatestNode {
    table: Arc<SluiceTable>,
    time: usize,
    outputs: Vec<Out>,
    /// The filters, over the table's columns (qualified as in `filter_schema`).
    filters: Vec<Expr>,
    filter_schema: DFSchemaRef,
    /// A filter or `max` reads the time column (rows without a time cannot answer).
    reads_time: bool,
    schema: DFSchemaRef,
    /// The aggregate this node replaced.
    fallback: LogicalPlan,
    label: String,
    fallback_state: Arc<OnceLock<SessionState>>,
}

crate::query::kept::answering_node!(LatestNode, "SluiceLatest");

/// The column `e` names, by index in `def`.
fn column_of(e: &Expr, def: &TableDef) -> Option<usize> {
    match e {
        Expr::Column(c) => def.column_index(&c.name),
        _ => None,
    }
}

/// Whether `e` is a lower bound on column `time` (`ts > x`, `ts >= x`, `x < ts`, `x <= ts`)
/// by an expression of no column.
fn lower_bound(e: &Expr, def: &TableDef, time: usize) -> bool {
    let Expr::BinaryExpr(b) = e else {
        return false;
    };
    let constant = |e: &Expr| e.column_refs().is_empty();
    match b.op {
        Operator::Gt | Operator::GtEq => {
            column_of(&b.left, def) == Some(time) && constant(&b.right)
        }
        Operator::Lt | Operator::LtEq => {
            column_of(&b.right, def) == Some(time) && constant(&b.left)
        }
        _ => false,
    }
}

impl LatestNode {
    /// The node for `agg` (the plan `plan`), when it asks for the newest row per key of a
    /// table that keeps a cache.
    pub(crate) fn try_new(agg: &Aggregate, plan: &LogicalPlan) -> Option<Self> {
        let src = source(agg.input.as_ref())?;
        let def = src.table.def();
        let (keys, time) = (&src.keys, src.time);
        let groups = the_keys(&agg.group_expr, &def, keys)?;
        let mut outputs: Vec<Out> = groups.iter().map(|c| Out::Column(*c)).collect();
        let mut reads_max = false;
        for e in &agg.aggr_expr {
            let e = match e {
                Expr::Alias(a) => a.expr.as_ref(),
                e => e,
            };
            let Expr::AggregateFunction(AggregateFunction { func, params }) = e else {
                return None;
            };
            if params.distinct || params.filter.is_some() || params.args.len() != 1 {
                return None;
            }
            if params.null_treatment == Some(NullTreatment::IgnoreNulls) {
                return None;
            }
            let c = column_of(&params.args[0], &def)?;
            let order = &params.order_by;
            outputs.push(match func.name() {
                "first_value" if by_time(order, &def, keys, time, false) => Out::Column(c),
                "last_value" if by_time(order, &def, keys, time, true) => Out::Column(c),
                "max" if c == time && order.is_empty() => {
                    reads_max = true;
                    Out::MaxTime
                }
                _ => return None,
            });
        }
        Self::build(src, outputs, reads_max, agg.schema.clone(), plan)
    }

    /// The node for `filter` (the plan `plan`) when it keeps the first row of
    /// `row_number() OVER (PARTITION BY keys ORDER BY time DESC)`.
    pub(crate) fn try_window(filter: &Filter, plan: &LogicalPlan) -> Option<Self> {
        let LogicalPlan::Window(window) = filter.input.as_ref() else {
            return None;
        };
        let [Expr::WindowFunction(f)] = &window.window_expr[..] else {
            return None;
        };
        let src = source(window.input.as_ref())?;
        let def = src.table.def();
        let p = &f.params;
        let is_row_number = matches!(&f.fun,
            WindowFunctionDefinition::WindowUDF(u) if u.name() == "row_number");
        if !is_row_number || p.filter.is_some() || !p.args.is_empty() {
            return None;
        }
        the_keys(&p.partition_by, &def, &src.keys)?;
        if !by_time(&p.order_by, &def, &src.keys, src.time, false) {
            return None;
        }
        // `rn = 1`, either way round.
        let Expr::BinaryExpr(b) = &filter.predicate else {
            return None;
        };
        let rn = window
            .schema
            .field(window.schema.fields().len() - 1)
            .name()
            .clone();
        let is_rn = |e: &Expr| matches!(e, Expr::Column(c) if c.name == rn);
        let is_one = |e: &Expr| matches!(e, Expr::Literal(v, _) if v.to_string() == "1" && v.data_type().is_integer());
        let one = (is_rn(&b.left) && is_one(&b.right)) || (is_one(&b.left) && is_rn(&b.right));
        if b.op != Operator::Eq || !one {
            return None;
        }
        let mut outputs = Vec::with_capacity(window.schema.fields().len());
        for field in window.input.schema().fields() {
            outputs.push(Out::Column(def.column_index(field.name())?));
        }
        outputs.push(Out::One);
        Self::build(src, outputs, false, filter.input.schema().clone(), plan)
    }

    fn build(
        src: Source,
        outputs: Vec<Out>,
        reads_max: bool,
        schema: DFSchemaRef,
        plan: &LogicalPlan,
    ) -> Option<Self> {
        let def = src.table.def();
        let mut reads_time = reads_max;
        let mut filters: Vec<Expr> = Vec::new();
        for e in src.filters {
            let on_keys = (e.column_refs().iter()).all(|c| {
                def.column_index(&c.name)
                    .is_some_and(|i| src.keys.contains(&i))
            });
            let bound = !on_keys && lower_bound(e, &def, src.time);
            if !on_keys && !bound {
                return None;
            }
            reads_time |= bound;
            if !filters.contains(e) {
                filters.push(e.clone());
            }
        }
        let table_schema = datafusion::datasource::TableProvider::schema(&src.table);
        let name = &src.scan.table_name;
        let qualified = DFSchema::try_from_qualified_schema(name.clone(), &table_schema);
        let shown: Vec<String> = schema.fields().iter().map(|f| f.name().clone()).collect();
        let mut label = format!("{name} [{}]", shown.join(", "));
        if !filters.is_empty() {
            let shown: Vec<String> = filters.iter().map(|e| e.to_string()).collect();
            label.push_str(&format!(" where {}", shown.join(" AND ")));
        }
        Some(Self {
            table: Arc::new(src.table),
            time: src.time,
            outputs,
            filters,
            filter_schema: Arc::new(qualified.ok()?),
            reads_time,
            schema,
            fallback: plan.clone(),
            label,
            fallback_state: Arc::default(),
        })
    }

    /// The answer from `rows` (the cache's newest rows, of the table's schema), or `None`
    /// when they cannot give it.
    fn answer_rows(&self, rows: &RecordBatch) -> DfResult<Option<RecordBatch>> {
        if self.reads_time && rows.column(self.time).null_count() > 0 {
            return Ok(None);
        }
        let rows = match conjunction(self.filters.iter().cloned()) {
            None => rows.clone(),
            Some(predicate) => {
                let now = Utc::now();
                let predicate = match self.filters.iter().any(of_the_moment) {
                    true => {
                        let context = SimplifyContext::builder()
                            .with_schema(self.filter_schema.clone())
                            .with_query_execution_start_time(Some(now))
                            .build();
                        ExprSimplifier::new(context).simplify(predicate)?
                    }
                    false => predicate,
                };
                let props = datafusion::execution::context::ExecutionProps::new()
                    .with_query_execution_start_time(now);
                let physical: Arc<dyn PhysicalExpr> = create_physical_expr(
                    &predicate,
                    &self.filter_schema,
                    &props,
                    &Default::default(),
                )?;
                let mask = physical.evaluate(rows)?.into_array(rows.num_rows())?;
                filter_record_batch(rows, mask.as_boolean())?
            }
        };
        let mut columns = Vec::with_capacity(self.outputs.len());
        for (out, field) in self.outputs.iter().zip(self.schema.fields()) {
            let column = match out {
                Out::Column(c) => rows.column(*c),
                Out::MaxTime => rows.column(self.time),
                Out::One => {
                    let one = ScalarValue::try_from(field.data_type())?;
                    let one = match one {
                        ScalarValue::UInt64(_) => ScalarValue::UInt64(Some(1)),
                        _ => ScalarValue::Int64(Some(1)),
                    };
                    &one.to_array_of_size(rows.num_rows())?
                }
            };
            columns.push(match column.data_type() == field.data_type() {
                true => column.clone(),
                false => cast(column, field.data_type())?,
            });
        }
        let schema: SchemaRef = Arc::new(self.schema.as_arrow().clone());
        Ok(Some(RecordBatch::try_new(schema, columns)?))
    }
}

/// Fills `table`'s cache (for its `generation`) from the whole table: the newest row of
/// each key, computed by DataFusion.
pub(crate) async fn fill(table: Arc<SluiceTable>, generation: u64, ctx: Arc<TaskContext>) {
    let state = &table.state().clone();
    let rows = async {
        let def = table.def();
        let (keys, time) = state.latest.shape().ok_or_else(|| {
            DataFusionError::Internal("the table keeps no last-value cache".into())
        })?;
        let name = |i: usize| col(datafusion::common::Column::from_name(&def.columns[i].name));
        let newest = |i: usize| last_value(name(i), vec![name(time).sort(true, false)]);
        let plan =
            LogicalPlanBuilder::scan(def.name.as_str(), provider_as_source(table.clone()), None)?
                .aggregate(
                    keys.iter().map(|k| name(*k)),
                    (0..def.columns.len()).map(newest),
                )?
                .build()?;
        let batches: Vec<RecordBatch> = run_replaced(&OnceLock::new(), &plan, ctx, None)
            .await?
            .try_collect()
            .await?;
        let mut rows = Vec::new();
        for b in &batches {
            for r in 0..b.num_rows() {
                let row = (keys.len()..b.num_columns())
                    .map(|c| ScalarValue::try_from_array(b.column(c), r).map(value))
                    .collect::<DfResult<Vec<Value>>>()?;
                rows.push(row);
            }
        }
        Ok::<_, DataFusionError>(rows)
    }
    .await;
    match rows {
        Ok(rows) => {
            tracing::debug!(table = %table.def().name, keys = rows.len(), "last-value cache filled");
            state.latest.filled(generation, Some(rows));
        }
        Err(e) => {
            tracing::warn!(table = %table.def().name, error = %e, "last-value cache not filled");
            state.latest.filled(generation, None);
        }
    }
}

/// A value of a table's column, as rows hold it.
fn value(s: ScalarValue) -> Value {
    use ScalarValue as S;
    match s {
        S::Boolean(Some(b)) => Value::Bool(b),
        S::Int8(Some(v)) => Value::Int(v.into()),
        S::Int16(Some(v)) => Value::Int(v.into()),
        S::Int32(Some(v)) => Value::Int(v.into()),
        S::Int64(Some(v)) => Value::Int(v),
        S::UInt8(Some(v)) => Value::UInt(v.into()),
        S::UInt16(Some(v)) => Value::UInt(v.into()),
        S::UInt32(Some(v)) => Value::UInt(v.into()),
        S::UInt64(Some(v)) => Value::UInt(v),
        S::Float32(Some(v)) => Value::Float(v.into()),
        S::Float64(Some(v)) => Value::Float(v),
        S::Utf8(Some(s)) | S::LargeUtf8(Some(s)) | S::Utf8View(Some(s)) => Value::Str(s),
        S::Binary(Some(b)) | S::LargeBinary(Some(b)) | S::BinaryView(Some(b)) => Value::Bytes(b),
        S::TimestampMicrosecond(Some(t), _) => Value::Timestamp(t),
        S::Date32(Some(d)) => Value::Date(d),
        _ => Value::Null,
    }
}

#[async_trait]
impl Answering for LatestNode {
    const NAME: &'static str = "SluiceLatestExec";
    const FROM_KEPT: &'static str = "from_cache";
    const FROM_SCAN: &'static str = "from_scan";

    fn label(&self) -> &str {
        &self.label
    }

    fn output(&self) -> &DFSchemaRef {
        &self.schema
    }

    /// From the cache; when it is not complete, the first caller starts filling it.
    async fn answer(
        &self,
        ctx: &Arc<TaskContext>,
        _now: chrono::DateTime<Utc>,
    ) -> DfResult<Option<RecordBatch>> {
        let state = self.table.state();
        let def = state.def();
        let types: Vec<_> = def.columns.iter().map(|c| c.ty).collect();
        let partial = self.table.store().partial();
        match state.latest.snapshot(&state.schema(), &types) {
            // The cache is current for the keys of the shards this node holds; the other
            // keys' newest rows come from their replicas' caches.
            Ok(rows) if partial => {
                let store = self.table.store();
                match crate::store::remote::latest_rows(store, state, rows).await {
                    Some(all) => self.answer_rows(&all),
                    None => Ok(None),
                }
            }
            Ok(rows) => self.answer_rows(&rows),
            Err(Some(generation)) => {
                tokio::spawn(fill(self.table.clone(), generation, ctx.clone()));
                Ok(None)
            }
            Err(None) => Ok(None),
        }
    }

    async fn fallback(
        &self,
        ctx: Arc<TaskContext>,
        now: chrono::DateTime<Utc>,
    ) -> DfResult<SendableRecordBatchStream> {
        let now = self.filters.iter().any(of_the_moment).then_some(now);
        run_replaced(&self.fallback_state, &self.fallback, ctx, now).await
    }
}
