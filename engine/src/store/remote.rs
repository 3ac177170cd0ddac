//! Rows of the shards a cluster node holds no replica of. Each node keeps replicas only of
//! the shards placed on it; the other shards' rows not yet in files live only on their
//! replicas. A query reads those from one replica of each ([`ShardReader`], the cluster's
//! side of the seam): the replica answers the shard's buffered rows of the partitions asked,
//! with where each log index's rows start ([`RowsAnswer`]), and this node keeps the rows
//! that its own manifest does not have in files ([`Remote::rows_of`]).
//!
//! Why that is exact: the replica takes its rows after applying every write acknowledged
//! before the request (its read barrier), then reads its manifest index. The reader waits
//! until its own metadata group has installed at least that index, and only then takes its
//! snapshot of files. Every file change the replica's rows were cut by is then installed
//! here too, so this node's `flushed` index of each (partition, shard) is at least the
//! replica's: the rows after it are in the answer, and the rows up to it are in the files
//! this node reads.

use crate::error::{Error, Result};
use crate::store::state::{Partition, TableState};
use async_trait::async_trait;
use datafusion::arrow::array::{ArrayRef, RecordBatch, new_null_array};
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::ipc::reader::StreamReader;
use datafusion::arrow::ipc::writer::StreamWriter;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

/// What a query asks one replica of a shard for.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RowsRequest {
    /// The table.
    pub table_id: u64,
    /// The shard.
    pub shard: u32,
    /// Partition keys from `lo` to `hi` (inclusive) ...
    pub lo: u64,
    pub hi: u64,
    /// ... and only these, when set.
    pub only: Option<Vec<u64>>,
    /// Column positions wanted (`None`: every column). Columns are only ever added at the
    /// end, so a position names the same column on every node that has it.
    pub columns: Option<Vec<usize>>,
    /// Instead of the buffered rows: the newest row of each key of the shard, from the
    /// replica's last-value cache (one part, partition 0, every column).
    #[serde(default)]
    pub latest: bool,
    /// Instead of the rows: a query's partial aggregation over them, run by the replica
    /// ([`PartialAnswer`]).
    #[serde(default)]
    pub partial: Option<PartialQuery>,
    /// Instead of the rows: their synopses per group, for a query a synopsis answers
    /// ([`SummaryAnswer`]).
    #[serde(default)]
    pub summary: Option<SummaryQuery>,
    /// The node asking (`system.queries` there lists the part it runs).
    #[serde(default)]
    pub asked_by: Option<u64>,
}

/// What a query answered from synopses needs of a shard's buffered rows
/// (`crate::query::summaries`): the synopses of `columns` per combination of values of
/// `keys` (one group when there are none) over the rows the filter admits.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SummaryQuery {
    pub keys: Vec<crate::query::groups::GroupKey>,
    pub columns: Vec<usize>,
    /// The filter's equalities, time bounds and number comparisons (the operator as SQL
    /// writes it), as [`crate::store::chunk::RowFilter`] holds them.
    pub equal: Vec<(usize, Vec<String>)>,
    pub time: Vec<(usize, i64, i64)>,
    pub value: Vec<(usize, String, crate::query::synopsis::Num)>,
}

/// A replica's synopses of its buffered rows of a shard ([`SummaryQuery`]).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SummaryAnswer {
    /// As [`PartialAnswer`]'s.
    pub manifest_index: u64,
    pub flushed: Vec<(u64, u64)>,
    /// Rows summarized.
    pub rows: u64,
    /// Each group: its key values, its rows, the synopsis of each column asked.
    pub groups: Vec<SummaryGroup>,
}

/// One group of a [`SummaryAnswer`].
pub(crate) type SummaryGroup = (
    Vec<crate::query::groups::WireKey>,
    u64,
    Vec<crate::query::synopsis::ColumnSynopsis>,
);

/// A query whose partial aggregation a replica runs over its buffered rows of one shard
/// (`crate::query::split`): it plans the same text against the same catalog, with the
/// asking node's clock.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PartialQuery {
    pub database: String,
    pub sql: String,
    /// The asking node's `now()`, in nanoseconds since the epoch.
    pub now_nanos: i64,
    /// Files (path, size) the replica reads too, its share of the table's files
    /// ([`PartialAnswer::files_read`] says it did).
    #[serde(default)]
    pub files: Vec<(String, u64)>,
    /// The query's id in the asking node's `system.queries`.
    #[serde(default)]
    pub query_id: Option<u64>,
}

impl PartialQuery {
    /// Query `sql` of `database` with the clock at `now`, no files.
    pub fn new(database: &str, sql: &str, now: chrono::DateTime<chrono::Utc>) -> Self {
        Self {
            database: database.to_string(),
            sql: sql.to_string(),
            now_nanos: now.timestamp_nanos_opt().unwrap_or(i64::MAX),
            files: Vec::new(),
            query_id: crate::query::log::current().map(|r| r.id()),
        }
    }
}

/// A replica's partial aggregation of its buffered rows of a shard (and of the files it
/// was given).
#[derive(Debug, Clone, Default)]
pub struct PartialAnswer {
    /// The metadata group's index it had installed after taking the rows.
    pub manifest_index: u64,
    /// Each partition of the shard the scan reads, with the shard's flushed index there: the
    /// buffered rows after it are what the states count, besides the files' rows.
    pub flushed: Vec<(u64, u64)>,
    /// Buffered rows aggregated (the files' rows are not counted).
    pub rows: u64,
    /// Files of the request's [`PartialQuery::files`] it read: all of them, or the asker
    /// reads them itself (a replica that does not know of files reads none).
    pub files_read: u64,
    /// The partial aggregate's output (its state columns).
    pub states: Vec<RecordBatch>,
}

impl RowsRequest {
    /// The buffered rows of `shard` of table `table_id` in the partitions `keys` (`lo`,
    /// `hi`, `only`), every column.
    pub(crate) fn new(table_id: u64, shard: u32, (lo, hi, only): PartitionKeys) -> Self {
        Self {
            table_id,
            shard,
            lo,
            hi,
            only,
            columns: None,
            latest: false,
            partial: None,
            summary: None,
            asked_by: None,
        }
    }

    /// Whether partition `key` is one the request names.
    pub(crate) fn admits(&self, key: u64) -> bool {
        (self.lo..=self.hi).contains(&key) && self.only.as_ref().is_none_or(|o| o.contains(&key))
    }
}

/// Partition keys from `lo` to `hi` (inclusive), and only those of the list when set.
pub(crate) type PartitionKeys = (u64, u64, Option<Vec<u64>>);

/// One partition's buffered rows of a shard, as a replica holds them.
#[derive(Debug, Clone)]
pub struct RemotePart {
    /// The shard.
    pub shard: u32,
    /// The partition key.
    pub partition: u64,
    /// Where each log index's rows start, `(index, rows before it)`, in order.
    pub starts: Vec<(u64, u64)>,
    /// Column positions of the batches (those asked that the replica's table has: a
    /// replica that has not applied an `ADD COLUMN` yet lacks it).
    pub columns: Vec<usize>,
    /// The rows, in log order.
    pub batches: Vec<RecordBatch>,
}

/// A replica's answer: the rows, and the metadata group's index it had installed when it
/// took them.
#[derive(Debug, Clone, Default)]
pub struct RowsAnswer {
    pub manifest_index: u64,
    /// Column positions of the batches (those asked that the replica's table has).
    pub columns: Vec<usize>,
    pub parts: Vec<RemotePart>,
}

/// The cluster's side: which shards this node holds no replica of, and reading theirs.
#[async_trait]
pub trait ShardReader: Send + Sync + 'static {
    /// The shards whose rows this node does not hold now (it is not one of their replicas,
    /// or its replica has not caught up yet). Empty when it holds them all.
    fn remote_shards(&self) -> BTreeSet<u32>;

    /// `request`'s rows from a replica of its shard (the leader first, then the others),
    /// taken after that replica applied every write acknowledged before this call. Returns
    /// once this node's metadata group has installed the answer's `manifest_index`. An
    /// error names the shard and why no replica answered.
    async fn read(&self, request: RowsRequest) -> Result<RowsAnswer>;

    /// `request`'s partial aggregation (its `partial` is set) from a replica of its shard,
    /// as [`ShardReader::read`] asks for rows.
    async fn partial(&self, request: RowsRequest) -> Result<PartialAnswer> {
        Err(Error::Replication {
            reason: format!("no partial aggregation of shard {}", request.shard),
        })
    }

    /// `request`'s synopses (its `summary` is set) from a replica of its shard, as
    /// [`ShardReader::read`] asks for rows.
    async fn summary(&self, request: RowsRequest) -> Result<SummaryAnswer> {
        Err(Error::Replication {
            reason: format!("no synopses of shard {}", request.shard),
        })
    }

    /// This node's id (0 outside a cluster).
    fn me(&self) -> u64 {
        0
    }

    /// The node a read of `shard`'s rows asks first (for `EXPLAIN`).
    fn asked_first(&self, _shard: u32) -> Option<u64> {
        None
    }

    /// Where each shard this node does not hold stands: its commit index as its leader
    /// confirms it now (a result kept from those shards' rows holds while none moved);
    /// `None` when some leader does not answer.
    async fn versions(&self) -> Option<Vec<(u32, u64)>>;

    /// The shard of each row of `batch` (rows of table `def`), when its last-value key
    /// `keys` is the column rows are sharded by (`None` otherwise).
    fn shards_of(
        &self,
        def: &crate::store::catalog::TableDef,
        keys: &[usize],
        batch: &RecordBatch,
    ) -> Option<Vec<u32>>;
}

impl std::fmt::Debug for dyn ShardReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ShardReader")
    }
}

/// The rows of a table this node does not hold, read for one query.
#[derive(Debug, Clone, Default)]
pub(crate) struct Remote {
    /// Shards whose local rows (left from a replica that was closed, or one catching up)
    /// do not count.
    pub shards: BTreeSet<u32>,
    pub parts: Vec<RemotePart>,
    /// The synopses of the buffered rows of shards whose replicas summarized them for a
    /// query answered from synopses (`crate::query::summaries`), instead of their rows.
    pub summaries: Vec<SummaryAnswer>,
    /// Files other nodes read for this query (their part of a split aggregate): left out
    /// here.
    pub files: BTreeSet<String>,
}

impl Remote {
    /// Whether this node's rows of `shard` are the shard's rows.
    pub(crate) fn holds(&self, shard: u32) -> bool {
        !self.shards.contains(&shard)
    }

    /// Reads, for one query, the buffered rows of table `table_id` in the partitions
    /// `lo..=hi` (`only`) of every shard this node does not hold, with the columns
    /// `columns` (`None`: all). Nothing on a single node or one holding every shard.
    pub(crate) async fn read(
        store: &crate::store::Store,
        table_id: u64,
        keys: (u64, u64, Option<Vec<u64>>),
        columns: Option<Vec<usize>>,
    ) -> Result<Self> {
        let Some(reader) = store.reader() else {
            return Ok(Self::default());
        };
        let shards = reader.remote_shards();
        Self::read_of(store, table_id, keys, columns, shards.clone(), &shards).await
    }

    /// [`Remote::read`] of the shards `read` only, for a node not holding `shards`.
    pub(crate) async fn read_of(
        store: &crate::store::Store,
        table_id: u64,
        (lo, hi, only): (u64, u64, Option<Vec<u64>>),
        columns: Option<Vec<usize>>,
        shards: BTreeSet<u32>,
        read: &BTreeSet<u32>,
    ) -> Result<Self> {
        let Some(reader) = store.reader() else {
            return Ok(Self::default());
        };
        if shards.is_empty() {
            return Ok(Self::default());
        }
        let mut out = Self {
            shards,
            ..Self::default()
        };
        if read.is_empty() || lo > hi {
            return Ok(out);
        }
        let reads = read.iter().map(|&shard| {
            reader.read(RowsRequest {
                columns: columns.clone(),
                ..RowsRequest::new(table_id, shard, (lo, hi, only.clone()))
            })
        });
        let answers = futures::future::try_join_all(reads).await?;
        for a in answers {
            out.parts
                .extend(a.parts.into_iter().filter(|p| !p.batches.is_empty()));
        }
        let rows = out
            .parts
            .iter()
            .flat_map(|p| &p.batches)
            .map(|b| b.num_rows() as u64);
        (store.remote_rows).fetch_add(rows.sum(), std::sync::atomic::Ordering::Relaxed);
        Ok(out)
    }

    /// The partition keys the remote rows fall in.
    pub(crate) fn keys(&self) -> BTreeSet<u64> {
        self.parts.iter().map(|p| p.partition).collect()
    }

    /// The remote rows of the partitions `admits` takes that this node's manifest does not
    /// have in files (`parts`: the table's partitions, under their lock), fitted to
    /// `schema` (the table's, projected by `projection`).
    pub(crate) fn rows_of(
        &self,
        parts: &BTreeMap<u64, Partition>,
        admits: impl Fn(u64) -> bool,
        schema: &SchemaRef,
        projection: Option<&[usize]>,
    ) -> Result<Vec<RecordBatch>> {
        let mut out = Vec::new();
        for p in self.parts.iter().filter(|p| admits(p.partition)) {
            let flushed = (parts.get(&p.partition))
                .and_then(|l| l.shards.get(&p.shard))
                .map_or(0, |s| s.flushed);
            for kept in after(&p.batches, &p.starts, flushed) {
                out.push(fit(&kept, &p.columns, schema, projection)?);
            }
        }
        Ok(out)
    }
}

/// The rows of `batches` (a shard's rows of a partition in log order, `starts` where each
/// log index's rows begin) of the log indexes after `flushed`.
pub(crate) fn after<'a>(
    batches: impl IntoIterator<Item = &'a RecordBatch>,
    starts: &[(u64, u64)],
    flushed: u64,
) -> Vec<RecordBatch> {
    let rest = |b: &RecordBatch, skip: usize| b.slice(skip, b.num_rows() - skip);
    cut_after(
        batches.into_iter().cloned(),
        starts,
        flushed,
        RecordBatch::num_rows,
        rest,
    )
}

/// [`after`] over any pieces of rows (`rows` counts a piece's rows, `rest` makes a piece of
/// its rows from a position on): whole pieces after the cut are kept as they are.
pub(crate) fn cut_after<T>(
    pieces: impl IntoIterator<Item = T>,
    starts: &[(u64, u64)],
    flushed: u64,
    rows: impl Fn(&T) -> usize,
    rest: impl Fn(&T, usize) -> T,
) -> Vec<T> {
    // The rows of the log indexes up to `flushed` (all of them when none is after it).
    let first = starts.iter().find(|(lsn, _)| *lsn > flushed);
    let mut skip = first.map_or(usize::MAX, |(_, at)| *at as usize);
    let mut out = Vec::new();
    for piece in pieces {
        let n = rows(&piece);
        match skip {
            0 => out.push(piece),
            s if s >= n => skip -= n,
            s => {
                out.push(rest(&piece, s));
                skip = 0;
            }
        }
    }
    out
}

/// The answers of one replica of each of `shards`, all asked at once (`ask`; none when not
/// `asking`), that `keep` takes, and the shards left to read as rows: those whose replica
/// gave no answer (`what`: what was asked, for the log) or one `keep` refuses.
pub(crate) async fn answers_of<A, F>(
    shards: &BTreeSet<u32>,
    asking: bool,
    ask: impl Fn(u32) -> F,
    keep: impl Fn(u32, &A) -> bool,
    what: &str,
) -> (BTreeMap<u32, A>, BTreeSet<u32>)
where
    F: std::future::Future<Output = Result<A>>,
{
    let asks = shards.iter().filter(|_| asking).map(|&shard| {
        let answer = ask(shard);
        async move { (shard, answer.await) }
    });
    let mut answered = BTreeMap::new();
    for (shard, answer) in futures::future::join_all(asks).await {
        match answer {
            Ok(a) if keep(shard, &a) => {
                answered.insert(shard, a);
            }
            Ok(_) => tracing::debug!(shard, what, "a replica's answer does not fit the query"),
            Err(e) => tracing::debug!(shard, what, error = %e, "no answer from a replica"),
        }
    }
    let read = (shards.iter()).filter(|s| !answered.contains_key(s));
    let read = read.copied().collect();
    (answered, read)
}

/// Whether a replica's answer for `shard`, cut at the flushed index of each partition in
/// `flushed`, counts exactly the rows this node's files lack: this node's flushed index of
/// each of those (partition, shard) pairs in `here` is the same (a partition absent here
/// has none).
pub(crate) fn cut_alike(
    shard: u32,
    flushed: &[(u64, u64)],
    here: &BTreeMap<(u64, u32), u64>,
) -> bool {
    (flushed.iter()).all(|(p, f)| here.get(&(*p, shard)).copied().unwrap_or(0) == *f)
}

/// `batch` (whose columns are the table's at positions `columns`) as a batch of `schema`
/// (the table's columns `projection`): columns the replica lacked are NULL.
pub(crate) fn fit(
    batch: &RecordBatch,
    columns: &[usize],
    schema: &SchemaRef,
    projection: Option<&[usize]>,
) -> Result<RecordBatch> {
    let wanted: Vec<usize> = match projection {
        Some(p) => p.to_vec(),
        None => (0..schema.fields().len()).collect(),
    };
    let arrays: Vec<ArrayRef> = (wanted.iter().zip(schema.fields()))
        .map(|(c, f)| match columns.iter().position(|x| x == c) {
            Some(i) if batch.column(i).data_type() == f.data_type() => batch.column(i).clone(),
            _ => new_null_array(f.data_type(), batch.num_rows()),
        })
        .collect();
    let options =
        datafusion::arrow::array::RecordBatchOptions::new().with_row_count(Some(batch.num_rows()));
    Ok(RecordBatch::try_new_with_options(
        schema.clone(),
        arrays,
        &options,
    )?)
}

/// The newest row of each key of `table` from its last-value cache: the rows of the shards
/// this node holds (`reader.remote_shards()` are not) and, for each other shard, those its
/// replica's cache holds (`latest` requests). `None` when they cannot be had: a cache not
/// complete here or there (a fill is started), or a key that is not the shard key.
pub(crate) async fn latest_rows(
    store: &crate::store::Store,
    table: &TableState,
    mine: RecordBatch,
) -> Option<RecordBatch> {
    let reader = store.reader()?;
    let def = table.def();
    let (keys, _) = table.latest.shape()?;
    let remote = reader.remote_shards();
    let shards = reader.shards_of(&def, &keys, &mine)?;
    let held: Vec<bool> = shards.iter().map(|s| !remote.contains(s)).collect();
    let mut out = vec![
        datafusion::arrow::compute::filter_record_batch(
            &mine,
            &datafusion::arrow::array::BooleanArray::from(held),
        )
        .ok()?,
    ];
    let reads = remote.iter().map(|&shard| {
        reader.read(RowsRequest {
            latest: true,
            ..RowsRequest::new(def.id, shard, (0, u64::MAX, None))
        })
    });
    for answer in futures::future::join_all(reads).await {
        let answer = answer.ok()?;
        for p in answer.parts {
            for b in &p.batches {
                out.push(fit(b, &p.columns, &mine.schema(), None).ok()?);
            }
        }
    }
    datafusion::arrow::compute::concat_batches(&mine.schema(), &out).ok()
}

/// Answers a `latest` request: the newest rows of the keys of `request.shard` in this
/// node's last-value cache; `Err(Some(generation))` to fill the cache first, `Err(None)`
/// when it cannot answer.
pub(crate) fn serve_latest(
    table: &TableState,
    request: &RowsRequest,
    reader: &dyn ShardReader,
    manifest_index: u64,
) -> std::result::Result<RowsAnswer, Option<u64>> {
    let def = table.def();
    let types: Vec<_> = def.columns.iter().map(|c| c.ty).collect();
    let schema = table.schema();
    let rows = table.latest.snapshot(&schema, &types)?;
    let (keys, _) = table.latest.shape().ok_or(None)?;
    let shards = reader.shards_of(&def, &keys, &rows).ok_or(None)?;
    let mask: Vec<bool> = shards.iter().map(|s| *s == request.shard).collect();
    let mask = datafusion::arrow::array::BooleanArray::from(mask);
    let rows = datafusion::arrow::compute::filter_record_batch(&rows, &mask).map_err(|_| None)?;
    let columns: Vec<usize> = (0..schema.fields().len()).collect();
    Ok(RowsAnswer {
        manifest_index,
        columns: columns.clone(),
        parts: vec![RemotePart {
            shard: request.shard,
            partition: 0,
            starts: Vec::new(),
            columns,
            batches: vec![rows],
        }],
    })
}

/// Answers `request` from this node's replica of the shard (the caller ran its read
/// barrier): its buffered rows of the partitions asked, with `manifest_index` read after
/// them.
pub(crate) fn serve(
    table: &TableState,
    request: &RowsRequest,
    manifest_index: impl Fn() -> u64,
) -> Result<RowsAnswer> {
    let schema = table.schema();
    let width = schema.fields().len();
    let columns: Vec<usize> = match &request.columns {
        Some(c) => c.iter().copied().filter(|c| *c < width).collect(),
        None => (0..width).collect(),
    };
    let mut parts = Vec::new();
    {
        let held = table.parts.read();
        // Bounds come from another node: contradictory ones (a query's filters that no
        // partition can meet) name nothing, and must not reach `range`, which panics.
        let keys = match request.lo <= request.hi {
            true => held.range(request.lo..=request.hi),
            false => held.range(1..1),
        };
        for (key, p) in keys {
            if !request.admits(*key) {
                continue;
            }
            let Some(s) = p.shards.get(&request.shard) else {
                continue;
            };
            if s.buffer.is_empty() {
                continue;
            }
            let batches = (s.buffer.chunks(&schema).into_iter())
                .map(|c| c.batch.project(&columns))
                .collect::<std::result::Result<Vec<_>, _>>()?;
            parts.push(RemotePart {
                shard: request.shard,
                partition: *key,
                starts: s.buffer.lsn_starts(),
                columns: columns.clone(),
                batches,
            });
        }
    }
    Ok(RowsAnswer {
        manifest_index: manifest_index(),
        columns,
        parts,
    })
}

impl RowsAnswer {
    /// The answer as bytes: a header (manifest index, columns, each part's shard,
    /// partition, batch count and starts), then every batch as one Arrow IPC stream.
    pub fn encode(&self, schema: &SchemaRef) -> Result<Vec<u8>> {
        let mut out = Vec::new();
        let put = |out: &mut Vec<u8>, v: u64| out.extend_from_slice(&v.to_le_bytes());
        put(&mut out, self.manifest_index);
        put(&mut out, self.columns.len() as u64);
        for c in &self.columns {
            put(&mut out, *c as u64);
        }
        put(&mut out, self.parts.len() as u64);
        for p in &self.parts {
            put(&mut out, u64::from(p.shard));
            put(&mut out, p.partition);
            put(&mut out, p.batches.len() as u64);
            put(&mut out, p.starts.len() as u64);
            for (lsn, at) in &p.starts {
                put(&mut out, *lsn);
                put(&mut out, *at);
            }
        }
        write_ipc(&mut out, schema, self.parts.iter().flat_map(|p| &p.batches))?;
        Ok(out)
    }

    /// The answer [`RowsAnswer::encode`] wrote.
    pub fn decode(bytes: &[u8]) -> Result<Self> {
        let bad = || damaged("rows");
        let mut words = Words { bytes, at: 0 };
        let mut get = || words.next("rows");
        let manifest_index = get()?;
        let n = get()?;
        let columns = (0..n)
            .map(|_| get().map(|c| c as usize))
            .collect::<Result<Vec<_>>>()?;
        let n = get()?;
        let mut heads = Vec::new();
        for _ in 0..n {
            let shard = u32::try_from(get()?).map_err(|_| bad())?;
            let partition = get()?;
            let batches = get()? as usize;
            let starts = get()?;
            let starts = (0..starts)
                .map(|_| Ok((get()?, get()?)))
                .collect::<Result<Vec<_>>>()?;
            heads.push((shard, partition, batches, starts));
        }
        let reader = StreamReader::try_new(std::io::Cursor::new(words.rest()), None)?;
        let mut batches = reader
            .collect::<std::result::Result<Vec<_>, _>>()?
            .into_iter();
        let mut parts = Vec::new();
        for (shard, partition, n, starts) in heads {
            let taken: Vec<RecordBatch> = batches.by_ref().take(n).collect();
            if taken.len() != n {
                return Err(bad());
            }
            parts.push(RemotePart {
                shard,
                partition,
                starts,
                columns: columns.clone(),
                batches: taken,
            });
        }
        Ok(Self {
            manifest_index,
            columns,
            parts,
        })
    }
}

/// `batches` as one Arrow IPC stream after `out` (of their schema, else `schema`).
fn write_ipc<'a>(
    out: &mut Vec<u8>,
    schema: &SchemaRef,
    batches: impl Iterator<Item = &'a RecordBatch> + Clone,
) -> Result<()> {
    let schema = batches
        .clone()
        .next()
        .map_or(schema.clone(), |b| b.schema());
    let mut writer = StreamWriter::try_new(out, &schema)?;
    for b in batches {
        writer.write(b)?;
    }
    writer.finish()?;
    Ok(())
}

fn damaged(what: &str) -> Error {
    Error::Replication {
        reason: format!("a replica's {what} came back damaged"),
    }
}

/// Reads an answer's header: little-endian words, then the rest.
struct Words<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Words<'a> {
    fn next(&mut self, what: &str) -> Result<u64> {
        let b = self
            .bytes
            .get(self.at..self.at + 8)
            .ok_or_else(|| damaged(what))?;
        self.at += 8;
        Ok(u64::from_le_bytes(b.try_into().map_err(|_| damaged(what))?))
    }

    fn rest(&self) -> &'a [u8] {
        &self.bytes[self.at..]
    }
}

/// Marks a [`PartialAnswer`] (a [`RowsAnswer`] starts with a manifest index).
/// Marks a [`PartialAnswer`] (the second form: with `files_read`; a replica of the first
/// form read no files, and its answer is refused: the asker reads rows and files itself).
const PARTIAL_MAGIC: u64 = 0x5350_4c49_5450_4132;

impl PartialAnswer {
    /// The answer as bytes: a header (marker, manifest index, rows, files read, each partition and its
    /// flushed index), then the states as one Arrow IPC stream.
    pub fn encode(&self) -> Result<Vec<u8>> {
        let mut out = Vec::new();
        let mut put = |v: u64| out.extend_from_slice(&v.to_le_bytes());
        put(PARTIAL_MAGIC);
        put(self.manifest_index);
        put(self.rows);
        put(self.files_read);
        put(self.flushed.len() as u64);
        for (partition, flushed) in &self.flushed {
            put(*partition);
            put(*flushed);
        }
        let empty = std::sync::Arc::new(datafusion::arrow::datatypes::Schema::empty());
        write_ipc(&mut out, &empty, self.states.iter())?;
        Ok(out)
    }

    /// The answer [`PartialAnswer::encode`] wrote.
    pub fn decode(bytes: &[u8]) -> Result<Self> {
        let mut words = Words { bytes, at: 0 };
        let mut get = || words.next("partial aggregate");
        if get()? != PARTIAL_MAGIC {
            return Err(damaged("partial aggregate"));
        }
        let manifest_index = get()?;
        let rows = get()?;
        let files_read = get()?;
        let n = get()?;
        let flushed = (0..n)
            .map(|_| Ok((get()?, get()?)))
            .collect::<Result<Vec<_>>>()?;
        let reader = StreamReader::try_new(std::io::Cursor::new(words.rest()), None)?;
        let states = reader.collect::<std::result::Result<Vec<_>, _>>()?;
        Ok(Self {
            manifest_index,
            flushed,
            rows,
            files_read,
            states,
        })
    }
}

#[cfg(test)]
mod tests;
