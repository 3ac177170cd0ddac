//! One client connection: the CONNECT handshake, then a reader (this task) and a writer task.
//!
//! The reader decodes packets and handles them in arrival order. A PUBLISH becomes a future
//! in `pending` (store in the table, then route to subscribers); those complete in order, and
//! only then is its PUBACK/PUBREC handed to the writer, so acks are durable and ordered. At
//! most `receive_maximum` publishes are pending; past that the reader stops reading, which
//! slows the client through TCP. The writer owns the socket's write half: it sends control
//! packets (acks, SUBACK, PINGRESP) first, then the session's queued messages within the
//! client's receive maximum.

use crate::Shared;
use crate::auth::Action;
use crate::codec::{self, Version};
use crate::error::{self, Error, Result};
use crate::router::min_qos;
use crate::session::{Delivery, Message, Outgoing, Session, SubOptions};
use crate::topic;
use bytes::{Bytes, BytesMut};
use futures::stream::{FuturesOrdered, StreamExt};
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::mqttbytes::v5::*;
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a closing connection's writer may take to flush before it is abandoned.
const WRITER_GRACE: Duration = Duration::from_secs(5);

/// A pending publish (or PUBREL): the ack to send once it completes, and the message to
/// route then. Completed in arrival order, so a client's messages are routed in order.
type Ack = Pin<Box<dyn Future<Output = (Option<Packet>, Option<Arc<Message>>)> + Send>>;

/// Serves one connection until it ends.
pub(crate) async fn serve<S>(shared: Arc<Shared>, stream: S, peer: std::net::SocketAddr)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (mut rd, mut wr) = tokio::io::split(stream);
    let mut buf = BytesMut::with_capacity(8 * 1024);
    let first = tokio::time::timeout(
        CONNECT_TIMEOUT,
        read_connect(&shared, &mut rd, &mut wr, &mut buf),
    )
    .await;
    let (version, packet) = match first {
        Ok(Ok(Some(x))) => x,
        Ok(Ok(None)) => return,
        Ok(Err(e)) => {
            tracing::debug!(%peer, error = %e, "connection refused before CONNECT");
            return;
        }
        Err(_) => {
            tracing::debug!(%peer, "no CONNECT in time");
            return;
        }
    };
    let Packet::Connect(connect, will, login) = packet else {
        return;
    };
    let user = match shared.auth.login(login, Some(&*shared.db)).await {
        Ok(user) => user,
        Err(code) => {
            tracing::warn!(%peer, client_id = %connect.client_id, ?code, "connection refused: authentication failed");
            let _ = send_connack(&mut wr, version, code, false, None).await;
            return;
        }
    };
    let current = shared.metrics.connections.fetch_add(1, Ordering::AcqRel) + 1;
    if current > shared.config.max_connections as u64 {
        shared.metrics.connections.fetch_sub(1, Ordering::AcqRel);
        tracing::warn!(%peer, max = shared.config.max_connections, "connection refused: too many connections");
        let _ = send_connack(
            &mut wr,
            version,
            ConnectReturnCode::QuotaExceeded,
            false,
            None,
        )
        .await;
        return;
    }
    shared
        .metrics
        .connections_total
        .fetch_add(1, Ordering::Relaxed);
    let r = run(&shared, version, connect, will, user, rd, wr, buf, peer).await;
    shared.metrics.connections.fetch_sub(1, Ordering::AcqRel);
    if let Err(e) = r {
        tracing::debug!(%peer, error = %e, "connection closed");
    }
}

async fn read_connect<R, W>(
    shared: &Shared,
    rd: &mut R,
    wr: &mut W,
    buf: &mut BytesMut,
) -> Result<Option<(Version, Packet)>>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let max = shared.config.max_packet_size;
    loop {
        if let Some((version, level)) = codec::connect_version(buf, max)? {
            if level != 4 && level != 5 {
                tracing::debug!(level, "unsupported MQTT protocol level");
                send_connack(
                    wr,
                    Version::V4,
                    ConnectReturnCode::UnsupportedProtocolVersion,
                    false,
                    None,
                )
                .await?;
                return Ok(None);
            }
            return match codec::read(version, buf, max) {
                Ok(Some(p)) => Ok(Some((version, p))),
                Ok(None) => Err(Error::Malformed("incomplete CONNECT".into())),
                Err(e) => {
                    if version == Version::V5 {
                        let code = match e {
                            Error::PacketTooLarge { .. } => ConnectReturnCode::PacketTooLarge,
                            _ => ConnectReturnCode::MalformedPacket,
                        };
                        let _ = send_connack(wr, version, code, false, None).await;
                    }
                    Err(e)
                }
            };
        }
        if rd.read_buf(buf).await? == 0 {
            return Ok(None);
        }
    }
}

async fn send_connack<W: AsyncWrite + Unpin>(
    wr: &mut W,
    version: Version,
    code: ConnectReturnCode,
    session_present: bool,
    properties: Option<ConnAckProperties>,
) -> Result<()> {
    let mut out = BytesMut::new();
    codec::write(
        version,
        &Packet::ConnAck(ConnAck {
            session_present,
            code,
            properties,
        }),
        &mut out,
    )?;
    wr.write_all(&out).await?;
    wr.flush().await?;
    Ok(())
}

/// What a connection knows about its client.
struct Client {
    version: Version,
    id: Arc<str>,
    session: Arc<Session>,
    ctrl: mpsc::UnboundedSender<Packet>,
    aliases: HashMap<u16, Arc<str>>,
    will: Option<LastWill>,
    user: Option<Arc<str>>,
    /// QoS 1/2 publishes received and not yet acknowledged (bounded by receive maximum).
    unacked: usize,
    /// Whether reason strings may be sent (MQTT 5 request problem information).
    problem_info: bool,
}

#[allow(clippy::too_many_arguments)]
async fn run<R, W>(
    shared: &Arc<Shared>,
    version: Version,
    connect: Connect,
    will: Option<LastWill>,
    user: Option<Arc<str>>,
    mut rd: R,
    mut wr: W,
    mut buf: BytesMut,
    peer: std::net::SocketAddr,
) -> Result<()>
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let cfg = &shared.config;
    let conn = shared.next_conn.fetch_add(1, Ordering::Relaxed);
    let props = connect.properties.clone().unwrap_or_default();
    let bad_connect = if props.receive_maximum == Some(0) {
        Some("receive maximum 0")
    } else if props.max_packet_size == Some(0) {
        Some("maximum packet size 0")
    } else if will
        .as_ref()
        .is_some_and(|w| std::str::from_utf8(&w.topic).map_or(true, |t| !topic::valid_name(t)))
    {
        Some("invalid will topic")
    } else {
        None
    };
    if let Some(why) = bad_connect {
        let code = match version {
            Version::V5 => ConnectReturnCode::ProtocolError,
            Version::V4 => ConnectReturnCode::ServiceUnavailable,
        };
        send_connack(&mut wr, version, code, false, None).await?;
        return Err(Error::Protocol(why.into()));
    }
    let problem_info = props.request_problem_info != Some(0);
    let mut assigned = None;
    let client_id: Arc<str> = if connect.client_id.is_empty() {
        if version == Version::V4 && !connect.clean_start {
            send_connack(
                &mut wr,
                version,
                ConnectReturnCode::ClientIdentifierNotValid,
                false,
                None,
            )
            .await?;
            return Err(Error::Protocol(
                "empty client id needs a clean session".into(),
            ));
        }
        // Unique across restarts (restored sessions keep their ids) and unlikely to be chosen
        // by a client: the connection number and the start time in nanoseconds.
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let id = format!("sluice-{conn}-{nanos:x}");
        assigned = Some(id.clone());
        Arc::from(id)
    } else {
        Arc::from(connect.client_id.as_str())
    };
    let max_expiry = u32::try_from(shared.max_session_expiry.as_secs()).unwrap_or(u32::MAX);
    let asked_expiry = match version {
        Version::V5 => props.session_expiry_interval.unwrap_or(0),
        Version::V4 if connect.clean_start => 0,
        Version::V4 => u32::MAX,
    };
    let expiry = asked_expiry.min(max_expiry);
    let key: Arc<str> = if cfg.shared_client_ids {
        Arc::from(format!("{client_id}#{conn}"))
    } else {
        client_id.clone()
    };
    let cancel = shared.shutdown.child_token();
    let (session, present, generation) = shared.router.attach(
        &key,
        connect.clean_start || cfg.shared_client_ids,
        expiry,
        conn,
        cancel.clone(),
    );
    let connack_props = (version == Version::V5).then(|| ConnAckProperties {
        session_expiry_interval: (expiry != asked_expiry).then_some(expiry),
        receive_max: Some(cfg.receive_maximum),
        max_packet_size: Some(cfg.max_packet_size),
        assigned_client_identifier: assigned,
        topic_alias_max: Some(cfg.topic_alias_maximum),
        retain_available: Some(1),
        wildcard_subscription_available: Some(1),
        subscription_identifiers_available: Some(1),
        shared_subscription_available: Some(1),
        max_qos: None,
        user_properties: Vec::new(),
        reason_string: None,
        server_keep_alive: None,
        response_information: None,
        server_reference: None,
        authentication_method: None,
        authentication_data: None,
    });
    send_connack(
        &mut wr,
        version,
        ConnectReturnCode::Success,
        present,
        connack_props,
    )
    .await?;
    tracing::debug!(%peer, client_id = %client_id, ?version, present, "client connected");

    let (ctrl, ctrl_rx) = mpsc::unbounded_channel();
    let window = usize::from(
        props
            .receive_maximum
            .unwrap_or(u16::MAX)
            .min(cfg.max_inflight)
            .max(1),
    );
    let writer = tokio::spawn(write_loop(
        shared.clone(),
        wr,
        WriterState {
            version,
            session: session.clone(),
            window,
            max_packet: props
                .max_packet_size
                .map(|m| m as usize)
                .unwrap_or(usize::MAX),
            alias_max: props.topic_alias_max.unwrap_or(0),
            aliases: HashMap::new(),
        },
        ctrl_rx,
        cancel.clone(),
        present,
    ));
    let mut client = Client {
        version,
        id: key.clone(),
        session: session.clone(),

        ctrl,
        aliases: HashMap::new(),
        will,
        user,
        unacked: 0,
        problem_info,
    };
    let keep_alive = Duration::from_secs(u64::from(connect.keep_alive)) * 3 / 2;
    let mut deadline = tokio::time::Instant::now() + keep_alive;
    let mut pending: FuturesOrdered<Ack> = FuturesOrdered::new();
    // 3.1.1 clients are held to the receive maximum by not reading further; MQTT 5 clients
    // were told it in CONNACK, so reading goes on a little further to catch a client that
    // exceeds it (DISCONNECT 0x93) rather than silently stalling it.
    let cap = match version {
        Version::V4 => usize::from(cfg.receive_maximum),
        Version::V5 => 2 * usize::from(cfg.receive_maximum),
    };
    let max = cfg.max_packet_size;
    let result: Result<()> = async {
        loop {
            while pending.len() < cap {
                match codec::read(version, &mut buf, max)? {
                    Some(p) => {
                        shared.metrics.packets_in.fetch_add(1, Ordering::Relaxed);
                        if handle(shared, &mut client, p, &mut pending).await? {
                            return Ok(());
                        }
                    }
                    None => break,
                }
            }
            // Checked here, cheaply, so a busy connection that was taken over stops at once;
            // the select below only waits on it when idle.
            if cancel.is_cancelled() {
                return Ok(());
            }
            // While this side stops reading (the client's window is full of messages still
            // being stored, which may wait for room in the buffers), the client's silence
            // proves nothing: its keep-alive counts again from when reading resumes.
            let reading = pending.len() < cap;
            if !reading {
                deadline = tokio::time::Instant::now() + keep_alive;
            }
            tokio::select! {
                biased;
                Some((ack, routed)) = pending.next(), if !pending.is_empty() => {
                    if let Some(p) = ack {
                        if matches!(p, Packet::PubAck(_) | Packet::PubRec(_)) {
                            client.unacked = client.unacked.saturating_sub(1);
                        }
                        let _ = client.ctrl.send(p);
                    }
                    // May wait for room in a slow subscriber's queue: the reader then stops
                    // reading, which slows this publisher.
                    if let Some(m) = routed {
                        crate::ingest::route(shared, &m).await;
                    }
                }
                r = rd.read_buf(&mut buf), if pending.len() < cap => {
                    let n = r?;
                    if n == 0 {
                        return Ok(());
                    }
                    shared.metrics.bytes_in.fetch_add(n as u64, Ordering::Relaxed);
                    deadline = tokio::time::Instant::now() + keep_alive;
                }
                _ = tokio::time::sleep_until(deadline), if !keep_alive.is_zero() && reading => {
                    return Err(Error::KeepAlive);
                }
                _ = cancel.cancelled() => return Ok(()),
            }
        }
    }
    .await;
    // Stored messages still waiting for the log finish (and are routed) even though their
    // acks can no longer be sent.
    while let Some((_, routed)) = pending.next().await {
        if let Some(m) = routed {
            crate::ingest::route(shared, &m).await;
        }
    }
    if let Err(e) = &result
        && version == Version::V5
    {
        let reason = e.disconnect_reason();
        let _ = client.ctrl.send(Packet::Disconnect(Disconnect {
            reason_code: reason,
            properties: None,
        }));
    }
    drop(client.ctrl);
    // A peer that stopped reading must not hold the session (and its will) for as long as
    // TCP takes to give up.
    let abort = writer.abort_handle();
    if tokio::time::timeout(WRITER_GRACE, writer).await.is_err() {
        abort.abort();
    }
    let still_ours = session.detach(conn);
    // The will is gone after a normal DISCONNECT; any other end publishes it.
    if let Some(w) = client.will.take() {
        publish_will(shared, &session, w, client.user.clone(), generation, expiry);
    }
    if still_ours && session.state.lock().expiry_secs == 0 {
        shared.router.discard(&session);
    }
    result
}

/// Handles one packet; returns true on a DISCONNECT (which ends the connection).
async fn handle(
    shared: &Arc<Shared>,
    client: &mut Client,
    packet: Packet,
    pending: &mut FuturesOrdered<Ack>,
) -> Result<bool> {
    match packet {
        Packet::Publish(p) => on_publish(shared, client, p, pending)?,
        Packet::PubAck(a) => {
            let mut st = client.session.state.lock();
            if matches!(st.inflight.get(&a.pkid), Some(Outgoing::Published(_))) {
                st.inflight.remove(&a.pkid);
            }
            drop(st);
            client.session.wake_writer.notify_one();
        }
        Packet::PubRec(r) => {
            let known = {
                let mut st = client.session.state.lock();
                let known = st.inflight.contains_key(&r.pkid);
                if known {
                    if (r.reason as u8) >= 0x80 {
                        st.inflight.remove(&r.pkid);
                    } else {
                        st.inflight.insert(r.pkid, Outgoing::Released);
                    }
                }
                known && (r.reason as u8) < 0x80
            };
            if known {
                let _ = client.ctrl.send(Packet::PubRel(PubRel {
                    pkid: r.pkid,
                    reason: PubRelReason::Success,
                    properties: None,
                }));
            } else {
                client.session.wake_writer.notify_one();
            }
        }
        Packet::PubComp(c) => {
            client.session.state.lock().inflight.remove(&c.pkid);
            client.session.wake_writer.notify_one();
        }
        Packet::PubRel(r) => {
            let found = client.session.state.lock().incoming_qos2.remove(&r.pkid);
            let pkid = r.pkid;
            // After the PUBREC of the same id, which may still be pending.
            pending.push_back(Box::pin(async move {
                let comp = Packet::PubComp(PubComp {
                    pkid,
                    reason: if found {
                        PubCompReason::Success
                    } else {
                        PubCompReason::PacketIdentifierNotFound
                    },
                    properties: None,
                });
                (Some(comp), None)
            }));
        }
        Packet::Subscribe(s) => on_subscribe(shared, client, s).await?,
        Packet::Unsubscribe(u) => {
            let reasons = u
                .filters
                .iter()
                .map(|f| match shared.router.unsubscribe(&client.session, f) {
                    true => UnsubAckReason::Success,
                    false => UnsubAckReason::NoSubscriptionExisted,
                })
                .collect();
            let _ = client.ctrl.send(Packet::UnsubAck(UnsubAck {
                pkid: u.pkid,
                reasons,
                properties: None,
            }));
        }
        Packet::PingReq(_) => {
            let _ = client.ctrl.send(Packet::PingResp(PingResp));
        }
        Packet::Disconnect(d) => {
            if let Some(secs) = d.properties.and_then(|p| p.session_expiry_interval) {
                let mut st = client.session.state.lock();
                if st.expiry_secs == 0 && secs != 0 {
                    return Err(Error::Protocol(
                        "session expiry set at DISCONNECT after 0 at CONNECT".into(),
                    ));
                }
                let max = u32::try_from(shared.max_session_expiry.as_secs()).unwrap_or(u32::MAX);
                st.expiry_secs = secs.min(max);
            }
            // Only a normal disconnection (0x00) deletes the will.
            if d.reason_code == DisconnectReasonCode::NormalDisconnection {
                client.will = None;
            }
            return Ok(true);
        }
        Packet::Connect(..) => return Err(Error::Protocol("second CONNECT".into())),
        Packet::Auth(_) => return Err(Error::Protocol("AUTH is not supported".into())),
        other => {
            return Err(Error::Protocol(format!(
                "a client may not send {:?}",
                std::mem::discriminant(&other)
            )));
        }
    }
    Ok(false)
}

fn on_publish(
    shared: &Arc<Shared>,
    client: &mut Client,
    mut p: Publish,
    pending: &mut FuturesOrdered<Ack>,
) -> Result<()> {
    shared.metrics.messages_in.fetch_add(1, Ordering::Relaxed);
    if p.qos != QoS::AtMostOnce {
        if client.unacked >= usize::from(shared.config.receive_maximum) {
            return Err(Error::ReceiveMaximum(shared.config.receive_maximum));
        }
        client.unacked += 1;
    }
    let mut props = p.properties.take();
    let topic: Arc<str> = match props.as_mut().and_then(|pr| pr.topic_alias.take()) {
        Some(alias) => {
            if alias == 0 || alias > shared.config.topic_alias_maximum {
                return Err(Error::TopicAlias(format!("alias {alias}")));
            }
            if p.topic.is_empty() {
                client
                    .aliases
                    .get(&alias)
                    .cloned()
                    .ok_or_else(|| Error::TopicAlias(format!("alias {alias} was never set")))?
            } else {
                let t: Arc<str> = Arc::from(utf8_topic(&p.topic)?);
                client.aliases.insert(alias, t.clone());
                t
            }
        }
        None => Arc::from(utf8_topic(&p.topic)?),
    };
    if !topic::valid_name(&topic) {
        return Err(Error::Protocol(format!("invalid topic name {topic:?}")));
    }
    if p.qos == QoS::ExactlyOnce && !client.session.state.lock().incoming_qos2.insert(p.pkid) {
        // A resent QoS 2 message already stored: acknowledge again, store nothing.
        let pkid = p.pkid;
        pending.push_back(Box::pin(async move {
            let rec = Packet::PubRec(PubRec {
                pkid,
                reason: PubRecReason::Success,
                properties: None,
            });
            (Some(rec), None)
        }));
        return Ok(());
    }
    if props
        .as_ref()
        .is_some_and(|pr| !pr.subscription_identifiers.is_empty())
    {
        return Err(Error::Protocol(
            "a PUBLISH from a client may not carry subscription identifiers".into(),
        ));
    }
    let expires = props
        .as_ref()
        .and_then(|pr| pr.message_expiry_interval)
        .map(|s| Instant::now() + Duration::from_secs(u64::from(s)));
    let message = Arc::new(Message {
        topic,
        payload: p.payload,
        qos: p.qos,
        retain: p.retain,
        properties: props,
        expires,
        origin: client.id.clone(),
    });
    let (qos, pkid, version) = (p.qos, p.pkid, client.version);
    let problem_info = client.problem_info;
    let shared = shared.clone();
    let session = client.session.clone();
    let started = Instant::now();
    let user = client.user.clone();
    pending.push_back(Box::pin(async move {
        let (reason, text) = crate::ingest::store_rows(&shared, &message, user.as_deref()).await;
        shared.metrics.observe_ack(started.elapsed());
        let failed = error::reason_code(reason) >= 0x80;
        let text = text.filter(|_| problem_info);
        let properties = (version == Version::V5 && text.is_some()).then(|| PubAckProperties {
            reason_string: text,
            user_properties: Vec::new(),
        });
        let ack = match qos {
            QoS::AtMostOnce => None,
            QoS::AtLeastOnce => Some(Packet::PubAck(PubAck {
                pkid,
                reason,
                properties,
            })),
            QoS::ExactlyOnce => {
                if failed {
                    session.state.lock().incoming_qos2.remove(&pkid);
                }
                Some(Packet::PubRec(PubRec {
                    pkid,
                    reason: pubrec_reason(reason),
                    properties: properties.map(|p| PubRecProperties {
                        reason_string: p.reason_string,
                        user_properties: p.user_properties,
                    }),
                }))
            }
        };
        (ack, (!failed).then_some(message))
    }));
    Ok(())
}

fn utf8_topic(b: &Bytes) -> Result<&str> {
    std::str::from_utf8(b).map_err(|_| Error::Malformed("topic is not UTF-8".into()))
}

fn pubrec_reason(r: PubAckReason) -> PubRecReason {
    match r {
        PubAckReason::Success => PubRecReason::Success,
        PubAckReason::NoMatchingSubscribers => PubRecReason::NoMatchingSubscribers,
        PubAckReason::UnspecifiedError => PubRecReason::UnspecifiedError,
        PubAckReason::ImplementationSpecificError => PubRecReason::ImplementationSpecificError,
        PubAckReason::NotAuthorized => PubRecReason::NotAuthorized,
        PubAckReason::TopicNameInvalid => PubRecReason::TopicNameInvalid,
        PubAckReason::PacketIdentifierInUse => PubRecReason::PacketIdentifierInUse,
        PubAckReason::QuotaExceeded => PubRecReason::QuotaExceeded,
        PubAckReason::PayloadFormatInvalid => PubRecReason::PayloadFormatInvalid,
    }
}

async fn on_subscribe(shared: &Arc<Shared>, client: &mut Client, s: Subscribe) -> Result<()> {
    let id = s.properties.as_ref().and_then(|p| p.id);
    if id == Some(0) {
        return Err(Error::Protocol("subscription identifier 0".into()));
    }
    let mut codes = Vec::with_capacity(s.filters.len());
    let mut retained = Vec::new();
    for f in &s.filters {
        let shared_sub = topic::parse_shared(&f.path);
        let plain = shared_sub.map(|(_, f)| f).unwrap_or(&f.path);
        let group_ok = shared_sub.is_none_or(|(g, _)| !g.is_empty() && !g.contains(['+', '#']));
        if !topic::valid_filter(plain)
            || !group_ok
            || (f.path.starts_with("$share") && shared_sub.is_none())
        {
            codes.push(SubscribeReasonCode::TopicFilterInvalid);
            continue;
        }
        if shared_sub.is_some() && f.nolocal {
            return Err(Error::Protocol("no local on a shared subscription".into()));
        }
        if !shared
            .auth
            .allowed(client.user.as_deref(), Action::Subscribe, plain)
        {
            tracing::info!(client_id = %client.id, filter = %f.path, "subscription refused by the ACL");
            codes.push(SubscribeReasonCode::NotAuthorized);
            continue;
        }
        let options = SubOptions {
            qos: f.qos,
            no_local: f.nolocal,
            retain_as_published: f.preserve_retain,
            id,
        };
        let existed = shared.router.subscribe(&client.session, &f.path, options);
        codes.push(SubscribeReasonCode::Success(f.qos));
        let send_retained = shared_sub.is_none()
            && match f.retain_forward_rule {
                RetainForwardRule::OnEverySubscribe => true,
                RetainForwardRule::OnNewSubscribe => !existed,
                RetainForwardRule::Never => false,
            };
        if send_retained {
            for m in shared.router.retained_matching(plain) {
                retained.push(Delivery {
                    qos: min_qos(m.qos, f.qos),
                    message: m,
                    retain: true,
                    subscription_ids: id.into_iter().collect(),
                });
            }
        }
    }
    let _ = client.ctrl.send(Packet::SubAck(SubAck {
        pkid: s.pkid,
        return_codes: codes,
        properties: None,
    }));
    for d in retained {
        client.session.enqueue(d, false).await;
    }
    Ok(())
}

fn publish_will(
    shared: &Arc<Shared>,
    session: &Arc<Session>,
    will: LastWill,
    user: Option<Arc<str>>,
    generation: u64,
    expiry: u32,
) {
    let delay = will
        .properties
        .as_ref()
        .and_then(|p| p.delay_interval)
        .unwrap_or(0)
        .min(expiry);
    let Ok(topic) = std::str::from_utf8(&will.topic) else {
        return;
    };
    let props = will.properties.map(|p| PublishProperties {
        payload_format_indicator: p.payload_format_indicator,
        message_expiry_interval: p.message_expiry_interval,
        topic_alias: None,
        response_topic: p.response_topic,
        correlation_data: p.correlation_data,
        user_properties: p.user_properties,
        subscription_identifiers: Vec::new(),
        content_type: p.content_type,
    });
    let expires = props
        .as_ref()
        .and_then(|p| p.message_expiry_interval)
        .map(|s| Instant::now() + Duration::from_secs(u64::from(s)));
    let message = Arc::new(Message {
        topic: Arc::from(topic),
        payload: will.message,
        qos: will.qos,
        retain: will.retain,
        properties: props,
        expires,
        origin: session.client_id.clone(),
    });
    let shared = shared.clone();
    let session = session.clone();
    tokio::spawn(async move {
        if delay > 0 {
            tokio::time::sleep(Duration::from_secs(u64::from(delay))).await;
            if session.generation.load(Ordering::Acquire) != generation {
                return; // The client came back in time.
            }
        }
        let (reason, _) = crate::ingest::store(shared, message, user).await;
        tracing::debug!(client_id = %session.client_id, reason = error::reason_code(reason), "will published");
    });
}

struct WriterState {
    version: Version,
    session: Arc<Session>,
    window: usize,
    max_packet: usize,
    alias_max: u16,
    aliases: HashMap<Arc<str>, u16>,
}

async fn write_loop<W: AsyncWrite + Unpin>(
    shared: Arc<Shared>,
    mut wr: W,
    mut st: WriterState,
    mut ctrl: mpsc::UnboundedReceiver<Packet>,
    cancel: CancellationToken,
    resend: bool,
) {
    let mut out = BytesMut::with_capacity(16 * 1024);
    if resend {
        let again: Vec<(u16, Outgoing)> = st
            .session
            .state
            .lock()
            .inflight
            .iter()
            .map(|(k, v)| (*k, v.clone()))
            .collect();
        for (pkid, o) in again {
            let p = match o {
                Outgoing::Published(d) => publish_packet(&mut st, &d, pkid, true).0,
                Outgoing::Released => Packet::PubRel(PubRel {
                    pkid,
                    reason: PubRelReason::Success,
                    properties: None,
                }),
            };
            let _ = codec::write(st.version, &p, &mut out);
        }
    }
    let mut closing = false;
    loop {
        // Control packets first, then queued messages within the window.
        loop {
            match ctrl.try_recv() {
                Ok(p) => {
                    closing |= matches!(p, Packet::Disconnect(_));
                    let _ = codec::write(st.version, &p, &mut out);
                }
                Err(mpsc::error::TryRecvError::Empty) => break,
                Err(mpsc::error::TryRecvError::Disconnected) => {
                    closing = true;
                    break;
                }
            }
        }
        // A connection taken over must not take messages meant for its successor.
        if !closing && !cancel.is_cancelled() {
            fill(&shared, &mut st, &mut out);
        }
        if !out.is_empty() {
            shared
                .metrics
                .bytes_out
                .fetch_add(out.len() as u64, Ordering::Relaxed);
            if wr.write_all(&out).await.is_err() {
                return;
            }
            out.clear();
            if wr.flush().await.is_err() {
                return;
            }
        }
        if closing {
            let _ = wr.shutdown().await;
            return;
        }
        tokio::select! {
            biased;
            _ = cancel.cancelled() => {
                if st.version == Version::V5 {
                    let reason = if shared.shutdown.is_cancelled() {
                        DisconnectReasonCode::ServerShuttingDown
                    } else {
                        DisconnectReasonCode::SessionTakenOver
                    };
                    let _ = codec::write(st.version, &Packet::Disconnect(Disconnect { reason_code: reason, properties: None }), &mut out);
                    let _ = wr.write_all(&out).await;
                }
                let _ = wr.shutdown().await;
                return;
            }
            p = ctrl.recv() => match p {
                Some(p) => {
                    closing |= matches!(p, Packet::Disconnect(_));
                    let _ = codec::write(st.version, &p, &mut out);
                }
                None => closing = true,
            },
            _ = st.session.wake_writer.notified() => {}
        }
    }
}

/// Moves queued messages into `out` while the client's receive window has room.
fn fill(shared: &Shared, st: &mut WriterState, out: &mut BytesMut) {
    loop {
        let room = st
            .window
            .saturating_sub(st.session.state.lock().inflight.len());
        if room == 0 {
            return;
        }
        let batch = st.session.take(room.min(256));
        if batch.is_empty() {
            return;
        }
        for d in batch {
            let pkid = if d.qos == QoS::AtMostOnce {
                0
            } else {
                let mut s = st.session.state.lock();
                let Some(pkid) = s.next_pkid() else { return };
                s.inflight.insert(pkid, Outgoing::Published(d.clone()));
                pkid
            };
            let (p, new_alias) = publish_packet(st, &d, pkid, false);
            if p.size() > st.max_packet {
                // The client cannot take it (MQTT 5 maximum packet size): it is not sent,
                // and neither is the alias it would have set up.
                if new_alias {
                    st.aliases.remove(&d.message.topic);
                }
                st.session.state.lock().inflight.remove(&pkid);
                tracing::debug!(client_id = %st.session.client_id, size = p.size(), "message larger than the client's maximum packet size not sent");
                continue;
            }
            shared.metrics.messages_out.fetch_add(1, Ordering::Relaxed);
            let _ = codec::write(st.version, &p, out);
        }
    }
}

/// The PUBLISH for `d`, and whether it set up a new outgoing topic alias.
fn publish_packet(st: &mut WriterState, d: &Delivery, pkid: u16, dup: bool) -> (Packet, bool) {
    let m = &d.message;
    let mut properties = m.properties.clone();
    if st.version == Version::V5 {
        let props = properties.get_or_insert_with(PublishProperties::default);
        props.subscription_identifiers = d.subscription_ids.clone();
        if let Some(e) = m.expires {
            props.message_expiry_interval =
                Some(e.saturating_duration_since(Instant::now()).as_secs().max(1) as u32);
        }
    }
    let mut topic = Bytes::copy_from_slice(m.topic.as_bytes());
    let mut new_alias = false;
    if st.version == Version::V5 && st.alias_max > 0 {
        let props = properties.get_or_insert_with(PublishProperties::default);
        match st.aliases.get(&m.topic) {
            Some(a) => {
                props.topic_alias = Some(*a);
                topic = Bytes::new();
            }
            None if st.aliases.len() < usize::from(st.alias_max) => {
                let a = st.aliases.len() as u16 + 1;
                st.aliases.insert(m.topic.clone(), a);
                props.topic_alias = Some(a);
                new_alias = true;
            }
            None => {}
        }
    }
    if properties
        .as_ref()
        .is_some_and(|p| *p == PublishProperties::default())
    {
        properties = None;
    }
    let p = Packet::Publish(Publish {
        dup,
        qos: d.qos,
        retain: d.retain,
        topic,
        pkid,
        payload: m.payload.clone(),
        properties,
    });
    (p, new_alias)
}
