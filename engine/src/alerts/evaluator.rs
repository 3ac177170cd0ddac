//! Running alerts: one scheduler task starts each alert's query when it is due (a few at a
//! time), reads the condition's value from the first rows, moves the alert's state and, on a
//! change, notifies. Everything an evaluation can fail with (a query error, a missing or
//! non-numeric column, a timeout) becomes the `error` state with its reason.

use super::{AlertDef, Condition};
use crate::ports::{QueryOptions, QueryPort};
use datafusion::arrow::array::{
    ArrayRef, AsArray, BooleanArray, Float64Array, StringArray, TimestampMicrosecondArray,
    UInt64Array,
};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Field, Float64Type, Schema, TimeUnit};
use datafusion::arrow::record_batch::RecordBatch;
use futures::StreamExt;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// Evaluations running at once; more wait, so a burst of due alerts cannot swamp the cores.
const CONCURRENCY: usize = 4;
/// An "any rows" alert counts at most this many rows.
const MAX_COUNTED_ROWS: usize = 10_000;
/// The shortest time an evaluation may take before it is an error.
const MIN_TIMEOUT: Duration = Duration::from_secs(10);
/// Attempts to deliver one webhook notification.
const WEBHOOK_ATTEMPTS: u32 = 3;

/// Where notifications go besides webhooks: the broker publishes them to local MQTT
/// subscribers.
pub trait AlertSink: Send + Sync + 'static {
    /// Publishes `payload` (JSON) on `topic` (`$alerts/<name>`).
    fn publish(&self, topic: String, payload: Vec<u8>);
}

/// An alert's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AlertState {
    /// Not evaluated yet.
    Pending,
    /// The condition does not hold.
    Ok,
    /// The condition holds.
    Firing,
    /// The last evaluation failed.
    Error,
}

impl AlertState {
    /// The lower-case name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Ok => "ok",
            Self::Firing => "firing",
            Self::Error => "error",
        }
    }
}

/// An alert with its state, as the HTTP API and `system.alerts` show it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct AlertStatus {
    /// Name.
    pub name: String,
    /// The query.
    pub query: String,
    /// The database of the query's unqualified names.
    pub database: String,
    /// The condition in words (`t > 90`, `any rows`).
    pub condition: String,
    /// How often it runs.
    pub interval_ms: u64,
    /// Whether changes are published on `$alerts/<name>`.
    pub publish: bool,
    /// Where changes are POSTed.
    pub webhook: Option<String>,
    /// Current state.
    pub state: AlertState,
    /// The value the condition compared (rows counted, for "any rows"), when there was one.
    pub last_value: Option<f64>,
    /// When it last ran (milliseconds since the epoch).
    pub last_evaluation_ms: Option<i64>,
    /// When its state last changed.
    pub last_change_ms: Option<i64>,
    /// Why the last evaluation failed.
    pub error: Option<String>,
    /// Evaluations since the server started (or the alert was made).
    pub evaluations: u64,
    /// Notifications sent (changes of state).
    pub notifications: u64,
    /// The last webhook failure, if the last delivery failed.
    pub webhook_error: Option<String>,
    /// Who made it; it runs with that user's rights.
    pub owner: Option<String>,
}

impl AlertStatus {
    fn new(def: &AlertDef) -> Self {
        Self {
            name: def.name.clone(),
            query: def.query.clone(),
            database: def.database.clone(),
            condition: def.condition.to_string(),
            interval_ms: def.interval_ms,
            publish: def.publish,
            webhook: def.webhook.clone(),
            owner: def.owner.clone(),
            state: AlertState::Pending,
            last_value: None,
            last_evaluation_ms: None,
            last_change_ms: None,
            error: None,
            evaluations: 0,
            notifications: 0,
            webhook_error: None,
        }
    }
}

/// What one evaluation found.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Reading {
    /// Whether the condition holds.
    pub(crate) fires: bool,
    /// The value compared, or the rows counted.
    pub(crate) value: Option<f64>,
}

/// Reads `condition` off a query result (the batches until the first non-empty one for a
/// threshold; up to [`MAX_COUNTED_ROWS`] rows for "any rows").
pub(crate) async fn read(
    condition: &Condition,
    mut stream: datafusion::execution::SendableRecordBatchStream,
) -> Result<Reading, String> {
    let mut rows = 0;
    while let Some(batch) = stream.next().await {
        let batch = batch.map_err(|e| crate::Error::from(e).to_string())?;
        if batch.num_rows() == 0 {
            continue;
        }
        match condition {
            Condition::AnyRows => {
                rows += batch.num_rows();
                if rows >= MAX_COUNTED_ROWS {
                    break;
                }
            }
            Condition::Threshold { column, op, value } => {
                let v = first_value(&batch, column)?;
                return Ok(Reading {
                    fires: v.is_some_and(|v| op.holds(v, *value)),
                    value: v,
                });
            }
        }
    }
    Ok(match condition {
        Condition::AnyRows => Reading {
            fires: rows > 0,
            value: Some(rows as f64),
        },
        Condition::Threshold { .. } => Reading {
            fires: false,
            value: None,
        },
    })
}

/// `column` of the first row as a number (`None` for NULL).
fn first_value(batch: &RecordBatch, column: &str) -> Result<Option<f64>, String> {
    let schema = batch.schema();
    let Ok(i) = schema.index_of(column) else {
        let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
        return Err(format!(
            "the query has no column '{column}' (it returns {})",
            names.join(", ")
        ));
    };
    let col = batch.column(i).slice(0, 1);
    let numeric = col.data_type().is_numeric() || matches!(col.data_type(), DataType::Boolean);
    if !numeric {
        return Err(format!(
            "column '{column}' is {}, not a number",
            col.data_type()
        ));
    }
    let f = cast(&col, &DataType::Float64).map_err(|e| e.to_string())?;
    Ok(f.as_primitive::<Float64Type>().iter().next().flatten())
}

/// One alert under evaluation.
#[derive(Debug)]
struct Entry {
    /// Shared with the runs in flight (no copy of the query per run).
    def: Arc<AlertDef>,
    /// Tells this definition's runs from those of an earlier one of the same name.
    generation: u64,
    status: AlertStatus,
    due: Instant,
    running: bool,
    /// This alert's webhook deliveries, in order (one task each alert, made at first use).
    webhook: Option<tokio::sync::mpsc::UnboundedSender<Vec<u8>>>,
}

/// What `<data_dir>/alerts.json` keeps of an alert, so a restart neither tells a firing
/// alert's news again nor misses its recovery: the state it was last in, for the definition
/// it was in it.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct Kept {
    /// The definition (`CREATE ALERT ...`), so a changed alert starts over.
    definition: String,
    state: String,
    last_value: Option<f64>,
    last_change_ms: Option<i64>,
    error: Option<String>,
}

/// The alerts' states and their scheduler.
#[derive(Debug)]
pub struct Alerts {
    entries: parking_lot::Mutex<BTreeMap<String, Entry>>,
    /// `<data_dir>/alerts.json` (none: states are not kept).
    path: Option<std::path::PathBuf>,
    /// States as last read or written, with the number of the snapshot written (held while
    /// writing; a snapshot older than the one on disk is not written over it).
    kept: Arc<parking_lot::Mutex<(u64, BTreeMap<String, Kept>)>>,
    /// Numbers the snapshots `keep` takes.
    snapshots: std::sync::atomic::AtomicU64,
    generations: std::sync::atomic::AtomicU64,
    /// Wakes the scheduler when alerts are added or changed.
    changed: tokio::sync::Notify,
    http: Option<reqwest::Client>,
    /// Whether this node evaluates alerts now (in a cluster: only the metadata group's
    /// leader does, so each alert fires once); unset: always.
    active: std::sync::OnceLock<Gate>,
}

/// Says whether this node evaluates alerts now.
struct Gate(Arc<dyn Fn() -> bool + Send + Sync>);

impl std::fmt::Debug for Gate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Gate")
    }
}

impl Default for Alerts {
    fn default() -> Self {
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(5))
            .build()
            .map_err(|e| tracing::error!(error = %e, "no HTTP client: alert webhooks will fail"))
            .ok();
        Self {
            entries: Default::default(),
            path: None,
            kept: Default::default(),
            snapshots: Default::default(),
            generations: Default::default(),
            changed: Default::default(),
            http,
            active: Default::default(),
        }
    }
}

fn now_ms() -> i64 {
    crate::now_micros() / 1000
}

impl Alerts {
    /// Alerts whose states are kept in `<dir>/alerts.json` across restarts (a damaged file is
    /// set aside: the states start over, nothing else is lost).
    pub fn open(dir: &std::path::Path) -> Self {
        let path = dir.join("alerts.json");
        let kept = crate::store::files::read_state(&path, "alert states").unwrap_or_default();
        Self {
            path: Some(path),
            kept: Arc::new(parking_lot::Mutex::new((0, kept))),
            ..Self::default()
        }
    }

    /// The state `def` was in before a restart, if it was kept for this very definition.
    fn restore(&self, def: &AlertDef, status: &mut AlertStatus) {
        let kept = self.kept.lock();
        let Some(k) = (kept.1)
            .get(&def.name)
            .filter(|k| k.definition == def.create_sql())
        else {
            return;
        };
        status.state = match k.state.as_str() {
            "ok" => AlertState::Ok,
            "firing" => AlertState::Firing,
            "error" => AlertState::Error,
            _ => return,
        };
        status.last_value = k.last_value;
        status.last_change_ms = k.last_change_ms;
        status.error = k.error.clone();
    }

    /// Writes every alert's state (after a change), off the async threads. Writes may run in
    /// any order; each carries its snapshot's number and an older one is dropped.
    fn keep(&self, entries: &BTreeMap<String, Entry>) {
        let Some(path) = self.path.clone() else {
            return;
        };
        let number = 1 + (self.snapshots).fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let now: BTreeMap<String, Kept> = (entries.iter())
            .filter(|(_, e)| e.status.state != AlertState::Pending)
            .map(|(name, e)| {
                let k = Kept {
                    definition: e.def.create_sql(),
                    state: e.status.state.as_str().into(),
                    last_value: e.status.last_value,
                    last_change_ms: e.status.last_change_ms,
                    error: e.status.error.clone(),
                };
                (name.clone(), k)
            })
            .collect();
        let kept = self.kept.clone();
        tokio::task::spawn_blocking(move || {
            let mut kept = kept.lock();
            if kept.0 > number {
                return;
            }
            let bytes = serde_json::to_vec_pretty(&now).unwrap_or_default();
            match crate::store::catalog::write_atomic(&path, &bytes) {
                Ok(()) => *kept = (number, now),
                Err(e) => tracing::warn!(error = %e, "keeping alert states failed"),
            }
        });
    }

    /// Makes the evaluated alerts those of `defs`: new ones start pending and run at once,
    /// changed ones start over, missing ones stop.
    pub fn sync<'a>(&self, defs: impl IntoIterator<Item = &'a AlertDef>) {
        let mut entries = self.entries.lock();
        let mut keep = BTreeMap::new();
        for def in defs {
            let entry = match entries.remove(&def.name) {
                Some(e) if *e.def == *def => e,
                _ => {
                    let mut status = AlertStatus::new(def);
                    self.restore(def, &mut status);
                    Entry {
                        def: Arc::new(def.clone()),
                        generation: (self.generations)
                            .fetch_add(1, std::sync::atomic::Ordering::Relaxed),
                        status,
                        due: Instant::now(),
                        running: false,
                        webhook: None,
                    }
                }
            };
            keep.insert(def.name.clone(), entry);
        }
        *entries = keep;
        drop(entries);
        self.changed.notify_one();
    }

    /// Every alert's state, by name.
    pub fn status(&self) -> Vec<AlertStatus> {
        (self.entries.lock().values())
            .map(|e| e.status.clone())
            .collect()
    }

    /// From now on alerts are evaluated only while `active` says so (due runs are skipped,
    /// not queued, meanwhile).
    pub fn set_active(&self, active: Arc<dyn Fn() -> bool + Send + Sync>) {
        let _ = self.active.set(Gate(active));
    }

    /// Runs due alerts against `db` until `cancel`, notifying `sink` of changes.
    pub async fn run(
        self: Arc<Self>,
        db: Arc<dyn QueryPort>,
        sink: Arc<dyn AlertSink>,
        cancel: CancellationToken,
    ) {
        let permits = Arc::new(tokio::sync::Semaphore::new(CONCURRENCY));
        let tasks = tokio_util::task::TaskTracker::new();
        loop {
            let now = Instant::now();
            let mut due = Vec::new();
            let mut next = now + Duration::from_secs(1);
            // Runs due within a couple of milliseconds start together: fewer wake-ups.
            let soon = now + Duration::from_millis(2);
            let active = self.active.get().is_none_or(|g| (g.0)());
            for e in self.entries.lock().values_mut() {
                if !active && !e.running && e.due <= soon {
                    // Another node evaluates it: look again one interval later.
                    e.due = now + Duration::from_millis(e.def.interval_ms);
                    next = next.min(e.due);
                } else if e.running {
                    // Its run sets the next time to this when it finishes. A run outlasting
                    // its interval is due at once when it ends; the next look (within a
                    // second) starts it.
                    let predicted = e.due + Duration::from_millis(e.def.interval_ms);
                    if predicted > now {
                        next = next.min(predicted);
                    }
                } else if e.due <= soon {
                    e.running = true;
                    due.push((e.def.clone(), e.generation, e.due));
                } else {
                    next = next.min(e.due);
                }
            }
            for (def, generation, scheduled) in due {
                let permit = tokio::select! {
                    p = permits.clone().acquire_owned() => p,
                    _ = cancel.cancelled() => break,
                };
                let Ok(permit) = permit else { break };
                let (this, db, sink) = (self.clone(), db.clone(), sink.clone());
                let cancel = cancel.clone();
                tasks.spawn(async move {
                    // A panic while evaluating is an error state, not an alert that never
                    // runs again.
                    let run = std::panic::AssertUnwindSafe(evaluate(db.as_ref(), &def));
                    let reading = tokio::select! {
                        r = futures::FutureExt::catch_unwind(run) => r.unwrap_or_else(|_| {
                            Err("internal error while evaluating (see the server log)".into())
                        }),
                        // Shutdown does not wait for a slow query.
                        _ = cancel.cancelled() => return,
                    };
                    this.finish(&def, generation, scheduled, reading, sink.as_ref());
                    drop(permit);
                });
            }
            tokio::select! {
                _ = cancel.cancelled() => break,
                _ = tokio::time::sleep_until(next) => {}
                _ = self.changed.notified() => {}
            }
        }
        tasks.close();
        tasks.wait().await;
    }

    /// Records an evaluation of `def` that was due at `scheduled`; on a change of state,
    /// logs it and notifies.
    fn finish(
        self: &Arc<Self>,
        def: &AlertDef,
        generation: u64,
        scheduled: Instant,
        reading: Result<Reading, String>,
        sink: &dyn AlertSink,
    ) {
        let now = Instant::now();
        let (notification, webhook) = {
            let mut entries = self.entries.lock();
            // Dropped or redefined meanwhile: this result belongs to nobody.
            let Some(e) = (entries.get_mut(&def.name)).filter(|e| e.generation == generation)
            else {
                return;
            };
            e.running = false;
            let interval = Duration::from_millis(def.interval_ms);
            // Keep the cadence; after a stall, skip the missed runs instead of bursting.
            e.due = (scheduled + interval).max(now);
            let before = e.status.state;
            let change = record(&mut e.status, reading, now_ms());
            let changed_state = e.status.state != before;
            let webhook = match (&change, &def.webhook) {
                (Some(_), Some(url)) => Some(self.webhook_queue(e, url)),
                _ => None,
            };
            if changed_state {
                self.keep(&entries);
            }
            (change, webhook)
        };
        let Some(payload) = notification else { return };
        if def.publish {
            sink.publish(format!("$alerts/{}", def.name), payload.clone());
        }
        if let Some(queue) = webhook {
            let _ = queue.send(payload);
        }
    }

    /// The queue of `e`'s webhook deliveries: one task POSTs them in order, so a receiver
    /// never sees an older change after a newer one. It ends when the alert is dropped or
    /// redefined (its sender goes with the entry).
    fn webhook_queue(
        self: &Arc<Self>,
        e: &mut Entry,
        url: &str,
    ) -> tokio::sync::mpsc::UnboundedSender<Vec<u8>> {
        e.webhook
            .get_or_insert_with(|| {
                let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Vec<u8>>();
                let this = Arc::downgrade(self);
                let (name, url, generation) = (e.def.name.clone(), url.to_string(), e.generation);
                tokio::spawn(async move {
                    while let Some(payload) = rx.recv().await {
                        let Some(alerts) = this.upgrade() else { break };
                        alerts.post(&name, generation, &url, payload).await;
                    }
                });
                tx
            })
            .clone()
    }

    /// POSTs a notification, trying a few times; the outcome shows as `webhook_error`.
    async fn post(&self, name: &str, generation: u64, url: &str, payload: Vec<u8>) {
        let mut failure = Some("no HTTP client".to_string());
        if let Some(http) = &self.http {
            for attempt in 0..WEBHOOK_ATTEMPTS {
                if attempt > 0 {
                    tokio::time::sleep(Duration::from_millis(500 << attempt)).await;
                }
                let sent = http
                    .post(url)
                    .header("content-type", "application/json")
                    .body(payload.clone())
                    .send()
                    .await;
                failure = match sent {
                    Ok(r) if r.status().is_success() => None,
                    Ok(r) => Some(format!("{url} answered {}", r.status())),
                    Err(e) => Some(format!("{url}: {e}")),
                };
                if failure.is_none() {
                    break;
                }
            }
        }
        if let Some(f) = &failure {
            tracing::warn!(alert = %name, error = %f, "alert webhook failed");
        }
        if let Some(e) = (self.entries.lock().get_mut(name)).filter(|e| e.generation == generation)
        {
            e.status.webhook_error = failure;
        }
    }

    /// `system.alerts`.
    pub fn system_table(&self) -> RecordBatch {
        let all = self.status();
        let s = |f: &dyn Fn(&AlertStatus) -> Option<String>| -> ArrayRef {
            Arc::new(all.iter().map(f).collect::<StringArray>())
        };
        let ts = |f: &dyn Fn(&AlertStatus) -> Option<i64>| -> ArrayRef {
            Arc::new(
                all.iter()
                    .map(|a| f(a).map(|ms| ms * 1000))
                    .collect::<TimestampMicrosecondArray>(),
            )
        };
        let u = |f: &dyn Fn(&AlertStatus) -> u64| -> ArrayRef {
            Arc::new(all.iter().map(f).collect::<UInt64Array>())
        };
        let time = DataType::Timestamp(TimeUnit::Microsecond, None);
        let columns: Vec<(&str, DataType, ArrayRef)> = vec![
            ("name", DataType::Utf8, s(&|a| Some(a.name.clone()))),
            (
                "state",
                DataType::Utf8,
                s(&|a| Some(a.state.as_str().into())),
            ),
            (
                "last_value",
                DataType::Float64,
                Arc::new(all.iter().map(|a| a.last_value).collect::<Float64Array>()),
            ),
            (
                "last_evaluation",
                time.clone(),
                ts(&|a| a.last_evaluation_ms),
            ),
            ("last_change", time, ts(&|a| a.last_change_ms)),
            ("error", DataType::Utf8, s(&|a| a.error.clone())),
            ("evaluations", DataType::UInt64, u(&|a| a.evaluations)),
            ("notifications", DataType::UInt64, u(&|a| a.notifications)),
            (
                "condition",
                DataType::Utf8,
                s(&|a| Some(a.condition.clone())),
            ),
            ("interval_ms", DataType::UInt64, u(&|a| a.interval_ms)),
            (
                "publish",
                DataType::Boolean,
                Arc::new(
                    all.iter()
                        .map(|a| Some(a.publish))
                        .collect::<BooleanArray>(),
                ),
            ),
            ("webhook", DataType::Utf8, s(&|a| a.webhook.clone())),
            (
                "webhook_error",
                DataType::Utf8,
                s(&|a| a.webhook_error.clone()),
            ),
            ("database", DataType::Utf8, s(&|a| Some(a.database.clone()))),
            ("query", DataType::Utf8, s(&|a| Some(a.query.clone()))),
            ("owner", DataType::Utf8, s(&|a| a.owner.clone())),
        ];
        let schema = Schema::new(
            (columns.iter())
                .map(|(n, t, _)| Field::new(*n, t.clone(), true))
                .collect::<Vec<_>>(),
        );
        RecordBatch::try_new(
            Arc::new(schema),
            columns.into_iter().map(|(_, _, a)| a).collect(),
        )
        .expect("system.alerts columns match their schema")
    }
}

/// Runs `def`'s query and reads its condition; every failure is a reason in words.
async fn evaluate(db: &dyn QueryPort, def: &AlertDef) -> Result<Reading, String> {
    let options = QueryOptions {
        database: Some(def.database.clone()),
        small: true,
        user: def.owner.clone(),
        ..Default::default()
    };
    let limit = MIN_TIMEOUT.max(Duration::from_millis(def.interval_ms));
    let run = async {
        let out = db
            .query(&def.query, &options)
            .await
            .map_err(|e| e.to_string())?;
        read(&def.condition, out.stream).await
    };
    match tokio::time::timeout(limit, run).await {
        Ok(r) => r,
        Err(_) => Err(format!("the query took longer than {} s", limit.as_secs())),
    }
}

/// Applies one evaluation to `status`; returns the notification (JSON) when the state
/// changed in a way worth telling: anything but pending -> ok.
pub(crate) fn record(
    status: &mut AlertStatus,
    reading: Result<Reading, String>,
    now_ms: i64,
) -> Option<Vec<u8>> {
    let previous = status.state;
    status.evaluations += 1;
    status.last_evaluation_ms = Some(now_ms);
    let state = match reading {
        Ok(r) => {
            status.last_value = r.value;
            status.error = None;
            if r.fires {
                AlertState::Firing
            } else {
                AlertState::Ok
            }
        }
        Err(reason) => {
            status.error = Some(reason);
            AlertState::Error
        }
    };
    if state == previous {
        return None;
    }
    status.state = state;
    status.last_change_ms = Some(now_ms);
    tracing::info!(alert = %status.name, from = previous.as_str(), to = state.as_str(), value = ?status.last_value, error = ?status.error, "alert state changed");
    if previous == AlertState::Pending && state == AlertState::Ok {
        return None;
    }
    status.notifications += 1;
    let time = chrono::DateTime::from_timestamp_millis(now_ms)
        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true));
    let body = serde_json::json!({
        "alert": status.name,
        "state": state,
        "previous": previous,
        "value": status.last_value,
        "condition": status.condition,
        "error": status.error,
        "time": time,
        "time_ms": now_ms,
        "query": status.query,
    });
    Some(body.to_string().into_bytes())
}

#[cfg(test)]
mod tests;
