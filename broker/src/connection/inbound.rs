//! The packets a client sends after CONNECT: PUBLISH and its QoS 2 handshake, acks of what
//! the server sent, SUBSCRIBE, UNSUBSCRIBE, PINGREQ and DISCONNECT.

use super::{Ack, Client};
use crate::BrokerState;
use crate::codec::Version;
use crate::error::{self, Error, Result};
use crate::journal::{self, Record};
use crate::router::remote::Groups;
use crate::session::{Message, Outgoing, SubOptions};
use crate::topic;
use bytes::Bytes;
use futures::stream::FuturesOrdered;
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::mqttbytes::v5::*;
use sluice_engine::access::Need;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// Handles one packet; returns true on a DISCONNECT (which ends the connection).
pub(super) async fn handle(
    shared: &Arc<BrokerState>,
    client: &mut Client,
    packet: Packet,
    pending: &mut FuturesOrdered<Ack>,
) -> Result<bool> {
    // Whether the session's state is in the journal: read where needed, under the lock
    // the branch takes anyway (this runs for every acknowledgement).
    let journals = shared.db.journals();
    match packet {
        Packet::Publish(p) => on_publish(shared, client, p, pending)?,
        Packet::PubAck(a) => {
            let mut st = client.session.state.lock();
            if let Some(Outgoing::Published(d)) = st.inflight.get(&a.pkid) {
                let lsn = d.lsn;
                st.inflight.remove(&a.pkid);
                if lsn != 0 && journals && st.expiry_secs > 0 {
                    client.acked.push(lsn);
                }
            }
            drop(st);
            client.session.wake_writer.notify_one();
        }
        Packet::PubRec(r) => {
            let (known, lasting) = {
                let mut st = client.session.state.lock();
                let lasting = journals && st.expiry_secs > 0;
                let known = st.inflight.get(&r.pkid).map(|o| o.lsn());
                if let Some(lsn) = known {
                    if (r.reason as u8) >= 0x80 {
                        st.inflight.remove(&r.pkid);
                        if lsn != 0 && lasting {
                            client.acked.push(lsn);
                        }
                    } else {
                        st.inflight.insert(r.pkid, Outgoing::Released(lsn));
                    }
                }
                (known.filter(|_| (r.reason as u8) < 0x80), lasting)
            };
            let rel = Packet::PubRel(PubRel {
                pkid: r.pkid,
                reason: PubRelReason::Success,
                properties: None,
            });
            match known {
                // The PUBREL goes once the PUBREC is in the journal: after a crash the
                // message is released again, never sent again as new.
                Some(lsn) if lsn != 0 && lasting => {
                    let record = Record::Received {
                        client: client.id.clone(),
                        lsn,
                        pkid: r.pkid,
                    };
                    let (db, entry) = (shared.db.clone(), journal::entry(&record, None));
                    pending.push_back(Box::pin(async move {
                        match db.journal(vec![entry], true).await {
                            Ok(_) => (Some(rel), None),
                            Err(e) => {
                                tracing::warn!(error = %e, "PUBREC not logged; PUBREL not sent");
                                (None, None)
                            }
                        }
                    }));
                }
                Some(_) => client.send(rel),
                None => client.session.wake_writer.notify_one(),
            }
        }
        Packet::PubComp(c) => {
            let (done, lasting) = {
                let mut st = client.session.state.lock();
                (st.inflight.remove(&c.pkid), journals && st.expiry_secs > 0)
            };
            if let Some(lsn) = done.map(|o| o.lsn()).filter(|l| *l != 0 && lasting) {
                client.acked.push(lsn);
            }
            client.session.wake_writer.notify_one();
        }
        Packet::PubRel(r) => {
            let (found, lasting) = {
                let mut st = client.session.state.lock();
                (
                    st.incoming_qos2.remove(&r.pkid),
                    journals && st.expiry_secs > 0,
                )
            };
            let pkid = r.pkid;
            // Its packet id is free once the journal says so, before the PUBCOMP lets the
            // client use it again.
            let released = (found && lasting).then(|| {
                let record = Record::Released {
                    client: client.id.clone(),
                    pkid,
                };
                (shared.db.clone(), journal::entry(&record, None))
            });
            let session = client.session.clone();
            // After the PUBREC of the same id, which may still be pending.
            pending.push_back(Box::pin(async move {
                if let Some((db, entry)) = released
                    && let Err(e) = db.journal(vec![entry], true).await
                {
                    // No PUBCOMP: the client keeps the id and sends its PUBREL again.
                    tracing::warn!(error = %e, "PUBREL not logged; PUBCOMP not sent");
                    session.state.lock().incoming_qos2.insert(pkid);
                    return (None, None);
                }
                let comp = Packet::PubComp(PubComp {
                    pkid,
                    reason: if found {
                        PubCompReason::Success
                    } else {
                        PubCompReason::PacketIdentifierNotFound
                    },
                    properties: None,
                });
                (Some(comp), None)
            }));
        }
        Packet::Subscribe(s) => Box::pin(on_subscribe(shared, client, s)).await?,
        Packet::Unsubscribe(u) => {
            let mut reasons = Vec::with_capacity(u.filters.len());
            for f in &u.filters {
                let (existed, lasting) = {
                    let st = client.session.state.lock();
                    (
                        st.subscriptions.contains_key(f),
                        journals && st.expiry_secs > 0,
                    )
                };
                if lasting {
                    let record = Record::Unsubscribe {
                        client: client.id.clone(),
                        filter: f.clone(),
                    };
                    let (state, session, filter) =
                        (shared.clone(), client.session.clone(), f.clone());
                    let then: sluice_engine::Then = Box::new(move |_| {
                        if state.router.is_current(&session) {
                            state.router.unsubscribe(&session, &filter);
                        }
                    });
                    let entry = journal::entry(&record, Some(then));
                    shared.db.journal(vec![entry], true).await?;
                } else {
                    shared.router.unsubscribe(&client.session, f);
                }
                reasons.push(match existed {
                    true => UnsubAckReason::Success,
                    false => UnsubAckReason::NoSubscriptionExisted,
                });
            }
            client.send(Packet::UnsubAck(UnsubAck {
                pkid: u.pkid,
                reasons,
                properties: None,
            }));
        }
        Packet::PingReq(_) => {
            client.send(Packet::PingResp(PingResp));
        }
        Packet::Disconnect(d) => {
            if let Some(secs) = d.properties.and_then(|p| p.session_expiry_interval) {
                let mut st = client.session.state.lock();
                if st.expiry_secs == 0 && secs != 0 {
                    return Err(Error::Protocol(
                        "session expiry set at DISCONNECT after 0 at CONNECT".into(),
                    ));
                }
                let max = u32::try_from(shared.max_session_expiry.as_secs()).unwrap_or(u32::MAX);
                st.expiry_secs = secs.min(max);
            }
            // Only a normal disconnection (0x00) deletes the will.
            if d.reason_code == DisconnectReasonCode::NormalDisconnection {
                client.will = None;
            }
            return Ok(true);
        }
        Packet::Connect(..) => return Err(Error::Protocol("second CONNECT".into())),
        Packet::Auth(_) => return Err(Error::Protocol("AUTH is not supported".into())),
        other => {
            return Err(Error::Protocol(format!(
                "a client may not send {:?}",
                std::mem::discriminant(&other)
            )));
        }
    }
    Ok(false)
}

pub(super) fn on_publish(
    shared: &Arc<BrokerState>,
    client: &mut Client,
    mut p: Publish,
    pending: &mut FuturesOrdered<Ack>,
) -> Result<()> {
    shared.metrics.messages_in.fetch_add(1, Ordering::Relaxed);
    // The receive maximum counts QoS 1 publishes until their PUBACK and QoS 2 ones until
    // their PUBCOMP (MQTT 5 §4.9); a resent QoS 2 publish still awaiting its PUBREL is
    // already counted. 3.1.1 clients are held back by not reading instead.
    let resent =
        p.qos == QoS::ExactlyOnce && (client.session.state.lock().incoming_qos2).contains(&p.pkid);
    if p.qos != QoS::AtMostOnce && !resent {
        let max = shared.config.receive_maximum;
        if client.version == Version::V5 && client.unacked >= usize::from(max) {
            return Err(Error::ReceiveMaximum(max));
        }
        client.unacked += 1;
    }
    let mut props = p.properties.take();
    let topic: Arc<str> = match props.as_mut().and_then(|pr| pr.topic_alias.take()) {
        Some(alias) => {
            if alias == 0 || alias > shared.config.topic_alias_maximum {
                return Err(Error::TopicAlias(format!("alias {alias}")));
            }
            if p.topic.is_empty() {
                client
                    .aliases
                    .get(&alias)
                    .cloned()
                    .ok_or_else(|| Error::TopicAlias(format!("alias {alias} was never set")))?
            } else {
                let t: Arc<str> = Arc::from(utf8_topic(&p.topic)?);
                client.aliases.insert(alias, t.clone());
                t
            }
        }
        None => Arc::from(utf8_topic(&p.topic)?),
    };
    if !topic::valid_name(&topic) {
        return Err(Error::Protocol(format!("invalid topic name {topic:?}")));
    }
    let fresh_qos2 = p.qos == QoS::ExactlyOnce && {
        let mut st = client.session.state.lock();
        let fresh = st.incoming_qos2.insert(p.pkid);
        if fresh && st.expiry_secs > 0 {
            // Not in a snapshot until its message's record is durable.
            st.unlogged_qos2.insert(p.pkid);
        }
        fresh
    };
    if p.qos == QoS::ExactlyOnce && !fresh_qos2 {
        // A resent QoS 2 message already stored: acknowledge again, store nothing.
        let pkid = p.pkid;
        pending.push_back(Box::pin(async move {
            let rec = Packet::PubRec(PubRec {
                pkid,
                reason: PubRecReason::Success,
                properties: None,
            });
            (Some(rec), None)
        }));
        return Ok(());
    }
    if props
        .as_ref()
        .is_some_and(|pr| !pr.subscription_identifiers.is_empty())
    {
        return Err(Error::Protocol(
            "a PUBLISH from a client may not carry subscription identifiers".into(),
        ));
    }
    let expires = props
        .as_ref()
        .and_then(|pr| pr.message_expiry_interval)
        .map(|s| Instant::now() + Duration::from_secs(u64::from(s)));
    let message = Arc::new(Message {
        id: Default::default(),
        sent_to: Default::default(),
        topic,
        payload: p.payload,
        qos: p.qos,
        retain: p.retain,
        properties: props,
        expires,
        origin: client.id.clone(),
    });
    let (qos, pkid, version) = (p.qos, p.pkid, client.version);
    let problem_info = client.problem_info;
    let shared = shared.clone();
    let session = client.session.clone();
    let started = Instant::now();
    let user = client.user.clone();
    // Queued for other nodes now, so in the order this client sent it.
    let (relaying, elsewhere) = crate::ingest::relay(&shared, &message);
    // A client with nothing in flight that last heard from us long ago (a device publishing
    // now and then, not one sending as soon as it is acknowledged) is in no hurry: its
    // message's group commit may wait a little for others' (`wal.max_commit_delay`).
    let patient = pending.is_empty()
        && started.saturating_duration_since(client.quiet_since) >= super::PATIENT_AFTER;
    // Its future is boxed for the pending queue: rare paths inside it are boxed in turn
    // (Sparkplug, refusals, line protocol), so that this one stays small (680 bytes).
    let stored = async move {
        // A lasting session's QoS 2 packet id is kept in the journal until its PUBREL.
        let incoming = (qos == QoS::ExactlyOnce && session.lasting())
            .then(|| (session.client_id.clone(), pkid));
        let serves = Groups::Except(&elsewhere);
        let (journal, targets) =
            crate::ingest::plan(&shared, &message, incoming, None, serves).await;
        let logged = journal.is_some();
        let (reason, text) =
            crate::ingest::store_rows(&shared, &message, user.as_deref(), journal).await;
        let failed = error::reason_code(reason) >= 0x80;
        // Acknowledged once the other nodes it goes to have it too.
        relaying.go(!failed).await;
        shared.metrics.observe_ack(started.elapsed());
        let text = text.filter(|_| problem_info);
        let properties = (version == Version::V5 && text.is_some()).then(|| PubAckProperties {
            reason_string: text,
            user_properties: Vec::new(),
        });
        let ack = match qos {
            QoS::AtMostOnce => None,
            QoS::AtLeastOnce => Some(Packet::PubAck(PubAck {
                pkid,
                reason,
                properties,
            })),
            QoS::ExactlyOnce => {
                if failed {
                    let mut st = session.state.lock();
                    st.incoming_qos2.remove(&pkid);
                    st.unlogged_qos2.remove(&pkid);
                }
                Some(Packet::PubRec(PubRec {
                    pkid,
                    reason: pubrec_reason(reason),
                    properties: properties.map(|p| PubRecProperties {
                        reason_string: p.reason_string,
                        user_properties: p.user_properties,
                    }),
                }))
            }
        };
        (ack, (!failed).then_some((message, targets, logged)))
    };
    match patient {
        true => pending.push_back(Box::pin(sluice_engine::patiently(stored))),
        false => pending.push_back(Box::pin(stored)),
    }
    Ok(())
}

fn utf8_topic(b: &Bytes) -> Result<&str> {
    std::str::from_utf8(b).map_err(|_| Error::Malformed("topic is not UTF-8".into()))
}

fn pubrec_reason(r: PubAckReason) -> PubRecReason {
    match r {
        PubAckReason::Success => PubRecReason::Success,
        PubAckReason::NoMatchingSubscribers => PubRecReason::NoMatchingSubscribers,
        PubAckReason::UnspecifiedError => PubRecReason::UnspecifiedError,
        PubAckReason::ImplementationSpecificError => PubRecReason::ImplementationSpecificError,
        PubAckReason::NotAuthorized => PubRecReason::NotAuthorized,
        PubAckReason::TopicNameInvalid => PubRecReason::TopicNameInvalid,
        PubAckReason::PacketIdentifierInUse => PubRecReason::PacketIdentifierInUse,
        PubAckReason::QuotaExceeded => PubRecReason::QuotaExceeded,
        PubAckReason::PayloadFormatInvalid => PubRecReason::PayloadFormatInvalid,
    }
}

async fn on_subscribe(shared: &Arc<BrokerState>, client: &mut Client, s: Subscribe) -> Result<()> {
    let id = s.properties.as_ref().and_then(|p| p.id);
    if id == Some(0) {
        return Err(Error::Protocol("subscription identifier 0".into()));
    }
    let mut codes = Vec::with_capacity(s.filters.len());
    let mut retained = Vec::new();
    for f in &s.filters {
        let shared_sub = topic::parse_shared(&f.path);
        let plain = shared_sub.map(|(_, f)| f).unwrap_or(&f.path);
        let group_ok = shared_sub.is_none_or(|(g, _)| !g.is_empty() && !g.contains(['+', '#']));
        if !topic::valid_filter(plain)
            || !group_ok
            || (f.path.starts_with("$share") && shared_sub.is_none())
        {
            codes.push(SubscribeReasonCode::TopicFilterInvalid);
            continue;
        }
        if shared_sub.is_some() && f.nolocal {
            return Err(Error::Protocol("no local on a shared subscription".into()));
        }
        if (shared.db)
            .authorize(client.user.as_deref(), Need::Subscribe(plain))
            .is_err()
        {
            codes.push(SubscribeReasonCode::NotAuthorized);
            continue;
        }
        let options = SubOptions {
            qos: f.qos,
            no_local: f.nolocal,
            retain_as_published: f.preserve_retain,
            id,
        };
        let existed = (client.session.state.lock().subscriptions).contains_key(&f.path);
        let send_retained = shared_sub.is_none()
            && match f.retain_forward_rule {
                RetainForwardRule::OnEverySubscribe => true,
                RetainForwardRule::OnNewSubscribe => !existed,
                RetainForwardRule::Never => false,
            };
        // A lasting session's subscription is in the journal before its SUBACK, and takes
        // effect as it is logged (so messages logged after it are queued for it on replay),
        // its retained messages queued with it (and again on replay, less those acked).
        if shared.db.journals() && client.session.lasting() {
            let record = Record::Subscribe {
                client: client.id.clone(),
                filter: f.path.clone(),
                options: options.clone(),
                retained: send_retained,
            };
            let (state, session, filter) = (shared.clone(), client.session.clone(), f.path.clone());
            let opts = options.clone();
            let then: sluice_engine::Then = Box::new(move |_| {
                // Not for a session taken over meanwhile (its replacement starts afresh).
                if state.router.is_current(&session) {
                    state.router.subscribe_with_retained(
                        &session,
                        &filter,
                        opts,
                        (send_retained, false),
                        state.db.as_ref(),
                    );
                }
            });
            shared
                .db
                .journal(vec![journal::entry(&record, Some(then))], true)
                .await?;
        } else {
            // Retained messages still being logged are kept first (their PUBLISH was read
            // before this SUBSCRIBE, on another connection perhaps).
            if send_retained && shared.db.journals() && shared.router.is_retaining() {
                let barrier = journal::entry(&Record::Barrier, None);
                shared.db.journal(vec![barrier], true).await?;
            }
            shared
                .router
                .subscribe(&client.session, &f.path, options.clone());
            if send_retained {
                let auth = shared.db.as_ref();
                retained.extend(
                    shared
                        .router
                        .retained_for(&client.session, plain, &options, auth),
                );
            }
        }
        if send_retained {
            let rows = crate::latest::retained_rows(shared, &client.session, plain, &options);
            retained.extend(rows.await);
        }
        codes.push(SubscribeReasonCode::Success(f.qos));
    }
    // What another node publishes after the SUBACK must reach it.
    if let Some(r) = shared.router.remote() {
        r.known().await;
    }
    client.send(Packet::SubAck(SubAck {
        pkid: s.pkid,
        return_codes: codes,
        properties: None,
    }));
    for d in retained {
        client.session.enqueue(d, false).await;
    }
    Ok(())
}
