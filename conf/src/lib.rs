//! Sluice configuration.
//!
//! [`Config`] is the whole configuration, with `Default` giving the embedded defaults that
//! `conf/sluice.toml` documents key by key. It is built in three layers, each overriding the
//! one before: the TOML file ([`Config::from_toml`]), the `SLUICE_*` environment
//! ([`Config::apply_env`]), then command-line flags (set by the binary on the struct).
//! [`Config::validate`] runs last. Durations are written as `"10m"`, `"30 days"` and parsed by
//! [`parse_duration`]; sizes are plain byte counts.

mod duration;
mod env;
mod error;

pub use duration::parse_duration;

/// Whether `addr` is `host:port` (a non-empty host, a port number): the form of every
/// network address in the config (peers, bridges) and the admin API.
pub fn is_host_port(addr: &str) -> bool {
    addr.rsplit_once(':')
        .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok())
}
pub use error::{Error, Result};

use serde::{Deserialize, Serialize};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// The whole server configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Directory holding the WAL, the catalog and (by default) the Parquet files.
    pub data_dir: PathBuf,
    /// Log filter in `RUST_LOG` syntax; `RUST_LOG` itself wins when set.
    pub log: String,
    /// The HTTP API.
    pub http: HttpConfig,
    /// The write-ahead log.
    pub wal: WalConfig,
    /// In-memory buffers and when they become Parquet.
    pub buffer: BufferConfig,
    /// Where Parquet files and manifests live.
    pub storage: StorageConfig,
    /// Merging small files.
    pub compaction: CompactionConfig,
    /// Dropping partitions past their table's TTL.
    pub retention: RetentionConfig,
    /// Query execution.
    pub query: QueryConfig,
    /// The MQTT broker.
    pub mqtt: MqttConfig,
    /// Topic rules: topics (with named wildcards) written into tables.
    pub topic: Vec<TopicRule>,
    /// MQTT users; with none, every listener must be on loopback.
    pub user: Vec<UserConfig>,
    /// Access rules, first match wins; what no rule matches is allowed.
    pub acl: Vec<AclRule>,
    /// Other MQTT brokers whose messages are stored here (and, optionally, that local
    /// topics are forwarded to).
    pub bridge: Vec<BridgeConfig>,
    /// Several nodes: absent, this is a single node.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cluster: Option<ClusterConfig>,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            data_dir: PathBuf::from("./data"),
            log: "info".into(),
            http: HttpConfig::default(),
            wal: WalConfig::default(),
            buffer: BufferConfig::default(),
            storage: StorageConfig::default(),
            compaction: CompactionConfig::default(),
            retention: RetentionConfig::default(),
            query: QueryConfig::default(),
            mqtt: MqttConfig::default(),
            topic: Vec::new(),
            user: Vec::new(),
            acl: Vec::new(),
            bridge: Vec::new(),
            cluster: None,
        }
    }
}

/// This node's place in a cluster: every node runs `sluice serve` with its own `[cluster]`
/// (same `peers`, `shards` and `replication_factor`, its own `node_id` and `listen`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterConfig {
    /// This node's id (positive, unique in the cluster).
    pub node_id: u64,
    /// Node-to-node address (raft and forwarded writes), e.g. `10.0.0.1:7000`.
    pub listen: SocketAddr,
    /// Every node of the cluster, this one included: node id (a TOML key, so written as a
    /// string: `"2" = "10.0.0.2:7000"`) to its node-to-node address.
    pub peers: std::collections::BTreeMap<String, String>,
    /// Object store every node shares for Parquet files: `file:///abs/path` on one machine,
    /// `s3://bucket/prefix` (with the `[storage]` `s3_*` keys) for real.
    pub shared_store: String,
    /// Replicas of each shard (capped by the node count).
    #[serde(default = "three")]
    pub replication_factor: usize,
    /// Data shards; 0: twice the node count.
    #[serde(default)]
    pub shards: u32,
    /// This node joins a running cluster (`POST /v1/cluster/nodes` on a member adds it):
    /// it forms no group itself and takes the cluster's shards and replication factor from
    /// the metadata group. `peers` must name at least one member.
    #[serde(default)]
    pub join: bool,
}

fn three() -> usize {
    3
}

impl ClusterConfig {
    /// Every node (this one included), by id, with its node-to-node address; valid after
    /// [`Config::validate`].
    pub fn nodes(&self) -> std::collections::BTreeMap<u64, String> {
        let mut out: std::collections::BTreeMap<u64, String> = (self.peers.iter())
            .filter_map(|(id, addr)| Some((id.parse().ok()?, addr.clone())))
            .collect();
        out.entry(self.node_id)
            .or_insert_with(|| self.listen.to_string());
        out
    }

    /// The number of data shards.
    pub fn shard_count(&self) -> u32 {
        match self.shards {
            0 => 2 * self.nodes().len() as u32,
            n => n,
        }
    }

    fn validate(&self) -> Result<()> {
        let bad = |key: &str, reason: String| Error::Invalid {
            key: format!("cluster.{key}"),
            reason,
        };
        if self.node_id == 0 {
            return Err(bad("node_id", "must be greater than 0".into()));
        }
        for (id, addr) in &self.peers {
            match id.parse::<u64>() {
                Ok(n) if n > 0 => {}
                _ => {
                    return Err(bad(
                        "peers",
                        format!("{id:?}: a node id is a positive integer"),
                    ));
                }
            }
            if !is_host_port(addr) {
                return Err(bad(
                    &format!("peers.{id}"),
                    format!("{addr:?}: expected host:port"),
                ));
            }
        }
        if let Some(own) = self.peers.get(&self.node_id.to_string())
            && own.parse::<SocketAddr>().ok() != Some(self.listen)
        {
            return Err(bad(
                "peers",
                format!(
                    "node {} is listed at {own} but listens on {}",
                    self.node_id, self.listen
                ),
            ));
        }
        if self.join && !self.nodes().keys().any(|id| *id != self.node_id) {
            return Err(bad(
                "peers",
                "a joining node must name at least one member of the cluster".into(),
            ));
        }
        if self.replication_factor == 0 {
            return Err(bad("replication_factor", "must be greater than 0".into()));
        }
        let url = self.shared_store.as_str();
        if !(url.starts_with("file:///") || url.starts_with("s3://")) {
            return Err(bad(
                "shared_store",
                format!("{url:?}: expected file:///absolute/path or s3://bucket/prefix"),
            ));
        }
        Ok(())
    }
}

/// HTTP listener and request limits.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HttpConfig {
    /// Address the HTTP API listens on. Port 0 picks a free port (printed at start).
    pub listen: SocketAddr,
    /// Largest request body accepted, in bytes; larger bodies get 413.
    pub max_body_bytes: usize,
    /// Write requests allowed to wait for the WAL at once; more get 503.
    pub max_pending_writes: usize,
    /// Microseconds a connection keeps reading its socket, without parking, for the next
    /// request of a lone client that sends back to back (0: never). Saves the wake-up of an
    /// idle CPU per request; see `sluice_web`'s `spin` module for when it applies.
    pub busy_poll_us: u64,
}

/// The longest `http.busy_poll_us`: a spin is meant to bridge a client's turnaround.
const MAX_BUSY_POLL_US: u64 = 10_000;

impl Default for HttpConfig {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            max_body_bytes: 16 * 1024 * 1024,
            max_pending_writes: 4096,
            busy_poll_us: 200,
        }
    }
}

/// How appends reach the disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Durability {
    /// Acknowledge after `fdatasync`: nothing acknowledged is lost by a crash or power cut.
    Fsync,
    /// Acknowledge after `write(2)` only, without fdatasync. For measuring; a power cut
    /// loses acknowledged rows (a process crash does not).
    None,
}

/// Write-ahead log settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WalConfig {
    /// `"fsync"` (default) or `"none"` (no fdatasync; for measuring only).
    pub durability: Durability,
    /// A WAL segment is closed and a new one started past this many bytes.
    pub segment_bytes: u64,
    /// Most bytes one group commit writes before syncing; appends beyond wait for the next.
    pub max_group_bytes: usize,
}

impl Default for WalConfig {
    fn default() -> Self {
        Self {
            durability: Durability::Fsync,
            segment_bytes: 64 * 1024 * 1024,
            max_group_bytes: 8 * 1024 * 1024,
        }
    }
}

/// When in-memory buffers are written out as Parquet.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BufferConfig {
    /// A partition's buffer is persisted once it holds this many rows.
    pub partition_max_rows: usize,
    /// All buffers together: past this many bytes the largest are persisted.
    pub total_max_bytes: usize,
    /// A buffer is persisted once its oldest row has waited this long.
    pub max_age: String,
    /// How often the flusher looks at the buffers.
    pub check_interval: String,
}

impl Default for BufferConfig {
    fn default() -> Self {
        Self {
            partition_max_rows: 1_000_000,
            total_max_bytes: 512 * 1024 * 1024,
            max_age: "10m".into(),
            check_interval: "1s".into(),
        }
    }
}

/// Object storage for Parquet files and manifests.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StorageConfig {
    /// Empty: the local directory `<data_dir>/objects`. Otherwise `file:///abs/path` or
    /// `s3://bucket/prefix` (an S3-compatible store, configured by the `s3_*` keys).
    pub url: String,
    /// S3 endpoint, e.g. `http://127.0.0.1:9000` for MinIO; empty for AWS.
    pub s3_endpoint: String,
    /// S3 region.
    pub s3_region: String,
    /// S3 access key id (the `AWS_ACCESS_KEY_ID` environment variable also works).
    pub s3_access_key_id: String,
    /// S3 secret access key (the `AWS_SECRET_ACCESS_KEY` environment variable also works).
    pub s3_secret_access_key: String,
    /// Allow plain-HTTP endpoints.
    pub s3_allow_http: bool,
    /// Rows per Parquet row group.
    pub row_group_rows: usize,
}

impl Default for StorageConfig {
    fn default() -> Self {
        Self {
            url: String::new(),
            s3_endpoint: String::new(),
            s3_region: "us-east-1".into(),
            s3_access_key_id: String::new(),
            s3_secret_access_key: String::new(),
            s3_allow_http: false,
            row_group_rows: 128 * 1024,
        }
    }
}

/// Merging a partition's small files into large ones.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CompactionConfig {
    /// Off: files are never merged.
    pub enabled: bool,
    /// A partition is compacted once it has this many files smaller than `target_file_bytes`.
    pub min_files: usize,
    /// Files at least this large are left alone.
    pub target_file_bytes: u64,
    /// How often the compactor looks for work.
    pub interval: String,
}

impl Default for CompactionConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            min_files: 4,
            target_file_bytes: 128 * 1024 * 1024,
            interval: "30s".into(),
        }
    }
}

/// Dropping expired partitions.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RetentionConfig {
    /// How often partitions are checked against their table's TTL.
    pub interval: String,
}

impl Default for RetentionConfig {
    fn default() -> Self {
        Self {
            interval: "1m".into(),
        }
    }
}

/// Query execution.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct QueryConfig {
    /// Memory for decoded Parquet files (the hot cache): files written by flushes and
    /// compactions stay here, least recently used first out, so queries on recent partitions
    /// never read Parquet. 0 turns the cache off.
    pub hot_cache_bytes: usize,
}

impl Default for QueryConfig {
    fn default() -> Self {
        Self {
            hot_cache_bytes: 2 * 1024 * 1024 * 1024,
        }
    }
}

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
}

impl Default for MqttConfig {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 1883)),
            tls_listen: String::new(),
            tls_cert: String::new(),
            tls_key: String::new(),
            max_packet_size: 1024 * 1024,
            receive_maximum: 1024,
            max_inflight: 1024,
            max_connections: 100_000,
            max_queued_messages: 10_000,
            max_session_expiry: "7 days".into(),
            topic_alias_maximum: 64,
            shared_client_ids: false,
            auto_create_databases: Vec::new(),
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
}

/// One `[[user]]`: a name and an argon2 password hash (PHC string, from
/// `sluice hash-password`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UserConfig {
    /// User name (the MQTT CONNECT user name).
    pub name: String,
    /// `$argon2id$v=19$...`; never the password itself.
    pub password_hash: String,
}

/// One `[[acl]]` rule.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AclRule {
    /// A user name, `*` for everyone, or `anonymous` for connections without a user.
    pub user: String,
    /// `publish` or `subscribe` (topic filters), `write` (tables), or `all`.
    pub action: String,
    /// For publish/subscribe a topic filter (`+`/`#` allowed); for write `db.table`, `db.*`
    /// or `*`.
    pub filter: String,
    /// Allow or refuse what the rule matches.
    pub allow: bool,
}

/// One `[[bridge]]`: a remote MQTT broker Sluice subscribes to as a client with a persistent
/// session, acknowledging each message only once it is durable here.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BridgeConfig {
    /// Unique name (shown in `system.bridges`, used by the admin API and as the dead letters'
    /// client id `bridge:<name>`).
    pub name: String,
    /// `host:port` of the remote broker.
    pub address: String,
    /// Client id at the remote broker; empty means `sluice-<name>`. The remote keeps the
    /// session (and the messages queued for it) under this id, so keep it stable.
    #[serde(default)]
    pub client_id: String,
    /// User name at the remote broker (empty: none).
    #[serde(default)]
    pub username: String,
    /// Password at the remote broker.
    #[serde(default)]
    pub password: String,
    /// MQTT version: `3.1.1` or `5`.
    #[serde(default = "mqtt_311")]
    pub version: String,
    /// Connect with TLS.
    #[serde(default)]
    pub tls: bool,
    /// PEM file of the CA certificates that sign the remote's certificate (empty: the
    /// system's roots).
    #[serde(default)]
    pub tls_ca: String,
    /// Keep-alive interval.
    #[serde(default = "keep_alive_30s")]
    pub keep_alive: String,
    /// How long the remote keeps the session while Sluice is away (MQTT 5; a 3.1.1 session
    /// without clean session lasts until the remote drops it).
    #[serde(default = "one_week")]
    pub session_expiry: String,
    /// Remote topic filters to subscribe to.
    pub topics: Vec<BridgeTopic>,
    /// Removed from the front of a remote topic before it is mapped to a table.
    #[serde(default)]
    pub strip_prefix: String,
    /// Added to the front of a remote topic (after `strip_prefix`) before it is mapped.
    #[serde(default)]
    pub add_prefix: String,
    /// Local topic filters whose messages are published to the remote broker (e.g.
    /// `$alerts/#`), at QoS 1, topic unchanged.
    #[serde(default)]
    pub forward: Vec<String>,
    /// Messages being stored at once (each still acknowledged in order).
    #[serde(default = "bridge_window")]
    pub window: u16,
}

/// A remote filter and the QoS it is subscribed with.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BridgeTopic {
    /// Topic filter at the remote broker.
    pub filter: String,
    /// 1 or 2 (0 would lose messages across a disconnect, and is refused).
    #[serde(default = "qos_1")]
    pub qos: u8,
}

impl BridgeConfig {
    /// Checks one bridge; `key` names it in errors (`bridge[0]`).
    pub fn validate(&self, key: &str) -> Result<()> {
        let bad = |field: &str, reason: String| Error::Invalid {
            key: format!("{key}.{field}"),
            reason,
        };
        if self.name.is_empty()
            || !self
                .name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        {
            return Err(bad(
                "name",
                format!("{:?}: use letters, digits, - and _", self.name),
            ));
        }
        if !is_host_port(&self.address) {
            return Err(bad(
                "address",
                format!("{:?}: expected host:port", self.address),
            ));
        }
        if !matches!(self.version.as_str(), "3.1.1" | "5" | "5.0") {
            return Err(bad(
                "version",
                format!("{:?}: expected 3.1.1 or 5", self.version),
            ));
        }
        for (field, value) in [
            ("keep_alive", &self.keep_alive),
            ("session_expiry", &self.session_expiry),
        ] {
            parse_duration(value).map_err(|reason| bad(field, reason))?;
        }
        if self.topics.is_empty() {
            return Err(bad("topics", "needs at least one filter".into()));
        }
        for (i, t) in self.topics.iter().enumerate() {
            if t.filter.is_empty() {
                return Err(bad(&format!("topics[{i}].filter"), "empty".into()));
            }
            if !(1..=2).contains(&t.qos) {
                return Err(bad(
                    &format!("topics[{i}].qos"),
                    format!("{}: expected 1 or 2 (QoS 0 can lose messages)", t.qos),
                ));
            }
        }
        if self.window == 0 {
            return Err(bad("window", "must be greater than 0".into()));
        }
        Ok(())
    }

    /// The client id used at the remote broker.
    pub fn remote_client_id(&self) -> String {
        match self.client_id.is_empty() {
            true => format!("sluice-{}", self.name),
            false => self.client_id.clone(),
        }
    }
}

fn mqtt_311() -> String {
    "3.1.1".into()
}

fn keep_alive_30s() -> String {
    "30s".into()
}

fn one_week() -> String {
    "7 days".into()
}

fn qos_1() -> u8 {
    1
}

fn bridge_window() -> u16 {
    256
}

fn auto_format() -> String {
    "auto".into()
}

impl Config {
    /// Parses a TOML document; missing keys keep their defaults, unknown keys are errors.
    pub fn from_toml(text: &str) -> Result<Self> {
        toml::from_str(text).map_err(|source| Error::Toml { source })
    }

    /// Reads and parses a TOML file.
    pub fn from_file(path: &std::path::Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|source| Error::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_toml(&text)
    }

    /// Applies `SLUICE_*` variables from `vars` (normally `std::env::vars()`):
    /// `SLUICE_DATA_DIR`, `SLUICE_HTTP_LISTEN`, `SLUICE_WAL_DURABILITY`, ... i.e. the key
    /// path upper-cased and joined with `_`.
    pub fn apply_env(&mut self, vars: impl IntoIterator<Item = (String, String)>) -> Result<()> {
        env::apply(self, vars)
    }

    /// Checks values that parse but make no sense.
    pub fn validate(&self) -> Result<()> {
        for (key, value) in [
            ("buffer.max_age", &self.buffer.max_age),
            ("buffer.check_interval", &self.buffer.check_interval),
            ("compaction.interval", &self.compaction.interval),
            ("retention.interval", &self.retention.interval),
            ("mqtt.max_session_expiry", &self.mqtt.max_session_expiry),
        ] {
            parse_duration(value).map_err(|reason| Error::Invalid {
                key: key.into(),
                reason,
            })?;
        }
        let positive = [
            (
                "buffer.partition_max_rows",
                self.buffer.partition_max_rows as u64,
            ),
            ("wal.segment_bytes", self.wal.segment_bytes),
            ("wal.max_group_bytes", self.wal.max_group_bytes as u64),
            (
                "http.max_pending_writes",
                self.http.max_pending_writes as u64,
            ),
            ("storage.row_group_rows", self.storage.row_group_rows as u64),
            ("compaction.min_files", self.compaction.min_files as u64),
            ("mqtt.max_packet_size", self.mqtt.max_packet_size as u64),
            ("mqtt.receive_maximum", self.mqtt.receive_maximum as u64),
            ("mqtt.max_inflight", self.mqtt.max_inflight as u64),
            ("mqtt.max_connections", self.mqtt.max_connections as u64),
            (
                "mqtt.max_queued_messages",
                self.mqtt.max_queued_messages as u64,
            ),
        ];
        if self.http.busy_poll_us > MAX_BUSY_POLL_US {
            return Err(Error::Invalid {
                key: "http.busy_poll_us".into(),
                reason: format!("at most {MAX_BUSY_POLL_US} (10 ms)"),
            });
        }
        for (key, value) in positive {
            if value == 0 {
                return Err(Error::Invalid {
                    key: key.into(),
                    reason: "must be greater than 0".into(),
                });
            }
        }
        if !self.mqtt.tls_listen.is_empty() {
            self.mqtt
                .tls_listen
                .parse::<SocketAddr>()
                .map_err(|e| Error::Invalid {
                    key: "mqtt.tls_listen".into(),
                    reason: e.to_string(),
                })?;
            if self.mqtt.tls_cert.is_empty() || self.mqtt.tls_key.is_empty() {
                return Err(Error::Invalid {
                    key: "mqtt.tls_listen".into(),
                    reason: "needs mqtt.tls_cert and mqtt.tls_key".into(),
                });
            }
        }
        // Secure by default: without users anyone reaching a listener could read and write
        // everything, so only loopback listeners are allowed.
        let mut listeners = vec![
            ("http.listen", self.http.listen),
            ("mqtt.listen", self.mqtt.listen),
        ];
        if let Ok(a) = self.mqtt.tls_listen.parse::<SocketAddr>() {
            listeners.push(("mqtt.tls_listen", a));
        }
        for (key, addr) in listeners {
            if !addr.ip().is_loopback() && self.user.is_empty() {
                return Err(Error::Invalid {
                    key: key.into(),
                    reason: format!(
                        "{addr} is not a loopback address and no users are configured, so \
                         anyone who can reach it could read and write every table; add \
                         [[user]] entries or listen on 127.0.0.1 (or ::1)"
                    ),
                });
            }
        }
        for (i, rule) in self.acl.iter().enumerate() {
            if !matches!(
                rule.action.as_str(),
                "publish" | "subscribe" | "write" | "all"
            ) {
                return Err(Error::Invalid {
                    key: format!("acl[{i}].action"),
                    reason: format!(
                        "{:?}: expected publish, subscribe, write or all",
                        rule.action
                    ),
                });
            }
        }
        let mut names = std::collections::HashSet::new();
        for (i, b) in self.bridge.iter().enumerate() {
            b.validate(&format!("bridge[{i}]"))?;
            if !names.insert(b.name.as_str()) {
                return Err(Error::Invalid {
                    key: format!("bridge[{i}].name"),
                    reason: format!("{:?} is used by an earlier bridge", b.name),
                });
            }
        }
        if let Some(c) = &self.cluster {
            c.validate()?;
        }
        for (i, rule) in self.topic.iter().enumerate() {
            if !matches!(rule.format.as_str(), "auto" | "json" | "csv" | "line") {
                return Err(Error::Invalid {
                    key: format!("topic[{i}].format"),
                    reason: format!("{:?}: expected auto, json, csv or line", rule.format),
                });
            }
            if rule.filter.is_empty() || rule.table.is_empty() {
                return Err(Error::Invalid {
                    key: format!("topic[{i}]"),
                    reason: "needs a filter and a table".into(),
                });
            }
        }
        Ok(())
    }

    /// A duration key known to be valid after [`Config::validate`].
    pub fn duration(value: &str) -> Duration {
        parse_duration(value).unwrap_or(Duration::from_secs(1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn documented_defaults_equal_code_defaults() {
        let text = include_str!("../sluice.toml");
        let parsed = Config::from_toml(text).expect("conf/sluice.toml parses");
        assert_eq!(parsed, Config::default());
        // Every key of the default must be written in the file, not merely defaulted.
        let written: toml::Value = toml::from_str(text).unwrap();
        let full = toml::Value::try_from(Config::default()).unwrap();
        assert_eq!(written, full, "conf/sluice.toml must spell out every key");
        parsed.validate().unwrap();
    }

    #[test]
    fn env_overrides_file() {
        let mut c = Config::from_toml("[http]\nlisten = \"127.0.0.1:1\"\n").unwrap();
        c.apply_env([
            ("SLUICE_HTTP_LISTEN".to_string(), "127.0.0.1:2".to_string()),
            ("SLUICE_DATA_DIR".into(), "/tmp/x".into()),
            ("SLUICE_WAL_DURABILITY".into(), "none".into()),
            ("SLUICE_BUFFER_PARTITION_MAX_ROWS".into(), "7".into()),
            ("SLUICE_STORAGE_S3_ALLOW_HTTP".into(), "true".into()),
            ("PATH".into(), "/bin".into()),
        ])
        .unwrap();
        assert_eq!(c.http.listen.port(), 2);
        assert_eq!(c.data_dir, PathBuf::from("/tmp/x"));
        assert_eq!(c.wal.durability, Durability::None);
        assert_eq!(c.buffer.partition_max_rows, 7);
        assert!(c.storage.s3_allow_http);
    }

    #[test]
    fn bad_env_is_named() {
        let mut c = Config::default();
        let err = c
            .apply_env([("SLUICE_HTTP_LISTNE".to_string(), "x".to_string())])
            .unwrap_err();
        assert!(err.to_string().contains("SLUICE_HTTP_LISTNE"), "{err}");
        let err = c
            .apply_env([(
                "SLUICE_BUFFER_PARTITION_MAX_ROWS".to_string(),
                "many".to_string(),
            )])
            .unwrap_err();
        assert!(err.to_string().contains("many"), "{err}");
    }

    #[test]
    fn public_listener_without_users_is_refused() {
        let mut c = Config::default();
        c.mqtt.listen = "0.0.0.0:1883".parse().unwrap();
        let err = c.validate().unwrap_err().to_string();
        assert!(
            err.contains("mqtt.listen") && err.contains("loopback"),
            "{err}"
        );
    }

    #[test]
    fn unknown_file_keys_are_refused() {
        assert!(Config::from_toml("[http]\nlistem = \"x\"\n").is_err());
    }

    #[test]
    fn cluster_section() {
        let text = "[cluster]\nnode_id = 2\nlisten = \"127.0.0.1:7002\"\n\
                    shared_store = \"file:///tmp/shared\"\n\
                    peers = { 1 = \"127.0.0.1:7001\", 3 = \"127.0.0.1:7003\" }\n";
        let c = Config::from_toml(text).unwrap();
        c.validate().unwrap();
        let cl = c.cluster.as_ref().unwrap();
        assert_eq!(cl.replication_factor, 3);
        let nodes = cl.nodes();
        assert_eq!(nodes.keys().copied().collect::<Vec<_>>(), vec![1, 2, 3]);
        assert_eq!(nodes[&2], "127.0.0.1:7002");
        assert_eq!(cl.shard_count(), 6);
        // A single node has no [cluster] at all.
        assert!(Config::default().cluster.is_none());

        let mut wrong = c.clone();
        wrong
            .cluster
            .as_mut()
            .unwrap()
            .peers
            .insert("2".into(), "127.0.0.1:9".into());
        let err = wrong.validate().unwrap_err().to_string();
        assert!(
            err.contains("cluster.peers") && err.contains("listens on"),
            "{err}"
        );
        let mut wrong = c.clone();
        wrong.cluster.as_mut().unwrap().shared_store = "shared".into();
        let err = wrong.validate().unwrap_err().to_string();
        assert!(err.contains("cluster.shared_store"), "{err}");
        let mut wrong = c;
        wrong
            .cluster
            .as_mut()
            .unwrap()
            .peers
            .insert("x".into(), "h:1".into());
        assert!(wrong.validate().is_err());
    }

    #[test]
    fn validate_names_the_key() {
        let mut c = Config::default();
        c.buffer.max_age = "soon".into();
        assert!(
            c.validate()
                .unwrap_err()
                .to_string()
                .contains("buffer.max_age")
        );
    }
}
