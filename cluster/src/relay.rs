//! Delivery across nodes ([`sluice_engine::Relay`]): each node owns its routes (the topic
//! filters its sessions subscribe) and pushes their changes to every other node, so that
//! every node holds the cluster's subscription table; a message goes only to the nodes
//! with a matching route, through one ordered queue per peer.
//!
//! - **Routes** ([`ROUTES`]): only their owner changes them, so no consensus is needed:
//!   each node numbers its changes and sends each peer the changes since the last one it
//!   took (or the whole set, when the peer lost track: it restarted, or the changes are no
//!   longer kept). A call with no change every [`HEARTBEAT`] finds a restarted peer. A
//!   SUBACK waits until every peer that answers knows the new route.
//! - **Messages** ([`RELAY`]): per peer, a queue in publish order; a message leaves once its
//!   publisher stored it, in batches, one batch in flight. A batch is answered once the
//!   peer's broker queued every message (durably, for sessions that outlive their
//!   connection), and only then is the publisher acknowledged. Batches are numbered per
//!   sender's run, so a batch sent again after a lost answer is not delivered twice. While a
//!   peer does not answer, its queue keeps up to [`MAX_WAITING`] messages (the oldest
//!   dropped beyond, counted) and sends them when it is back; its publishers do not wait.

use crate::raft::net::{self, Frame};
use crate::raft::node::Node;
use crate::topology::SharedTopology;
use bytes::Bytes;
use futures::future::BoxFuture;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use sluice_engine::{Relay as RelayPort, RelaySink, Relaying, RouteChange};
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;
use tokio::sync::{mpsc, oneshot, watch};
use tokio_util::sync::CancellationToken;

pub(crate) use net::{FLUSH, GIVE, PULL, RELAY, ROUTES, STANDBY, TAKE, WILLS};

mod batch;
mod pull;
mod standby;
mod wills;

/// What a [`FLUSH`] call runs on this node: writes table `.0`'s rows of the shards led here
/// as files and commits them; the files written.
pub(crate) type Flusher = Arc<dyn Fn(u64) -> BoxFuture<'static, Result<u64, String>> + Send + Sync>;

/// What a [`SHARD_ROWS`](net::SHARD_ROWS) call runs on this node: the request's rows of a
/// shard replicated here.
pub(crate) type RowsServer =
    Arc<dyn Fn(Bytes) -> BoxFuture<'static, Result<Vec<u8>, String>> + Send + Sync>;

/// How long a peer has to answer a call before it counts as not answering.
const CALL_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a connecting client waits for a node to hand its session over.
const TAKE_TIMEOUT: Duration = Duration::from_secs(1);
/// How often routes are checked with a peer when nothing changes.
const HEARTBEAT: Duration = Duration::from_secs(1);
/// How long to wait before calling a peer that did not answer again.
const RETRY: Duration = Duration::from_millis(300);
/// The longest a SUBACK waits for the peers to learn its route.
const ROUTES_WAIT: Duration = Duration::from_secs(5);
/// Route changes kept for sending as changes (beyond, the whole set is sent).
const KEPT_CHANGES: usize = 4096;
/// Messages per batch, at most.
const BATCH: usize = 1024;
/// Messages kept for a peer that does not answer.
const MAX_WAITING: usize = 100_000;

/// A change to this node's routes, or the whole set, as [`ROUTES`] carries it.
#[derive(Debug, Serialize, Deserialize)]
struct RoutesCall {
    from: u64,
    incarnation: u64,
    /// The change the peer had (ignored with `full`).
    since: u64,
    /// The change this brings the peer to.
    seq: u64,
    full: Option<Vec<Change>>,
    changes: Vec<Change>,
    /// The caller reads a second byte in the answer: whether this node reads the ids and
    /// destinations of relayed messages (an older caller reads one byte).
    #[serde(default)]
    ids: bool,
}

/// One change to a node's routes or to its registry of lasting sessions.
#[derive(Debug, Clone, Serialize, Deserialize)]
enum Change {
    /// A filter subscribed (`true`) or no longer.
    Route(String, bool),
    /// A lasting session of this client id: its subscriptions (the broker's encoding), or
    /// (empty) its end.
    Session(
        String,
        #[serde(with = "crate::raft::types::as_bytes")] Bytes,
    ),
    /// A connection of this client id has this will and delay (seconds), or (empty) none.
    Will(
        String,
        u32,
        #[serde(with = "crate::raft::types::as_bytes")] Bytes,
    ),
}

/// This node's routes: the filters its sessions subscribe, numbered changes.
#[derive(Debug, Default)]
struct LocalRoutes {
    set: BTreeSet<String>,
    sessions: BTreeMap<String, Bytes>,
    wills: BTreeMap<String, wills::Will>,
    seq: u64,
    /// The latest changes, numbered.
    log: VecDeque<(u64, Change)>,
}

impl LocalRoutes {
    fn change(&mut self, change: Change, changed: &watch::Sender<u64>) -> u64 {
        self.seq += 1;
        self.log.push_back((self.seq, change));
        if self.log.len() > KEPT_CHANGES {
            self.log.pop_front();
        }
        changed.send_replace(self.seq);
        self.seq
    }

    fn full(&self) -> Vec<Change> {
        let routes = (self.set.iter()).map(|f| Change::Route(f.clone(), true));
        let sessions = (self.sessions.iter()).map(|(c, b)| Change::Session(c.clone(), b.clone()));
        let wills = (self.wills.iter()).map(|(c, w)| Change::Will(c.clone(), w.0, w.1.clone()));
        routes.chain(sessions).chain(wills).collect()
    }
}

/// Another node's routes as this node knows them.
#[derive(Debug, Default)]
struct RemoteRoutes {
    incarnation: u64,
    seq: u64,
    set: BTreeSet<String>,
    sessions: BTreeMap<String, Bytes>,
    wills: BTreeMap<String, wills::Will>,
}

/// What a peer knows of this node's routes.
#[derive(Debug, Clone, Copy, Default)]
struct Known {
    seq: u64,
    /// The last call to it failed.
    down: bool,
    /// When it last answered.
    answered: Option<std::time::Instant>,
    /// It reads the ids and destinations of relayed messages (it said so).
    ids: bool,
}

/// A sender's run and the last message of it taken.
type Received = tokio::sync::Mutex<(u64, u64)>;

/// A message waiting to be released by its publisher.
struct Slot {
    bytes: Bytes,
    go: oneshot::Receiver<bool>,
    accepted: oneshot::Sender<()>,
    /// When the publisher queued it (see `Relay::send_batch`).
    queued: tokio::time::Instant,
}

/// What a peer's queue carries: a message, or a [`PULL`]'s request for what it holds once
/// everything queued before it is released.
enum Item {
    Message(Slot),
    Pull(oneshot::Sender<Vec<Bytes>>),
}

/// Publishers waiting for a peer to take their messages: number, answer, when queued.
type Waiters = Vec<(u64, oneshot::Sender<()>, tokio::time::Instant)>;

/// One other node: its queue and what it knows of the routes.
struct Peer {
    queue: mpsc::UnboundedSender<Item>,
    known: watch::Sender<Known>,
    /// The peer started again: it needs the whole set.
    resync: tokio::sync::Notify,
}

/// See the module docs.
pub(crate) struct Relay {
    node: Arc<Node>,
    topology: SharedTopology,
    incarnation: u64,
    routes: Mutex<LocalRoutes>,
    changed: watch::Sender<u64>,
    peers: Mutex<HashMap<u64, Arc<Peer>>>,
    remote: Mutex<HashMap<u64, RemoteRoutes>>,
    /// What became of the other nodes' wills (locked after `remote`).
    fates: Mutex<wills::Fates>,
    sink: OnceLock<Arc<dyn RelaySink>>,
    /// The broker has loaded its sessions (its routes are complete): only then are they
    /// sent, so that a restarted node does not tell its peers it has none.
    ready: watch::Sender<bool>,
    /// The peers whose whole set of routes this run has.
    learned: watch::Sender<BTreeSet<u64>>,
    /// Per sender: its run and the last message taken, behind a lock held while its batch
    /// is delivered (a batch sent again waits for the first).
    received: Mutex<HashMap<u64, Arc<Received>>>,
    /// Messages dropped for peers that did not answer long enough.
    pub(crate) dropped: AtomicU64,
    /// Answers [`FLUSH`] calls (set by the cluster).
    pub(crate) flusher: OnceLock<Flusher>,
    /// Answers [`SHARD_ROWS`](net::SHARD_ROWS) calls (set by the cluster).
    pub(crate) rows_server: OnceLock<RowsServer>,
    cancel: CancellationToken,
    me: Weak<Relay>,
}

impl std::fmt::Debug for Relay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Relay")
            .field("node", &self.node.id())
            .finish()
    }
}

impl Relay {
    /// The relay of `node`, whose run is `incarnation`; starts keeping the routes of every
    /// node of `topology` in step.
    pub(crate) fn start(
        node: Arc<Node>,
        topology: SharedTopology,
        incarnation: u64,
        cancel: CancellationToken,
    ) -> Arc<Self> {
        let relay = Arc::new_cyclic(|me| Self {
            node,
            topology,
            incarnation,
            routes: Mutex::new(LocalRoutes::default()),
            changed: watch::channel(0).0,
            peers: Mutex::new(HashMap::new()),
            remote: Mutex::new(HashMap::new()),
            fates: Mutex::new(wills::Fates::default()),
            sink: OnceLock::new(),
            ready: watch::channel(false).0,
            learned: watch::channel(BTreeSet::new()).0,
            received: Mutex::new(HashMap::new()),
            dropped: AtomicU64::new(0),
            flusher: OnceLock::new(),
            rows_server: OnceLock::new(),
            cancel,
            me: me.clone(),
        });
        relay.node.set_relay(Arc::downgrade(&relay));
        for id in relay.peer_ids() {
            relay.peer(id);
        }
        tokio::spawn(relay.clone().watch_wills());
        relay
    }

    fn peer_ids(&self) -> Vec<u64> {
        let me = self.node.id();
        (self.topology.lock().as_ref())
            .map(|t| t.nodes.keys().copied().filter(|n| *n != me).collect())
            .unwrap_or_default()
    }

    /// Peer `id`, its tasks started on first use.
    fn peer(&self, id: u64) -> Arc<Peer> {
        let mut peers = self.peers.lock();
        if let Some(p) = peers.get(&id) {
            return p.clone();
        }
        let (queue, rx) = mpsc::unbounded_channel();
        let peer = Arc::new(Peer {
            queue,
            known: watch::channel(Known::default()).0,
            resync: tokio::sync::Notify::new(),
        });
        peers.insert(id, peer.clone());
        if let Some(me) = self.me.upgrade() {
            tokio::spawn(me.clone().sync_routes(id, peer.clone()));
            tokio::spawn(me.forward(id, rx));
        }
        peer
    }

    /// Asks node `to` to flush table `table` ([`FLUSH`]); the files it wrote.
    pub(crate) async fn flush_on(&self, to: u64, table: u64) -> Result<u64, String> {
        let frame = Frame::cbor(FLUSH, &table, 16).map_err(|e| e.to_string())?;
        let b = self
            .node
            .call(to, frame, crate::WRITE_DEADLINE)
            .await
            .map_err(|e| e.to_string())?;
        crate::from_cbor(&b).map_err(|e| e.to_string())
    }

    async fn call(&self, to: u64, frame: Frame) -> Result<Bytes, String> {
        self.node
            .call(to, frame, CALL_TIMEOUT)
            .await
            .map_err(|e| e.to_string())
    }

    /// Keeps peer `id` told of this node's routes.
    async fn sync_routes(self: Arc<Self>, id: u64, peer: Arc<Peer>) {
        let mut changed = self.changed.subscribe();
        // The change the peer has, when it has this run's routes.
        let mut has: Option<u64> = None;
        let mut ready = self.ready.subscribe();
        tokio::select! {
            _ = self.cancel.cancelled() => return,
            _ = ready.wait_for(|r| *r) => {}
        }
        loop {
            let target = *changed.borrow_and_update();
            let call = {
                let r = self.routes.lock();
                let oldest = r.log.front().map_or(r.seq + 1, |c| c.0);
                let changes = has.filter(|h| *h + 1 >= oldest).map(|h| {
                    (r.log.iter())
                        .filter(|c| c.0 > h)
                        .map(|c| c.1.clone())
                        .collect()
                });
                RoutesCall {
                    from: self.node.id(),
                    incarnation: self.incarnation,
                    since: has.unwrap_or(0),
                    seq: r.seq,
                    full: changes.is_none().then(|| r.full()),
                    changes: changes.unwrap_or_default(),
                    ids: true,
                }
            };
            let seq = call.seq;
            let answer = match Frame::cbor(ROUTES, &call, 64) {
                Ok(f) => self.call(id, f).await,
                Err(e) => Err(e.to_string()),
            };
            match answer.as_deref() {
                Ok([1, ids @ ..]) => {
                    has = Some(seq);
                    let answered = Some(std::time::Instant::now());
                    (peer.known).send_replace(Known {
                        seq,
                        down: false,
                        answered,
                        ids: ids == [1],
                    });
                }
                // The peer lost track: the whole set next.
                Ok(_) => {
                    has = None;
                    continue;
                }
                Err(e) => {
                    if !peer.known.borrow().down {
                        tracing::info!(peer = id, error = %e, "a node does not answer; its messages wait");
                    }
                    has = None;
                    peer.known.send_modify(|k| k.down = true);
                    tokio::select! {
                        _ = self.cancel.cancelled() => return,
                        _ = tokio::time::sleep(RETRY) => continue,
                    }
                }
            }
            if *changed.borrow() != target {
                continue;
            }
            tokio::select! {
                _ = self.cancel.cancelled() => return,
                _ = changed.changed() => {}
                _ = peer.resync.notified() => has = None,
                _ = tokio::time::sleep(HEARTBEAT) => {}
            }
        }
    }

    /// Answers a [`ROUTES`] or [`RELAY`] call from a peer.
    pub(crate) async fn handle(&self, kind: u8, body: Bytes) -> Result<Vec<u8>, String> {
        match kind {
            ROUTES => {
                let call: RoutesCall = crate::from_cbor(&body).map_err(|e| e.to_string())?;
                let ids = call.ids;
                let mut answer = vec![u8::from(self.learn_routes(call))];
                if ids && answer == [1] {
                    answer.push(1);
                }
                Ok(answer)
            }
            TAKE => {
                let (client, clean): (String, bool) =
                    crate::from_cbor(&body).map_err(|e| e.to_string())?;
                self.forget_will(&client);
                // Not started: its sessions may not be loaded yet, so it cannot say.
                let Some(sink) = self.sink.get().cloned() else {
                    return Err(format!("node {}'s broker has not started", self.node.id()));
                };
                // An empty answer: nothing to hand over; else a 1 and the session.
                Ok(match sink.hand_over(client, clean).await {
                    Some(b) => std::iter::once(1).chain(b).collect(),
                    None => Vec::new(),
                })
            }
            FLUSH => {
                let table: u64 = crate::from_cbor(&body).map_err(|e| e.to_string())?;
                let Some(flush) = self.flusher.get().cloned() else {
                    return Err(format!("node {} has not started", self.node.id()));
                };
                let files = flush(table).await?;
                crate::to_cbor(&files).map_err(|e| e.to_string())
            }
            net::SHARD_ROWS => match self.rows_server.get().cloned() {
                Some(serve) => serve(body).await,
                None => Err(format!("node {} has not started", self.node.id())),
            },
            GIVE => {
                let (client, held): (String, serde_bytes_vec::Held) =
                    crate::from_cbor(&body).map_err(|e| e.to_string())?;
                let Some(sink) = self.sink.get().cloned() else {
                    return Err(format!("node {}'s broker has not started", self.node.id()));
                };
                match sink.take_given(client.clone(), held.0).await {
                    true => Ok(Vec::new()),
                    false => Err(format!("no lasting session of client {client:?} here")),
                }
            }
            STANDBY => self.serve_standby(body).await,
            PULL => self.serve_pull(body).await,
            WILLS => {
                let (from, incarnation): (u64, u64) =
                    crate::from_cbor(&body).map_err(|e| e.to_string())?;
                self.claimed(from, incarnation)
            }
            _ => self.receive(body).await.map(|()| Vec::new()),
        }
    }

    /// Takes a peer's routes; false when they do not follow from what this node has.
    fn learn_routes(&self, call: RoutesCall) -> bool {
        let mut remote = self.remote.lock();
        let r = remote.entry(call.from).or_default();
        let sink = self.sink.get();
        if let Some(full) = call.full {
            if r.incarnation != call.incarnation {
                // The wills of its previous run not yet published are orphans.
                let known = *self.peer(call.from).known.borrow();
                let silent =
                    (known.answered.filter(|_| known.down)).unwrap_or_else(std::time::Instant::now);
                self.fates.lock().ended(call.from, r, silent);
                // A new run of that node: it knows none of this node's routes.
                self.peer(call.from).resync.notify_one();
                self.learned.send_modify(|l| {
                    l.insert(call.from);
                });
            }
            r.incarnation = call.incarnation;
            r.seq = call.seq;
            r.set.clear();
            r.sessions.clear();
            r.wills.clear();
            for c in full {
                match c {
                    Change::Route(f, _) => r.set.insert(f),
                    Change::Session(c, b) => r.sessions.insert(c, b).is_some(),
                    Change::Will(c, d, b) => r.wills.insert(c, (d, b)).is_some(),
                };
            }
            if let Some(s) = sink {
                s.routes(
                    call.from,
                    RouteChange::Replace(r.set.iter().cloned().collect()),
                );
            }
            return true;
        }
        if r.incarnation != call.incarnation || r.seq != call.since {
            return false;
        }
        r.seq = call.seq;
        for change in call.changes {
            let (filter, present) = match change {
                Change::Route(f, p) => (f, p),
                Change::Session(c, b) if b.is_empty() => {
                    r.sessions.remove(&c);
                    continue;
                }
                Change::Session(c, b) => {
                    r.sessions.insert(c, b);
                    continue;
                }
                Change::Will(c, _, b) if b.is_empty() => {
                    r.wills.remove(&c);
                    continue;
                }
                Change::Will(c, d, b) => {
                    r.wills.insert(c, (d, b));
                    continue;
                }
            };
            let changed = match present {
                true => r.set.insert(filter.clone()),
                false => r.set.remove(&filter),
            };
            if let (true, Some(s)) = (changed, sink) {
                s.routes(
                    call.from,
                    match present {
                        true => RouteChange::Add(filter),
                        false => RouteChange::Remove(filter),
                    },
                );
            }
        }
        true
    }
}

impl RelayPort for Relay {
    fn node(&self) -> u64 {
        self.node.id()
    }

    fn set_route(&self, filter: &str, present: bool) -> u64 {
        let mut r = self.routes.lock();
        let changed = match present {
            true => r.set.insert(filter.to_string()),
            false => r.set.remove(filter),
        };
        if changed {
            r.change(Change::Route(filter.to_string(), present), &self.changed);
        }
        r.seq
    }

    fn set_session(&self, client: &str, held: Option<Bytes>) -> u64 {
        let mut r = self.routes.lock();
        let held = held.unwrap_or_default();
        let same = match r.sessions.get(client) {
            Some(b) => *b == held,
            None => held.is_empty(),
        };
        if same {
            return r.seq;
        }
        match held.is_empty() {
            true => r.sessions.remove(client),
            false => r.sessions.insert(client.to_string(), held.clone()),
        };
        r.change(Change::Session(client.to_string(), held), &self.changed)
    }

    fn session_elsewhere(&self, client: &str) -> Option<(u64, bool, Bytes)> {
        let remote = self.remote.lock();
        let (node, b) = remote
            .iter()
            .find_map(|(n, r)| r.sessions.get(client).map(|b| (*n, b.clone())))?;
        drop(remote);
        let down = self.peer(node).known.borrow().down;
        Some((node, down, b))
    }

    fn takes_ids(&self, node: u64) -> bool {
        self.peer(node).known.borrow().ids
    }

    fn routes_known(&self, seq: u64) -> BoxFuture<'static, ()> {
        let watches: Vec<watch::Receiver<Known>> = (self.peer_ids().into_iter())
            .map(|id| self.peer(id).known.subscribe())
            .collect();
        Box::pin(async move {
            let all = futures::future::join_all(watches.into_iter().map(|mut w| async move {
                let _ = w.wait_for(|k| k.seq >= seq || k.down).await;
            }));
            let _ = tokio::time::timeout(ROUTES_WAIT, all).await;
        })
    }

    fn send(&self, to: &[u64], message: Bytes) -> Relaying {
        let mut out = Relaying::none();
        let queued = tokio::time::Instant::now();
        for id in to {
            let (r, go, accepted) = Relaying::slot();
            let slot = Slot {
                bytes: message.clone(),
                go,
                accepted,
                queued,
            };
            if self.peer(*id).queue.send(Item::Message(slot)).is_ok() {
                out.join(r);
            }
        }
        out
    }

    fn peers(&self) -> Vec<u64> {
        self.peer_ids()
    }

    fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    fn set_sink(&self, sink: Arc<dyn RelaySink>) {
        let remote = self.remote.lock();
        for (node, r) in remote.iter() {
            sink.routes(*node, RouteChange::Replace(r.set.iter().cloned().collect()));
        }
        let _ = self.sink.set(sink);
        drop(remote);
        self.ready.send_replace(true);
    }

    fn take_session(&self, client: &str, clean: bool) -> BoxFuture<'static, Vec<Bytes>> {
        // Nodes known not to answer are not waited for.
        let up: Vec<u64> = (self.peer_ids().into_iter())
            .filter(|id| !self.peer(*id).known.borrow().down)
            .collect();
        self.forget_will(client);
        let (me, client) = (self.me.clone(), client.to_string());
        Box::pin(async move {
            let Some(me) = me.upgrade() else {
                return Vec::new();
            };
            let calls = up.into_iter().map(|id| {
                let (me, client) = (me.clone(), client.clone());
                async move {
                    let frame = Frame::cbor(TAKE, &(client, clean), 64).ok()?;
                    let b = me.node.call(id, frame, TAKE_TIMEOUT).await.ok()?;
                    (b.first() == Some(&1)).then(|| b.slice(1..))
                }
            });
            futures::future::join_all(calls)
                .await
                .into_iter()
                .flatten()
                .collect()
        })
    }

    fn give(&self, node: u64, client: &str, held: Bytes) -> BoxFuture<'static, bool> {
        let (me, client) = (self.me.clone(), client.to_string());
        Box::pin(async move {
            let Some(me) = me.upgrade() else {
                return false;
            };
            let Ok(frame) = Frame::cbor(GIVE, &(client, serde_bytes_vec::Held(held)), 64) else {
                return false;
            };
            me.node.call(node, frame, CALL_TIMEOUT).await.is_ok()
        })
    }

    fn answers(&self, node: u64) -> bool {
        self.answering(node)
    }

    fn standby_call(&self, node: u64, call: Bytes) -> BoxFuture<'static, Option<Bytes>> {
        self.call_standby(node, call)
    }

    fn received_before(&self, marks: Vec<(u64, u64, u64)>) {
        let mut received = self.received.lock();
        for (from, incarnation, last) in marks {
            received.insert(from, Arc::new(tokio::sync::Mutex::new((incarnation, last))));
        }
    }

    fn set_will(&self, client: &str, will: Option<(Bytes, u32)>) {
        self.share_will(client, will.map(|(b, d)| (d, b)));
    }

    fn pull(&self, node: u64, filters: Vec<String>) -> BoxFuture<'static, Vec<Bytes>> {
        self.pull_from_all(node, filters)
    }

    fn claim_wills(&self) -> BoxFuture<'static, sluice_engine::ClaimedWills> {
        let me = self.me.clone();
        Box::pin(async move {
            match me.upgrade() {
                Some(me) => me.claim().await,
                None => Default::default(),
            }
        })
    }

    fn peers_known(&self) -> BoxFuture<'static, ()> {
        let peers: Vec<(u64, watch::Receiver<Known>)> = (self.peer_ids().into_iter())
            .map(|id| (id, self.peer(id).known.subscribe()))
            .collect();
        let learned = self.learned.subscribe();
        Box::pin(async move {
            let all = futures::future::join_all(peers.into_iter().map(|(id, mut known)| {
                let mut learned = learned.clone();
                async move {
                    tokio::select! {
                        _ = learned.wait_for(|l| l.contains(&id)) => {}
                        _ = known.wait_for(|k| k.down) => {}
                    }
                }
            }));
            let _ = tokio::time::timeout(ROUTES_WAIT, all).await;
        })
    }
}

/// Bytes as a CBOR byte string inside a tuple.
mod serde_bytes_vec {
    use bytes::Bytes;
    use serde::{Deserialize, Serialize};

    #[derive(Serialize, Deserialize)]
    pub(crate) struct Held(#[serde(with = "crate::raft::types::as_bytes")] pub(crate) Bytes);
}
