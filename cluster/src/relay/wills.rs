//! Wills across nodes. Each node shares the will of each of its connections (with its
//! delay) with the other nodes, as it shares its routes ([`Change::Will`]), and withdraws it
//! once the will is published or no longer due. When a node stops answering, one other
//! node publishes its clients' wills, each once the node has been silent for the will's
//! delay and at least [`SILENT_FOR`]: the lowest-numbered node that answers (a client that
//! comes back meanwhile, on any node, takes its will back with its session: [`TAKE`]).
//!
//! When the node starts again, its new run replaces what the others kept; the wills of the
//! old run not yet published become orphans, published at their due time by the same
//! rule, unless the restarted node claims them first ([`WILLS`]): it is then told which of
//! its old run's wills went out (so that it does not publish those again from its journal)
//! and gets those that did not, to publish itself. One lock over the kept wills, the
//! orphans and the published ones makes each will go out once, from one node, while the
//! nodes agree on who answers; a node cut off from the others (not dead) may see its
//! clients' wills published while they are still connected to it.

use super::{Change, Relay, RemoteRoutes, WILLS};
use crate::raft::net::Frame;
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use sluice_engine::ClaimedWills;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a node must not answer before another publishes its clients' wills, whatever
/// their delay (a frozen or briefly cut-off node is not taken for dead at once).
pub(super) const SILENT_FOR: Duration = Duration::from_secs(3);
/// How often due wills are looked for.
const TICK: Duration = Duration::from_millis(250);
/// How long a node remembers which wills it published for another node's run.
const REMEMBER: Duration = Duration::from_secs(3600);

/// A will kept for another node's client: its delay (seconds) and the broker's encoding.
pub(super) type Will = (u32, Bytes);

/// A will of a node's ended run: its client, will, and when it is due.
struct Orphan {
    client: String,
    will: Will,
    due: Instant,
}

/// What became of other nodes' wills (behind one lock with [`Relay::remote`]'s wills).
#[derive(Default)]
pub(super) struct Fates {
    orphans: HashMap<u64, Vec<Orphan>>,
    /// Per node: clients whose will this node published, and when.
    published: HashMap<u64, BTreeMap<String, Instant>>,
}

/// The answer to a [`WILLS`] call.
#[derive(Serialize, Deserialize)]
struct Claimed {
    published: Vec<String>,
    pending: Vec<(String, u32, super::serde_bytes_vec::Held)>,
}

impl Fates {
    /// Node `node`'s run ended (a new one is known): its kept wills, silent since
    /// `silent_since`, are orphans.
    pub(super) fn ended(&mut self, node: u64, r: &mut RemoteRoutes, silent_since: Instant) {
        let list = self.orphans.entry(node).or_default();
        for (client, will) in std::mem::take(&mut r.wills) {
            let due = silent_since + Duration::from_secs(u64::from(will.0));
            list.push(Orphan { client, will, due });
        }
    }

    /// `client` connected somewhere: none of its kept wills is due any more.
    fn forget(&mut self, client: &str) {
        for list in self.orphans.values_mut() {
            list.retain(|o| o.client != client);
        }
    }
}

impl Relay {
    /// Publishes, from this node, the wills that are due and whose turn is this node's.
    pub(super) async fn watch_wills(self: Arc<Self>) {
        loop {
            tokio::select! {
                _ = self.cancel.cancelled() => return,
                _ = tokio::time::sleep(TICK) => {}
            }
            let due = self.due_wills(Instant::now());
            let Some(sink) = self.sink.get().cloned() else {
                continue;
            };
            for (node, client, will) in due {
                tracing::info!(node, %client, "a will of a node that does not answer, published here");
                sink.publish_will(node, will).await;
            }
        }
    }

    /// The wills due now that this node publishes, taken out of what is kept.
    fn due_wills(&self, now: Instant) -> Vec<(u64, String, Bytes)> {
        let mut out = Vec::new();
        if self.sink.get().is_none() {
            return out;
        }
        let mut remote = self.remote.lock();
        let mut fates = self.fates.lock();
        let fates = &mut *fates;
        for (node, r) in remote.iter_mut() {
            let known = *self.peer(*node).known.borrow();
            let Some(heard) = known.answered.filter(|_| known.down) else {
                continue;
            };
            if r.wills.is_empty() || !self.publishes_for(*node) {
                continue;
            }
            r.wills.retain(|client, (delay, will)| {
                let wait = SILENT_FOR.max(Duration::from_secs(u64::from(*delay)));
                let due = now >= heard + wait;
                if due {
                    out.push((*node, client.clone(), will.clone()));
                }
                !due
            });
        }
        for (node, list) in fates.orphans.iter_mut() {
            if !self.publishes_for(*node) {
                continue;
            }
            list.retain(|o| {
                let due = now >= o.due;
                if due {
                    out.push((*node, o.client.clone(), o.will.1.clone()));
                }
                !due
            });
        }
        fates.orphans.retain(|_, l| !l.is_empty());
        for (node, client, _) in &out {
            let p = fates.published.entry(*node).or_default();
            p.insert(client.clone(), now);
        }
        for p in fates.published.values_mut() {
            p.retain(|_, at| now.duration_since(*at) < REMEMBER);
        }
        out
    }

    /// Whether this node publishes node `owner`'s wills: the lowest-numbered node that
    /// answers, `owner` aside.
    fn publishes_for(&self, owner: u64) -> bool {
        let me = self.node.id();
        !(self.peer_ids().into_iter())
            .any(|id| id < me && id != owner && !self.peer(id).known.borrow().down)
    }

    /// `client` connected somewhere: its kept wills (from any node) are no longer due.
    pub(super) fn forget_will(&self, client: &str) {
        let mut remote = self.remote.lock();
        for r in remote.values_mut() {
            r.wills.remove(client);
        }
        self.fates.lock().forget(client);
    }

    /// Answers a [`WILLS`] call from node `from`, run `incarnation`: what became of the
    /// wills of its earlier runs.
    pub(super) fn claimed(&self, from: u64, incarnation: u64) -> Result<Vec<u8>, String> {
        let mut remote = self.remote.lock();
        let mut fates = self.fates.lock();
        let mut pending: Vec<(String, Will)> = (fates.orphans.remove(&from).into_iter())
            .flatten()
            .map(|o| (o.client, o.will))
            .collect();
        if let Some(r) = remote.get_mut(&from)
            && r.incarnation != incarnation
        {
            pending.extend(std::mem::take(&mut r.wills));
        }
        let published = fates.published.remove(&from).unwrap_or_default();
        let answer = Claimed {
            published: published.into_keys().collect(),
            pending: (pending.into_iter())
                .map(|(c, (d, w))| (c, d, super::serde_bytes_vec::Held(w)))
                .collect(),
        };
        crate::to_cbor(&answer).map_err(|e| e.to_string())
    }

    /// This node's connection of `client` has `will`, or none.
    pub(super) fn share_will(&self, client: &str, will: Option<Will>) {
        let mut r = self.routes.lock();
        if r.wills.get(client) == will.as_ref() {
            return;
        }
        let (delay, bytes) = will.clone().unwrap_or_default();
        match will {
            Some(w) => r.wills.insert(client.to_string(), w),
            None => r.wills.remove(client),
        };
        r.change(
            Change::Will(client.to_string(), delay, bytes),
            &self.changed,
        );
    }

    /// Asks every node that answers what became of the wills of this node's earlier runs.
    pub(super) async fn claim(self: Arc<Self>) -> ClaimedWills {
        let me = (self.node.id(), self.incarnation);
        let calls = self.peer_ids().into_iter().map(|id| {
            let relay = self.clone();
            async move {
                let frame = Frame::cbor(WILLS, &me, 16).ok()?;
                let b = relay.call(id, frame).await.ok()?;
                crate::from_cbor::<Claimed>(&b).ok()
            }
        });
        let mut out = ClaimedWills::default();
        let mut seen = BTreeSet::new();
        for c in futures::future::join_all(calls).await.into_iter().flatten() {
            out.published.extend(c.published);
            for (client, delay, will) in c.pending {
                if seen.insert(client.clone()) {
                    out.pending.push((client, will.0, delay));
                }
            }
        }
        out.pending.retain(|(c, _, _)| !out.published.contains(c));
        out
    }
}
