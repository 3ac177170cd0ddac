//! Window functions over a [`KeyedSortExec`]'s keys (`lag(x) OVER (PARTITION BY device
//! ORDER BY time)`): [`KeyedWindowExec`] replaces the window operator and the sort under it.
//!
//! The sort already knows where each key's rows begin and end, so the window's partitions
//! need not be found again by comparing the keys row by row (what DataFusion's window
//! operators do, a `memcmp` per row for a text key). Each key's rows are gathered, in
//! batches of whole keys, and each window function evaluated over each key's slice.
//! With many small keys (fewer than [`MIN_KEY_ROWS`] rows each on average) the
//! per-key evaluation would cost more than it saves: the sorted rows then go to the
//! window operator it replaced, as they do when memory runs short. Input columns that the
//! projection above does not read are not gathered (NULLs stand in).

use super::{BATCH_ROWS, KeyedSortExec, Once, read_all};
use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, RecordBatch, UInt32Array, new_null_array,
};
use datafusion::arrow::compute::kernels::filter::{filter as filter_array, prep_null_mask_filter};
use datafusion::arrow::compute::{concat, take, take_record_batch};
use datafusion::arrow::datatypes::Schema;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::error::DataFusionError;
use datafusion::error::Result as DfResult;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_plan::expressions::Column;
use datafusion::physical_plan::filter::FilterExec;
use datafusion::physical_plan::metrics::{ExecutionPlanMetricsSet, MetricBuilder, MetricsSet};
use datafusion::physical_plan::projection::{ProjectionExec, ProjectionExpr};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::windows::{BoundedWindowAggExec, WindowAggExec};
use datafusion::physical_plan::{
    ChildrenPropertiesMode, DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties,
    ReplaceChildrenOptions, WindowExpr,
};
use futures::TryStreamExt;
use std::sync::Arc;

const RECOMPUTE: ReplaceChildrenOptions =
    ReplaceChildrenOptions::new(ChildrenPropertiesMode::Recompute);

/// Fewer rows per key than this on average: the window operator finds the keys' bounds.
const MIN_KEY_ROWS: usize = 64;

/// A window operator whose partitions are a [`KeyedSortExec`]'s keys, and the sort.
#[derive(Debug, Clone)]
pub(crate) struct KeyedWindowExec {
    /// The window operator it replaces (run over the sorted rows when keys are small or
    /// memory short).
    window: Arc<dyn ExecutionPlan>,
    exprs: Vec<Arc<dyn WindowExpr>>,
    sort: KeyedSortExec,
    /// Input columns (nullable ones) that neither the operator above nor the window
    /// functions read: output as NULLs instead of gathered.
    unread: Vec<usize>,
    /// The predicate of a filter above (over this operator's output), applied here so that
    /// the `late` input columns are gathered only for the rows it keeps.
    filter: Option<Arc<dyn PhysicalExpr>>,
    late: Vec<usize>,
    metrics: ExecutionPlanMetricsSet,
}

impl KeyedWindowExec {
    /// The replacement for `window`, when its input is a [`KeyedSortExec`] by its
    /// partitions' keys then its one order column.
    pub(super) fn of(window: &Arc<dyn ExecutionPlan>) -> Option<Self> {
        let exprs = if let Some(w) = window.downcast_ref::<BoundedWindowAggExec>() {
            w.window_expr().to_vec()
        } else {
            window
                .downcast_ref::<WindowAggExec>()?
                .window_expr()
                .to_vec()
        };
        let [input] = window.children()[..] else {
            return None;
        };
        let sort = input.downcast_ref::<KeyedSortExec>()?;
        let column = |e: &Arc<dyn PhysicalExpr>| e.downcast_ref::<Column>().map(Column::index);
        let last = sort.ordering().last()?;
        let fits = |e: &Arc<dyn WindowExpr>| {
            let mut keys: Vec<usize> = (e.partition_by().iter()).filter_map(column).collect();
            keys.sort_unstable();
            let mut want = sort.keys.clone();
            want.sort_unstable();
            let order = e.order_by();
            keys.len() == e.partition_by().len()
                && keys == want
                && order.len() == 1
                && column(&order[0].expr) == Some(sort.last)
                && order[0].options == last.options
        };
        (!exprs.is_empty() && exprs.iter().all(fits)).then(|| Self {
            window: window.clone(),
            exprs,
            sort: sort.clone(),
            unread: Vec::new(),
            filter: None,
            late: Vec::new(),
            metrics: ExecutionPlanMetricsSet::new(),
        })
    }

    /// The input columns the window functions read (their arguments and order).
    fn window_reads(&self) -> Vec<usize> {
        use datafusion::physical_expr::utils::collect_columns;
        let mut read = Vec::new();
        for e in &self.exprs {
            let exprs = e.expressions().into_iter();
            let order = e.order_by().iter().map(|o| o.expr.clone());
            read.extend(
                exprs
                    .chain(order)
                    .flat_map(|x| collect_columns(&x))
                    .map(|c| c.index()),
            );
        }
        read
    }

    /// A filter over a [`KeyedWindowExec`], or over a projection of one (a condition on a
    /// window function's result: `lag(status) <> status`): the filter applied in the window
    /// operator, before the input columns only what is above reads are gathered.
    pub(super) fn filtered(filter: &Arc<dyn ExecutionPlan>) -> Option<Arc<dyn ExecutionPlan>> {
        use datafusion::common::tree_node::{Transformed, TreeNode};
        use datafusion::physical_expr::utils::collect_columns;
        let f = filter.downcast_ref::<FilterExec>()?;
        if f.fetch().is_some() {
            return None;
        }
        let p = f.input().downcast_ref::<ProjectionExec>();
        let w = match p {
            Some(p) => p.input().downcast_ref::<Self>()?,
            None => f.input().downcast_ref::<Self>()?,
        };
        if w.filter.is_some() {
            return None;
        }
        // The predicate over the window's output: each column of the projection's output
        // replaced by the projection's expression.
        let predicate = match p {
            None => f.predicate().clone(),
            Some(p) => {
                let column = |e: Arc<dyn PhysicalExpr>| {
                    Ok(match e.downcast_ref::<Column>() {
                        Some(c) => Transformed::yes(p.expr()[c.index()].expr.clone()),
                        None => Transformed::no(e),
                    })
                };
                f.predicate().clone().transform(column).ok()?.data
            }
        };
        let inputs = w.sort.sort.input().schema();
        let mut early = w.window_reads();
        early.extend(collect_columns(&predicate).iter().map(|c| c.index()));
        // What is read above: the projection's columns, or the filter's own.
        let above: Vec<usize> = match (p, f.projection()) {
            (Some(p), _) => (p.expr().iter())
                .flat_map(|e| collect_columns(&e.expr))
                .map(|c| c.index())
                .collect(),
            (None, Some(keep)) => keep.to_vec(),
            (None, None) => (0..w.schema().fields().len()).collect(),
        };
        let mut unread = w.unread.clone();
        if p.is_none() {
            unread.extend((0..inputs.fields().len()).filter(|i| {
                !early.contains(i) && !above.contains(i) && inputs.field(*i).is_nullable()
            }));
        }
        let late: Vec<usize> = (0..inputs.fields().len())
            .filter(|i| !early.contains(i) && !unread.contains(i) && above.contains(i))
            .collect();
        if late.is_empty() {
            return None;
        }
        let filtered = Arc::new(Self {
            unread,
            filter: Some(predicate),
            late,
            metrics: ExecutionPlanMetricsSet::new(),
            ..w.clone()
        });
        let projected: Arc<dyn ExecutionPlan> = match p {
            Some(p) => Arc::new(ProjectionExec::try_new(p.expr().to_vec(), filtered).ok()?),
            None => filtered,
        };
        let Some(keep) = f.projection() else {
            return Some(projected);
        };
        let schema = projected.schema();
        let keep = keep.iter().map(|i| ProjectionExpr {
            expr: Arc::new(Column::new(schema.field(*i).name(), *i)),
            alias: schema.field(*i).name().clone(),
        });
        Some(Arc::new(ProjectionExec::try_new(keep, projected).ok()?))
    }

    /// `projection` over a [`KeyedWindowExec`] with the input columns it does not read (nor
    /// the window functions) left ungathered.
    pub(super) fn trimmed(projection: &Arc<dyn ExecutionPlan>) -> Option<Arc<dyn ExecutionPlan>> {
        use datafusion::physical_expr::utils::collect_columns;
        let p = projection.downcast_ref::<ProjectionExec>()?;
        let w = p.input().downcast_ref::<Self>()?;
        if !w.unread.is_empty() || w.filter.is_some() {
            return None;
        }
        let mut read: Vec<usize> = (p.expr().iter())
            .flat_map(|e| collect_columns(&e.expr))
            .map(|c| c.index())
            .collect();
        read.extend(w.window_reads());
        let input = w.sort.sort.input().schema();
        let unread: Vec<usize> = (0..input.fields().len())
            .filter(|i| !read.contains(i) && input.field(*i).is_nullable())
            .collect();
        if unread.is_empty() {
            return None;
        }
        let trimmed = Self {
            unread,
            metrics: ExecutionPlanMetricsSet::new(),
            ..w.clone()
        };
        let projection = ProjectionExec::try_new(p.expr().to_vec(), Arc::new(trimmed)).ok()?;
        Some(Arc::new(projection))
    }

    /// The window operator over `sorted` rows (the sort's output).
    fn by_window(
        &self,
        sorted: SendableRecordBatchStream,
        context: Arc<TaskContext>,
    ) -> DfResult<SendableRecordBatchStream> {
        let once = Once::exec(sorted, vec![self.sort.ordering().clone()])?;
        let window = (self.window.clone()).replace_children(vec![once], RECOMPUTE)?;
        window.execute(0, context)
    }

    /// The output for the rows of `at` (row numbers into `whole`, in sorted order), whose
    /// keys begin at `start` (and, last, end): one batch per run of whole keys of about
    /// [`BATCH_ROWS`] rows, each window function evaluated over each key's rows.
    fn evaluate(
        &self,
        whole: &RecordBatch,
        at: &[u32],
        start: &[usize],
    ) -> DfResult<Vec<DfResult<RecordBatch>>> {
        let schema = self.schema();
        // Batches with the columns not yet gathered as NULLs, for the window functions and
        // the filter, which do not read them.
        let loose = |s: &Schema| {
            let fields = s
                .fields()
                .iter()
                .map(|f| f.as_ref().clone().with_nullable(true));
            Arc::new(Schema::new(fields.collect::<Vec<_>>()))
        };
        let (loose_in, loose_out) = (loose(&whole.schema()), loose(&schema));
        let mut out = Vec::new();
        let mut from = 0;
        while from + 1 < start.len() {
            let mut to = from + 1;
            while to + 1 < start.len() && start[to] - start[from] < BATCH_ROWS {
                to += 1;
            }
            let (lo, hi) = (start[from], start[to]);
            let rows_at = &at[lo..hi];
            let indices = UInt32Array::from(rows_at.to_vec());
            let columns: Vec<ArrayRef> = (whole.columns().iter().enumerate())
                .map(
                    |(i, c)| match (self.unread.contains(&i), self.late.contains(&i)) {
                        (true, _) => Ok(c.slice(0, hi - lo)),
                        (_, true) => Ok(new_null_array(c.data_type(), hi - lo)),
                        _ => take(c, &indices, None),
                    },
                )
                .collect::<Result<_, _>>()?;
            let rows = RecordBatch::try_new(loose_in.clone(), columns)?;
            let mut columns = rows.columns().to_vec();
            for e in &self.exprs {
                let parts: Vec<ArrayRef> = (start[from..=to].windows(2))
                    .map(|w| e.evaluate(&rows.slice(w[0] - lo, w[1] - w[0])))
                    .collect::<DfResult<_>>()?;
                let parts: Vec<&dyn Array> = parts.iter().map(|a| a.as_ref()).collect();
                columns.push(concat(&parts)?);
            }
            if let Some(filter) = &self.filter {
                let probe = RecordBatch::try_new(loose_out.clone(), columns.clone())?;
                let mask = filter.evaluate(&probe)?.into_array(hi - lo)?;
                let mask = match mask.as_boolean_opt() {
                    Some(m) if m.null_count() > 0 => prep_null_mask_filter(m),
                    Some(m) => m.clone(),
                    None => return Err(DataFusionError::Internal("a filter not boolean".into())),
                };
                let kept: Vec<u32> = (rows_at.iter().zip(mask.values().iter()))
                    .filter_map(|(a, keep)| keep.then_some(*a))
                    .collect();
                let kept = UInt32Array::from(kept);
                columns = (columns.iter().enumerate())
                    .map(|(i, c)| match self.late.contains(&i) {
                        true => take(whole.column(i), &kept, None),
                        false => filter_array(c, &mask),
                    })
                    .collect::<Result<_, _>>()?;
            }
            let batch = RecordBatch::try_new(schema.clone(), columns)?;
            // A key of many rows is one slice; what follows takes batches of the usual size.
            let n = batch.num_rows();
            out.extend((0..n).step_by(BATCH_ROWS).map(|i| {
                let len = BATCH_ROWS.min(n - i);
                Ok(batch.slice(i, len))
            }));
            from = to;
        }
        Ok(out)
    }
}

impl DisplayAs for KeyedWindowExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("SluiceKeyedWindow: ")?;
        let names: Vec<&str> = self.exprs.iter().map(|e| e.name()).collect();
        write!(f, "[{}] over ", names.join(", "))?;
        if !self.unread.is_empty() {
            let schema = self.sort.sort.input().schema();
            let unread: Vec<&str> = (self.unread.iter())
                .map(|i| schema.field(*i).name().as_str())
                .collect();
            write!(f, "(not read above: {}) ", unread.join(", "))?;
        }
        if let Some(filter) = &self.filter {
            let schema = self.sort.sort.input().schema();
            let late: Vec<&str> = (self.late.iter())
                .map(|i| schema.field(*i).name().as_str())
                .collect();
            write!(
                f,
                "filter={filter}, gathered after it: {} ",
                late.join(", ")
            )?;
        }
        self.sort.fmt_as(t, f)
    }
}

impl ExecutionPlan for KeyedWindowExec {
    fn name(&self) -> &'static str {
        "SluiceKeyedWindow"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        self.window.properties()
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![self.sort.sort.input()]
    }

    fn apply_expressions(
        &self,
        f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> DfResult<TreeNodeRecursion>,
    ) -> DfResult<TreeNodeRecursion> {
        self.window.apply_expressions(f)
    }

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        let sort = Arc::new(self.sort.clone()).replace_children(children, RECOMPUTE)?;
        let window = (self.window.clone()).replace_children(vec![sort], RECOMPUTE)?;
        // An input the sort cannot take leaves DataFusion's operators (and the filter).
        Ok(match Self::of(&window) {
            Some(keyed) => Arc::new(Self {
                unread: self.unread.clone(),
                filter: self.filter.clone(),
                late: self.late.clone(),
                ..keyed
            }),
            None => match &self.filter {
                Some(f) => Arc::new(FilterExec::try_new(f.clone(), window)?),
                None => window,
            },
        })
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> DfResult<SendableRecordBatchStream> {
        let input = self.sort.sort.input().execute(partition, context.clone())?;
        let schema = self.schema();
        let metric = |name: &'static str| MetricBuilder::new(&self.metrics).global_counter(name);
        let (keyed, small, handed) = (
            metric("keyed_rows"),
            metric("small_keys"),
            metric("handed_to_sort"),
        );
        let elapsed = MetricBuilder::new(&self.metrics).elapsed_compute(partition);
        let this = Arc::new(self.clone());
        let out = futures::stream::once(async move {
            let name = format!("SluiceKeyedWindow[{partition}]");
            let (batches, _held) = match read_all(input, &name, &context, &handed).await? {
                Ok(read) => read,
                Err(rest) => {
                    let sorted = this.sort.by_datafusion(rest, context.clone())?;
                    return this.by_window(sorted, context);
                }
            };
            let rows: usize = batches.iter().map(RecordBatch::num_rows).sum();
            let timer = elapsed.timer();
            let (whole, at, start) = this.sort.sorted(batches, &this.unread)?;
            let keys = start.len().saturating_sub(1);
            if rows < keys * MIN_KEY_ROWS {
                small.add(1);
                let sorted: Vec<DfResult<RecordBatch>> = (at.chunks(BATCH_ROWS))
                    .map(|c| Ok(take_record_batch(&whole, &UInt32Array::from(c.to_vec()))?))
                    .collect();
                let sorted =
                    RecordBatchStreamAdapter::new(whole.schema(), futures::stream::iter(sorted));
                drop(timer);
                return this.by_window(Box::pin(sorted), context);
            }
            keyed.add(rows);
            let out = this.evaluate(&whole, &at, &start)?;
            Ok(Box::pin(RecordBatchStreamAdapter::new(
                this.schema(),
                futures::stream::iter(out),
            )) as SendableRecordBatchStream)
        })
        .try_flatten();
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, out)))
    }
}
