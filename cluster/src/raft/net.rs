//! Node-to-node RPC: every raft group of a node talks to a peer over one TCP connection.
//!
//! A frame is `[length u32][request id u64][kind u8][CBOR body]`. A request's body is its
//! group and its message; the answer reuses the request id, with kind [`OK`] or [`FAILED`]
//! (a text). Requests on one connection are answered out of order: each is handled on a task
//! of its own, so a snapshot being installed for one group never holds back another group's
//! heartbeats. A connection that fails is dropped, and the next call dials again.
//!
//! Replication is pipelined: a leader sends a follower each AppendEntries of a replication
//! stream ([`APPEND_STREAM`]) as soon as openraft has it, without waiting for the answer to
//! the one before, and the follower hands the stream's requests to its raft in the order the
//! connection delivered them (openraft's `Raft::stream_append`), answering each once it is on
//! disk. Waiting for each answer before sending the next (openraft's default) left a
//! follower idle for a whole round trip per request: on three nodes sharing two cores a
//! round trip was ~1.4 ms, of which the follower's append and sync took ~0.5 ms.

use crate::raft::types::{GroupId, Tc, as_bytes, cbor_into, entries_size_hint, from_cbor};
use bytes::Bytes;
use futures::future::BoxFuture;
use futures::stream::{BoxStream, Stream, StreamExt};
use openraft::OptionalSend;
use openraft::error::{
    NetworkError, RPCError, ReplicationClosed, StreamingError, Timeout, Unreachable,
};
use openraft::network::{RPCOption, RPCTypes};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, StreamAppendResult,
    TransferLeaderRequest, TransferLeaderResponse, VoteRequest, VoteResponse,
};
use openraft::type_config::alias::{SnapshotMetaOf, SnapshotOf, VoteOf};
use openraft::{BasicNode, RaftNetworkFactory, RaftNetworkV2};
use parking_lot::Mutex;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader, BufWriter};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

/// Answer kinds.
const OK: u8 = 0;
const FAILED: u8 = 1;
/// Request kinds.
pub(crate) const APPEND: u8 = 10;
pub(crate) const VOTE: u8 = 11;
pub(crate) const PRE_VOTE: u8 = 12;
pub(crate) const SNAPSHOT: u8 = 13;
pub(crate) const TRANSFER_LEADER: u8 = 14;
/// A client's command, forwarded to the node believed to lead its group.
pub(crate) const CLIENT_WRITE: u8 = 15;
/// The index a read must see applied (ReadIndex), asked of the node leading a group.
pub(crate) const READ_INDEX: u8 = 16;
/// One AppendEntries of a leader's replication stream to a group (a [`StreamRequest`]):
/// a follower takes a stream's requests in the order they came.
pub(crate) const APPEND_STREAM: u8 = 17;
/// A replication stream ended (its id, CBOR): sent without an answer.
pub(crate) const STREAM_END: u8 = 18;
/// AppendEntries a replication stream has sent and not yet had answered, at most.
/// A change to a node's routes (`crate::relay`).
pub(crate) const ROUTES: u8 = 19;
/// Messages for a node's subscribers (`crate::relay`).
pub(crate) const RELAY: u8 = 20;
/// A client connected to another node: its session moves there (`crate::relay`).
pub(crate) const TAKE: u8 = 21;
/// What a session held, for the node its client went to (`crate::relay`).
pub(crate) const GIVE: u8 = 22;
/// Write a table's buffered rows of the shards led here as files (`FLUSH TABLE`).
pub(crate) const FLUSH: u8 = 23;
/// What became of a node's earlier runs' wills (`crate::relay`).
pub(crate) const WILLS: u8 = 24;
/// A shard's buffered rows of a table, for a query on a node holding no replica of it
/// (`crate::reads`).
pub(crate) const SHARD_ROWS: u8 = 25;
/// Whether a node answers at all (an empty answer), asked while a call to it takes long.
pub(crate) const PING: u8 = 26;
/// About the standby copies of the nodes' broker journals (`crate::relay`).
pub(crate) const STANDBY: u8 = 27;
/// The messages queued for a node that does not answer, for a session that came from its
/// standby copy (`crate::relay`).
pub(crate) const PULL: u8 = 28;

const PIPELINE: usize = 64;
/// Largest frame accepted (a snapshot is one frame).
const MAX_FRAME: usize = 1 << 30;
/// How long dialing a peer may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// How long data sent to a peer may stay unacknowledged by its TCP stack before the
/// connection is dropped (`TCP_USER_TIMEOUT`), and how long an idle connection goes before
/// keep-alive probes start, and between them. A peer whose machine died or whose network
/// went away without a reset otherwise keeps its connection, and the frames queued for it,
/// for as long as TCP's retransmissions last (about 15 minutes on Linux).
const PEER_SILENCE: Duration = Duration::from_secs(10);
const KEEPALIVE_IDLE: Duration = Duration::from_secs(5);
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(2);

/// Sets a node-to-node connection's options: no Nagle delay, and the peer-silence limits
/// above. A failure is logged and the connection kept as it is.
fn tune(stream: &TcpStream) {
    let socket = socket2::SockRef::from(stream);
    let keepalive = socket2::TcpKeepalive::new()
        .with_time(KEEPALIVE_IDLE)
        .with_interval(KEEPALIVE_INTERVAL)
        .with_retries(3);
    let set = (socket.set_tcp_nodelay(true))
        .and_then(|()| socket.set_tcp_keepalive(&keepalive))
        .and_then(|()| socket.set_tcp_user_timeout(Some(PEER_SILENCE)));
    if let Err(e) = set {
        tracing::warn!(error = %e, "could not set a node connection's TCP options");
    }
}

/// What a node does with the requests it receives.
pub trait Handler: Send + Sync + 'static {
    /// Answers request `kind` with `body` (CBOR), or says why not.
    fn handle(&self, kind: u8, body: Bytes)
    -> impl Future<Output = Result<Vec<u8>, String>> + Send;

    /// Takes a request of a replication stream ([`APPEND_STREAM`], [`STREAM_END`]) before the
    /// connection's next frame is read, so a stream's requests keep their order; `reply`
    /// answers it whenever it is done (a [`STREAM_END`] gets no answer). `conn` tells the
    /// connections apart: a stream is known by its connection and its id.
    fn take_ordered(&self, conn: u64, kind: u8, body: Bytes, reply: Reply);

    /// Connection `conn` closed: its streams end.
    fn connection_closed(&self, conn: u64);
}

/// Where the answer to one request goes.
#[derive(Debug)]
pub struct Reply {
    id: u64,
    tx: mpsc::UnboundedSender<Vec<u8>>,
}

impl Reply {
    /// Sends the answer (dropped if the connection is gone).
    pub fn send(self, answer: Result<Vec<u8>, String>) {
        let frame = match answer {
            Ok(b) => frame_bytes(self.id, OK, &b),
            Err(e) => frame_bytes(self.id, FAILED, e.as_bytes()),
        };
        let _ = self.tx.send(frame);
    }
}

/// An AppendEntries of a replication stream, as [`APPEND_STREAM`] carries it (in a
/// [`ToGroup`]).
#[derive(Serialize, Deserialize)]
pub(crate) struct StreamRequest {
    /// The stream, unique on its connection.
    pub(crate) stream: u64,
    pub(crate) request: AppendEntriesRequest<Tc>,
}

/// Accepts node-to-node connections on `listener` until `stop`, answering with `handler`.
pub async fn serve<H: Handler>(listener: TcpListener, handler: Arc<H>, stop: CancellationToken) {
    loop {
        let accepted = tokio::select! {
            _ = stop.cancelled() => return,
            a = listener.accept() => a,
        };
        match accepted {
            Ok((stream, _)) => {
                tune(&stream);
                tokio::spawn(serve_connection(stream, handler.clone(), stop.clone()));
            }
            Err(e) => {
                tracing::warn!(error = %e, "accepting a node connection");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

async fn serve_connection<H: Handler>(stream: TcpStream, handler: Arc<H>, stop: CancellationToken) {
    static CONNECTIONS: AtomicU64 = AtomicU64::new(0);
    let conn = CONNECTIONS.fetch_add(1, Ordering::Relaxed);
    let peer = stream.peer_addr().ok();
    let (rd, wr) = stream.into_split();
    let (tx, rx) = mpsc::unbounded_channel::<Vec<u8>>();
    let writer = tokio::spawn(write_frames(wr, rx));
    let mut rd = BufReader::new(rd);
    loop {
        let frame = tokio::select! {
            _ = stop.cancelled() => break,
            f = read_frame(&mut rd) => f,
        };
        let (id, kind, body) = match frame {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => break,
            Err(e) => {
                tracing::warn!(peer = ?peer, error = %e, "dropping a node connection that sent a bad frame");
                break;
            }
        };
        let reply = Reply { id, tx: tx.clone() };
        if kind == APPEND_STREAM || kind == STREAM_END {
            handler.take_ordered(conn, kind, body, reply);
            continue;
        }
        let handler = handler.clone();
        tokio::spawn(async move { reply.send(handler.handle(kind, body).await) });
    }
    handler.connection_closed(conn);
    drop(tx);
    writer.abort();
}

async fn write_frames(
    wr: tokio::net::tcp::OwnedWriteHalf,
    mut rx: mpsc::UnboundedReceiver<Vec<u8>>,
) -> io::Result<()> {
    let mut wr = BufWriter::new(wr);
    let sent =
        |f: &[u8]| (sluice_engine::NODE_BYTES_SENT).fetch_add(f.len() as u64, Ordering::Relaxed);
    while let Some(f) = rx.recv().await {
        wr.write_all(&f).await?;
        sent(&f);
        // Whatever else is ready goes in the same write.
        while let Ok(f) = rx.try_recv() {
            wr.write_all(&f).await?;
            sent(&f);
        }
        wr.flush().await?;
    }
    Ok(())
}

fn frame_bytes(id: u64, kind: u8, body: &[u8]) -> Vec<u8> {
    Frame::raw(kind, body).sent_as(id)
}

/// Bytes of a frame before its body: length (u32), id (u64), kind.
const FRAME_HEAD: usize = 4 + 8 + 1;

/// A request frame, its body encoded in place behind room for the head (a body copied into
/// a frame after being encoded cost a copy of every shard entry it carried); the id is
/// filled in when it is sent.
pub(crate) struct Frame(Vec<u8>);

impl Frame {
    /// A frame of `kind` carrying `value` as CBOR; `hint`: about how many bytes that takes.
    pub(crate) fn cbor<T: Serialize>(kind: u8, value: &T, hint: usize) -> io::Result<Self> {
        let mut f = Vec::with_capacity(FRAME_HEAD + hint.max(64));
        f.resize(FRAME_HEAD, 0);
        f[FRAME_HEAD - 1] = kind;
        cbor_into(value, &mut f)?;
        Ok(Self(f))
    }

    pub(crate) fn raw(kind: u8, body: &[u8]) -> Self {
        let mut f = Vec::with_capacity(FRAME_HEAD + body.len());
        f.resize(FRAME_HEAD, 0);
        f[FRAME_HEAD - 1] = kind;
        f.extend_from_slice(body);
        Self(f)
    }

    /// The frame's bytes, sent under `id`.
    fn sent_as(mut self, id: u64) -> Vec<u8> {
        let len = (self.0.len() - 4) as u32;
        self.0[..4].copy_from_slice(&len.to_le_bytes());
        self.0[4..12].copy_from_slice(&id.to_le_bytes());
        self.0
    }
}

async fn read_frame<R: tokio::io::AsyncRead + Unpin>(rd: &mut R) -> io::Result<(u64, u8, Bytes)> {
    let len = rd.read_u32_le().await? as usize;
    if !(9..=MAX_FRAME).contains(&len) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("a node frame of {len} bytes"),
        ));
    }
    let id = rd.read_u64_le().await?;
    let kind = rd.read_u8().await?;
    let mut body = vec![0; len - 9];
    rd.read_exact(&mut body).await?;
    Ok((id, kind, Bytes::from(body)))
}

/// Connections to the other nodes, one per peer address, shared by every group.
#[derive(Debug, Default)]
pub struct Pool {
    peers: Mutex<HashMap<String, Arc<Peer>>>,
    next_id: AtomicU64,
    failed_dials: AtomicU64,
}

#[derive(Debug, Default)]
struct Peer {
    conn: tokio::sync::Mutex<Option<Arc<Conn>>>,
}

#[derive(Debug)]
struct Conn {
    addr: String,
    tx: mpsc::UnboundedSender<Vec<u8>>,
    waiting: Arc<Mutex<Waiting>>,
}

/// A request sent, its answer to come. Its entry in the connection's calls in flight goes
/// with it: answered, timed out, or given up by a caller that stopped waiting (a forward
/// whose leader was replaced, a replication stream openraft dropped).
struct Sent {
    id: u64,
    answer: oneshot::Receiver<(u8, Bytes)>,
    timeout: Duration,
    waiting: Arc<Mutex<Waiting>>,
}

impl Drop for Sent {
    fn drop(&mut self) {
        if let Some(w) = self.waiting.lock().as_mut() {
            w.remove(&self.id);
        }
    }
}

impl Conn {
    fn lost(&self) -> CallError {
        CallError::Unreachable(self.addr.clone(), "connection lost".into())
    }

    /// Queues request `frame` under `id`; its answer is due within `timeout` of being awaited.
    fn send(&self, id: u64, frame: Frame, timeout: Duration) -> Result<Sent, CallError> {
        let (tx, answer) = oneshot::channel();
        match self.waiting.lock().as_mut() {
            Some(w) => w.insert(id, tx),
            None => return Err(self.lost()),
        };
        self.tx.send(frame.sent_as(id)).map_err(|_| self.lost())?;
        Ok(Sent {
            id,
            answer,
            timeout,
            waiting: self.waiting.clone(),
        })
    }

    /// Queues request `frame`, which gets no answer.
    fn post(&self, id: u64, frame: Frame) {
        let _ = self.tx.send(frame.sent_as(id));
    }

    /// Waits for the answer to `sent`.
    async fn answer(&self, mut sent: Sent) -> Result<Bytes, CallError> {
        // Counted from when the answer is awaited: a replication stream awaits its answers in
        // turn, and a request far back in a long pipeline is not late while those before it
        // are still being answered.
        match tokio::time::timeout(sent.timeout, &mut sent.answer).await {
            Err(_) => Err(CallError::Timeout(self.addr.clone(), sent.timeout)),
            Ok(Err(_)) => Err(self.lost()),
            Ok(Ok((OK, b))) => Ok(b),
            Ok(Ok((_, b))) => Err(CallError::Remote(
                self.addr.clone(),
                String::from_utf8_lossy(&b).into_owned(),
            )),
        }
    }
}

/// Calls in flight on a connection; `None` once it failed.
type Waiting = Option<HashMap<u64, oneshot::Sender<(u8, Bytes)>>>;

/// Why a call failed.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    /// The peer could not be reached (or the connection broke).
    #[error("node {0} unreachable: {1}")]
    Unreachable(String, String),
    /// No answer in time.
    #[error("node {0} did not answer in {1:?}")]
    Timeout(String, Duration),
    /// The peer answered with an error.
    #[error("node {0}: {1}")]
    Remote(String, String),
}

impl Pool {
    /// A new, empty pool.
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Sends request `frame` to the node at `addr` and waits up to `timeout` for
    /// its answer.
    pub(crate) async fn call(
        &self,
        addr: &str,
        frame: Frame,
        timeout: Duration,
    ) -> Result<Bytes, CallError> {
        let conn = self.conn(addr).await?;
        let sent = conn.send(self.next_id(), frame, timeout)?;
        conn.answer(sent).await
    }

    /// Dials to peers that failed since the pool was made.
    pub(crate) fn failed_dials(&self) -> u64 {
        self.failed_dials.load(Ordering::Relaxed)
    }

    fn next_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// The live connection to `addr`, dialing it if there is none.
    async fn conn(&self, addr: &str) -> Result<Arc<Conn>, CallError> {
        let peer = self
            .peers
            .lock()
            .entry(addr.to_string())
            .or_default()
            .clone();
        let mut slot = peer.conn.lock().await;
        if let Some(c) = slot.as_ref()
            && c.waiting.lock().is_some()
            && !c.tx.is_closed()
        {
            return Ok(c.clone());
        }
        let unreachable = |e: String| {
            self.failed_dials.fetch_add(1, Ordering::Relaxed);
            CallError::Unreachable(addr.to_string(), e)
        };
        let stream = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(addr))
            .await
            .map_err(|_| unreachable("connect timed out".into()))?
            .map_err(|e| unreachable(e.to_string()))?;
        tune(&stream);
        let (rd, wr) = stream.into_split();
        let (tx, rx) = mpsc::unbounded_channel();
        let waiting: Arc<Mutex<Waiting>> = Arc::new(Mutex::new(Some(HashMap::new())));
        let w = waiting.clone();
        tokio::spawn(async move {
            let _ = write_frames(wr, rx).await;
        });
        tokio::spawn(async move {
            let mut rd = BufReader::new(rd);
            while let Ok((id, kind, body)) = read_frame(&mut rd).await {
                let tx = w.lock().as_mut().and_then(|m| m.remove(&id));
                if let Some(tx) = tx {
                    let _ = tx.send((kind, body));
                }
            }
            // Every call still waiting fails now (their senders drop).
            w.lock().take();
        });
        let c = Arc::new(Conn {
            addr: addr.to_string(),
            tx,
            waiting,
        });
        *slot = Some(c.clone());
        Ok(c)
    }
}

/// A request to one group.
#[derive(Serialize, Deserialize)]
pub(crate) struct ToGroup<T> {
    pub(crate) group: GroupId,
    pub(crate) message: T,
}

/// A whole snapshot, as sent to a follower.
#[derive(Serialize, Deserialize)]
pub(crate) struct SnapshotRequest {
    pub(crate) vote: VoteOf<Tc>,
    pub(crate) meta: SnapshotMetaOf<Tc>,
    #[serde(with = "as_bytes")]
    pub(crate) data: Bytes,
}

/// One group's network: openraft's view of the pool.
#[derive(Debug, Clone)]
pub struct GroupNetwork {
    pool: Arc<Pool>,
    group: GroupId,
}

impl GroupNetwork {
    /// The network of `group` over `pool`.
    pub fn new(pool: Arc<Pool>, group: GroupId) -> Self {
        Self { pool, group }
    }
}

impl RaftNetworkFactory<Tc> for GroupNetwork {
    type Network = GroupPeer;

    async fn new_client(&mut self, target: u64, node: &BasicNode) -> GroupPeer {
        GroupPeer {
            pool: self.pool.clone(),
            group: self.group,
            target,
            addr: node.addr.clone(),
        }
    }
}

/// One group's link to one peer.
#[derive(Debug)]
pub struct GroupPeer {
    pool: Arc<Pool>,
    group: GroupId,
    target: u64,
    addr: String,
}

impl GroupPeer {
    async fn rpc<Req: Serialize, Resp: DeserializeOwned>(
        &self,
        kind: u8,
        message: Req,
        hint: usize,
        action: RPCTypes,
        ttl: Duration,
    ) -> Result<Resp, RPCError<Tc>> {
        let message = ToGroup {
            group: self.group,
            message,
        };
        let frame = (Frame::cbor(kind, &message, hint))
            .map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        match self.pool.call(&self.addr, frame, ttl).await {
            Ok(b) => from_cbor(&b).map_err(|e| RPCError::Network(NetworkError::new(&e))),
            Err(e) => Err(rpc_error(e, action, self.target)),
        }
    }
}

/// openraft's name for a failed call to `target`.
fn rpc_error(e: CallError, action: RPCTypes, target: u64) -> RPCError<Tc> {
    match e {
        CallError::Timeout(_, timeout) => RPCError::Timeout(Timeout {
            action,
            id: 0,
            target,
            timeout,
        }),
        e @ CallError::Unreachable(..) => RPCError::Unreachable(Unreachable::new(&e)),
        e @ CallError::Remote(..) => RPCError::Network(NetworkError::new(&e)),
    }
}

/// Sends the requests of replication stream `stream` as openraft makes them, each without
/// waiting for the answer to the one before, and passes what was sent on to `sent` (which
/// waits for the answers in order); at the end tells the follower the stream ended.
async fn send_stream<S>(
    pool: Arc<Pool>,
    conn: Arc<Conn>,
    group: GroupId,
    stream: u64,
    mut input: S,
    sent: mpsc::Sender<Result<Sent, CallError>>,
    timeout: Duration,
) where
    S: Stream<Item = AppendEntriesRequest<Tc>> + Unpin,
{
    loop {
        // Biased: once openraft dropped this stream's answers, the requests its input yields
        // belong to the next replication stream, which shares that input; none may go here.
        let request = tokio::select! {
            biased;
            _ = sent.closed() => break,
            r = input.next() => match r {
                Some(r) => r,
                None => break,
            },
        };
        if sent.is_closed() {
            break;
        }
        let hint = entries_size_hint(&request.entries);
        let message = ToGroup {
            group,
            message: StreamRequest { stream, request },
        };
        let one = match Frame::cbor(APPEND_STREAM, &message, hint) {
            Ok(frame) => conn.send(pool.next_id(), frame, timeout),
            Err(e) => Err(CallError::Remote(conn.addr.clone(), e.to_string())),
        };
        let failed = one.is_err();
        if sent.send(one).await.is_err() || failed {
            break;
        }
    }
    if let Ok(frame) = Frame::cbor(STREAM_END, &stream, 0) {
        conn.post(pool.next_id(), frame);
    }
}

impl RaftNetworkV2<Tc> for GroupPeer {
    type SnapshotData = Bytes;

    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<Tc>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<Tc>, RPCError<Tc>> {
        let hint = entries_size_hint(&rpc.entries);
        (self.rpc(
            APPEND,
            rpc,
            hint,
            RPCTypes::AppendEntries,
            option.soft_ttl(),
        ))
        .await
    }

    fn stream_append<'s, S>(
        &'s mut self,
        input: S,
        option: RPCOption,
    ) -> BoxFuture<
        's,
        Result<BoxStream<'s, Result<StreamAppendResult<Tc>, RPCError<Tc>>>, RPCError<Tc>>,
    >
    where
        S: Stream<Item = AppendEntriesRequest<Tc>> + OptionalSend + Unpin + 'static,
    {
        let (pool, addr, group, target) = (
            self.pool.clone(),
            self.addr.clone(),
            self.group,
            self.target,
        );
        let action = RPCTypes::AppendEntries;
        Box::pin(async move {
            // The first request is awaited before connecting: openraft sleeps out its backoff
            // inside the input stream, so a stream that failed to connect without polling it
            // would be retried at once, tens of thousands of times a second while a peer is
            // down.
            let mut input = input.peekable();
            if Pin::new(&mut input).peek().await.is_none() {
                return Ok(futures::stream::empty().boxed());
            }
            let conn = (pool.conn(&addr).await).map_err(|e| rpc_error(e, action, target))?;
            let (tx, rx) = mpsc::channel(PIPELINE);
            let stream = pool.next_id();
            let ttl = option.soft_ttl();
            tokio::spawn(send_stream(
                pool,
                conn.clone(),
                group,
                stream,
                input,
                tx,
                ttl,
            ));
            // The stream ends after its first error, as openraft expects.
            let answers = futures::stream::unfold(Some(rx), move |rx| {
                let conn = conn.clone();
                async move {
                    let mut rx = rx?;
                    let answer = match rx.recv().await? {
                        Ok(sent) => conn.answer(sent).await,
                        Err(e) => Err(e),
                    };
                    let result = answer
                        .map_err(|e| rpc_error(e, action, target))
                        .and_then(|b| {
                            from_cbor(&b).map_err(|e| RPCError::Network(NetworkError::new(&e)))
                        });
                    let rest = result.is_ok().then_some(rx);
                    Some((result, rest))
                }
            });
            Ok(answers.boxed())
        })
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<Tc>,
        option: RPCOption,
    ) -> Result<VoteResponse<Tc>, RPCError<Tc>> {
        self.rpc(VOTE, rpc, 0, RPCTypes::Vote, option.soft_ttl())
            .await
    }

    async fn pre_vote(
        &mut self,
        rpc: VoteRequest<Tc>,
        option: RPCOption,
    ) -> Result<VoteResponse<Tc>, RPCError<Tc>> {
        (self.rpc(PRE_VOTE, rpc, 0, RPCTypes::Vote, option.soft_ttl())).await
    }

    async fn full_snapshot(
        &mut self,
        vote: VoteOf<Tc>,
        snapshot: SnapshotOf<Tc, Bytes>,
        cancel: impl Future<Output = ReplicationClosed> + Send + 'static,
        option: RPCOption,
    ) -> Result<SnapshotResponse<Tc>, StreamingError<Tc>> {
        let request = SnapshotRequest {
            vote,
            meta: snapshot.meta,
            data: snapshot.snapshot,
        };
        let hint = request.data.len();
        let sent = self.rpc(
            SNAPSHOT,
            request,
            hint,
            RPCTypes::InstallSnapshot,
            option.hard_ttl(),
        );
        tokio::select! {
            closed = cancel => Err(StreamingError::Closed(closed)),
            r = sent => r.map_err(StreamingError::from),
        }
    }

    async fn transfer_leader(
        &mut self,
        req: TransferLeaderRequest<Tc>,
        option: RPCOption,
    ) -> Result<TransferLeaderResponse<Tc>, RPCError<Tc>> {
        self.rpc(
            TRANSFER_LEADER,
            req,
            0,
            RPCTypes::TransferLeader,
            option.soft_ttl(),
        )
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Both ends of a node connection drop a peer that stays silent: keep-alive probes on an
    /// idle connection, and a limit on how long sent data may stay unacknowledged.
    #[tokio::test]
    async fn node_connections_give_up_on_a_silent_peer() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (dialed, accepted) = tokio::join!(TcpStream::connect(addr), listener.accept());
        let (dialed, (accepted, _)) = (dialed.unwrap(), accepted.unwrap());
        for stream in [&dialed, &accepted] {
            let socket = socket2::SockRef::from(stream);
            assert_eq!(socket.tcp_user_timeout().unwrap(), None);
            tune(stream);
            assert!(socket.tcp_nodelay().unwrap());
            assert!(socket.keepalive().unwrap());
            assert_eq!(socket.tcp_keepalive_time().unwrap(), KEEPALIVE_IDLE);
            assert_eq!(socket.tcp_keepalive_interval().unwrap(), KEEPALIVE_INTERVAL);
            assert_eq!(socket.tcp_user_timeout().unwrap(), Some(PEER_SILENCE));
        }
    }
}
