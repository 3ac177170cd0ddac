//! Partial aggregation where the rows are. On a cluster node that holds replicas of only
//! some shards, a query's partial aggregate over a table's scan ([`SplitRule`]) runs in
//! several places: here over the shards held here and this node's share of the files, and
//! on one replica of each other shard over that shard's unflushed rows and the share of the
//! files given to it ([`files_to_nodes`]). Only the aggregate states travel; the final
//! aggregate above merges them ([`SplitAggExec`]).
//!
//! The replica plans the same query text against the same catalog, with this node's clock,
//! and runs the one partial aggregate of its plan over its buffered rows of the shard and
//! its files ([`Engine::serve_partial`]). It answers with the shard's flushed index of each
//! partition it read and the number of files read. Those rows are exactly the ones this
//! node's files lack when this node's own flushed index of the partition is the same, which
//! it checks once its snapshot is taken (it waited for the replica's manifest index first,
//! so it is never behind), and its snapshot leaves out exactly the files read elsewhere
//! when it came across every one of them (none was compacted away meanwhile): otherwise it
//! asks again, and after [`TRIES`] it reads the shard's rows and every file itself (as a
//! scan on such a node always did). A replica that cannot split the query (its plan
//! differs, or it read no files: an older version) is read the same way, and so are all of
//! them when fewer rows than `query.split_min_rows` would travel or be read elsewhere
//! (estimated from the shards held here and the files' rows): planning the query on each
//! replica costs more than a few rows.

use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::query::made_once::MadeOnce;
use crate::query::provider::{Scan, ScanExec, write_elsewhere};
use crate::store::remote::{
    PartialAnswer, PartialQuery, Remote, RowsRequest, ShardReader, answers_of, cut_alike,
};
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{Transformed, TransformedResult, TreeNode, TreeNodeRecursion};
use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::{EquivalenceProperties, Partitioning, PhysicalExpr};
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::aggregates::{AggregateExec, AggregateMode};
use datafusion::physical_plan::filter::FilterExec;
use datafusion::physical_plan::metrics::{
    Count, ExecutionPlanMetricsSet, MetricBuilder, MetricsSet,
};
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_plan::repartition::RepartitionExec;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, InputOrderMode, PlanProperties,
};
use futures::{StreamExt, TryStreamExt};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, OnceLock};

/// Times a node asks the replicas for partial aggregates before it reads their rows.
const TRIES: usize = 3;

/// Wraps each partial aggregate over a scan of a table, on a node holding only some of
/// its shards, in a [`SplitAggExec`].
#[derive(Debug)]
pub(crate) struct SplitRule;

impl PhysicalOptimizerRule for SplitRule {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        _config: &ConfigOptions,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        plan.transform_up(|node| {
            let held_elsewhere = scan_under(&node).is_some_and(|s| s.scan().store().partial());
            Ok(match held_elsewhere {
                true => Transformed::yes(SplitAggExec::wrap(node)? as Arc<dyn ExecutionPlan>),
                false => Transformed::no(node),
            })
        })
        .data()
    }

    fn name(&self) -> &str {
        "sluice_split_aggregate"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

/// The scan under `node` when `node` is a partial aggregate that can run in parts: over
/// one scan of a table through operators that take each row alone (filters, projections,
/// ), in no particular order, and not counting the newest partitions (`WHERE PARTS
/// last n` needs every shard's partitions in one place).
pub(crate) fn scan_under(node: &Arc<dyn ExecutionPlan>) -> Option<&ScanExec> {
    let agg = node.downcast_ref::<AggregateExec>()?;
    if *agg.mode() != AggregateMode::Partial || *agg.input_order_mode() != InputOrderMode::Linear {
        return None;
    }
    if !matches!(
        agg.properties().partitioning,
        Partitioning::UnknownPartitioning(_) | Partitioning::RoundRobinBatch(_)
    ) {
        return None;
    }
    let mut at = agg.input();
    loop {
        if let Some(scan) = at.downcast_ref::<ScanExec>() {
            return (!scan.scan().counts_newest()).then_some(scan);
        }
        let each_row = at.is::<FilterExec>()
            || at.is::<ProjectionExec>()
            || at
                .downcast_ref::<RepartitionExec>()
                .is_some_and(|r| matches!(r.partitioning(), Partitioning::RoundRobinBatch(_)));
        match at.children().as_slice() {
            [child] if each_row => at = child,
            _ => return None,
        }
    }
}

/// What one run of a split aggregate shares between the scan under it and itself.
#[derive(Debug)]
pub(crate) struct SplitState {
    /// Whether this run splits (the node holds only some shards when it starts).
    splits: OnceLock<bool>,
    /// The query, as the replicas plan it, and `query.split_min_rows` (set by the engine
    /// before each run; `None`: the other shards' rows are read instead).
    query: parking_lot::Mutex<Option<(PartialQuery, u64)>>,
    /// The partial aggregate's output.
    schema: SchemaRef,
    made: Arc<MadeOnce<Made>>,
    metrics: SplitMetrics,
}

/// A run's snapshot: the scan's input here, and the other shards' partial aggregates.
#[derive(Debug)]
pub(crate) struct Made {
    pub(crate) local: Arc<dyn ExecutionPlan>,
    states: Vec<RecordBatch>,
}

#[derive(Debug, Clone)]
struct SplitMetrics {
    /// Shards whose replicas answered with partial aggregates.
    partials: Count,
    /// Buffered rows those replicas aggregated (the files they read: `remote_files`).
    remote_aggregated: Count,
    /// Shards whose rows were read instead.
    read_rows_of: Count,
    /// Times a flush (or a compaction of a file read elsewhere) between a replica's answer
    /// and this node's snapshot made it ask again.
    asked_again: Count,
    /// Files the replicas read (their share of the table's files).
    files_elsewhere: Count,
}

impl SplitState {
    /// Whether this run splits; decided by the first to ask.
    pub(crate) fn splits(&self, scan: &Scan) -> bool {
        *self.splits.get_or_init(|| scan.store().partial())
    }

    /// The run's snapshot, made once ([`MadeOnce`]).
    pub(crate) async fn made(
        self: &Arc<Self>,
        scan: &Arc<Scan>,
        metrics: &ExecutionPlanMetricsSet,
    ) -> DfResult<&Made> {
        let (me, scan, metrics) = (self.clone(), scan.clone(), metrics.clone());
        (self.made)
            .get_or_spawn(async move { me.make(&scan, &metrics).await })
            .await
    }

    async fn make(&self, scan: &Scan, scan_metrics: &ExecutionPlanMetricsSet) -> DfResult<Made> {
        let external = |e: Error| DataFusionError::External(Box::new(e));
        let store = scan.store();
        let Some(reader) = store.reader() else {
            let (local, _, _) = scan.input_cut(scan_metrics, &Remote::default())?;
            return Ok(Made {
                local,
                states: Vec::new(),
            });
        };
        // Few rows elsewhere (as many per shard as here, and the rows of the files other
        // nodes would read) travel for less than the replicas' planning costs.
        let first = self.query.lock().clone();
        let mut shares = BTreeMap::new();
        let query = first.and_then(|(q, min)| {
            let elsewhere = reader.remote_shards();
            // Holding none, it cannot guess: the rows may be many.
            let per_shard = scan.held_rows_per_shard(&elsewhere).unwrap_or(u64::MAX);
            let in_files;
            (shares, in_files) = files_to_nodes(scan.files(), &elsewhere, &**reader);
            let rows = per_shard.saturating_mul(elsewhere.len() as u64);
            (rows.saturating_add(in_files) >= min).then_some(q)
        });
        let m = &self.metrics;
        for attempt in 1..=TRIES {
            let elsewhere = reader.remote_shards();
            let ask = query.clone().filter(|_| attempt < TRIES);
            if attempt > 1 {
                shares = match ask {
                    Some(_) => files_to_nodes(scan.files(), &elsewhere, &**reader).0,
                    None => BTreeMap::new(),
                };
            }
            let share = |shard: u32| shares.get(&shard).map_or(&[][..], Vec::as_slice);
            let request = |shard: u32| RowsRequest {
                partial: ask.clone().map(|q| PartialQuery {
                    files: share(shard).to_vec(),
                    ..q
                }),
                ..scan.rows_request(shard)
            };
            // Taken only with every file it was given read, and the state columns here.
            let fits = |shard: u32, a: &PartialAnswer| {
                a.files_read == share(shard).len() as u64
                    && (a.states.iter()).all(|b| b.schema().fields() == self.schema.fields())
            };
            let ask_one = |shard: u32| reader.partial(request(shard));
            let (answered, read) = answers_of(
                &elsewhere,
                ask.is_some(),
                ask_one,
                fits,
                "partial aggregate",
            )
            .await;
            let elsewhere_files = (answered.keys())
                .flat_map(|s| share(*s).iter().map(|(path, _)| path.clone()))
                .collect();
            let mut remote = scan
                .remote_of(elsewhere.clone(), &read)
                .await
                .map_err(external)?;
            remote.files = elsewhere_files;
            let (local, flushed, skipped) = scan.input_cut(scan_metrics, &remote)?;
            let cut_alike = (answered.iter()).all(|(s, a)| cut_alike(*s, &a.flushed, &flushed));
            // A file read elsewhere that the snapshot lacks was compacted in between: its
            // rows are in a file read here too.
            if !cut_alike || skipped != remote.files.len() {
                m.asked_again.add(1);
                continue;
            }
            m.partials.add(answered.len());
            m.files_elsewhere.add(skipped);
            m.read_rows_of.add(read.len());
            let aggregated: u64 = answered.values().map(|a| a.rows).sum();
            m.remote_aggregated.add(aggregated as usize);
            (store.remote_aggregated).fetch_add(aggregated, std::sync::atomic::Ordering::Relaxed);
            let states = answered.into_values().flat_map(|a| a.states).collect();
            return Ok(Made { local, states });
        }
        Err(DataFusionError::Internal(
            "SluiceSplitAggregate: the last try reads rows, which always cut alike".into(),
        ))
    }
}

/// Each file of `files` (path, size, rows) goes to one node, by rendezvous hashing of its
/// path over this node and those asked first for the shards `elsewhere`, so that a file is
/// read (and kept in the hot cache) by the same node query after query. Returns the files
/// of each shard whose request carries them (the first shard asked of each other node),
/// and the rows of those files.
fn files_to_nodes(
    files: Vec<(String, u64, u64)>,
    elsewhere: &BTreeSet<u32>,
    reader: &dyn ShardReader,
) -> (BTreeMap<u32, Vec<(String, u64)>>, u64) {
    use std::hash::BuildHasher;
    let mut nodes: BTreeMap<u64, u32> = BTreeMap::new();
    for s in elsewhere {
        if let Some(node) = reader.asked_first(*s) {
            nodes.entry(node).or_insert(*s);
        }
    }
    let (me, hash) = (
        reader.me(),
        foldhash::quality::FixedState::with_seed(0x51u64),
    );
    let mut out: BTreeMap<u32, Vec<(String, u64)>> = BTreeMap::new();
    let mut rows = 0u64;
    for (path, bytes, n) in files {
        let to = (nodes.keys().copied())
            .chain([me])
            .max_by_key(|node| hash.hash_one((&path, *node)));
        if let Some(shard) = to.and_then(|node| nodes.get(&node)) {
            rows = rows.saturating_add(n);
            out.entry(*shard).or_default().push((path, bytes));
        }
    }
    (out, rows)
}

/// A partial aggregate whose shards held elsewhere are aggregated on their replicas: its
/// output partitions are the aggregate's here, the first followed by the replicas'
/// states.
#[derive(Debug)]
pub(crate) struct SplitAggExec {
    /// The partial aggregate (its scan linked to `state`).
    input: Arc<dyn ExecutionPlan>,
    state: Arc<SplitState>,
    properties: Arc<PlanProperties>,
    metrics: ExecutionPlanMetricsSet,
    /// The shards held elsewhere when planned, with the node asked first (for `EXPLAIN`).
    elsewhere: Vec<(u32, Option<u64>)>,
}

impl SplitAggExec {
    /// `partial` (a partial aggregate [`scan_under`] takes) run in parts, with a new state.
    fn wrap(partial: Arc<dyn ExecutionPlan>) -> DfResult<Arc<Self>> {
        let metrics = ExecutionPlanMetricsSet::new();
        let counter = |name: &'static str| MetricBuilder::new(&metrics).global_counter(name);
        let state = Arc::new(SplitState {
            splits: OnceLock::new(),
            query: Default::default(),
            schema: partial.schema(),
            made: Default::default(),
            metrics: SplitMetrics {
                partials: counter("remote_partials"),
                remote_aggregated: counter("remote_rows_aggregated"),
                read_rows_of: counter("remote_shards_read"),
                asked_again: counter("asked_again"),
                files_elsewhere: counter("remote_files"),
            },
        });
        let elsewhere = (scan_under(&partial))
            .map(|s| s.elsewhere().to_vec())
            .unwrap_or_default();
        let linked = partial
            .transform_down(|node| match node.downcast_ref::<ScanExec>() {
                Some(scan) => Ok(Transformed::yes(scan.linked(state.clone()))),
                None => Ok(Transformed::no(node)),
            })
            .data()?;
        let p = linked.properties();
        let properties = PlanProperties::new(
            EquivalenceProperties::new(linked.schema()),
            Partitioning::UnknownPartitioning(p.partitioning.partition_count()),
            p.emission_type,
            p.boundedness,
        );
        Ok(Arc::new(Self {
            input: linked,
            state,
            properties: Arc::new(properties),
            metrics,
            elsewhere,
        }))
    }

    /// Sets the query the replicas plan (made by `query` only if the plan has a split
    /// aggregate), for the next run of every split aggregate in `plan`.
    pub(crate) fn prepare(
        plan: &Arc<dyn ExecutionPlan>,
        query: impl Fn() -> Option<PartialQuery>,
        min_rows: u64,
    ) {
        let mut made = None;
        let _ = plan.apply(|node| {
            if let Some(s) = node.downcast_ref::<SplitAggExec>() {
                let q = made.get_or_insert_with(&query).clone();
                *s.state.query.lock() = q.map(|q| (q, min_rows));
            }
            Ok(TreeNodeRecursion::Continue)
        });
    }
}

impl DisplayAs for SplitAggExec {
    fn fmt_as(&self, _: DisplayFormatType, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("SluiceSplitAggregate: partial aggregates of")?;
        write_elsewhere(f, &self.elsewhere, " shard", "on")
    }
}

impl ExecutionPlan for SplitAggExec {
    fn name(&self) -> &'static str {
        "SluiceSplitAggregate"
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> DfResult<TreeNodeRecursion>,
    ) -> DfResult<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    fn with_new_children(
        self: Arc<Self>,
        mut children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        match (children.pop(), children.is_empty()) {
            (Some(child), true) if scan_under(&child).is_some() => {
                Ok(Self::wrap(child)? as Arc<dyn ExecutionPlan>)
            }
            _ => Err(DataFusionError::Internal(
                "SluiceSplitAggregate splits a partial aggregate over a scan".into(),
            )),
        }
    }

    fn reset_state(self: Arc<Self>) -> DfResult<Arc<dyn ExecutionPlan>> {
        Ok(Self::wrap(self.input.clone())? as Arc<dyn ExecutionPlan>)
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> DfResult<SendableRecordBatchStream> {
        let here = self.input.execute(partition, context)?;
        if partition != 0 {
            return Ok(here);
        }
        // The replicas' states after this partition's own: the scan under it has made the
        // run's snapshot by then (its streams start by making it).
        let state = self.state.clone();
        let states = futures::stream::once(async move {
            let states = match (state.splits.get(), state.made.get()) {
                (Some(true), Some(Ok(made))) => made.states.clone(),
                (Some(true), Some(Err(e))) => return Err(e),
                (Some(true), None) => {
                    return Err(DataFusionError::Internal(
                        "SluiceSplitAggregate: the scan under it did not run".into(),
                    ));
                }
                _ => Vec::new(),
            };
            Ok(futures::stream::iter(states.into_iter().map(Ok)))
        })
        .try_flatten();
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            self.schema(),
            here.chain(states),
        )))
    }
}

impl Engine {
    /// Answers a replica's part of a split aggregate (`request.partial`; the caller ran
    /// the shard's read barrier): the query planned here, its one partial aggregate run
    /// over this node's buffered rows of the shard and the files the request names, with
    /// the flushed index of each partition read and the metadata group's index read after.
    pub async fn serve_partial(self: &Arc<Self>, request: RowsRequest) -> Result<Vec<u8>> {
        let Some(query) = request.partial.clone() else {
            return Err(Error::invalid("not a partial aggregation"));
        };
        if self.store.tables.get(request.table_id).is_none() {
            let engine = self.clone();
            let id = request.table_id;
            tokio::task::spawn_blocking(move || engine.await_table(id))
                .await
                .map_err(|e| Error::invalid(e.to_string()))??;
        }
        let session = self.session(&query.database, false)?;
        let partial = self.partial_of(&session, &query, request.table_id).await?;
        let no_scan = || Error::invalid("a kept partial aggregate lost its scan");
        let input = scan_under(&partial)
            .ok_or_else(no_scan)?
            .scan()
            .shard_input(request.shard, &query.files)?;
        let manifest_index = self.manifest_index();
        let over_rows = partial
            .transform_down(|node| match node.is::<ScanExec>() {
                true => Ok(Transformed::yes(input.plan.clone())),
                false => Ok(Transformed::no(node)),
            })
            .data()?;
        let lease = session.lease(self.config.query.max_memory_bytes);
        let states = datafusion::physical_plan::collect(over_rows, lease.task()).await?;
        if let Some(running) = crate::query::log::current() {
            running.note(crate::query::log::Work {
                files_read: query.files.len() as u64,
                memory_rows: input.rows,
                ..Default::default()
            });
        }
        PartialAnswer {
            manifest_index,
            flushed: input.flushed,
            rows: input.rows,
            files_read: query.files.len() as u64,
            states,
        }
        .encode()
    }
}

/// Partial aggregates a replica ran for other nodes, kept per (database, query text) with
/// the catalog version they were planned at, ready for another run: a query whose plan
/// reads no value of the moment (`now()`) is planned once, not for every request (one
/// that does is optimized for each, from the engine's kept logical plans).
#[derive(Default)]
pub(crate) struct ReplicaPlans(parking_lot::Mutex<std::collections::HashMap<QueryKey, Kept>>);

/// (database, query text).
type QueryKey = (String, String);
/// (catalog version, the partial aggregate).
type Kept = (u64, Arc<dyn ExecutionPlan>);

impl Engine {
    /// The one partial aggregate over a scan of table `table_id` in `query`'s plan, kept
    /// or planned here.
    async fn partial_of(
        &self,
        session: &crate::query::planner::Session,
        query: &PartialQuery,
        table_id: u64,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        use crate::query::planner::{CACHED_PLANS, bounded_insert, of_the_moment, optimize_at};
        let version = self.store.catalog.snapshot().version;
        let key = (query.database.clone(), query.sql.clone());
        let kept = self.planner.partials.0.lock().get(&key).cloned();
        let cannot = |why: &str| Error::Replication {
            reason: format!("the query cannot be aggregated in parts here: {why}"),
        };
        let of_table = |p: &Arc<dyn ExecutionPlan>| {
            scan_under(p).is_some_and(|s| s.scan().table_id() == table_id)
        };
        if let Some((v, kept)) = kept
            && v == version
        {
            if !of_table(&kept) {
                return Err(cannot("another table"));
            }
            return Ok(datafusion::physical_plan::execution_plan::reset_plan_states(kept)?);
        }
        // The text planned before (by a query here, or a request with `now()`), else now.
        let before = (self.planner.plans.lock().get(&key))
            .filter(|(v, _)| *v == version)
            .map(|(_, p)| p.clone());
        let planned = match before {
            Some(planned) => planned,
            None => {
                let (planned, cacheable) =
                    (self.plan(session, &query.database, &query.sql, None)).await?;
                if cacheable {
                    let entry = (version, planned.clone());
                    bounded_insert(
                        &mut self.planner.plans.lock(),
                        CACHED_PLANS,
                        key.clone(),
                        entry,
                    );
                }
                planned
            }
        };
        let now = chrono::DateTime::from_timestamp_nanos(query.now_nanos);
        let optimized = optimize_at(&session.state, &planned.plan, Some(now))?;
        // Its scans read nothing when planned: their rows are chosen when served.
        let physical = crate::query::provider::FOR_A_REPLICA.scope(
            (),
            (session.state.query_planner()).create_physical_plan(&optimized, &session.state),
        );
        let physical = physical.await?;
        let mut partials = Vec::new();
        physical.apply(|node| {
            if let Some(a) = node.downcast_ref::<AggregateExec>()
                && *a.mode() == AggregateMode::Partial
            {
                partials.push(node.clone());
            }
            Ok(TreeNodeRecursion::Continue)
        })?;
        let [partial] = partials.as_slice() else {
            return Err(cannot("not one partial aggregate"));
        };
        if !of_table(partial) {
            return Err(cannot("no scan of the table under it"));
        }
        if !of_the_moment(&planned.plan) {
            let entry = (version, partial.clone());
            bounded_insert(
                &mut self.planner.partials.0.lock(),
                CACHED_PLANS,
                key,
                entry,
            );
        }
        Ok(partial.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::remote::RowsAnswer;

    /// This node is node 1; shard 5's replica asked first is on node 2, shards 6 and 7's
    /// on node 3 (node 4 only when `four`).
    struct Holders {
        four: bool,
    }

    #[async_trait::async_trait]
    impl ShardReader for Holders {
        fn remote_shards(&self) -> BTreeSet<u32> {
            [5, 6, 7, 8].into()
        }
        fn me(&self) -> u64 {
            1
        }
        fn asked_first(&self, shard: u32) -> Option<u64> {
            match shard {
                5 => Some(2),
                6 | 7 => Some(3),
                8 => self.four.then_some(4),
                _ => None,
            }
        }
        async fn read(&self, _: RowsRequest) -> Result<RowsAnswer> {
            unreachable!()
        }
        async fn versions(&self) -> Option<Vec<(u32, u64)>> {
            None
        }
        fn shards_of(
            &self,
            _: &crate::store::catalog::TableDef,
            _: &[usize],
            _: &RecordBatch,
        ) -> Option<Vec<u32>> {
            None
        }
    }

    /// Each file goes to one node, with the request of the first shard asked there; the
    /// same files go to the same nodes every time, and a node joining the candidates takes
    /// files only from the others (rendezvous hashing), so hot caches stay warm.
    #[test]
    fn files_go_to_one_node_each_and_stay_there() {
        let files: Vec<(String, u64, u64)> = (0..600)
            .map(|i| (format!("t/p{i}/f.parquet"), 10, 100))
            .collect();
        let shards: BTreeSet<u32> = [5, 6, 7, 8].into();
        let (three, rows) = files_to_nodes(files.clone(), &shards, &Holders { four: false });
        assert_eq!(three.keys().copied().collect::<Vec<_>>(), vec![5, 6]);
        let (to_2, to_3) = (three[&5].len(), three[&6].len());
        // About a third each to nodes 2 and 3; the rest stays here.
        assert!(
            (150..250).contains(&to_2) && (150..250).contains(&to_3),
            "{to_2} {to_3}"
        );
        assert_eq!(rows, 100 * (to_2 + to_3) as u64);
        let again = files_to_nodes(files.clone(), &shards, &Holders { four: true }).0;
        for (shard, kept) in [(5, &three[&5]), (6, &three[&6])] {
            let now: BTreeSet<&String> = again[&shard].iter().map(|(p, _)| p).collect();
            assert!(
                now.iter().all(|p| kept.iter().any(|(k, _)| k == *p)),
                "shard {shard}"
            );
        }
        let to_4 = again[&8].len();
        assert!((100..200).contains(&to_4), "{to_4}");
        assert_eq!(
            three,
            files_to_nodes(files, &shards, &Holders { four: false }).0
        );
    }
}
