//! A bridge's figures: the live counters its task keeps, and the snapshot that the admin
//! API, `/metrics` and `system.bridges` show.

use super::Running;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

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
    /// The cluster node it runs on (`None` on a single node, or while a cluster has no
    /// node running its bridges).
    pub node: Option<u64>,
}

impl BridgeStatus {
    /// A bridge that runs on another node of the cluster (`node`, when known): its figures
    /// are that node's to show.
    pub(crate) fn elsewhere(config: &sluice_conf::BridgeConfig, node: Option<u64>) -> Self {
        Self {
            name: config.name.clone(),
            address: config.address.clone(),
            version: config.version.clone(),
            connected: false,
            last_error: None,
            last_error_micros: None,
            messages_per_second: 0,
            received: 0,
            stored: 0,
            duplicates: 0,
            dead_letters: 0,
            forwarded: 0,
            reconnects: 0,
            node,
        }
    }
}

#[derive(Debug, Default)]
pub(super) struct Status {
    pub(super) connected: AtomicBool,
    pub(super) last_error: parking_lot::Mutex<Option<(i64, String)>>,
    pub(super) rate: AtomicU64,
    pub(super) received: AtomicU64,
    pub(super) stored: AtomicU64,
    pub(super) duplicates: AtomicU64,
    pub(super) dead_letters: AtomicU64,
    pub(super) forwarded: AtomicU64,
    pub(super) reconnects: AtomicU64,
}

impl Status {
    pub(super) fn error(&self, name: &str, text: String) {
        tracing::warn!(bridge = name, error = %text, "bridge");
        *self.last_error.lock() = Some((sluice_engine::now_micros(), text));
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
    // Where it runs, in a cluster (NULL on a single node).
    fields.push(Field::new("node", DataType::UInt64, true));
    columns.push(Arc::new(UInt64Array::from(
        all.iter().map(|s| s.node).collect::<Vec<_>>(),
    )));
    arrow::record_batch::RecordBatch::try_new(Arc::new(Schema::new(fields)), columns)
        .expect("columns match their fields")
}

pub(super) fn status_of(r: &Running, node: Option<u64>) -> BridgeStatus {
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
        node,
    }
}
