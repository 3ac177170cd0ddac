//! Scanning a table: the partitions and files a query needs ([`Scan`]), read as one DataFusion plan node ([`ScanExec`]) over buffers and Parquet.

use super::*;
use crate::query::made_once::MadeOnce;
use crate::query::split::SplitState;
use crate::store::remote::{RowsRequest, after, fit};
use futures::TryStreamExt;

fn external(e: crate::error::Error) -> DataFusionError {
    DataFusionError::External(Box::new(e))
}

/// What a scan reads, decided when it is planned; the rows are taken when it runs.
#[derive(Debug)]
pub(crate) struct Scan {
    pub(super) table: SluiceTable,
    pub(super) keys: KeyFilter,
    pub(super) rows: RowFilter,
    /// The filters, for Parquet's statistics and page index.
    pub(super) predicate: Option<Arc<dyn PhysicalExpr>>,
    pub(super) projection: Option<Vec<usize>>,
    /// The table's schema with the projection applied.
    pub(super) projected: SchemaRef,
    pub(super) limit: Option<usize>,
    /// Output partitions.
    pub(super) lanes: usize,
}

impl Scan {
    /// The plan reading what the table holds now: its Parquet files and its in-memory rows
    /// (hot files and buffers, narrowed by the chunk indexes). Each output partition of the
    /// scan is one or more of this plan's partitions.
    pub(super) fn input(
        &self,
        metrics: &ScanMetrics,
        remote: &Remote,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        Ok(self.input_and_cut(metrics, remote)?.0)
    }

    /// [`Scan::input`], with the flushed index of each (partition, shard) it read, for
    /// the shards `remote` names, and how many of `remote.files` it came across.
    fn input_and_cut(
        &self,
        metrics: &ScanMetrics,
        remote: &Remote,
    ) -> DfResult<(Arc<dyn ExecutionPlan>, Cut, usize)> {
        let t = &self.table;
        let mut set = t.scan_set(&self.keys, &self.rows, self.projection.as_deref(), remote)?;
        let (flushed, skipped) = (std::mem::take(&mut set.flushed), set.skipped);
        metrics.files.add(set.files.len());
        let fetched = remote.parts.iter().flat_map(|p| &p.batches);
        metrics.remote_rows.add(fetched.map(|b| b.num_rows()).sum());
        metrics
            .memory_rows
            .add(set.batches.iter().map(|b| b.num_rows()).sum());
        Ok((self.plan_of(set)?, flushed, skipped))
    }

    /// The plan reading `set`: its files as Parquet (each loaded into the hot cache in the
    /// background), its batches (of the projected columns already) from memory.
    fn plan_of(&self, set: ScanSet) -> DfResult<Arc<dyn ExecutionPlan>> {
        let t = &self.table;
        let mut inputs: Vec<Arc<dyn ExecutionPlan>> = Vec::new();
        if !set.files.is_empty() {
            for (path, bytes) in &set.files {
                t.warm(path, *bytes);
            }
            let (predicate, projection) = (self.predicate.clone(), self.projection.clone());
            inputs.push(t.parquet(set.files, predicate, projection, self.limit, self.lanes)?);
        }
        if !set.batches.is_empty() || inputs.is_empty() {
            inputs.push(self.in_lanes(set.batches)?);
        }
        UnionExec::try_new(inputs)
    }

    /// `batches` (of the projected columns) as a plan of the scan's lanes, spread evenly.
    fn in_lanes(&self, batches: Vec<RecordBatch>) -> DfResult<Arc<dyn ExecutionPlan>> {
        let n = self.lanes.min(batches.len()).max(1);
        let mut parts: Vec<Vec<RecordBatch>> = vec![Vec::new(); n];
        for (i, b) in batches.into_iter().enumerate() {
            parts[i % n].push(b);
        }
        Ok(MemorySourceConfig::try_new_exec(
            &parts,
            self.projected.clone(),
            None,
        )?)
    }

    /// [`Scan::input`] with the scan's counters in `metrics`, the cut, and how many of
    /// `remote.files` it came across.
    pub(crate) fn input_cut(
        &self,
        metrics: &ExecutionPlanMetricsSet,
        remote: &Remote,
    ) -> DfResult<(Arc<dyn ExecutionPlan>, Cut, usize)> {
        self.input_and_cut(&ScanMetrics::new(metrics), remote)
    }

    pub(crate) fn store(&self) -> &Arc<Store> {
        &self.table.store
    }

    pub(crate) fn table_id(&self) -> u64 {
        self.table.def.id
    }

    /// Whether the scan picks the newest partitions (`WHERE PARTS last n`).
    pub(crate) fn counts_newest(&self) -> bool {
        self.table.counts_newest()
    }

    /// A request for this scan's partitions and columns of `shard`.
    pub(crate) fn rows_request(&self, shard: u32) -> RowsRequest {
        RowsRequest {
            columns: self.projection.clone(),
            ..RowsRequest::new(self.table.def.id, shard, self.key_bounds())
        }
    }

    fn key_bounds(&self) -> (u64, u64, Option<Vec<u64>>) {
        self.keys.request_bounds()
    }

    /// The buffered rows of the shards `read` from their replicas, for a node not
    /// holding `shards`.
    pub(crate) async fn remote_of(
        &self,
        shards: BTreeSet<u32>,
        read: &BTreeSet<u32>,
    ) -> crate::error::Result<Remote> {
        let t = &self.table;
        let keys = self.key_bounds();
        Remote::read_of(
            &t.store,
            t.def.id,
            keys,
            self.projection.clone(),
            shards,
            read,
        )
        .await
    }

    /// The buffered rows of the partitions this scan reads, per shard held here (not in
    /// `elsewhere`): a guess at the other shards'. `None` when it holds none.
    pub(crate) fn held_rows_per_shard(&self, elsewhere: &BTreeSet<u32>) -> Option<u64> {
        let t = &self.table;
        let parts = t.state.parts.read();
        let admits = t.admitted(&parts, &self.keys, &BTreeSet::new());
        let mut shards = BTreeSet::new();
        let mut rows = 0;
        for (_, p) in in_range(&parts, &admits) {
            for (s, r) in p.shards.iter().filter(|(s, _)| !elsewhere.contains(s)) {
                shards.insert(*s);
                rows += r.buffer.rows as u64;
            }
        }
        (!shards.is_empty()).then(|| rows / shards.len() as u64)
    }

    /// The files (path, size, rows) of the partitions this scan reads.
    pub(crate) fn files(&self) -> Vec<(String, u64, u64)> {
        let t = &self.table;
        let parts = t.state.parts.read();
        let admits = t.admitted(&parts, &self.keys, &BTreeSet::new());
        (in_range(&parts, &admits).into_iter())
            .flat_map(|(_, p)| p.files.iter().map(|f| (f.path.clone(), f.bytes, f.rows)))
            .collect()
    }

    /// This node's buffered rows of `shard` that the scan reads (partitions and columns,
    /// not yet in files as far as this node knows), and the rows of `files` it picks, as a
    /// plan; with the shard's flushed index of each partition that has such rows, and
    /// their count.
    pub(crate) fn shard_input(&self, shard: u32, files: &[(String, u64)]) -> DfResult<ShardInput> {
        let t = &self.table;
        let parts = t.state.parts.read();
        let admits = t.admitted(&parts, &self.keys, &BTreeSet::new());
        let (mut set, mut flushed) = (ScanSet::default(), Vec::new());
        let all: Vec<usize> = (0..t.schema.fields().len()).collect();
        let projection = self.projection.as_deref();
        for (key, p) in in_range(&parts, &admits) {
            let Some(s) = p.shards.get(&shard) else {
                continue;
            };
            // Every partition with an entry of the shard, rows or none: the asker checks
            // each against its own flushed index (one it lags behind misses rows).
            flushed.push((key, s.flushed));
            let chunks = s.buffer.chunks(&t.schema);
            let kept = after(
                chunks.iter().map(|c| &c.batch),
                &s.buffer.lsn_starts(),
                s.flushed,
            );
            for b in kept {
                let fitted = fit(&b, &all, &self.projected, projection).map_err(external)?;
                set.batches.push(fitted);
            }
        }
        drop(parts);
        let rows = set.batches.iter().map(|b| b.num_rows() as u64).sum();
        let mut picker = Picker::default();
        for (path, bytes) in files {
            t.file_into(
                &mut set,
                &mut picker,
                (path, *bytes),
                &self.rows,
                projection,
            );
        }
        picker.finish(&mut set.batches)?;
        Ok(ShardInput {
            plan: self.plan_of(set)?,
            flushed,
            rows,
        })
    }

    /// The buffered rows of the shards this node holds no replica of, from their replicas
    /// (nothing when it holds them all).
    pub(super) async fn remote(&self) -> DfResult<Remote> {
        let t = &self.table;
        Remote::read(
            &t.store,
            t.def.id,
            self.key_bounds(),
            self.projection.clone(),
        )
        .await
        .map_err(external)
    }
}

/// A replica's buffered rows of one shard that a scan reads, and the files it was given
/// ([`Scan::shard_input`]).
pub(crate) struct ShardInput {
    pub(crate) plan: Arc<dyn ExecutionPlan>,
    /// Each partition with an entry of the shard, and the shard's flushed index there.
    pub(crate) flushed: Vec<(u64, u64)>,
    /// Buffered rows.
    pub(crate) rows: u64,
}

/// A scan's counters, shown by `EXPLAIN ANALYZE`.
#[derive(Debug)]
pub(super) struct ScanMetrics {
    /// Parquet files read from the object store (not in the hot cache).
    files: Count,
    /// In-memory rows passed on after the chunk indexes narrowed them.
    memory_rows: Count,
    /// Unflushed rows of shards held elsewhere, as their replicas sent them.
    remote_rows: Count,
}

impl ScanMetrics {
    pub(super) fn new(set: &ExecutionPlanMetricsSet) -> Self {
        Self {
            files: MetricBuilder::new(set).global_counter("files_read"),
            memory_rows: MetricBuilder::new(set).global_counter("memory_rows"),
            remote_rows: MetricBuilder::new(set).global_counter("remote_rows"),
        }
    }
}

impl SluiceTable {
    /// A plan reading `files` of this table (path and size) in `lanes` partitions, pruned
    /// by `predicate` (statistics and page index; the rows are not filtered).
    pub(crate) fn parquet(
        &self,
        files: Vec<(String, u64)>,
        predicate: Option<Arc<dyn PhysicalExpr>>,
        projection: Option<Vec<usize>>,
        limit: Option<usize>,
        lanes: usize,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        let mut source = ParquetSource::new(self.schema.clone())
            .with_enable_page_index(true)
            .with_pushdown_filters(false);
        if let Some(p) = predicate {
            source = source.with_predicate(p);
        }
        let mut groups: Vec<Vec<PartitionedFile>> = vec![Vec::new(); lanes.min(files.len()).max(1)];
        let n = groups.len();
        for (i, (path, size)) in files.into_iter().enumerate() {
            groups[i % n].push(PartitionedFile::new(path, size));
        }
        let conf = FileScanConfigBuilder::new(self.store.storage.url.clone(), Arc::new(source))
            .with_file_groups(groups.into_iter().map(FileGroup::new).collect())
            .with_projection_indices(projection)?
            .with_limit(limit)
            .build();
        Ok(DataSourceExec::from_data_source(conf))
    }

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
    pub(super) scan: Arc<Scan>,
    pub(super) shown: Vec<u64>,
    pub(super) of: usize,
    /// The shards this node held no replica of when planned, with the node asked first
    /// for each: their unflushed rows are read from their replicas when the scan runs.
    pub(super) elsewhere: Vec<(u32, Option<u64>)>,
    pub(super) properties: Arc<PlanProperties>,
    /// The input made when planned, for the first run.
    pub(super) planned: Option<Arc<dyn ExecutionPlan>>,
    /// A later run's input (or the first's, when other nodes hold some of its rows), made
    /// by the first partition executed.
    pub(super) input: Arc<MadeOnce<Arc<dyn ExecutionPlan>>>,
    /// Held while a partition makes `input` without waiting (all rows here).
    pub(super) making: parking_lot::Mutex<()>,
    pub(super) metrics: ExecutionPlanMetricsSet,
    /// The run of the split aggregate above it (`crate::query::split`), which reads the
    /// shards held elsewhere as their replicas' partial aggregates.
    pub(super) split: Option<Arc<SplitState>>,
}

impl ScanExec {
    pub(crate) fn scan(&self) -> &Arc<Scan> {
        &self.scan
    }

    /// The shards held elsewhere when planned, with the node asked first for each.
    pub(crate) fn elsewhere(&self) -> &[(u32, Option<u64>)] {
        &self.elsewhere
    }

    /// The scan afresh (as [`ExecutionPlan::reset_state`] makes it), read as part of
    /// the split aggregate whose run is `split`.
    pub(crate) fn linked(&self, split: Arc<SplitState>) -> Arc<dyn ExecutionPlan> {
        self.afresh(Some(split))
    }

    /// The scan ready for another run (nothing of this one's kept), in the split
    /// aggregate run `split`.
    fn afresh(&self, split: Option<Arc<SplitState>>) -> Arc<dyn ExecutionPlan> {
        Arc::new(Self {
            scan: self.scan.clone(),
            shown: self.shown.clone(),
            of: self.of,
            elsewhere: self.elsewhere.clone(),
            properties: self.properties.clone(),
            planned: None,
            input: Default::default(),
            making: Default::default(),
            metrics: ExecutionPlanMetricsSet::new(),
            split,
        })
    }
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
        f.write_str("]")?;
        if self.split.is_some() {
            // The split aggregate above names the shards aggregated elsewhere.
            return Ok(());
        }
        write_elsewhere(f, &self.elsewhere, ", unflushed rows of shard", "from")
    }
}

/// `elsewhere` (shards, each with the node asked first) for `EXPLAIN`: `lead` before the
/// first, then `shard at node n` (or `at its replicas`), comma-separated.
pub(crate) fn write_elsewhere(
    f: &mut std::fmt::Formatter,
    elsewhere: &[(u32, Option<u64>)],
    lead: &str,
    at: &str,
) -> std::fmt::Result {
    for (i, (shard, node)) in elsewhere.iter().enumerate() {
        let lead = if i == 0 { lead } else { "," };
        match node {
            Some(n) => write!(f, "{lead} {shard} {at} node {n}")?,
            None => write!(f, "{lead} {shard} {at} its replicas")?,
        }
    }
    Ok(())
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
            elsewhere: self.elsewhere.clone(),
            properties: self.properties.clone(),
            planned: children.pop(),
            input: Default::default(),
            making: Default::default(),
            metrics: self.metrics.clone(),
            split: self.split.clone(),
        }))
    }

    fn reset_state(self: Arc<Self>) -> DfResult<Arc<dyn ExecutionPlan>> {
        Ok(self.afresh(self.split.clone()))
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> DfResult<SendableRecordBatchStream> {
        let schema = self.properties.eq_properties.schema().clone();
        let lanes = self.scan.lanes;
        let streams = move |input: &Arc<dyn ExecutionPlan>| {
            let n = input.properties().partitioning.partition_count();
            (partition..n)
                .step_by(lanes)
                .map(|j| input.execute(j, context.clone()))
                .collect::<DfResult<Vec<_>>>()
        };
        if let Some(split) = self.split.clone().filter(|s| s.splits(&self.scan)) {
            // Part of a split aggregate on a node holding only some shards: the run's
            // snapshot (this node's rows, the other shards' partial aggregates) is made
            // once, by the partition that runs first.
            let (scan, metrics) = (self.scan.clone(), self.metrics.clone());
            let run = async move {
                let made = split.made(&scan, &metrics).await?;
                let streams = streams(&made.local)?;
                Ok::<_, DataFusionError>(futures::stream::iter(streams).flatten())
            };
            return Ok(Box::pin(RecordBatchStreamAdapter::new(
                schema,
                futures::stream::once(run).try_flatten(),
            )));
        }
        if let Some(input) = &self.planned {
            let streams = streams(input)?;
            return Ok(Box::pin(RecordBatchStreamAdapter::new(
                schema,
                futures::stream::iter(streams).flatten(),
            )));
        }
        if !self.scan.table.store.partial() {
            // Everything is here: the snapshot is taken now, by the first partition asked
            // (under the lock, so the other uses the same). Waiting for it in the streams
            // instead would wake the second partition's task in the first one's worker's
            // LIFO slot, which no other worker steals: both partitions then ran on one
            // core, half the time (a grouped aggregate over 8.64M rows: 60 ms or 116).
            let input = {
                let _making = self.making.lock();
                match self.input.get() {
                    Some(i) => i?.clone(),
                    None => {
                        let metrics = ScanMetrics::new(&self.metrics);
                        let made = self.scan.input(&metrics, &Remote::default())?;
                        self.input.set(made.clone());
                        made
                    }
                }
            };
            let streams = streams(&input)?;
            return Ok(Box::pin(RecordBatchStreamAdapter::new(
                schema,
                futures::stream::iter(streams).flatten(),
            )));
        }
        // One snapshot per run, taken once the rows other nodes hold are read ([`MadeOnce`]).
        let (scan, cell, metrics) = (self.scan.clone(), self.input.clone(), self.metrics.clone());
        let run = async move {
            let made = cell.get_or_spawn(async move {
                let remote = scan.remote().await?;
                scan.input(&ScanMetrics::new(&metrics), &remote)
            });
            let streams = streams(made.await?)?;
            Ok::<_, DataFusionError>(futures::stream::iter(streams).flatten())
        };
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            schema,
            futures::stream::once(run).try_flatten(),
        )))
    }
}
