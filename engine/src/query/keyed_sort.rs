//! Sorting by key columns then one number or time column, the order IoT window functions
//! and dashboards ask for (`PARTITION BY device ORDER BY time`, `ORDER BY device, time`):
//! [`KeyedSortExec`] replaces DataFusion's `SortExec` there ([`KeyedSortRule`]).
//!
//! Instead of comparing rows (each comparison a `memcmp` of the keys' row format), it gives
//! each distinct key its rank (one text key hashed as text, other keys in their row format;
//! the distinct keys sorted once), places the rows by rank with a counting sort that keeps
//! their order, and then sorts each key's rows by the last column, which rows arriving in
//! time order mostly are already (checked first). The output is taken from the input
//! concatenated in order. A partition's rows are held in memory; when the query's memory
//! budget cannot hold them, the rows go on to DataFusion's own sort, which spills.
//! A window operator over such a sort, partitioned by its keys, becomes a
//! [`window::KeyedWindowExec`].

use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, RecordBatch, RecordBatchOptions, UInt32Array, new_empty_array,
    new_null_array,
};
use datafusion::arrow::compute::{cast, concat, take_record_batch};
use datafusion::arrow::datatypes::{DataType, Float64Type, Int64Type, SchemaRef};
use datafusion::arrow::row::{RowConverter, SortField};
use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{Transformed, TransformedResult, TreeNode, TreeNodeRecursion};
use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::execution::memory_pool::{MemoryConsumer, MemoryReservation};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::{LexOrdering, PhysicalExpr};
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::expressions::Column;
use datafusion::physical_plan::metrics::{ExecutionPlanMetricsSet, MetricBuilder, MetricsSet};
use datafusion::physical_plan::sorts::sort::SortExec;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties};
use futures::{StreamExt, TryStreamExt};
use std::sync::Arc;

mod window;

/// The rows in order, (batch, row) pairs, and where each key's rows start (then the end).
type Order = (Vec<(usize, usize)>, Vec<usize>);

/// Output batches' rows.
const BATCH_ROWS: usize = 8192;

/// Puts [`KeyedSortExec`] in place of each `SortExec` it can do.
#[derive(Debug)]
pub(crate) struct KeyedSortRule;

impl PhysicalOptimizerRule for KeyedSortRule {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        _config: &ConfigOptions,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        plan.transform_up(|node| {
            // Children first: a window's sort is replaced before the window is looked at.
            if let Some(k) = node.downcast_ref::<SortExec>().and_then(KeyedSortExec::of) {
                return Ok(Transformed::yes(Arc::new(k) as Arc<dyn ExecutionPlan>));
            }
            if let Some(w) = window::KeyedWindowExec::of(&node) {
                return Ok(Transformed::yes(Arc::new(w) as Arc<dyn ExecutionPlan>));
            }
            let trimmed = window::KeyedWindowExec::trimmed(&node);
            Ok(
                match trimmed.or_else(|| window::KeyedWindowExec::filtered(&node)) {
                    Some(p) => Transformed::yes(p),
                    None => Transformed::no(node),
                },
            )
        })
        .data()
    }

    fn name(&self) -> &str {
        "sluice_keyed_sort"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

/// How the last sort column's values compare: as integers or as floats.
#[derive(Debug, Clone, Copy)]
enum Last {
    Int,
    Float,
}

/// A `SortExec` by key columns then a number or time column, without a limit, each input
/// partition sorted on its own (or a single one).
#[derive(Debug, Clone)]
pub(crate) struct KeyedSortExec {
    /// The sort it replaces (run instead when memory runs short).
    sort: SortExec,
    /// Key columns (their indexes) and the last column's.
    keys: Vec<usize>,
    last: usize,
    kind: Last,
    metrics: ExecutionPlanMetricsSet,
}

impl KeyedSortExec {
    /// The replacement for `sort`, when it is one this can do.
    fn of(sort: &SortExec) -> Option<Self> {
        let input = sort.input();
        let single = input.properties().partitioning.partition_count() == 1;
        if sort.fetch().is_some() || !(sort.preserve_partitioning() || single) {
            return None;
        }
        let exprs: Vec<_> = sort.expr().iter().collect();
        if exprs.len() < 2 {
            return None;
        }
        let schema = input.schema();
        let column = |e: &Arc<dyn PhysicalExpr>| e.downcast_ref::<Column>().map(Column::index);
        let columns: Vec<usize> = exprs
            .iter()
            .map(|e| column(&e.expr))
            .collect::<Option<_>>()?;
        let (last, keys) = columns.split_last()?;
        let kind = match schema.field(*last).data_type() {
            DataType::Int8 | DataType::Int16 | DataType::Int32 | DataType::Int64 => Last::Int,
            DataType::UInt8 | DataType::UInt16 | DataType::UInt32 => Last::Int,
            DataType::Timestamp(..) | DataType::Date32 => Last::Int,
            DataType::Float32 | DataType::Float64 => Last::Float,
            _ => return None,
        };
        let fields: Vec<SortField> = (keys.iter().zip(&exprs))
            .map(|(k, e)| {
                SortField::new_with_options(schema.field(*k).data_type().clone(), e.options)
            })
            .collect();
        if !RowConverter::supports_fields(&fields) {
            return None;
        }
        Some(Self {
            sort: sort.clone(),
            keys: keys.to_vec(),
            last: *last,
            kind,
            metrics: ExecutionPlanMetricsSet::new(),
        })
    }

    fn ordering(&self) -> &LexOrdering {
        self.sort.expr()
    }
}

impl DisplayAs for KeyedSortExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("SluiceKeyedSort: ")?;
        self.sort.fmt_as(t, f)
    }
}

impl ExecutionPlan for KeyedSortExec {
    fn name(&self) -> &'static str {
        "SluiceKeyedSort"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        self.sort.properties()
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![self.sort.input()]
    }

    fn apply_expressions(
        &self,
        f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> DfResult<TreeNodeRecursion>,
    ) -> DfResult<TreeNodeRecursion> {
        self.sort.apply_expressions(f)
    }

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        let [child] = <[_; 1]>::try_from(children)
            .map_err(|_| DataFusionError::Internal("SluiceKeyedSort has one input".into()))?;
        let sort = SortExec::new(self.sort.expr().clone(), child)
            .with_preserve_partitioning(self.sort.preserve_partitioning());
        // An input this cannot sort is sorted by DataFusion.
        Ok(match Self::of(&sort) {
            Some(keyed) => Arc::new(keyed),
            None => Arc::new(sort),
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
        let input = self.sort.input().execute(partition, context.clone())?;
        let schema = self.schema();
        let sorted = MetricBuilder::new(&self.metrics).global_counter("keyed_rows");
        let spilled = MetricBuilder::new(&self.metrics).global_counter("handed_to_sort");
        let elapsed = MetricBuilder::new(&self.metrics).elapsed_compute(partition);
        let this = Arc::new(self.clone());
        let out = futures::stream::once(async move {
            let name = format!("SluiceKeyedSort[{partition}]");
            let (batches, _held) = match read_all(input, &name, &context, &spilled).await? {
                Ok(read) => read,
                Err(rest) => return this.by_datafusion(rest, context),
            };
            sorted.add(batches.iter().map(RecordBatch::num_rows).sum());
            let _timer = elapsed.timer();
            let (whole, at, _) = this.sorted(batches, &[])?;
            let out: Vec<DfResult<RecordBatch>> = (at.chunks(BATCH_ROWS))
                .map(|c| Ok(take_record_batch(&whole, &UInt32Array::from(c.to_vec()))?))
                .collect();
            Ok(Box::pin(RecordBatchStreamAdapter::new(
                this.schema(),
                futures::stream::iter(out),
            )) as SendableRecordBatchStream)
        })
        .try_flatten();
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, out)))
    }
}

/// Reads the whole of `input` under the query's memory budget (as consumer `name`; the
/// reservation returned holds the rows until dropped). `Err`: the budget could not hold it: the rows read so far and the rest, as one stream,
/// for DataFusion's operators (which spill); `handed` counts that.
async fn read_all(
    mut input: SendableRecordBatchStream,
    name: &str,
    context: &TaskContext,
    handed: &datafusion::physical_plan::metrics::Count,
) -> DfResult<Result<(Vec<RecordBatch>, MemoryReservation), SendableRecordBatchStream>> {
    let reservation = MemoryConsumer::new(name).register(context.memory_pool());
    let schema = input.schema();
    let mut batches = Vec::new();
    while let Some(batch) = input.next().await {
        let batch = batch?;
        if reservation.try_grow(batch.get_array_memory_size()).is_err() {
            handed.add(1);
            let rest = futures::stream::iter(batches.into_iter().map(Ok))
                .chain(futures::stream::once(async { Ok(batch) }))
                .chain(input);
            return Ok(Err(Box::pin(RecordBatchStreamAdapter::new(schema, rest))));
        }
        batches.push(batch);
    }
    Ok(Ok((batches, reservation)))
}

impl KeyedSortExec {
    /// `batches` sorted: their rows concatenated (one array per column, a tighter loop to
    /// gather from than every batch at once), the sorted order as row numbers into it, and
    /// where each key's rows start in that order (and, last, where they end).
    /// Columns `skip` are not copied: NULLs stand in.
    fn sorted(
        &self,
        batches: Vec<RecordBatch>,
        skip: &[usize],
    ) -> DfResult<(RecordBatch, Vec<u32>, Vec<usize>)> {
        let (order, start) = self.order(&batches)?;
        let mut first = Vec::with_capacity(batches.len() + 1);
        first.push(0u32);
        for b in &batches {
            first.push(first[first.len() - 1] + b.num_rows() as u32);
        }
        let schema = self.sort.input().schema();
        let total = first[first.len() - 1] as usize;
        let columns = (0..schema.fields().len())
            .map(|i| match skip.contains(&i) {
                true => Ok(new_null_array(schema.field(i).data_type(), total)),
                false if batches.is_empty() => Ok(new_empty_array(schema.field(i).data_type())),
                false => {
                    let parts: Vec<&dyn Array> =
                        batches.iter().map(|b| b.column(i).as_ref()).collect();
                    concat(&parts)
                }
            })
            .collect::<Result<Vec<_>, _>>()?;
        let whole = RecordBatch::try_new_with_options(
            schema,
            columns,
            &RecordBatchOptions::new().with_row_count(Some(total)),
        )?;
        let at = order.iter().map(|(b, r)| first[*b] + *r as u32).collect();
        Ok((whole, at, start))
    }
}

impl KeyedSortExec {
    /// Sorts `rows` (the input's, as a stream) with DataFusion's `SortExec`.
    fn by_datafusion(
        &self,
        rows: SendableRecordBatchStream,
        context: Arc<TaskContext>,
    ) -> DfResult<SendableRecordBatchStream> {
        let sort = SortExec::new(self.ordering().clone(), Once::exec(rows, Vec::new())?);
        sort.execute(0, context)
    }

    /// The rows of `batches` in order: (batch, row) pairs; and where each key's rows start
    /// (and, last, where they end).
    fn order(&self, batches: &[RecordBatch]) -> DfResult<Order> {
        let options: Vec<_> = self.ordering().iter().map(|e| e.options).collect();
        let schema = self.sort.input().schema();
        let (key_of, rank) = match schema.field(self.keys[0]).data_type() {
            DataType::Utf8 if self.keys.len() == 1 => text_ranks(batches, self.keys[0], options[0]),
            _ => self.row_ranks(batches, &options)?,
        };
        let distinct = rank.len();
        // Counting sort by rank, keeping the rows' order within a key.
        let mut start = vec![0usize; distinct + 1];
        for keys in &key_of {
            for k in keys {
                start[rank[*k as usize] as usize + 1] += 1;
            }
        }
        for i in 1..start.len() {
            start[i] += start[i - 1];
        }
        let total = start[distinct];
        let mut next = start.clone();
        let mut order = vec![(0usize, 0usize); total];
        for (b, keys) in key_of.iter().enumerate() {
            for (r, k) in keys.iter().enumerate() {
                let at = &mut next[rank[*k as usize] as usize];
                order[*at] = (b, r);
                *at += 1;
            }
        }
        // Each key's rows by the last column.
        let last_options = options.last().copied().unwrap_or_default();
        let values = self.last_values(batches)?;
        // A row's place: NULL or not (bit 127), its value (bits 63-126), its position
        // in the key's rows (bits 0-62, so that equal values keep their order).
        let place = |(b, r): (usize, usize), pos: usize| -> u128 {
            let (null_after, v) = match values[b][r] {
                None => (!last_options.nulls_first, 0),
                Some(v) => (
                    last_options.nulls_first,
                    if last_options.descending { !v } else { v },
                ),
            };
            (u128::from(null_after) << 127) | (u128::from(v) << 63) | pos as u128
        };
        let (mut places, mut copy) = (Vec::new(), Vec::new());
        for w in start.windows(2) {
            let group = &mut order[w[0]..w[1]];
            places.clear();
            places.extend(group.iter().enumerate().map(|(i, at)| place(*at, i)));
            if places.is_sorted() {
                continue;
            }
            // Stable and run-adaptive: rows that came in a few time-ordered runs merge.
            places.sort();
            copy.clear();
            copy.extend_from_slice(group);
            let mask = (1u128 << 63) - 1;
            for (slot, p) in group.iter_mut().zip(&places) {
                *slot = copy[(p & mask) as usize];
            }
        }
        Ok((order, start))
    }

    /// Each row's key number (per batch) and each key number's rank, the keys compared in
    /// Arrow's row format (which orders them as the sort's options say).
    fn row_ranks(
        &self,
        batches: &[RecordBatch],
        options: &[datafusion::arrow::compute::SortOptions],
    ) -> DfResult<(Vec<Vec<u32>>, Vec<u32>)> {
        let schema = self.sort.input().schema();
        let fields: Vec<SortField> = (self.keys.iter().zip(options))
            .map(|(k, o)| SortField::new_with_options(schema.field(*k).data_type().clone(), *o))
            .collect();
        let converter = RowConverter::new(fields)?;
        let mut index: foldhash::HashMap<Box<[u8]>, u32> = Default::default();
        let mut distinct: Vec<Box<[u8]>> = Vec::new();
        let mut key_of: Vec<Vec<u32>> = Vec::with_capacity(batches.len());
        for b in batches {
            let cols: Vec<ArrayRef> = self.keys.iter().map(|k| b.column(*k).clone()).collect();
            let rows = converter.convert_columns(&cols)?;
            let mut keys = Vec::with_capacity(b.num_rows());
            for r in rows.iter() {
                let k = match index.get(r.as_ref()) {
                    Some(k) => *k,
                    None => {
                        let k = distinct.len() as u32;
                        index.insert(r.as_ref().into(), k);
                        distinct.push(r.as_ref().into());
                        k
                    }
                };
                keys.push(k);
            }
            key_of.push(keys);
        }
        Ok((
            key_of,
            ranks(distinct.len(), |a, b| distinct[a].cmp(&distinct[b])),
        ))
    }

    /// The last sort column's values per batch and row, as order-preserving unsigned
    /// integers (`None`: NULL).
    fn last_values(&self, batches: &[RecordBatch]) -> DfResult<Vec<Vec<Option<u64>>>> {
        let flip = 1u64 << 63;
        (batches.iter())
            .map(|b| {
                let col = b.column(self.last);
                Ok(match self.kind {
                    Last::Int => {
                        // Timestamps keep their unit's values: no ties made.
                        let col = cast(col, &DataType::Int64)?;
                        let a = col.as_primitive::<Int64Type>();
                        (0..a.len())
                            .map(|i| a.is_valid(i).then(|| a.value(i) as u64 ^ flip))
                            .collect()
                    }
                    Last::Float => {
                        let col = cast(col, &DataType::Float64)?;
                        let a = col.as_primitive::<Float64Type>();
                        (0..a.len())
                            .map(|i| {
                                a.is_valid(i).then(|| {
                                    // IEEE 754 bits in total order.
                                    let bits = a.value(i).to_bits();
                                    if bits & flip != 0 { !bits } else { bits ^ flip }
                                })
                            })
                            .collect()
                    }
                })
            })
            .collect()
    }
}

/// Each key's rank, the keys numbered `0..n` and compared by `cmp`.
fn ranks(n: usize, cmp: impl Fn(usize, usize) -> std::cmp::Ordering) -> Vec<u32> {
    let mut by_rank: Vec<u32> = (0..n as u32).collect();
    by_rank.sort_unstable_by(|a, b| cmp(*a as usize, *b as usize));
    let mut rank = vec![0u32; n];
    for (r, k) in by_rank.iter().enumerate() {
        rank[*k as usize] = r as u32;
    }
    rank
}

/// [`KeyedSortExec::row_ranks`] for one text key: its values hashed as they are.
fn text_ranks(
    batches: &[RecordBatch],
    column: usize,
    options: datafusion::arrow::compute::SortOptions,
) -> (Vec<Vec<u32>>, Vec<u32>) {
    let mut index: foldhash::HashMap<Option<&str>, u32> = Default::default();
    let mut distinct: Vec<Option<&str>> = Vec::new();
    let key_of = (batches.iter())
        .map(|b| {
            let a = b.column(column).as_string::<i32>();
            (0..a.len())
                .map(|i| {
                    let v = a.is_valid(i).then(|| a.value(i));
                    *index.entry(v).or_insert_with(|| {
                        distinct.push(v);
                        distinct.len() as u32 - 1
                    })
                })
                .collect()
        })
        .collect();
    let rank = ranks(distinct.len(), |a, b| match (distinct[a], distinct[b]) {
        (None, None) => std::cmp::Ordering::Equal,
        (None, Some(_)) if options.nulls_first => std::cmp::Ordering::Less,
        (None, Some(_)) => std::cmp::Ordering::Greater,
        (Some(_), None) if options.nulls_first => std::cmp::Ordering::Greater,
        (Some(_), None) => std::cmp::Ordering::Less,
        (Some(x), Some(y)) if options.descending => y.cmp(x),
        (Some(x), Some(y)) => x.cmp(y),
    });
    (key_of, rank)
}

/// One stream, handed out once (the rows a [`KeyedSortExec`] passes to DataFusion's sort).
struct Once {
    schema: SchemaRef,
    stream: parking_lot::Mutex<Option<SendableRecordBatchStream>>,
}

impl Once {
    /// A plan node of one partition that hands out `rows` (in `ordering`), once.
    fn exec(
        rows: SendableRecordBatchStream,
        ordering: Vec<LexOrdering>,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        let schema = rows.schema();
        let once = Arc::new(Once {
            schema: schema.clone(),
            stream: parking_lot::Mutex::new(Some(rows)),
        });
        let exec = datafusion::physical_plan::streaming::StreamingTableExec::try_new(
            schema,
            vec![once],
            None,
            ordering,
            false,
            None,
        )?;
        Ok(Arc::new(exec))
    }
}

impl std::fmt::Debug for Once {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Once")
    }
}

impl datafusion::physical_plan::streaming::PartitionStream for Once {
    fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    fn execute(&self, _ctx: Arc<TaskContext>) -> SendableRecordBatchStream {
        match self.stream.lock().take() {
            Some(s) => s,
            None => Box::pin(RecordBatchStreamAdapter::new(
                self.schema.clone(),
                futures::stream::once(async {
                    Err(DataFusionError::Internal(
                        "rows handed to the sort twice".into(),
                    ))
                }),
            )),
        }
    }
}

#[cfg(test)]
mod tests;
