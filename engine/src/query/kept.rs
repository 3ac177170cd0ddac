//! The physical side of Sluice's answering nodes ([`crate::query::optimizer::SynopsisNode`],
//! [`crate::query::latest::LatestNode`]): a leaf that, when it runs, answers from what
//! Sluice keeps (synopses, the last-value cache), or else runs the plan it replaced.
//! `EXPLAIN ANALYZE` counts which, under each node's own two names.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::catalog::Session;
use datafusion::common::DFSchemaRef;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::logical_expr::LogicalPlan;
use datafusion::logical_expr::UserDefinedLogicalNode;
use datafusion::logical_expr::physical_planning_context::PhysicalPlanningContext;
use datafusion::physical_expr::{EquivalenceProperties, PhysicalExpr};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::metrics::{
    Count, ExecutionPlanMetricsSet, MetricBuilder, MetricsSet,
};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, Partitioning, PlanProperties,
};
use datafusion::physical_planner::{ExtensionPlanner, PhysicalPlanner};
use futures::{StreamExt, TryStreamExt};
use std::sync::Arc;

/// A node that answers from what Sluice keeps, else by the plan it replaced.
#[async_trait]
pub(crate) trait Answering: std::fmt::Debug + Send + Sync + 'static {
    /// The name `EXPLAIN` shows, and the counters of its two ways.
    const NAME: &'static str;
    const FROM_KEPT: &'static str;
    const FROM_SCAN: &'static str;

    /// What tells the node apart in `EXPLAIN`.
    fn label(&self) -> &str;

    /// The output schema (the replaced plan's).
    fn output(&self) -> &DFSchemaRef;

    /// The answer with the clock at `now`, or `None` when what is kept cannot give it.
    async fn answer(
        &self,
        ctx: &Arc<TaskContext>,
        now: DateTime<Utc>,
    ) -> DfResult<Option<RecordBatch>>;

    /// Runs the replaced plan, with the clock at `now`.
    async fn fallback(
        &self,
        ctx: Arc<TaskContext>,
        now: DateTime<Utc>,
    ) -> DfResult<SendableRecordBatchStream>;
}

/// Plans the [`Answering`] node `N`.
pub(crate) struct AnsweringPlanner<N>(std::marker::PhantomData<N>);

impl<N> AnsweringPlanner<N> {
    pub(crate) fn new() -> Self {
        Self(std::marker::PhantomData)
    }
}

#[async_trait]
impl<N: Answering + Clone> ExtensionPlanner for AnsweringPlanner<N> {
    async fn plan_extension(
        &self,
        _planner: &dyn PhysicalPlanner,
        node: &dyn UserDefinedLogicalNode,
        _logical_inputs: &[&LogicalPlan],
        _physical_inputs: &[Arc<dyn ExecutionPlan>],
        _state: &dyn Session,
        _planning: &PhysicalPlanningContext,
    ) -> DfResult<Option<Arc<dyn ExecutionPlan>>> {
        let Some(node) = node.as_any().downcast_ref::<N>() else {
            return Ok(None);
        };
        let properties = PlanProperties::new(
            EquivalenceProperties::new(node.output().inner().clone()),
            Partitioning::UnknownPartitioning(1),
            EmissionType::Final,
            Boundedness::Bounded,
        );
        Ok(Some(Arc::new(AnsweringExec::new(
            Arc::new(node.clone()),
            Arc::new(properties),
        ))))
    }
}

/// Runs an [`Answering`] node.
#[derive(Debug)]
pub(crate) struct AnsweringExec<N> {
    node: Arc<N>,
    properties: Arc<PlanProperties>,
    metrics: ExecutionPlanMetricsSet,
    from_kept: Count,
    from_scan: Count,
}

impl<N: Answering> AnsweringExec<N> {
    fn new(node: Arc<N>, properties: Arc<PlanProperties>) -> Self {
        let metrics = ExecutionPlanMetricsSet::new();
        Self {
            node,
            properties,
            from_kept: MetricBuilder::new(&metrics).global_counter(N::FROM_KEPT),
            from_scan: MetricBuilder::new(&metrics).global_counter(N::FROM_SCAN),
            metrics,
        }
    }
}

impl<N: Answering> DisplayAs for AnsweringExec<N> {
    fn fmt_as(&self, _: DisplayFormatType, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        write!(f, "{}: {}", N::NAME, self.node.label())
    }
}

impl<N: Answering> ExecutionPlan for AnsweringExec<N> {
    fn name(&self) -> &'static str {
        N::NAME
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        Vec::new()
    }

    fn with_new_children(
        self: Arc<Self>,
        _: Vec<Arc<dyn ExecutionPlan>>,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        Ok(self)
    }

    /// A run of a kept plan counts afresh.
    fn reset_state(self: Arc<Self>) -> DfResult<Arc<dyn ExecutionPlan>> {
        let (node, properties) = (self.node.clone(), self.properties.clone());
        Ok(Arc::new(Self::new(node, properties)))
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> DfResult<TreeNodeRecursion>,
    ) -> DfResult<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }

    fn execute(
        &self,
        _partition: usize,
        ctx: Arc<TaskContext>,
    ) -> DfResult<SendableRecordBatchStream> {
        let node = self.node.clone();
        let schema = self.schema();
        let (from_kept, from_scan) = (self.from_kept.clone(), self.from_scan.clone());
        let (out, schema_of_rows) = (schema.clone(), schema.clone());
        let batches = futures::stream::once(async move {
            let now = Utc::now();
            if let Some(batch) = node.answer(&ctx, now).await? {
                from_kept.add(1);
                let one: SendableRecordBatchStream = Box::pin(RecordBatchStreamAdapter::new(
                    batch.schema(),
                    futures::stream::iter([Ok(batch)]),
                ));
                return Ok::<_, DataFusionError>(one);
            }
            from_scan.add(1);
            let rows = node.fallback(ctx, now).await?;
            // The replaced plan's batches, under this node's schema.
            let rows =
                rows.map(move |b| Ok(RecordBatch::try_new(out.clone(), b?.columns().to_vec())?));
            Ok(
                Box::pin(RecordBatchStreamAdapter::new(schema_of_rows, rows))
                    as SendableRecordBatchStream,
            )
        })
        .try_flatten();
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, batches)))
    }
}

/// The logical side of an answering node `$node` (a leaf with fields `table`, `schema` and
/// `label`, the label telling two apart), shown as `$name` by `EXPLAIN`.
macro_rules! answering_node {
    ($node:ty, $name:literal) => {
        impl PartialEq for $node {
            fn eq(&self, other: &Self) -> bool {
                self.label == other.label && Arc::ptr_eq(&self.table, &other.table)
            }
        }

        impl Eq for $node {}

        impl std::hash::Hash for $node {
            fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
                self.label.hash(state);
            }
        }

        impl PartialOrd for $node {
            fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
                self.label.partial_cmp(&other.label)
            }
        }

        impl datafusion::logical_expr::UserDefinedLogicalNodeCore for $node {
            fn name(&self) -> &str {
                $name
            }

            fn inputs(&self) -> Vec<&datafusion::logical_expr::LogicalPlan> {
                Vec::new()
            }

            fn schema(&self) -> &datafusion::common::DFSchemaRef {
                &self.schema
            }

            fn expressions(&self) -> Vec<datafusion::logical_expr::Expr> {
                Vec::new()
            }

            fn fmt_for_explain(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                write!(f, "{}: {}", $name, self.label)
            }

            fn with_exprs_and_inputs(
                &self,
                _: Vec<datafusion::logical_expr::Expr>,
                _: Vec<datafusion::logical_expr::LogicalPlan>,
            ) -> datafusion::error::Result<Self> {
                Ok(self.clone())
            }
        }
    };
}
pub(crate) use answering_node;
