//! The messages a node relays to another, in numbered batches ([`RELAY`]).

use super::{BATCH, Item, MAX_WAITING, RELAY, RETRY, Relay, Waiters};
use crate::raft::net::Frame;
use crate::raft::node::PROBE_AFTER;
use bytes::{Buf, Bytes};
use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio::sync::mpsc;

/// The longest a batch's call waits for a peer that answers otherwise: its broker may hold
/// the batch while a slow subscriber's queue has no room (`MAX_WAIT`, 10 s), which slows
/// the publishers here as it would there.
const BATCH_TIMEOUT: Duration = Duration::from_secs(15);

impl Relay {
    /// Sends peer `id` its queue, in order (see the module docs).
    pub(super) async fn forward(self: Arc<Self>, id: u64, mut rx: mpsc::UnboundedReceiver<Item>) {
        // Released messages not yet taken, numbered; and who waits for them.
        let mut waiting: VecDeque<(u64, Bytes)> = VecDeque::new();
        let mut waiters: Waiters = Vec::new();
        let mut next = 1u64;
        let mut down = false;
        loop {
            if waiting.is_empty() {
                let slot = tokio::select! {
                    _ = self.cancel.cancelled() => return,
                    s = rx.recv() => match s { Some(s) => s, None => return },
                };
                self.take(slot, &mut next, &mut waiting, &mut waiters).await;
                if waiting.is_empty() {
                    continue;
                }
            }
            while waiting.len() < BATCH
                && let Ok(slot) = rx.try_recv()
            {
                self.take(slot, &mut next, &mut waiting, &mut waiters).await;
            }
            if down {
                waiters.clear();
            }
            let n = waiting.len().min(BATCH);
            let last = waiting.get(n.saturating_sub(1)).map_or(0, |w| w.0);
            let frame = batch_frame(self.node.id(), self.incarnation, waiting.iter().take(n));
            // While the peer is down, publishers do not wait for it, not even during a call
            // to a frozen peer: what they queue meanwhile is taken.
            let oldest = waiters.first().map(|w| w.2);
            let call = self.send_batch(id, frame, oldest);
            tokio::pin!(call);
            let answer = loop {
                tokio::select! {
                    biased;
                    a = &mut call => break a,
                    s = rx.recv(), if down => match s {
                        Some(s) => {
                            self.take(s, &mut next, &mut waiting, &mut waiters).await;
                            waiters.clear();
                        }
                        None => return,
                    },
                }
            };
            match answer {
                Ok(_) => {
                    if down {
                        tracing::info!(peer = id, "a node answers again; its messages are sent");
                    }
                    down = false;
                    waiting.drain(..n);
                    waiters.retain(|(seq, ..)| *seq > last);
                }
                Err(e) => {
                    if !down {
                        tracing::warn!(peer = id, error = %e, "messages for a node wait until it answers");
                    }
                    down = true;
                    waiters.clear();
                    let until = tokio::time::Instant::now() + RETRY;
                    loop {
                        let slot = tokio::select! {
                            _ = self.cancel.cancelled() => return,
                            _ = tokio::time::sleep_until(until) => break,
                            s = rx.recv() => match s { Some(s) => s, None => return },
                        };
                        self.take(slot, &mut next, &mut waiting, &mut waiters).await;
                        waiters.clear();
                    }
                }
            }
            if waiting.len() > MAX_WAITING {
                let over = waiting.len() - MAX_WAITING;
                waiting.drain(..over);
                self.dropped.fetch_add(over as u64, Ordering::Relaxed);
            }
        }
    }

    /// Waits for `item`'s release; a released message joins `waiting`. A pull is answered
    /// with what `waiting` holds (all queued before it is released or withdrawn by now).
    async fn take(
        &self,
        item: Item,
        next: &mut u64,
        waiting: &mut VecDeque<(u64, Bytes)>,
        waiters: &mut Waiters,
    ) {
        let slot = match item {
            Item::Message(slot) => slot,
            Item::Pull(answer) => {
                let _ = answer.send(waiting.iter().map(|(_, b)| b.clone()).collect());
                return;
            }
        };
        if slot.go.await == Ok(true) {
            waiting.push_back((*next, slot.bytes));
            waiters.push((*next, slot.accepted, slot.queued));
            *next += 1;
        }
    }

    /// Sends a batch to peer `to` and waits for its answer, as long as the peer answers
    /// probes ([`PROBE_AFTER`]): publishers' acknowledgements wait meanwhile, and with one
    /// fixed timeout a frozen peer held every publisher of the cluster for all of it (2 s,
    /// or 3 s when a message's own write waited for a shard's election first, as its
    /// publisher's wait counts from when it queued: `oldest`). A batch that took longer than
    /// a failed probe is sent again (its numbers tell the copies).
    pub(super) async fn send_batch(
        &self,
        to: u64,
        frame: Frame,
        oldest: Option<tokio::time::Instant>,
    ) -> Result<Bytes, String> {
        let probe_at = match oldest {
            Some(at) => (at + PROBE_AFTER).max(tokio::time::Instant::now()),
            None => tokio::time::Instant::now() + PROBE_AFTER,
        };
        (self
            .node
            .call_while_answering(to, frame, BATCH_TIMEOUT, probe_at)
            .await)
            .map_err(|e| e.to_string())
    }

    /// Delivers a peer's batch, once.
    pub(super) async fn receive(&self, mut body: Bytes) -> Result<(), String> {
        let bad = || "a relayed batch that does not decode".to_string();
        if body.len() < 28 {
            return Err(bad());
        }
        let (from, incarnation, first) = (body.get_u64_le(), body.get_u64_le(), body.get_u64_le());
        let count = body.get_u32_le() as usize;
        let mut messages = super::pull::unframed(body).ok_or_else(bad)?;
        if messages.len() != count {
            return Err(bad());
        }
        let Some(sink) = self.sink.get().cloned() else {
            return Err(format!("node {}'s broker has not started", self.node.id()));
        };
        let state = (self.received.lock().entry(from).or_default()).clone();
        let mut state = state.lock().await;
        if state.0 != incarnation {
            *state = (incarnation, 0);
        }
        // Numbers skipped: the sender's queue dropped them while this node did not answer.
        if first > state.1 + 1 {
            sink.gap(from);
        }
        // Those taken already (the answer to an earlier copy was lost) are skipped.
        let skip = (state.1 + 1).saturating_sub(first) as usize;
        if skip >= messages.len() {
            return Ok(());
        }
        let last = first + messages.len() as u64 - 1;
        sink.receive(from, (incarnation, last), messages.split_off(skip))
            .await?;
        state.1 = last;
        Ok(())
    }
}

/// A [`RELAY`] frame: sender, run, the first message's number, the count, then each message
/// as a u32 length and its bytes (little-endian).
pub(super) fn batch_frame<'a>(
    from: u64,
    incarnation: u64,
    messages: impl Iterator<Item = &'a (u64, Bytes)> + Clone,
) -> Frame {
    let size: usize = messages.clone().map(|m| 4 + m.1.len()).sum();
    let mut body = Vec::with_capacity(28 + size);
    let first = messages.clone().next().map_or(0, |m| m.0);
    body.extend_from_slice(&from.to_le_bytes());
    body.extend_from_slice(&incarnation.to_le_bytes());
    body.extend_from_slice(&first.to_le_bytes());
    body.extend_from_slice(&(messages.clone().count() as u32).to_le_bytes());
    for (_, m) in messages {
        body.extend_from_slice(&(m.len() as u32).to_le_bytes());
        body.extend_from_slice(m);
    }
    Frame::raw(RELAY, &body)
}
