//! The last will: published, after its delay, when a connection ends without a normal
//! DISCONNECT. In a cluster the other nodes keep a copy until then, and one of them
//! publishes it if this node dies first (`sluice_cluster`'s relay); a node that starts again
//! publishes only the wills of its previous run that no other node did.

use crate::BrokerState;
use crate::error;
use crate::journal::Record;
use crate::session::{Message, Session};
use rumqttc::v5::mqttbytes::v5::*;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

pub(super) fn publish_will(
    shared: &Arc<BrokerState>,
    session: &Arc<Session>,
    will: LastWill,
    user: Option<Arc<str>>,
    generation: u64,
    expiry: u32,
) {
    let Some((message, delay)) = will_message(&session.client_id, &will) else {
        return;
    };
    let delay = delay.min(expiry);
    let shared = shared.clone();
    let session = session.clone();
    tokio::spawn(async move {
        if delay > 0 {
            // Until the delay runs out or the session ends, whichever comes first.
            let ended = session.ended.notified();
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_secs(u64::from(delay))) => {}
                _ = ended => {}
            }
            if session.generation.load(Ordering::Acquire) != generation {
                return; // The client came back in time.
            }
        }
        let will_of = session.lasting().then(|| session.client_id.clone());
        let (reason, _) = crate::ingest::store(shared.clone(), message, user, will_of).await;
        tracing::debug!(client_id = %session.client_id, reason = error::reason_code(reason), "will published");
        if let Some(r) = shared.router.remote()
            && session.generation.load(Ordering::Acquire) == generation
        {
            r.share_will(&session.client_id, None, None, 0);
        }
    });
}

/// Publishes a will another node kept for its client: that node stopped answering (or
/// started again without claiming it) after the will's delay.
pub(crate) async fn publish_kept_will(shared: Arc<BrokerState>, node: u64, will: bytes::Bytes) {
    let Some(Record::Open {
        client,
        user,
        will: Some((message, _)),
        ..
    }) = Record::decode(&will)
    else {
        tracing::warn!(
            node,
            "a will kept for another node's client does not decode; dropped"
        );
        return;
    };
    let (reason, _) = crate::ingest::store(shared.clone(), message, user, None).await;
    tracing::info!(node, client_id = %client, reason = error::reason_code(reason), "will of a client of a node that does not answer, published");
}

/// Publishes, each after its delay, the wills of connections that ended with this node's
/// previous run (`wills`: client, message, delay), unless the client came back meanwhile.
/// In a cluster, first asks the other nodes what they did with them: those one of them
/// published are not published again, and the wills they kept and did not publish (those
/// of clean sessions too, which this node's journal does not hold) are published here.
pub(crate) fn publish_replayed_wills(
    shared: &Arc<BrokerState>,
    wills: Vec<(Arc<str>, Arc<Message>, u32)>,
) {
    if shared.router.remote().is_none() {
        for (client, message, delay) in wills {
            publish_replayed(shared, client, message, None, delay);
        }
        return;
    }
    let shared = shared.clone();
    tokio::spawn(async move {
        let Some(remote) = shared.router.remote() else {
            return;
        };
        let claimed = remote.claim_wills().await;
        let journaled: std::collections::HashSet<Arc<str>> =
            wills.iter().map(|w| w.0.clone()).collect();
        let mut here = 0;
        for (client, message, delay) in wills {
            if !claimed.published.contains(&*client) {
                publish_replayed(&shared, client, message, None, delay);
            }
        }
        for (client, will, delay) in claimed.pending {
            if journaled.contains(client.as_str()) {
                continue;
            }
            if let Some(Record::Open {
                user,
                will: Some((message, _)),
                ..
            }) = Record::decode(&will)
            {
                here += 1;
                publish_replayed(&shared, Arc::from(client), message, user, delay);
            }
        }
        tracing::info!(
            published_elsewhere = claimed.published.len(),
            handed_back = here,
            "wills of the previous run claimed from the other nodes"
        );
    });
}

/// Publishes, after its delay, the will of a connection that ended with the server, unless
/// the client came back meanwhile (here, or, in a cluster, with its lasting session on
/// another node).
fn publish_replayed(
    shared: &Arc<BrokerState>,
    client: Arc<str>,
    message: Arc<Message>,
    user: Option<Arc<str>>,
    delay: u32,
) {
    let shared = shared.clone();
    let generation = (shared.router.session(&client)).map(|s| s.generation.load(Ordering::Acquire));
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(u64::from(delay))).await;
        let session = shared.router.session(&client);
        let now = (session.as_ref()).map(|s| s.generation.load(Ordering::Acquire));
        let elsewhere = (shared.router.remote()).is_some_and(|r| r.session_elsewhere(&client));
        if now != generation || elsewhere {
            return; // The client came back in time.
        }
        let user = user.or_else(|| session.and_then(|s| s.user.lock().clone()));
        let (reason, _) =
            crate::ingest::store(shared.clone(), message, user, Some(client.clone())).await;
        tracing::debug!(client_id = %client, reason = error::reason_code(reason), "will of a connection ended by the stop published");
    });
}

/// The message a will publishes, from `client`, and its delay in seconds.
pub(crate) fn will_message(client: &Arc<str>, will: &LastWill) -> Option<(Arc<Message>, u32)> {
    let delay = will
        .properties
        .as_ref()
        .and_then(|p| p.delay_interval)
        .unwrap_or(0);
    let topic = std::str::from_utf8(&will.topic).ok()?;
    let props = will.properties.clone().map(|p| PublishProperties {
        payload_format_indicator: p.payload_format_indicator,
        message_expiry_interval: p.message_expiry_interval,
        topic_alias: None,
        response_topic: p.response_topic,
        correlation_data: p.correlation_data,
        user_properties: p.user_properties,
        subscription_identifiers: Vec::new(),
        content_type: p.content_type,
    });
    let expires = props
        .as_ref()
        .and_then(|p| p.message_expiry_interval)
        .map(|s| Instant::now() + Duration::from_secs(u64::from(s)));
    let message = Arc::new(Message {
        id: Default::default(),
        sent_to: Default::default(),
        topic: Arc::from(topic),
        payload: will.message.clone(),
        qos: will.qos,
        retain: will.retain,
        properties: props,
        expires,
        origin: client.clone(),
    });
    Some((message, delay))
}
