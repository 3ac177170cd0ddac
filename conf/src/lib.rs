//! Sluice configuration.
//!
//! [`Config`] is the whole configuration, with `Default` giving the embedded defaults that
//! `conf/sluice.toml` documents key by key. It is built in three layers, each overriding the
//! one before: the TOML file ([`Config::from_toml`]), the `SLUICE_*` environment
//! ([`Config::apply_env`]), then command-line flags (set by the binary on the struct).
//! [`Config::validate`] runs last. Durations are written as `"10m"`, `"30 days"` and parsed by
//! [`parse_duration`]; sizes are plain byte counts.

mod auth;
mod bridge;
mod cluster;
mod duration;
mod engine;
mod env;
mod error;
mod http;
mod mqtt;
mod pg;
#[cfg(test)]
mod tests;

pub use auth::{AclRule, UserConfig};
pub use bridge::{BridgeConfig, BridgeTopic};
pub use cluster::ClusterConfig;
pub use duration::parse_duration;
pub use engine::{
    BufferConfig, CompactionConfig, Durability, MemoryBudget, QueryConfig, RetentionConfig,
    StorageConfig, WalConfig, machine_memory,
};
pub use error::{Error, Result};
pub use http::HttpConfig;
pub use mqtt::{MqttConfig, RetainFrom, SparkplugLayout, TopicRule};
pub use pg::PgConfig;

use http::MAX_BUSY_POLL_US;
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// Whether `addr` is `host:port` (a non-empty host, a port number): the form of every
/// network address in the config (peers, bridges) and the admin API.
pub fn is_host_port(addr: &str) -> bool {
    addr.rsplit_once(':')
        .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok())
}

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
    /// The PostgreSQL wire protocol.
    pub pg: PgConfig,
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
            pg: PgConfig::default(),
            topic: Vec::new(),
            user: Vec::new(),
            acl: Vec::new(),
            bridge: Vec::new(),
            cluster: None,
        }
    }
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

    /// TLS settings that go together, and no plain-text listener beyond loopback unless
    /// asked for (`allow_plaintext`).
    fn validate_tls(&self) -> Result<()> {
        let invalid = |key: &str, reason: &str| {
            Err(Error::Invalid {
                key: key.into(),
                reason: reason.into(),
            })
        };
        if self.http.tls_cert.is_empty() != self.http.tls_key.is_empty() {
            return invalid(
                "http.tls_cert",
                "http.tls_cert and http.tls_key go together",
            );
        }
        let m = &self.mqtt;
        if !m.tls_client_ca.is_empty() && m.tls_listen.is_empty() {
            return invalid("mqtt.tls_client_ca", "needs mqtt.tls_listen");
        }
        if (m.tls_require_client_cert || m.tls_cert_user) && m.tls_client_ca.is_empty() {
            return invalid(
                "mqtt.tls_client_ca",
                "mqtt.tls_require_client_cert and mqtt.tls_cert_user need a CA to verify \
                 client certificates against",
            );
        }
        let clear = [
            (
                "http",
                self.http.listen,
                self.http.tls_cert.is_empty(),
                self.http.allow_plaintext,
            ),
            ("mqtt", m.listen, true, m.allow_plaintext),
        ];
        if !self.pg.listen.is_empty() {
            let addr: SocketAddr = self.pg.listen.parse().map_err(|_| Error::Invalid {
                key: "pg.listen".into(),
                reason: format!(
                    "'{}' is not an address (ip:port), nor empty (no listener)",
                    self.pg.listen
                ),
            })?;
            let plain = self.http.tls_cert.is_empty();
            if plain && !self.pg.allow_plaintext && !addr.ip().is_loopback() {
                return invalid(
                    "pg.listen",
                    "not a loopback address and no certificate for TLS (http.tls_cert), so \
                     passwords and data would cross the network in clear; set \
                     http.tls_cert and http.tls_key, or pg.allow_plaintext = true",
                );
            }
        }
        for (section, addr, plain, allowed) in clear {
            if plain && !allowed && !addr.ip().is_loopback() {
                return Err(Error::Invalid {
                    key: format!("{section}.listen"),
                    reason: format!(
                        "{addr} is not a loopback address and the listener has no TLS, so \
                         passwords and data would cross the network in clear; {}, or set \
                         {section}.allow_plaintext = true",
                        match section {
                            "http" => "set http.tls_cert and http.tls_key",
                            _ => "use mqtt.tls_listen (and keep mqtt.listen on 127.0.0.1)",
                        }
                    ),
                });
            }
        }
        Ok(())
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
            ("retention.orphan_grace", &self.retention.orphan_grace),
            ("mqtt.max_session_expiry", &self.mqtt.max_session_expiry),
            ("query.timeout", &self.query.timeout),
            ("wal.max_commit_delay", &self.wal.max_commit_delay),
        ] {
            parse_duration(value).map_err(|reason| Error::Invalid {
                key: key.into(),
                reason,
            })?;
        }
        self.query
            .hot_cache_bytes
            .bytes()
            .map_err(|reason| Error::Invalid {
                key: "query.hot_cache_bytes".into(),
                reason,
            })?;
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
            ("http.max_connections", self.http.max_connections as u64),
            ("query.max_memory_bytes", self.query.max_memory_bytes as u64),
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
        self.validate_tls()?;
        for (i, u) in self.user.iter().enumerate() {
            if u.name.starts_with("bridge:") {
                return Err(Error::Invalid {
                    key: format!("user[{i}].name"),
                    reason: "names starting with bridge: are the bridges' own".into(),
                });
            }
            if !matches!(u.role.as_str(), "admin" | "user") {
                return Err(Error::Invalid {
                    key: format!("user[{i}].role"),
                    reason: format!("{:?}: expected admin or user", u.role),
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
            let unnamed = |l: &str| l == "#" || l == "+";
            if rule.retain == RetainFrom::Latest && rule.filter.split('/').any(unnamed) {
                return Err(Error::Invalid {
                    key: format!("topic[{i}].retain"),
                    reason: "\"latest\" needs every wildcard of the filter named (+name), \
                             so that a row makes its topic"
                        .into(),
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
