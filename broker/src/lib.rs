//! The MQTT broker: devices publish, rows land in tables, subscribers receive.
//!
//! Data flow: a listener ([`Broker::serve_tcp`], or [`Broker::serve_connection`] for TLS and
//! WebSocket streams) hands each connection to `connection`, which decodes packets with
//! rumqttc's codecs (`codec` turns 3.1.1 packets into 5.0 ones so the rules are written
//! once). A PUBLISH goes to `ingest`: `mapping` finds its table (user properties, `[[topic]]`
//! rules, `/db/table`), the engine stores it as one durable append through
//! [`sluice_engine::IngestPort::publish`], and only then is it acknowledged and handed to the
//! `router`, which queues it on every matching `session`. Start reading at `connection`.
//!
//! `bridge` makes Sluice a client of other brokers: what they deliver takes the same path,
//! and is acknowledged to them only once stored.

mod auth;
mod bridge;
mod codec;
mod connection;
mod error;
mod ingest;
mod journal;
mod latest;
mod mapping;
mod metrics;
mod persist;
mod reactor;
mod router;
mod session;
mod sparkplug;
mod standby;
mod tables;
mod takeover;
pub mod tls;
mod topic;

pub use bridge::{BridgeStatus, Bridges};
pub use error::{BridgeError, Error, Result};

use metrics::Metrics;
use router::Router;
use sluice_conf::{Config, MqttConfig};
use sluice_engine::IngestPort;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// How often sessions and retained messages are saved (also at shutdown).
const SAVE_EVERY_SECS: u64 = 5;

/// How often the `$SYS/broker/...` topics are published.
const SYS_EVERY_SECS: u64 = 10;

/// State every connection shares.
struct BrokerState {
    config: MqttConfig,
    db: Arc<dyn IngestPort>,
    router: Router,
    mapper: mapping::Mapper,
    metrics: Metrics,
    next_conn: AtomicU64,
    shutdown: CancellationToken,
    max_session_expiry: Duration,
    store: persist::Store,
    /// The LSN of the last snapshot written (0: none yet).
    saved_lsn: AtomicU64,
    /// In a cluster: the standby copies of the nodes' sessions.
    standby: standby::Standby,
}

impl std::fmt::Debug for BrokerState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BrokerState")
            .field("config", &self.config)
            .field("router", &self.router)
            .finish_non_exhaustive()
    }
}

/// Publishes alert notifications (see [`Broker::alert_sink`]).
#[derive(Debug)]
struct AlertPublisher(tokio::sync::mpsc::UnboundedSender<Arc<session::Message>>);

impl sluice_engine::AlertSink for AlertPublisher {
    fn publish(&self, topic: String, payload: Vec<u8>) {
        let m = Arc::new(session::Message {
            id: Default::default(),
            sent_to: Default::default(),
            topic: Arc::from(topic),
            payload: payload.into(),
            qos: rumqttc::v5::mqttbytes::QoS::AtLeastOnce,
            retain: false,
            properties: None,
            expires: None,
            origin: Arc::from("$alerts"),
        });
        // Unbounded: changes of state are few, and none may be dropped; only a stopped
        // broker refuses them.
        if self.0.send(m).is_err() {
            tracing::warn!("the broker has stopped; an alert notification was not published");
        }
    }
}

/// The broker; cheap to clone.
#[derive(Debug, Clone)]
pub struct Broker {
    shared: Arc<BrokerState>,
    tasks: TaskTracker,
    bridges: Arc<Bridges>,
    /// The threads plain TCP connections run on; none on a cluster node, whose
    /// connections stay on the main runtime (the relay and raft clients start tasks of their
    /// own from a connection's runtime; not yet made to run on connection threads).
    reactors: Option<Arc<reactor::Reactors>>,
}

impl Broker {
    /// A broker storing into `db`, ending its connections when `shutdown` is cancelled.
    pub fn new(
        config: &Config,
        db: Arc<dyn IngestPort>,
        shutdown: CancellationToken,
    ) -> Result<Self> {
        let mapper = mapping::Mapper::new(&config.topic)?;
        let relay = db.relay();
        let clustered = relay.is_some();
        let router = Router::new(config.mqtt.max_queued_messages, relay.clone());
        let store = persist::Store::new(&config.data_dir);
        let (wills, copies) = replay(&router, &store, db.as_ref());
        router.forget_retained(|t| mapper.retains_latest(t));
        let shared = Arc::new(BrokerState {
            config: config.mqtt.clone(),
            db,
            router,
            mapper,
            metrics: Metrics::default(),
            next_conn: AtomicU64::new(1),
            shutdown,
            max_session_expiry: Config::duration(&config.mqtt.max_session_expiry),
            store,
            saved_lsn: AtomicU64::new(0),
            standby: standby::Standby::default(),
        });
        if let Some(relay) = relay {
            relay.received_before(shared.router.relayed_marks());
            relay.set_sink(Arc::new(ingest::Inbox(Arc::downgrade(&shared))));
            // From now on its journal's records also go to another node's standby copy.
            if config.cluster.as_ref().is_some_and(|c| c.standby_copy) {
                let (mirror, shipping) = standby::Mirror::new(relay);
                let _ = shared.standby.mirror.set(mirror.clone());
                shared.db.set_journal_tap(mirror.clone());
                mirror.start(shipping);
            }
        }
        connection::publish_replayed_wills(&shared, wills);
        for (client, lsns) in copies {
            connection::log_done(&shared, &client, lsns);
        }
        // In a cluster: sessions whose clients went elsewhere while this node was down.
        tokio::spawn(takeover::give_back(shared.clone()));
        let bridges = Arc::new(Bridges::new(shared.clone(), &config.data_dir));
        let status = Arc::downgrade(&bridges);
        for (name, rows) in tables::TABLES {
            let state = Arc::downgrade(&shared);
            let empty = rows(&Router::new(1, None));
            shared.db.add_system_table(
                name,
                sluice_engine::SystemRows(Arc::new(move || match state.upgrade() {
                    Some(s) => rows(&s.router),
                    None => empty.clone(),
                })),
            );
        }
        shared.db.add_system_table(
            "bridges",
            sluice_engine::SystemRows(Arc::new(move || {
                let all = status.upgrade().map(|b| b.status_now()).unwrap_or_default();
                bridge::system_table(&all)
            })),
        );
        Ok(Self {
            shared,
            tasks: TaskTracker::new(),
            bridges,
            reactors: match clustered {
                false => Some(reactor::Reactors::start(config.mqtt.threads)?),
                true => None,
            },
        })
    }

    /// Starts the bridges of the configuration (and those the admin API added earlier).
    pub async fn start_bridges(&self, configured: &[sluice_conf::BridgeConfig]) {
        self.bridges.start(configured).await;
    }

    /// The bridges, for the admin API.
    pub fn bridges(&self) -> &Arc<Bridges> {
        &self.bridges
    }

    /// Accepts MQTT connections on `listener` until shutdown, then waits for them to end.
    pub async fn serve_tcp(&self, listener: TcpListener) -> Result<()> {
        self.peers_known().await;
        let shutdown = self.shared.shutdown.clone();
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        let mut ticks = 0u64;
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = tick.tick() => {
                    let ended = self.shared.router.expire(Instant::now());
                    if !ended.is_empty() && self.shared.db.journals() {
                        let entries = (ended.into_iter())
                            .map(|client| journal::entry(&journal::Record::End { client }, None))
                            .collect();
                        if let Err(e) = self.shared.db.journal(entries, true).await {
                            tracing::warn!(error = %e, "expired sessions not logged");
                        }
                    }
                    ticks += 1;
                    if ticks.is_multiple_of(SAVE_EVERY_SECS) {
                        self.save(false).await;
                    }
                    if ticks % SYS_EVERY_SECS == 1 {
                        self.publish_sys().await;
                    }
                }
                accepted = listener.accept() => match accepted {
                    Ok((stream, peer)) => {
                        let _ = stream.set_nodelay(true);
                        match &self.reactors {
                            Some(r) => self.serve_on_reactor(stream, peer, r),
                            None => self.serve_connection(stream, peer),
                        }
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
        self.bridges.stopped().await;
        self.save(true).await;
        Ok(())
    }

    /// Publishes the metrics as retained `$SYS/broker/...` messages (e.g.
    /// `$SYS/broker/messages_received_total`).
    async fn publish_sys(&self) {
        let r = &self.shared.router;
        for (name, _, value) in self.shared.metrics.values(&r.gauges()) {
            let topic = format!("$SYS/broker/{}", name.trim_start_matches("sluice_mqtt_"));
            let m = Arc::new(session::Message {
                id: Default::default(),
                sent_to: Default::default(),
                topic: Arc::from(topic),
                payload: value.to_string().into(),
                qos: rumqttc::v5::mqttbytes::QoS::AtMostOnce,
                retain: true,
                properties: None,
                expires: None,
                origin: Arc::from("$SYS"),
            });
            ingest::route(&self.shared, &m).await;
        }
    }

    /// In a cluster, waits (a few seconds at most) until the other nodes' subscriptions are
    /// known here: a publish taken before would miss them.
    async fn peers_known(&self) {
        if let Some(r) = self.shared.db.relay() {
            r.peers_known().await;
        }
    }

    /// Whether logins are needed (any user exists), for the HTTP API too.
    pub fn auth_required(&self) -> bool {
        self.shared.db.has_users()
    }

    /// Failed logins by address (MQTT and HTTP count together).
    pub fn logins(&self) -> &sluice_engine::access::LoginFailures {
        self.shared.db.logins()
    }

    /// Whether `user` is an administrator.
    pub fn is_admin(&self, user: &str) -> bool {
        self.shared.db.is_admin(Some(user))
    }

    /// `user`'s argon2 password hash: the same users as MQTT logins.
    pub fn password_hash(&self, user: &str) -> Option<String> {
        self.shared.db.password_hash(user)
    }

    /// The broker's live figures (`{"mqtt": {...}, "bridges": [...]}`) for the console.
    pub fn live(&self) -> serde_json::Value {
        let m = &self.shared.metrics;
        let r = &self.shared.router;
        let mut mqtt = serde_json::Map::new();
        for (name, _, value) in m.values(&r.gauges()) {
            let short = name.trim_start_matches("sluice_mqtt_");
            let key = match short {
                "connections_total" => "connections_accepted".to_string(),
                _ => (short.trim_end_matches("_total"))
                    .replace("_received", "_in")
                    .replace("_sent", "_out"),
            };
            mqtt.insert(key, value.into());
        }
        let (p50, p99) = m.recent_ack_quantiles().unzip();
        mqtt.insert("ack_p50_ms".into(), p50.into());
        mqtt.insert("ack_p99_ms".into(), p99.into());
        serde_json::json!({"mqtt": mqtt, "bridges": self.bridges.status_now()})
    }

    /// Delivers `payload` on `topic` to the matching subscriptions here and on the other
    /// nodes of a cluster (QoS 1, not retained, not stored: what made it stored it), as
    /// published by `origin`; returns once it is queued for them.
    pub async fn publish(&self, topic: &str, payload: bytes::Bytes, origin: &str) {
        if !self.shared.router.listened(topic) {
            return;
        }
        let m = Arc::new(session::Message {
            id: Default::default(),
            sent_to: Default::default(),
            topic: Arc::from(topic),
            payload,
            qos: rumqttc::v5::mqttbytes::QoS::AtLeastOnce,
            retain: false,
            properties: None,
            expires: None,
            origin: Arc::from(origin),
        });
        ingest::route(&self.shared, &m).await;
    }

    /// Where alerts publish their changes: `$alerts/<name>` to local subscribers (and through
    /// bridges forwarding it), in the order they happen.
    pub fn alert_sink(&self) -> Arc<dyn sluice_engine::AlertSink> {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Arc<session::Message>>();
        let shared = self.shared.clone();
        tokio::spawn(async move {
            while let Some(m) = rx.recv().await {
                ingest::route(&shared, &m).await;
            }
        });
        Arc::new(AlertPublisher(tx))
    }

    /// Saves a snapshot of sessions and retained messages (see `persist`); the log then
    /// keeps only the journal records after it. Unless `always`, nothing is written when
    /// the log has not moved since the last snapshot (where the journal is kept: every
    /// change to lasting state is a record).
    async fn save(&self, always: bool) {
        let shared = self.shared.clone();
        let r = tokio::task::spawn_blocking(move || {
            let last = shared.saved_lsn.load(std::sync::atomic::Ordering::Acquire);
            let unless = (!always && last > 0 && shared.db.journals()).then_some(last);
            if let Some(lsn) = shared
                .store
                .save(&shared.router, shared.db.as_ref(), unless)?
            {
                shared
                    .saved_lsn
                    .store(lsn, std::sync::atomic::Ordering::Release);
                shared.db.keep_journal_from(lsn + 1);
            }
            Ok::<_, std::io::Error>(())
        })
        .await;
        if let Ok(Err(e)) = r {
            tracing::error!(error = %e, "saving broker sessions and retained messages failed");
        }
    }

    /// Serves one already-accepted stream (TCP, TLS or WebSocket) on its own task.
    pub fn serve_connection<S>(&self, stream: S, peer: std::net::SocketAddr)
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        self.serve_connection_as(stream, peer, None)
    }

    /// Like [`Broker::serve_connection`], for a client already known as `ident` (the
    /// common name of its verified TLS certificate): it logs in as that user, without a
    /// password.
    pub fn serve_connection_as<S>(
        &self,
        stream: S,
        peer: std::net::SocketAddr,
        ident: Option<Arc<str>>,
    ) where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let shared = self.shared.clone();
        (self.tasks).spawn(async move { connection::serve(shared, stream, peer, ident).await });
    }

    /// Serves a plain TCP connection on one of the connection threads ([`reactor`]).
    fn serve_on_reactor(
        &self,
        stream: tokio::net::TcpStream,
        peer: std::net::SocketAddr,
        reactors: &reactor::Reactors,
    ) {
        let stream = match stream.into_std() {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(%peer, error = %e, "an MQTT connection could not be handed over");
                return;
            }
        };
        let shared = self.shared.clone();
        let serve = async move {
            // Registered with the thread's own runtime, which polls it.
            match tokio::net::TcpStream::from_std(stream) {
                Ok(s) => connection::serve(shared, s, peer, None).await,
                Err(e) => tracing::warn!(%peer, error = %e, "an MQTT connection was lost"),
            }
        };
        self.tasks.spawn_on(serve, reactors.pick());
    }

    /// The broker's metrics (bridges' included) in Prometheus text format.
    pub fn metrics_text(&self) -> String {
        let mut text = self.shared.metrics.render(&self.shared.router.gauges());
        text.push_str(&bridge::render_metrics(&self.bridges.status_now()));
        text.push_str(&self.shared.standby.render());
        text
    }
}

/// Loads the snapshot into `router` and applies the journal records after it; returns the
/// wills still to be published (their connection ended with the server), and the copies
/// it dropped (to be logged as done).
fn replay(
    router: &Router,
    store: &persist::Store,
    db: &dyn IngestPort,
) -> (Vec<router::replay::Will>, Vec<router::replay::Copies>) {
    let lsn = store.load(router);
    let (mut applied, mut unknown) = (0u64, 0u64);
    for (at, bytes) in db.take_journal() {
        if at <= lsn {
            continue;
        }
        match journal::Record::decode(&bytes) {
            Some(r) => {
                router.replay(at, r, db);
                applied += 1;
            }
            None => {
                unknown += 1;
                tracing::error!(lsn = at, "broker journal record not understood; skipped");
            }
        }
    }
    let (wills, copies) = router.replayed();
    db.keep_journal_from(lsn + 1);
    if applied + unknown > 0 {
        tracing::info!(
            records = applied,
            skipped = unknown,
            after = lsn,
            "broker journal replayed"
        );
    }
    (wills, copies)
}

/// The MQTT over TLS acceptor: `certs` served, client certificates verified against
/// `mqtt.tls_client_ca` when set (required with `mqtt.tls_require_client_cert`), and with
/// `mqtt.tls_cert_user` a verified certificate's common name is the user.
pub fn tls_acceptor(
    certs: Arc<tls::CertFiles>,
    mqtt: &sluice_conf::MqttConfig,
) -> Result<TlsAcceptor> {
    let clients = (!mqtt.tls_client_ca.is_empty()).then(|| tls::ClientCerts {
        ca: std::path::Path::new(&mqtt.tls_client_ca),
        required: mqtt.tls_require_client_cert,
    });
    let config = tls::server_config(certs, clients, &[])?;
    Ok(TlsAcceptor {
        tls: tokio_rustls::TlsAcceptor::from(config),
        cert_user: mqtt.tls_cert_user,
    })
}

/// The HTTPS acceptor (HTTP/1.1) serving `certs`.
pub fn https_acceptor(certs: Arc<tls::CertFiles>) -> Result<HttpsAcceptor> {
    let config = tls::server_config(certs, None, &[b"http/1.1"])?;
    Ok(tokio_rustls::TlsAcceptor::from(config))
}

/// Accepts TLS for the PostgreSQL protocol (ALPN `postgresql`), with the HTTPS certificate.
pub fn pg_acceptor(certs: Arc<tls::CertFiles>) -> Result<HttpsAcceptor> {
    let config = tls::server_config(certs, None, &[b"postgresql"])?;
    Ok(tokio_rustls::TlsAcceptor::from(config))
}

/// What [`https_acceptor`] makes, for the HTTP server.
pub type HttpsAcceptor = tokio_rustls::TlsAcceptor;

/// Accepts TLS connections for the broker (see [`tls_acceptor`]).
#[derive(Clone)]
pub struct TlsAcceptor {
    tls: tokio_rustls::TlsAcceptor,
    cert_user: bool,
}

impl std::fmt::Debug for TlsAcceptor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TlsAcceptor")
    }
}

impl Broker {
    /// Accepts MQTT over TLS on `listener` until shutdown. A failed handshake ends only that
    /// connection.
    pub async fn serve_tls(&self, listener: TcpListener, tls: TlsAcceptor) -> Result<()> {
        self.peers_known().await;
        let shutdown = self.shared.shutdown.clone();
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return Ok(()),
                accepted = listener.accept() => match accepted {
                    Ok((stream, peer)) => {
                        let _ = stream.set_nodelay(true);
                        let (cert_user, tls) = (tls.cert_user, tls.tls.clone());
                        let broker = self.clone();
                        self.tasks.spawn(async move {
                            match tokio::time::timeout(Duration::from_secs(10), tls.accept(stream)).await {
                                Ok(Ok(s)) => {
                                    // Only a verified chain is there to read.
                                    let certs = s.get_ref().1.peer_certificates();
                                    let ident = (certs.and_then(|c| c.first()))
                                        .filter(|_| cert_user)
                                        .and_then(|c| tls::common_name(c))
                                        .map(Arc::<str>::from);
                                    broker.serve_connection_as(s, peer, ident)
                                }
                                Ok(Err(e)) => tracing::debug!(%peer, error = %e, "TLS handshake failed"),
                                Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
                            }
                        });
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "accepting an MQTT/TLS connection failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                },
            }
        }
    }
}
