//! One client connection: the CONNECT handshake, then one task that reads, handles and writes.
//!
//! Packets are decoded and handled in arrival order. A PUBLISH becomes a future in `pending`
//! (store in the table, then route to subscribers); those complete in order, and only then
//! is its PUBACK/PUBREC encoded into the outgoing buffer, so acks are durable and ordered.
//! At most `receive_maximum` publishes are pending; past that the task stops reading, which
//! slows the client through TCP. Control packets (acks, SUBACK, PINGRESP) are encoded as
//! they arise; the session's queued messages follow within the client's receive maximum
//! ([`outbound`]). The same task writes the buffer out as the socket takes it: no task or
//! channel between a stored message and its PUBACK. Reads land in a buffer of the worker
//! thread's and are copied out, so an idle connection holds no buffer at all.

mod connect;
mod inbound;
mod outbound;
mod socket;
mod will;
pub(crate) use will::{publish_kept_will, publish_replayed_wills};

use crate::BrokerState;
use crate::codec::{self, Version};
use crate::error::{Error, Result};
use crate::journal::{self, Record};
use crate::session::{Message, Session};
use crate::topic;
use bytes::BytesMut;
use connect::{read_connect, send_connack};
use futures::FutureExt;
use futures::stream::{FuturesOrdered, StreamExt};
use inbound::{handle, on_publish};
use outbound::{Outbound, fill, resend, resend_given};
use rumqttc::v5::mqttbytes::v5::*;
pub(super) use socket::read_scratch;
use socket::{write_some, wrote};
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use will::publish_will;

const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a closing connection may take to write what it still has before it is dropped.
const WRITER_GRACE: Duration = Duration::from_secs(5);

/// A pending publish (or PUBREL, or PUBREC of a message in the journal): the packet to send
/// once it completes, and the message to route then with its targets (a message in the
/// journal was queued by its record). Completed in arrival order, so a client's messages
/// are routed in order.
type Ack = Pin<Box<dyn Future<Output = (Option<Packet>, Option<Routed>)> + Send>>;

/// A stored message, the sessions it goes to from here (those not queued by its journal
/// record), and whether it is in the journal.
type Routed = (Arc<Message>, Vec<crate::router::Target>, bool);

/// Messages sent to a lasting session wait for the journal record of their packet ids
/// before they go out (so that after a crash they are sent again with the same ids).
type Sending = Pin<Box<dyn Future<Output = sluice_engine::Result<u64>> + Send>>;

/// Serves one connection until it ends.
pub(crate) async fn serve<S>(
    shared: Arc<BrokerState>,
    stream: S,
    peer: std::net::SocketAddr,
    ident: Option<Arc<str>>,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    // A plain TCP stream writes straight to the socket: nothing waits for a flush there
    // (TLS and WebSocket writers keep bytes back until flushed).
    let buffered = std::any::TypeId::of::<S>() != std::any::TypeId::of::<tokio::net::TcpStream>();
    let (mut rd, mut wr) = tokio::io::split(stream);
    let mut buf = BytesMut::new();
    // The handshake runs boxed, and what it leaves is boxed: held only while needed, its
    // state does not make every connection's task (what an idle connection costs) larger.
    let Some(hello) = Box::pin(handshake(
        &shared,
        &mut rd,
        &mut wr,
        &mut buf,
        (peer, ident),
    ))
    .await
    else {
        return;
    };
    let r = run(&shared, hello, (rd, wr, buffered), buf, peer).await;
    shared.metrics.connections.fetch_sub(1, Ordering::AcqRel);
    if let Err(e) = r {
        tracing::debug!(%peer, error = %e, "connection closed");
    }
}

/// What the handshake learnt: the client's CONNECT and who logged in.
struct Hello {
    version: Version,
    connect: Connect,
    will: Option<LastWill>,
    user: Option<Arc<str>>,
}

/// Reads the CONNECT, logs the client in and counts the connection (refusing it past
/// `mqtt.max_connections`); `None` when the connection ends here.
async fn handshake<R, W>(
    shared: &BrokerState,
    rd: &mut R,
    wr: &mut W,
    buf: &mut BytesMut,
    (peer, ident): (std::net::SocketAddr, Option<Arc<str>>),
) -> Option<Box<Hello>>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let first = tokio::time::timeout(CONNECT_TIMEOUT, read_connect(shared, rd, wr, buf)).await;
    let (version, packet) = match first {
        Ok(Ok(Some(x))) => x,
        Ok(Ok(None)) => return None,
        Ok(Err(e)) => {
            tracing::debug!(%peer, error = %e, "connection refused before CONNECT");
            return None;
        }
        Err(_) => {
            tracing::debug!(%peer, "no CONNECT in time");
            return None;
        }
    };
    let Packet::Connect(connect, will, login) = packet else {
        return None;
    };
    // A verified client certificate names the user; otherwise the CONNECT's credentials.
    let logged_in = match ident {
        Some(user) => Ok(Some(user)),
        None => crate::auth::login(login, shared.db.as_ref(), peer.ip()).await,
    };
    let user = match logged_in {
        Ok(user) => user,
        Err(code) => {
            tracing::warn!(%peer, client_id = %connect.client_id, ?code, "connection refused: authentication failed");
            let _ = send_connack(wr, version, code, false, None).await;
            return None;
        }
    };
    let current = shared.metrics.connections.fetch_add(1, Ordering::AcqRel) + 1;
    if current > shared.config.max_connections as u64 {
        shared.metrics.connections.fetch_sub(1, Ordering::AcqRel);
        tracing::warn!(%peer, max = shared.config.max_connections, "connection refused: too many connections");
        let code = ConnectReturnCode::QuotaExceeded;
        let _ = send_connack(wr, version, code, false, None).await;
        return None;
    }
    shared
        .metrics
        .connections_total
        .fetch_add(1, Ordering::Relaxed);
    Some(Box::new(Hello {
        version,
        connect,
        will,
        user,
    }))
}

/// What a connection knows about its client.
struct Client {
    version: Version,
    id: Arc<str>,
    session: Arc<Session>,
    /// Encoded packets not yet written to the socket.
    out: BytesMut,
    aliases: HashMap<u16, Arc<str>>,
    /// Boxed: most clients have none, and the connection's task holds this for its life.
    will: Option<Box<LastWill>>,
    user: Option<Arc<str>>,
    /// QoS 1/2 publishes received and not yet acknowledged (bounded by receive maximum).
    unacked: usize,
    /// Whether reason strings may be sent (MQTT 5 request problem information).
    problem_info: bool,
    /// LSNs of messages the client acknowledged since the last journal record of them.
    acked: Vec<u64>,
    /// Since when none of its publishes is in flight (see [`PATIENT_AFTER`]).
    quiet_since: std::time::Instant,
}

/// A publish that comes this long after the client's last one was answered, none being in
/// flight, is stored *patiently* ([`sluice_engine::patiently`]): its sender is not waiting
/// to send the next.
const PATIENT_AFTER: Duration = Duration::from_millis(100);

impl Client {
    /// Queues a control packet (ack, SUBACK, PINGRESP, ...) for the client.
    fn send(&mut self, p: Packet) {
        if let Err(e) = codec::write(self.version, &p, &mut self.out) {
            tracing::debug!(client_id = %self.id, error = %e, "packet not encodable, not sent");
        }
    }
}

/// What the session setup leaves for the connection's loop.
struct Attached {
    client: Client,
    outbound: Outbound,
    cancel: tokio_util::sync::CancellationToken,
    conn: u64,
    generation: u64,
    expiry: u32,
    keep_alive: Duration,
}

/// Checks the CONNECT, attaches the session (taking it over from another node of a
/// cluster), logs it and sends the CONNACK. Awaited boxed: what it holds meanwhile (the
/// CONNECT, its will and properties) is not part of every connection's task.
async fn attach<W>(
    shared: &Arc<BrokerState>,
    hello: Box<Hello>,
    wr: &mut W,
    peer: std::net::SocketAddr,
) -> Result<Attached>
where
    W: AsyncWrite + Unpin,
{
    let cfg = &shared.config;
    let Hello {
        version,
        connect,
        will,
        user,
    } = *hello;
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
    // `mqtt.max_keep_alive`: an MQTT 5 client asking for more (or for none) is told the
    // server's in CONNACK; a 3.1.1 client cannot be told, and is refused as Mosquitto
    // does (0x02).
    let max_keep_alive = cfg.max_keep_alive;
    let server_keep_alive = (max_keep_alive > 0
        && (connect.keep_alive == 0 || connect.keep_alive > max_keep_alive))
        .then_some(max_keep_alive);
    if server_keep_alive.is_some() && version == Version::V4 {
        let code = ConnectReturnCode::ClientIdentifierNotValid;
        Box::pin(send_connack(wr, version, code, false, None)).await?;
        return Err(Error::Protocol(format!(
            "keep alive {} s beyond mqtt.max_keep_alive {max_keep_alive} s",
            connect.keep_alive
        )));
    }
    if let Some(why) = bad_connect {
        let code = match version {
            Version::V5 => ConnectReturnCode::ProtocolError,
            Version::V4 => ConnectReturnCode::ServiceUnavailable,
        };
        Box::pin(send_connack(wr, version, code, false, None)).await?;
        return Err(Error::Protocol(why.into()));
    }
    let problem_info = props.request_problem_info != Some(0);
    let mut assigned = None;
    let client_id: Arc<str> = if connect.client_id.is_empty() {
        if version == Version::V4 && !connect.clean_start {
            Box::pin(send_connack(
                wr,
                version,
                ConnectReturnCode::ClientIdentifierNotValid,
                false,
                None,
            ))
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
    // In a cluster, a session of this client on another node moves here.
    let mut handed = match cfg.shared_client_ids {
        false => crate::takeover::take_over(shared, &key, connect.clean_start).await,
        true => Default::default(),
    };
    // What was handed over makes the session present (it is logged below).
    let took = expiry > 0 && !handed.is_empty() && shared.db.journals();
    let cancel = shared.shutdown.child_token();
    let was_lasting = (shared.router.session(&key)).is_some_and(|s| s.lasting());
    let (session, present, generation) = shared.router.attach(
        &key,
        connect.clean_start || cfg.shared_client_ids,
        expiry,
        conn,
        cancel.clone(),
    );
    *session.user.lock() = user.clone();
    let will_message = will.as_ref().and_then(|w| will::will_message(&key, w));
    *session.will.lock() = will_message.clone();
    if let Some(r) = shared.router.remote() {
        r.share_will(&key, will_message.as_ref(), user.clone(), expiry);
    }
    // A session that outlives its connection (or replaces one that did) is in the
    // journal before the CONNACK says it exists.
    if shared.db.journals() && (expiry > 0 || was_lasting) {
        let record = Record::Open {
            client: key.clone(),
            user: user.clone(),
            expiry,
            fresh: !present,
            will: will_message.filter(|_| expiry > 0),
        };
        let logged = shared.db.journal(vec![journal::entry(&record, None)], true);
        let handed = std::mem::take(&mut handed);
        let imported = async {
            logged.await?;
            match expiry > 0 && !handed.is_empty() {
                true => crate::takeover::resume(shared, &session, handed).await,
                false => Ok(()),
            }
        };
        if let Err(e) = imported.await {
            let code = ConnectReturnCode::ServiceUnavailable;
            Box::pin(send_connack(wr, version, code, false, None)).await?;
            session.detach(conn);
            return Err(Error::Protocol(format!("session not logged: {e}")));
        }
    }
    let present = present || took;
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
        server_keep_alive,
        response_information: None,
        server_reference: None,
        authentication_method: None,
        authentication_data: None,
    });
    Box::pin(send_connack(
        wr,
        version,
        ConnectReturnCode::Success,
        present,
        connack_props,
    ))
    .await?;
    tracing::debug!(%peer, client_id = %client_id, ?version, present, "client connected");

    let window = usize::from(
        props
            .receive_maximum
            .unwrap_or(u16::MAX)
            .min(cfg.max_inflight)
            .max(1),
    );
    let mut outbound = Outbound {
        version,
        session: session.clone(),
        window,
        max_packet: props
            .max_packet_size
            .map(|m| m as usize)
            .unwrap_or(usize::MAX),
        alias_max: props.topic_alias_max.unwrap_or(0),
        aliases: HashMap::new(),
    };
    let mut client = Client {
        version,
        id: key.clone(),
        session: session.clone(),
        out: BytesMut::new(),
        aliases: HashMap::new(),
        will: will.map(Box::new),
        user,
        unacked: 0,
        problem_info,
        acked: Vec::new(),
        quiet_since: std::time::Instant::now(),
    };
    if present {
        resend(&mut outbound, &mut client.out);
    }
    let keep_alive_secs = server_keep_alive.unwrap_or(connect.keep_alive);
    let keep_alive = Duration::from_secs(u64::from(keep_alive_secs)) * 3 / 2;
    Ok(Attached {
        client,
        outbound,
        cancel,
        conn,
        generation,
        expiry,
        keep_alive,
    })
}

#[allow(clippy::too_many_arguments)]
async fn run<R, W>(
    shared: &Arc<BrokerState>,
    hello: Box<Hello>,
    (mut rd, mut wr, buffered): (R, W, bool),
    mut buf: BytesMut,
    peer: std::net::SocketAddr,
) -> Result<()>
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let cfg = &shared.config;
    let Attached {
        mut client,
        mut outbound,
        cancel,
        conn,
        generation,
        expiry,
        keep_alive,
    } = Box::pin(attach(shared, hello, &mut wr, peer)).await?;
    let version = client.version;
    let session = client.session.clone();
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
    // The socket needs a flush after the buffer was written (TLS keeps records back).
    let mut unflushed = false;
    // Whether the session may have messages to send (queued, or room in the window).
    let mut woken = true;
    // Messages encoded but held until the journal has their packet ids, and that record.
    let mut held = BytesMut::new();
    let mut sending: Option<Sending> = None;
    // Subscribers of the message just stored, reached after the select (whose output is
    // then not held across the wait).
    let mut deliver = Vec::new();
    // One timer for the keep-alive, moved only when it fires before the (later) deadline.
    let keep_alive_timer = tokio::time::sleep_until(deadline);
    tokio::pin!(keep_alive_timer);
    // The session's wake-up and the cancellation are waited on by futures kept across the
    // loop's turns (made again only once the wake-up came), not made and dropped each turn.
    let wake = session.wake_writer.notified();
    let cancelled = cancel.cancelled();
    tokio::pin!(wake, cancelled);
    let mut rearm = false;
    let result: Result<()> = async {
        loop {
            while pending.len() < cap {
                // A PUBLISH is handled at once; other packets may wait (boxed, so that their
                // state is held only meanwhile; the packet is gone from here by then).
                let other = {
                    let Some(p) = codec::read(version, &mut buf, max)? else {
                        break;
                    };
                    shared.metrics.packets_in.fetch_add(1, Ordering::Relaxed);
                    match p {
                        Packet::Publish(p) => {
                            on_publish(shared, &mut client, p, &mut pending)?;
                            None
                        }
                        p => Some(Box::pin(handle(shared, &mut client, p, &mut pending))),
                    }
                };
                if let Some(handled) = other
                    && handled.await?
                {
                    return Ok(());
                }
            }
            // Checked here, cheaply, so a busy connection that was taken over stops at once;
            // the select below only waits on it when idle.
            if cancel.is_cancelled() {
                return Ok(());
            }
            if !client.acked.is_empty() {
                log_done(shared, &client.id, std::mem::take(&mut client.acked));
            }
            if sending.is_none() && std::mem::take(&mut woken) {
                resend_given(&mut outbound, &mut client.out);
                let dropped = &mut client.acked;
                let sent = fill(shared, &mut outbound, &mut client.out, &mut held, dropped);
                if !sent.is_empty() {
                    let record = Record::Sent {
                        client: client.id.clone(),
                        items: sent,
                    };
                    let db = shared.db.clone();
                    let entry = journal::entry(&record, None);
                    sending = Some(Box::pin(async move { db.journal(vec![entry], true).await }));
                }
            }
            // Read through the thread's scratch buffer: a connection waiting for its client
            // holds no read buffer.
            if buf.is_empty() && buf.capacity() > 0 {
                buf = BytesMut::new();
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
                        // A slot of the receive maximum is free again at the PUBACK, at the
                        // PUBCOMP of a QoS 2 publish, or at a PUBREC that refused it.
                        let freed = match &p {
                            Packet::PubAck(_) => true,
                            Packet::PubRec(r) => (r.reason as u8) >= 0x80,
                            Packet::PubComp(c) => c.reason == PubCompReason::Success,
                            _ => false,
                        };
                        if freed {
                            client.unacked = client.unacked.saturating_sub(1);
                        }
                        client.send(p);
                    }
                    if pending.is_empty() {
                        client.quiet_since = std::time::Instant::now();
                    }
                    if let Some((m, targets, logged)) = routed {
                        if crate::ingest::kept_retained(shared, &m) && !logged {
                            shared.router.retain(&m, 0);
                        }
                        deliver = targets;
                    }
                }
                Some(r) = async { match sending.as_mut() { Some(f) => Some(f.await), None => None } }, if sending.is_some() => {
                    sending = None;
                    r?;
                    client.out.extend_from_slice(&held);
                    held = BytesMut::new();
                    woken = true;
                }
                r = write_some(&mut wr, &client.out), if unflushed || !client.out.is_empty() => {
                    unflushed = wrote(shared, &mut client.out, r?) && buffered;
                }
                r = read_scratch(&mut rd, &mut buf), if reading => {
                    let n = r?;
                    if n == 0 {
                        return Ok(());
                    }
                    shared.metrics.bytes_in.fetch_add(n as u64, Ordering::Relaxed);
                    deadline = tokio::time::Instant::now() + keep_alive;
                }
                // Deliveries queued for this session, or room in the client's window.
                () = wake.as_mut() => (woken, rearm) = (true, true),
                () = keep_alive_timer.as_mut(), if !keep_alive.is_zero() && reading => {
                    if tokio::time::Instant::now() >= deadline {
                        return Err(Error::KeepAlive);
                    }
                    keep_alive_timer.as_mut().reset(deadline);
                }
                () = cancelled.as_mut() => return Ok(()),
            }
            if std::mem::take(&mut rearm) {
                wake.set(session.wake_writer.notified());
            }
            // What was queued (a PUBACK, nearly always) goes out now when the socket takes
            // it, rather than on another turn of the loop; but while other messages are
            // still being stored, the select takes the ones ready first, so that their
            // PUBACKs leave in one write (a write each cost a deep window 3x its CPU).
            if !client.out.is_empty()
                && pending.is_empty()
                && let Some(r) = write_some(&mut wr, &client.out).now_or_never()
            {
                unflushed = wrote(shared, &mut client.out, r?) && buffered;
            }
            // May wait for room in a slow subscriber's queue: reading then stops, which
            // slows this publisher. Boxed (most stored readings have no subscriber).
            if !deliver.is_empty() {
                Box::pin(crate::router::deliver(std::mem::take(&mut deliver))).await;
            }
        }
    }
    .await;
    // Packet ids being logged for messages held back: logged or not, they are in flight
    // now, and the client gets them again (DUP) on its return.
    if let Some(f) = sending.take()
        && let Err(e) = f.await
    {
        tracing::debug!(client_id = %client.id, error = %e, "packet ids of messages not logged");
    }
    Box::pin(close(
        shared,
        &mut client,
        &mut pending,
        &mut wr,
        &cancel,
        &result,
    ))
    .await;
    let still_ours = session.detach(conn);
    if !client.acked.is_empty() {
        log_done(shared, &client.id, std::mem::take(&mut client.acked));
    }
    let lasting = session.state.lock().expiry_secs;
    if still_ours && shared.db.journals() && (lasting > 0 || expiry > 0) {
        let record = Record::Close {
            client: client.id.clone(),
            expiry: lasting,
            will_pending: client.will.is_some(),
        };
        if let Err(e) = shared
            .db
            .journal(vec![journal::entry(&record, None)], true)
            .await
        {
            tracing::warn!(client_id = %client.id, error = %e, "end of connection not logged");
        }
    }
    // The will is gone after a normal DISCONNECT; any other end publishes it, within the
    // session's expiry as it is now (a DISCONNECT may have changed it).
    if let Some(w) = client.will.take() {
        publish_will(
            shared,
            &session,
            *w,
            client.user.clone(),
            generation,
            lasting,
        );
    } else if still_ours {
        *session.will.lock() = None;
        if let Some(r) = shared.router.remote() {
            r.share_will(&session.client_id, None, None, 0);
        }
    }
    if still_ours && session.state.lock().expiry_secs == 0 {
        shared.router.discard(&session);
    }
    result
}

/// Logs the messages at `lsns` as done for session `client` (its client acknowledged
/// them, or they were copies not queued after all), without waiting: a record lost in a
/// crash means those messages are sent again (QoS 1 allows it; a QoS 2 message's PUBREC
/// was logged before its PUBREL was sent).
pub(crate) fn log_done(shared: &BrokerState, client: &Arc<str>, lsns: Vec<u64>) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        tracing::warn!(%client, ?lsns, "messages done not logged: no runtime to log them on");
        return;
    };
    let (db, client) = (shared.db.clone(), client.clone());
    runtime.spawn(async move {
        if let Err(e) = journal_done(db.as_ref(), &client, lsns).await {
            tracing::debug!(error = %e, "acknowledgements not logged");
        }
    });
}

/// Logs the messages at `lsns` as done for session `client`; returns once durable.
pub(crate) async fn journal_done(
    db: &dyn sluice_engine::IngestPort,
    client: &Arc<str>,
    lsns: Vec<u64>,
) -> sluice_engine::Result<()> {
    let record = Record::Acked {
        client: client.clone(),
        lsns,
    };
    db.journal(vec![journal::entry(&record, None)], true)
        .await
        .map(|_| ())
}

/// The end of a connection: stored messages still waiting for the log finish (and are
/// routed) though their acks can no longer be sent; an MQTT 5 client is told why it ends;
/// what is still unwritten goes out, within [`WRITER_GRACE`].
async fn close<W: AsyncWrite + Unpin>(
    shared: &BrokerState,
    client: &mut Client,
    pending: &mut FuturesOrdered<Ack>,
    wr: &mut W,
    cancel: &tokio_util::sync::CancellationToken,
    result: &Result<()>,
) {
    while let Some((_, routed)) = pending.next().await {
        if let Some((m, targets, logged)) = routed {
            crate::ingest::deliver_now(shared, &m, targets, logged).await;
        }
    }
    let reason = match result {
        // MQTT 5 §3.1.2.10: closed "as if the network had failed", without a DISCONNECT
        // (as Mosquitto does; a client reading for the close sees it at once).
        Err(Error::KeepAlive) => None,
        Err(e) => Some(e.disconnect_reason()),
        Ok(()) if cancel.is_cancelled() => Some(if shared.shutdown.is_cancelled() {
            DisconnectReasonCode::ServerShuttingDown
        } else {
            DisconnectReasonCode::SessionTakenOver
        }),
        Ok(()) => None,
    };
    if let Some(reason_code) = reason
        && client.version == Version::V5
    {
        client.send(Packet::Disconnect(Disconnect {
            reason_code,
            properties: None,
        }));
    }
    // What is still unwritten goes out; a peer that stopped reading must not hold the
    // session (and its will) for as long as TCP takes to give up.
    let out = std::mem::take(&mut client.out);
    let _ = tokio::time::timeout(WRITER_GRACE, async {
        wr.write_all(&out).await?;
        wr.flush().await?;
        wr.shutdown().await
    })
    .await;
}
