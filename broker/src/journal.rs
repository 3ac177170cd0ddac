//! The broker's records in the engine's log (journal records, WAL kind 3).
//!
//! Every change to a session that outlives its connection, and every message such a session
//! must receive or that is retained, is a record in the same log as the rows: a QoS 1/2
//! PUBLISH is acknowledged only once its rows **and** its record are durable (one group
//! commit), a SUBACK once the subscription's record is, a CONNACK once the session's. A
//! message is logged once, however many sessions wait for it: a session's queue is the
//! LSNs of the messages it has not acknowledged, and its records (sent with a packet id,
//! PUBREC received, acknowledged) name messages by LSN, as Kafka keeps consumer offsets.
//!
//! Records that change the router's state are applied by the log itself, in LSN order,
//! before any appender is answered ([`sluice_engine::Journal`]): so a snapshot taken at a
//! checkpoint (`persist`) is exactly the log up to its LSN, and a start applies the
//! snapshot and then the records after it ([`crate::router::Router::replay`]). Records of
//! what a connection did (sent, acknowledged) are applied before they are logged; replaying
//! them again is harmless (they name messages by LSN, and each sets a state).
//!
//! Format: a version byte, a tag byte, then the fields in order; integers little-endian,
//! strings and byte strings as a u32 length and the bytes, options as a 0/1 byte first.

use crate::session::{Message, MessageId, SubOptions};
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::mqttbytes::v5::PublishProperties;
use std::sync::Arc;
use std::time::{Duration, Instant};

const VERSION: u8 = 1;

/// One broker record.
#[derive(Debug, Clone)]
pub(crate) enum Record {
    /// A connection attached to a session: `fresh` when it starts with no state (a new
    /// session, or clean start), with the will published if the connection is lost.
    Open {
        client: Arc<str>,
        user: Option<Arc<str>>,
        expiry: u32,
        fresh: bool,
        will: Option<(Arc<Message>, u32)>,
    },
    /// The connection ended: the session's expiry from now (0 ends it), and whether its will
    /// is still to be published (after its delay).
    Close {
        client: Arc<str>,
        expiry: u32,
        will_pending: bool,
    },
    /// The session expired or was discarded.
    End {
        client: Arc<str>,
    },
    /// A subscription; `retained`: the retained messages matching it were queued with it.
    Subscribe {
        client: Arc<str>,
        filter: String,
        options: SubOptions,
        retained: bool,
    },
    Unsubscribe {
        client: Arc<str>,
        filter: String,
    },
    /// A message: retained, and queued for the sessions whose subscriptions match it (for a
    /// shared subscription, the members in `chosen`); `incoming` is the publisher's QoS 2
    /// packet id, kept until its PUBREL; `will_of` the session whose will it is.
    Message {
        message: Arc<Message>,
        chosen: Vec<Arc<str>>,
        incoming: Option<(Arc<str>, u16)>,
        will_of: Option<Arc<str>>,
    },
    /// Messages (by LSN) sent to the client with these packet ids.
    Sent {
        client: Arc<str>,
        items: Vec<(u64, u16)>,
    },
    /// PUBREC of the message at `lsn`, sent with `pkid`, received (its PUBREL is being
    /// sent).
    Received {
        client: Arc<str>,
        lsn: u64,
        pkid: u16,
    },
    /// Messages (by LSN) the client acknowledged (PUBACK, PUBCOMP).
    Acked {
        client: Arc<str>,
        lsns: Vec<u64>,
    },
    /// The client's PUBREL of its QoS 2 packet id `pkid`.
    Released {
        client: Arc<str>,
        pkid: u16,
    },
    /// Relayed messages from node `from` (its run `incarnation`) up to number `last` are
    /// logged here: a copy sent again after a restart is not delivered twice.
    Relayed {
        from: u64,
        incarnation: u64,
        last: u64,
    },
    /// A message queued for one session: what it held on another node, which handed it
    /// over when the client connected here.
    /// `sent`: the other node had sent it under this packet id, not acknowledged (it is
    /// sent again under the same id, DUP set).
    Queued {
        client: Arc<str>,
        qos: QoS,
        retain: bool,
        ids: Vec<usize>,
        message: Arc<Message>,
        sent: Option<u16>,
    },
    /// The client's PUBREC of the QoS 2 message it got under `pkid` from another node, which
    /// handed the session over before its PUBCOMP (the PUBREL is sent from here).
    Releasing {
        client: Arc<str>,
        pkid: u16,
    },
    /// Nothing to apply: logged so that its `then` runs after every record queued before it
    /// (a new subscription waits this way for retained messages still being logged).
    Barrier,
    /// The session took what node `node`'s standby copy of it held, which was that node's
    /// journal up to `lsn` (`crate::standby`): should that node come back, it gives only
    /// what it logged after.
    Standby {
        client: Arc<str>,
        node: u64,
        lsn: u64,
    },
    /// The session took, of what the nodes kept for node `node` (which did not answer), the
    /// messages of each (node, run) up to its number (`crate::session::State::note_pulled`):
    /// should `node` give them too, they are left out, wherever the session is by then.
    Pulled {
        client: Arc<str>,
        node: u64,
        marks: Vec<((u64, u64), u64)>,
    },
    /// Only in a hand-over, first: the session handed over was a restarted node's copy
    /// that its client had left (withdrawn, in its grace period), not where it lives.
    Withdrawn {
        client: Arc<str>,
    },
}

impl Record {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut o = Out(Vec::with_capacity(64));
        o.u8(VERSION);
        match self {
            Record::Open {
                client,
                user,
                expiry,
                fresh,
                will,
            } => {
                o.u8(1);
                o.str(client);
                o.opt(user.as_deref(), |o, u| o.str(u));
                o.u32(*expiry);
                o.u8(u8::from(*fresh));
                o.opt(will.as_ref(), |o, (m, delay)| {
                    message(o, m);
                    o.u32(*delay);
                });
            }
            Record::Close {
                client,
                expiry,
                will_pending,
            } => {
                o.u8(2);
                o.str(client);
                o.u32(*expiry);
                o.u8(u8::from(*will_pending));
            }
            Record::End { client } => {
                o.u8(3);
                o.str(client);
            }
            Record::Subscribe {
                client,
                filter,
                options,
                retained,
            } => {
                o.u8(4);
                o.str(client);
                o.str(filter);
                o.u8(options.qos as u8);
                o.u8(u8::from(options.no_local)
                    | (u8::from(options.retain_as_published) << 1)
                    | (u8::from(*retained) << 2));
                o.opt(options.id, |o, id| o.u64(id as u64));
            }
            Record::Unsubscribe { client, filter } => {
                o.u8(5);
                o.str(client);
                o.str(filter);
            }
            Record::Message {
                message: m,
                chosen,
                incoming,
                will_of,
            } => {
                o.u8(6);
                message(&mut o, m);
                o.u32(chosen.len() as u32);
                for c in chosen {
                    o.str(c);
                }
                o.opt(incoming.as_ref(), |o, (c, pkid)| {
                    o.str(c);
                    o.u16(*pkid);
                });
                o.opt(will_of.as_deref(), |o, c| o.str(c));
            }
            Record::Sent { client, items } => {
                o.u8(7);
                o.str(client);
                o.u32(items.len() as u32);
                for (lsn, pkid) in items {
                    o.u64(*lsn);
                    o.u16(*pkid);
                }
            }
            Record::Received { client, lsn, pkid } => {
                o.u8(8);
                o.str(client);
                o.u64(*lsn);
                o.u16(*pkid);
            }
            Record::Acked { client, lsns } => {
                o.u8(9);
                o.str(client);
                o.u32(lsns.len() as u32);
                for lsn in lsns {
                    o.u64(*lsn);
                }
            }
            Record::Released { client, pkid } => {
                o.u8(10);
                o.str(client);
                o.u16(*pkid);
            }
            Record::Relayed {
                from,
                incarnation,
                last,
            } => {
                o.u8(12);
                o.u64(*from);
                o.u64(*incarnation);
                o.u64(*last);
            }
            Record::Queued {
                client,
                qos,
                retain,
                ids,
                message: m,
                sent,
            } => {
                o.u8(11);
                o.str(client);
                o.u8(*qos as u8 | (u8::from(*retain) << 2) | (u8::from(sent.is_some()) << 3));
                if let Some(pkid) = sent {
                    o.u16(*pkid);
                }
                o.u32(ids.len() as u32);
                for id in ids {
                    o.u64(*id as u64);
                }
                message(&mut o, m);
            }
            Record::Barrier => o.u8(13),
            Record::Releasing { client, pkid } => {
                o.u8(14);
                o.str(client);
                o.u16(*pkid);
            }
            Record::Standby { client, node, lsn } => {
                o.u8(15);
                o.str(client);
                o.u64(*node);
                o.u64(*lsn);
            }
            Record::Pulled {
                client,
                node,
                marks,
            } => {
                o.u8(16);
                o.str(client);
                o.u64(*node);
                o.u32(marks.len() as u32);
                for ((from, run), seq) in marks {
                    o.u64(*from);
                    o.u64(*run);
                    o.u64(*seq);
                }
            }
            Record::Withdrawn { client } => {
                o.u8(17);
                o.str(client);
            }
        }
        o.0
    }

    /// Decodes a record; `None` if it is not one this version wrote.
    pub(crate) fn decode(buf: &[u8]) -> Option<Self> {
        let mut i = In(buf);
        if i.u8()? != VERSION {
            return None;
        }
        let r = match i.u8()? {
            1 => Record::Open {
                client: i.arc()?,
                user: i.opt(|i| i.arc())?,
                expiry: i.u32()?,
                fresh: i.u8()? != 0,
                will: i.opt(|i| Some((read_message(i)?, i.u32()?)))?,
            },
            2 => Record::Close {
                client: i.arc()?,
                expiry: i.u32()?,
                will_pending: i.u8()? != 0,
            },
            3 => Record::End { client: i.arc()? },
            4 => {
                let client = i.arc()?;
                let filter = i.str()?.to_string();
                let qos = qos(i.u8()?);
                let flags = i.u8()?;
                let id = i.opt(|i| i.u64().map(|v| v as usize))?;
                Record::Subscribe {
                    client,
                    filter,
                    options: SubOptions {
                        qos,
                        no_local: flags & 1 != 0,
                        retain_as_published: flags & 2 != 0,
                        id,
                    },
                    retained: flags & 4 != 0,
                }
            }
            5 => Record::Unsubscribe {
                client: i.arc()?,
                filter: i.str()?.to_string(),
            },
            6 => {
                let message = read_message(&mut i)?;
                let n = i.u32()? as usize;
                let chosen = (0..n).map(|_| i.arc()).collect::<Option<Vec<_>>>()?;
                Record::Message {
                    message,
                    chosen,
                    incoming: i.opt(|i| Some((i.arc()?, i.u16()?)))?,
                    will_of: i.opt(|i| i.arc())?,
                }
            }
            7 => {
                let client = i.arc()?;
                let n = i.u32()? as usize;
                let items = (0..n)
                    .map(|_| Some((i.u64()?, i.u16()?)))
                    .collect::<Option<Vec<_>>>()?;
                Record::Sent { client, items }
            }
            8 => Record::Received {
                client: i.arc()?,
                lsn: i.u64()?,
                pkid: i.u16()?,
            },
            9 => {
                let client = i.arc()?;
                let n = i.u32()? as usize;
                let lsns = (0..n).map(|_| i.u64()).collect::<Option<Vec<_>>>()?;
                Record::Acked { client, lsns }
            }
            10 => Record::Released {
                client: i.arc()?,
                pkid: i.u16()?,
            },
            12 => Record::Relayed {
                from: i.u64()?,
                incarnation: i.u64()?,
                last: i.u64()?,
            },
            11 => {
                let client = i.arc()?;
                let flags = i.u8()?;
                let sent = match flags & 8 != 0 {
                    true => Some(i.u16()?),
                    false => None,
                };
                let n = i.u32()? as usize;
                let ids = (0..n)
                    .map(|_| i.u64().map(|v| v as usize))
                    .collect::<Option<Vec<_>>>()?;
                Record::Queued {
                    client,
                    qos: qos(flags & 3),
                    retain: flags & 4 != 0,
                    ids,
                    message: read_message(&mut i)?,
                    sent,
                }
            }
            13 => Record::Barrier,
            14 => Record::Releasing {
                client: i.arc()?,
                pkid: i.u16()?,
            },
            15 => Record::Standby {
                client: i.arc()?,
                node: i.u64()?,
                lsn: i.u64()?,
            },
            16 => {
                let client = i.arc()?;
                let node = i.u64()?;
                let n = i.u32()? as usize;
                let marks = (0..n)
                    .map(|_| Some(((i.u64()?, i.u64()?), i.u64()?)))
                    .collect::<Option<Vec<_>>>()?;
                Record::Pulled {
                    client,
                    node,
                    marks,
                }
            }
            17 => Record::Withdrawn { client: i.arc()? },
            _ => return None,
        };
        i.0.is_empty().then_some(r)
    }
}

/// The engine's journal entry for `record`, applied by `then` once committed.
pub(crate) fn entry(record: &Record, then: Option<sluice_engine::Then>) -> sluice_engine::Journal {
    sluice_engine::Journal {
        bytes: record.encode(),
        then,
    }
}

/// A message relayed to another node (`crate::router::remote`): the message, then the
/// shared groups whose member that node chooses, as (group, filter).
/// Without its id (`with_id` false) for a node of a version that does not read it.
pub(crate) fn relayed(
    m: &Message,
    groups: &[crate::router::remote::Group],
    with_id: bool,
) -> bytes::Bytes {
    let mut o = Out(Vec::with_capacity(64 + m.topic.len() + m.payload.len()));
    o.u8(VERSION);
    message_with(&mut o, m, with_id);
    o.u32(groups.len() as u32);
    for (g, f) in groups {
        o.str(g);
        o.str(f);
    }
    o.0.into()
}

/// A message another node relayed ([`relayed`]); `None` when it does not decode.
pub(crate) fn read_relayed(b: &[u8]) -> Option<(Arc<Message>, Vec<crate::router::remote::Group>)> {
    let mut i = In(b);
    if i.u8()? != VERSION {
        return None;
    }
    let m = read_message(&mut i)?;
    let n = i.u32()? as usize;
    let groups = (0..n)
        .map(|_| Some((i.arc()?, i.arc()?)))
        .collect::<Option<Vec<_>>>()?;
    i.0.is_empty().then_some((m, groups))
}

pub(crate) fn qos(n: u8) -> QoS {
    match n {
        2 => QoS::ExactlyOnce,
        1 => QoS::AtLeastOnce,
        _ => QoS::AtMostOnce,
    }
}

/// A message's expiry as wall-clock microseconds (0: none).
fn expires_at(m: &Message) -> i64 {
    m.expires.map_or(0, |e| {
        let left = e.saturating_duration_since(Instant::now());
        sluice_engine::now_micros() + left.as_micros() as i64
    })
}

fn message(o: &mut Out, m: &Message) {
    message_with(o, m, true);
}

fn message_with(o: &mut Out, m: &Message, with_id: bool) {
    o.str(&m.topic);
    o.bytes(&m.payload);
    let id = m.id.get().filter(|_| with_id);
    o.u8(m.qos as u8 | (u8::from(m.retain) << 2) | (u8::from(id.is_some()) << 3));
    o.str(&m.origin);
    o.u64(expires_at(m) as u64);
    o.opt(m.properties.as_ref(), |o, p| {
        o.opt(p.payload_format_indicator, |o, v| o.u8(v));
        o.opt(p.content_type.as_deref(), |o, v| o.str(v));
        o.opt(p.response_topic.as_deref(), |o, v| o.str(v));
        o.opt(p.correlation_data.as_deref(), |o, v| o.bytes(v));
        o.u32(p.user_properties.len() as u32);
        for (k, v) in &p.user_properties {
            o.str(k);
            o.str(v);
        }
    });
    if let Some(id) = id {
        o.u64(id.node);
        o.u64(id.run);
        o.u64(id.seq);
        let to = m.sent_to.get().map_or(&[][..], |t| &t[..]);
        o.u32(to.len() as u32);
        for node in to {
            o.u64(*node);
        }
    }
}

fn read_message(i: &mut In) -> Option<Arc<Message>> {
    let topic = i.arc()?;
    let payload = bytes::Bytes::copy_from_slice(i.bytes()?);
    let flags = i.u8()?;
    let origin = i.arc()?;
    let at = i.u64()? as i64;
    let properties = i.opt(|i| {
        let payload_format_indicator = i.opt(|i| i.u8())?;
        let content_type = i.opt(|i| i.str().map(str::to_string))?;
        let response_topic = i.opt(|i| i.str().map(str::to_string))?;
        let correlation_data = i.opt(|i| i.bytes().map(bytes::Bytes::copy_from_slice))?;
        let n = i.u32()? as usize;
        let user_properties = (0..n)
            .map(|_| Some((i.str()?.to_string(), i.str()?.to_string())))
            .collect::<Option<Vec<_>>>()?;
        Some(PublishProperties {
            payload_format_indicator,
            message_expiry_interval: None,
            topic_alias: None,
            response_topic,
            correlation_data,
            user_properties,
            subscription_identifiers: Vec::new(),
            content_type,
        })
    })?;
    // Expired while the server was down: it expires at once.
    let expires = (at != 0).then(|| {
        let left = at.saturating_sub(sluice_engine::now_micros()).max(0);
        Instant::now() + Duration::from_micros(left as u64)
    });
    let (id, sent_to) = match flags & 8 != 0 {
        true => {
            let id = MessageId {
                node: i.u64()?,
                run: i.u64()?,
                seq: i.u64()?,
            };
            let n = i.u32()? as usize;
            let to = (0..n).map(|_| i.u64()).collect::<Option<Arc<[u64]>>>()?;
            (Some(id), Some(to))
        }
        false => (None, None),
    };
    Some(Arc::new(Message {
        id: id.map(std::sync::OnceLock::from).unwrap_or_default(),
        sent_to: sent_to.map(std::sync::OnceLock::from).unwrap_or_default(),
        topic,
        payload,
        qos: qos(flags & 3),
        retain: flags & 4 != 0,
        properties,
        expires,
        origin,
    }))
}

struct Out(Vec<u8>);

impl Out {
    fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    fn u16(&mut self, v: u16) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn bytes(&mut self, v: &[u8]) {
        self.u32(v.len() as u32);
        self.0.extend_from_slice(v);
    }
    fn str(&mut self, v: &str) {
        self.bytes(v.as_bytes());
    }
    fn opt<T>(&mut self, v: Option<T>, f: impl FnOnce(&mut Self, T)) {
        match v {
            None => self.u8(0),
            Some(v) => {
                self.u8(1);
                f(self, v);
            }
        }
    }
}

struct In<'a>(&'a [u8]);

impl<'a> In<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Some(head)
    }
    fn u8(&mut self) -> Option<u8> {
        Some(self.take(1)?[0])
    }
    fn u16(&mut self) -> Option<u16> {
        Some(u16::from_le_bytes(self.take(2)?.try_into().ok()?))
    }
    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }
    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }
    fn bytes(&mut self) -> Option<&'a [u8]> {
        let n = self.u32()? as usize;
        self.take(n)
    }
    fn str(&mut self) -> Option<&'a str> {
        std::str::from_utf8(self.bytes()?).ok()
    }
    fn arc(&mut self) -> Option<Arc<str>> {
        self.str().map(Arc::from)
    }
    fn opt<T>(&mut self, f: impl FnOnce(&mut Self) -> Option<T>) -> Option<Option<T>> {
        match self.u8()? {
            0 => Some(None),
            1 => f(self).map(Some),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests;
