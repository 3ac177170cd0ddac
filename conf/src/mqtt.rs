//! `[mqtt]`, the broker's listeners and limits, and the `[[topic]]` rules that write
//! publishes into tables.

use serde::{Deserialize, Serialize};
use std::net::SocketAddr;

/// The MQTT broker: listeners, limits, sessions.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MqttConfig {
    /// MQTT over TCP. Port 0 picks a free port (printed at start).
    pub listen: SocketAddr,
    /// MQTT over TLS; empty: no TLS listener. Needs `tls_cert` and `tls_key`.
    pub tls_listen: String,
    /// PEM certificate chain for the TLS listener.
    pub tls_cert: String,
    /// PEM private key for the TLS listener.
    pub tls_key: String,
    /// PEM CA certificates that client certificates are verified against (empty: clients
    /// are not asked for one). A client whose certificate does not verify is refused.
    pub tls_client_ca: String,
    /// With `tls_client_ca`: refuse TLS clients without a certificate (otherwise they log
    /// in with a user name and password).
    pub tls_require_client_cert: bool,
    /// With `tls_client_ca`: a client with a verified certificate logs in as the user its
    /// subject common name names, without a password (Mosquitto's
    /// `use_identity_as_username`); roles, grants and `[[acl]]` rules apply to that name.
    pub tls_cert_user: bool,
    /// Allow `listen` on a non-loopback address: MQTT over plain TCP sends passwords and
    /// data in clear (use `tls_listen`), so it must be asked for.
    pub allow_plaintext: bool,
    /// Largest MQTT packet accepted, in bytes (MQTT 5 clients are told in CONNACK).
    pub max_packet_size: u32,
    /// QoS 1/2 publishes a client may have unacknowledged towards the server (MQTT 5
    /// receive maximum); more is a protocol error (0x93).
    pub receive_maximum: u16,
    /// QoS 1/2 messages the server sends a client before waiting for its acks (lowered by a
    /// client's own receive maximum).
    pub max_inflight: u16,
    /// Concurrent connections; more get CONNACK 0x97 (quota exceeded).
    pub max_connections: usize,
    /// Threads that plain TCP connections run on, each serving its connections alone
    /// (read, store, acknowledge, route); 0: half the cores, at least one.
    pub threads: usize,
    /// Longest keep-alive a client may ask for, in seconds (0: no limit). An MQTT 5 client
    /// asking for more, or for none, gets this one as Server Keep Alive in CONNACK; a 3.1.1
    /// client, which cannot be told, is refused (CONNACK 0x02), as Mosquitto does.
    pub max_keep_alive: u16,
    /// Messages queued per session (online or offline) before publishers are slowed
    /// (online) or the session's oldest QoS 0 messages are dropped (offline).
    pub max_queued_messages: usize,
    /// Longest session expiry a client may ask for (MQTT 5); longer requests are capped.
    pub max_session_expiry: String,
    /// Topic aliases a client may use towards the server (MQTT 5).
    pub topic_alias_maximum: u16,
    /// Compatibility: several connections may share one client id, each with its own
    /// session, instead of the newer taking over the older (the OIDBS loader needs this).
    pub shared_client_ids: bool,
    /// Databases in which the first JSON message on `/db/table` creates the table (types
    /// inferred); later new fields add nullable columns.
    pub auto_create_databases: Vec<String>,
    /// The database Sparkplug B messages (`spBv1.0/...`) are stored in, a table per group,
    /// made with the database on the first message; empty: they are only routed.
    pub sparkplug_database: String,
    /// How Sparkplug metrics are stored: `long` (a row per metric) or `wide` (a row per
    /// message, a column per metric).
    pub sparkplug_layout: SparkplugLayout,
}

/// How Sparkplug B metrics become rows (`mqtt.sparkplug_layout`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SparkplugLayout {
    /// One table per group, a row per metric (name, alias, datatype, the value in the column
    /// of its type); the BIRTH rows are the announcements.
    Long,
    /// One table per group, a row per message, a column per metric named after it and typed
    /// by its datatype (new metrics add columns); BIRTH messages also go, as long rows, to
    /// `{group}_births`.
    Wide,
}

impl Default for MqttConfig {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 1883)),
            tls_listen: String::new(),
            tls_cert: String::new(),
            tls_key: String::new(),
            tls_client_ca: String::new(),
            tls_require_client_cert: false,
            tls_cert_user: false,
            allow_plaintext: false,
            max_packet_size: 1024 * 1024,
            receive_maximum: 1024,
            max_inflight: 1024,
            max_connections: 100_000,
            threads: 0,
            max_keep_alive: 0,
            max_queued_messages: 10_000,
            max_session_expiry: "7 days".into(),
            topic_alias_maximum: 64,
            shared_client_ids: false,
            auto_create_databases: Vec::new(),
            sparkplug_database: "sparkplug".into(),
            sparkplug_layout: SparkplugLayout::Long,
        }
    }
}

/// One `[[topic]]` rule: publishes matching `filter` are written into `table`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TopicRule {
    /// Topic filter; a level `+name` matches one level and writes it into column `name`,
    /// a plain `+` matches without capturing, a final `#` matches the rest.
    pub filter: String,
    /// Target table, `db.table` or `table` (database `default`).
    pub table: String,
    /// Payload format: `json`, `csv`, `line` (InfluxDB line protocol) or `auto` (JSON when
    /// it starts with `{` or `[`, else CSV).
    #[serde(default = "auto_format")]
    pub format: String,
    /// What a new subscription to the rule's topics gets as their retained messages:
    /// `messages` (the default: those published with the retain flag, kept by the broker)
    /// or `latest` (each key's newest row from the table's last-value cache, as JSON on the
    /// topic its named levels make; the filter's wildcards must all be named, and cover
    /// the cache's key columns).
    #[serde(default)]
    pub retain: RetainFrom,
}

/// Where a `[[topic]]` rule's retained messages come from ([`TopicRule::retain`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RetainFrom {
    /// Messages published with the retain flag, kept by the broker.
    #[default]
    Messages,
    /// The table's last-value cache: each key's newest row.
    Latest,
}

fn auto_format() -> String {
    "auto".into()
}
