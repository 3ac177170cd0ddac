//! A node's raft groups: opened from their directories, each with its log in the node's one
//! log file and its network on the node's one pool, and answering the requests peers send.

use crate::raft::log::{LogStore, LogWriter};
use crate::raft::net::{
    self, Frame, GroupNetwork, Handler, Pool, Reply, SnapshotRequest, StreamRequest, ToGroup,
};
use crate::raft::sm::{GroupState, StateMachine};
use crate::raft::types::{Command, GroupId, Response, Tc, from_cbor, to_cbor};
use bytes::Bytes;
use futures::StreamExt;
use openraft::async_runtime::WatchReceiver;
use openraft::error::{ClientWriteError, RaftError};
use openraft::raft::AppendEntriesRequest;
use openraft::type_config::alias::SnapshotOf;
use openraft::{Config, Raft, ReadPolicy, SnapshotPolicy};
use parking_lot::{Mutex, RwLock};
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// The state machine every group uses: what it applies to is chosen per group.
pub type GroupMachine = StateMachine<DynGroupState>;

/// Any [`GroupState`] (a shard's tables, the catalog).
#[derive(Clone)]
pub struct DynGroupState(pub Arc<dyn GroupState>);

impl std::fmt::Debug for DynGroupState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DynGroupState")
    }
}
/// One group's raft.
pub type GroupRaft = Raft<Tc, GroupMachine>;

impl GroupState for DynGroupState {
    fn apply(&self, index: u64, command: &Command) -> Response {
        self.0.apply(index, command)
    }
    fn snapshot(&self) -> io::Result<(Option<u64>, Bytes)> {
        self.0.snapshot()
    }
    fn restore(&self, data: &[u8]) -> io::Result<()> {
        self.0.restore(data)
    }
}

/// Raft timing. A follower starts an election only once the leader's lease has run out
/// (openraft: `election_timeout_max` after the last heartbeat a quorum acknowledged, which
/// is also what the lease reads of [`Node::read_barrier`] rely on) and then its own election
/// timeout has passed: a leader that stops is replaced about 1.5–1.8 s after its last
/// heartbeat (about 2.4 s when the first election fails), inside the 3 s failover goal.
/// With 1,200 ms and 800–1,200 ms it took 2.0–2.4 s, and a frozen leader held its groups'
/// writes for the whole of a 3 s freeze in about one fault in three (`cluster_chaos`).
/// Pre-Vote keeps a node that comes back from a partition from deposing a healthy leader.
pub fn raft_config(name: &str) -> io::Result<Config> {
    Config {
        cluster_name: name.to_string(),
        heartbeat_interval: 150,
        election_timeout_min: 600,
        election_timeout_max: 900,
        enable_pre_vote: Some(true),
        // A full snapshot's send includes the follower's install, which may wait for the
        // metadata group (`restore_shard`, up to 30 s): at openraft's 200 ms default a slow
        // install timed out on the leader every time, and as shards snapshot every flush the
        // next send was a newer snapshot, installed as slowly (a learner never caught up).
        install_snapshot_timeout: INSTALL_TIMEOUT.as_millis() as u64,
        // Data shards are snapshotted when their rows are in Parquet, not every N entries.
        snapshot_policy: SnapshotPolicy::Never,
        // Behind a snapshot the log is purged but for this many entries: a replica further
        // behind catches up from the snapshot (the shared store), not from the log.
        max_in_snapshot_log_to_keep: LOG_KEPT_BEHIND_SNAPSHOT,
        ..Config::default()
    }
    .validate()
    .map_err(io::Error::other)
}

/// How long a leader waits for a follower to take and install a full snapshot.
const INSTALL_TIMEOUT: Duration = Duration::from_secs(40);

/// Entries a group keeps in its log behind its snapshot.
pub(crate) const LOG_KEPT_BEHIND_SNAPSHOT: u64 = 256;

/// This node's groups.
pub struct Node {
    id: u64,
    dir: PathBuf,
    pool: Arc<Pool>,
    writer: Arc<LogWriter>,
    groups: RwLock<HashMap<GroupId, GroupRaft>>,
    /// Node-to-node addresses of every node (for forwarding writes to leaders).
    peers: RwLock<BTreeMap<u64, String>>,
    /// The replication streams leaders send this node, by connection and stream id.
    streams: Mutex<HashMap<(u64, u64), AppendStream>>,
    /// Where routes and relayed messages go (`crate::relay`).
    relay: std::sync::OnceLock<std::sync::Weak<crate::relay::Relay>>,
    /// The node that last took a write for a group this node has no replica of: where
    /// the next one goes first.
    led_by: Mutex<HashMap<GroupId, u64>>,
    /// When each node last failed a probe ([`Node::call_while_answering`]), until it answers
    /// a call again: asked last while [`SILENT_FOR`] has not passed.
    silent: Mutex<HashMap<u64, tokio::time::Instant>>,
}

/// A replication stream from a leader: its requests go to the group's raft in order, and
/// each answer to the reply waiting longest.
struct AppendStream {
    requests: tokio::sync::mpsc::UnboundedSender<AppendEntriesRequest<Tc>>,
    replies: Arc<Mutex<Replies>>,
}

#[derive(Default)]
struct Replies {
    waiting: VecDeque<Reply>,
    /// The raft ended the stream (a conflict, a higher vote, or it stopped): later requests
    /// are refused.
    ended: bool,
}

impl AppendStream {
    fn open(raft: &GroupRaft) -> Self {
        let (requests, rx) = tokio::sync::mpsc::unbounded_channel();
        let input =
            futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|r| (r, rx)) });
        let answers = raft.stream_append(input);
        let replies = Arc::new(Mutex::new(Replies::default()));
        let r = replies.clone();
        tokio::spawn(async move {
            let mut answers = std::pin::pin!(answers);
            while let Some(answer) = answers.next().await {
                let answer = match answer {
                    Ok(result) => to_cbor(&result).map_err(|e| e.to_string()),
                    Err(fatal) => Err(fatal.to_string()),
                };
                match r.lock().waiting.pop_front() {
                    Some(reply) => reply.send(answer),
                    None => break,
                }
            }
            let mut r = r.lock();
            r.ended = true;
            for reply in r.waiting.drain(..) {
                reply.send(Err("the replication stream ended".into()));
            }
        });
        Self { requests, replies }
    }

    /// Passes `request` on; `reply` gets its answer.
    fn take(&self, request: AppendEntriesRequest<Tc>, reply: Reply) {
        let mut r = self.replies.lock();
        if r.ended {
            drop(r);
            return reply.send(Err("the replication stream ended".into()));
        }
        r.waiting.push_back(reply);
        if self.requests.send(request).is_err() {
            let reply = r.waiting.pop_back();
            drop(r);
            if let Some(reply) = reply {
                reply.send(Err("the replication stream ended".into()));
            }
        }
    }
}

/// How long [`Node::write`] keeps looking for a leader that takes its command.
pub const WRITE_DEADLINE: Duration = Duration::from_secs(10);

/// How long a call waits before its peer is asked whether it still answers at all, and how
/// often again after that ([`Node::call_while_answering`]).
pub(crate) const PROBE_AFTER: Duration = Duration::from_millis(500);
/// How long the peer has to answer that: a frozen or dead peer counts as down then.
pub(crate) const PROBE_TIMEOUT: Duration = Duration::from_millis(400);
/// How long a node that failed a probe is asked last by reads ([`Node::silent_lately`]).
const SILENT_FOR: Duration = Duration::from_secs(10);
/// How long a write forwarded to another node may take before it is sent again (to the
/// leader known then; a copy that was committed after all is dropped by the state machine, by its write id),
/// and how long a read-index call to a leader that answers probes may take.
const FORWARD_TIMEOUT: Duration = Duration::from_secs(3);

/// Why [`Node::write`] failed.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    /// No leader took the command in time; it was not committed.
    #[error("{group}: no leader accepted the write within {secs} s ({last})")]
    NoLeader {
        /// The group.
        group: GroupId,
        /// Seconds waited.
        secs: u64,
        /// The last thing that went wrong.
        last: String,
    },
    /// The group stopped or failed on this node.
    #[error("{0}")]
    Failed(String),
}

/// A read-index request's answer.
#[derive(Debug, Serialize, serde::Deserialize)]
enum ReadAnswer {
    /// Apply up to this index before reading.
    Index(u64),
    /// This node does not lead the group.
    NotLeader,
    /// The group failed here.
    Failed(String),
}

/// A forwarded client write's answer.
#[derive(Debug, Serialize, serde::Deserialize)]
enum WriteAnswer {
    /// Committed and applied on the leader.
    Done(Response),
    /// This node does not lead the group; the leader it knows of, if any.
    NotLeader(Option<u64>),
    /// Appended but maybe discarded by a leader change: committed or not, unknown.
    Unknown(String),
    /// The group failed here.
    Failed(String),
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node").field("id", &self.id).finish()
    }
}

impl Node {
    /// A node with no groups yet, keeping them under `dir`.
    pub fn new(id: u64, dir: &Path) -> io::Result<Arc<Self>> {
        Ok(Arc::new(Self {
            id,
            dir: dir.to_path_buf(),
            pool: Pool::new(),
            writer: LogWriter::open(&dir.join("raft.log"))?,
            groups: RwLock::new(HashMap::new()),
            peers: RwLock::new(BTreeMap::new()),
            streams: Mutex::new(HashMap::new()),
            relay: std::sync::OnceLock::new(),
            led_by: Mutex::new(HashMap::new()),
            silent: Mutex::new(HashMap::new()),
        }))
    }

    /// Answers routes and relayed messages with `relay`.
    pub(crate) fn set_relay(&self, relay: std::sync::Weak<crate::relay::Relay>) {
        let _ = self.relay.set(relay);
    }

    /// Sends `frame` to node `to` and waits up to `timeout` for its answer.
    pub(crate) async fn call(
        &self,
        to: u64,
        frame: Frame,
        timeout: Duration,
    ) -> Result<Bytes, net::CallError> {
        let addr = (self.peers.read().get(&to).cloned()).ok_or_else(|| {
            net::CallError::Unreachable(format!("node {to}"), "no address".into())
        })?;
        self.pool.call(&addr, frame, timeout).await
    }

    /// [`Self::call`], waiting up to `limit` for the answer as long as `to` answers a probe
    /// ([`net::PING`]) first sent at `probe_at`, then every [`PROBE_AFTER`]: a frozen or
    /// cut-off node fails the call about [`PROBE_TIMEOUT`] after a probe, while a slow one
    /// (a query's part waiting out an election, a batch held by a full queue) is waited
    /// for. The answer is taken while a probe is on its way too.
    pub(crate) async fn call_while_answering(
        &self,
        to: u64,
        frame: Frame,
        limit: Duration,
        mut probe_at: tokio::time::Instant,
    ) -> Result<Bytes, net::CallError> {
        let call = self.call(to, frame, limit);
        tokio::pin!(call);
        loop {
            let probe = async {
                tokio::time::sleep_until(probe_at).await;
                let ping = Frame::cbor(net::PING, &(), 0).map_err(|e| {
                    net::CallError::Unreachable(format!("node {to}"), e.to_string())
                })?;
                match self.call(to, ping, PROBE_TIMEOUT).await {
                    // Any answer, an older node's refusal of the kind included.
                    Ok(_) | Err(net::CallError::Remote(..)) => Ok(()),
                    Err(e) => Err(net::CallError::Unreachable(
                        format!("node {to}"),
                        format!("does not answer: {e}"),
                    )),
                }
            };
            tokio::select! {
                biased;
                a = &mut call => {
                    if a.is_ok() {
                        self.silent.lock().remove(&to);
                    }
                    return a;
                }
                p = probe => {
                    if let Err(e) = p {
                        self.silent.lock().insert(to, tokio::time::Instant::now());
                        return Err(e);
                    }
                }
            }
            probe_at = tokio::time::Instant::now() + PROBE_AFTER;
        }
    }

    /// Whether `node` failed a probe within [`SILENT_FOR`] and has answered no call since:
    /// a read asks it only after the others.
    pub(crate) fn silent_lately(&self, node: u64) -> bool {
        (self.silent.lock().get(&node)).is_some_and(|at| at.elapsed() < SILENT_FOR)
    }

    /// Sets the node-to-node address of every node (this one included).
    pub fn set_peers(&self, peers: BTreeMap<u64, String>) {
        *self.peers.write() = peers;
    }

    /// Learns the addresses of `nodes` (a node added to the cluster).
    pub fn add_peers(&self, nodes: &BTreeMap<u64, String>) {
        let mut peers = self.peers.write();
        for (id, addr) in nodes {
            peers.insert(*id, addr.clone());
        }
    }

    /// Every node's address, by id.
    pub fn peers(&self) -> BTreeMap<u64, String> {
        self.peers.read().clone()
    }

    /// Commits `command` in `group` through the group's leader, wherever it is, and returns
    /// what applying it answered there. `replicas` are the nodes that may lead the group
    /// (tried when this node has no replica and no leader is known).
    ///
    /// A command is re-sent only when it may have been committed already (a leader died
    /// after receiving it), or surely was not: so the state machine must drop a second copy of a
    /// command it has applied, which it can tell by an id inside the command.
    pub async fn write(
        &self,
        group: GroupId,
        command: Command,
        replicas: &[u64],
    ) -> Result<Response, WriteError> {
        let deadline = tokio::time::Instant::now() + WRITE_DEADLINE;
        let mut local = self.group(group);
        let mut target = match &local {
            Some(r) => r.metrics().borrow_watched().current_leader,
            None => self.led_by.lock().get(&group).copied(),
        };
        let mut turn = 0usize;
        let mut last;
        loop {
            let to = match target.take() {
                Some(t) => t,
                None if local.is_some() => self.id,
                None if replicas.is_empty() => {
                    return Err(WriteError::Failed(format!("{group}: no replicas")));
                }
                None => {
                    turn += 1;
                    replicas[turn % replicas.len()]
                }
            };
            let answer = if to == self.id {
                match &local {
                    Some(raft) => Self::write_local(raft, command.clone()).await,
                    None => WriteAnswer::NotLeader(None),
                }
            } else {
                self.forward_until_moved(to, group, &command, local.as_ref())
                    .await
            };
            match answer {
                WriteAnswer::Done(r) => {
                    if local.is_none() {
                        self.led_by.lock().insert(group, to);
                    }
                    return Ok(r);
                }
                WriteAnswer::Failed(e) => return Err(WriteError::Failed(e)),
                WriteAnswer::NotLeader(leader) => {
                    last = format!("node {to} does not lead it");
                    target = leader.filter(|l| *l != to);
                }
                WriteAnswer::Unknown(e) => {
                    last = format!("node {to}: {e}");
                    // A replica closed meanwhile leaves this node's groups.
                    local = self.group(group);
                }
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(WriteError::NoLeader {
                    group,
                    secs: WRITE_DEADLINE.as_secs(),
                    last,
                });
            }
            if target.is_none() {
                // An election is likely under way: let it finish.
                tokio::time::sleep(Duration::from_millis(100)).await;
                target = local
                    .as_ref()
                    .and_then(|r| r.metrics().borrow_watched().current_leader);
            }
        }
    }

    /// Waits until this node has applied everything `group` had committed when this was
    /// called (the leader's ReadIndex, confirmed by a quorum), so that a read here sees
    /// every write acknowledged before it.
    pub async fn read_barrier(&self, group: GroupId) -> Result<(), WriteError> {
        let Some(raft) = self.group(group) else {
            return Err(WriteError::Failed(format!(
                "node {} has no {group}",
                self.id
            )));
        };
        let deadline = tokio::time::Instant::now() + WRITE_DEADLINE;
        let mut last;
        loop {
            let (leader, answer) = self.ask_read_index(&raft, group).await;
            match answer {
                ReadAnswer::Index(index) => {
                    let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                    return (raft.wait(Some(left)))
                        .applied_index_at_least(Some(index), "read barrier")
                        .await
                        .map(|_| ())
                        .map_err(|e| WriteError::Failed(format!("{group}: {e}")));
                }
                ReadAnswer::NotLeader => last = format!("leader {leader:?} did not answer"),
                ReadAnswer::Failed(e) => last = e,
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(WriteError::NoLeader {
                    group,
                    secs: WRITE_DEADLINE.as_secs(),
                    last,
                });
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// `group`'s commit index as its leader confirms it now, one try.
    async fn ask_read_index(&self, raft: &GroupRaft, group: GroupId) -> (Option<u64>, ReadAnswer) {
        let leader = raft.metrics().borrow_watched().current_leader;
        let answer = match leader {
            Some(l) if l == self.id => Self::read_index_local(raft).await,
            Some(l) => self.forward_read(l, group).await,
            None => ReadAnswer::NotLeader,
        };
        (leader, answer)
    }

    /// Where this node's replica of `group` has applied its log to (0: nothing yet).
    pub(crate) fn applied_index(&self, group: GroupId) -> Option<u64> {
        let raft = self.group(group)?;
        let applied = raft.metrics().borrow_watched().last_applied;
        Some(applied.map_or(0, |l| l.index))
    }

    /// Whether `applied` (this node's applied index of `group`, taken before the call)
    /// already covers everything the group had committed when this was called; one try:
    /// `false` when its leader is not known or does not answer.
    pub(crate) async fn applied_covers(&self, group: GroupId, applied: u64) -> bool {
        let Some(raft) = self.group(group) else {
            return false;
        };
        matches!(self.ask_read_index(&raft, group).await.1, ReadAnswer::Index(i) if i <= applied)
    }

    async fn read_index_local(raft: &GroupRaft) -> ReadAnswer {
        // While its lease holds (a quorum acknowledged it within `election_timeout_max`,
        // and followers do not vote for another leader meanwhile) the leader answers at
        // once; otherwise it confirms its leadership with a quorum first.
        if let Ok((read, _)) = raft.get_read_log_id(ReadPolicy::LeaseRead).await {
            return ReadAnswer::Index(read.log_id().index);
        }
        match raft.get_read_log_id(ReadPolicy::ReadIndex).await {
            Ok((read, _)) => ReadAnswer::Index(read.log_id().index),
            Err(e) if e.forward_to_leader().is_some() => ReadAnswer::NotLeader,
            Err(e) => ReadAnswer::Failed(e.to_string()),
        }
    }

    /// The commit index of `group` as its leader confirms it now (openraft's ReadIndex),
    /// asking `candidates` in turn (the group is not replicated here); `None` when none of
    /// them leads it.
    pub(crate) async fn read_index_of(&self, group: GroupId, candidates: &[u64]) -> Option<u64> {
        for to in candidates {
            if let ReadAnswer::Index(i) = self.forward_read(*to, group).await {
                return Some(i);
            }
        }
        None
    }

    async fn forward_read(&self, to: u64, group: GroupId) -> ReadAnswer {
        if !self.peers.read().contains_key(&to) {
            return ReadAnswer::NotLeader;
        }
        let message = ToGroup { group, message: () };
        let Ok(frame) = Frame::cbor(net::READ_INDEX, &message, 0) else {
            return ReadAnswer::Failed("encoding a read request".into());
        };
        // A frozen leader fails a probe (about 0.9 s) before the call's time is out: the
        // barrier asks again, the new leader once one is elected.
        let probe_at = tokio::time::Instant::now() + PROBE_AFTER;
        match (self.call_while_answering(to, frame, FORWARD_TIMEOUT, probe_at)).await {
            Ok(b) => from_cbor(&b).unwrap_or_else(|e| ReadAnswer::Failed(e.to_string())),
            Err(e) => ReadAnswer::Failed(e.to_string()),
        }
    }

    async fn write_local(raft: &GroupRaft, command: Command) -> WriteAnswer {
        match raft.client_write(command).await {
            Ok(r) => WriteAnswer::Done(r.data),
            Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f))) => {
                WriteAnswer::NotLeader(f.leader_id)
            }
            Err(RaftError::APIError(e @ ClientWriteError::LogEntryDiscarded(_))) => {
                WriteAnswer::Unknown(e.to_string())
            }
            // The replica stopped (it left this node: the shard moved): the write may have
            // been committed; the group's leader elsewhere takes it again.
            Err(e @ RaftError::Fatal(_)) => WriteAnswer::Unknown(e.to_string()),
            Err(e) => WriteAnswer::Failed(e.to_string()),
        }
    }

    /// [`Self::forward`]s `command` to `to`, but stops waiting once this node's replica of
    /// the group (`local`) sees another leader: `to` froze or was cut off, and the write goes
    /// to the new leader at once instead of after [`FORWARD_TIMEOUT`]. It may have been
    /// committed all the same: the state machine drops the second copy by its id.
    async fn forward_until_moved(
        &self,
        to: u64,
        group: GroupId,
        command: &Command,
        local: Option<&GroupRaft>,
    ) -> WriteAnswer {
        let Some(raft) = local else {
            return self.forward(to, group, command).await;
        };
        // Leadership and membership only: this channel does not change with every entry.
        let mut server = raft.server_metrics();
        // Only a change counts: a replica that has not yet heard of `to` winning must not
        // send the write back to the leader it knew, and from there to `to` again.
        let known = server.borrow_watched().current_leader;
        let moved = async {
            loop {
                if server.changed().await.is_err() {
                    return std::future::pending().await;
                }
                let leader = server.borrow_watched().current_leader;
                if leader != known && leader.is_some_and(|l| l != to) {
                    return leader;
                }
            }
        };
        tokio::select! {
            answer = self.forward(to, group, command) => answer,
            leader = moved => WriteAnswer::NotLeader(leader),
        }
    }

    async fn forward(&self, to: u64, group: GroupId, command: &Command) -> WriteAnswer {
        let Some(addr) = self.peers.read().get(&to).cloned() else {
            return WriteAnswer::NotLeader(None);
        };
        let hint = command.size_hint();
        let message = ToGroup {
            group,
            message: command,
        };
        let frame = match Frame::cbor(net::CLIENT_WRITE, &message, hint) {
            Ok(f) => f,
            Err(e) => return WriteAnswer::Failed(e.to_string()),
        };
        match (self.pool.call(&addr, frame, FORWARD_TIMEOUT)).await {
            Ok(b) => from_cbor(&b).unwrap_or_else(|e| WriteAnswer::Unknown(e.to_string())),
            // Whether the leader got it is unknown: the state machine drops a second copy.
            Err(e) => WriteAnswer::Unknown(e.to_string()),
        }
    }

    /// Dials to peers that failed since the node started. A peer that is down is dialed
    /// again at openraft's backoff (a few times a second per group), not in a tight loop.
    pub fn failed_dials(&self) -> u64 {
        self.pool.failed_dials()
    }

    /// This node's id.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Opens `group` (its log and snapshot from disk, if any), applying to `apply`, and
    /// starts its raft; snapshotted every `snapshot_every` entries when given (else when
    /// asked: `trigger().snapshot()`).
    pub async fn open_group(
        &self,
        group: GroupId,
        apply: Arc<dyn GroupState>,
        snapshot_every: Option<u64>,
    ) -> io::Result<GroupRaft> {
        let dir = self.dir.join(group.to_string());
        // A log of the old layout (a file per group) moves into the node's file.
        let old = dir.join("log");
        if old.join("raft.log").exists() {
            self.writer.take_over(group, &old.join("raft.log")).await?;
            std::fs::remove_dir_all(&old)?;
        }
        let log = LogStore::open(group, &self.writer);
        let sm = StateMachine::open(&dir.join("sm"), DynGroupState(apply))?;
        let mut config = raft_config(&group.to_string())?;
        if let Some(n) = snapshot_every {
            config.snapshot_policy = SnapshotPolicy::LogsSinceLast(n.max(1));
            config.max_in_snapshot_log_to_keep = LOG_KEPT_BEHIND_SNAPSHOT.min(n);
        }
        let config = Arc::new(config);
        let network = GroupNetwork::new(self.pool.clone(), group);
        let raft = Raft::new(self.id, config, network, log, sm)
            .await
            .map_err(io::Error::other)?;
        self.groups.write().insert(group, raft.clone());
        Ok(raft)
    }

    /// The raft of `group`, if this node has it.
    pub fn group(&self, group: GroupId) -> Option<GroupRaft> {
        self.groups.read().get(&group).cloned()
    }

    /// Stops `group` here and deletes its log and state (its replica left this node).
    pub async fn close_group(&self, group: GroupId) -> io::Result<()> {
        let raft = self.groups.write().remove(&group);
        if let Some(raft) = raft
            && let Err(e) = raft.shutdown().await
        {
            tracing::warn!(%group, error = %e, "stopping a raft group");
        }
        self.writer.remove(group).await?;
        match std::fs::remove_dir_all(self.dir.join(group.to_string())) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }

    /// Stops every group (their logs stay on disk).
    pub async fn shutdown(&self) {
        let groups: Vec<_> = self.groups.write().drain().collect();
        for (g, raft) in groups {
            if let Err(e) = raft.shutdown().await {
                tracing::warn!(group = %g, error = %e, "stopping a raft group");
            }
        }
    }
}

/// Decodes a request to a group, runs it on the group's raft, encodes the answer.
async fn on_group<Req, Resp, E, F, Fut>(node: &Node, body: &[u8], f: F) -> Result<Vec<u8>, String>
where
    Req: DeserializeOwned,
    Resp: Serialize,
    E: std::fmt::Display,
    F: FnOnce(GroupRaft, Req) -> Fut,
    Fut: std::future::Future<Output = Result<Resp, E>>,
{
    let req: ToGroup<Req> = (from_cbor(body)).map_err(|e| {
        format!(
            "node {}: a {} request that does not decode: {e}",
            node.id,
            std::any::type_name::<Req>()
        )
    })?;
    let raft = node
        .group(req.group)
        .ok_or_else(|| format!("node {} has no group {}", node.id, req.group))?;
    let resp = f(raft, req.message).await.map_err(|e| e.to_string())?;
    to_cbor(&resp).map_err(|e| e.to_string())
}

impl Handler for Node {
    async fn handle(&self, kind: u8, body: Bytes) -> Result<Vec<u8>, String> {
        match kind {
            net::APPEND => {
                on_group(self, &body, |r, q| async move { r.append_entries(q).await }).await
            }
            net::VOTE => on_group(self, &body, |r, q| async move { r.vote(q).await }).await,
            net::PRE_VOTE => on_group(self, &body, |r, q| async move { r.pre_vote(q).await }).await,
            net::TRANSFER_LEADER => {
                on_group(self, &body, |r, q| async move {
                    r.handle_transfer_leader(q).await
                })
                .await
            }
            net::SNAPSHOT => {
                on_group(self, &body, |r, q: SnapshotRequest| async move {
                    let snapshot = SnapshotOf::<Tc, Bytes> {
                        meta: q.meta,
                        snapshot: q.data,
                    };
                    r.install_full_snapshot(q.vote, snapshot).await
                })
                .await
            }
            net::CLIENT_WRITE => {
                let req: ToGroup<Command> = from_cbor(&body).map_err(|e| e.to_string())?;
                let answer = match self.group(req.group) {
                    Some(raft) => Self::write_local(&raft, req.message).await,
                    None => WriteAnswer::NotLeader(None),
                };
                to_cbor(&answer).map_err(|e| e.to_string())
            }
            net::READ_INDEX => {
                let req: ToGroup<()> = from_cbor(&body).map_err(|e| e.to_string())?;
                let answer = match self.group(req.group) {
                    Some(raft) => Self::read_index_local(&raft).await,
                    None => ReadAnswer::NotLeader,
                };
                to_cbor(&answer).map_err(|e| e.to_string())
            }
            net::PING => Ok(Vec::new()),
            net::ROUTES
            | net::RELAY
            | net::TAKE
            | net::GIVE
            | net::FLUSH
            | net::WILLS
            | net::STANDBY
            | net::PULL
            | net::SHARD_ROWS => match self.relay.get().and_then(|r| r.upgrade()) {
                Some(relay) => relay.handle(kind, body).await,
                None => Err(format!("node {} relays nothing yet", self.id)),
            },
            k => Err(format!("unknown request kind {k}")),
        }
    }

    fn take_ordered(&self, conn: u64, kind: u8, body: Bytes, reply: Reply) {
        if kind == net::STREAM_END {
            if let Ok(stream) = from_cbor::<u64>(&body) {
                self.streams.lock().remove(&(conn, stream));
            }
            return;
        }
        let req: ToGroup<StreamRequest> = match from_cbor(&body) {
            Ok(r) => r,
            Err(e) => {
                return reply.send(Err(format!(
                    "a replication request that does not decode: {e}"
                )));
            }
        };
        let mut streams = self.streams.lock();
        let key = (conn, req.message.stream);
        let stream = match streams.entry(key) {
            std::collections::hash_map::Entry::Occupied(s) => s.into_mut(),
            std::collections::hash_map::Entry::Vacant(v) => match self.group(req.group) {
                Some(raft) => v.insert(AppendStream::open(&raft)),
                None => {
                    drop(streams);
                    return reply.send(Err(format!("node {} has no group {}", self.id, req.group)));
                }
            },
        };
        stream.take(req.message.request, reply);
    }

    fn connection_closed(&self, conn: u64) {
        self.streams.lock().retain(|(c, _), _| *c != conn);
    }
}
