//! Storing what the remote delivers: a batch with one log submission, or one message alone
//! (redeliveries recognised, transient refusals retried, the rest kept as dead letters).

use super::link::Received;
use super::status::Status;
use crate::BrokerState;
use crate::ingest;
use crate::session::Message;
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::mqttbytes::v5::PubAckReason;
use sluice_conf::BridgeConfig;
use sluice_engine::Origin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Longest wait between attempts to store a message refused for a passing reason.
const MAX_RETRY: Duration = Duration::from_secs(5);

/// Applies `strip_prefix` then `add_prefix` to a remote topic.
fn local_topic(cfg: &BridgeConfig, remote: &str) -> String {
    let rest = remote
        .strip_prefix(cfg.strip_prefix.as_str())
        .unwrap_or(remote);
    format!("{}{rest}", cfg.add_prefix)
}

/// What one bridge's stores share.
pub(super) struct Context {
    pub(super) shared: Arc<BrokerState>,
    pub(super) config: BridgeConfig,
    pub(super) status: Arc<Status>,
    /// `bridge:<name>`: the messages' origin (dead letters' client id, ACL user).
    pub(super) client_id: Arc<str>,
    pub(super) stop: CancellationToken,
}

/// A received message once handled: acknowledge it, then route it (unless it was a
/// duplicate or a dead letter).
pub(super) struct Handled {
    pub(super) received: Received,
    pub(super) route: Option<Arc<Message>>,
}

/// Stores received messages with one log submission (see the `bridge` module docs); a message that
/// cannot go with the others (a redelivery, one too large, one refused or needing its table
/// created) is stored alone by [`handle`]. Returns those handled, in order (one the bridge
/// stopped before storing is left out: it is not acknowledged).
pub(super) async fn store_batch(ctx: Arc<Context>, mut rs: Vec<Received>) -> Vec<Handled> {
    if rs.len() == 1 {
        let r = rs.pop().expect("one message");
        return handle(ctx, r).await.into_iter().collect();
    }
    let max = ctx.shared.config.max_packet_size as usize;
    let (mut together, mut at) = (Vec::new(), Vec::new());
    for (i, r) in rs.iter().enumerate() {
        if r.dup || r.payload.len() > max {
            continue;
        }
        let origin = (r.qos != QoS::AtMostOnce)
            .then(|| Origin::new(&ctx.config.name, r.pkid, &r.topic, &r.payload));
        together.push((Arc::new(local_message(&ctx, r)), origin));
        at.push(i);
    }
    let user = Some(&*ctx.client_id);
    let outcome = match ingest::try_store_batch(&ctx.shared, &together, user).await {
        Ok(o) => o,
        // The log failed: each is retried alone.
        Err(_) => vec![ingest::Batched::Alone; together.len()],
    };
    let mut done: Vec<Option<Arc<Message>>> = vec![None; rs.len()];
    for ((i, (message, _)), o) in at.into_iter().zip(together).zip(outcome) {
        if o == ingest::Batched::Stored {
            ctx.status.stored.fetch_add(1, Ordering::Relaxed);
        }
        if o != ingest::Batched::Alone {
            done[i] = Some(message);
        }
    }
    let mut out = Vec::with_capacity(rs.len());
    for (r, message) in rs.into_iter().zip(done) {
        match message {
            Some(m) => out.push(Handled {
                received: r,
                route: Some(m),
            }),
            None => out.extend(Box::pin(handle(ctx.clone(), r)).await),
        }
    }
    out
}

/// The local form of a message received from the remote.
fn local_message(ctx: &Context, r: &Received) -> Message {
    Message {
        id: Default::default(),
        sent_to: Default::default(),
        topic: Arc::from(local_topic(&ctx.config, &r.topic)),
        payload: r.payload.clone(),
        qos: r.qos,
        retain: r.retain,
        properties: r.properties.clone(),
        expires: None,
        origin: ctx.client_id.clone(),
    }
}

/// Stores one received message (see the `bridge` module docs); `None` when the bridge stopped
/// before it could be stored (it is then not acknowledged, and the remote keeps it).
async fn handle(ctx: Arc<Context>, r: Received) -> Option<Handled> {
    let st = &ctx.status;
    let origin = (r.qos != QoS::AtMostOnce)
        .then(|| Origin::new(&ctx.config.name, r.pkid, &r.topic, &r.payload));
    if r.dup && origin.as_ref().is_some_and(|o| ctx.shared.db.is_stored(o)) {
        st.duplicates.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(bridge = %ctx.config.name, pkid = r.pkid, topic = %r.topic, "redelivery of a stored message: acknowledged, not stored again");
        return Some(Handled {
            received: r,
            route: None,
        });
    }
    let message = Arc::new(local_message(&ctx, &r));
    let mut wait = Duration::from_millis(50);
    let max = ctx.shared.config.max_packet_size as usize;
    loop {
        let user = Some(&*ctx.client_id);
        let stored = if r.payload.len() > max {
            Err(ingest::Refusal {
                reason: PubAckReason::ImplementationSpecificError,
                text: format!(
                    "payload of {} bytes is larger than mqtt.max_packet_size ({max})",
                    r.payload.len()
                ),
                transient: false,
            })
        } else {
            ingest::try_store(&ctx.shared, &message, user, origin.as_ref(), None).await
        };
        match stored {
            Ok(stored) => {
                if stored {
                    st.stored.fetch_add(1, Ordering::Relaxed);
                }
                return Some(Handled {
                    received: r,
                    route: Some(message),
                });
            }
            Err(refusal) if refusal.transient => {
                st.error(
                    &ctx.config.name,
                    format!(
                        "storing a message from {}: {} (retrying; not acknowledged)",
                        r.topic, refusal.text
                    ),
                );
                tokio::select! {
                    _ = ctx.stop.cancelled() => return None,
                    _ = tokio::time::sleep(wait) => {}
                }
                wait = (wait * 2).min(MAX_RETRY);
            }
            Err(refusal) => {
                let kept =
                    ingest::dead_letter(&ctx.shared, &message, refusal.reason, &refusal.text).await;
                if let Err(e) = kept {
                    // Neither stored nor kept: not acknowledged, so the remote keeps it.
                    st.error(
                        &ctx.config.name,
                        format!(
                            "keeping a refused message from {} as a dead letter: {e} (retrying; not acknowledged)",
                            r.topic
                        ),
                    );
                    tokio::select! {
                        _ = ctx.stop.cancelled() => return None,
                        _ = tokio::time::sleep(wait) => {}
                    }
                    wait = (wait * 2).min(MAX_RETRY);
                    continue;
                }
                st.dead_letters.fetch_add(1, Ordering::Relaxed);
                return Some(Handled {
                    received: r,
                    route: None,
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_are_stripped_then_added() {
        let mut cfg: BridgeConfig = serde_json::from_str(
            r##"{"name": "b", "address": "h:1", "topics": [{"filter": "#"}]}"##,
        )
        .unwrap();
        assert_eq!(local_topic(&cfg, "site/a/t"), "site/a/t");
        cfg.strip_prefix = "site/".into();
        cfg.add_prefix = "plant/".into();
        assert_eq!(local_topic(&cfg, "site/a/t"), "plant/a/t");
        assert_eq!(local_topic(&cfg, "other/t"), "plant/other/t");
    }
}
