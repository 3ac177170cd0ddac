//! The last will: published, after its delay, when a connection ends without a normal
//! DISCONNECT.

use crate::BrokerState;
use crate::error;
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
        let (reason, _) = crate::ingest::store(shared, message, user, will_of).await;
        tracing::debug!(client_id = %session.client_id, reason = error::reason_code(reason), "will published");
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
