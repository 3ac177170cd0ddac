//! Bridges: Sluice as a client of other MQTT brokers, storing what they deliver without
//! losing a message.
//!
//! Each bridge runs one task ([`run`]) that polls its connection (`link`, rumqttc's 3.1.1 or
//! 5.0 client with a persistent session and manual acks). A received PUBLISH goes through the
//! same path as a direct one (`ingest`: topic -> table, a durable append), carrying its
//! [`Origin`] (bridge, packet id, topic, payload digest) into the log record; the messages
//! already received when one arrives (up to [`MAX_BATCH`]) are stored together, with one log
//! submission and one completion, on a task per batch ([`store_batch`]). Only once the
//! rows are durable is the message acknowledged to the remote broker, in the order received;
//! then it is routed to local subscribers. So a crash, a kill or a lost connection leaves
//! every unacknowledged message queued at the remote, which delivers it again (DUP set): one
//! whose origin matches the last message stored with that packet id is acknowledged without
//! being stored twice. A message that can never fit its table goes to the dead letters and
//! is acknowledged; one refused for a reason that passes (disk or buffers full) is retried
//! and holds back the acks behind it, so the remote keeps it.
//!
//! Optionally local topics (`forward`) are published to the remote through a local session
//! `$bridge/<name>`, kept like any persistent session.
//!
//! [`Bridges`] is the registry the admin API uses: list, add, remove, restart. Bridges
//! added or removed at run time are kept in `<data_dir>/broker/bridges.json`.

mod link;

use crate::Shared;
use crate::error::BridgeError;
use crate::ingest;
use crate::session::{Message, Session, SubOptions};
use futures::StreamExt;
use futures::stream::FuturesOrdered;
use link::{Client, Got, Received};
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::mqttbytes::v5::PubAckReason;
use sluice_conf::BridgeConfig;
use sluice_engine::Origin;
use std::collections::{BTreeMap, VecDeque};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Longest wait between reconnection attempts.
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// First wait after a failed connection.
const MIN_BACKOFF: Duration = Duration::from_millis(200);
/// Most messages stored with one log submission.
const MAX_BATCH: usize = 256;
/// Longest wait between attempts to store a message refused for a passing reason.
const MAX_RETRY: Duration = Duration::from_secs(5);

/// One bridge's figures, as `system.bridges`, `/metrics` and the admin API show them.
#[derive(Debug, Clone, serde::Serialize)]
pub struct BridgeStatus {
    /// The bridge's name.
    pub name: String,
    /// Remote `host:port`.
    pub address: String,
    /// MQTT version spoken.
    pub version: String,
    /// Whether the connection is up (CONNACK received, no error since).
    pub connected: bool,
    /// The last error, if any, and when (microseconds since the epoch).
    pub last_error: Option<String>,
    /// When the last error happened.
    pub last_error_micros: Option<i64>,
    /// Messages received per second, over the last second.
    pub messages_per_second: u64,
    /// Messages received (redeliveries included).
    pub received: u64,
    /// Messages whose rows were stored.
    pub stored: u64,
    /// Redeliveries recognised as already stored.
    pub duplicates: u64,
    /// Messages kept as dead letters.
    pub dead_letters: u64,
    /// Local messages published to the remote.
    pub forwarded: u64,
    /// Connections lost or refused.
    pub reconnects: u64,
}

#[derive(Debug, Default)]
struct Status {
    connected: AtomicBool,
    last_error: parking_lot::Mutex<Option<(i64, String)>>,
    rate: AtomicU64,
    received: AtomicU64,
    stored: AtomicU64,
    duplicates: AtomicU64,
    dead_letters: AtomicU64,
    forwarded: AtomicU64,
    reconnects: AtomicU64,
}

impl Status {
    fn error(&self, name: &str, text: String) {
        tracing::warn!(bridge = name, error = %text, "bridge");
        *self.last_error.lock() = Some((sluice_engine::now_micros(), text));
    }
}

struct Running {
    config: BridgeConfig,
    status: Arc<Status>,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

/// Bridges added or removed through the admin API, and what each last subscribed to.
#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
struct Saved {
    version: u32,
    added: Vec<BridgeConfig>,
    removed: Vec<String>,
    /// Bridge -> the filters (and QoS) its remote session is subscribed to.
    #[serde(default)]
    subscribed: BTreeMap<String, Vec<(String, u8)>>,
}

/// `<data_dir>/broker/bridges.json`.
#[derive(Debug)]
struct SavedFile {
    path: PathBuf,
    saved: parking_lot::Mutex<Saved>,
}

impl SavedFile {
    fn open(path: PathBuf) -> Self {
        let saved =
            sluice_engine::read_state(&path, "bridges saved by the admin API").unwrap_or_default();
        Self {
            path,
            saved: parking_lot::Mutex::new(saved),
        }
    }

    fn change(&self, f: impl FnOnce(&mut Saved)) -> Result<(), BridgeError> {
        let mut saved = self.saved.lock();
        f(&mut saved);
        saved.version = 1;
        let bytes = serde_json::to_vec_pretty(&*saved).map_err(|e| BridgeError::Save {
            path: self.path.clone(),
            source: e.into(),
        })?;
        sluice_engine::replace_file(&self.path, &bytes).map_err(|source| BridgeError::Save {
            path: self.path.clone(),
            source,
        })
    }
}

/// The running bridges.
pub struct Bridges {
    shared: Arc<Shared>,
    running: tokio::sync::Mutex<BTreeMap<String, Running>>,
    saved: Arc<SavedFile>,
    /// Ends every bridge (server shutdown).
    shutdown: CancellationToken,
}

impl std::fmt::Debug for Bridges {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bridges")
            .field("saved", &self.saved.path)
            .finish_non_exhaustive()
    }
}

impl Bridges {
    /// The registry; [`Bridges::start`] starts the configured and saved bridges.
    pub(crate) fn new(shared: Arc<Shared>, data_dir: &std::path::Path) -> Self {
        let path = data_dir.join("broker").join("bridges.json");
        Self {
            shutdown: shared.shutdown.clone(),
            shared,
            running: tokio::sync::Mutex::new(BTreeMap::new()),
            saved: Arc::new(SavedFile::open(path)),
        }
    }

    /// Starts the configured bridges (those the admin API removed excepted) and those it
    /// added.
    pub(crate) async fn start(&self, configured: &[BridgeConfig]) {
        let (added, removed) = {
            let s = self.saved.saved.lock();
            (s.added.clone(), s.removed.clone())
        };
        let mut all: BTreeMap<String, BridgeConfig> = configured
            .iter()
            .filter(|b| !removed.contains(&b.name))
            .map(|b| (b.name.clone(), b.clone()))
            .collect();
        for b in added {
            all.insert(b.name.clone(), b);
        }
        let mut running = self.running.lock().await;
        for (name, cfg) in all {
            let r = self.spawn(cfg);
            running.insert(name, r);
        }
    }

    fn spawn(&self, config: BridgeConfig) -> Running {
        let status = Arc::new(Status::default());
        let stop = self.shutdown.child_token();
        let task = tokio::spawn(run(
            self.shared.clone(),
            config.clone(),
            status.clone(),
            stop.clone(),
            self.saved.clone(),
        ));
        Running {
            config,
            status,
            stop,
            task,
        }
    }

    /// Every bridge's figures, by name.
    pub async fn status(&self) -> Vec<BridgeStatus> {
        let running = self.running.lock().await;
        running.values().map(status_of).collect()
    }

    /// The figures without waiting for a change in progress (for `system.bridges` and
    /// `/metrics`, which must not block).
    pub fn status_now(&self) -> Vec<BridgeStatus> {
        match self.running.try_lock() {
            Ok(running) => running.values().map(status_of).collect(),
            Err(_) => Vec::new(),
        }
    }

    /// Starts a new bridge and keeps it across restarts.
    pub async fn add(&self, config: BridgeConfig) -> Result<(), BridgeError> {
        config
            .validate("bridge")
            .map_err(|e| BridgeError::Invalid(e.to_string()))?;
        let mut running = self.running.lock().await;
        if running.contains_key(&config.name) {
            return Err(BridgeError::Exists(config.name));
        }
        self.saved.change(|s| {
            s.removed.retain(|n| *n != config.name);
            s.added.retain(|b| b.name != config.name);
            s.added.push(config.clone());
        })?;
        tracing::info!(bridge = %config.name, address = %config.address, "bridge added");
        running.insert(config.name.clone(), self.spawn(config));
        Ok(())
    }

    /// Stops a bridge (its stores in flight finish and are acknowledged), forgets what it
    /// stored, and keeps it removed across restarts.
    pub async fn remove(&self, name: &str) -> Result<(), BridgeError> {
        let mut running = self.running.lock().await;
        let r = running
            .remove(name)
            .ok_or_else(|| BridgeError::NotFound(name.into()))?;
        r.stop.cancel();
        let _ = r.task.await;
        self.saved.change(|s| {
            s.subscribed.remove(name);
            s.added.retain(|b| b.name != name);
            if !s.removed.iter().any(|n| n == name) {
                s.removed.push(name.to_string());
            }
        })?;
        if let Err(e) = self.shared.db.forget_origins(name) {
            tracing::error!(bridge = name, error = %e, "forgetting a removed bridge's packet ids failed");
        }
        let key = forward_session(name);
        if let Some(s) = self.shared.router.session(&key) {
            self.shared.router.discard(&s);
        }
        tracing::info!(bridge = name, "bridge removed");
        Ok(())
    }

    /// Stops a bridge and starts it again (a new connection, figures reset).
    pub async fn restart(&self, name: &str) -> Result<(), BridgeError> {
        let mut running = self.running.lock().await;
        let r = running
            .remove(name)
            .ok_or_else(|| BridgeError::NotFound(name.into()))?;
        r.stop.cancel();
        let _ = r.task.await;
        tracing::info!(bridge = name, "bridge restarted");
        running.insert(name.to_string(), self.spawn(r.config));
        Ok(())
    }

    /// Waits for every bridge to stop (after shutdown was signalled).
    pub(crate) async fn stopped(&self) {
        let mut running = self.running.lock().await;
        for (_, r) in std::mem::take(&mut *running) {
            r.stop.cancel();
            let _ = r.task.await;
        }
    }
}

/// One figure of a bridge's status.
type Figure = fn(&BridgeStatus) -> u64;

/// `/metrics` lines for every bridge, labelled by name.
pub(crate) fn render_metrics(all: &[BridgeStatus]) -> String {
    use std::fmt::Write;
    let figures: [(&str, &str, Figure); 8] = [
        ("connected", "1 while the bridge's connection is up", |s| {
            u64::from(s.connected)
        }),
        (
            "messages_per_second",
            "Messages received over the last second",
            |s| s.messages_per_second,
        ),
        (
            "received_total",
            "Messages received (redeliveries included)",
            |s| s.received,
        ),
        ("stored_total", "Messages whose rows were stored", |s| {
            s.stored
        }),
        (
            "duplicates_total",
            "Redeliveries recognised as stored and not stored again",
            |s| s.duplicates,
        ),
        ("dead_letters_total", "Messages kept as dead letters", |s| {
            s.dead_letters
        }),
        (
            "forwarded_total",
            "Local messages published to the remote broker",
            |s| s.forwarded,
        ),
        ("reconnects_total", "Connections lost or refused", |s| {
            s.reconnects
        }),
    ];
    let mut out = String::new();
    if all.is_empty() {
        return out;
    }
    for (suffix, help, get) in figures {
        let name = format!("sluice_bridge_{suffix}");
        let kind = if suffix.ends_with("_total") {
            "counter"
        } else {
            "gauge"
        };
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for s in all {
            let _ = writeln!(out, "{name}{{bridge=\"{}\"}} {}", s.name, get(s));
        }
    }
    out
}

/// `system.bridges`: one row per bridge.
pub(crate) fn system_table(all: &[BridgeStatus]) -> arrow::record_batch::RecordBatch {
    use arrow::array::{
        ArrayRef, BooleanArray, StringArray, TimestampMicrosecondArray, UInt64Array,
    };
    use arrow::datatypes::{DataType, Field, Schema, TimeUnit};
    let text = |f: fn(&BridgeStatus) -> String| -> ArrayRef {
        Arc::new(StringArray::from(all.iter().map(f).collect::<Vec<_>>()))
    };
    let number = |f: Figure| -> ArrayRef {
        Arc::new(UInt64Array::from(all.iter().map(f).collect::<Vec<_>>()))
    };
    let counters: [(&str, Figure); 7] = [
        ("messages_per_second", |s| s.messages_per_second),
        ("received", |s| s.received),
        ("stored", |s| s.stored),
        ("duplicates", |s| s.duplicates),
        ("dead_letters", |s| s.dead_letters),
        ("forwarded", |s| s.forwarded),
        ("reconnects", |s| s.reconnects),
    ];
    let mut fields = vec![
        Field::new("name", DataType::Utf8, false),
        Field::new("address", DataType::Utf8, false),
        Field::new("version", DataType::Utf8, false),
        Field::new("connected", DataType::Boolean, false),
        Field::new("last_error", DataType::Utf8, true),
        Field::new(
            "last_error_time",
            DataType::Timestamp(TimeUnit::Microsecond, None),
            true,
        ),
    ];
    let mut columns: Vec<ArrayRef> = vec![
        text(|s| s.name.clone()),
        text(|s| s.address.clone()),
        text(|s| s.version.clone()),
        Arc::new(BooleanArray::from(
            all.iter().map(|s| s.connected).collect::<Vec<_>>(),
        )),
        Arc::new(StringArray::from(
            all.iter().map(|s| s.last_error.clone()).collect::<Vec<_>>(),
        )),
        Arc::new(TimestampMicrosecondArray::from(
            all.iter().map(|s| s.last_error_micros).collect::<Vec<_>>(),
        )),
    ];
    for (name, get) in counters {
        fields.push(Field::new(name, DataType::UInt64, false));
        columns.push(number(get));
    }
    arrow::record_batch::RecordBatch::try_new(Arc::new(Schema::new(fields)), columns)
        .expect("columns match their fields")
}

fn status_of(r: &Running) -> BridgeStatus {
    let s = &r.status;
    let err = s.last_error.lock().clone();
    BridgeStatus {
        name: r.config.name.clone(),
        address: r.config.address.clone(),
        version: r.config.version.clone(),
        connected: s.connected.load(Ordering::Relaxed),
        last_error_micros: err.as_ref().map(|e| e.0),
        last_error: err.map(|e| e.1),
        messages_per_second: s.rate.load(Ordering::Relaxed),
        received: s.received.load(Ordering::Relaxed),
        stored: s.stored.load(Ordering::Relaxed),
        duplicates: s.duplicates.load(Ordering::Relaxed),
        dead_letters: s.dead_letters.load(Ordering::Relaxed),
        forwarded: s.forwarded.load(Ordering::Relaxed),
        reconnects: s.reconnects.load(Ordering::Relaxed),
    }
}

/// The local session that collects a bridge's outbound messages.
fn forward_session(name: &str) -> String {
    format!("$bridge/{name}")
}

/// The wait before reconnection attempt `attempt` (0 first): doubling from
/// [`MIN_BACKOFF`] up to [`MAX_BACKOFF`], each with up to 50% random jitter so that many
/// bridges (or many Sluice nodes) do not reconnect in step.
fn backoff(attempt: u32) -> Duration {
    let base = MIN_BACKOFF
        .saturating_mul(1u32 << attempt.min(16))
        .min(MAX_BACKOFF);
    let jitter = (u64::from(std::process::id()) ^ sluice_engine::now_micros() as u64)
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        % 1000;
    base.mul_f64(0.5 + jitter as f64 / 2000.0)
}

/// Applies `strip_prefix` then `add_prefix` to a remote topic.
fn local_topic(cfg: &BridgeConfig, remote: &str) -> String {
    let rest = remote
        .strip_prefix(cfg.strip_prefix.as_str())
        .unwrap_or(remote);
    format!("{}{rest}", cfg.add_prefix)
}

/// What one bridge's stores share.
struct Context {
    shared: Arc<Shared>,
    config: BridgeConfig,
    status: Arc<Status>,
    /// `bridge:<name>`: the messages' origin (dead letters' client id, ACL user).
    client_id: Arc<str>,
    stop: CancellationToken,
}

/// A received message once handled: acknowledge it, then route it (unless it was a
/// duplicate or a dead letter).
struct Handled {
    received: Received,
    route: Option<Arc<Message>>,
}

/// Stores received messages with one log submission (see the module docs); a message that
/// cannot go with the others (a redelivery, one too large, one refused or needing its table
/// created) is stored alone by [`handle`]. Returns those handled, in order (one the bridge
/// stopped before storing is left out: it is not acknowledged).
async fn store_batch(ctx: Arc<Context>, mut rs: Vec<Received>) -> Vec<Handled> {
    if rs.len() == 1 {
        let r = rs.pop().expect("one message");
        return handle(ctx, r).await.into_iter().collect();
    }
    let max = ctx.shared.config.max_packet_size as usize;
    let (mut together, mut at) = (Vec::new(), Vec::new());
    for (i, r) in rs.iter().enumerate() {
        if r.dup || r.payload.len() > max {
            continue;
        }
        let origin = (r.qos != QoS::AtMostOnce)
            .then(|| Origin::new(&ctx.config.name, r.pkid, &r.topic, &r.payload));
        together.push((Arc::new(local_message(&ctx, r)), origin));
        at.push(i);
    }
    let user = Some(&*ctx.client_id);
    let outcome = match ingest::try_store_batch(&ctx.shared, &together, user).await {
        Ok(o) => o,
        // The log failed: each is retried alone.
        Err(_) => vec![ingest::Batched::Alone; together.len()],
    };
    let mut done: Vec<Option<Arc<Message>>> = vec![None; rs.len()];
    for ((i, (message, _)), o) in at.into_iter().zip(together).zip(outcome) {
        if o == ingest::Batched::Stored {
            ctx.status.stored.fetch_add(1, Ordering::Relaxed);
        }
        if o != ingest::Batched::Alone {
            done[i] = Some(message);
        }
    }
    let mut out = Vec::with_capacity(rs.len());
    for (r, message) in rs.into_iter().zip(done) {
        match message {
            Some(m) => out.push(Handled {
                received: r,
                route: Some(m),
            }),
            None => out.extend(Box::pin(handle(ctx.clone(), r)).await),
        }
    }
    out
}

/// The local form of a message received from the remote.
fn local_message(ctx: &Context, r: &Received) -> Message {
    Message {
        topic: Arc::from(local_topic(&ctx.config, &r.topic)),
        payload: r.payload.clone(),
        qos: r.qos,
        retain: r.retain,
        properties: r.properties.clone(),
        expires: None,
        origin: ctx.client_id.clone(),
    }
}

/// Stores one received message (see the module docs); `None` when the bridge stopped
/// before it could be stored (it is then not acknowledged, and the remote keeps it).
async fn handle(ctx: Arc<Context>, r: Received) -> Option<Handled> {
    let st = &ctx.status;
    let origin = (r.qos != QoS::AtMostOnce)
        .then(|| Origin::new(&ctx.config.name, r.pkid, &r.topic, &r.payload));
    if r.dup && origin.as_ref().is_some_and(|o| ctx.shared.db.is_stored(o)) {
        st.duplicates.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(bridge = %ctx.config.name, pkid = r.pkid, topic = %r.topic, "redelivery of a stored message: acknowledged, not stored again");
        return Some(Handled {
            received: r,
            route: None,
        });
    }
    let message = Arc::new(local_message(&ctx, &r));
    let mut wait = Duration::from_millis(50);
    let max = ctx.shared.config.max_packet_size as usize;
    loop {
        let user = Some(&*ctx.client_id);
        let stored = if r.payload.len() > max {
            Err(ingest::Refusal {
                reason: PubAckReason::ImplementationSpecificError,
                text: format!(
                    "payload of {} bytes is larger than mqtt.max_packet_size ({max})",
                    r.payload.len()
                ),
                transient: false,
            })
        } else {
            ingest::try_store(&ctx.shared, &message, user, origin.as_ref()).await
        };
        match stored {
            Ok(stored) => {
                if stored {
                    st.stored.fetch_add(1, Ordering::Relaxed);
                }
                return Some(Handled {
                    received: r,
                    route: Some(message),
                });
            }
            Err(refusal) if refusal.transient => {
                st.error(
                    &ctx.config.name,
                    format!(
                        "storing a message from {}: {} (retrying; not acknowledged)",
                        r.topic, refusal.text
                    ),
                );
                tokio::select! {
                    _ = ctx.stop.cancelled() => return None,
                    _ = tokio::time::sleep(wait) => {}
                }
                wait = (wait * 2).min(MAX_RETRY);
            }
            Err(refusal) => {
                let kept =
                    ingest::dead_letter(&ctx.shared, &message, refusal.reason, &refusal.text).await;
                if let Err(e) = kept {
                    // Neither stored nor kept: not acknowledged, so the remote keeps it.
                    st.error(
                        &ctx.config.name,
                        format!(
                            "keeping a refused message from {} as a dead letter: {e} (retrying; not acknowledged)",
                            r.topic
                        ),
                    );
                    tokio::select! {
                        _ = ctx.stop.cancelled() => return None,
                        _ = tokio::time::sleep(wait) => {}
                    }
                    wait = (wait * 2).min(MAX_RETRY);
                    continue;
                }
                st.dead_letters.fetch_add(1, Ordering::Relaxed);
                return Some(Handled {
                    received: r,
                    route: None,
                });
            }
        }
    }
}

/// Queues the acks of handled messages, in order, routing each locally once its ack is
/// queued; stops at the first that does not fit rumqttc's request queue (the event loop must
/// be polled to make room).
async fn send_acks(ctx: &Context, client: &Client, unacked: &mut VecDeque<Handled>) {
    while let Some(h) = unacked.front() {
        if h.received.qos != QoS::AtMostOnce && client.ack(&h.received).is_err() {
            return;
        }
        if let Some(h) = unacked.pop_front()
            && let Some(m) = h.route
        {
            ingest::route(&ctx.shared, &m).await;
        }
    }
}

/// Finishes every store in flight and queues what acks fit (the connection is gone or the
/// bridge is stopping: an ack that does not fit is not sent, so the remote delivers that
/// message again and it is recognised as stored then). Each is routed locally.
async fn settle<F>(
    ctx: &Context,
    client: &Client,
    pending: &mut FuturesOrdered<F>,
    unacked: &mut VecDeque<Handled>,
) where
    F: std::future::Future<Output = Vec<Handled>>,
{
    while let Some(done) = pending.next().await {
        unacked.extend(done);
    }
    for h in unacked.drain(..) {
        if h.received.qos != QoS::AtMostOnce {
            let _ = client.ack(&h.received);
        }
        if let Some(m) = h.route {
            ingest::route(&ctx.shared, &m).await;
        }
    }
}

/// One bridge, until `stop`.
async fn run(
    shared: Arc<Shared>,
    config: BridgeConfig,
    status: Arc<Status>,
    stop: CancellationToken,
    saved: Arc<SavedFile>,
) {
    let name = config.name.clone();
    let (client, events) = match link::connect(&config, shared.config.max_packet_size) {
        Ok(l) => l,
        Err(e) => {
            status.error(&name, e);
            return;
        }
    };
    let mut events = Driver::start(events);
    let forward = Forward::new(&shared, &config);
    let ctx = Arc::new(Context {
        client_id: Arc::from(format!("bridge:{name}")),
        shared,
        config,
        status: status.clone(),
        stop: stop.clone(),
    });
    let filters: Vec<(String, u8)> = (ctx.config.topics.iter())
        .map(|t| (t.filter.clone(), t.qos))
        .collect();
    let window = usize::from(ctx.config.window);
    let mut pending = FuturesOrdered::new();
    // Handled in order, acks not yet queued.
    let mut unacked = VecDeque::new();
    let mut attempt = 0u32;
    let mut subscribed = false;
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let mut last_received = 0u64;
    tracing::info!(bridge = %name, address = %ctx.config.address, "bridge starting");
    loop {
        send_acks(&ctx, &client, &mut unacked).await;
        tokio::select! {
            biased;
            _ = stop.cancelled() => break,
            // Acks waiting for room in the request queue hold back further completions, and
            // the event loop (which makes that room) is polled even with a full window.
            Some(done) = pending.next(), if unacked.is_empty() && !pending.is_empty() => {
                unacked.extend(done);
            }
            got = events.next(), if !unacked.is_empty() || pending.len() < window => match got {
                Ok(Got::Connected { session_present }) => {
                    status.connected.store(true, Ordering::Relaxed);
                    attempt = 0;
                    tracing::info!(bridge = %name, session_present, "bridge connected");
                    // A remote that kept the session keeps its subscriptions too; subscribing
                    // again would make a 3.1.1 broker resend its retained messages, which
                    // would be stored twice.
                    let known = saved.saved.lock().subscribed.get(&name) == Some(&filters);
                    if !session_present || !(subscribed || known) {
                        if let Err(e) = client.subscribe(&filters) {
                            status.error(&name, format!("subscribing: {e}"));
                        }
                        let f = filters.clone();
                        if let Err(e) = saved.change(|s| { s.subscribed.insert(name.clone(), f); }) {
                            status.error(&name, e.to_string());
                        }
                    }
                    subscribed = true;
                    if let Some(f) = &forward {
                        f.send(&ctx, &client);
                    }
                }
                Ok(Got::Message(r)) => {
                    // Every message already received goes with it: one log submission for
                    // them all.
                    let mut batch = vec![*r];
                    while batch.len() < MAX_BATCH {
                        match events.try_next() {
                            Some(Ok(Got::Message(r))) => batch.push(*r),
                            Some(other) => {
                                events.defer(other);
                                break;
                            }
                            None => break,
                        }
                    }
                    status.received.fetch_add(batch.len() as u64, Ordering::Relaxed);
                    // Each batch is stored on its own task: batches proceed on both cores,
                    // and a window of stores is not re-polled as one task's futures.
                    let store = tokio::spawn(store_batch(ctx.clone(), batch));
                    pending.push_back(async move {
                        store.await.unwrap_or_else(|e| {
                            tracing::error!(error = %e, "a bridged batch's store failed; not acknowledged");
                            Vec::new()
                        })
                    });
                }
                Ok(Got::Other) => {}
                Err(e) => {
                    status.connected.store(false, Ordering::Relaxed);
                    status.reconnects.fetch_add(1, Ordering::Relaxed);
                    status.error(&name, format!("connection to {}: {e}", ctx.config.address));
                    // Stores in flight finish first, so a redelivery after the reconnection
                    // is checked against them.
                    settle(&ctx, &client, &mut pending, &mut unacked).await;
                    tokio::select! {
                        _ = stop.cancelled() => break,
                        _ = tokio::time::sleep(backoff(attempt)) => {}
                    }
                    attempt = attempt.saturating_add(1);
                    events.reconnect();
                }
            },
            _ = queued(&forward) => {
                if status.connected.load(Ordering::Relaxed) && let Some(f) = &forward {
                    f.send(&ctx, &client);
                }
            }
            _ = tick.tick() => {
                let now = status.received.load(Ordering::Relaxed);
                status.rate.store(now - last_received, Ordering::Relaxed);
                last_received = now;
                if status.connected.load(Ordering::Relaxed) && let Some(f) = &forward {
                    f.send(&ctx, &client);
                }
            }
        }
    }
    // Stopping: what is being stored finishes and is acknowledged; then a polite DISCONNECT
    // (the remote keeps the session and whatever arrives meanwhile).
    settle(&ctx, &client, &mut pending, &mut unacked).await;
    if status.connected.load(Ordering::Relaxed) {
        client.disconnect();
        let _ = tokio::time::timeout(Duration::from_secs(2), async {
            while events.next().await.is_ok() {}
        })
        .await;
    }
    events.task.abort();
    if let Some(f) = &forward {
        f.session.detach(f.conn);
    }
    status.connected.store(false, Ordering::Relaxed);
    tracing::info!(bridge = %name, "bridge stopped");
}

/// Polls the connection on its own task, so that polling is never cancelled (a connection
/// attempt cut short would be lost, with what its CONNACK said) and acks are sent while the
/// bridge waits for stores.
struct Driver {
    rx: tokio::sync::mpsc::Receiver<Result<Got, String>>,
    /// An event taken early (while gathering a batch), returned first.
    deferred: Option<Result<Got, String>>,
    resume: tokio::sync::mpsc::Sender<()>,
    task: tokio::task::JoinHandle<()>,
}

impl Driver {
    fn start(mut events: link::Events) -> Self {
        let (tx, rx) = tokio::sync::mpsc::channel(64);
        let (resume, mut resumed) = tokio::sync::mpsc::channel(1);
        let task = tokio::spawn(async move {
            loop {
                let got = events.poll().await;
                let failed = got.is_err();
                if tx.send(got).await.is_err() {
                    return;
                }
                // After an error the next poll reconnects: only once the bridge says so.
                if failed && resumed.recv().await.is_none() {
                    return;
                }
            }
        });
        Self {
            rx,
            deferred: None,
            resume,
            task,
        }
    }

    /// The next event (an error: the connection is down).
    async fn next(&mut self) -> Result<Got, String> {
        if let Some(e) = self.deferred.take() {
            return e;
        }
        self.rx
            .recv()
            .await
            .unwrap_or_else(|| Err("connection task ended".into()))
    }

    /// The next event if one is already waiting.
    fn try_next(&mut self) -> Option<Result<Got, String>> {
        match self.deferred.take() {
            Some(e) => Some(e),
            None => self.rx.try_recv().ok(),
        }
    }

    /// Keeps `event` to be returned by the next call.
    fn defer(&mut self, event: Result<Got, String>) {
        self.deferred = Some(event);
    }

    /// Lets the connection task reconnect after an error.
    fn reconnect(&self) {
        let _ = self.resume.try_send(());
    }
}

/// Completes when the forward session has something queued (never without one).
async fn queued(forward: &Option<Forward>) {
    match forward {
        Some(f) => f.session.wake_writer.notified().await,
        None => std::future::pending().await,
    }
}

/// The local session whose messages a bridge publishes to the remote.
struct Forward {
    session: Arc<Session>,
    conn: u64,
}

impl Forward {
    fn new(shared: &Arc<Shared>, cfg: &BridgeConfig) -> Option<Self> {
        if cfg.forward.is_empty() {
            return None;
        }
        let conn = shared.next_conn.fetch_add(1, Ordering::Relaxed);
        let key = forward_session(&cfg.name);
        // A week offline is plenty: a bridge that is gone that long was removed.
        let (session, _, _) =
            shared
                .router
                .attach(&key, false, 7 * 24 * 3600, conn, CancellationToken::new());
        for filter in &cfg.forward {
            let options = SubOptions {
                qos: QoS::AtLeastOnce,
                no_local: false,
                retain_as_published: true,
                id: None,
            };
            shared.router.subscribe(&session, filter, options);
        }
        Some(Self { session, conn })
    }

    /// Publishes what is queued, except messages that came from this bridge (no loops);
    /// stops when rumqttc's queue is full (the rest waits for the next call).
    fn send(&self, ctx: &Context, client: &Client) {
        loop {
            let batch = self.session.take(64);
            if batch.is_empty() {
                return;
            }
            let mut rest = batch.into_iter();
            while let Some(d) = rest.next() {
                if d.message.origin == ctx.client_id {
                    continue;
                }
                if !client.publish(&d.message.topic, d.message.payload.clone(), d.retain) {
                    // Back to the front of the queue, in order.
                    let mut st = self.session.state.lock();
                    for d in std::iter::once(d).chain(rest).rev() {
                        st.queue.push_front(d);
                    }
                    return;
                }
                ctx.status.forwarded.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_to_its_cap_with_jitter() {
        for attempt in 0..40 {
            let b = backoff(attempt);
            let base = MIN_BACKOFF
                .saturating_mul(1u32 << attempt.min(16))
                .min(MAX_BACKOFF);
            assert!(b >= base / 2 && b <= base, "attempt {attempt}: {b:?}");
        }
        assert!(backoff(30) <= MAX_BACKOFF);
    }

    #[test]
    fn prefixes_are_stripped_then_added() {
        let mut cfg: BridgeConfig = serde_json::from_str(
            r##"{"name": "b", "address": "h:1", "topics": [{"filter": "#"}]}"##,
        )
        .unwrap();
        assert_eq!(local_topic(&cfg, "site/a/t"), "site/a/t");
        cfg.strip_prefix = "site/".into();
        cfg.add_prefix = "plant/".into();
        assert_eq!(local_topic(&cfg, "site/a/t"), "plant/a/t");
        assert_eq!(local_topic(&cfg, "other/t"), "plant/other/t");
    }
}
