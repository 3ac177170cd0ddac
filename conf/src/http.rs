//! `[http]`: the HTTP API's listener and request limits.

use serde::{Deserialize, Serialize};
use std::net::SocketAddr;

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
    /// PEM certificate chain: with `tls_key`, the listener speaks HTTPS only (the console,
    /// the API and MQTT over WebSocket as wss). Both files are read again on SIGHUP and
    /// when they change.
    pub tls_cert: String,
    /// PEM private key for `tls_cert`.
    pub tls_key: String,
    /// Allow `listen` on a non-loopback address without TLS: credentials, session cookies
    /// and data would travel in clear, so it must be asked for.
    pub allow_plaintext: bool,
    /// Open connections at once; a connection past this is closed as soon as it is accepted
    /// (and logged), so one client cannot hold every socket.
    pub max_connections: usize,
}

/// The longest `http.busy_poll_us`: a spin is meant to bridge a client's turnaround.
pub(crate) const MAX_BUSY_POLL_US: u64 = 10_000;

impl Default for HttpConfig {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            max_body_bytes: 16 * 1024 * 1024,
            max_pending_writes: 4096,
            busy_poll_us: 200,
            tls_cert: String::new(),
            tls_key: String::new(),
            allow_plaintext: false,
            max_connections: 10_000,
        }
    }
}
