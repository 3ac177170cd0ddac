//! Scanning a table: the partitions and files a query needs ([`Scan`]), read as one DataFusion plan node ([`ScanExec`]) over buffers and Parquet.

use super::*;
use futures::TryStreamExt;

/// What a scan reads, decided when it is planned; the rows are taken when it runs.
#[derive(Debug)]
pub(super) struct Scan {
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
        let t = &self.table;
        let set = t.scan_set(&self.keys, &self.rows, self.projection.as_deref(), remote)?;
        for (path, bytes) in &set.files {
            t.warm(path, *bytes);
        }
        metrics.files.add(set.files.len());
        let fetched = remote.parts.iter().flat_map(|p| &p.batches);
        metrics.remote_rows.add(fetched.map(|b| b.num_rows()).sum());
        metrics
            .memory_rows
            .add(set.batches.iter().map(|b| b.num_rows()).sum());
        let lanes = self.lanes;
        let mut inputs: Vec<Arc<dyn ExecutionPlan>> = Vec::new();
        if !set.files.is_empty() {
            let projection = self.projection.clone();
            let predicate = self.predicate.clone();
            inputs.push(t.parquet(set.files, predicate, projection, self.limit, lanes)?);
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

impl Scan {
    /// The buffered rows of the shards this node holds no replica of, from their replicas
    /// (nothing when it holds them all).
    pub(super) async fn remote(&self) -> DfResult<Remote> {
        let k = &self.keys;
        let keys = (
            k.lo,
            k.hi,
            k.only.as_ref().map(|o| o.iter().copied().collect()),
        );
        let t = &self.table;
        Remote::read(&t.store, t.def.id, keys, self.projection.clone())
            .await
            .map_err(|e| DataFusionError::External(Box::new(e)))
    }
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
    pub(super) input: Arc<tokio::sync::OnceCell<Arc<dyn ExecutionPlan>>>,
    /// Held while a partition makes `input` without waiting (all rows here).
    pub(super) making: parking_lot::Mutex<()>,
    pub(super) metrics: ExecutionPlanMetricsSet,
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
        for (i, (shard, node)) in self.elsewhere.iter().enumerate() {
            let lead = if i == 0 {
                ", unflushed rows of shard"
            } else {
                ","
            };
            match node {
                Some(n) => write!(f, "{lead} {shard} from node {n}")?,
                None => write!(f, "{lead} {shard} from its replicas")?,
            }
        }
        Ok(())
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
            elsewhere: self.elsewhere.clone(),
            properties: self.properties.clone(),
            planned: children.pop(),
            input: Default::default(),
            making: Default::default(),
            metrics: self.metrics.clone(),
        }))
    }

    fn reset_state(self: Arc<Self>) -> DfResult<Arc<dyn ExecutionPlan>> {
        Ok(Arc::new(Self {
            scan: self.scan.clone(),
            shown: self.shown.clone(),
            of: self.of,
            elsewhere: self.elsewhere.clone(),
            properties: self.properties.clone(),
            planned: None,
            input: Default::default(),
            making: Default::default(),
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
        let schema = self.properties.eq_properties.schema().clone();
        let lanes = self.scan.lanes;
        let streams = move |input: &Arc<dyn ExecutionPlan>| {
            let n = input.properties().partitioning.partition_count();
            (partition..n)
                .step_by(lanes)
                .map(|j| input.execute(j, context.clone()))
                .collect::<DfResult<Vec<_>>>()
        };
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
                    Some(i) => i.clone(),
                    None => {
                        let metrics = ScanMetrics::new(&self.metrics);
                        let made = self.scan.input(&metrics, &Remote::default())?;
                        let _ = self.input.set(made.clone());
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
        // One snapshot per run, taken by the partition that runs first, once the rows other
        // nodes hold are read.
        let (scan, cell, metrics) = (self.scan.clone(), self.input.clone(), self.metrics.clone());
        let run = async move {
            let made = cell.get_or_try_init(|| async {
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
