//! The listeners' certificates (MQTT over TLS, HTTPS): read at start, and read again on
//! SIGHUP and when the files change (checked every few seconds), so a renewed certificate
//! is served to new connections without a restart.

use anyhow::Context;
use sluice_broker::tls::CertFiles;
use sluice_conf::Config;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// How often the certificate files are checked for changes.
const CHECK_EVERY: Duration = Duration::from_secs(5);

/// The TLS acceptors the configuration asks for, and the files behind them.
pub(crate) struct Certificates {
    /// For `mqtt.tls_listen`.
    pub(crate) mqtt: Option<sluice_broker::TlsAcceptor>,
    /// For the HTTP listener (HTTPS).
    pub(crate) http: Option<sluice_broker::HttpsAcceptor>,
    /// For the PostgreSQL listener: the HTTPS certificate.
    pub(crate) pg: Option<sluice_broker::HttpsAcceptor>,
    files: Vec<Arc<CertFiles>>,
}

impl Certificates {
    /// Reads the certificates; fails when a file does not hold what it should.
    pub(crate) fn load(cfg: &Config) -> anyhow::Result<Self> {
        let mut files = Vec::new();
        let mut open = |cert: &str, key: &str| -> anyhow::Result<Arc<CertFiles>> {
            let f = CertFiles::open(Path::new(cert), Path::new(key))
                .with_context(|| format!("loading the TLS certificate {cert}"))?;
            files.push(f.clone());
            Ok(f)
        };
        let mqtt = match cfg.mqtt.tls_listen.is_empty() {
            true => None,
            false => {
                let certs = open(&cfg.mqtt.tls_cert, &cfg.mqtt.tls_key)?;
                Some(sluice_broker::tls_acceptor(certs, &cfg.mqtt)?)
            }
        };
        let (http, pg) = match cfg.http.tls_cert.is_empty() {
            true => (None, None),
            false => {
                let certs = open(&cfg.http.tls_cert, &cfg.http.tls_key)?;
                let pg = sluice_broker::pg_acceptor(certs.clone())?;
                (Some(sluice_broker::https_acceptor(certs)?), Some(pg))
            }
        };
        Ok(Self {
            mqtt,
            http,
            pg,
            files,
        })
    }

    /// Reloads the certificates on SIGHUP and when their files change, until `cancel`.
    /// SIGHUP is taken over here, before the server says it is ready (its default would
    /// end the process).
    pub(crate) fn watch(&self, cancel: CancellationToken) -> anyhow::Result<()> {
        use tokio::signal::unix::{SignalKind, signal};
        let mut hup = signal(SignalKind::hangup()).context("handling SIGHUP")?;
        let files = self.files.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(CHECK_EVERY);
            loop {
                tokio::select! {
                    _ = cancel.cancelled() => return,
                    _ = tick.tick() => {
                        for f in &files {
                            f.reload_if_changed();
                        }
                    }
                    _ = hup.recv() => {
                        for f in &files {
                            match f.reload() {
                                Ok(()) => tracing::info!("SIGHUP: TLS certificate reloaded"),
                                Err(e) => tracing::warn!(error = %e, "SIGHUP: TLS certificate not reloaded; the previous one stays"),
                            }
                        }
                    }
                }
            }
        });
        Ok(())
    }
}
