//! What the server sends on its own: the session's queued messages, within the client's
//! receive window, encoded after the control packets already waiting.

use crate::BrokerState;
use crate::codec::{self, Version};
use crate::session::{Delivery, Outgoing, Session};
use bytes::{Bytes, BytesMut};
use rumqttc::v5::mqttbytes::v5::*;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

pub(super) struct Outbound {
    pub(super) version: Version,
    pub(super) session: Arc<Session>,
    pub(super) window: usize,
    pub(super) max_packet: usize,
    pub(super) alias_max: u16,
    pub(super) aliases: HashMap<Arc<str>, u16>,
}

/// Encodes again what was in flight to a resumed session (DUP set), in the order it was
/// sent (by log position; messages not in the journal first, by packet id), as far as the
/// client's receive window goes; the rest follows as acknowledgements make room.
pub(super) fn resend(st: &mut Outbound, out: &mut BytesMut) {
    {
        let mut s = st.session.state.lock();
        s.resend = s.inflight.keys().copied().collect();
    }
    resend_given(st, out);
}

/// Encodes again what waits to be sent again (what another node gave while the client is
/// connected: `State::resend`; what the window did not take at the CONNACK), as far as the
/// client's receive window goes.
pub(super) fn resend_given(st: &mut Outbound, out: &mut BytesMut) {
    let again = {
        let mut s = st.session.state.lock();
        if s.resend.is_empty() {
            return;
        }
        s.due_resends(st.window)
    };
    send_again(st, again, out);
}

fn send_again(st: &mut Outbound, again: Vec<(u16, Outgoing)>, out: &mut BytesMut) {
    for (pkid, o) in again {
        let p = match o {
            Outgoing::Published(d) => publish_packet(st, &d, pkid, true).0,
            Outgoing::Released(_) => Packet::PubRel(PubRel {
                pkid,
                reason: PubRelReason::Success,
                properties: None,
            }),
        };
        let _ = codec::write(st.version, &p, out);
    }
}

/// Moves queued messages into `out` while the client's receive window has room. A QoS 1/2
/// message in the journal going to a lasting session, and everything after it, goes into
/// `held` instead: it is sent once the journal has its packet id; returns those (LSN,
/// packet id) pairs. A lasting session's message too large for the client is added to
/// `dropped`, to be logged as done with (else a restart would queue it again).
pub(super) fn fill(
    shared: &BrokerState,
    st: &mut Outbound,
    out: &mut BytesMut,
    held: &mut BytesMut,
    dropped: &mut Vec<u64>,
) -> Vec<(u64, u16)> {
    let lasting = st.session.lasting() && shared.db.journals();
    let mut sent = Vec::new();
    loop {
        let room = st
            .window
            .saturating_sub(st.session.state.lock().inflight.len());
        if room == 0 {
            return sent;
        }
        let batch = st.session.take_into_flight(room.min(256));
        if batch.is_empty() {
            return sent;
        }
        for (d, pkid) in batch {
            let (p, new_alias) = publish_packet(st, &d, pkid, false);
            if p.size() > st.max_packet {
                // The client cannot take it (MQTT 5 maximum packet size): it is not sent,
                // and neither is the alias it would have set up.
                if new_alias {
                    st.aliases.remove(&d.message.topic);
                }
                st.session.state.lock().inflight.remove(&pkid);
                if lasting && d.lsn != 0 {
                    dropped.push(d.lsn);
                }
                tracing::debug!(client_id = %st.session.client_id, size = p.size(), "message larger than the client's maximum packet size not sent");
                continue;
            }
            if lasting && pkid != 0 && d.lsn != 0 {
                sent.push((d.lsn, pkid));
            }
            shared.metrics.messages_out.fetch_add(1, Ordering::Relaxed);
            let to = if sent.is_empty() {
                &mut *out
            } else {
                &mut *held
            };
            let _ = codec::write(st.version, &p, to);
        }
    }
}

/// The PUBLISH for `d`, and whether it set up a new outgoing topic alias.
fn publish_packet(st: &mut Outbound, d: &Delivery, pkid: u16, dup: bool) -> (Packet, bool) {
    let m = &d.message;
    let mut properties = m.properties.clone();
    if st.version == Version::V5 {
        let props = properties.get_or_insert_with(PublishProperties::default);
        props.subscription_identifiers = d.subscription_ids.clone();
        if let Some(e) = m.expires {
            props.message_expiry_interval =
                Some(e.saturating_duration_since(Instant::now()).as_secs().max(1) as u32);
        }
    }
    let mut topic = Bytes::copy_from_slice(m.topic.as_bytes());
    let mut new_alias = false;
    if st.version == Version::V5 && st.alias_max > 0 {
        let props = properties.get_or_insert_with(PublishProperties::default);
        match st.aliases.get(&m.topic) {
            Some(a) => {
                props.topic_alias = Some(*a);
                topic = Bytes::new();
            }
            None if st.aliases.len() < usize::from(st.alias_max) => {
                let a = st.aliases.len() as u16 + 1;
                st.aliases.insert(m.topic.clone(), a);
                props.topic_alias = Some(a);
                new_alias = true;
            }
            None => {}
        }
    }
    if properties
        .as_ref()
        .is_some_and(|p| *p == PublishProperties::default())
    {
        properties = None;
    }
    let p = Packet::Publish(Publish {
        dup,
        qos: d.qos,
        retain: d.retain,
        topic,
        pkid,
        payload: m.payload.clone(),
        properties,
    });
    (p, new_alias)
}
