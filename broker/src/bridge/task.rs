//! One bridge's task: connect, subscribe, hand received messages to the stores, acknowledge
//! them in order, forward local messages, and reconnect with backoff.

use super::forward::{Forward, queued};
use super::link::{self, Client, Got};
use super::saved::SavedFile;
use super::status::Status;
use super::store::{Context, Handled, store_batch};
use crate::BrokerState;
use crate::ingest;
use futures::StreamExt;
use futures::stream::FuturesOrdered;
use rumqttc::v5::mqttbytes::QoS;
use sluice_conf::BridgeConfig;
use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Longest wait between reconnection attempts.
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// First wait after a failed connection.
const MIN_BACKOFF: Duration = Duration::from_millis(200);
/// Most messages stored with one log submission.
const MAX_BATCH: usize = 256;

/// The wait before reconnection attempt `attempt` (0 first): doubling from
/// [`MIN_BACKOFF`] up to [`MAX_BACKOFF`], each with up to 50% random jitter so that many
/// bridges (or many Sluice nodes) do not reconnect in step.
fn backoff(attempt: u32) -> Duration {
    let base = MIN_BACKOFF
        .saturating_mul(1u32 << attempt.min(16))
        .min(MAX_BACKOFF);
    let jitter = (u64::from(std::process::id()) ^ sluice_engine::now_micros() as u64)
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        % 1000;
    base.mul_f64(0.5 + jitter as f64 / 2000.0)
}

/// Routes handled messages locally and queues their acks, in order (routing first: a
/// message for a lasting session is in the journal before the remote is told it is
/// stored); stops at the first ack that does not fit rumqttc's request queue (the event
/// loop must be polled to make room).
async fn send_acks(ctx: &Context, client: &Client, unacked: &mut VecDeque<Handled>) {
    let routed: Vec<_> = unacked.iter_mut().filter_map(|h| h.route.take()).collect();
    if !routed.is_empty() {
        ingest::route_all(&ctx.shared, routed).await;
    }
    while let Some(h) = unacked.front_mut() {
        if h.received.qos != QoS::AtMostOnce && client.ack(&h.received).is_err() {
            return;
        }
        unacked.pop_front();
    }
}

/// Finishes every store in flight and queues what acks fit (the connection is gone or the
/// bridge is stopping: an ack that does not fit is not sent, so the remote delivers that
/// message again and it is recognised as stored then). Each is routed locally.
async fn settle<F>(
    ctx: &Context,
    client: &Client,
    pending: &mut FuturesOrdered<F>,
    unacked: &mut VecDeque<Handled>,
) where
    F: std::future::Future<Output = Vec<Handled>>,
{
    while let Some(done) = pending.next().await {
        unacked.extend(done);
    }
    let routed: Vec<_> = unacked.iter_mut().filter_map(|h| h.route.take()).collect();
    if !routed.is_empty() {
        ingest::route_all(&ctx.shared, routed).await;
    }
    for h in unacked.drain(..) {
        if h.received.qos != QoS::AtMostOnce {
            let _ = client.ack(&h.received);
        }
    }
}

/// One bridge, until `stop`.
pub(super) async fn run(
    shared: Arc<BrokerState>,
    config: BridgeConfig,
    status: Arc<Status>,
    stop: CancellationToken,
    saved: Arc<SavedFile>,
) {
    let name = config.name.clone();
    let (client, events) = match link::connect(&config, shared.config.max_packet_size) {
        Ok(l) => l,
        Err(e) => {
            status.error(&name, e);
            return;
        }
    };
    let mut events = Driver::start(events);
    let forward = Forward::new(&shared, &config);
    let ctx = Arc::new(Context {
        client_id: Arc::from(format!("bridge:{name}")),
        shared,
        config,
        status: status.clone(),
        stop: stop.clone(),
    });
    let filters: Vec<(String, u8)> = (ctx.config.topics.iter())
        .map(|t| (t.filter.clone(), t.qos))
        .collect();
    let window = usize::from(ctx.config.window);
    let mut pending = FuturesOrdered::new();
    // Handled in order, acks not yet queued.
    let mut unacked = VecDeque::new();
    let mut attempt = 0u32;
    let mut subscribed = false;
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let mut last_received = 0u64;
    tracing::info!(bridge = %name, address = %ctx.config.address, "bridge starting");
    loop {
        send_acks(&ctx, &client, &mut unacked).await;
        tokio::select! {
            biased;
            _ = stop.cancelled() => break,
            // Acks waiting for room in the request queue hold back further completions, and
            // the event loop (which makes that room) is polled even with a full window.
            Some(done) = pending.next(), if unacked.is_empty() && !pending.is_empty() => {
                unacked.extend(done);
            }
            got = events.next(), if !unacked.is_empty() || pending.len() < window => match got {
                Ok(Got::Connected { session_present }) => {
                    status.connected.store(true, Ordering::Relaxed);
                    attempt = 0;
                    tracing::info!(bridge = %name, session_present, "bridge connected");
                    // A remote that kept the session keeps its subscriptions too; subscribing
                    // again would make a 3.1.1 broker resend its retained messages, which
                    // would be stored twice.
                    let known = saved.saved.lock().subscribed.get(&name) == Some(&filters);
                    if !session_present || !(subscribed || known) {
                        if let Err(e) = client.subscribe(&filters) {
                            status.error(&name, format!("subscribing: {e}"));
                        }
                        let f = filters.clone();
                        if let Err(e) = saved.change(|s| { s.subscribed.insert(name.clone(), f); }) {
                            status.error(&name, e.to_string());
                        }
                    }
                    subscribed = true;
                    if let Some(f) = &forward {
                        f.send(&ctx, &client);
                    }
                }
                Ok(Got::Message(r)) => {
                    // Every message already received goes with it: one log submission for
                    // them all.
                    let mut batch = vec![*r];
                    while batch.len() < MAX_BATCH {
                        match events.try_next() {
                            Some(Ok(Got::Message(r))) => batch.push(*r),
                            Some(other) => {
                                events.defer(other);
                                break;
                            }
                            None => break,
                        }
                    }
                    status.received.fetch_add(batch.len() as u64, Ordering::Relaxed);
                    // Each batch is stored on its own task: batches proceed on both cores,
                    // and a window of stores is not re-polled as one task's futures.
                    let store = tokio::spawn(store_batch(ctx.clone(), batch));
                    pending.push_back(async move {
                        store.await.unwrap_or_else(|e| {
                            tracing::error!(error = %e, "a bridged batch's store failed; not acknowledged");
                            Vec::new()
                        })
                    });
                }
                Ok(Got::Other) => {}
                Err(e) => {
                    status.connected.store(false, Ordering::Relaxed);
                    status.reconnects.fetch_add(1, Ordering::Relaxed);
                    status.error(&name, format!("connection to {}: {e}", ctx.config.address));
                    // Stores in flight finish first, so a redelivery after the reconnection
                    // is checked against them.
                    settle(&ctx, &client, &mut pending, &mut unacked).await;
                    tokio::select! {
                        _ = stop.cancelled() => break,
                        _ = tokio::time::sleep(backoff(attempt)) => {}
                    }
                    attempt = attempt.saturating_add(1);
                    events.reconnect();
                }
            },
            _ = queued(&forward) => {
                if status.connected.load(Ordering::Relaxed) && let Some(f) = &forward {
                    f.send(&ctx, &client);
                }
            }
            _ = tick.tick() => {
                let now = status.received.load(Ordering::Relaxed);
                status.rate.store(now - last_received, Ordering::Relaxed);
                last_received = now;
                if status.connected.load(Ordering::Relaxed) && let Some(f) = &forward {
                    f.send(&ctx, &client);
                }
            }
        }
    }
    // Stopping: what is being stored finishes and is acknowledged; then a polite DISCONNECT
    // (the remote keeps the session and whatever arrives meanwhile).
    settle(&ctx, &client, &mut pending, &mut unacked).await;
    if status.connected.load(Ordering::Relaxed) {
        client.disconnect();
        let _ = tokio::time::timeout(Duration::from_secs(2), async {
            while events.next().await.is_ok() {}
        })
        .await;
    }
    events.task.abort();
    if let Some(f) = &forward {
        f.session.detach(f.conn);
    }
    status.connected.store(false, Ordering::Relaxed);
    tracing::info!(bridge = %name, "bridge stopped");
}

/// Polls the connection on its own task, so that polling is never cancelled (a connection
/// attempt cut short would be lost, with what its CONNACK said) and acks are sent while the
/// bridge waits for stores.
struct Driver {
    rx: tokio::sync::mpsc::Receiver<Result<Got, String>>,
    /// An event taken early (while gathering a batch), returned first.
    deferred: Option<Result<Got, String>>,
    resume: tokio::sync::mpsc::Sender<()>,
    task: tokio::task::JoinHandle<()>,
}

impl Driver {
    fn start(mut events: link::Events) -> Self {
        let (tx, rx) = tokio::sync::mpsc::channel(64);
        let (resume, mut resumed) = tokio::sync::mpsc::channel(1);
        let task = tokio::spawn(async move {
            loop {
                let got = events.poll().await;
                let failed = got.is_err();
                if tx.send(got).await.is_err() {
                    return;
                }
                // After an error the next poll reconnects: only once the bridge says so.
                if failed && resumed.recv().await.is_none() {
                    return;
                }
            }
        });
        Self {
            rx,
            deferred: None,
            resume,
            task,
        }
    }

    /// The next event (an error: the connection is down).
    async fn next(&mut self) -> Result<Got, String> {
        if let Some(e) = self.deferred.take() {
            return e;
        }
        self.rx
            .recv()
            .await
            .unwrap_or_else(|| Err("connection task ended".into()))
    }

    /// The next event if one is already waiting.
    fn try_next(&mut self) -> Option<Result<Got, String>> {
        match self.deferred.take() {
            Some(e) => Some(e),
            None => self.rx.try_recv().ok(),
        }
    }

    /// Keeps `event` to be returned by the next call.
    fn defer(&mut self, event: Result<Got, String>) {
        self.deferred = Some(event);
    }

    /// Lets the connection task reconnect after an error.
    fn reconnect(&self) {
        let _ = self.resume.try_send(());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_to_its_cap_with_jitter() {
        for attempt in 0..40 {
            let b = backoff(attempt);
            let base = MIN_BACKOFF
                .saturating_mul(1u32 << attempt.min(16))
                .min(MAX_BACKOFF);
            assert!(b >= base / 2 && b <= base, "attempt {attempt}: {b:?}");
        }
        assert!(backoff(30) <= MAX_BACKOFF);
    }
}
