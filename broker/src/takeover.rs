//! A client's session moving between a cluster's nodes. When a client connects, the node
//! it reaches asks the others to end any session of its client id (their connection gets
//! DISCONNECT 0x8E, session taken over); unless the client starts clean, a node that had a
//! lasting session hands over what it held: its subscriptions and the messages queued or
//! in flight, as journal records (`Subscribe`, `Queued`). The new node logs them for its
//! session, applying each as it is logged (as a replay would), before its CONNACK, which
//! then says the session is present. A message the old node had sent but not seen
//! acknowledged is sent again from the new node.
//!
//! A node that is down cannot hand over. So each node shares the subscriptions of its
//! lasting sessions with the others (`Relay::set_session`): a client that comes back on
//! another node while its node is down gets its subscriptions there, and what is published
//! from then on. When its old node is back, that node gives what its copy held (queued
//! before it died, or relayed to it while it was down) to the node the client went to, and
//! ends the copy after a grace period ([`give_back`]). A session taken from the standby
//! copy of a node that is down does not wait for that: what the nodes that answer still
//! queue for that node comes along at once ([`pull`]).

use crate::BrokerState;
use crate::journal::{self, Record};
use crate::session::MessageId;
use crate::session::{Message, Outgoing, Session};
use bytes::{Buf, Bytes};
use parking_lot::Mutex;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::Ordering;

/// What the other nodes handed over to a connecting client's session.
#[derive(Default)]
pub(crate) struct Handed {
    /// The session's records: from its node, else from that node's standby copy, else the
    /// subscriptions it shared.
    records: Vec<Record>,
    /// The node whose standby copy they came from (it does not answer), if they did.
    from_copy: Option<u64>,
    /// What restarted nodes' withdrawn copies of the session held (the client had left
    /// them): their messages join after the session's own.
    withdrawn: Vec<Record>,
}

impl Handed {
    pub(crate) fn is_empty(&self) -> bool {
        self.records.is_empty() && self.withdrawn.is_empty()
    }
}

/// On the node a client connects to: the other nodes end their session of `client` and,
/// unless `clean`, hand over what it held; returns those records.
pub(crate) async fn take_over(shared: &BrokerState, client: &Arc<str>, clean: bool) -> Handed {
    let mut handed = Handed::default();
    let Some(relay) = shared.db.relay() else {
        return handed;
    };
    for b in relay.take_session(client, clean).await {
        match records(b, client) {
            // A copy the client had left: where it went holds the session.
            r if matches!(r.first(), Some(Record::Withdrawn { .. })) => {
                handed.withdrawn.extend(r.into_iter().skip(1));
            }
            r => handed.records.extend(r),
        }
    }
    // Its node did not answer (it is down): what the standby copy of it held, else the
    // subscriptions it shared.
    if handed.records.is_empty()
        && !clean
        && let Some((node, _, b)) = relay.session_elsewhere(client)
    {
        // Copies are kept where this node keeps one of its own (`[cluster] standby_copy`).
        let copied = match shared.standby.mirror.get() {
            Some(_) => crate::standby::take(shared, node, client).await,
            None => None,
        };
        match copied {
            Some((held, lsn)) => {
                handed.from_copy = Some(node);
                // First: the subscriptions' share then tells that node what came here.
                handed.records.push(Record::Standby {
                    client: client.clone(),
                    node,
                    lsn,
                });
                handed.records.extend(records(held, client));
            }
            None => {
                tracing::info!(%client, node, "session's node does not answer; its subscriptions resume here");
                handed.records.extend(records(b, client));
            }
        }
    }
    handed
}

/// The records of a hand-over that belong to `client`, and only those one carries.
fn records(mut b: Bytes, client: &Arc<str>) -> Vec<Record> {
    let mut out = Vec::new();
    while b.len() >= 4 {
        let len = b.get_u32_le() as usize;
        if b.len() < len {
            break;
        }
        match Record::decode(&b.split_to(len)) {
            Some(
                r @ (Record::Subscribe { .. }
                | Record::Queued { .. }
                | Record::Releasing { .. }
                | Record::Standby { .. }
                | Record::Pulled { .. }
                | Record::Withdrawn { .. }),
            ) if record_client(&r) == Some(client) => out.push(r),
            _ => {
                tracing::warn!(%client, "a handed-over session record that does not decode; skipped")
            }
        }
    }
    out
}

fn record_client(r: &Record) -> Option<&Arc<str>> {
    match r {
        Record::Subscribe { client, .. }
        | Record::Queued { client, .. }
        | Record::Releasing { client, .. }
        | Record::Standby { client, .. }
        | Record::Pulled { client, .. }
        | Record::Withdrawn { client } => Some(client),
        _ => None,
    }
}

/// A connecting client's session takes what other nodes handed over ([`take_over`]): when
/// it came from a standby copy just now, also what the nodes kept for that node ([`pull`]).
/// (A session handed over by a live node carries the `Standby` records of copies it took
/// earlier: those nodes may answer again, and what they took since is no longer theirs.)
pub(crate) async fn resume(
    shared: &Arc<BrokerState>,
    session: &Arc<Session>,
    handed: Handed,
) -> sluice_engine::Result<()> {
    let Handed {
        mut records,
        from_copy,
        mut withdrawn,
    } = handed;
    // No node had more than a copy the client had left: that is the session. Else only
    // its messages join (the client may have changed its subscriptions since).
    match records.is_empty() {
        true => records = std::mem::take(&mut withdrawn),
        false => withdrawn.retain(|r| {
            matches!(
                r,
                Record::Queued { .. } | Record::Releasing { .. } | Record::Pulled { .. }
            )
        }),
    }
    import(shared, records, false).await?;
    if let Some(node) = from_copy {
        pull(shared, session, node).await;
    }
    // After what the session took from its node, its copy and the others' queues (the
    // messages it took are known by then, [`import`] leaves them out).
    if !withdrawn.is_empty() {
        tracing::info!(client = %session.client_id, records = withdrawn.len(), "a copy the client had left answered; its messages join after the session's");
        import(shared, withdrawn, false).await?;
    }
    Ok(())
}

/// Logs `records` (handed over from another node; `pulled`: the [`pull`]ed messages) for
/// this node's session, each applied to the router as it is logged; a message already
/// routed to the session here is left out (a copy the other node kept while the client was
/// here: [`crate::session::State::routed_here`]).
pub(crate) async fn import(
    shared: &Arc<BrokerState>,
    records: Vec<Record>,
    pulled: bool,
) -> sluice_engine::Result<()> {
    let n = records.len();
    // What the session here holds already: a copy of it routed here before the session
    // was withdrawn (its client came back before the node it went to gave it back).
    let client = records.iter().find_map(record_client).cloned();
    let session = client.as_ref().and_then(|c| shared.router.session(c));
    let (records, mark) = match &session {
        Some(s) => {
            let received = (shared.router.remote())
                .map(|r| r.received_now())
                .unwrap_or_default();
            let st = s.state.lock();
            let (flying, queued) = st.held_split();
            // One queued here that the other node had sent under a packet id: that one is
            // kept (its client may hold the id), and the one queued here goes.
            let copy = |m: &Message, sent: &Option<u16>| match m.id.get() {
                Some(id) if queued.contains(id) && sent.is_some() => false,
                // Or one it took from another node already (a copy that node gives back).
                Some(id)
                    if flying.contains(id)
                        || queued.contains(id)
                        || st.was_imported(id)
                        || st.was_pulled(m) =>
                {
                    true
                }
                _ => st.routed_here(m, &received),
            };
            let records: Vec<Record> = (records.into_iter())
                .filter(
                    |r| !matches!(r, Record::Queued { message, sent, .. } if copy(message, sent)),
                )
                .collect();
            let mark = Mark {
                session: s.clone(),
                flying,
                pushed: st.pushed,
            };
            (records, Some(Arc::new(mark)))
        }
        None => (records, None),
    };
    if records.len() < n {
        let copies = n - records.len();
        tracing::info!(
            copies,
            "messages handed over that were delivered here already; left out"
        );
    }
    let took: Vec<(u64, Arc<str>)> = (records.iter())
        .filter_map(|r| match r {
            Record::Standby { client, node, .. } => Some((*node, client.clone())),
            _ => None,
        })
        .collect();
    // Until its subscriptions are in place, what is routed to it here is noted as come.
    if !pulled && let (Some(s), Some(r)) = (&session, shared.router.remote()) {
        s.install_pending(r.installed());
    }
    let skipped: Arc<Mutex<Vec<u64>>> = Arc::default();
    let entries = records
        .into_iter()
        .map(|r| {
            let (state, record) = (shared.clone(), r.clone());
            let (mark, skipped) = (mark.clone(), skipped.clone());
            let then: sluice_engine::Then = Box::new(move |lsn| {
                if let Some(mark) = mark {
                    let mut skipped = skipped.lock();
                    if !applies(&state, &mark, &record, &mut skipped) {
                        skipped.push(lsn);
                        return;
                    }
                }
                let id = match &record {
                    Record::Queued {
                        client, message, ..
                    } => message.id.get().map(|id| (client.clone(), *id)),
                    _ => None,
                };
                match record {
                    r @ Record::Queued { .. } if pulled => state.router.replay_queued(lsn, r, true),
                    r => state.router.replay(lsn, r, state.db.as_ref()),
                }
                if let Some((client, id)) = id
                    && let Some(s) = state.router.session(&client)
                {
                    s.state.lock().note_imported(id);
                }
            });
            journal::entry(&r, Some(then))
        })
        .collect();
    let logged = shared.db.journal(entries, true).await;
    // Its subscriptions are in place (or the records were not logged): what reaches it
    // here from now on.
    if !pulled && let (Some(s), Some(r)) = (&session, shared.router.remote()) {
        s.install(r.installed());
    }
    logged?;
    let skipped = std::mem::take(&mut *skipped.lock());
    if let (Some(c), false) = (&client, skipped.is_empty()) {
        tracing::info!(
            skipped = skipped.len(),
            "messages handed over that reached the session here while they were logged; left out"
        );
        // Logged as done: a replay leaves them out too.
        crate::connection::log_done(shared, c, skipped);
    }
    // What came from standby copies is here now: they are dropped.
    for (node, client) in took {
        crate::standby::forgotten(shared, node, &client);
    }
    Ok(())
}

/// What an import's session held when its records were chosen: the messages in flight,
/// and how many deliveries had been queued.
struct Mark {
    session: Arc<Session>,
    flying: HashSet<MessageId>,
    pushed: u64,
}

/// Whether a handed-over `record` is applied as it is logged: not a message that reached
/// the session here since its records were chosen (its own delivery was on its way), unless
/// it waits in the queue here and the other node had sent it under a packet id (then the
/// one queued here goes instead, its LSN added to `gone`).
fn applies(shared: &BrokerState, mark: &Mark, record: &Record, gone: &mut Vec<u64>) -> bool {
    let Record::Queued {
        client,
        message,
        sent,
        ..
    } = record
    else {
        return true;
    };
    let (Some(id), Some(s)) = (message.id.get(), shared.router.session(client)) else {
        return true;
    };
    // Another session of the client meanwhile (it started clean): nothing to tell.
    if !Arc::ptr_eq(&s, &mark.session) {
        return true;
    }
    let mut st = s.state.lock();
    if sent.is_some() {
        let unqueued = st.unqueue(id);
        if !unqueued.is_empty() {
            gone.extend(unqueued);
            return true;
        }
    }
    !(mark.flying.contains(id) || st.came_late(id) || st.holds_since(mark.pushed, id))
}

/// Session `session` came from node `node`'s standby copy (`node` does not answer): what the
/// nodes that answer still keep for `node` and the session subscribes (relayed to it after
/// it died, before they knew the session is here) joins the session here, each message
/// before what came here directly from its node's run since. Else it would wait for `node`
/// to come back, and be lost if it never does. The numbers taken are noted
/// (`State::note_pulled`): when `node` comes back and gives what it received meanwhile,
/// those are left out.
async fn pull(shared: &Arc<BrokerState>, session: &Arc<Session>, node: u64) {
    let Some(relay) = shared.db.relay() else {
        return;
    };
    let filters: Vec<String> = session.state.lock().subscriptions.keys().cloned().collect();
    if filters.is_empty() {
        return;
    }
    let (mut records, mut marks) = (Vec::new(), HashMap::new());
    for b in relay.pull(node, filters).await {
        let Some((message, groups)) = journal::read_relayed(&b) else {
            continue;
        };
        let Some(id) = message.id.get().copied() else {
            continue;
        };
        let mark = marks.entry((id.node, id.run)).or_insert(0);
        *mark = id.seq.max(*mark);
        let serves = crate::router::remote::Groups::Only(&groups);
        let (targets, _) =
            (shared.router).targets_among(&message, shared.db.as_ref(), None, serves);
        for (_, d) in targets.into_iter().filter(|(s, _)| Arc::ptr_eq(s, session)) {
            if d.qos != rumqttc::v5::mqttbytes::QoS::AtMostOnce {
                records.push(Record::Queued {
                    client: session.client_id.clone(),
                    qos: d.qos,
                    retain: d.retain,
                    ids: d.subscription_ids,
                    message: d.message,
                    sent: None,
                });
            }
        }
    }
    let n = records.len();
    let logged = match n {
        0 => Ok(()),
        _ => import(shared, records, true).await,
    };
    match logged {
        Ok(()) => {
            let client = &session.client_id;
            tracing::info!(%client, node, messages = n, "took what the nodes kept for the node a session came from");
            // Kept with the session: in its journal (so in a snapshot and the standby copy)
            // and in what it hands over.
            let marks: Vec<_> = marks.into_iter().collect();
            session.state.lock().note_pulled(node, marks.clone());
            let record = Record::Pulled {
                client: client.clone(),
                node,
                marks,
            };
            let logged = (shared.db).journal(vec![journal::entry(&record, None)], true);
            if let Err(e) = logged.await {
                tracing::warn!(%client, node, error = %e, "what a session pulled not logged");
            }
        }
        Err(e) => {
            tracing::warn!(client = %session.client_id, node, error = %e, "what the nodes kept for a session's node not logged here; it waits for that node");
        }
    }
}

/// On the node that has session `client`: ends it (its connection is told it was taken
/// over) and, unless `clean`, returns what a lasting one held.
pub(crate) async fn hand_over(
    shared: Arc<BrokerState>,
    client: String,
    clean: bool,
) -> Option<Bytes> {
    let session = shared.router.session(&client)?;
    if !clean {
        // The session goes on over there: a will waiting for its delay is not published.
        session.generation.fetch_add(1, Ordering::AcqRel);
    }
    if let Some(r) = shared.router.remote() {
        r.share_will(&session.client_id, None, None, 0);
    }
    if let Some((_, token)) = session.connection.lock().take() {
        token.cancel();
    }
    let lasting = session.lasting();
    let withdrawn = session.withdrawn.load(Ordering::Acquire);
    let held = (!clean && lasting).then(|| match withdrawn {
        true => {
            let marker = Record::Withdrawn {
                client: session.client_id.clone(),
            };
            [framed(std::iter::once(marker)), export(&session)]
                .concat()
                .into()
        }
        false => export(&session),
    });
    shared.router.discard(&session);
    if lasting && shared.db.journals() {
        let record = Record::End {
            client: session.client_id.clone(),
        };
        if let Err(e) = shared
            .db
            .journal(vec![journal::entry(&record, None)], true)
            .await
        {
            tracing::warn!(%client, error = %e, "a session handed over not logged as ended");
        }
    }
    tracing::info!(%client, clean, "session taken over by another node");
    held
}

/// What `session` holds, as records: what it took from standby copies, its
/// subscriptions, then its messages in flight and queued (in that order), each as a u32
/// length and the record.
pub(crate) fn export(session: &Session) -> Bytes {
    let subscriptions = subscriptions(session).unwrap_or_default();
    let (messages, ..) = messages(session, 0);
    [subscriptions, messages].concat().into()
}

/// What a lasting `session` subscribes, as records (`None` when it is not lasting), for
/// the other nodes to keep ([`sluice_engine::Relay::set_session`]); after what it took from
/// other nodes' standby copies of it (for those nodes, should they come back).
pub(crate) fn subscriptions(session: &Session) -> Option<Bytes> {
    if !session.lasting() {
        return None;
    }
    let client = session.client_id.clone();
    let took: Vec<Record> = (session.standby.lock().iter())
        .map(|(node, lsn)| Record::Standby {
            client: client.clone(),
            node: *node,
            lsn: *lsn,
        })
        .collect();
    let st = session.state.lock();
    let pulled = (st.pulled_marks().into_iter()).map(|(node, marks)| Record::Pulled {
        client: client.clone(),
        node,
        marks,
    });
    let all = (st.subscriptions.iter()).map(|(filter, options)| Record::Subscribe {
        client: client.clone(),
        filter: filter.clone(),
        options: options.clone(),
        retained: false,
    });
    Some(framed(took.into_iter().chain(pulled).chain(all)))
}

fn framed(records: impl Iterator<Item = Record>) -> Bytes {
    let mut out = Vec::new();
    for r in records {
        let b = r.encode();
        out.extend_from_slice(&(b.len() as u32).to_le_bytes());
        out.extend_from_slice(&b);
    }
    out.into()
}

/// A session's messages (in flight in the order sent, then queued) as `Queued` records,
/// the ones in flight with the packet ids they were sent under, and the QoS 2 packet ids
/// whose PUBREL is pending (`Releasing`): the node that takes them sends them again under
/// those ids (DUP set), so that its client, which may hold those ids, keeps each once. With
/// the LSNs of all of them. Only those logged here after LSN `after`; the LSNs of those
/// before it come apart (another node took them from this node's standby copy). A message
/// held twice (a journal that logged a copy handed over and its own delivery, both) goes
/// once.
fn messages(session: &Session, after: u64) -> (Bytes, Vec<u64>, Vec<u64>) {
    let st = session.state.lock();
    let mut sent: Vec<(u16, Outgoing)> =
        (st.inflight.iter()).map(|(k, o)| (*k, o.clone())).collect();
    sent.sort_by_key(|(_, o)| o.lsn());
    let queued: Vec<_> = st.queue.iter().map(|d| (None, d.clone())).collect();
    drop(st);
    let client = session.client_id.clone();
    let (mut records, mut lsns, mut published) = (Vec::new(), Vec::new(), Vec::new());
    let mut taken = Vec::new();
    let mut seen = HashSet::new();
    let once = |d: &crate::session::Delivery, seen: &mut HashSet<MessageId>| {
        d.message.id.get().is_none_or(|id| seen.insert(*id))
    };
    for (pkid, o) in sent {
        match o {
            _ if after > 0 && o.lsn() <= after => taken.push(o.lsn()),
            Outgoing::Published(d) if !once(&d, &mut seen) => {}
            Outgoing::Published(d) => published.push((Some(pkid), d)),
            Outgoing::Released(lsn) => {
                let client = client.clone();
                records.push(Record::Releasing { client, pkid });
                lsns.push(lsn);
            }
        }
    }
    let mut rest = Vec::new();
    for (pkid, d) in queued {
        if after > 0 && d.lsn <= after {
            taken.push(d.lsn);
        } else if once(&d, &mut seen) {
            rest.push((pkid, d));
        }
    }
    for (pkid, d) in published.into_iter().chain(rest) {
        lsns.push(d.lsn);
        records.push(Record::Queued {
            client: client.clone(),
            qos: d.qos,
            retain: d.retain,
            ids: d.subscription_ids,
            message: d.message,
            sent: pkid,
        });
    }
    (framed(records.into_iter()), lsns, taken)
}

/// On the node the client went to: what its old node's copy held joins its session here.
pub(crate) async fn take_given(shared: Arc<BrokerState>, client: String, held: Bytes) -> bool {
    let Some(session) = shared.router.session(&client).filter(|s| s.lasting()) else {
        return false;
    };
    let queued: Vec<Record> = records(held, &session.client_id)
        .into_iter()
        .filter(|r| matches!(r, Record::Queued { .. } | Record::Releasing { .. }))
        .collect();
    let n = queued.len();
    match import(&shared, queued, false).await {
        // Handed over to a third node meanwhile: given again there.
        Ok(()) if !shared.router.is_current(&session) => false,
        Ok(()) => {
            tracing::info!(%client, messages = n, "took what the session held on the node it left");
            true
        }
        Err(e) => {
            tracing::warn!(%client, error = %e, "what another node gave not logged");
            false
        }
    }
}

/// The messages at `lsns` of a restored session `s` are the node's that its client went to
/// (given there, or taken from a standby copy): dropped here and logged as done, unless
/// its client came back here meanwhile (and took that node's session, with them: it keeps
/// them here, as that node's copy was left out as held; `attach` bumps the generation
/// before it takes the lock).
async fn done_here(shared: &BrokerState, s: &Session, lsns: Vec<u64>) {
    {
        let mut st = s.state.lock();
        if s.generation.load(Ordering::Acquire) != 0 {
            return;
        }
        st.forget_acked(&lsns);
    }
    let logged = crate::connection::journal_done(shared.db.as_ref(), &s.client_id, lsns);
    if let Err(e) = logged.await {
        tracing::warn!(client = %s.client_id, error = %e, "messages given to another node not logged as done");
    }
}

/// How long a restarted node keeps giving what its lasting sessions receive to the nodes
/// their clients went to (its peers' queues for it arrive meanwhile), before it ends them.
const GRACE: std::time::Duration = std::time::Duration::from_secs(30);

/// After a start: each lasting session restored here whose client went to another node
/// meanwhile gives what it holds to that node, now and then for [`GRACE`], and then ends.
pub(crate) async fn give_back(shared: Arc<BrokerState>) {
    let Some(relay) = shared.db.relay() else {
        return;
    };
    let restored = |s: &Session| {
        // Restored here and not attached since (generation 0), offline, lasting.
        s.generation.load(Ordering::Acquire) == 0 && !s.online() && s.lasting()
    };
    let until = tokio::time::Instant::now() + GRACE;
    let mut moved: Vec<Arc<Session>> = Vec::new();
    loop {
        let done = tokio::time::Instant::now() >= until;
        for s in (shared.router.sessions().into_iter()).filter(|s| restored(s)) {
            let Some((node, false, share)) = relay.session_elsewhere(&s.client_id) else {
                continue;
            };
            if !moved.iter().any(|m| Arc::ptr_eq(m, &s)) {
                // New messages go to the node it went to; what is on its way here follows
                // (unless its client attached here meanwhile).
                if !shared.router.withdraw(&s, restored) {
                    continue;
                }
                moved.push(s.clone());
            }
            // What that node took from this node's standby copy of the session is there.
            let cut = (records(share, &s.client_id).into_iter())
                .find_map(|r| match r {
                    Record::Standby { node, lsn, .. } if node == relay.node() => Some(lsn),
                    _ => None,
                })
                .unwrap_or(0);
            let (held, lsns, taken) = messages(&s, cut);
            // What that node took from the copy is its own now: should the client come
            // back here, it does not get them again from this one.
            if !taken.is_empty() {
                done_here(&shared, &s, taken).await;
            }
            if lsns.is_empty() {
                continue;
            }
            if !relay.give(node, &s.client_id, held).await {
                tracing::info!(client = %s.client_id, node, "could not give what a moved session held; trying again");
                continue;
            }
            tracing::info!(client = %s.client_id, node, messages = lsns.len(), "gave what a moved session held");
            done_here(&shared, &s, lsns).await;
        }
        if done {
            break;
        }
        tokio::select! {
            _ = shared.shutdown.cancelled() => return,
            _ = tokio::time::sleep(std::time::Duration::from_secs(1)) => {}
        }
    }
    for s in moved {
        if restored(&s) && shared.router.discard(&s) {
            let record = Record::End {
                client: s.client_id.clone(),
            };
            let logged = shared.db.journal(vec![journal::entry(&record, None)], true);
            if let Err(e) = logged.await {
                tracing::warn!(client = %s.client_id, error = %e, "a session that moved not logged as ended");
            }
        }
    }
}
