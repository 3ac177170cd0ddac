//! Node-to-node RPC: every raft group of a node talks to a peer over one TCP connection.
//!
//! A frame is `[length u32][request id u64][kind u8][CBOR body]`. A request's body is its
//! group and its message; the answer reuses the request id, with kind [`OK`] or [`FAILED`]
//! (a text). Requests on one connection are answered out of order: each is handled on a task
//! of its own, so a snapshot being installed for one group never holds back another group's
//! heartbeats. A connection that fails is dropped, and the next call dials again.

use crate::types::{GroupId, Tc, as_bytes, from_cbor, to_cbor};
use bytes::Bytes;
use openraft::error::{
    NetworkError, RPCError, ReplicationClosed, StreamingError, Timeout, Unreachable,
};
use openraft::network::{RPCOption, RPCTypes};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, TransferLeaderRequest,
    TransferLeaderResponse, VoteRequest, VoteResponse,
};
use openraft::type_config::alias::{SnapshotMetaOf, SnapshotOf, VoteOf};
use openraft::{BasicNode, RaftNetworkFactory, RaftNetworkV2};
use parking_lot::Mutex;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::future::Future;
use std::io;
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
/// Largest frame accepted (a snapshot is one frame).
const MAX_FRAME: usize = 1 << 30;
/// How long dialing a peer may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// What a node does with the requests it receives.
pub trait Handler: Send + Sync + 'static {
    /// Answers request `kind` with `body` (CBOR), or says why not.
    fn handle(&self, kind: u8, body: Bytes)
    -> impl Future<Output = Result<Vec<u8>, String>> + Send;
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
                let _ = stream.set_nodelay(true);
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
        let (handler, tx) = (handler.clone(), tx.clone());
        tokio::spawn(async move {
            let answer = match handler.handle(kind, body).await {
                Ok(b) => frame_bytes(id, OK, &b),
                Err(e) => frame_bytes(id, FAILED, e.as_bytes()),
            };
            let _ = tx.send(answer);
        });
    }
    drop(tx);
    writer.abort();
}

async fn write_frames(
    wr: tokio::net::tcp::OwnedWriteHalf,
    mut rx: mpsc::UnboundedReceiver<Vec<u8>>,
) -> io::Result<()> {
    let mut wr = BufWriter::new(wr);
    while let Some(f) = rx.recv().await {
        wr.write_all(&f).await?;
        // Whatever else is ready goes in the same write.
        while let Ok(f) = rx.try_recv() {
            wr.write_all(&f).await?;
        }
        wr.flush().await?;
    }
    Ok(())
}

fn frame_bytes(id: u64, kind: u8, body: &[u8]) -> Vec<u8> {
    let mut f = Vec::with_capacity(13 + body.len());
    f.extend_from_slice(&((9 + body.len()) as u32).to_le_bytes());
    f.extend_from_slice(&id.to_le_bytes());
    f.push(kind);
    f.extend_from_slice(body);
    f
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
}

#[derive(Debug, Default)]
struct Peer {
    conn: tokio::sync::Mutex<Option<Arc<Conn>>>,
}

#[derive(Debug)]
struct Conn {
    tx: mpsc::UnboundedSender<Vec<u8>>,
    waiting: Arc<Mutex<Waiting>>,
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

    /// Sends request `kind` with `body` to the node at `addr` and waits up to `timeout` for
    /// its answer.
    pub async fn call(
        &self,
        addr: &str,
        kind: u8,
        body: &[u8],
        timeout: Duration,
    ) -> Result<Bytes, CallError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let conn = self.conn(addr).await?;
        let (tx, rx) = oneshot::channel();
        {
            let mut w = conn.waiting.lock();
            let Some(w) = w.as_mut() else {
                return Err(CallError::Unreachable(
                    addr.into(),
                    "connection lost".into(),
                ));
            };
            w.insert(id, tx);
        }
        if conn.tx.send(frame_bytes(id, kind, body)).is_err() {
            return Err(CallError::Unreachable(
                addr.into(),
                "connection lost".into(),
            ));
        }
        match tokio::time::timeout(timeout, rx).await {
            Err(_) => {
                if let Some(w) = conn.waiting.lock().as_mut() {
                    w.remove(&id);
                }
                Err(CallError::Timeout(addr.into(), timeout))
            }
            Ok(Err(_)) => Err(CallError::Unreachable(
                addr.into(),
                "connection lost".into(),
            )),
            Ok(Ok((OK, b))) => Ok(b),
            Ok(Ok((_, b))) => Err(CallError::Remote(
                addr.into(),
                String::from_utf8_lossy(&b).into_owned(),
            )),
        }
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
        let unreachable = |e: String| CallError::Unreachable(addr.to_string(), e);
        let stream = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(addr))
            .await
            .map_err(|_| unreachable("connect timed out".into()))?
            .map_err(|e| unreachable(e.to_string()))?;
        let _ = stream.set_nodelay(true);
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
        let c = Arc::new(Conn { tx, waiting });
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
        action: RPCTypes,
        ttl: Duration,
    ) -> Result<Resp, RPCError<Tc>> {
        let body = to_cbor(&ToGroup {
            group: self.group,
            message,
        })
        .map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        match self.pool.call(&self.addr, kind, &body, ttl).await {
            Ok(b) => from_cbor(&b).map_err(|e| RPCError::Network(NetworkError::new(&e))),
            Err(CallError::Timeout(..)) => Err(RPCError::Timeout(Timeout {
                action,
                id: 0,
                target: self.target,
                timeout: ttl,
            })),
            Err(e @ CallError::Unreachable(..)) => Err(RPCError::Unreachable(Unreachable::new(&e))),
            Err(e @ CallError::Remote(..)) => Err(RPCError::Network(NetworkError::new(&e))),
        }
    }
}

impl RaftNetworkV2<Tc> for GroupPeer {
    type SnapshotData = Bytes;

    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<Tc>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<Tc>, RPCError<Tc>> {
        self.rpc(APPEND, rpc, RPCTypes::AppendEntries, option.soft_ttl())
            .await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<Tc>,
        option: RPCOption,
    ) -> Result<VoteResponse<Tc>, RPCError<Tc>> {
        self.rpc(VOTE, rpc, RPCTypes::Vote, option.soft_ttl()).await
    }

    async fn pre_vote(
        &mut self,
        rpc: VoteRequest<Tc>,
        option: RPCOption,
    ) -> Result<VoteResponse<Tc>, RPCError<Tc>> {
        self.rpc(PRE_VOTE, rpc, RPCTypes::Vote, option.soft_ttl())
            .await
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
        let sent = self.rpc(
            SNAPSHOT,
            request,
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
            RPCTypes::TransferLeader,
            option.soft_ttl(),
        )
        .await
    }
}
