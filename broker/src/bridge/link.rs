//! One bridge's client connection to the remote broker, over rumqttc's 3.1.1 or 5.0 client,
//! seen through one small interface: events in, manual acks and publishes out.

use bytes::Bytes;
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::mqttbytes::v5::PublishProperties;
use sluice_conf::{BridgeConfig, Config};
use std::sync::Arc;
use std::time::Duration;

/// A message received from the remote broker, not yet acknowledged.
#[derive(Debug)]
pub(super) struct Received {
    pub(super) pkid: u16,
    pub(super) qos: QoS,
    pub(super) dup: bool,
    pub(super) retain: bool,
    pub(super) topic: String,
    pub(super) payload: Bytes,
    pub(super) properties: Option<PublishProperties>,
    ack: Ack,
}

/// What acknowledging needs: the publish as the client received it.
#[derive(Debug)]
enum Ack {
    V4(rumqttc::Publish),
    V5(rumqttc::v5::mqttbytes::v5::Publish),
}

/// What polling the connection gave.
#[derive(Debug)]
pub(super) enum Got {
    /// CONNACK accepted.
    Connected { session_present: bool },
    /// A PUBLISH.
    Message(Box<Received>),
    /// Anything else (acks of our packets, pings).
    Other,
}

/// Sends to the remote broker (acks, subscriptions, publishes); cheap to clone.
#[derive(Clone)]
pub(super) enum Client {
    V4(rumqttc::AsyncClient),
    V5(rumqttc::v5::AsyncClient),
}

/// The connection's events; polling it drives the connection (and reconnects after an
/// error).
pub(super) enum Events {
    V4(Box<rumqttc::EventLoop>),
    V5(Box<rumqttc::v5::EventLoop>),
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Client")
    }
}

impl std::fmt::Debug for Events {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Events")
    }
}

/// rumqttc's request queue: room for every ack the window allows plus forwarded messages.
fn request_capacity(cfg: &BridgeConfig) -> usize {
    usize::from(cfg.window) * 2 + 256
}

/// The largest packet MQTT can carry. Bridged messages of any size are taken: one larger
/// than Sluice's own limit becomes a dead letter (and is acknowledged) instead of breaking
/// the connection on every redelivery.
const MAX_REMOTE_PACKET: u32 = 268_435_455;

/// A client for `cfg` (nothing is sent until its events are polled). Clean session is off
/// (3.1.1) or the session outlives the connection (5.0); acks are sent by us, once stored.
pub(super) fn connect(cfg: &BridgeConfig, max_packet: u32) -> Result<(Client, Events), String> {
    {
        let (host, port) = cfg
            .address
            .rsplit_once(':')
            .and_then(|(h, p)| Some((h.trim_matches(['[', ']']), p.parse::<u16>().ok()?)))
            .ok_or_else(|| format!("address {:?} is not host:port", cfg.address))?;
        let keep_alive = Config::duration(&cfg.keep_alive).max(Duration::from_secs(1));
        let transport = match cfg.tls {
            true => rumqttc::Transport::Tls(rumqttc::TlsConfiguration::Rustls(tls_config(cfg)?)),
            false => rumqttc::Transport::Tcp,
        };
        let id = cfg.remote_client_id();
        let cap = request_capacity(cfg);
        if matches!(cfg.version.as_str(), "5" | "5.0") {
            let mut o = rumqttc::v5::MqttOptions::new(id, host, port);
            o.set_clean_start(false)
                .set_session_expiry_interval(Some(
                    Config::duration(&cfg.session_expiry)
                        .as_secs()
                        .min(u64::from(u32::MAX)) as u32,
                ))
                .set_manual_acks(true)
                .set_keep_alive(keep_alive)
                .set_receive_maximum(Some(cfg.window))
                .set_max_packet_size(Some(MAX_REMOTE_PACKET))
                .set_request_channel_capacity(cap)
                .set_transport(transport);
            if !cfg.username.is_empty() {
                o.set_credentials(cfg.username.clone(), cfg.password.clone());
            }
            let (c, e) = rumqttc::v5::AsyncClient::new(o, cap);
            Ok((Client::V5(c), Events::V5(Box::new(e))))
        } else {
            let mut o = rumqttc::MqttOptions::new(id, host, port);
            o.set_clean_session(false)
                .set_manual_acks(true)
                .set_keep_alive(keep_alive)
                .set_max_packet_size(MAX_REMOTE_PACKET as usize, max_packet as usize)
                .set_request_channel_capacity(cap)
                .set_transport(transport);
            if !cfg.username.is_empty() {
                o.set_credentials(cfg.username.clone(), cfg.password.clone());
            }
            let (c, e) = rumqttc::AsyncClient::new(o, cap);
            Ok((Client::V4(c), Events::V4(Box::new(e))))
        }
    }
}

impl Events {
    /// The next event; an error means the connection is down (polling again reconnects).
    pub(super) async fn poll(&mut self) -> Result<Got, String> {
        match self {
            Events::V4(events) => {
                use rumqttc::{ConnectReturnCode, Event, Packet};
                match events.poll().await.map_err(|e| e.to_string())? {
                    Event::Incoming(Packet::ConnAck(c)) => match c.code {
                        ConnectReturnCode::Success => Ok(Got::Connected {
                            session_present: c.session_present,
                        }),
                        code => Err(format!("connection refused: {code:?}")),
                    },
                    Event::Incoming(Packet::Publish(p)) => Ok(Got::Message(Box::new(Received {
                        pkid: p.pkid,
                        qos: match p.qos {
                            rumqttc::QoS::AtMostOnce => QoS::AtMostOnce,
                            rumqttc::QoS::AtLeastOnce => QoS::AtLeastOnce,
                            rumqttc::QoS::ExactlyOnce => QoS::ExactlyOnce,
                        },
                        dup: p.dup,
                        retain: p.retain,
                        topic: p.topic.clone(),
                        payload: p.payload.clone(),
                        properties: None,
                        ack: Ack::V4(p),
                    }))),
                    _ => Ok(Got::Other),
                }
            }
            Events::V5(events) => {
                use rumqttc::v5::Event;
                use rumqttc::v5::mqttbytes::v5::{ConnectReturnCode, Packet};
                match events.poll().await.map_err(|e| e.to_string())? {
                    Event::Incoming(Packet::ConnAck(c)) => match c.code {
                        ConnectReturnCode::Success => Ok(Got::Connected {
                            session_present: c.session_present,
                        }),
                        code => Err(format!("connection refused: {code:?}")),
                    },
                    Event::Incoming(Packet::Publish(p)) => {
                        let topic = String::from_utf8(p.topic.to_vec())
                            .map_err(|_| "a topic that is not UTF-8".to_string())?;
                        Ok(Got::Message(Box::new(Received {
                            pkid: p.pkid,
                            qos: p.qos,
                            dup: p.dup,
                            retain: p.retain,
                            topic,
                            payload: p.payload.clone(),
                            properties: p.properties.clone(),
                            ack: Ack::V5(p),
                        })))
                    }
                    _ => Ok(Got::Other),
                }
            }
        }
    }
}

impl Client {
    /// Queues the PUBACK (or PUBREC) for a stored message.
    pub(super) fn ack(&self, r: &Received) -> Result<(), String> {
        match (self, &r.ack) {
            (Client::V4(c), Ack::V4(p)) => c.try_ack(p).map_err(|e| e.to_string()),
            (Client::V5(c), Ack::V5(p)) => c.try_ack(p).map_err(|e| e.to_string()),
            _ => Err("an ack of the other protocol version".into()),
        }
    }

    /// Queues a SUBSCRIBE for `filters`, at QoS 1 whatever the filter asks: rumqttc 0.25
    /// forgets QoS 2 packet ids when a connection drops, so a remote resending PUBREL on the
    /// resumed session would be refused on every reconnect (rumqtt issue 664) and the bridge
    /// would never recover. At QoS 1 a redelivery of a stored message is still recognised by
    /// its origin and not stored twice. MQTT 5 asks for retained messages only for new
    /// subscriptions, so a resubscription does not bring them again.
    pub(super) fn subscribe(&self, filters: &[(String, u8)]) -> Result<(), String> {
        match self {
            Client::V4(c) => {
                let f = filters.iter().map(|(f, _)| {
                    rumqttc::SubscribeFilter::new(f.clone(), rumqttc::QoS::AtLeastOnce)
                });
                c.try_subscribe_many(f).map_err(|e| e.to_string())
            }
            Client::V5(c) => {
                use rumqttc::v5::mqttbytes::v5::{Filter, RetainForwardRule};
                let f = filters.iter().map(|(f, _)| {
                    let mut filter = Filter::new(f.clone(), QoS::AtLeastOnce);
                    filter.retain_forward_rule = RetainForwardRule::OnNewSubscribe;
                    filter
                });
                c.try_subscribe_many(f).map_err(|e| e.to_string())
            }
        }
    }

    /// Queues a QoS 1 PUBLISH to the remote; `false` when the queue is full.
    pub(super) fn publish(&self, topic: &str, payload: Bytes, retain: bool) -> bool {
        match self {
            Client::V4(c) => c
                .try_publish(topic, rumqttc::QoS::AtLeastOnce, retain, payload)
                .is_ok(),
            Client::V5(c) => c
                .try_publish(topic, QoS::AtLeastOnce, retain, payload)
                .is_ok(),
        }
    }

    /// Queues a DISCONNECT (the remote keeps the session).
    pub(super) fn disconnect(&self) {
        let _ = match self {
            Client::V4(c) => c.try_disconnect().map_err(|e| e.to_string()),
            Client::V5(c) => c.try_disconnect().map_err(|e| e.to_string()),
        };
    }
}

/// rustls client settings: the CA file's certificates, or the system's roots.
fn tls_config(cfg: &BridgeConfig) -> Result<Arc<tokio_rustls::rustls::ClientConfig>, String> {
    use rustls_pki_types::CertificateDer;
    use rustls_pki_types::pem::PemObject;
    let mut roots = tokio_rustls::rustls::RootCertStore::empty();
    if cfg.tls_ca.is_empty() {
        let found = rustls_native_certs::load_native_certs();
        for cert in found.certs {
            let _ = roots.add(cert);
        }
    } else {
        let certs = CertificateDer::pem_file_iter(&cfg.tls_ca)
            .and_then(|it| it.collect::<Result<Vec<_>, _>>())
            .map_err(|e| format!("reading {}: {e}", cfg.tls_ca))?;
        for cert in certs {
            roots
                .add(cert)
                .map_err(|e| format!("a certificate in {}: {e}", cfg.tls_ca))?;
        }
    }
    if roots.is_empty() {
        return Err("no CA certificates to check the remote broker with (set tls_ca)".into());
    }
    let provider = Arc::new(tokio_rustls::rustls::crypto::ring::default_provider());
    let config = tokio_rustls::rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(config))
}
