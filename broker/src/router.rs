//! The router: sessions by client id, the subscription tree, retained messages, and the
//! fan-out of one message to every session whose subscriptions match it.

pub(crate) mod remote;
pub(crate) mod replay;

use crate::persist;
use crate::session::{Delivery, Message, Outgoing, Session, SubOptions};
use crate::topic::{self, Tree};
use parking_lot::{Mutex, RwLock};
use rumqttc::v5::mqttbytes::QoS;
use sluice_engine::Logins;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// A retained message and its LSN in the journal (0: not in it).
type Retained = (Arc<Message>, u64);

/// The members of one shared-subscription group, with their options.
type Members = Vec<(Arc<Session>, SubOptions)>;

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct SubKey {
    session: Arc<str>,
    group: Option<Arc<str>>,
}

#[derive(Debug)]
struct SubEntry {
    session: Arc<Session>,
    filter: Arc<str>,
    options: SubOptions,
}

/// The broker's state in figures, for `/metrics`, `$SYS` and the console.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Gauges {
    pub(crate) sessions: u64,
    pub(crate) online: u64,
    pub(crate) retained: u64,
    pub(crate) subscriptions: u64,
    pub(crate) queued: u64,
    pub(crate) inflight: u64,
    pub(crate) dropped: u64,
    /// Messages for other nodes of a cluster dropped while they did not answer.
    pub(crate) relay_dropped: u64,
}

/// See the module docs.
#[derive(Debug)]
pub(crate) struct Router {
    tree: RwLock<Tree<SubKey, SubEntry>>,
    /// Retained messages by topic, with their LSN in the journal (0: not in it).
    retained: RwLock<HashMap<Arc<str>, Retained>>,
    sessions: Mutex<HashMap<Arc<str>, Arc<Session>>>,
    next_shared: AtomicUsize,
    max_queued: usize,
    /// The cluster node these sessions live on (`None` on a single node).
    pub(crate) node: Option<u64>,
    /// The cluster's routes (`None` on a single node).
    remote: Option<remote::Remote>,
    /// Per node relaying to this one: its run and the last message logged here.
    relayed: Mutex<std::collections::BTreeMap<u64, (u64, u64)>>,
    /// Retained messages in the log's queue, not yet kept (see [`Router::retaining`]).
    retaining: Arc<AtomicUsize>,
    /// Changes to the subscriptions so far (see [`Router::changes`]).
    changes: std::sync::atomic::AtomicU64,
}

/// Counts a retained message from its journal entry's making until it is kept (or the
/// entry is dropped unlogged): a new subscription that finds some waits for them, so that
/// a retained message whose PUBLISH was read before its SUBSCRIBE is sent with its SUBACK.
pub(crate) struct Retaining(Arc<AtomicUsize>);

impl Drop for Retaining {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Router {
    pub(crate) fn new(max_queued: usize, relay: Option<Arc<dyn sluice_engine::Relay>>) -> Self {
        Self {
            node: relay.as_ref().map(|r| r.node()),
            remote: relay.map(remote::Remote::new),
            tree: RwLock::new(Tree::default()),
            retained: RwLock::new(HashMap::new()),
            sessions: Mutex::new(HashMap::new()),
            next_shared: AtomicUsize::new(0),
            changes: Default::default(),
            max_queued,
            relayed: Mutex::new(std::collections::BTreeMap::new()),
            retaining: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// How many times the subscriptions changed so far: a message planned for the sessions
    /// of one count and logged after a change plans again as it is logged (as a replay of
    /// the journal would: a subscription takes effect as it is logged).
    pub(crate) fn changes(&self) -> u64 {
        self.changes.load(Ordering::Acquire)
    }

    /// The lasting sessions (and their deliveries) a journal replay queues `message` for:
    /// as [`crate::router::replay`]'s `Record::Message` does.
    pub(crate) fn lasting_targets(
        &self,
        message: &Arc<Message>,
        auth: &dyn sluice_engine::Logins,
        chosen: &[Arc<str>],
    ) -> Vec<(Arc<Session>, Delivery)> {
        let (targets, _) = self.targets_among(message, auth, Some(chosen), remote::Groups::All);
        (targets.into_iter())
            .filter(|(s, d)| d.qos != QoS::AtMostOnce && s.lasting())
            .collect()
    }

    /// Counts a retained message being logged until the guard is dropped.
    pub(crate) fn retaining(&self) -> Retaining {
        self.retaining.fetch_add(1, Ordering::AcqRel);
        Retaining(self.retaining.clone())
    }

    /// Whether retained messages are being logged now.
    pub(crate) fn is_retaining(&self) -> bool {
        self.retaining.load(Ordering::Acquire) > 0
    }

    /// Attaches connection `conn` to the session `key`, ending any connection attached to it
    /// (a takeover). Returns the session, whether it existed before, and the generation
    /// this connection owns (a delayed will checks it).
    pub(crate) fn attach(
        &self,
        key: &str,
        clean_start: bool,
        expiry_secs: u32,
        conn: u64,
        cancel: CancellationToken,
    ) -> (Arc<Session>, bool, u64) {
        let mut sessions = self.sessions.lock();
        let existing = sessions.get(key).cloned();
        if let Some(old) = &existing
            && let Some((_, token)) = old.connection.lock().take()
        {
            token.cancel();
        }
        // A session whose expiry was 0 ended with its connection, and one offline past its
        // expiry has ended even if the reaper has not run yet.
        let now = Instant::now();
        let alive = |s: &Arc<Session>| {
            let st = s.state.lock();
            st.expiry_secs > 0
                && st.disconnected_at.is_none_or(|at| {
                    now.duration_since(at) < Duration::from_secs(u64::from(st.expiry_secs))
                })
        };
        let (session, present) = match existing {
            Some(s) if !clean_start && alive(&s) => (s, true),
            other => {
                if let Some(old) = other {
                    self.unsubscribe_all(&old);
                }
                let s = self.new_session(Arc::from(key));
                sessions.insert(s.client_id.clone(), s.clone());
                (s, false)
            }
        };
        *session.connection.lock() = Some((conn, cancel));
        let generation = session.bump();
        {
            let mut st = session.state.lock();
            st.disconnected_at = None;
            st.expiry_secs = expiry_secs;
        }
        drop(sessions);
        if present {
            self.unwithdraw(&session);
        }
        (session, present, generation)
    }

    /// A new session of client `id` on this node (not registered yet).
    pub(crate) fn new_session(&self, id: Arc<str>) -> Arc<Session> {
        Session::new(id, self.max_queued, self.node)
    }

    /// Whether `session` is still the one registered under its id.
    pub(crate) fn is_current(&self, session: &Arc<Session>) -> bool {
        (self.sessions.lock().get(&session.client_id)).is_some_and(|s| Arc::ptr_eq(s, session))
    }

    /// Forgets `session` if it is still the one registered under its id and no connection
    /// has attached to it meanwhile; says whether it did.
    pub(crate) fn discard(&self, session: &Arc<Session>) -> bool {
        let mut sessions = self.sessions.lock();
        let gone = sessions
            .get(&session.client_id)
            .is_some_and(|s| Arc::ptr_eq(s, session))
            && session.connection.lock().is_none();
        if gone {
            sessions.remove(&session.client_id);
            self.unsubscribe_all(session);
        }
        gone
    }

    /// Discards sessions whose expiry has passed since their connection ended; returns
    /// their ids.
    pub(crate) fn expire(&self, now: Instant) -> Vec<Arc<str>> {
        let expired: Vec<Arc<Session>> = self
            .sessions
            .lock()
            .values()
            .filter(|s| {
                let st = s.state.lock();
                st.disconnected_at.is_some_and(|at| {
                    now.duration_since(at) >= Duration::from_secs(u64::from(st.expiry_secs))
                })
            })
            .cloned()
            .collect();
        (expired.into_iter())
            .filter(|s| self.discard(s))
            .map(|s| s.client_id.clone())
            .collect()
    }

    /// The session registered under `key`, if any.
    pub(crate) fn session(&self, key: &str) -> Option<Arc<Session>> {
        self.sessions.lock().get(key).cloned()
    }

    /// Every session (online and offline).
    pub(crate) fn sessions(&self) -> Vec<Arc<Session>> {
        self.sessions.lock().values().cloned().collect()
    }

    /// The state's figures (one pass over the sessions).
    pub(crate) fn gauges(&self) -> Gauges {
        let mut g = Gauges {
            retained: self.retained_count() as u64,
            relay_dropped: self.remote.as_ref().map_or(0, |r| r.dropped()),
            ..Gauges::default()
        };
        for s in self.sessions() {
            let st = s.state.lock();
            g.sessions += 1;
            g.online += u64::from(st.disconnected_at.is_none());
            g.subscriptions += st.subscriptions.len() as u64;
            g.queued += st.queue.len() as u64;
            g.inflight += st.inflight.len() as u64;
            g.dropped += st.dropped;
        }
        g
    }

    /// Every retained message.
    pub(crate) fn retained_all(&self) -> Vec<Arc<Message>> {
        self.retained
            .read()
            .values()
            .map(|(m, _)| m.clone())
            .collect()
    }

    /// Subscribes `session` to `filter` (possibly `$share/group/...`); returns whether it
    /// replaced an existing subscription to the same filter.
    pub(crate) fn subscribe(
        &self,
        session: &Arc<Session>,
        filter: &str,
        options: SubOptions,
    ) -> bool {
        let (group, plain) = match topic::parse_shared(filter) {
            Some((g, f)) => (Some(Arc::from(g)), f),
            None => (None, filter),
        };
        let key = SubKey {
            session: session.client_id.clone(),
            group,
        };
        session
            .state
            .lock()
            .subscriptions
            .insert(filter.to_string(), options.clone());
        let entry = SubEntry {
            session: session.clone(),
            filter: Arc::from(plain),
            options,
        };
        let replaced = self.tree.write().insert(plain, key, entry).is_some();
        self.changes.fetch_add(1, Ordering::AcqRel);
        if let Some(r) = &self.remote
            && !session.withdrawn.load(Ordering::Acquire)
        {
            if !replaced {
                r.added(filter);
            }
            r.share_session(session);
        }
        replaced
    }

    /// Subscribes `session` to `filter` and, with `retained` (and not shared), queues the
    /// retained messages matching it at once: a lasting session's subscription as its
    /// journal record is applied, live and on replay (which leaves QoS 0 ones out: they
    /// were sent, or are gone with the connection).
    pub(crate) fn subscribe_with_retained(
        &self,
        session: &Arc<Session>,
        filter: &str,
        options: SubOptions,
        (retained, replaying): (bool, bool),
        auth: &dyn Logins,
    ) {
        self.subscribe(session, filter, options.clone());
        if retained && topic::parse_shared(filter).is_none() {
            for d in self.retained_for(session, filter, &options, auth) {
                if !replaying || d.qos != QoS::AtMostOnce {
                    session.push(d);
                }
            }
        }
    }

    /// Removes `session`'s subscription to `filter`; returns whether there was one.
    pub(crate) fn unsubscribe(&self, session: &Arc<Session>, filter: &str) -> bool {
        self.remove_subscription(session, filter, true)
    }

    /// [`Router::unsubscribe`]; `share`: tell the other nodes of a cluster what the lasting
    /// session subscribes now (not when it ends: that is said once).
    fn remove_subscription(&self, session: &Arc<Session>, filter: &str, share: bool) -> bool {
        let (group, plain) = match topic::parse_shared(filter) {
            Some((g, f)) => (Some(Arc::from(g)), f),
            None => (None, filter),
        };
        session.state.lock().subscriptions.remove(filter);
        let key = SubKey {
            session: session.client_id.clone(),
            group,
        };
        let removed = self.tree.write().remove(plain, &key).is_some();
        self.changes.fetch_add(1, Ordering::AcqRel);
        if let Some(r) = &self.remote
            && !session.withdrawn.load(Ordering::Acquire)
        {
            if removed {
                r.removed(filter);
            }
            if share {
                r.share_session(session);
            }
        }
        removed
    }

    /// Removes every subscription of `session`, which has ended.
    fn unsubscribe_all(&self, session: &Arc<Session>) {
        session.ended.notify_waiters();
        let filters: Vec<String> = session.state.lock().subscriptions.keys().cloned().collect();
        for f in filters {
            self.remove_subscription(session, &f, false);
        }
        if let Some(r) = &self.remote {
            r.session_ended(&session.client_id);
        }
    }

    /// Keeps (or, for an empty payload, clears) the retained message of its topic; `lsn` is
    /// its record's in the journal (0: not in it).
    pub(crate) fn retain(&self, message: &Arc<Message>, lsn: u64) {
        let mut r = self.retained.write();
        if message.payload.is_empty() {
            r.remove(&message.topic);
        } else {
            r.insert(message.topic.clone(), (message.clone(), lsn));
        }
    }

    /// Forgets the retained messages of the topics `served` says the tables serve (a
    /// `retain = "latest"` rule's, kept before that rule was set).
    pub(crate) fn forget_retained(&self, served: impl Fn(&str) -> bool) {
        self.retained.write().retain(|topic, _| !served(topic));
    }

    /// What a new subscription of `session` to `filter` (not shared) gets at once: the
    /// retained messages matching it (not expired) that its user may receive, each with its
    /// LSN so that a lasting session's record of it names it.
    pub(crate) fn retained_for(
        &self,
        session: &Session,
        filter: &str,
        options: &SubOptions,
        auth: &dyn Logins,
    ) -> Vec<Delivery> {
        let now = Instant::now();
        let user = session.user.lock().clone();
        self.retained
            .read()
            .values()
            .filter(|(m, _)| topic::matches(filter, &m.topic))
            .filter(|(m, _)| m.expires.is_none_or(|e| e > now))
            .filter(|(m, _)| crate::auth::may_receive(auth, user.as_deref(), &m.topic))
            .map(|(m, lsn)| Delivery {
                qos: min_qos(m.qos, options.qos),
                message: m.clone(),
                retain: true,
                subscription_ids: options.id.into_iter().collect(),
                lsn: *lsn,
            })
            .collect()
    }

    /// Number of retained messages.
    pub(crate) fn retained_count(&self) -> usize {
        self.retained.read().len()
    }

    /// The sessions `message` goes to, each with its delivery: once per session with the
    /// highest QoS of its matching subscriptions and all their identifiers, and to one
    /// member of each shared group, each only if `auth` lets its session's user receive the
    /// topic; and how many of them are not shared groups' members (those come first). No
    /// allocation when there are none; [`deliver`] queues them. With `chosen` (a replay),
    /// each shared group's member is the one of `chosen` (as the journal recorded), instead
    /// of the next in turn.
    pub(crate) fn targets_among(
        &self,
        message: &Arc<Message>,
        auth: &dyn Logins,
        chosen: Option<&[Arc<str>]>,
        serves: remote::Groups<'_>,
    ) -> (Vec<Target>, usize) {
        let may_receive =
            |s: &Session| crate::auth::may_receive(auth, s.user.lock().as_deref(), &message.topic);
        let mut direct: HashMap<Arc<str>, (Arc<Session>, Delivery)> = HashMap::new();
        let mut groups: HashMap<(Arc<str>, Arc<str>), Members> = HashMap::new();
        self.tree
            .read()
            .for_each_match(&message.topic, |key, entry| {
                if !may_receive(&entry.session) {
                    return;
                }
                if let Some(group) = &key.group {
                    groups
                        .entry((group.clone(), entry.filter.clone()))
                        .or_default()
                        .push((entry.session.clone(), entry.options.clone()));
                    return;
                }
                if entry.options.no_local && entry.session.client_id == message.origin {
                    return;
                }
                let qos = min_qos(message.qos, entry.options.qos);
                let retain = entry.options.retain_as_published && message.retain;
                let d = direct
                    .entry(entry.session.client_id.clone())
                    .or_insert_with(|| {
                        (
                            entry.session.clone(),
                            Delivery {
                                message: message.clone(),
                                qos,
                                retain,
                                subscription_ids: Vec::new(),
                                lsn: 0,
                            },
                        )
                    });
                d.1.qos = max_qos(d.1.qos, qos);
                d.1.retain |= retain;
                d.1.subscription_ids.extend(entry.options.id);
            });
        let mut out: Vec<Target> = direct.into_values().collect();
        let direct = out.len();
        for ((group, filter), mut members) in groups {
            if !serves.serves(&group, &filter) {
                continue;
            }
            let picked = match chosen {
                Some(chosen) => members
                    .iter()
                    .find(|(s, _)| chosen.contains(&s.client_id))
                    .cloned(),
                None => {
                    // Round robin, preferring members that are connected.
                    members.sort_by(|a, b| a.0.client_id.cmp(&b.0.client_id));
                    let online: Vec<_> = members.iter().filter(|(s, _)| s.online()).collect();
                    let pool = if online.is_empty() {
                        members.iter().collect()
                    } else {
                        online
                    };
                    let n = self.next_shared.fetch_add(1, Ordering::Relaxed) % pool.len();
                    Some(pool[n].clone())
                }
            };
            let Some((session, options)) = picked else {
                continue;
            };
            out.push((
                session.clone(),
                Delivery {
                    message: message.clone(),
                    qos: min_qos(message.qos, options.qos),
                    retain: false,
                    subscription_ids: options.id.into_iter().collect(),
                    lsn: 0,
                },
            ));
        }
        (out, direct)
    }
}

/// A session and what it is to be sent.
pub(crate) type Target = (Arc<Session>, Delivery);

/// Queues each target's delivery; waits while an online receiver's queue is full.
pub(crate) async fn deliver(targets: Vec<Target>) {
    for (session, d) in targets {
        let may_wait = may_wait(&session, &d.message);
        session.enqueue(d, may_wait).await;
    }
}

/// Whether the publisher of `message` may wait for room in `session`'s queue: a client
/// subscribed to what it publishes must not wait for its own reader, and the broker's own
/// messages (`$SYS`, alerts) never wait.
pub(crate) fn may_wait(session: &Session, message: &Message) -> bool {
    let origin = &message.origin;
    session.client_id != *origin && !origin.starts_with('$')
}

pub(crate) fn min_qos(a: QoS, b: QoS) -> QoS {
    if (a as u8) <= (b as u8) { a } else { b }
}

fn max_qos(a: QoS, b: QoS) -> QoS {
    if (a as u8) >= (b as u8) { a } else { b }
}

/// What a snapshot holds, copied quickly (messages shared) while the log is still.
pub(crate) struct LastingCopy {
    sessions: Vec<(Arc<Session>, crate::session::State)>,
    retained: Vec<(Arc<Message>, u64)>,
}

impl Router {
    /// Sessions that outlive their connection, and retained messages, copied for a
    /// snapshot (see [`Router::lasting_state`]).
    pub(crate) fn lasting_copy(&self) -> LastingCopy {
        let sessions: Vec<Arc<Session>> = self.sessions.lock().values().cloned().collect();
        let sessions = (sessions.into_iter())
            .filter_map(|s| {
                let copy = {
                    let st = s.state.lock();
                    (st.expiry_secs > 0).then(|| st.copy())
                };
                copy.map(|c| (s, c))
            })
            .collect();
        let retained = self.retained.read().values().cloned().collect();
        LastingCopy { sessions, retained }
    }

    /// A copy's sessions and retained messages as saved.
    pub(crate) fn lasting_state(
        copy: LastingCopy,
    ) -> (
        Vec<persist::SessionState>,
        Vec<persist::StoredMessage>,
        persist::ByLsn,
    ) {
        let mut out = Vec::new();
        let mut messages = persist::ByLsn::new();
        for (s, st) in copy.sessions {
            out.push(persist::SessionState {
                id: s.client_id.to_string(),
                user: s.user.lock().as_deref().map(str::to_string),
                expiry_secs: st.expiry_secs,
                subscriptions: st
                    .subscriptions
                    .iter()
                    .map(|(f, o)| persist::StoredSub::from(f, o))
                    .collect(),
                queue: (st.queue.iter())
                    .map(|d| persist::StoredDelivery::from(d, &mut messages))
                    .collect(),
                inflight: (st.inflight.iter())
                    .map(|(k, o)| (*k, persist::outgoing(o, &mut messages)))
                    .collect(),
                released: (st.inflight.iter())
                    .filter_map(|(k, o)| match o {
                        Outgoing::Released(lsn) => Some((*k, *lsn)),
                        Outgoing::Published(_) => None,
                    })
                    .collect(),
                incoming_qos2: (st.incoming_qos2.difference(&st.unlogged_qos2))
                    .copied()
                    .collect(),
                will: (s.will.lock().as_ref())
                    .map(|(m, delay)| (persist::StoredMessage::from(m), *delay)),
                standby: s.standby.lock().clone(),
                pulled: st.pulled_marks(),
            });
        }
        let retained = (copy.retained.iter())
            .map(|(m, lsn)| persist::StoredMessage::from(m).at(*lsn))
            .collect();
        (out, retained, messages)
    }

    /// Recreates saved sessions (offline, their expiry counting from now) and retained
    /// messages.
    pub(crate) fn restore(
        &self,
        sessions: Vec<persist::SessionState>,
        retained: Vec<persist::StoredMessage>,
        messages: Vec<(u64, persist::StoredMessage)>,
    ) {
        let messages: HashMap<u64, Arc<Message>> = (messages.into_iter())
            .map(|(lsn, m)| (lsn, m.into_message()))
            .collect();
        for saved in sessions {
            let s = self.new_session(Arc::from(saved.id.as_str()));
            *s.user.lock() = saved.user.map(Arc::from);
            *s.will.lock() = saved.will.map(|(m, delay)| (m.into_message(), delay));
            *s.standby.lock() = saved.standby;
            {
                let mut st = s.state.lock();
                st.expiry_secs = saved.expiry_secs;
                st.disconnected_at = Some(Instant::now());
                for (node, marks) in saved.pulled {
                    st.note_pulled(node, marks);
                }
                st.queue = (saved.queue.into_iter())
                    .filter_map(|d| d.into_delivery(&messages))
                    .collect();
                let released: HashMap<u16, u64> = saved.released.into_iter().collect();
                st.inflight = (saved.inflight.into_iter())
                    .filter_map(|(k, d)| {
                        let o = match d {
                            Some(d) => Outgoing::Published(d.into_delivery(&messages)?),
                            None => Outgoing::Released(released.get(&k).copied().unwrap_or(0)),
                        };
                        Some((k, o))
                    })
                    .collect();
                st.incoming_qos2 = saved.incoming_qos2.into_iter().collect();
            }
            self.sessions.lock().insert(s.client_id.clone(), s.clone());
            for sub in saved.subscriptions {
                self.subscribe(&s, &sub.filter, sub.options());
            }
        }
        let mut r = self.retained.write();
        for m in retained {
            let lsn = m.lsn;
            let m = m.into_message();
            r.insert(m.topic.clone(), (m, lsn));
        }
    }
}
