//! What the nodes still keep for a node that does not answer, for a session that came from
//! that node's standby copy ([`PULL`]): each node's queue for it (messages relayed after it
//! died, before they knew the session had moved), else they would wait for it to come back.

use super::{Item, PULL, ROUTES_WAIT, Relay};
use crate::raft::net::Frame;
use bytes::{Buf, Bytes};
use futures::future::BoxFuture;
use std::time::Duration;
use tokio::sync::oneshot;

/// How long a node's queue may take to reach the request (its messages queued before are
/// released as their publishers store them: a write waits while a shard of the dead node
/// elects a new leader), and how long a call may take. The session's CONNACK waits for
/// them; a node that does not answer in time keeps its messages for the dead node.
const QUEUE_TIMEOUT: Duration = Duration::from_secs(2);
const PULL_TIMEOUT: Duration = Duration::from_millis(2500);

impl Relay {
    /// This node's queue for `node` (released, not yet taken by it; everything queued
    /// before is released or withdrawn first): the messages whose topic matches `filters`.
    async fn queued_for(&self, node: u64, filters: &[String]) -> Vec<Bytes> {
        let peer = self.peers.lock().get(&node).cloned();
        let Some(peer) = peer.filter(|_| node != self.node.id()) else {
            return Vec::new();
        };
        let (tx, rx) = oneshot::channel();
        if peer.queue.send(Item::Pull(tx)).is_err() {
            return Vec::new();
        }
        match (
            tokio::time::timeout(QUEUE_TIMEOUT, rx).await,
            self.sink.get(),
        ) {
            (Ok(Ok(queued)), Some(sink)) => sink.matching(filters, queued),
            (Err(_), _) => {
                tracing::warn!(
                    node,
                    "the queue for a node that does not answer was not read in time; its messages wait for it"
                );
                Vec::new()
            }
            _ => Vec::new(),
        }
    }

    /// Answers a [`PULL`]: (node, filters) -> the matching messages queued for it here.
    pub(super) async fn serve_pull(&self, body: Bytes) -> Result<Vec<u8>, String> {
        let (node, filters): (u64, Vec<String>) = crate::from_cbor(&body)
            .map_err(|e| format!("a pull (node, filters) that does not decode: {e}"))?;
        Ok(framed(&self.queued_for(node, &filters).await))
    }

    /// [`sluice_engine::Relay::pull`]: from this node and every other that answers, each
    /// asked once it knows this node's routes as they are now (so that what it numbers
    /// after its answer comes here too, if the session subscribes it).
    pub(super) fn pull_from_all(
        &self,
        node: u64,
        filters: Vec<String>,
    ) -> BoxFuture<'static, Vec<Bytes>> {
        let others: Vec<u64> = (self.peer_ids().into_iter())
            .filter(|id| *id != node && self.answering(*id))
            .collect();
        let (me, seq) = (self.me.clone(), *self.changed.borrow());
        Box::pin(async move {
            let Some(me) = me.upgrade() else {
                return Vec::new();
            };
            let calls = others.into_iter().map(|id| {
                let (me, filters) = (me.clone(), &filters);
                async move {
                    let mut known = me.peer(id).known.subscribe();
                    let knows = known.wait_for(|k| k.seq >= seq || k.down);
                    let _ = tokio::time::timeout(ROUTES_WAIT, knows).await;
                    let Ok(frame) = Frame::cbor(PULL, &(node, filters), 64) else {
                        return Vec::new();
                    };
                    match me.node.call(id, frame, PULL_TIMEOUT).await {
                        Ok(b) => unframed(b).unwrap_or_else(|| {
                            tracing::warn!(id, "an answer to a pull that does not decode");
                            Vec::new()
                        }),
                        Err(e) => {
                            tracing::info!(id, error = %e, "a node did not say what it keeps for a node that is down");
                            Vec::new()
                        }
                    }
                }
            });
            let (here, there) = tokio::join!(
                me.queued_for(node, &filters),
                futures::future::join_all(calls)
            );
            there.into_iter().fold(here, |mut all, v| {
                all.extend(v);
                all
            })
        })
    }
}

/// Messages as one body: each a u32 length (little-endian) and its bytes.
fn framed(messages: &[Bytes]) -> Vec<u8> {
    let mut out = Vec::with_capacity(messages.iter().map(|m| 4 + m.len()).sum());
    for m in messages {
        out.extend_from_slice(&(m.len() as u32).to_le_bytes());
        out.extend_from_slice(m);
    }
    out
}

/// The messages of [`framed`]'s body; `None` when it does not decode.
pub(super) fn unframed(mut body: Bytes) -> Option<Vec<Bytes>> {
    let mut out = Vec::new();
    while body.has_remaining() {
        if body.len() < 4 {
            return None;
        }
        let len = body.get_u32_le() as usize;
        if body.len() < len {
            return None;
        }
        out.push(body.split_to(len));
    }
    Some(out)
}
