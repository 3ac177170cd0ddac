//! `system.queries`: the statements this node runs and ran (the last [`KEPT`] that ended),
//! and on a cluster node the parts of other nodes' queries it runs for them (a partial
//! aggregate, synopses or rows of a shard it holds), so that each node's work for a query
//! can be seen where it was done.
//!
//! A statement is logged as it starts ([`QueryLog::begin`]) and ends when its result has
//! been read to the end, failed, or was dropped unread ("cancelled": the client went away).
//! What it read is taken from its physical plan's counters once it ends (the ones `EXPLAIN
//! ANALYZE` shows): files, buffered rows, rows read from other nodes' replicas, and the
//! partial aggregates, rows and files other nodes took on for it. The plan reaches its log
//! entry through a task-local ([`within`], [`current`]) set around the statement's planning.

use crate::error::{Error, Result};
use crate::store::remote::RowsRequest;
use datafusion::arrow::array::{
    ArrayRef, Float64Array, StringArray, TimestampMicrosecondArray, UInt64Array,
};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::error::Result as DfResult;
use datafusion::execution::SendableRecordBatchStream;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use futures::StreamExt;
use parking_lot::Mutex;
use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::Instant;

/// Entries that ended kept per node, the oldest dropped first.
pub(crate) const KEPT: usize = 1_000;
/// Bytes of a statement's text kept (a long `INSERT ... VALUES` is cut, with `...` after).
const TEXT_BYTES: usize = 4_096;

/// What a statement read and what other nodes did for it, from its plan's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Work {
    pub files_read: u64,
    pub memory_rows: u64,
    pub remote_rows: u64,
    pub remote_partials: u64,
    pub remote_rows_aggregated: u64,
    pub remote_files: u64,
}

impl Work {
    /// Adds the counters of `plan` and every plan under it.
    fn add(&mut self, plan: &dyn ExecutionPlan) {
        if let Some(m) = plan.metrics() {
            let sum = |name: &str| m.sum_by_name(name).map_or(0, |v| v.as_usize() as u64);
            self.files_read += sum("files_read");
            self.memory_rows += sum("memory_rows");
            self.remote_rows += sum("remote_rows");
            self.remote_partials += sum("remote_partials");
            self.remote_rows_aggregated += sum("remote_rows_aggregated");
            self.remote_files += sum("remote_files");
        }
        for child in plan.children() {
            self.add(child.as_ref());
        }
    }
}

/// One statement, or one part of another node's query.
#[derive(Debug, Clone)]
struct Entry {
    id: u64,
    /// "query", or for a part run for another node: "partial", "synopses", "rows".
    kind: &'static str,
    /// For a part: the node that asked, and its query's id there (when it said).
    asked_by: Option<u64>,
    asker_query: Option<u64>,
    user: Option<String>,
    database: String,
    text: String,
    started_micros: i64,
    started: Instant,
    duration_ms: Option<f64>,
    state: &'static str,
    error: Option<String>,
    result_rows: Option<u64>,
    work: Work,
}

/// A node's log of statements, running and recent.
#[derive(Debug, Default)]
pub(crate) struct QueryLog {
    next: AtomicU64,
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    running: BTreeMap<u64, Entry>,
    ended: VecDeque<Entry>,
}

/// What a new entry is.
pub(crate) struct Begin<'a> {
    pub kind: &'static str,
    pub asked_by: Option<(u64, Option<u64>)>,
    pub user: Option<&'a str>,
    pub database: &'a str,
    pub text: &'a str,
}

impl QueryLog {
    /// Logs a statement (or part) as running; it ends when the returned handle says so or
    /// is dropped.
    pub(crate) fn begin(self: &Arc<Self>, b: Begin<'_>) -> Arc<Running> {
        let id = self.next.fetch_add(1, Ordering::Relaxed) + 1;
        let entry = Entry {
            id,
            kind: b.kind,
            asked_by: b.asked_by.map(|(node, _)| node),
            asker_query: b.asked_by.and_then(|(_, q)| q),
            user: b.user.map(str::to_string),
            database: b.database.to_string(),
            text: cut(masked(b.text)),
            started_micros: chrono::Utc::now().timestamp_micros(),
            started: Instant::now(),
            duration_ms: None,
            state: "running",
            error: None,
            result_rows: None,
            work: Work::default(),
        };
        self.inner.lock().running.insert(id, entry);
        Arc::new(Running {
            id,
            log: self.clone(),
            plan: Mutex::new(None),
            noted: Mutex::new(Work::default()),
            rows: AtomicU64::new(0),
            ended: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// `system.queries`, as this node (`node`) has it: running entries first, then those
    /// that ended, newest first.
    pub(crate) fn table(&self, node: u64) -> DfResult<RecordBatch> {
        let entries: Vec<Entry> = {
            let inner = self.inner.lock();
            let running = inner.running.values().rev().cloned();
            running.chain(inner.ended.iter().rev().cloned()).collect()
        };
        let now = Instant::now();
        let u64s = |f: &dyn Fn(&Entry) -> u64| -> ArrayRef {
            Arc::new(UInt64Array::from_iter_values(entries.iter().map(f)))
        };
        let opt = |f: &dyn Fn(&Entry) -> Option<u64>| -> ArrayRef {
            Arc::new(UInt64Array::from_iter(entries.iter().map(f)))
        };
        let text = |f: &dyn Fn(&Entry) -> Option<&str>| -> ArrayRef {
            Arc::new(StringArray::from_iter(entries.iter().map(f)))
        };
        let arrays: Vec<ArrayRef> = vec![
            u64s(&|e| e.id),
            u64s(&|_| node),
            text(&|e| Some(e.kind)),
            opt(&|e| e.asked_by),
            opt(&|e| e.asker_query),
            text(&|e| e.user.as_deref()),
            text(&|e| Some(&e.database)),
            text(&|e| Some(&e.text)),
            Arc::new(TimestampMicrosecondArray::from_iter_values(
                entries.iter().map(|e| e.started_micros),
            )),
            Arc::new(Float64Array::from_iter(entries.iter().map(|e| {
                // A running statement shows how long it has run so far.
                Some(
                    e.duration_ms
                        .unwrap_or_else(|| now.duration_since(e.started).as_secs_f64() * 1e3),
                )
            }))),
            text(&|e| Some(e.state)),
            text(&|e| e.error.as_deref()),
            opt(&|e| e.result_rows),
            u64s(&|e| e.work.files_read),
            u64s(&|e| e.work.memory_rows),
            u64s(&|e| e.work.remote_rows),
            u64s(&|e| e.work.remote_partials),
            u64s(&|e| e.work.remote_rows_aggregated),
            u64s(&|e| e.work.remote_files),
        ];
        Ok(RecordBatch::try_new(SCHEMA.clone(), arrays)?)
    }

    fn end(
        &self,
        id: u64,
        state: &'static str,
        error: Option<String>,
        rows: Option<u64>,
        work: Work,
    ) {
        let mut inner = self.inner.lock();
        let Some(mut entry) = inner.running.remove(&id) else {
            return;
        };
        entry.duration_ms = Some(entry.started.elapsed().as_secs_f64() * 1e3);
        (entry.state, entry.error, entry.result_rows, entry.work) = (state, error, rows, work);
        if inner.ended.len() >= KEPT {
            inner.ended.pop_front();
        }
        inner.ended.push_back(entry);
    }
}

static SCHEMA: LazyLock<SchemaRef> = LazyLock::new(|| {
    let f = |name: &str, ty: DataType, null: bool| Field::new(name, ty, null);
    let count = |name: &str| f(name, DataType::UInt64, false);
    Arc::new(Schema::new(vec![
        count("query_id"),
        count("node"),
        f("kind", DataType::Utf8, false),
        f("asked_by", DataType::UInt64, true),
        f("asker_query_id", DataType::UInt64, true),
        f("user", DataType::Utf8, true),
        f("database_name", DataType::Utf8, false),
        f("query", DataType::Utf8, false),
        f(
            "started",
            DataType::Timestamp(TimeUnit::Microsecond, None),
            false,
        ),
        f("duration_ms", DataType::Float64, false),
        f("state", DataType::Utf8, false),
        f("error", DataType::Utf8, true),
        f("result_rows", DataType::UInt64, true),
        count("files_read"),
        count("memory_rows"),
        count("remote_rows"),
        count("remote_partials"),
        count("remote_rows_aggregated"),
        count("remote_files"),
    ]))
});

/// A logged statement that has not ended yet.
pub(crate) struct Running {
    id: u64,
    log: Arc<QueryLog>,
    plan: Mutex<Option<Arc<dyn ExecutionPlan>>>,
    /// Work done outside its plan (a part's rows and files).
    noted: Mutex<Work>,
    rows: AtomicU64,
    ended: std::sync::atomic::AtomicBool,
}

impl std::fmt::Debug for Running {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Running").field("id", &self.id).finish()
    }
}

impl Running {
    /// Its id in `system.queries`.
    pub(crate) fn id(&self) -> u64 {
        self.id
    }

    /// The physical plan it runs: its counters are read when it ends.
    pub(crate) fn set_plan(&self, plan: Arc<dyn ExecutionPlan>) {
        *self.plan.lock() = Some(plan);
    }

    /// Work it did outside its plan.
    pub(crate) fn note(&self, work: Work) {
        *self.noted.lock() = work;
    }

    /// What its plan's counters say, and what was noted.
    fn work(&self) -> Work {
        let mut work = *self.noted.lock();
        if let Some(plan) = self.plan.lock().take() {
            work.add(plan.as_ref());
        }
        work
    }

    /// Ends it: `Ok` with the rows it returned (when counted), or the error.
    pub(crate) fn end(&self, outcome: std::result::Result<Option<u64>, String>) {
        if self.ended.swap(true, Ordering::AcqRel) {
            return;
        }
        let work = self.work();
        match outcome {
            Ok(rows) => self.log.end(self.id, "finished", None, rows, work),
            Err(e) => self.log.end(self.id, "failed", Some(e), None, work),
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if !self.ended.swap(true, Ordering::AcqRel) {
            let rows = Some(self.rows.load(Ordering::Relaxed));
            let work = self.work();
            self.log.end(self.id, "cancelled", None, rows, work);
        }
    }
}

/// `stream`, ending `running` when it ends: with the rows it gave, or its error. Dropped
/// before its end, `running` ends as cancelled.
pub(crate) fn recorded(
    stream: SendableRecordBatchStream,
    running: Arc<Running>,
) -> SendableRecordBatchStream {
    let schema = stream.schema();
    let counted = futures::stream::unfold(
        (stream, Some(running)),
        |(mut stream, running)| async move {
            let running = running?;
            match stream.next().await {
                Some(Ok(batch)) => {
                    running
                        .rows
                        .fetch_add(batch.num_rows() as u64, Ordering::Relaxed);
                    Some((Ok(batch), (stream, Some(running))))
                }
                Some(Err(e)) => {
                    running.end(Err(e.to_string()));
                    Some((Err(e), (stream, None)))
                }
                None => {
                    running.end(Ok(Some(running.rows.load(Ordering::Relaxed))));
                    None
                }
            }
        },
    );
    Box::pin(RecordBatchStreamAdapter::new(schema, counted))
}

impl crate::engine::Engine {
    /// Answers another node's request for a shard held here, once the shard's read barrier
    /// passed: a partial aggregate of its query, the synopses or the rows of the shard,
    /// logged in `system.queries` as a part of that query.
    pub async fn serve_shard(self: &Arc<Self>, request: RowsRequest) -> Result<Vec<u8>> {
        let cat = self.store.catalog.snapshot();
        let table = (cat.tables().find(|t| t.id == request.table_id))
            .map(|t| (t.database.clone(), format!("{}.{}", t.database, t.name)));
        let (database, table) = table.unwrap_or_else(|| {
            let id = format!("table {}", request.table_id);
            (String::new(), id)
        });
        let shard = request.shard;
        let (kind, text, query_id) = match (&request.partial, &request.summary) {
            (Some(p), _) => ("partial", p.sql.clone(), p.query_id),
            (None, Some(_)) => (
                "synopses",
                format!("synopses of {table}, shard {shard}"),
                None,
            ),
            (None, None) if request.latest => (
                "rows",
                format!("latest rows of {table}, shard {shard}"),
                None,
            ),
            (None, None) => ("rows", format!("rows of {table}, shard {shard}"), None),
        };
        let running = self.store.queries.begin(Begin {
            kind,
            asked_by: request.asked_by.map(|node| (node, query_id)),
            user: None,
            database: &database,
            text: &text,
        });
        let answer = if request.partial.is_some() {
            within(running.clone(), self.serve_partial(request)).await
        } else {
            // Both may wait for the catalog to know the table: off the runtime's threads.
            let engine = self.clone();
            let blocking = tokio::task::spawn_blocking(move || match request.summary {
                Some(_) => engine.serve_summary(&request),
                None => engine.shard_rows(&request),
            });
            (blocking.await).unwrap_or_else(|e| Err(Error::invalid(e.to_string())))
        };
        running.end(answer.as_ref().map(|_| None).map_err(|e| e.to_string()));
        answer
    }
}

tokio::task_local! {
    static CURRENT: Arc<Running>;
}

/// Runs `f` with `running` as the statement being planned ([`current`]).
pub(crate) async fn within<F: std::future::Future>(running: Arc<Running>, f: F) -> F::Output {
    CURRENT.scope(running, f).await
}

/// The statement whose planning runs on this task, if it is logged.
pub(crate) fn current() -> Option<Arc<Running>> {
    CURRENT.try_with(Arc::clone).ok()
}

/// `text` cut to [`TEXT_BYTES`] at a character's boundary, with `...` after when cut.
fn cut(mut text: String) -> String {
    if text.len() > TEXT_BYTES {
        let at = (0..=TEXT_BYTES).rev().find(|i| text.is_char_boundary(*i));
        text.truncate(at.unwrap_or(0));
        text.push_str("...");
    }
    text
}

/// `sql` with the literal after each `PASSWORD` keyword (outside quotes) replaced by
/// `***` (`CREATE USER`, `ALTER USER`): passwords are not kept in the log.
fn masked(sql: &str) -> String {
    let b = sql.as_bytes();
    // The end of the literal opened by the quote at `i` (past its closing quote; a doubled
    // quote is one quote inside it).
    let literal_end = |i: usize| {
        let q = b[i];
        let mut j = i + 1;
        while j < b.len() {
            if b[j] == q {
                if b.get(j + 1) == Some(&q) {
                    j += 2;
                    continue;
                }
                return j + 1;
            }
            j += 1;
        }
        b.len()
    };
    let word = |i: usize| {
        b.get(i)
            .is_some_and(|c| c.is_ascii_alphanumeric() || *c == b'_')
    };
    let mut out = String::with_capacity(sql.len());
    let (mut i, mut copied) = (0, 0);
    while i < b.len() {
        if b[i] == b'\'' || b[i] == b'"' {
            i = literal_end(i);
            continue;
        }
        let keyword = b.len() - i >= 8
            && b[i..i + 8].eq_ignore_ascii_case(b"password")
            && !(i > 0 && word(i - 1))
            && !word(i + 8);
        if !keyword {
            i += 1;
            continue;
        }
        let mut j = i + 8;
        let skip_spaces = |mut j: usize| {
            while b.get(j).is_some_and(u8::is_ascii_whitespace) {
                j += 1;
            }
            j
        };
        j = skip_spaces(j);
        if b.get(j) == Some(&b'=') {
            j = skip_spaces(j + 1);
        } else if b.len() - j >= 2 && b[j..j + 2].eq_ignore_ascii_case(b"to") && !word(j + 2) {
            j = skip_spaces(j + 2);
        }
        if b.get(j) == Some(&b'\'') || b.get(j) == Some(&b'"') {
            let end = literal_end(j);
            out.push_str(&sql[copied..=j]);
            out.push_str("***");
            if end > j + 1 && b[end - 1] == b[j] {
                out.push(b[j] as char);
            }
            (i, copied) = (end, end);
        } else {
            i = j.max(i + 8);
        }
    }
    out.push_str(&sql[copied..]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_masked() {
        assert_eq!(
            masked("CREATE USER ann PASSWORD 'it''s secret' ROLE reader"),
            "CREATE USER ann PASSWORD '***' ROLE reader"
        );
        assert_eq!(
            masked("alter user bob password = \"x\"; select 'password' as p"),
            "alter user bob password = \"***\"; select 'password' as p"
        );
        assert_eq!(masked("SELECT 1"), "SELECT 1");
        assert_eq!(
            masked("CREATE USER c PASSWORD 'open"),
            "CREATE USER c PASSWORD '***"
        );
        assert_eq!(masked("SELECT passwords FROM t"), "SELECT passwords FROM t");
        let long = format!("INSERT INTO t VALUES {}", "('é', 1), ".repeat(1_000));
        let kept = cut(long.clone());
        assert!(
            kept.len() <= TEXT_BYTES + 3 && kept.ends_with("...") && long.starts_with(&kept[..100])
        );
        assert_eq!(cut("SELECT 1".into()), "SELECT 1");
    }

    #[tokio::test]
    async fn ends_as_the_stream_ends_or_is_dropped() {
        let log = Arc::new(QueryLog::default());
        let begin = |text| Begin {
            kind: "query",
            asked_by: None,
            user: Some("ann"),
            database: "default",
            text,
        };
        let schema = Arc::new(Schema::new(vec![Field::new("x", DataType::UInt64, false)]));
        let batch = RecordBatch::try_new(
            schema.clone(),
            vec![Arc::new(UInt64Array::from(vec![1, 2, 3])) as ArrayRef],
        )
        .unwrap();
        let stream = |n: usize| -> SendableRecordBatchStream {
            let batches: Vec<DfResult<RecordBatch>> = (0..n).map(|_| Ok(batch.clone())).collect();
            Box::pin(RecordBatchStreamAdapter::new(
                schema.clone(),
                futures::stream::iter(batches),
            ))
        };
        let read = log.begin(begin("SELECT read"));
        let mut s = recorded(stream(2), read);
        while s.next().await.is_some() {}
        let dropped = log.begin(begin("SELECT dropped"));
        let mut s2 = recorded(stream(2), dropped);
        s2.next().await;
        let running = log.begin(begin("SELECT running"));
        let t = log.table(7).unwrap();
        assert_eq!(t.num_rows(), 3, "one ended, two running");
        drop(s2);
        running.end(Err("it failed".into()));
        let t = log.table(7).unwrap();
        let col = |name: &str| {
            let c = t.column_by_name(name).unwrap();
            (0..t.num_rows())
                .map(|i| datafusion::arrow::util::display::array_value_to_string(c, i).unwrap())
                .collect::<Vec<_>>()
        };
        assert_eq!(
            col("query"),
            ["SELECT running", "SELECT dropped", "SELECT read"]
        );
        assert_eq!(col("state"), ["failed", "cancelled", "finished"]);
        assert_eq!(col("result_rows"), ["", "3", "6"]);
        assert_eq!(col("error"), ["it failed", "", ""]);
        assert_eq!(col("node"), ["7", "7", "7"]);
        assert_eq!(col("user"), ["ann", "ann", "ann"]);
    }

    #[test]
    fn keeps_the_last_that_ended() {
        let log = Arc::new(QueryLog::default());
        for i in 0..KEPT + 5 {
            let text = format!("SELECT {i}");
            let r = log.begin(Begin {
                kind: "query",
                asked_by: None,
                user: None,
                database: "default",
                text: &text,
            });
            r.end(Ok(Some(0)));
        }
        let t = log.table(0).unwrap();
        assert_eq!(t.num_rows(), KEPT);
        let ids = t.column(0).as_any().downcast_ref::<UInt64Array>().unwrap();
        assert_eq!(ids.value(0), (KEPT + 5) as u64, "newest first");
        assert_eq!(ids.value(KEPT - 1), 6, "the first five dropped");
    }
}
