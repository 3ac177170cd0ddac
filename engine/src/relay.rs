//! The relay port: how a cluster's brokers act as one. Each node's broker tells the relay
//! which topic filters its sessions subscribe ([`Relay::set_route`]); the relay shares those
//! routes with the other nodes, and hands the broker theirs ([`RelaySink::routes`]), so that
//! a message published on one node is sent ([`Relay::send`]) only to the nodes with a
//! matching subscription, where their broker delivers it ([`RelaySink::receive`]). The
//! messages are opaque bytes here (the broker's own encoding). The `sluice-cluster` crate
//! implements [`Relay`]; a single node has none.

use futures::future::BoxFuture;
use std::sync::Arc;
use tokio::sync::oneshot;

/// A change to one node's routes, as the broker of another node learns it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RouteChange {
    /// The node's routes are exactly these (it started, or this node lost track).
    Replace(Vec<String>),
    /// The node's sessions now subscribe this filter (`$share/<group>/<filter>` included).
    Add(String),
    /// ... and no longer do.
    Remove(String),
}

/// Delivery across a cluster's nodes (see the module docs).
pub trait Relay: Send + Sync + 'static {
    /// This node's id.
    fn node(&self) -> u64;

    /// This node's sessions subscribe `filter` now (`present`), or no longer do; returns the
    /// change's number, for [`Relay::routes_known`].
    fn set_route(&self, filter: &str, present: bool) -> u64;

    /// Returns once every node that answers knows this node's routes up to change `seq`
    /// (a node that does not answer learns them when it does): a subscription is
    /// acknowledged only then, so what is published anywhere after it reaches it.
    fn routes_known(&self, seq: u64) -> BoxFuture<'static, ()>;

    /// This node's lasting session `client` now holds these subscriptions (the broker's
    /// encoding), or (`None`) has ended: shared with the other nodes, so that the client
    /// finds its subscriptions on another node while this one is down. Returns the change's
    /// number, for [`Relay::routes_known`] (a SUBACK waits until the others know it too).
    fn set_session(&self, client: &str, held: Option<bytes::Bytes>) -> u64;

    /// Another node's lasting session of `client`, as that node last shared it: the node,
    /// whether it is known not to answer, and its subscriptions.
    fn session_elsewhere(&self, client: &str) -> Option<(u64, bool, bytes::Bytes)>;

    /// Queues `message` for the nodes `to` (in the order of the calls, per node); it is sent
    /// once [`Relaying::go`] says it is stored.
    fn send(&self, to: &[u64], message: bytes::Bytes) -> Relaying;

    /// The other nodes of the cluster (retained messages go to all of them).
    fn peers(&self) -> Vec<u64>;

    /// Messages dropped for nodes that did not answer while their queue was full.
    fn dropped(&self) -> u64;

    /// Where the routes of the other nodes and the messages they send go (the broker, once
    /// its sessions are loaded: this node's routes are sent to the others from then on).
    fn set_sink(&self, sink: Arc<dyn RelaySink>);

    /// Whether node `node` reads the ids and destinations of the messages relayed to it
    /// (it said so in its answer to this node's routes: a version that knows them).
    fn takes_ids(&self, node: u64) -> bool;

    /// Returns once this node knows the routes of every other node that answers (a few
    /// seconds at most): a node that starts takes no publishes before, or it would not
    /// send them to the other nodes' subscribers.
    fn peers_known(&self) -> BoxFuture<'static, ()>;

    /// What this node had durably taken from each sender before it stopped: (sender, run,
    /// number of the last message), as the broker's journal kept it.
    fn received_before(&self, marks: Vec<(u64, u64, u64)>);

    /// A client connects here: every other node that answers ends its session `client`
    /// (its connection is taken over) and, unless `clean`, hands over what the session
    /// held ([`RelaySink::hand_over`]); returns those hand-overs.
    fn take_session(&self, client: &str, clean: bool) -> BoxFuture<'static, Vec<bytes::Bytes>>;

    /// Hands what this node's session `client` held to node `node`, where the client went
    /// while this node was down ([`RelaySink::take_given`]); true once it took it.
    fn give(&self, node: u64, client: &str, held: bytes::Bytes) -> BoxFuture<'static, bool>;

    /// This node's connection of `client` has this will (the broker's encoding) and will
    /// delay in seconds, or (`None`) no will to publish any more: the other nodes keep it,
    /// and one of them publishes it ([`RelaySink::publish_will`]) once this node has not
    /// answered for the delay (a few seconds at least), unless the client comes back
    /// meanwhile.
    fn set_will(&self, client: &str, will: Option<(bytes::Bytes, u32)>);

    /// Whether node `node` answers (it is not known to be down).
    fn answers(&self, node: u64) -> bool;
    /// Asks node `node` about the standby copies of the nodes' journals (the broker's
    /// encoding, [`RelaySink::standby`]); `None` when it does not answer in time or says
    /// it cannot.
    fn standby_call(
        &self,
        node: u64,
        call: bytes::Bytes,
    ) -> BoxFuture<'static, Option<bytes::Bytes>>;
    /// What the nodes that answer (this one too) still keep for node `node`, which does not
    /// answer: the messages queued for it (released, not yet taken by it; the broker's
    /// encoding) whose topics match one of `filters` ([`RelaySink::matching`]). Each node's
    /// in the order it numbered them. A session that came here from `node`'s standby copy
    /// takes them, else they would wait for `node` to come back.
    fn pull(&self, node: u64, filters: Vec<String>) -> BoxFuture<'static, Vec<bytes::Bytes>>;
    /// At start: what the other nodes did with the wills of this node's previous run. The
    /// clients whose will one of them published, and the wills none published yet (handed
    /// over to this node, with their delays: they are this node's to publish now).
    fn claim_wills(&self) -> BoxFuture<'static, ClaimedWills>;
}

/// What [`Relay::claim_wills`] returns.
#[derive(Debug, Default)]
pub struct ClaimedWills {
    /// Clients whose will another node published.
    pub published: std::collections::HashSet<String>,
    /// Wills still to publish: client, will (the broker's encoding), delay in seconds.
    pub pending: Vec<(String, bytes::Bytes, u32)>,
}

/// The broker's side of the relay.
pub trait RelaySink: Send + Sync + 'static {
    /// Node `node`'s routes changed.
    fn routes(&self, node: u64, change: RouteChange);

    /// Delivers messages node `from` sent, in order; resolves once each is queued for its
    /// subscribers (durably, for those whose sessions outlive their connection); an error
    /// (they could not be logged) has the sender send them again. `mark`
    /// (the sender's run and the number of the last message) is logged with them when any
    /// is logged, and given back at start ([`Relay::received_before`]), so that a batch
    /// sent again after a restart is not delivered twice.
    fn receive(
        &self,
        from: u64,
        mark: (u64, u64),
        messages: Vec<bytes::Bytes>,
    ) -> BoxFuture<'static, Result<(), String>>;

    /// Some messages node `from` had for this node never came: its queue for this node
    /// dropped them while this node did not answer (numbers of its batches were skipped).
    fn gap(&self, from: u64);

    /// Another node took client `client` over: its session here ends (its connection
    /// told so); unless `clean`, returns what it held, for that node to go on with.
    fn hand_over(&self, client: String, clean: bool) -> BoxFuture<'static, Option<bytes::Bytes>>;

    /// Another node gives what its session `client` held (the client came here while that
    /// node was down); true once taken into this node's session of it.
    fn take_given(&self, client: String, held: bytes::Bytes) -> BoxFuture<'static, bool>;

    /// Of `messages` (queued for another node), those whose topic matches one of
    /// `filters`, in order ([`Relay::pull`]).
    fn matching(&self, filters: &[String], messages: Vec<bytes::Bytes>) -> Vec<bytes::Bytes>;

    /// Answers another node's [`Relay::standby_call`] (the broker's encoding both ways).
    fn standby(&self, call: bytes::Bytes) -> BoxFuture<'static, Result<Vec<u8>, String>>;
    /// Publishes a will (the broker's encoding, which names its client) of a client of node
    /// `node`, which stopped answering (or started again without claiming it) after its
    /// delay.
    fn publish_will(&self, node: u64, will: bytes::Bytes) -> BoxFuture<'static, ()>;
}

/// A message queued for other nodes: it leaves once its publisher says it is stored.
#[derive(Debug)]
pub struct Relaying {
    go: Vec<oneshot::Sender<bool>>,
    accepted: Vec<oneshot::Receiver<()>>,
}

impl Relaying {
    /// Nothing to relay.
    pub fn none() -> Self {
        Self {
            go: Vec::new(),
            accepted: Vec::new(),
        }
    }

    /// One slot of the message in a node's queue: `go` releases it, `accepted` fires once
    /// the node took it (or is known not to answer).
    pub fn slot() -> (Self, oneshot::Receiver<bool>, oneshot::Sender<()>) {
        let (go, go_rx) = oneshot::channel();
        let (accepted_tx, accepted) = oneshot::channel();
        let r = Self {
            go: vec![go],
            accepted: vec![accepted],
        };
        (r, go_rx, accepted_tx)
    }

    /// Adds `other`'s slots to this one's.
    pub fn join(&mut self, other: Relaying) {
        self.go.extend(other.go);
        self.accepted.extend(other.accepted);
    }

    /// Whether the message goes to no other node.
    pub fn is_empty(&self) -> bool {
        self.go.is_empty()
    }

    /// How many nodes it goes to.
    pub fn len(&self) -> usize {
        self.go.len()
    }

    /// Releases the message (`stored`), or withdraws it; with `stored`, resolves once every
    /// node it goes to took it (a node that does not answer is not waited for: its queue
    /// keeps the message and sends it when the node is back).
    pub async fn go(self, stored: bool) {
        for g in self.go {
            let _ = g.send(stored);
        }
        if stored {
            for a in self.accepted {
                let _ = a.await;
            }
        }
    }
}
