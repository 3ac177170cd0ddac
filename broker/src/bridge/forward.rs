//! Forwarding: the local session whose messages a bridge publishes to the remote broker.

use super::link::Client;
use super::store::Context;
use crate::BrokerState;
use crate::session::{Session, SubOptions};
use rumqttc::v5::mqttbytes::QoS;
use sluice_conf::BridgeConfig;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use tokio_util::sync::CancellationToken;

/// The local session that collects a bridge's outbound messages.
pub(super) fn forward_session(name: &str) -> String {
    format!("$bridge/{name}")
}

/// Completes when the forward session has something queued (never without one).
pub(super) async fn queued(forward: &Option<Forward>) {
    match forward {
        Some(f) => f.session.wake_writer.notified().await,
        None => std::future::pending().await,
    }
}

/// The local session whose messages a bridge publishes to the remote.
pub(super) struct Forward {
    pub(super) session: Arc<Session>,
    pub(super) conn: u64,
}

impl Forward {
    pub(super) fn new(shared: &Arc<BrokerState>, cfg: &BridgeConfig) -> Option<Self> {
        if cfg.forward.is_empty() {
            return None;
        }
        let conn = shared.next_conn.fetch_add(1, Ordering::Relaxed);
        let key = forward_session(&cfg.name);
        // A week offline is plenty: a bridge that is gone that long was removed.
        let (session, _, _) =
            shared
                .router
                .attach(&key, false, 7 * 24 * 3600, conn, CancellationToken::new());
        for filter in &cfg.forward {
            let options = SubOptions {
                qos: QoS::AtLeastOnce,
                no_local: false,
                retain_as_published: true,
                id: None,
            };
            shared.router.subscribe(&session, filter, options);
        }
        Some(Self { session, conn })
    }

    /// Publishes what is queued, except messages that came from this bridge (no loops);
    /// stops when rumqttc's queue is full (the rest waits for the next call).
    pub(super) fn send(&self, ctx: &Context, client: &Client) {
        loop {
            let batch = self.session.take(64);
            if batch.is_empty() {
                return;
            }
            let mut rest = batch.into_iter();
            while let Some(d) = rest.next() {
                if d.message.origin == ctx.client_id {
                    continue;
                }
                if !client.publish(&d.message.topic, d.message.payload.clone(), d.retain) {
                    // Back to the front of the queue, in order.
                    let mut st = self.session.state.lock();
                    for d in std::iter::once(d).chain(rest).rev() {
                        st.queue.push_front(d);
                    }
                    return;
                }
                ctx.status.forwarded.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}
