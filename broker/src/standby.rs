//! A standby copy of each cluster node's lasting sessions, kept on another node, so that
//! what a node queued for its clients outlives it even when it never comes back.
//!
//! **Shipping** ([`Mirror`]). Every journal record a node commits (sessions, subscriptions,
//! messages queued for lasting sessions, what was sent and acknowledged) also goes, in log
//! order, to one other node: its buddy, the next node by id that answers. A task of its own
//! sends them in batches, one call in flight (never behind relayed messages, whose own
//! handling may wait for a journal: two nodes' journals waiting on each other would never
//! move), numbered per run of the node, and a journal write returns only once its records
//! reached the buddy: no message the node acknowledged, and no packet id it sent to a
//! client, is missing from the copy. The buddy applies the records to a router of its own
//! for that node ([`Shadow`]), as the node itself would on a restart. A copy that misses a
//! record (the buddy restarted, the node started again or chose another buddy) asks the
//! node for its whole state as of a checkpoint (the snapshot it saves to disk), then
//! applies the records after it; until then it answers that it is not whole, and the node
//! sends the batch again (its journal writes wait meanwhile). A buddy that does not answer
//! within [`SHIP_TIMEOUT`], or is not whole within [`WHOLE_WAIT`], is passed over for
//! [`PASS_OVER`]: the next node keeps the copy.
//!
//! **Use** ([`take`]). A client whose node does not answer connects to another node with
//! clean start off: that node asks the others (and itself) for their copy of the session,
//! and the most recent copy is given (and forgotten where it was) as a hand-over would be:
//! queued messages, messages in flight with their packet ids, pending PUBRELs. The session
//! keeps the LSN of the journal the copy held ([`note`], [`crate::journal::Record::Standby`]):
//! should that node come back, it gives only what it logged after
//! (`crate::takeover::give_back`).

use crate::BrokerState;
use crate::journal::Record;
use crate::router::Router;
use crate::session::Session;
use bytes::{Buf, BufMut, Bytes};
use futures::future::BoxFuture;
use parking_lot::Mutex;
use sluice_engine::Relay;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use tokio::sync::{mpsc, watch};

#[cfg(test)]
mod tests;

/// Calls ([`sluice_engine::Relay::standby_call`]): a node's whole state, for its buddy.
const SNAPSHOT: u8 = 1;
/// ... a session of a node's copy, for the node its client went to.
const TAKE: u8 = 2;
/// ... records a node ships to its buddy.
const SHIP: u8 = 3;

/// ... a node's copy of a session was taken: the others forget theirs.
const FORGET: u8 = 4;

/// How long a buddy has to answer a batch of records.
const SHIP_TIMEOUT: std::time::Duration = std::time::Duration::from_millis(600);
/// How long a buddy may take to make its copy whole (it asks the node for its state) before
/// it is passed over; its answers say it is not whole yet meanwhile.
const WHOLE_WAIT: std::time::Duration = std::time::Duration::from_secs(10);
/// How long a buddy that did not take a batch in time is passed over.
const PASS_OVER: std::time::Duration = std::time::Duration::from_secs(5);
/// How long a connecting client waits for a node's copy of its session.
const TAKE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(1);
/// Bytes of records per batch, at most (one record at least).
const MAX_BATCH: usize = 4 << 20;

/// Records waiting for a snapshot, at most (beyond, the oldest go: the copy asks again).
const MAX_WAITING: usize = 1 << 20;

/// What a broker keeps of the standby copies: its own shipping, and its copies of others.
#[derive(Default)]
pub(crate) struct Standby {
    pub(crate) mirror: OnceLock<Arc<Mirror>>,
    shadows: Mutex<HashMap<u64, Shadow>>,
    /// Sessions resumed here from a copy.
    taken: AtomicU64,
}

impl Standby {
    /// Its figures for `/metrics` (Prometheus text), in a cluster.
    pub(crate) fn render(&self) -> String {
        let Some(m) = self.mirror.get() else {
            return String::new();
        };
        let whole = (self.shadows.lock().values())
            .filter(|s| s.copy.is_some())
            .count();
        let mut out = String::new();
        let values = [
            (
                "sluice_standby_records_shipped_total",
                "Journal records a buddy node took for its standby copy of this node's sessions",
                m.taken.load(Ordering::Relaxed),
            ),
            (
                "sluice_standby_passed_over_total",
                "Times this node's buddy did not take its journal records in time (another node keeps the copy)",
                m.passed_over.load(Ordering::Relaxed),
            ),
            (
                "sluice_standby_copies_whole",
                "Other nodes whose standby copy here is whole",
                whole as u64,
            ),
            (
                "sluice_standby_sessions_taken_total",
                "Sessions resumed here from a standby copy (their node did not answer)",
                self.taken.load(Ordering::Relaxed),
            ),
        ];
        crate::metrics::render_values(&mut out, values);
        out
    }
}

/// Ships this node's journal records to its buddy (see the module docs).
pub(crate) struct Mirror {
    relay: Arc<dyn Relay>,
    /// This run of the node: a copy of an earlier run starts over.
    run: u64,
    /// Records shipped so far (numbered as the log applies them, so in LSN order).
    seq: AtomicU64,
    /// The records to ship, encoded, with their LSNs, in order.
    queue: mpsc::UnboundedSender<(u64, Vec<u8>)>,
    /// The LSN of the last record the buddy took (or that no node could take).
    shipped: watch::Sender<u64>,
    /// Records a buddy took; batches a buddy did not take in time.
    taken: AtomicU64,
    passed_over: AtomicU64,
}

impl Mirror {
    /// Ships this node's journal through `relay` once [`Mirror::start`]ed.
    pub(crate) fn new(relay: Arc<dyn Relay>) -> (Arc<Self>, Shipping) {
        let (queue, rx) = mpsc::unbounded_channel();
        let m = Arc::new(Self {
            relay,
            run: sluice_engine::now_micros() as u64,
            seq: AtomicU64::new(0),
            queue,
            shipped: watch::channel(0).0,
            taken: AtomicU64::new(0),
            passed_over: AtomicU64::new(0),
        });
        (m, Shipping(rx))
    }

    /// Starts shipping (once this node answers for its state: [`Standby::mirror`] is set);
    /// its buddy learns at once that this run started, and asks for its state.
    pub(crate) fn start(self: &Arc<Self>, shipping: Shipping) {
        self.push(0, 0, &[]);
        tokio::spawn(ship(Arc::downgrade(self), shipping.0));
    }

    /// Queues record number `seq` (`bytes`, at `lsn`) for the buddy.
    fn push(&self, seq: u64, lsn: u64, bytes: &[u8]) {
        let _ = self.queue.send((lsn, frame(seq, lsn, bytes)));
    }

    /// The node that keeps the copy now: the next node by id that answers and was not
    /// passed over.
    fn buddy(&self, passed: &HashMap<u64, tokio::time::Instant>) -> Option<u64> {
        let me = self.relay.node();
        let mut peers = self.relay.peers();
        peers.sort_unstable();
        let (before, after): (Vec<u64>, Vec<u64>) = peers.into_iter().partition(|p| *p < me);
        let now = tokio::time::Instant::now();
        (after.into_iter().chain(before))
            .find(|p| self.relay.answers(*p) && passed.get(p).is_none_or(|t| now >= *t))
    }
}

/// The records to ship, for [`Mirror::start`].
pub(crate) struct Shipping(mpsc::UnboundedReceiver<(u64, Vec<u8>)>);

/// Record number `seq` (`bytes`, at `lsn`) as a [`SHIP`] call carries it.
fn frame(seq: u64, lsn: u64, bytes: &[u8]) -> Vec<u8> {
    let mut frame = Vec::with_capacity(20 + bytes.len());
    frame.put_u64_le(seq);
    frame.put_u64_le(lsn);
    frame.put_u32_le(bytes.len() as u32);
    frame.extend_from_slice(bytes);
    frame
}

/// The shipping task: batches of the queued records, one call at a time, to the buddy.
async fn ship(mirror: std::sync::Weak<Mirror>, mut rx: mpsc::UnboundedReceiver<(u64, Vec<u8>)>) {
    let mut passed: HashMap<u64, tokio::time::Instant> = HashMap::new();
    let mut was = None;
    let mut next = None;
    loop {
        let first = match next.take() {
            Some(f) => f,
            None => match rx.recv().await {
                Some(f) => f,
                None => return,
            },
        };
        let Some(m) = mirror.upgrade() else {
            return;
        };
        let (mut lsn, mut body, mut n) = (first.0, vec![SHIP], 1);
        body.put_u64_le(m.relay.node());
        body.put_u64_le(m.run);
        body.extend_from_slice(&first.1);
        while body.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok((l, f)) if body.len() + f.len() <= MAX_BATCH => {
                    (lsn, n) = (l, n + 1);
                    body.extend_from_slice(&f);
                }
                Ok(r) => {
                    next = Some(r);
                    break;
                }
                Err(_) => break,
            }
        }
        let body = Bytes::from(body);
        // Until a buddy's whole copy takes it (or none answers: nothing keeps a copy).
        'buddies: while let Some(to) = m.buddy(&passed) {
            if was != Some(to) {
                tracing::info!(
                    buddy = to,
                    "the standby copy of this node's sessions is kept on node {to}"
                );
                was = Some(to);
            }
            let whole_by = tokio::time::Instant::now() + WHOLE_WAIT;
            loop {
                let call = m.relay.standby_call(to, body.clone());
                match tokio::time::timeout(SHIP_TIMEOUT, call).await {
                    Ok(Some(a)) if a.first() == Some(&1) => {
                        m.taken.fetch_add(n, Ordering::Relaxed);
                        break 'buddies;
                    }
                    // Its copy waits for this node's state: sent again until whole.
                    Ok(Some(_)) if tokio::time::Instant::now() < whole_by => {
                        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                    }
                    _ => break,
                }
            }
            m.passed_over.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(
                buddy = to,
                "the standby copy's node did not take this node's journal records in time; passed over"
            );
            passed.insert(to, tokio::time::Instant::now() + PASS_OVER);
        }
        m.shipped.send_replace(lsn);
    }
}

impl sluice_engine::JournalTap for Mirror {
    fn record(&self, lsn: u64, bytes: &[u8]) {
        let seq = self.seq.fetch_add(1, Ordering::AcqRel) + 1;
        self.push(seq, lsn, bytes);
    }

    fn shipped(&self, lsn: u64) -> BoxFuture<'static, ()> {
        let mut rx = self.shipped.subscribe();
        Box::pin(async move {
            let _ = rx.wait_for(|v| *v >= lsn).await;
        })
    }
}

/// One record as shipped.
struct Shipped {
    run: u64,
    seq: u64,
    lsn: u64,
    record: Bytes,
}

impl Shipped {
    /// The records of a [`SHIP`] call's body (after its kind): the node, and its records.
    fn decode(mut b: Bytes) -> Option<(u64, Vec<Self>)> {
        if b.len() < 16 {
            return None;
        }
        let (from, run) = (b.get_u64_le(), b.get_u64_le());
        let mut out = Vec::new();
        while !b.is_empty() {
            if b.len() < 20 {
                return None;
            }
            let (seq, lsn, len) = (b.get_u64_le(), b.get_u64_le(), b.get_u32_le() as usize);
            if b.len() < len {
                return None;
            }
            let record = b.split_to(len);
            out.push(Self {
                run,
                seq,
                lsn,
                record,
            });
        }
        Some((from, out))
    }
}

/// This node's copy of another node's sessions.
struct Shadow {
    run: u64,
    /// Complete up to its record `seq` (`None` while it waits for the node's state).
    copy: Option<Copy>,
    /// Records that came since the copy broke, for after the node's state.
    waiting: Vec<Shipped>,
    /// The node's state is being asked for.
    asking: bool,
}

struct Copy {
    router: Router,
    seq: u64,
    /// The LSN (the node's) of the last record applied.
    lsn: u64,
}

impl Copy {
    /// Applies the next record; false when it does not decode (the copy is no longer whole).
    fn apply(&mut self, f: Shipped, auth: &dyn sluice_engine::Logins) -> bool {
        self.seq = f.seq;
        if f.record.is_empty() {
            return true;
        }
        let Some(r) = Record::decode(&f.record) else {
            return false;
        };
        self.router.replay(f.lsn, r, auth);
        self.lsn = f.lsn;
        true
    }
}

impl Shadow {
    fn new(run: u64) -> Self {
        Self {
            run,
            copy: None,
            waiting: Vec::new(),
            asking: false,
        }
    }

    fn take(&mut self, from: u64, f: Shipped, auth: &dyn sluice_engine::Logins) {
        match &mut self.copy {
            // Sent again.
            Some(c) if f.seq <= c.seq => {}
            Some(c) if f.seq == c.seq + 1 => {
                if !c.apply(f, auth) {
                    tracing::warn!(
                        from,
                        "a shipped journal record that does not decode; the standby copy starts over"
                    );
                    self.copy = None;
                }
            }
            _ => {
                if self.copy.take().is_some() {
                    tracing::info!(
                        from,
                        "the standby copy missed records; asking the node for its state"
                    );
                }
                // A batch sent again while waiting.
                if self.waiting.last().is_some_and(|w| f.seq <= w.seq) {
                    return;
                }
                if self.waiting.len() >= MAX_WAITING {
                    self.waiting.clear();
                }
                self.waiting.push(f);
            }
        }
    }
}

/// Records node `from` shipped here, in order; whether its copy is whole now.
fn receive(shared: &Arc<BrokerState>, from: u64, records: Vec<Shipped>) -> bool {
    let mut ask = false;
    let whole = {
        let mut all = shared.standby.shadows.lock();
        for f in records {
            let s = all.entry(from).or_insert_with(|| Shadow::new(f.run));
            if s.run != f.run {
                // The node started again: its journal says what it holds now.
                *s = Shadow::new(f.run);
            }
            s.take(from, f, shared.db.as_ref());
            if s.copy.is_none() && !std::mem::replace(&mut s.asking, true) {
                ask = true;
            }
        }
        all.get(&from).is_some_and(|s| s.copy.is_some())
    };
    if ask {
        tokio::spawn(fetch(shared.clone(), from));
    }
    whole
}

/// Asks node `from` for its state and makes the copy whole with it (a few tries).
async fn fetch(shared: Arc<BrokerState>, from: u64) {
    let Some(relay) = shared.db.relay() else {
        return;
    };
    for attempt in 0..3 {
        if attempt > 0 {
            tokio::select! {
                _ = shared.shutdown.cancelled() => return,
                _ = tokio::time::sleep(std::time::Duration::from_secs(1)) => {}
            }
        }
        let Some(mut answer) = relay
            .standby_call(from, Bytes::from_static(&[SNAPSHOT]))
            .await
        else {
            continue;
        };
        if answer.len() < 16 {
            continue;
        }
        let (run, seq) = (answer.get_u64_le(), answer.get_u64_le());
        let state: crate::persist::State = match serde_json::from_slice(&answer) {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(from, error = %e, "a node's state for its standby copy does not decode");
                continue;
            }
        };
        let router = Router::new(shared.config.max_queued_messages, None);
        let Ok(lsn) = crate::persist::restore(&router, state) else {
            continue;
        };
        let mut all = shared.standby.shadows.lock();
        let Some(s) = all.get_mut(&from).filter(|s| s.run == run) else {
            // It started again meanwhile: its new run's records ask again.
            return;
        };
        if s.copy.is_some() {
            // Another fetch made it whole.
            return;
        }
        let mut copy = Copy { router, seq, lsn };
        let whole = std::mem::take(&mut s.waiting)
            .into_iter()
            .filter(|f| f.seq > seq)
            .all(|f| {
                f.seq <= copy.seq || (f.seq == copy.seq + 1 && copy.apply(f, shared.db.as_ref()))
            });
        if whole {
            tracing::info!(
                from,
                seq,
                "standby copy of another node's sessions in place"
            );
            s.copy = Some(copy);
            s.asking = false;
            return;
        }
    }
    if let Some(s) = shared.standby.shadows.lock().get_mut(&from) {
        s.asking = false;
    }
}

/// Answers another node's standby call.
pub(crate) async fn serve(shared: Arc<BrokerState>, mut call: Bytes) -> Result<Vec<u8>, String> {
    let kind = call.first().copied();
    if kind.is_some() {
        call.advance(1);
    }
    match kind {
        Some(SHIP) => {
            let (from, records) = Shipped::decode(call).ok_or("shipped records cut short")?;
            Ok(vec![u8::from(receive(&shared, from, records))])
        }
        // Copied under the log's lock, encoded off the runtime's threads.
        Some(SNAPSHOT) => tokio::task::spawn_blocking(move || snapshot(&shared))
            .await
            .map_err(|e| e.to_string())?,
        Some(TAKE) => {
            let (node, client) = read_session(&mut call)?;
            give(&shared, node, client)
        }
        Some(FORGET) => {
            let (node, client) = read_session(&mut call)?;
            forget(&shared, node, client);
            Ok(Vec::new())
        }
        k => Err(format!(
            "a standby call of a kind this node does not know: {k:?}"
        )),
    }
}

/// A [`TAKE`] or [`FORGET`] call about node `node`'s session `client`.
fn session_call(kind: u8, node: u64, client: &str) -> Bytes {
    let mut call = vec![kind];
    call.put_u64_le(node);
    call.extend_from_slice(client.as_bytes());
    call.into()
}

/// The node and client of a [`session_call`] (after its kind).
fn read_session(call: &mut Bytes) -> Result<(u64, &str), String> {
    if call.len() < 8 {
        return Err(format!(
            "a standby call of {} bytes, too short",
            call.len() + 1
        ));
    }
    let node = call.get_u64_le();
    let client =
        std::str::from_utf8(call).map_err(|e| format!("a standby call's client id: {e}"))?;
    Ok((node, client))
}

/// The nodes other than `node` that answer.
fn others(relay: &dyn Relay, node: u64) -> impl Iterator<Item = u64> + '_ {
    (relay.peers().into_iter()).filter(move |p| *p != node && relay.answers(*p))
}

/// This node's state as of a checkpoint, and the number of the last record shipped then.
fn snapshot(shared: &BrokerState) -> Result<Vec<u8>, String> {
    let mirror = (shared.standby.mirror.get()).ok_or("this node ships no journal")?;
    let mut seq = 0;
    let (_, state) = crate::persist::capture(&shared.router, shared.db.as_ref(), None, &mut || {
        seq = mirror.seq.load(Ordering::Acquire);
    })
    .ok_or("no checkpoint")?;
    let mut out = Vec::new();
    out.put_u64_le(mirror.run);
    out.put_u64_le(seq);
    serde_json::to_writer(&mut out, &state).map_err(|e| e.to_string())?;
    Ok(out)
}

/// This node's copy of node `node`'s session `client`: the node's run, the number of the
/// copy's last record, the LSN it held, and the session's records.
fn give(shared: &BrokerState, node: u64, client: &str) -> Result<Vec<u8>, String> {
    let all = shared.standby.shadows.lock();
    let shadow = all.get(&node);
    let copy = (shadow.and_then(|s| s.copy.as_ref()))
        .ok_or_else(|| format!("no whole copy of node {node} here"))?;
    let session = (copy.router.session(client).filter(|s| s.lasting()))
        .ok_or_else(|| format!("no lasting session of {client:?} in the copy of node {node}"))?;
    let held = crate::takeover::export(&session);
    let mut out = Vec::with_capacity(24 + held.len());
    out.put_u64_le(shadow.map_or(0, |s| s.run));
    out.put_u64_le(copy.seq);
    out.put_u64_le(copy.lsn);
    out.extend_from_slice(&held);
    Ok(out)
}

/// On the node a client connects to, its session's node not answering: the most recent
/// standby copy of that session (on `node`'s buddy, or one it had), among the nodes that
/// answer within [`TAKE_TIMEOUT`]: what it held (records, as a hand-over's) and the LSN of
/// `node`'s journal it held. Once it is logged here, [`forgotten`] drops the copies.
pub(crate) async fn take(shared: &BrokerState, node: u64, client: &str) -> Option<(Bytes, u64)> {
    let relay = shared.db.relay()?;
    let call = session_call(TAKE, node, client);
    let asked: Vec<u64> = others(relay.as_ref(), node).collect();
    // A node that does not answer within [`TAKE_TIMEOUT`] is not waited for.
    let calls = asked.into_iter().map(|p| {
        let call = relay.standby_call(p, call.clone());
        async move {
            tokio::time::timeout(TAKE_TIMEOUT, call)
                .await
                .ok()
                .flatten()
        }
    });
    let mut answers: Vec<Bytes> = futures::future::join_all(calls)
        .await
        .into_iter()
        .flatten()
        .collect();
    answers.extend(give(shared, node, client).ok().map(Bytes::from));
    // The most recent: of the node's latest run, the furthest.
    let (run, seq, lsn, held) = (answers.into_iter())
        .filter(|a| a.len() >= 24)
        .map(|mut a| (a.get_u64_le(), a.get_u64_le(), a.get_u64_le(), a))
        .max_by_key(|(run, seq, ..)| (*run, *seq))?;
    shared.standby.taken.fetch_add(1, Ordering::Relaxed);
    tracing::info!(
        client,
        node,
        run,
        seq,
        lsn,
        "took a session from the standby copy of its node"
    );
    Some((held, lsn))
}

/// `session` took what node `node`'s copy held, up to `lsn` of that node's journal.
pub(crate) fn note(session: &Session, node: u64, lsn: u64) {
    let mut cuts = session.standby.lock();
    match cuts.iter_mut().find(|(n, _)| *n == node) {
        Some(c) => c.1 = c.1.max(lsn),
        None => cuts.push((node, lsn)),
    }
}

/// This node's copy of node `node`'s session `client` is dropped.
fn forget(shared: &BrokerState, node: u64, client: &str) {
    let all = shared.standby.shadows.lock();
    if let Some(c) = all.get(&node).and_then(|s| s.copy.as_ref()) {
        c.router.forget(client);
    }
}

/// The session `client` taken from a copy of node `node`'s is logged here: every node drops
/// its copy of it (one that does not hear of it keeps a copy no node asks for: node `node`,
/// should it come back, starts its copies over).
pub(crate) fn forgotten(shared: &BrokerState, node: u64, client: &str) {
    forget(shared, node, client);
    let Some(relay) = shared.db.relay() else {
        return;
    };
    let call = session_call(FORGET, node, client);
    for p in others(relay.as_ref(), node) {
        tokio::spawn(relay.standby_call(p, call.clone()));
    }
}
