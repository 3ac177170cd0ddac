//! Sparkplug B messages: `spBv1.0/{group}/{type}/{edge node}[/{device}]` BIRTH, DATA and
//! DEATH messages go to the group's table in `mqtt.sparkplug_database`, decoded by the
//! engine (`sluice_engine::sparkplug`); commands (NCMD, DCMD) and host STATE messages are
//! only routed. A DATA message naming an alias no BIRTH announced is refused (a dead letter
//! naming the alias), and the edge node is asked for a rebirth with an NCMD
//! `Node Control/Rebirth`, as a Sparkplug host application does. Subscribers (SCADA hosts)
//! get every message either way: a message that cannot be stored for good (a payload that
//! does not decode, an unknown alias, a denied insert) is still routed, kept as a dead
//! letter and refused with its reason; one refused for a passing reason (disk or buffers
//! full) is not routed, so that the publisher's resend is the one delivered. `[[topic]]` rules for `spBv1.0/...` topics win.

use crate::BrokerState;
use crate::ingest::{Refusal, refusal_of, route};
use crate::session::Message;
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::mqttbytes::v5::PubAckReason;
use sluice_conf::MqttConfig;
use sluice_engine::access::Need;
use sluice_engine::{Format, Origin, Publication, sparkplug};
use std::sync::Arc;
use std::sync::atomic::Ordering;

/// Where a Sparkplug message goes: (database, group, its fixed columns).
pub(crate) struct Target<'a> {
    database: &'a str,
    group: &'a str,
    edge: &'a str,
    fixed: Vec<(String, String)>,
}

/// The table of a Sparkplug BIRTH, DATA or DEATH message (`None` for other topics, and
/// when Sparkplug storage is off).
pub(crate) fn target<'a>(config: &'a MqttConfig, topic: &'a str) -> Option<Target<'a>> {
    if config.sparkplug_database.is_empty() {
        return None;
    }
    let (group, kind, edge, device) = sparkplug::parse_topic(topic)?;
    let stored = ["NBIRTH", "NDATA", "NDEATH", "DBIRTH", "DDATA", "DDEATH"];
    if !stored.contains(&kind) || kind.starts_with('D') != device.is_some() {
        return None;
    }
    let mut fixed = vec![
        ("edge_node".to_string(), edge.to_string()),
        ("message".to_string(), kind.to_string()),
    ];
    fixed.extend(device.map(|d| ("device".to_string(), d.to_string())));
    Some(Target {
        database: &config.sparkplug_database,
        group,
        edge,
        fixed,
    })
}

/// Stores a Sparkplug message (see [`crate::ingest::try_store`]).
pub(crate) async fn store(
    shared: &Arc<BrokerState>,
    message: &Message,
    user: Option<&str>,
    origin: Option<&Origin>,
    journal: Option<sluice_engine::Journal>,
    t: Target<'_>,
) -> Result<bool, Refusal> {
    let need = Need::Insert {
        database: t.database,
        table: t.group,
    };
    if let Err(e) = shared.db.authorize(user, need) {
        let refusal = Refusal {
            reason: PubAckReason::NotAuthorized,
            text: e.to_string(),
            transient: false,
        };
        return routed_anyway(shared, message, refusal).await;
    }
    let publication = Publication {
        database: t.database,
        table: t.group,
        format: Format::Sparkplug,
        payload: &message.payload,
        fixed: &t.fixed,
        auto_create: true,
        origin,
    };
    match shared.db.publish_journaled(publication, journal).await {
        Ok(receipt) => {
            let rows = receipt.map_or(0, |r| r.rows as u64);
            shared
                .metrics
                .rows_stored
                .fetch_add(rows, Ordering::Relaxed);
            Ok(true)
        }
        Err(e) => {
            if matches!(e, sluice_engine::Error::NoBirth { .. })
                && shared.db.ask_rebirth(t.group, t.edge)
            {
                ask_rebirth(shared, t.group, t.edge).await;
            }
            routed_anyway(shared, message, refusal_of(e)).await
        }
    }
}

/// A message not stored for good is still routed (with a journal record of its own), then
/// refused, so the caller keeps it as a dead letter and tells the publisher why; a passing
/// failure is only refused.
async fn routed_anyway(
    shared: &Arc<BrokerState>,
    message: &Message,
    refusal: Refusal,
) -> Result<bool, Refusal> {
    if !refusal.transient {
        route(shared, &Arc::new(message.clone())).await;
    }
    Err(refusal)
}

/// Publishes `spBv1.0/{group}/NCMD/{edge}` with `Node Control/Rebirth = true`.
async fn ask_rebirth(shared: &Arc<BrokerState>, group: &str, edge: &str) {
    let now_ms = (sluice_engine::now_micros() / 1000) as u64;
    let m = Arc::new(Message {
        id: Default::default(),
        sent_to: Default::default(),
        topic: Arc::from(format!("spBv1.0/{group}/NCMD/{edge}")),
        payload: sparkplug::payload::rebirth_request(now_ms).into(),
        qos: QoS::AtLeastOnce,
        retain: false,
        properties: None,
        expires: None,
        origin: Arc::from("$sparkplug"),
    });
    tracing::info!(group, edge, "asking a Sparkplug edge node for a rebirth");
    route(shared, &m).await;
}
