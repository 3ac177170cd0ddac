//! Sessions: what outlives a connection (subscriptions, queued and unacknowledged messages,
//! QoS 2 packet ids) and the queue between the router and a connection's writer.

mod pulled;

pub(crate) use pulled::PulledMarks;
#[cfg(test)]
mod tests;

use parking_lot::Mutex;
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::mqttbytes::v5::PublishProperties;
use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

/// Longest a publisher waits for room in one subscriber's queue.
pub(crate) const MAX_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// One application message as the router passes it around (shared by every receiver).
#[derive(Debug, Clone)]
pub(crate) struct Message {
    pub(crate) topic: Arc<str>,
    pub(crate) payload: bytes::Bytes,
    pub(crate) qos: QoS,
    pub(crate) retain: bool,
    /// Properties forwarded to subscribers (alias and subscription ids removed).
    pub(crate) properties: Option<PublishProperties>,
    /// When the message expires (MQTT 5 message expiry interval).
    pub(crate) expires: Option<Instant>,
    /// Client id of the publisher, for "no local" subscriptions.
    pub(crate) origin: Arc<str>,
    /// Its identity across a cluster's nodes, set where it was first routed.
    pub(crate) id: std::sync::OnceLock<MessageId>,
    /// The other nodes that node relayed it to (set with `id`).
    pub(crate) sent_to: std::sync::OnceLock<Arc<[u64]>>,
}

/// A message's identity across a cluster's nodes: the node that took it from its publisher,
/// that node's run, and its number in that run (numbers rise in publish order).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct MessageId {
    pub(crate) node: u64,
    pub(crate) run: u64,
    pub(crate) seq: u64,
}

/// Taken when a session's subscriptions were put in place on this node (it came from
/// another node): this node's run and next number then, and per other node's run the
/// highest number received here then. A message another node kept for the session and
/// gives back later reached it here too when it was numbered here from `next` on, or when
/// it was numbered elsewhere, relayed here too (`Message::sent_to`) and numbered above what
/// had been received here from that run (messages come from a node in the order numbered,
/// so it arrived after the subscriptions were in place).
#[derive(Debug, Clone)]
pub(crate) struct Installed {
    pub(crate) node: u64,
    pub(crate) run: u64,
    pub(crate) next: u64,
    /// What had come from the other nodes then.
    pub(crate) then: Arrivals,
    /// The session's plain filters then: only a message one of them (still subscribed)
    /// matches reached it here.
    pub(crate) filters: Vec<String>,
    /// Until when messages routed to the session that the numbers place before it came
    /// (numbered or received before, stored or applied after) are noted in `late`; `None`
    /// once past (no clock is read per delivery after that).
    pub(crate) until: Option<std::time::Instant>,
    pub(crate) late: HashSet<MessageId>,
    /// Set while what comes from another node is being logged, before the subscriptions
    /// it brings are in place: no number places a message yet, and every message routed
    /// to the session meanwhile is noted in `late` (it reached it here).
    pub(crate) pending: bool,
}

/// What has come to this node from the others (`Remote::received`).
#[derive(Debug, Clone, Default)]
pub(crate) struct Arrivals {
    /// Per other node's run, the highest number received.
    pub(crate) max: HashMap<(u64, u64), u64>,
    /// Nodes that relayed messages here without ids: what they sent cannot be placed.
    pub(crate) unnumbered: HashSet<u64>,
    /// Nodes' runs some of whose messages for this node never came (a full queue dropped
    /// them) or were not taken (they could not be logged): what they sent in that run
    /// cannot be placed. A later run of the node numbers afresh.
    pub(crate) gapped: HashSet<(u64, u64)>,
}

/// How long after a session came here the messages in flight then are noted one by one
/// (a message is stored within a few seconds of being numbered, or not at all).
pub(crate) const LATE_FOR: std::time::Duration = std::time::Duration::from_secs(10);
/// At most this many noted (they are the messages in flight at one moment).
const LATE_MAX: usize = 100_000;

impl Installed {
    /// Whether `message` reached the session here (see the type's docs), given what has
    /// come `now`: a message numbered above the highest received from its run has not
    /// come (its node died before sending it, or it is still on its way).
    pub(crate) fn routed(&self, message: &Message, now: &Arrivals) -> bool {
        let Some(id) = message.id.get() else {
            return false;
        };
        let came = id.node == self.node
            || (!now.gapped.contains(&(id.node, id.run))
                && (now.max.get(&(id.node, id.run))).is_some_and(|last| id.seq <= *last));
        self.late.contains(id) || (came && self.by_numbers(message, id))
    }

    /// `message` is routed to the session now: noted if its numbers say it came before.
    fn routed_late(&mut self, message: &Message) {
        let Some(until) = self.until else {
            return;
        };
        if !self.pending && (Instant::now() >= until || self.late.len() >= LATE_MAX) {
            self.until = None;
        } else if let Some(id) = message.id.get()
            && !self.by_numbers(message, id)
        {
            self.late.insert(*id);
        }
    }

    fn by_numbers(&self, message: &Message, id: &MessageId) -> bool {
        if self.pending {
            return false;
        }
        if id.node == self.node {
            return id.run == self.run && id.seq >= self.next;
        }
        let sent_here = (message.sent_to.get()).is_some_and(|to| to.contains(&self.node));
        let after = match self.then.max.get(&(id.node, id.run)) {
            Some(last) => id.seq > *last,
            None => !self.then.unnumbered.contains(&id.node),
        };
        sent_here && after && !self.then.gapped.contains(&(id.node, id.run))
    }
}

/// A message on its way to one session.
#[derive(Debug, Clone)]
pub(crate) struct Delivery {
    pub(crate) message: Arc<Message>,
    pub(crate) qos: QoS,
    pub(crate) retain: bool,
    pub(crate) subscription_ids: Vec<usize>,
    /// The message's position in the log when it is in the journal (0 when it is not): the
    /// session's records (sent, acknowledged) name it by this.
    pub(crate) lsn: u64,
}

/// How one filter was subscribed.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct SubOptions {
    pub(crate) qos: QoS,
    pub(crate) no_local: bool,
    pub(crate) retain_as_published: bool,
    pub(crate) id: Option<usize>,
}

/// An outgoing QoS 1/2 message the client has not finished acknowledging.
#[derive(Debug, Clone)]
pub(crate) enum Outgoing {
    /// PUBLISH sent, PUBACK/PUBREC awaited.
    Published(Delivery),
    /// PUBREC received, PUBREL sent, PUBCOMP awaited (the message's LSN, 0 if unlogged).
    Released(u64),
}

impl Outgoing {
    /// The LSN of the message (0 when it is not in the journal).
    pub(crate) fn lsn(&self) -> u64 {
        match self {
            Outgoing::Published(d) => d.lsn,
            Outgoing::Released(lsn) => *lsn,
        }
    }
}

/// A session's mutable state.
#[derive(Debug, Default)]
pub(crate) struct State {
    pub(crate) queue: VecDeque<Delivery>,
    pub(crate) inflight: BTreeMap<u16, Outgoing>,
    next_pkid: u16,
    /// QoS 2 packet ids received and stored, until their PUBREL.
    pub(crate) incoming_qos2: HashSet<u16>,
    /// Those of `incoming_qos2` whose message's journal record is not durable yet: a
    /// snapshot leaves them out (the publisher resends such a message).
    pub(crate) unlogged_qos2: HashSet<u16>,
    /// Filter (as subscribed, `$share/...` included) -> options.
    pub(crate) subscriptions: HashMap<String, SubOptions>,
    /// Seconds the session outlives its connection.
    pub(crate) expiry_secs: u32,
    /// Set while no connection is attached.
    pub(crate) disconnected_at: Option<Instant>,
    /// Messages dropped from a full offline queue.
    pub(crate) dropped: u64,
    /// Set when the session came here from another node: what tells a copy of a message
    /// another node kept for it while its client was here (cleared when it is withdrawn).
    pub(crate) installed: Option<Box<Installed>>,
    /// Packet ids to send again (DUP, or PUBREL) while a connection is attached: what
    /// another node gave, with the ids it had sent them under, and what the client's
    /// receive window did not take yet ([`State::due_resends`]).
    pub(crate) resend: Vec<u16>,
    /// The ids of messages another node handed over or gave that were queued here, for
    /// [`IMPORTED_FOR`] more deliveries: the same message routed here later (its own
    /// delivery was on its way meanwhile) is not queued twice.
    pub(crate) imported: Option<Box<Imported>>,
    /// Deliveries queued so far (to tell which of the queue came after a moment).
    pub(crate) pushed: u64,
    /// Per node that did not answer and other node's run (dead node, node, run), the
    /// highest number of the messages taken from what the nodes kept for the dead node
    /// ([`State::note_pulled`]).
    pulled: HashMap<(u64, u64, u64), u64>,
}

/// See [`State::imported`].
#[derive(Debug)]
pub(crate) struct Imported {
    ids: HashSet<MessageId>,
    left: u32,
    until: Instant,
}

/// Deliveries to a session for which the ids of messages it took from another node are
/// kept (see [`State::imported`]), and for how long at most (a message's own delivery is
/// late by what its logging and relaying take: seconds).
const IMPORTED_FOR: u32 = 200_000;
const IMPORTED_SECS: u64 = 60;

impl State {
    /// A copy of what a snapshot keeps (messages are shared, not copied).
    pub(crate) fn copy(&self) -> Self {
        Self {
            queue: self.queue.clone(),
            inflight: self.inflight.clone(),
            next_pkid: self.next_pkid,
            incoming_qos2: self.incoming_qos2.clone(),
            unlogged_qos2: self.unlogged_qos2.clone(),
            subscriptions: self.subscriptions.clone(),
            expiry_secs: self.expiry_secs,
            disconnected_at: self.disconnected_at,
            dropped: self.dropped,
            installed: None,
            resend: Vec::new(),
            imported: None,
            pushed: 0,
            pulled: self.pulled.clone(),
        }
    }

    /// Whether `message` (given back or handed over by another node) was routed to this
    /// session here already ([`Installed::routed`]). Not for sessions with shared
    /// subscriptions, whose members each get only some of the messages.
    pub(crate) fn routed_here(&self, message: &Message, now: &Arrivals) -> bool {
        let Some(installed) = &self.installed else {
            return false;
        };
        let shared = (self.subscriptions.keys()).any(|f| crate::topic::parse_shared(f).is_some());
        // A filter it had when it came and still has matches it (a message for a filter
        // its other copy had and this one lacks did not come to it here).
        let subscribed = (installed.filters.iter()).any(|f| {
            crate::topic::matches(f, &message.topic) && self.subscriptions.contains_key(f)
        });
        !shared && subscribed && installed.routed(message, now)
    }

    /// The ids of the messages in flight, and of those queued.
    pub(crate) fn held_split(&self) -> (HashSet<MessageId>, HashSet<MessageId>) {
        let flying = (self.inflight.values())
            .filter_map(|o| match o {
                Outgoing::Published(d) => d.message.id.get().copied(),
                Outgoing::Released(_) => None,
            })
            .collect();
        let queued = (self.queue.iter())
            .filter_map(|d| d.message.id.get().copied())
            .collect();
        (flying, queued)
    }

    /// Whether message `id` is in flight, or among what was queued since `pushed` deliveries
    /// had been ([`State::pushed`]).
    pub(crate) fn holds_since(&self, pushed: u64, id: &MessageId) -> bool {
        let new = usize::try_from(self.pushed.saturating_sub(pushed)).unwrap_or(usize::MAX);
        let in_flight = (self.inflight.values())
            .any(|o| matches!(o, Outgoing::Published(d) if d.message.id.get() == Some(id)));
        in_flight || (self.queue.iter().rev().take(new)).any(|d| d.message.id.get() == Some(id))
    }

    /// Drops the queued copies of messages held already (in flight, or queued before);
    /// returns their LSNs.
    pub(crate) fn drop_copies(&mut self) -> Vec<u64> {
        // A copy under the same LSN is another delivery of the same record (a retained
        // message sent on a subscription, beside its routed one): kept.
        let mut seen: HashMap<MessageId, u64> = (self.inflight.values())
            .filter_map(|o| match o {
                Outgoing::Published(d) => d.message.id.get().map(|id| (*id, d.lsn)),
                Outgoing::Released(_) => None,
            })
            .collect();
        self.unqueue_where(|d| {
            d.message
                .id
                .get()
                .is_some_and(|id| *seen.entry(*id).or_insert(d.lsn) != d.lsn)
        })
    }

    /// Takes the queued deliveries `gone` picks out of the queue; their LSNs.
    fn unqueue_where(&mut self, mut gone: impl FnMut(&Delivery) -> bool) -> Vec<u64> {
        let mut taken = Vec::new();
        self.queue.retain(|d| {
            let go = gone(d);
            if go {
                taken.push(d.lsn);
            }
            !go
        });
        taken
    }

    /// Whether message `id` reached the session here while what another node held was
    /// being logged ([`Installed::late`]).
    pub(crate) fn came_late(&self, id: &MessageId) -> bool {
        self.installed.as_ref().is_some_and(|i| i.late.contains(id))
    }

    /// Takes `id` out of the queue (where it waits, not yet sent); the LSNs taken.
    pub(crate) fn unqueue(&mut self, id: &MessageId) -> Vec<u64> {
        self.unqueue_where(|d| d.message.id.get() == Some(id))
    }

    /// `id` was queued (or put in flight) here from what another node handed over or gave.
    pub(crate) fn note_imported(&mut self, id: MessageId) {
        let until = Instant::now() + std::time::Duration::from_secs(IMPORTED_SECS);
        let i = self.imported.get_or_insert_with(|| {
            Box::new(Imported {
                ids: HashSet::new(),
                left: IMPORTED_FOR,
                until,
            })
        });
        i.ids.insert(id);
        (i.left, i.until) = (IMPORTED_FOR, until);
    }

    /// Whether message `id` came from another node already (handed over or given), within
    /// [`IMPORTED_SECS`].
    pub(crate) fn was_imported(&self, id: &MessageId) -> bool {
        (self.imported.as_ref()).is_some_and(|i| i.ids.contains(id) && Instant::now() < i.until)
    }

    /// Whether a delivery of `message` routed here now is one taken from another node
    /// already (it is not queued again); counts the delivery.
    fn imported_already(&mut self, message: &Message) -> bool {
        let Some(i) = self.imported.as_mut() else {
            return false;
        };
        if message.id.get().is_some_and(|id| i.ids.contains(id)) {
            return true;
        }
        i.left = i.left.saturating_sub(1);
        if i.left == 0 || Instant::now() >= i.until {
            self.imported = None;
        }
        false
    }

    /// `pkid` was put in flight from what another node gave: while a connection is
    /// attached, it is sent again at once (else when the client returns).
    pub(crate) fn resend_now(&mut self, pkid: u16) {
        if self.disconnected_at.is_none() {
            self.resend.push(pkid);
        }
    }

    /// What to send again now (oldest first) of what waits in [`State::resend`]: every
    /// PUBREL, and PUBLISHes while the client's receive `window` has room for them beside
    /// what it holds already (what is in flight but PUBLISHes waiting here). The rest waits for
    /// room: a give-back can hold as many as the client's window, and a returning client may
    /// set a smaller one.
    pub(crate) fn due_resends(&mut self, window: usize) -> Vec<(u16, Outgoing)> {
        let ids = std::mem::take(&mut self.resend);
        let mut waiting: Vec<(u16, Outgoing)> = (ids.into_iter())
            .filter_map(|k| self.inflight.get(&k).map(|o| (k, o.clone())))
            .collect();
        waiting.sort_by_key(|(k, o)| (o.lsn(), *k));
        waiting.dedup_by_key(|(k, _)| *k);
        // A QoS 2 message awaiting its PUBREL counts at the client until its PUBCOMP, as
        // it did since the node it came from sent it: its PUBREL adds nothing.
        let unsent = (waiting.iter())
            .filter(|(_, o)| matches!(o, Outgoing::Published(_)))
            .count();
        let held = self.inflight.len().saturating_sub(unsent);
        let mut room = window.saturating_sub(held);
        let mut due = Vec::with_capacity(waiting.len().min(room));
        for (k, o) in waiting {
            match o {
                Outgoing::Published(_) if room == 0 => self.resend.push(k),
                Outgoing::Published(_) => {
                    room -= 1;
                    due.push((k, o));
                }
                Outgoing::Released(_) => due.push((k, o)),
            }
        }
        due
    }

    /// The message at `lsn` was sent with `pkid` (a journal replay): in flight now.
    pub(crate) fn mark_sent(&mut self, lsn: u64, pkid: u16) {
        let d = match self.queue.iter().position(|d| d.lsn == lsn) {
            Some(i) => self.queue.remove(i),
            None => {
                let k = (self.inflight.iter())
                    .find(|(_, o)| matches!(o, Outgoing::Published(d) if d.lsn == lsn))
                    .map(|(k, _)| *k);
                match k.and_then(|k| self.inflight.remove(&k)) {
                    Some(Outgoing::Published(d)) => Some(d),
                    _ => None,
                }
            }
        };
        if let Some(d) = d {
            self.inflight.insert(pkid, Outgoing::Published(d));
        }
    }

    /// The client's PUBREC of the message at `lsn`, sent as `pkid` (a journal replay):
    /// released, wherever it was (its `Sent` record may not have been logged).
    pub(crate) fn mark_received(&mut self, lsn: u64, pkid: u16) {
        let k = (self.inflight.iter())
            .find(|(_, o)| matches!(o, Outgoing::Published(d) if d.lsn == lsn))
            .map(|(k, _)| *k);
        if let Some(k) = k {
            self.inflight.insert(k, Outgoing::Released(lsn));
        } else if let Some(i) = self.queue.iter().position(|d| d.lsn == lsn) {
            self.queue.remove(i);
            self.inflight.insert(pkid, Outgoing::Released(lsn));
        }
    }

    /// The client acknowledged the messages at `lsns`: they leave the session.
    ///
    /// Each acknowledgement takes one copy: the one in flight, else the first queued (a
    /// session can hold one message twice, through a shared and a plain subscription, or a
    /// retained copy beside the live one).
    /// One pass over what is in flight, and over the queue only for those not found there.
    pub(crate) fn forget_acked(&mut self, lsns: &[u64]) {
        let mut left: HashMap<u64, usize> = HashMap::with_capacity(lsns.len());
        for &lsn in lsns.iter().filter(|l| **l != 0) {
            *left.entry(lsn).or_default() += 1;
        }
        fn take(left: &mut HashMap<u64, usize>, lsn: u64) -> bool {
            match left.get_mut(&lsn) {
                Some(n) if *n > 0 => {
                    *n -= 1;
                    true
                }
                _ => false,
            }
        }
        self.inflight.retain(|_, o| !take(&mut left, o.lsn()));
        if left.values().any(|n| *n > 0) {
            self.queue.retain(|d| !take(&mut left, d.lsn));
        }
    }

    /// A free packet id for an outgoing message, from `lo..=hi`.
    pub(crate) fn next_pkid(&mut self, (lo, hi): (u16, u16)) -> Option<u16> {
        for _ in lo..=hi {
            self.next_pkid = match self.next_pkid {
                p if p < lo || p >= hi => lo,
                p => p + 1,
            };
            if !self.inflight.contains_key(&self.next_pkid) {
                return Some(self.next_pkid);
            }
        }
        None
    }
}

/// A session.
#[derive(Debug)]
pub(crate) struct Session {
    pub(crate) client_id: Arc<str>,
    pub(crate) state: Mutex<State>,
    /// Wakes the attached connection's writer: a message was queued or a slot freed.
    pub(crate) wake_writer: Notify,
    /// Wakes publishers waiting for queue space.
    space: Notify,
    max_queued: usize,
    /// The attached connection: its id and how to end it (a takeover).
    pub(crate) connection: Mutex<Option<(u64, CancellationToken)>>,
    /// Bumped whenever a connection attaches, so a delayed will knows it was superseded.
    pub(crate) generation: AtomicU64,
    /// Who logged in on the last connection attached (`system.sessions`).
    pub(crate) user: Mutex<Option<Arc<str>>>,
    /// The will of its connection (and its delay in seconds), from CONNECT until a normal
    /// DISCONNECT or until it is published: kept with a lasting session's state, so that a
    /// connection the server's stop ended still has its will published.
    pub(crate) will: Mutex<Option<(Arc<Message>, u32)>>,
    /// Notified when the session ends (discarded, expired or replaced by a clean start): a
    /// will waiting for its delay is published then (MQTT 5 §3.1.3.2.2).
    pub(crate) ended: Notify,
    /// Its client went to another node of a cluster: its subscriptions no longer count as
    /// this node's routes (only what is already on its way here still reaches it).
    pub(crate) withdrawn: std::sync::atomic::AtomicBool,
    /// The packet ids this node gives its messages ([`pkids_of`]).
    pkids: (u16, u16),
    /// Held while the session is withdrawn or given its routes back, with the check that
    /// decides it ([`crate::router::Router::withdraw`]).
    pub(crate) moving: Mutex<()>,
    /// What it took from other nodes' standby copies of it: (node, that node's journal LSN
    /// they held), for that node's give-back ([`crate::journal::Record::Standby`]).
    pub(crate) standby: Mutex<Vec<(u64, u64)>>,
}

/// The packet ids a node gives its sessions' messages: all of them on a single node; in a
/// cluster a sixteenth of them per node (by node id), so that a session resumed on another
/// node while its node is down (its state there unknown) does not reuse an id its client
/// still holds for a QoS 2 message from that node (which it would take for a copy). A
/// session handed over or given back keeps the ids of the messages it had in flight.
pub(crate) fn pkids_of(node: Option<u64>) -> (u16, u16) {
    match node {
        None => (1, u16::MAX),
        Some(n) => {
            let k = (n % 16) as u16;
            (k * 4096 + 1, k * 4096 + 4095)
        }
    }
}

impl Session {
    /// `node`: this node's id, in a cluster.
    pub(crate) fn new(client_id: Arc<str>, max_queued: usize, node: Option<u64>) -> Arc<Self> {
        Arc::new(Self {
            client_id,
            state: Mutex::new(State::default()),
            wake_writer: Notify::new(),
            space: Notify::new(),
            max_queued,
            connection: Mutex::new(None),
            generation: AtomicU64::new(0),
            user: Mutex::new(None),
            will: Mutex::new(None),
            ended: Notify::new(),
            withdrawn: std::sync::atomic::AtomicBool::new(false),
            pkids: pkids_of(node),
            moving: Mutex::new(()),
            standby: Mutex::new(Vec::new()),
        })
    }

    /// Queues `d`. When an online session is full and `may_wait`, the caller waits for
    /// room first ([`Session::wait_room`]). An offline session that is full drops its oldest
    /// message and counts it.
    pub(crate) async fn enqueue(&self, d: Delivery, may_wait: bool) {
        if may_wait {
            self.wait_room().await;
        }
        self.push(d);
    }

    /// Waits while the session is online and its queue full (the publisher is slowed;
    /// nothing is dropped), for up to [`MAX_WAIT`], after which a warning is logged and the
    /// caller goes on (queueing past the limit), so that two clients publishing to each
    /// other cannot wait on each other forever.
    pub(crate) async fn wait_room(&self) {
        let deadline = tokio::time::Instant::now() + MAX_WAIT;
        loop {
            let space = self.space.notified();
            {
                let st = self.state.lock();
                if st.queue.len() < self.max_queued || st.disconnected_at.is_some() {
                    return;
                }
                if tokio::time::Instant::now() >= deadline {
                    tracing::warn!(client_id = %self.client_id, queued = st.queue.len(), "subscriber queue over its limit: client is not reading");
                    return;
                }
            }
            let _ = tokio::time::timeout_at(deadline, space).await;
        }
    }

    /// Queues `d`, a message routed to the session here, unless it is one the session took
    /// from another node already ([`State::imported`]): false then (the caller logs its
    /// LSN as done, so that a replay does not queue it either).
    pub(crate) fn push_routed(&self, d: Delivery) -> bool {
        let mut st = self.state.lock();
        if st.imported_already(&d.message) {
            return false;
        }
        self.push_locked(st, d);
        true
    }

    /// Queues `d` at once: past the limit when online (the publisher waited for room
    /// before), dropping the oldest (counted) when offline and full.
    pub(crate) fn push(&self, d: Delivery) {
        self.push_locked(self.state.lock(), d);
    }

    fn push_locked(&self, mut st: parking_lot::MutexGuard<'_, State>, d: Delivery) {
        st.pushed += 1;
        // A QoS 0 delivery is no copy of a lasting one another node holds.
        if let Some(installed) = st.installed.as_mut()
            && d.qos != QoS::AtMostOnce
        {
            installed.routed_late(&d.message);
        }
        if st.queue.len() >= self.max_queued && st.disconnected_at.is_some() {
            st.queue.pop_front();
            if st.dropped == 0 {
                tracing::warn!(client_id = %self.client_id, max = self.max_queued, "offline session's queue full (mqtt.max_queued_messages): its oldest messages are dropped, counted in system.sessions and sluice_mqtt_dropped_messages");
            }
            st.dropped += 1;
        }
        st.queue.push_back(d);
        drop(st);
        self.wake_writer.notify_one();
    }

    /// Whether the session outlives its connection (its state is in the journal).
    pub(crate) fn lasting(&self) -> bool {
        self.state.lock().expiry_secs > 0
    }

    /// Takes up to `max` queued deliveries (skipping expired ones), each QoS 1/2 one with a
    /// free packet id under which it is in flight from now, in the same critical section
    /// (so that a snapshot sees each either queued or in flight). QoS 0 ones get 0. Stops
    /// early when no packet id is free.
    pub(crate) fn take_into_flight(&self, max: usize) -> Vec<(Delivery, u16)> {
        let mut st = self.state.lock();
        let now = Instant::now();
        let mut out = Vec::new();
        while out.len() < max {
            let Some(d) = st.queue.front() else { break };
            if d.message.expires.is_some_and(|e| e <= now) {
                st.queue.pop_front();
                continue;
            }
            let pkid = if d.qos == QoS::AtMostOnce {
                0
            } else {
                let Some(pkid) = st.next_pkid(self.pkids) else {
                    break;
                };
                pkid
            };
            let Some(d) = st.queue.pop_front() else { break };
            if pkid != 0 {
                st.inflight.insert(pkid, Outgoing::Published(d.clone()));
            }
            out.push((d, pkid));
        }
        drop(st);
        if !out.is_empty() {
            self.space.notify_waiters();
        }
        out
    }

    /// Takes up to `max` queued deliveries (skipping expired ones), not into flight (a
    /// bridge's forwarder, whose remote acknowledges them).
    pub(crate) fn take(&self, max: usize) -> Vec<Delivery> {
        let mut st = self.state.lock();
        let now = Instant::now();
        let mut out = Vec::new();
        while out.len() < max {
            let Some(d) = st.queue.pop_front() else { break };
            if d.message.expires.is_none_or(|e| e > now) {
                out.push(d);
            }
        }
        drop(st);
        if !out.is_empty() {
            self.space.notify_waiters();
        }
        out
    }

    /// What another node holds for the session is about to be logged here (and the
    /// subscriptions it brings put in place): from now until [`Session::install`], every
    /// message routed to it is noted as having reached it here ([`Installed::pending`]).
    /// Nothing changes when it was installed before.
    pub(crate) fn install_pending(&self, mut installed: Installed) {
        let mut st = self.state.lock();
        if st.installed.is_none() {
            installed.pending = true;
            st.installed = Some(Box::new(installed));
        }
    }

    /// The session's subscriptions are in place here: `installed` says from when (kept if
    /// set before: the subscriptions were in place since, unless that was pending: what
    /// it noted meanwhile is kept).
    pub(crate) fn install(&self, mut installed: Installed) {
        let mut st = self.state.lock();
        let late = match st.installed.take() {
            Some(i) if !i.pending => {
                st.installed = Some(i);
                return;
            }
            Some(i) => i.late,
            None => HashSet::new(),
        };
        installed.filters = (st.subscriptions.keys())
            .filter(|f| crate::topic::parse_shared(f).is_none())
            .cloned()
            .collect();
        installed.late.extend(late);
        st.installed = Some(Box::new(installed));
    }

    /// Takes `o`, which another node had sent under `pkid` and not seen completed: in
    /// flight under that id (sent again, DUP or PUBREL, at once to a connected client),
    /// unless the id is taken here: then a message is queued, to go out under a new one (a
    /// pending PUBREL is dropped: the id's state here stands). One critical section, so the
    /// writer cannot send it under another id first.
    pub(crate) fn push_in_flight(&self, o: Outgoing, pkid: u16) {
        let mut st = self.state.lock();
        match st.inflight.entry(pkid) {
            std::collections::btree_map::Entry::Vacant(e) => {
                e.insert(o);
                st.resend_now(pkid);
            }
            std::collections::btree_map::Entry::Occupied(_) => {
                if let Outgoing::Published(d) = o {
                    st.queue.push_back(d);
                }
            }
        }
        drop(st);
        self.wake_writer.notify_one();
    }

    /// Whether a connection is attached.
    pub(crate) fn online(&self) -> bool {
        self.state.lock().disconnected_at.is_none()
    }

    /// Marks the session detached from connection `conn` (if still attached to it); a
    /// publisher blocked on its queue is released into the offline rules.
    pub(crate) fn detach(&self, conn: u64) -> bool {
        let mut c = self.connection.lock();
        if c.as_ref().is_some_and(|(id, _)| *id == conn) {
            *c = None;
            self.state.lock().disconnected_at = Some(Instant::now());
            self.space.notify_waiters();
            true
        } else {
            false
        }
    }

    /// Next generation number (a new connection attached).
    pub(crate) fn bump(&self) -> u64 {
        self.generation.fetch_add(1, Ordering::AcqRel) + 1
    }
}
