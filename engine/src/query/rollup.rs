//! A rollup as queries see it ([`crate::store::rollup`]): a view that merges partial rows
//! (`sum` of sums and counts, `min` of minimums, ...) grouped by bucket and keys, over
//! [`Partials`]: the rollup's files, and the partial rows of the source's rows still in
//! memory, folded when the query runs. Both are taken under the source's lock (a flush
//! moves rows from one to the other under it), so a row is counted once, from the moment
//! it is acked. Filters on the bucket and keys go down to the partials (partitions and
//! files pruned).

use crate::query::provider::{SluiceTable, key_filter, row_filter};
use crate::store::remote::Remote;
use crate::store::rollup::{AggFn, COUNT_SUFFIX, Fold, RollupDef, SUM_SUFFIX};
use crate::store::state::TableState;
use async_trait::async_trait;
use datafusion::arrow::datatypes::{DataType, SchemaRef};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::catalog::{Session, TableProvider};
use datafusion::common::Column;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::datasource::{TableType, provider_as_source};
use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::functions_aggregate::expr_fn::{max, min, sum};
use datafusion::logical_expr::{Expr, LogicalPlanBuilder, TableProviderFilterPushDown, cast};
use datafusion::physical_expr::{EquivalenceProperties, PhysicalExpr};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, Partitioning, PlanProperties,
};
use futures::{StreamExt, TryStreamExt};
use std::sync::Arc;

fn col(name: &str) -> Expr {
    Expr::Column(Column::new_unqualified(name))
}

/// The view a query of rollup `table` (kept from `source` by `def`) reads.
pub(crate) fn view(
    table: SluiceTable,
    source: Arc<TableState>,
    def: RollupDef,
) -> DfResult<Arc<dyn TableProvider>> {
    let rdef = table.def();
    let mut group = vec![col(&def.bucket)];
    group.extend(def.keys.iter().map(|k| col(k)));
    let mut aggs = Vec::new();
    let mut out = group.clone();
    for (i, a) in def.aggregates.iter().enumerate() {
        let (v, n) = (format!("__v{i}"), format!("__n{i}"));
        match a.func {
            AggFn::Avg => {
                aggs.push(sum(col(&format!("{}{SUM_SUFFIX}", a.name))).alias(&v));
                aggs.push(sum(col(&format!("{}{COUNT_SUFFIX}", a.name))).alias(&n));
                out.push((col(&v) / cast(col(&n), DataType::Float64)).alias(&a.name));
                continue;
            }
            AggFn::Sum | AggFn::Count => aggs.push(sum(col(&a.name)).alias(&v)),
            AggFn::Min => aggs.push(min(col(&a.name)).alias(&v)),
            AggFn::Max => aggs.push(max(col(&a.name)).alias(&v)),
        }
        out.push(col(&v).alias(&a.name));
    }
    let partials = Arc::new(Partials {
        schema: table.def().arrow_schema(),
        table,
        source,
        def: def.clone(),
    });
    let plan = LogicalPlanBuilder::scan(rdef.name.as_str(), provider_as_source(partials), None)?
        .aggregate(group, aggs)?
        .project(out)?
        .build()?;
    let text = format!("CREATE ROLLUP {} AS {}", rdef.name, def.sql);
    Ok(Arc::new(datafusion::catalog::view::ViewTable::new(
        plan,
        Some(text),
    )))
}

/// A rollup's partial rows: its files' and those of its source's rows in memory.
#[derive(Debug)]
struct Partials {
    table: SluiceTable,
    schema: SchemaRef,
    source: Arc<TableState>,
    def: RollupDef,
}

#[async_trait]
impl TableProvider for Partials {
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
        Ok(vec![TableProviderFilterPushDown::Inexact; filters.len()])
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        _limit: Option<usize>,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        let (predicate, projected) =
            crate::query::provider::predicate_and_schema(state, &self.schema, filters, projection)?;
        let properties = PlanProperties::new(
            EquivalenceProperties::new(projected.clone()),
            Partitioning::UnknownPartitioning(1),
            EmissionType::Incremental,
            Boundedness::Bounded,
        );
        let rdef = self.table.def();
        Ok(Arc::new(PartialsExec {
            table: self.table.clone(),
            source: self.source.clone(),
            def: self.def.clone(),
            keys: key_filter(&rdef, filters),
            rows: row_filter(&rdef, filters),
            predicate,
            projection: projection.cloned(),
            properties: Arc::new(properties),
        }))
    }
}

/// Reads [`Partials`] when it runs (so a kept plan sees what is there then).
#[derive(Debug)]
struct PartialsExec {
    table: SluiceTable,
    source: Arc<TableState>,
    def: RollupDef,
    keys: crate::query::provider::KeyFilter,
    rows: crate::store::chunk::RowFilter,
    predicate: Option<Arc<dyn PhysicalExpr>>,
    projection: Option<Vec<usize>>,
    properties: Arc<PlanProperties>,
}

impl DisplayAs for PartialsExec {
    fn fmt_as(&self, _: DisplayFormatType, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        let def = self.table.def();
        write!(f, "RollupPartials: {}.{}", def.database, def.name)
    }
}

impl ExecutionPlan for PartialsExec {
    fn name(&self) -> &'static str {
        "RollupPartials"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        Vec::new()
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> DfResult<TreeNodeRecursion>,
    ) -> DfResult<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        match children.is_empty() {
            true => Ok(self),
            false => Err(DataFusionError::Internal(
                "RollupPartials has no inputs".into(),
            )),
        }
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> DfResult<SendableRecordBatchStream> {
        if partition != 0 {
            return Err(DataFusionError::Internal(format!(
                "RollupPartials has one partition, not {partition}"
            )));
        }
        let (table, source) = (self.table.clone(), self.source.clone());
        let (keys, rows) = (self.keys.clone(), self.rows.clone());
        let (def, rdef) = (self.def.clone(), self.table.def());
        let (projection, predicate) = (self.projection.clone(), self.predicate.clone());
        let external = |e: crate::error::Error| DataFusionError::External(Box::new(e));
        let run = async move {
            // The source's buffered rows other nodes hold (every partition: a bucket's
            // partition is not its rows').
            let store = table.store();
            let remote = Remote::read(store, source.def().id, (0, u64::MAX, None), None)
                .await
                .map_err(external)?;
            // The source's rows in memory and the rollup's files, as of one moment.
            let (set, live) = {
                let parts = source.parts.read();
                let schema = source.schema();
                let held = |s: u32| remote.holds(s);
                let mut live: Vec<RecordBatch> = (parts.values())
                    .flat_map(|p| p.unflushed_chunks_of(&schema, &held))
                    .map(|c| c.batch)
                    .collect();
                let fetched = remote.rows_of(&parts, |_| true, &schema, None);
                live.extend(fetched.map_err(external)?);
                let set = table.scan_set(&keys, &rows, None, &Remote::default())?;
                (set, live)
            };
            let project = |b: RecordBatch| -> DfResult<RecordBatch> {
                match &projection {
                    Some(p) => Ok(b.project(p)?),
                    None => Ok(b),
                }
            };
            // The unflushed rows are folded off the runtime's threads (a large buffer
            // takes a while).
            let source_def = source.def();
            let fold = move || -> crate::error::Result<Vec<RecordBatch>> {
                let mut fold = Fold::new(&def, &source_def)?;
                for b in &live {
                    fold.raw(b)?;
                }
                Ok(fold.finish(&rdef)?.into_iter().map(|(_, b)| b).collect())
            };
            let joined = tokio::task::spawn_blocking(fold).await;
            let folded = joined
                .map_err(|e| DataFusionError::External(Box::new(e)))?
                .map_err(external)?;
            let memory = (folded.into_iter().chain(set.batches))
                .map(project)
                .collect::<Vec<_>>();
            let files = match set.files.is_empty() {
                true => None,
                false => {
                    let plan = table.parquet(set.files, predicate, projection.clone(), None, 1)?;
                    Some(plan.execute(0, context)?)
                }
            };
            let stream =
                futures::stream::iter(memory).chain(futures::stream::iter(files).flatten());
            Ok::<_, DataFusionError>(stream)
        };
        let schema = self.properties.eq_properties.schema().clone();
        let stream = futures::stream::once(run).try_flatten();
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, stream)))
    }
}

#[cfg(test)]
mod tests;
