//! `[[bridge]]`: remote MQTT brokers stored here, and the topics forwarded to them.

use crate::{Error, Result, is_host_port, parse_duration};
use serde::{Deserialize, Serialize};

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
