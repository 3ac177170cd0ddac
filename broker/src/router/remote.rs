//! The router's part in a cluster: it tells the relay which filters this node's sessions
//! subscribe, keeps the other nodes' filters in a second tree, and chooses which nodes a
//! message goes to (every node with a matching subscription; for a shared group, one
//! node among those with members, in turn; every node for a retained message, which each
//! keeps).

use super::Router;
use crate::journal;
use crate::session::{Message, MessageId};
use crate::topic::{self, Tree};
use parking_lot::{Mutex, RwLock};
use sluice_engine::{Relay, Relaying, RouteChange};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// A shared group and its filter.
pub(crate) type Group = (Arc<str>, Arc<str>);

/// Which shared groups a delivery on this node serves.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Groups<'a> {
    /// All of them (a single node, or a replay).
    All,
    /// All but these, whose member another node chose.
    Except(&'a [Group]),
    /// Only these (a message another node relayed).
    Only(&'a [Group]),
}

impl Groups<'_> {
    pub(crate) fn serves(&self, group: &Arc<str>, filter: &Arc<str>) -> bool {
        let listed = |l: &[Group]| l.iter().any(|(g, f)| g == group && f == filter);
        match self {
            Groups::All => true,
            Groups::Except(l) => !listed(l),
            Groups::Only(l) => listed(l),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct RemoteKey {
    node: u64,
    group: Option<Arc<str>>,
}

/// See the module docs.
pub(crate) struct Remote {
    relay: Arc<dyn Relay>,
    /// This node's subscriptions per filter as subscribed (`$share/...` included).
    local: Mutex<HashMap<String, usize>>,
    /// The last change to this node's routes.
    seq: AtomicU64,
    /// The other nodes' routes: plain filter -> (node, group).
    tree: RwLock<Tree<RemoteKey, Arc<str>>>,
    /// ... and the same by node, as subscribed.
    sets: Mutex<HashMap<u64, HashSet<String>>>,
    next_shared: AtomicUsize,
    /// This run of the node, and the number of the last message it took from a publisher
    /// ([`crate::session::MessageId`]), held while a message is numbered, its nodes chosen
    /// and queued: a later number is queued later for every node, and goes to every node
    /// an earlier one went to (a route, once known, counts for every later number).
    run: u64,
    numbered: Mutex<u64>,
    /// What came from the other nodes.
    came: Mutex<Came>,
}

/// What came from the other nodes ([`Remote::received`], [`Remote::taken`]).
#[derive(Default)]
struct Came {
    /// Per other node's run, the highest number relayed here, counted before its batch is
    /// planned for the sessions here (what an [`crate::session::Installed`] takes); the
    /// nodes that relayed messages without ids; the runs with a gap.
    planned: crate::session::Arrivals,
    /// Per other node's run, the highest number of a batch logged here.
    taken: HashMap<(u64, u64), u64>,
    /// Nodes with a gap whose run is not known yet: the next numbered message tells it.
    gap_run_unknown: HashSet<u64>,
}

/// Raises `max`'s number for `id`'s run to `id`'s.
fn raise(max: &mut HashMap<(u64, u64), u64>, id: &MessageId) {
    let m = max.entry((id.node, id.run)).or_insert(id.seq);
    *m = (*m).max(id.seq);
}

impl std::fmt::Debug for Remote {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Remote")
            .field("node", &self.relay.node())
            .finish_non_exhaustive()
    }
}

/// A subscribed filter split into its shared group (if any) and plain filter.
fn split(filter: &str) -> (Option<Arc<str>>, &str) {
    match topic::parse_shared(filter) {
        Some((g, f)) => (Some(Arc::from(g)), f),
        None => (None, filter),
    }
}

impl Remote {
    pub(crate) fn new(relay: Arc<dyn Relay>) -> Self {
        Self {
            relay,
            local: Mutex::new(HashMap::new()),
            seq: AtomicU64::new(0),
            tree: RwLock::new(Tree::default()),
            sets: Mutex::new(HashMap::new()),
            next_shared: AtomicUsize::new(0),
            run: sluice_engine::now_micros() as u64,
            numbered: Mutex::new(0),
            came: Mutex::new(Came::default()),
        }
    }

    /// This node's id.
    pub(crate) fn node(&self) -> u64 {
        self.relay.node()
    }

    /// The number the next message this node takes from a publisher gets, at least.
    pub(crate) fn next_number(&self) -> u64 {
        *self.numbered.lock() + 1
    }

    /// Messages came from node `from` (before they are routed here), with these ids.
    pub(crate) fn received<'a>(&self, from: u64, messages: impl Iterator<Item = &'a Message>) {
        // A batch holds its sender's messages, in the order numbered: its last numbered
        // one is the highest, and one update of the map does.
        let (mut last, mut unnumbered) = (None, false);
        for m in messages {
            match m.id.get() {
                Some(id) => last = Some(*id),
                None => unnumbered = true,
            }
        }
        let mut came = self.came.lock();
        if let Some(id) = last {
            raise(&mut came.planned.max, &id);
            if came.gap_run_unknown.remove(&id.node) {
                came.planned.gapped.insert((id.node, id.run));
            }
        }
        if unnumbered {
            came.planned.unnumbered.insert(from);
        }
    }

    /// A batch of these messages (as given to [`Remote::received`]) was logged for the
    /// sessions here, or needed no logging: they came.
    pub(crate) fn taken<'a>(&self, messages: impl Iterator<Item = &'a Message>) {
        // The batch's last numbered message is its highest.
        if let Some(id) = messages.filter_map(|m| m.id.get()).last() {
            raise(&mut self.came.lock().taken, id);
        }
    }

    /// What has come from the other nodes so far: the messages of batches logged here
    /// ([`Remote::taken`]). A batch still being logged, or one that could not be, has not
    /// come: a copy another node gives back of one of its messages is kept, not left out.
    pub(crate) fn received_now(&self) -> crate::session::Arrivals {
        let came = self.came.lock();
        crate::session::Arrivals {
            max: came.taken.clone(),
            unnumbered: came.planned.unnumbered.clone(),
            gapped: came.planned.gapped.clone(),
        }
    }

    /// Some of node `from`'s messages for this node never came, or were not taken: none of
    /// the messages of that run of the node (`run`, when known) can be placed from now on
    /// (a copy is kept rather than one lost). Else the run is the one of the next numbered
    /// message that comes from it (the batch that skipped numbers): a node that restarted
    /// meanwhile gets its new run marked, which only keeps copies.
    pub(crate) fn gap(&self, from: u64, run: Option<u64>) {
        let mut came = self.came.lock();
        match run {
            Some(run) => came.planned.gapped.insert((from, run)),
            None => came.gap_run_unknown.insert(from),
        };
    }

    /// What tells, once a session's subscriptions are in place here (what another node
    /// held was taken), which of the messages another node later gives back or hands over
    /// reached it here already ([`crate::session::Installed`]).
    pub(crate) fn installed(&self) -> crate::session::Installed {
        crate::session::Installed {
            node: self.node(),
            run: self.run,
            next: self.next_number(),
            then: self.came.lock().planned.clone(),
            filters: Vec::new(),
            until: Some(std::time::Instant::now() + crate::session::LATE_FOR),
            late: HashSet::new(),
            pending: false,
        }
    }

    /// A session of this node subscribed `filter` (not replacing a subscription).
    pub(crate) fn added(&self, filter: &str) {
        let mut local = self.local.lock();
        let n = local.entry(filter.to_string()).or_default();
        *n += 1;
        if *n == 1 {
            let seq = self.relay.set_route(filter, true);
            self.seq.fetch_max(seq, Ordering::AcqRel);
        }
    }

    /// A session of this node no longer subscribes `filter`.
    pub(crate) fn removed(&self, filter: &str) {
        let mut local = self.local.lock();
        let Some(n) = local.get_mut(filter) else {
            return;
        };
        *n -= 1;
        if *n == 0 {
            local.remove(filter);
            let seq = self.relay.set_route(filter, false);
            self.seq.fetch_max(seq, Ordering::AcqRel);
        }
    }

    /// The other nodes keep what a lasting `session` subscribes (for its client, should
    /// this node be down when it comes back).
    pub(crate) fn share_session(&self, session: &crate::session::Session) {
        let held = crate::takeover::subscriptions(session);
        // A SUBACK waits until the others know it (`known`), as for a new route: should
        // this node die next, the client finds the subscription elsewhere.
        let seq = self.relay.set_session(&session.client_id, held);
        self.seq.fetch_max(seq, Ordering::AcqRel);
    }

    /// The other nodes keep the will of this node's connection of `client` (for when this
    /// node dies before publishing it), or forget it (`None`: published, or no longer due).
    /// Kept as the journal's record of a connection with a will: message, delay (at most
    /// the session's `expiry`) and user.
    pub(crate) fn share_will(
        &self,
        client: &Arc<str>,
        will: Option<&(Arc<Message>, u32)>,
        user: Option<Arc<str>>,
        expiry: u32,
    ) {
        let held = will.map(|(message, delay)| {
            let delay = (*delay).min(expiry);
            let record = journal::Record::Open {
                client: client.clone(),
                user,
                expiry,
                fresh: false,
                will: Some((message.clone(), delay)),
            };
            (bytes::Bytes::from(record.encode()), delay)
        });
        self.relay.set_will(client, held);
    }

    /// What the other nodes did with the wills of this node's previous run.
    pub(crate) async fn claim_wills(&self) -> sluice_engine::ClaimedWills {
        self.relay.claim_wills().await
    }

    /// Whether a node other than this one has a lasting session of `client`.
    pub(crate) fn session_elsewhere(&self, client: &str) -> bool {
        self.relay.session_elsewhere(client).is_some()
    }

    /// Messages dropped for nodes that did not answer.
    pub(crate) fn dropped(&self) -> u64 {
        self.relay.dropped()
    }

    /// The session `client` ended here.
    pub(crate) fn session_ended(&self, client: &str) {
        self.relay.set_session(client, None);
    }

    /// Returns once the other nodes know this node's routes as they are now (or do not
    /// answer).
    pub(crate) async fn known(&self) {
        self.relay
            .routes_known(self.seq.load(Ordering::Acquire))
            .await;
    }

    /// Node `node`'s routes changed.
    pub(crate) fn change(&self, node: u64, change: RouteChange) {
        let mut sets = self.sets.lock();
        let set = sets.entry(node).or_default();
        let mut tree = self.tree.write();
        let mut apply = |filter: &str, present: bool| {
            let (group, plain) = split(filter);
            let key = RemoteKey { node, group };
            match present {
                true => tree.insert(plain, key, Arc::from(plain)),
                false => tree.remove(plain, &key),
            };
        };
        match change {
            RouteChange::Replace(all) => {
                for f in set.drain() {
                    apply(&f, false);
                }
                for f in all {
                    apply(&f, true);
                    set.insert(f);
                }
            }
            RouteChange::Add(f) => {
                apply(&f, true);
                set.insert(f);
            }
            RouteChange::Remove(f) => {
                apply(&f, false);
                set.remove(&f);
            }
        }
    }

    /// Queues `message` for the other nodes it goes to, now (so in its publisher's order);
    /// returns the queue slots and the shared groups whose member another node chose.
    pub(crate) fn relay(&self, message: &Message) -> (Relaying, Vec<Group>) {
        // Numbered here, where its publisher's node first routes it (before it is stored,
        // so in its publisher's order), with the nodes it goes to.
        let mut numbered = self.numbered.lock();
        let mut to: BTreeMap<u64, Vec<Group>> = BTreeMap::new();
        let mut groups: HashMap<Group, Vec<u64>> = HashMap::new();
        self.tree
            .read()
            .for_each_match(&message.topic, |key, plain| match &key.group {
                None => {
                    to.entry(key.node).or_default();
                }
                Some(g) => {
                    let nodes = groups.entry((g.clone(), plain.clone())).or_default();
                    nodes.push(key.node);
                }
            });
        let mut elsewhere = Vec::new();
        for (group, mut nodes) in groups {
            let here = format!("$share/{}/{}", group.0, group.1);
            if self.local.lock().contains_key(&here) {
                nodes.push(self.relay.node());
            }
            nodes.sort_unstable();
            let n = self.next_shared.fetch_add(1, Ordering::Relaxed) % nodes.len();
            if nodes[n] != self.relay.node() {
                to.entry(nodes[n]).or_default().push(group.clone());
                elsewhere.push(group);
            }
        }
        if message.retain {
            for p in self.relay.peers() {
                to.entry(p).or_default();
            }
        }
        if message.id.get().is_none() {
            *numbered += 1;
            let id = MessageId {
                node: self.relay.node(),
                run: self.run,
                seq: *numbered,
            };
            let _ = message.sent_to.set(to.keys().copied().collect());
            let _ = message.id.set(id);
        }
        // Encoded once for the nodes that serve no shared group (most of them); without
        // its id for a node of an older version, which would not read it.
        let mut plain: [Option<bytes::Bytes>; 2] = [None, None];
        let mut out = Relaying::none();
        for (node, groups) in to {
            let ids = self.relay.takes_ids(node);
            let bytes = match groups.is_empty() {
                true => (plain[usize::from(ids)])
                    .get_or_insert_with(|| journal::relayed(message, &[], ids))
                    .clone(),
                false => journal::relayed(message, &groups, ids),
            };
            out.join(self.relay.send(&[node], bytes));
        }
        (out, elsewhere)
    }
}

impl Router {
    /// Whether any subscription here or on another node matches `topic` (a subscription
    /// made meanwhile may or may not get a message published at the same time).
    pub(crate) fn listened(&self, topic: &str) -> bool {
        let mut any = false;
        self.tree.read().for_each_match(topic, |_, _| any = true);
        if let Some(r) = &self.remote
            && !any
        {
            r.tree.read().for_each_match(topic, |_, _| any = true);
        }
        any
    }

    /// The cluster's routes, in a cluster.
    pub(crate) fn remote(&self) -> Option<&Remote> {
        self.remote.as_ref()
    }

    /// Relayed messages from node `from`'s run `incarnation` up to `last` are logged.
    pub(crate) fn relayed(&self, from: u64, incarnation: u64, last: u64) {
        let mut marks = self.relayed.lock();
        let m = marks.entry(from).or_insert((incarnation, last));
        if m.0 != incarnation || m.1 < last {
            *m = (incarnation, last);
        }
    }

    /// `session`'s client went to another node: unless `still` no longer holds (checked
    /// under the session's `moving` lock, which a client attaching here takes to give the
    /// routes back), its subscriptions stop counting as this node's routes, and the other
    /// nodes forget it is here (once). Whether it is withdrawn now.
    pub(crate) fn withdraw(
        &self,
        session: &crate::session::Session,
        still: impl FnOnce(&crate::session::Session) -> bool,
    ) -> bool {
        let Some(r) = &self.remote else {
            return false;
        };
        let _moving = session.moving.lock();
        if !still(session) {
            return session.withdrawn.load(Ordering::Acquire);
        }
        if session.withdrawn.swap(true, Ordering::AcqRel) {
            return true;
        }
        let filters: Vec<String> = {
            let mut st = session.state.lock();
            // Messages stop coming here for it: what was routed here says nothing of later
            // ones.
            st.installed = None;
            st.subscriptions.keys().cloned().collect()
        };
        for f in filters {
            r.removed(&f);
        }
        r.session_ended(&session.client_id);
        true
    }

    /// `session`'s client came back to it here after [`Router::withdraw`]: its
    /// subscriptions count as this node's routes again.
    pub(crate) fn unwithdraw(&self, session: &crate::session::Session) {
        let Some(r) = &self.remote else {
            return;
        };
        let _moving = session.moving.lock();
        if !session.withdrawn.swap(false, Ordering::AcqRel) {
            return;
        }
        let filters: Vec<String> = session.state.lock().subscriptions.keys().cloned().collect();
        for f in filters {
            r.added(&f);
        }
        r.share_session(session);
    }

    /// What [`Router::relayed`] keeps: (sender, run, last).
    pub(crate) fn relayed_marks(&self) -> Vec<(u64, u64, u64)> {
        (self.relayed.lock().iter())
            .map(|(from, (i, l))| (*from, *i, *l))
            .collect()
    }
}
