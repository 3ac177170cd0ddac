//! `[pg]`: the PostgreSQL wire protocol listener (psql, psycopg, JDBC, Grafana).

use serde::{Deserialize, Serialize};

/// PostgreSQL wire protocol listener.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PgConfig {
    /// Address the PostgreSQL protocol listens on (`host:port`); empty: no listener. Port 0
    /// picks a free port (printed at start). With `http.tls_cert` set, clients may ask for
    /// TLS (`sslmode=require`) and get the same certificate as HTTPS.
    pub listen: String,
    /// Allow `listen` on a non-loopback address without TLS (passwords travel in clear).
    pub allow_plaintext: bool,
    /// Open connections at once; a connection past this is closed as soon as it is accepted.
    pub max_connections: usize,
}

impl Default for PgConfig {
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:5433".into(),
            allow_plaintext: false,
            max_connections: 1000,
        }
    }
}
