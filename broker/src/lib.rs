//! The MQTT broker: devices publish, rows land in tables, subscribers receive.
//!
//! Data flow: a listener ([`Broker::serve_tcp`], or [`Broker::serve_connection`] for TLS and
//! WebSocket streams) hands each connection to `connection`, which decodes packets with
//! rumqttc's codecs (`codec` turns 3.1.1 packets into 5.0 ones so the rules are written
//! once). A PUBLISH goes to `ingest`: `mapping` finds its table (user properties, `[[topic]]`
//! rules, `/db/table`), the engine stores it as one durable append through
//! [`sluice_engine::Database::publish`], and only then is it acknowledged and handed to the
//! `router`, which queues it on every matching `session`. Start reading at `connection`.

mod codec;
mod connection;
mod error;
mod ingest;
mod mapping;
mod metrics;
mod router;
mod session;
mod topic;

pub use error::{Error, Result};

use metrics::Metrics;
use router::Router;
use sluice_conf::{Config, MqttConfig};
use sluice_engine::Database;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// State every connection shares.
struct Shared {
    config: MqttConfig,
    db: Arc<dyn Database>,
    router: Router,
    mapper: mapping::Mapper,
    metrics: Metrics,
    next_conn: AtomicU64,
    shutdown: CancellationToken,
    max_session_expiry: Duration,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("config", &self.config)
            .field("router", &self.router)
            .finish_non_exhaustive()
    }
}

/// The broker; cheap to clone.
#[derive(Debug, Clone)]
pub struct Broker {
    shared: Arc<Shared>,
    tasks: TaskTracker,
}

impl Broker {
    /// A broker storing into `db`, ending its connections when `shutdown` is cancelled.
    pub fn new(
        config: &Config,
        db: Arc<dyn Database>,
        shutdown: CancellationToken,
    ) -> Result<Self> {
        let mapper = mapping::Mapper::new(&config.topic)?;
        Ok(Self {
            shared: Arc::new(Shared {
                config: config.mqtt.clone(),
                db,
                router: Router::new(config.mqtt.max_queued_messages),
                mapper,
                metrics: Metrics::default(),
                next_conn: AtomicU64::new(1),
                shutdown,
                max_session_expiry: Config::duration(&config.mqtt.max_session_expiry),
            }),
            tasks: TaskTracker::new(),
        })
    }

    /// Accepts MQTT connections on `listener` until shutdown, then waits for them to end.
    pub async fn serve_tcp(&self, listener: TcpListener) -> Result<()> {
        let shutdown = self.shared.shutdown.clone();
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = tick.tick() => {
                    self.shared.router.expire(Instant::now());
                }
                accepted = listener.accept() => match accepted {
                    Ok((stream, peer)) => {
                        let _ = stream.set_nodelay(true);
                        self.serve_connection(stream, peer);
                    }
                    Err(e) => {
                        // Out of file descriptors and the like: back off instead of spinning.
                        tracing::warn!(error = %e, "accepting an MQTT connection failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                },
            }
        }
        self.tasks.close();
        self.tasks.wait().await;
        Ok(())
    }

    /// Serves one already-accepted stream (TCP, TLS or WebSocket) on its own task.
    pub fn serve_connection<S>(&self, stream: S, peer: std::net::SocketAddr)
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let shared = self.shared.clone();
        self.tasks
            .spawn(async move { connection::serve(shared, stream, peer).await });
    }

    /// The broker's metrics in Prometheus text format.
    pub fn metrics_text(&self) -> String {
        self.shared.metrics.render(
            self.shared.router.session_count(),
            self.shared.router.retained_count(),
        )
    }
}
