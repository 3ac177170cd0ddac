//! Answers from synopses: an aggregate (grouped by nothing, or by few-valued columns and
//! `date(ts)`, see [`crate::query::groups`]) whose functions are `count`, `sum`,
//! `min`, `max` and `avg` over plain columns of one Sluice table, scanning whole partitions
//! (`WHERE PARTS` is fine), or filtered only by bounds on its time partition column
//! (`ts >= '...'`, `ts > now() - INTERVAL '30 seconds'`) and string equalities
//! (`device = 'd-7'`, `site IN ('a', 'b')`), becomes a [`SynopsisNode`]. When it runs it
//! computes its answer (one row, or a row per group) from the synopses of the files and buffer chunks wholly
//! inside the bounds ([`crate::query::synopsis`]), from per-value synopses kept by indexed chunks
//! for the equalities, and from the filtered rows of the chunks that straddle a bound. When
//! that cannot be done then (a file written before synopses, a file to filter that is not in
//! the hot cache, an integer sum past i64) it plans and runs the aggregate it replaced, so
//! the answer is always the one a scan would give.
//!
//! The answer is computed when the plan runs, not when it is optimized, so a plan kept for
//! a repeated query (an alert on one device's newest partition) stays valid as rows arrive.

use crate::query::groups::{Answer, GroupKey, Key};
use crate::query::kept::{Answering, AnsweringPlanner};
use crate::query::latest::LatestNode;
use crate::query::provider::{SluiceTable, row_filter};
use crate::query::synopsis::{ColumnSynopsis, Num};
use crate::store::catalog::TableDef;
use crate::store::chunk::{RowFilter, comparable};
use crate::store::remote::{Remote, SummaryQuery};
use async_trait::async_trait;
use chrono::{DateTime, Utc};
use datafusion::arrow::array::new_empty_array;
use datafusion::arrow::datatypes::{DataType, SchemaRef, TimeUnit};
use datafusion::arrow::record_batch::{RecordBatch, RecordBatchOptions};
use datafusion::catalog::Session;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::{DFSchema, DFSchemaRef, ScalarValue};
use datafusion::datasource::source_as_provider;
use datafusion::error::Result as DfResult;
use datafusion::execution::context::QueryPlanner;
use datafusion::execution::session_state::{SessionState, SessionStateBuilder};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::logical_expr::Volatility;
use datafusion::logical_expr::expr::AggregateFunction;
use datafusion::logical_expr::simplify::SimplifyContext;
use datafusion::logical_expr::utils::split_conjunction;
use datafusion::logical_expr::{Aggregate, Expr, Extension, LogicalPlan, UserDefinedLogicalNode};
use datafusion::optimizer::simplify_expressions::ExprSimplifier;
use datafusion::optimizer::{ApplyOrder, OptimizerConfig, OptimizerRule};
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_planner::{DefaultPhysicalPlanner, ExtensionPlanner, PhysicalPlanner};
use std::sync::{Arc, OnceLock};

/// The optimizer rule. It runs last, on the plan DataFusion's rules made (filters pushed
/// into the scan, constants and `now()` folded).
#[derive(Debug, Default)]
pub(crate) struct SynopsisRule;

impl OptimizerRule for SynopsisRule {
    fn name(&self) -> &str {
        "sluice_synopsis"
    }

    /// The rule walks the plan itself, so that it does not look inside a node it made.
    fn apply_order(&self) -> Option<ApplyOrder> {
        None
    }

    fn supports_rewrite(&self) -> bool {
        true
    }

    fn rewrite(
        &self,
        plan: LogicalPlan,
        _config: &dyn OptimizerConfig,
    ) -> DfResult<Transformed<LogicalPlan>> {
        plan.transform_down_with_subqueries(|p| {
            let node = match &p {
                LogicalPlan::Extension(e) if e.node.as_any().is::<SynopsisNode>() => {
                    return Ok(Transformed::new(p, false, TreeNodeRecursion::Jump));
                }
                LogicalPlan::Extension(e) if e.node.as_any().is::<LatestNode>() => {
                    return Ok(Transformed::new(p, false, TreeNodeRecursion::Jump));
                }
                // The last-value cache first: what it answers, synopses would only scan.
                LogicalPlan::Aggregate(agg) => match LatestNode::try_new(agg, &p) {
                    Some(n) => Some(Arc::new(n) as Arc<dyn UserDefinedLogicalNode>),
                    None => SynopsisNode::try_new(agg, &p)
                        .map(|n| Arc::new(n) as Arc<dyn UserDefinedLogicalNode>),
                },
                LogicalPlan::Filter(f) => LatestNode::try_window(f, &p)
                    .map(|n| Arc::new(n) as Arc<dyn UserDefinedLogicalNode>),
                _ => None,
            };
            Ok(match node {
                Some(node) => Transformed::new(
                    LogicalPlan::Extension(Extension { node }),
                    true,
                    TreeNodeRecursion::Jump,
                ),
                None => Transformed::no(p),
            })
        })
    }
}

/// What one aggregate asks of the synopsis.
#[derive(Debug, Clone, Copy)]
enum Want {
    /// `count(*)` / `count(1)`.
    Rows,
    Count(usize),
    Sum(usize),
    Avg(usize),
    Min(usize),
    Max(usize),
}

/// The column an aggregate argument reads, looking through the widening casts the planner
/// adds (Int8 -> Int64, Float32 -> Float64): a cast that could change a value (to a narrower
/// or other type) is not looked through, so such an aggregate is computed by a scan.
fn column<'a>(e: &'a Expr, schema: &SchemaRef) -> Option<&'a str> {
    let (inner, to) = match e {
        Expr::Column(c) => return Some(&c.name),
        Expr::Cast(c) => (c.expr.as_ref(), c.field.data_type()),
        _ => return None,
    };
    let name = column(inner, schema)?;
    let from = schema.field_with_name(name).ok()?.data_type();
    let widening = match to {
        DataType::Int64 => from.is_signed_integer(),
        DataType::UInt64 => from.is_unsigned_integer(),
        DataType::Float64 => from.is_integer() || from.is_floating(),
        _ => false,
    };
    widening.then_some(name)
}

/// An aggregate answered from synopses when it runs ([`SynopsisRule`]): a leaf of the plan
/// that holds the aggregate it replaced, planned and run only when synopses cannot answer.
#[derive(Debug, Clone)]
pub(crate) struct SynopsisNode {
    table: Arc<SluiceTable>,
    /// What a `GROUP BY` groups by, answered from group synopses.
    group: Vec<GroupKey>,
    wants: Vec<Want>,
    /// The table's columns the aggregates read, each once.
    columns: Vec<usize>,
    filter: RowFilter,
    /// Filters that read the clock (`ts > now() - INTERVAL '30 seconds'`), bound each run.
    unbound: Option<Unbound>,
    schema: DFSchemaRef,
    /// The aggregate this node replaced.
    fallback: LogicalPlan,
    /// What EXPLAIN shows; also what tells two nodes apart.
    label: String,
    /// The state the fallback is planned in, made on the first fallback.
    fallback_state: Arc<OnceLock<SessionState>>,
    /// Groups of sealed chunks are being computed and kept in the background.
    priming: Arc<tokio::sync::watch::Sender<bool>>,
}

/// Rows of sealed chunks a `GROUP BY` answer may group from their rows as it runs (and
/// keep, [`crate::store::chunk`]): about as long as DataFusion's scan of them would take.
/// Past that the scan answers, and the chunks' groups are kept in the background for the
/// next run (made on every core; the next runs wait for them, [`PRIMING_WAIT`]).
const GROUP_ROWS_INLINE: u64 = 1 << 20;

/// How long a `GROUP BY` answer waits for the chunks' groups being kept in the background
/// before it scans instead.
const PRIMING_WAIT: std::time::Duration = std::time::Duration::from_millis(500);

/// Turns a node's `priming` off when its background grouping ends, however it ends.
struct Primed(Arc<tokio::sync::watch::Sender<bool>>);

impl Drop for Primed {
    fn drop(&mut self) {
        self.0.send_replace(false);
    }
}

crate::query::kept::answering_node!(SynopsisNode, "SluiceSynopsis");

impl SynopsisNode {
    /// The node for `agg` (the plan `plan`), when synopses can answer an aggregate of its
    /// shape.
    fn try_new(agg: &Aggregate, plan: &LogicalPlan) -> Option<Self> {
        if agg.group_expr.is_empty() && agg.aggr_expr.is_empty() {
            return None;
        }
        let mut input = agg.input.as_ref();
        let mut filter = None;
        loop {
            input = match input {
                LogicalPlan::SubqueryAlias(a) => a.input.as_ref(),
                LogicalPlan::Projection(p)
                    if p.expr.iter().all(|e| matches!(e, Expr::Column(_))) =>
                {
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
        if scan.fetch.is_some() {
            return None;
        }
        let provider = source_as_provider(&scan.source).ok()?;
        let table = provider.downcast_ref::<SluiceTable>()?;
        let def = table.def();
        // A filter pushed into the scan is also above it (pushdown is inexact): each once.
        let mut filters: Vec<&Expr> = Vec::new();
        for e in (filter.into_iter().chain(&scan.filters)).flat_map(split_conjunction) {
            if !filters.contains(&e) {
                filters.push(e);
            }
        }
        let schema = datafusion::datasource::TableProvider::schema(table);
        let mut group = Vec::with_capacity(agg.group_expr.len());
        for (e, field) in agg.group_expr.iter().zip(agg.schema.fields().iter()) {
            group.push(group_key(e, &def, &schema, field.data_type())?);
        }
        let (row_filter, unbound) = match filters.iter().any(|e| of_the_moment(e)) {
            false => (exact_filter(&def, filters.iter().copied())?, None),
            true => {
                let qualified =
                    DFSchema::try_from_qualified_schema(scan.table_name.clone(), &schema);
                let unbound = Unbound {
                    filters: filters.iter().map(|e| (*e).clone()).collect(),
                    schema: Arc::new(qualified.ok()?),
                };
                // Bound once now, to see that it is a filter synopses answer.
                (unbound.bind(&def, chrono::Utc::now())?, Some(unbound))
            }
        };
        let mut wants = Vec::new();
        let mut columns: Vec<usize> = Vec::new();
        let aggregate_fields = agg.schema.fields().iter().skip(group.len());
        for (e, field) in agg.aggr_expr.iter().zip(aggregate_fields) {
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
            let name = func.name();
            let arg = &params.args[0];
            if name == "count" && matches!(arg, Expr::Literal(v, _) if !v.is_null()) {
                if *field.data_type() != DataType::Int64 {
                    return None;
                }
                wants.push(Want::Rows);
                continue;
            }
            let c = def.column_index(column(arg, &schema)?)?;
            let slot = match columns.iter().position(|x| *x == c) {
                Some(i) => i,
                None => {
                    columns.push(c);
                    columns.len() - 1
                }
            };
            let want = match name {
                "count" => Want::Count(slot),
                "sum" => Want::Sum(slot),
                "avg" => Want::Avg(slot),
                "min" => Want::Min(slot),
                "max" => Want::Max(slot),
                _ => return None,
            };
            if !answerable(want, schema.field(c).data_type(), field.data_type()) {
                return None;
            }
            wants.push(want);
        }
        let aggregates: Vec<String> = (agg.aggr_expr.iter())
            .map(|e| e.schema_name().to_string())
            .collect();
        let mut label = format!("{} [{}]", scan.table_name, aggregates.join(", "));
        if !agg.group_expr.is_empty() {
            let shown: Vec<String> = agg.group_expr.iter().map(|e| e.to_string()).collect();
            label.push_str(&format!(" group by {}", shown.join(", ")));
        }
        if !filters.is_empty() {
            let shown: Vec<String> = filters.iter().map(|e| e.to_string()).collect();
            label.push_str(&format!(" where {}", shown.join(" AND ")));
        }
        Some(Self {
            table: Arc::new(table.clone()),
            group,
            wants,
            columns,
            filter: row_filter,
            unbound,
            schema: agg.schema.clone(),
            fallback: plan.clone(),
            label,
            fallback_state: Arc::default(),
            priming: Arc::new(tokio::sync::watch::Sender::new(false)),
        })
    }

    /// The one-row answer from synopses with the clock at `now`, or `None` when they cannot
    /// give it. A `GROUP BY` may group `budget` rows of sealed chunks from their rows; past
    /// that it gives `None`, and [`Answer::over_budget`] is set in the second value.
    fn answer(
        &self,
        now: DateTime<Utc>,
        budget: u64,
        remote: &Remote,
    ) -> (Option<RecordBatch>, bool) {
        let Some(filter) = self.filter_at(now) else {
            return (None, false);
        };
        let filter = filter.as_ref();
        if !self.group.is_empty() {
            return self.grouped(filter, budget, remote);
        }
        (self.ungrouped(filter, remote), false)
    }

    /// The filter with the clock at `now` (`None`: it cannot be bound then).
    fn filter_at(&self, now: DateTime<Utc>) -> Option<std::borrow::Cow<'_, RowFilter>> {
        match &self.unbound {
            Some(u) => u.bind(&self.table.def(), now).map(std::borrow::Cow::Owned),
            None => Some(std::borrow::Cow::Borrowed(&self.filter)),
        }
    }

    fn ungrouped(&self, filter: &RowFilter, remote: &Remote) -> Option<RecordBatch> {
        let (rows, syn) = self.table.synopsis_where(&self.columns, filter, remote)?;
        let schema: SchemaRef = self.schema.inner().clone();
        let mut columns = Vec::with_capacity(self.wants.len());
        for (want, field) in self.wants.iter().zip(schema.fields().iter()) {
            let v = value(*want, rows, &syn, field.data_type())?;
            columns.push(v.to_array().ok()?);
        }
        RecordBatch::try_new(schema, columns).ok()
    }

    /// The answer to a `GROUP BY` from group synopses (rows in key order), or `None`.
    fn grouped(
        &self,
        filter: &RowFilter,
        budget: u64,
        remote: &Remote,
    ) -> (Option<RecordBatch>, bool) {
        let mut answer = Answer::new(self.group.clone(), self.columns.clone());
        answer.budget = budget;
        let done = self.table.groups_where(&mut answer, filter, remote);
        let over = answer.over_budget;
        (done.and_then(|()| self.grouped_batch(answer)), over)
    }

    fn grouped_batch(&self, answer: Answer) -> Option<RecordBatch> {
        let mut groups: Vec<_> = answer.groups.into_iter().collect();
        groups.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        let schema: SchemaRef = self.schema.inner().clone();
        let mut columns = Vec::with_capacity(schema.fields().len());
        for (i, field) in schema.fields().iter().enumerate() {
            let ty = field.data_type();
            let values: Vec<ScalarValue> = match i.checked_sub(self.group.len()) {
                None => (groups.iter())
                    .map(|(key, _)| key_value(&key[i], ty))
                    .collect::<Option<_>>()?,
                Some(a) => (groups.iter())
                    .map(|(_, (rows, syn))| value(*self.wants.get(a)?, *rows, syn, ty))
                    .collect::<Option<_>>()?,
            };
            columns.push(match values.is_empty() {
                true => new_empty_array(ty),
                false => ScalarValue::iter_to_array(values).ok()?,
            });
        }
        let options = RecordBatchOptions::new().with_row_count(Some(groups.len()));
        RecordBatch::try_new_with_options(schema, columns, &options).ok()
    }

    /// Plans and runs the aggregate this node replaced, with the clock at `now`.
    async fn fallback(
        &self,
        ctx: Arc<TaskContext>,
        now: DateTime<Utc>,
    ) -> DfResult<SendableRecordBatchStream> {
        let now = self.unbound.is_some().then_some(now);
        run_replaced(&self.fallback_state, &self.fallback, ctx, now).await
    }
}

/// Plans and runs `plan` (what a node of ours replaced) in DataFusion's own session state
/// (made once, in `state`); with `now`, optimized again first to fold the clock in (and
/// prune by it).
pub(crate) async fn run_replaced(
    state: &OnceLock<SessionState>,
    plan: &LogicalPlan,
    ctx: Arc<TaskContext>,
    now: Option<DateTime<Utc>>,
) -> DfResult<SendableRecordBatchStream> {
    let state = state.get_or_init(|| {
        SessionStateBuilder::new()
            .with_config(ctx.session_config().clone())
            .with_runtime_env(ctx.runtime_env())
            .with_default_features()
            .build()
    });
    let plan = match now {
        Some(now) => {
            let clock = Clock {
                state,
                now: Some(now),
            };
            (state.optimizer()).optimize(plan.clone(), &clock, |_, _| {})?
        }
        None => plan.clone(),
    };
    let physical = (state.query_planner())
        .create_physical_plan(&plan, state)
        .await?;
    datafusion::physical_plan::execute_stream(physical, ctx)
}

/// What `want` answers from a synopsis of `rows` rows, as a value of type `ty`; `None` when
/// it cannot (a sum past the type, min/max of a column without order, another type).
fn value(want: Want, rows: u64, syn: &[ColumnSynopsis], ty: &DataType) -> Option<ScalarValue> {
    let v = match want {
        Want::Rows => ScalarValue::Int64(Some(i64::try_from(rows).ok()?)),
        Want::Count(s) => ScalarValue::Int64(Some(i64::try_from(syn.get(s)?.count).ok()?)),
        Want::Sum(s) => sum(syn.get(s)?, ty)?,
        Want::Avg(s) => avg(syn.get(s)?, ty)?,
        Want::Min(s) => bound(syn.get(s)?, syn.get(s)?.min, ty)?,
        Want::Max(s) => bound(syn.get(s)?, syn.get(s)?.max, ty)?,
    };
    (v.data_type() == *ty).then_some(v)
}

/// What group synopses group by for `GROUP BY e` (a column of a key type, or `date(ts)` of
/// a microsecond timestamp column), when the group's values are of type `ty`.
fn group_key(e: &Expr, def: &TableDef, schema: &SchemaRef, ty: &DataType) -> Option<GroupKey> {
    let column = |e: &Expr| match e {
        Expr::Column(c) => def.column_index(&c.name),
        _ => None,
    };
    match e {
        Expr::Column(_) => {
            let i = column(e)?;
            let of = schema.field(i).data_type();
            (of == ty && crate::query::groups::keyable(of)).then_some(GroupKey::Column(i))
        }
        Expr::ScalarFunction(f) if f.func.name() == "date" && f.args.len() == 1 => {
            let i = column(&f.args[0])?;
            let of = schema.field(i).data_type();
            let micros = DataType::Timestamp(TimeUnit::Microsecond, None);
            (*of == micros && *ty == DataType::Date32).then_some(GroupKey::Day(i))
        }
        _ => None,
    }
}

/// Filters that read the clock, with the schema their columns are named in.
#[derive(Debug, Clone)]
struct Unbound {
    filters: Vec<Expr>,
    schema: DFSchemaRef,
}

impl Unbound {
    /// The filters with the clock at `now`, as a [`RowFilter`] (`None` if they are not one).
    fn bind(&self, def: &TableDef, now: DateTime<Utc>) -> Option<RowFilter> {
        let context = SimplifyContext::builder()
            .with_schema(self.schema.clone())
            .with_query_execution_start_time(Some(now))
            .build();
        let simplifier = ExprSimplifier::new(context);
        let bound: Vec<Expr> = (self.filters.iter())
            .map(|e| simplifier.simplify(e.clone()).ok())
            .collect::<Option<_>>()?;
        exact_filter(def, bound.iter())
    }
}

/// Whether `e` calls a function that is not immutable (`now()`, `random()`).
pub(crate) fn of_the_moment(e: &Expr) -> bool {
    e.exists(|e| {
        Ok(matches!(e, Expr::ScalarFunction(f)
            if f.func.signature().volatility != Volatility::Immutable))
    })
    .unwrap_or(true)
}

/// Whether a synopsis of a column of type `from` answers `want` as a value of type `ty`:
/// counts as Int64; min and max of numbers, dates and times (not text, whose synopsis has no
/// order) as their own type or a widening of it; sums of integers as integers and of floats
/// as floats; averages of numbers as Float64.
fn answerable(want: Want, from: &DataType, ty: &DataType) -> bool {
    let number = from.is_integer() || from.is_floating();
    match want {
        Want::Rows | Want::Count(_) => *ty == DataType::Int64,
        Want::Min(_) | Want::Max(_) => {
            let ordered = number
                || matches!(
                    from,
                    DataType::Date32 | DataType::Timestamp(TimeUnit::Microsecond, _)
                );
            ordered && (ty == from || *ty == DataType::Float64 || ty.is_integer())
        }
        Want::Sum(_) => {
            (from.is_integer() && matches!(ty, DataType::Int64 | DataType::UInt64))
                || (from.is_floating() && *ty == DataType::Float64)
        }
        Want::Avg(_) => number && *ty == DataType::Float64,
    }
}

/// The session's optimizer settings with a given time for `now()` (`None`: left unfolded).
/// A session's own clock is set once, when it is made.
pub(crate) struct Clock<'a> {
    pub state: &'a SessionState,
    pub now: Option<DateTime<Utc>>,
}

impl OptimizerConfig for Clock<'_> {
    fn query_execution_start_time(&self) -> Option<DateTime<Utc>> {
        self.now
    }

    fn alias_generator(&self) -> &Arc<datafusion::common::alias::AliasGenerator> {
        &self.state.execution_props().alias_generator
    }

    fn options(&self) -> Arc<datafusion::config::ConfigOptions> {
        self.state.config_options().clone()
    }

    fn function_registry(&self) -> Option<&dyn datafusion::execution::FunctionRegistry> {
        Some(self.state)
    }
}

/// The [`RowFilter`] that is exactly `filters`, when each of them is a bound on the table's
/// partition column (`ts >= '...'`, `ts > now() - INTERVAL '1 minute'`), a string equality
/// (`device = 'd-7'`, `device IN ('a', 'b')`) or a number column compared with a number of
/// its kind (`total_amount < 0`, `passenger_count > 3`).
fn exact_filter<'a>(def: &TableDef, filters: impl Iterator<Item = &'a Expr>) -> Option<RowFilter> {
    let mut out = RowFilter::default();
    for e in filters.flat_map(split_conjunction) {
        let f = row_filter(def, std::slice::from_ref(e));
        match (&f.time[..], &f.equal[..], &f.value[..]) {
            ([(col, _, _)], [], []) if *col == def.partition_column => out.time.extend(f.time),
            ([], [_], []) => out.equal.extend(f.equal),
            ([], [], [(col, _, v)]) if comparable(&def.columns[*col].ty.arrow(), *v) => {
                out.value.extend(f.value)
            }
            _ => return None,
        }
    }
    Some(out)
}

/// Plans Sluice's own nodes ([`SynopsisNode`], [`LatestNode`]: [`crate::query::kept`]) and
/// the rest as DataFusion does.
#[derive(Debug)]
pub(crate) struct SluiceQueryPlanner;

#[async_trait]
impl QueryPlanner for SluiceQueryPlanner {
    async fn create_physical_plan(
        &self,
        plan: &LogicalPlan,
        state: &dyn Session,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        let planners: Vec<Arc<dyn ExtensionPlanner + Send + Sync>> = vec![
            Arc::new(AnsweringPlanner::<SynopsisNode>::new()),
            Arc::new(AnsweringPlanner::<LatestNode>::new()),
        ];
        DefaultPhysicalPlanner::with_extension_planners(planners)
            .create_physical_plan(plan, state)
            .await
    }
}

#[async_trait]
impl Answering for SynopsisNode {
    const NAME: &'static str = "SluiceSynopsisExec";
    const FROM_KEPT: &'static str = "from_synopsis";
    const FROM_SCAN: &'static str = "from_scan";

    fn label(&self) -> &str {
        &self.label
    }

    fn output(&self) -> &DFSchemaRef {
        &self.schema
    }

    async fn answer(
        &self,
        _ctx: &Arc<TaskContext>,
        now: DateTime<Utc>,
    ) -> DfResult<Option<RecordBatch>> {
        if !self.group.is_empty() {
            self.table.load_groups(&self.filter).await;
        }
        // The groups being made in the background are ready sooner than a scan competing
        // with them for the cores would answer: wait for them (a while at most).
        let mut primed = self.priming.subscribe();
        let _ = tokio::time::timeout(PRIMING_WAIT, primed.wait_for(|priming| !priming)).await;
        // With the synopses of the buffered rows of shards held on other nodes, from their
        // replicas (none when all are held here).
        let filter = self.filter_at(now);
        let summary = (filter.as_deref()).map(|f| SummaryQuery::new(&self.group, &self.columns, f));
        let answer = |remote: &Remote| SynopsisNode::answer(self, now, GROUP_ROWS_INLINE, remote);
        let answered = crate::query::summaries::answered(&self.table, summary, answer);
        let ((batch, over), remote) = answered
            .await
            .map_err(|e| datafusion::error::DataFusionError::External(Box::new(e)))?;
        // Started once at a time: the one that turns `priming` on.
        let start = || {
            self.priming
                .send_if_modified(|p| !std::mem::replace(p, true))
        };
        if over && start() {
            let node = self.clone();
            tokio::task::spawn_blocking(move || {
                let _done = Primed(node.priming.clone());
                SynopsisNode::answer(&node, now, u64::MAX, &remote);
            });
        }
        Ok(batch)
    }

    async fn fallback(
        &self,
        ctx: Arc<TaskContext>,
        now: DateTime<Utc>,
    ) -> DfResult<SendableRecordBatchStream> {
        SynopsisNode::fallback(self, ctx, now).await
    }
}

fn null(ty: &DataType) -> Option<ScalarValue> {
    ScalarValue::try_from(ty).ok()
}

fn sum(s: &ColumnSynopsis, ty: &DataType) -> Option<ScalarValue> {
    if s.count == 0 {
        return null(ty);
    }
    Some(match (s.sum?, ty) {
        (Num::Int(v), DataType::Int64) => ScalarValue::Int64(Some(i64::try_from(v).ok()?)),
        (Num::Int(v), DataType::UInt64) => ScalarValue::UInt64(Some(u64::try_from(v).ok()?)),
        (Num::Float(v), DataType::Float64) => ScalarValue::Float64(Some(v)),
        _ => return None,
    })
}

fn avg(s: &ColumnSynopsis, ty: &DataType) -> Option<ScalarValue> {
    if *ty != DataType::Float64 {
        return None;
    }
    if s.count == 0 {
        return null(ty);
    }
    let v = match s.sum? {
        // Exact integer sum, one rounding.
        Num::Int(v) => v as f64 / s.count as f64,
        Num::Float(v) => v / s.count as f64,
    };
    Some(ScalarValue::Float64(Some(v)))
}

/// A group's value of a grouped column, as a value of type `ty`.
fn key_value(k: &Key, ty: &DataType) -> Option<ScalarValue> {
    let v = match k {
        Key::Null => return null(ty),
        Key::Bool(b) => ScalarValue::Boolean(Some(*b)),
        Key::Str(s) => ScalarValue::Utf8(Some(s.to_string())),
        Key::Int(i) if *ty == DataType::Date32 => {
            ScalarValue::Date32(Some(i32::try_from(*i).ok()?))
        }
        Key::Int(i) => int_value(*i, ty)?,
    };
    (v.data_type() == *ty).then_some(v)
}

/// An integer as a value of integer type `ty` (`None` if it does not fit, or `ty` is no
/// integer type).
fn int_value(i: i128, ty: &DataType) -> Option<ScalarValue> {
    Some(match ty {
        DataType::Int8 => ScalarValue::Int8(Some(i8::try_from(i).ok()?)),
        DataType::Int16 => ScalarValue::Int16(Some(i16::try_from(i).ok()?)),
        DataType::Int32 => ScalarValue::Int32(Some(i32::try_from(i).ok()?)),
        DataType::Int64 => ScalarValue::Int64(Some(i64::try_from(i).ok()?)),
        DataType::UInt8 => ScalarValue::UInt8(Some(u8::try_from(i).ok()?)),
        DataType::UInt16 => ScalarValue::UInt16(Some(u16::try_from(i).ok()?)),
        DataType::UInt32 => ScalarValue::UInt32(Some(u32::try_from(i).ok()?)),
        DataType::UInt64 => ScalarValue::UInt64(Some(u64::try_from(i).ok()?)),
        _ => return None,
    })
}

fn bound(s: &ColumnSynopsis, v: Option<Num>, ty: &DataType) -> Option<ScalarValue> {
    if s.count == 0 {
        return null(ty);
    }
    if !s.ordered {
        return None;
    }
    let int = |n: Num| match n {
        Num::Int(i) => Some(i),
        Num::Float(_) => None,
    };
    let v = v?;
    Some(match ty {
        ty if ty.is_integer() => int_value(int(v)?, ty)?,
        // Values were Float32 to begin with, so this conversion is exact.
        DataType::Float32 => ScalarValue::Float32(Some(v.as_f64() as f32)),
        DataType::Float64 => ScalarValue::Float64(Some(v.as_f64())),
        DataType::Date32 => ScalarValue::Date32(Some(i32::try_from(int(v)?).ok()?)),
        DataType::Timestamp(TimeUnit::Microsecond, tz) => {
            ScalarValue::TimestampMicrosecond(Some(i64::try_from(int(v)?).ok()?), tz.clone())
        }
        _ => return None,
    })
}
