//! Storing one message: topic -> table, one durable append, dead letters, then routing.

use crate::BrokerState;
use crate::error;
use crate::journal::{self, Record};
use crate::router::Target;
use crate::router::remote::{Group, Groups};
use crate::session::Message;
use crate::sparkplug;
use futures::future::BoxFuture;
use rumqttc::v5::mqttbytes::v5::PubAckReason;
use sluice_engine::Origin;
use sluice_engine::access::Need;
use sluice_engine::{DeadLetter, Publication};
use sluice_engine::{RelaySink, Relaying, RouteChange};
use std::sync::Arc;
use std::sync::Weak;
use std::sync::atomic::Ordering;

/// Stores `message` if its topic maps to a table, then hands it to the subscribers; a will
/// names the session whose it is (`will_of`), so that it is published once. A message the
/// table refuses is kept in the dead letters and not routed. Returns the ack reason and, on
/// failure, the reason in words.
pub(crate) async fn store(
    shared: Arc<BrokerState>,
    message: Arc<Message>,
    user: Option<Arc<str>>,
    will_of: Option<Arc<str>>,
) -> (PubAckReason, Option<String>) {
    let (relaying, elsewhere) = relay(&shared, &message);
    let serves = Groups::Except(&elsewhere);
    let (journal, targets) = plan(&shared, &message, None, will_of, serves).await;
    let logged = journal.is_some();
    let outcome = store_rows(&shared, &message, user.as_deref(), journal).await;
    let stored = outcome.0 == PubAckReason::Success;
    relaying.go(stored).await;
    if stored {
        deliver_now(&shared, &message, targets, logged).await;
    }
    outcome
}

/// Queues `message` for the other nodes of a cluster whose sessions subscribe it (every
/// node, when it is retained) before it is stored, so in its publisher's order; returns
/// the slots, to release once it is stored ([`Relaying::go`]), and the shared groups whose
/// member another node chose (this node's members skip it).
pub(crate) fn relay(shared: &BrokerState, message: &Message) -> (Relaying, Vec<Group>) {
    match shared.router.remote() {
        Some(r) if !message.origin.starts_with("$SYS") => {
            let (relaying, elsewhere) = r.relay(message);
            let n = relaying.len() as u64;
            shared.metrics.relayed_out.fetch_add(n, Ordering::Relaxed);
            (relaying, elsewhere)
        }
        _ => (Relaying::none(), Vec::new()),
    }
}

/// The broker's side of a cluster's relay: routes of the other nodes into the router, and
/// the messages they relay to this node's sessions.
pub(crate) struct Inbox(pub(crate) Weak<BrokerState>);

impl RelaySink for Inbox {
    fn routes(&self, node: u64, change: RouteChange) {
        if let Some(r) = self.0.upgrade().as_ref().and_then(|s| s.router.remote()) {
            r.change(node, change);
        }
    }

    fn receive(
        &self,
        from: u64,
        (incarnation, last): (u64, u64),
        messages: Vec<bytes::Bytes>,
    ) -> BoxFuture<'static, Result<(), String>> {
        let shared = self.0.upgrade();
        Box::pin(async move {
            let Some(shared) = shared else {
                return Err("the broker has stopped".into());
            };
            // The batch's records go in one group commit, in order; then the receivers that
            // are not lasting get theirs, in order.
            let (mut entries, mut planned) = (Vec::new(), Vec::with_capacity(messages.len()));
            let n = messages.len() as u64;
            shared.metrics.relayed_in.fetch_add(n, Ordering::Relaxed);
            let mut decoded = Vec::with_capacity(messages.len());
            for b in messages {
                let Some((message, groups)) = journal::read_relayed(&b) else {
                    tracing::warn!(from, "a relayed message that does not decode; dropped");
                    continue;
                };
                decoded.push((message, groups));
            }
            if let Some(r) = shared.router.remote() {
                r.received(from, decoded.iter().map(|(m, _)| &**m));
            }
            for (message, groups) in decoded {
                let (journal, targets) =
                    plan(&shared, &message, None, None, Groups::Only(&groups)).await;
                let logged = journal.is_some();
                entries.extend(journal);
                planned.push((message, targets, logged));
            }
            // Logged with them: a copy of this batch sent again after a restart here is
            // skipped (its sessions have it).
            if !entries.is_empty() {
                let mark = Record::Relayed {
                    from,
                    incarnation,
                    last,
                };
                let state = shared.clone();
                let then: sluice_engine::Then =
                    Box::new(move |_| state.router.relayed(from, incarnation, last));
                entries.push(journal::entry(&mark, Some(then)));
            }
            if !entries.is_empty()
                && let Err(e) = shared.db.journal(entries, true).await
            {
                // Not answered: the sender keeps them and sends them again (unless it
                // dies first: counted as a gap, their numbers are no longer telling).
                if let Some(r) = shared.router.remote() {
                    let numbered = planned.iter().rev().find_map(|(m, ..)| m.id.get());
                    r.gap(from, numbered.map(|id| id.run));
                }
                tracing::error!(from, error = %e, "relayed messages not logged for their lasting subscribers; not delivered");
                return Err(format!("relayed messages from node {from} not logged: {e}"));
            }
            if let Some(r) = shared.router.remote() {
                r.taken(planned.iter().map(|(m, ..)| &**m));
            }
            for (message, targets, logged) in planned {
                deliver_now(&shared, &message, targets, logged).await;
            }
            Ok(())
        })
    }

    fn matching(&self, filters: &[String], messages: Vec<bytes::Bytes>) -> Vec<bytes::Bytes> {
        let plain: Vec<&str> = (filters.iter())
            .map(|f| crate::topic::parse_shared(f).map_or(f.as_str(), |(_, plain)| plain))
            .collect();
        let matches = |b: &bytes::Bytes| {
            journal::read_relayed(b)
                .is_some_and(|(m, _)| plain.iter().any(|f| crate::topic::matches(f, &m.topic)))
        };
        messages.into_iter().filter(matches).collect()
    }

    fn hand_over(&self, client: String, clean: bool) -> BoxFuture<'static, Option<bytes::Bytes>> {
        let shared = self.0.upgrade();
        Box::pin(async move { crate::takeover::hand_over(shared?, client, clean).await })
    }

    fn publish_will(&self, node: u64, will: bytes::Bytes) -> BoxFuture<'static, ()> {
        let shared = self.0.upgrade();
        Box::pin(async move {
            if let Some(s) = shared {
                crate::connection::publish_kept_will(s, node, will).await;
            }
        })
    }

    fn gap(&self, from: u64) {
        if let Some(r) = self.0.upgrade().as_ref().and_then(|s| s.router.remote()) {
            tracing::warn!(
                from,
                "messages from another node were dropped on the way here (its queue for this node was full)"
            );
            r.gap(from, None);
        }
    }

    fn standby(&self, call: bytes::Bytes) -> BoxFuture<'static, Result<Vec<u8>, String>> {
        let shared = self.0.upgrade();
        Box::pin(async move {
            match shared {
                Some(s) => crate::standby::serve(s, call).await,
                None => Err("the broker has stopped".into()),
            }
        })
    }

    fn take_given(&self, client: String, held: bytes::Bytes) -> BoxFuture<'static, bool> {
        let shared = self.0.upgrade();
        Box::pin(async move {
            match shared {
                Some(s) => crate::takeover::take_given(s, client, held).await,
                None => false,
            }
        })
    }
}

/// Hands `message` to the subscribers (it is stored already, or maps to no table): through
/// the journal when it must be there ([`plan`]).
pub(crate) async fn route(shared: &Arc<BrokerState>, message: &Arc<Message>) {
    route_all(shared, vec![message.clone()]).await;
}

/// [`route`] for many messages at once (a bridge's): their records in one group commit,
/// the other nodes' copies released together.
pub(crate) async fn route_all(shared: &Arc<BrokerState>, messages: Vec<Arc<Message>>) {
    let relayed: Vec<_> = messages.iter().map(|m| relay(shared, m)).collect();
    let (mut entries, mut planned) = (Vec::new(), Vec::with_capacity(messages.len()));
    for (m, (_, elsewhere)) in messages.into_iter().zip(&relayed) {
        let (journal, targets) = plan(shared, &m, None, None, Groups::Except(elsewhere)).await;
        planned.push((m, targets, journal.is_some()));
        entries.extend(journal);
    }
    let logged = match entries.is_empty() {
        true => Ok(0),
        false => shared.db.journal(entries, true).await,
    };
    let go = relayed.into_iter().map(|(r, _)| r.go(logged.is_ok()));
    futures::future::join_all(go).await;
    if let Err(e) = logged {
        tracing::error!(error = %e, "messages not logged for their lasting subscribers; not delivered");
        return;
    }
    for (m, targets, logged) in planned {
        deliver_now(shared, &m, targets, logged).await;
    }
}

/// Queues `message` for `targets` (what [`plan`] left to deliver once it is stored) and,
/// when it is not in the journal, keeps it if retained; may wait for room in a slow
/// subscriber's queue.
pub(crate) async fn deliver_now(
    shared: &BrokerState,
    message: &Arc<Message>,
    targets: Vec<Target>,
    logged: bool,
) {
    if kept_retained(shared, message) && !logged {
        shared.router.retain(message, 0);
    }
    if !targets.is_empty() {
        crate::router::deliver(targets).await;
    }
}

/// Whether `message` is a retained message the broker keeps: not those of topics whose
/// table serves them (a `retain = "latest"` rule's; see [`crate::latest`]).
pub(crate) fn kept_retained(shared: &BrokerState, message: &Message) -> bool {
    message.retain && !shared.mapper.retains_latest(&message.topic)
}

/// Where `message` goes, and whether it goes through the journal: it does, where the log
/// keeps one, when it is retained, goes at QoS 1 or 2 to a session that outlives its
/// connection, is the QoS 2 publish of such a session (`incoming`: its packet id is kept
/// until PUBREL) or its will (`will_of`). Then this waits for room in its lasting online
/// receivers' queues (a slow subscriber slows its publishers), and returns the journal
/// entry, which retains the message and queues it for those receivers once it is durable,
/// in log order; the message is acknowledged only after that. The other receivers (not
/// lasting, or at QoS 0) are returned either way, for [`deliver_now`] once it is stored:
/// in the order its publisher sent it, as messages not in the journal are.
pub(crate) async fn plan(
    shared: &Arc<BrokerState>,
    message: &Arc<Message>,
    incoming: Option<(Arc<str>, u16)>,
    will_of: Option<Arc<str>>,
    serves: Groups<'_>,
) -> (Option<sluice_engine::Journal>, Vec<Target>) {
    let changes = shared.router.changes();
    let (targets, direct) =
        (shared.router).targets_among(message, shared.db.as_ref(), None, serves);
    let lasting = |(s, d): &Target| d.qos != rumqttc::v5::mqttbytes::QoS::AtMostOnce && s.lasting();
    let kept = kept_retained(shared, message);
    let logged = shared.db.journals()
        && !message.origin.starts_with("$SYS")
        && (kept || incoming.is_some() || will_of.is_some() || targets.iter().any(lasting));
    if !logged {
        return (None, targets);
    }
    let chosen: Vec<Arc<str>> = targets[direct..]
        .iter()
        .map(|(s, _)| s.client_id.clone())
        .collect();
    let (queued, rest): (Vec<Target>, Vec<Target>) = targets.into_iter().partition(lasting);
    for (s, _) in &queued {
        if crate::router::may_wait(s, message) {
            s.wait_room().await;
        }
    }
    let record = Record::Message {
        message: message.clone(),
        chosen: chosen.clone(),
        incoming: incoming.clone(),
        will_of: will_of.clone(),
    };
    let (state, m) = (shared.clone(), message.clone());
    let retaining = kept.then(|| shared.router.retaining());
    let then = Box::new(move |lsn| {
        if kept {
            state.router.retain(&m, lsn);
        }
        drop(retaining);
        // Subscriptions logged since it was planned (a session taken over, its records
        // logged meanwhile): planned again, as a replay of the journal (and the standby
        // copy) plans it, else the copy queues what the session here never gets.
        let queued = match state.router.changes() == changes {
            true => queued,
            false => (state.router).lasting_targets(&m, state.db.as_ref(), &chosen),
        };
        for (s, mut d) in queued {
            d.lsn = lsn;
            // One it took from another node already: logged as done here.
            if !s.push_routed(d) {
                crate::connection::log_done(&state, &s.client_id, vec![lsn]);
            }
        }
        if let Some((c, pkid)) = incoming
            && let Some(s) = state.router.session(&c)
        {
            s.state.lock().unlogged_qos2.remove(&pkid);
        }
        if let Some(s) = will_of.and_then(|c| state.router.session(&c)) {
            *s.will.lock() = None;
        }
    });
    (Some(journal::entry(&record, Some(then))), rest)
}

/// Stores `message` in its table, if its topic maps to one, with its `journal` entry in the
/// same group commit (alone when there are no rows); see [`store`].
pub(crate) async fn store_rows(
    shared: &Arc<BrokerState>,
    message: &Arc<Message>,
    user: Option<&str>,
    journal: Option<sluice_engine::Journal>,
) -> (PubAckReason, Option<String>) {
    match try_store(shared, message, user, None, journal).await {
        Ok(_) => (PubAckReason::Success, None),
        Err(Refusal { reason, text, .. }) => Box::pin(refuse(shared, message, reason, text)).await,
    }
}

/// An empty retained PUBLISH clears its topic's retained message: it is no reading, so it
/// is not stored (nor kept as a dead letter) even on a table's topic.
fn clears_retained(message: &Message) -> bool {
    message.retain && message.payload.is_empty()
}

/// Why a message was not stored.
#[derive(Debug)]
pub(crate) struct Refusal {
    pub(crate) reason: PubAckReason,
    pub(crate) text: String,
    /// Trying again later can succeed (see [`sluice_engine::Error::is_transient`]).
    pub(crate) transient: bool,
}

/// Stores `message` in its table, if its topic maps to one, with the bridged message's
/// `origin` and its `journal` entry (logged alone when there are no rows); says whether
/// rows were stored. A refusal is returned, not yet kept (see [`refuse`]); the journal
/// entry is then not logged.
pub(crate) async fn try_store(
    shared: &Arc<BrokerState>,
    message: &Message,
    user: Option<&str>,
    origin: Option<&Origin>,
    journal: Option<sluice_engine::Journal>,
) -> Result<bool, Refusal> {
    let refusal = |reason, text| {
        Err(Refusal {
            reason,
            text,
            transient: false,
        })
    };
    if let Err(e) = shared.db.authorize(user, Need::Publish(&message.topic)) {
        return refusal(PubAckReason::NotAuthorized, e.to_string());
    }
    let alone = |journal: Option<sluice_engine::Journal>| async {
        match journal {
            Some(j) => shared.db.journal(vec![j], true).await.map(|_| false),
            None => Ok(false),
        }
    };
    if clears_retained(message) {
        return alone(journal).await.map_err(refusal_of);
    }
    let Some(t) = shared.mapper.map(
        &message.topic,
        message.properties.as_ref(),
        &message.payload,
    ) else {
        if let Some(s) = sparkplug::target(&shared.config, &message.topic) {
            // Boxed: its future would otherwise size every message's.
            return Box::pin(sparkplug::store(shared, message, user, origin, journal, s)).await;
        }
        return alone(journal).await.map_err(refusal_of);
    };
    let need = Need::Insert {
        database: t.database,
        table: t.table,
    };
    if let Err(e) = shared.db.authorize(user, need) {
        return refusal(PubAckReason::NotAuthorized, e.to_string());
    }
    let auto_create = shared
        .config
        .auto_create_databases
        .iter()
        .any(|d| d == t.database || d == "*");
    let result = shared
        .db
        .publish_journaled(
            Publication {
                database: t.database,
                table: t.table,
                format: t.format,
                payload: &message.payload,
                fixed: &t.fixed,
                auto_create,
                origin,
            },
            journal,
        )
        .await;
    match result {
        Ok(Some(receipt)) => {
            shared
                .metrics
                .rows_stored
                .fetch_add(receipt.rows as u64, Ordering::Relaxed);
            Ok(true)
        }
        Ok(None) => Ok(false),
        Err(e) => Err(refusal_of(e)),
    }
}

/// The refusal an engine error means.
pub(crate) fn refusal_of(e: sluice_engine::Error) -> Refusal {
    Refusal {
        reason: error::store_reason(&e),
        text: e.to_string(),
        transient: e.is_transient(),
    }
}

/// What [`try_store_batch`] did with one message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Batched {
    /// Its rows are durable.
    Stored,
    /// Its topic maps to no table: nothing to store.
    Unmapped,
    /// Not stored here: store it alone ([`try_store`] refuses, creates or retries).
    Alone,
}

/// Stores `messages` (each with its bridged origin) with one log submission; says, for each
/// in order, what became of it. `Err`: the log failed and none of them is stored.
pub(crate) async fn try_store_batch(
    shared: &Arc<BrokerState>,
    messages: &[(Arc<Message>, Option<Origin>)],
    user: Option<&str>,
) -> Result<Vec<Batched>, Refusal> {
    let mut outcome = vec![Batched::Alone; messages.len()];
    // The targets own the values captured from topics, which the publications borrow.
    let mut targets = Vec::with_capacity(messages.len());
    for (i, (m, _)) in messages.iter().enumerate() {
        // A refused message is left to be stored alone, which refuses it with the reason.
        if shared.db.authorize(user, Need::Publish(&m.topic)).is_err() {
            continue;
        }
        if clears_retained(m) {
            outcome[i] = Batched::Unmapped;
            continue;
        }
        let Some(t) = (shared.mapper).map(&m.topic, m.properties.as_ref(), &m.payload) else {
            // Sparkplug messages are decoded and stored one by one.
            if sparkplug::target(&shared.config, &m.topic).is_none() {
                outcome[i] = Batched::Unmapped;
            }
            continue;
        };
        let need = Need::Insert {
            database: t.database,
            table: t.table,
        };
        if shared.db.authorize(user, need).is_ok() {
            targets.push((i, t));
        }
    }
    let slots: Vec<usize> = targets.iter().map(|(i, _)| *i).collect();
    let publications: Vec<Publication> = (targets.iter())
        .map(|(i, t)| Publication {
            database: t.database,
            table: t.table,
            format: t.format,
            payload: &messages[*i].0.payload,
            fixed: &t.fixed,
            auto_create: (shared.config.auto_create_databases.iter())
                .any(|d| d == t.database || d == "*"),
            origin: messages[*i].1.as_ref(),
        })
        .collect();
    if publications.is_empty() {
        return Ok(outcome);
    }
    let receipts = shared
        .db
        .publish_batch(publications)
        .await
        .map_err(refusal_of)?;
    for (i, r) in slots.into_iter().zip(receipts) {
        if let Some(r) = r {
            outcome[i] = Batched::Stored;
            (shared.metrics.rows_stored).fetch_add(r.rows as u64, Ordering::Relaxed);
        }
    }
    Ok(outcome)
}

/// Logs a refused message once and keeps it in the dead letters (a failure to keep it is
/// logged: the publisher is told of the refusal either way).
pub(crate) async fn refuse(
    shared: &BrokerState,
    message: &Message,
    reason: PubAckReason,
    text: String,
) -> (PubAckReason, Option<String>) {
    if let Err(e) = dead_letter(shared, message, reason, &text).await {
        tracing::error!(topic = %message.topic, error = %e, "could not keep a dead letter");
    }
    (reason, Some(text))
}

/// Logs a refused message once and keeps it, durably, in the dead letters.
pub(crate) async fn dead_letter(
    shared: &BrokerState,
    message: &Message,
    reason: PubAckReason,
    text: &str,
) -> sluice_engine::Result<()> {
    let code = error::reason_code(reason);
    let letter = DeadLetter {
        time_micros: sluice_engine::now_micros(),
        client_id: message.origin.to_string(),
        topic: message.topic.to_string(),
        payload: message.payload.to_vec(),
        reason: text.to_string(),
        reason_code: code,
    };
    shared.db.dead_letter(letter).await?;
    // Counted and logged once kept (a bridge retries a letter that could not be written).
    shared.metrics.dead_letters.fetch_add(1, Ordering::Relaxed);
    tracing::warn!(client_id = %message.origin, topic = %message.topic, reason = code, error = %text, "message refused; kept in system.dead_letters");
    Ok(())
}
