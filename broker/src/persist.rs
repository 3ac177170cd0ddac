//! Snapshots of sessions and retained messages.
//!
//! The router's lasting state (sessions that outlive their connection: subscriptions, queued
//! and unacknowledged messages, QoS 2 packet ids; retained messages) is in the journal
//! (`journal`); a snapshot of it, taken at a checkpoint and so exactly the log up to its
//! LSN, is written to `<data_dir>/broker/state.json` every few seconds and at shutdown,
//! atomically (temporary file, fsync, rename). A start loads it and replays the journal
//! records after its LSN; the WAL keeps those records until a newer snapshot covers them.

use crate::router::Router;
use crate::session::{Delivery, Message, MessageId, Outgoing, SubOptions};
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::mqttbytes::v5::PublishProperties;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

const FORMAT: u32 = 1;

#[derive(Serialize, Deserialize, Default)]
pub(crate) struct State {
    format: u32,
    /// The LSN of the last journal record the snapshot holds (0: none).
    #[serde(default)]
    lsn: u64,
    sessions: Vec<SessionState>,
    retained: Vec<StoredMessage>,
    /// The messages in the journal that sessions hold, once each, by LSN.
    #[serde(default)]
    messages: Vec<(u64, StoredMessage)>,
    /// Relayed messages logged, per sending node: (node, its run, last number).
    #[serde(default)]
    relayed: Vec<(u64, u64, u64)>,
}

/// Messages by LSN: saved once however many sessions hold them, and shared again when
/// loaded.
pub(crate) type ByLsn = std::collections::BTreeMap<u64, StoredMessage>;

#[derive(Serialize, Deserialize)]
pub(crate) struct SessionState {
    pub(crate) id: String,
    /// Who logged in on its last connection: deliveries to it are checked against the ACL
    /// as that user, also after a restart.
    #[serde(default)]
    pub(crate) user: Option<String>,
    pub(crate) expiry_secs: u32,
    pub(crate) subscriptions: Vec<StoredSub>,
    pub(crate) queue: Vec<StoredDelivery>,
    /// Sent and not yet fully acknowledged: resent (DUP) when the client returns.
    pub(crate) inflight: Vec<(u16, Option<StoredDelivery>)>,
    /// The LSNs of the messages of `inflight` that were released (PUBREC received).
    #[serde(default)]
    pub(crate) released: Vec<(u16, u64)>,
    pub(crate) incoming_qos2: Vec<u16>,
    /// The will of its connection and its delay in seconds, until published or dropped by
    /// a normal DISCONNECT.
    #[serde(default)]
    pub(crate) will: Option<(StoredMessage, u32)>,
    /// What it took from other nodes' standby copies of it: (node, LSN).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) standby: Vec<(u64, u64)>,
    /// What it took of what the nodes kept for nodes that did not answer: per such node,
    /// the last number taken of each (node, run) (`session::State::note_pulled`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) pulled: crate::session::PulledMarks,
}

#[derive(Serialize, Deserialize)]
pub(crate) struct StoredSub {
    pub(crate) filter: String,
    pub(crate) qos: u8,
    pub(crate) no_local: bool,
    pub(crate) retain_as_published: bool,
    pub(crate) id: Option<usize>,
}

#[derive(Serialize, Deserialize)]
pub(crate) struct StoredDelivery {
    /// The message, when it is not in the journal (else it is in [`State`]'s `messages`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    message: Option<StoredMessage>,
    qos: u8,
    retain: bool,
    subscription_ids: Vec<usize>,
    /// The message's LSN in the journal (0: not in it).
    #[serde(default)]
    lsn: u64,
}

#[derive(Serialize, Deserialize)]
pub(crate) struct StoredMessage {
    topic: String,
    payload_hex: String,
    qos: u8,
    retain: bool,
    origin: String,
    /// Seconds left before it expires, when it has an expiry.
    expires_in: Option<u64>,
    content_type: Option<String>,
    response_topic: Option<String>,
    correlation_hex: Option<String>,
    payload_format_indicator: Option<u8>,
    user_properties: Vec<(String, String)>,
    /// A retained message's LSN in the journal (0: not in it).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub(crate) lsn: u64,
    /// Its identity across a cluster's nodes (`session::MessageId`): node, run, number.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    id: Option<(u64, u64, u64)>,
    /// The other nodes that node relayed it to (`Message::sent_to`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    sent_to: Vec<u64>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

fn qos(n: u8) -> QoS {
    match n {
        2 => QoS::ExactlyOnce,
        1 => QoS::AtLeastOnce,
        _ => QoS::AtMostOnce,
    }
}

impl StoredMessage {
    pub(crate) fn from(m: &Message) -> Self {
        let p = m.properties.as_ref();
        Self {
            topic: m.topic.to_string(),
            payload_hex: sluice_engine::hex::encode(&m.payload),
            qos: m.qos as u8,
            retain: m.retain,
            origin: m.origin.to_string(),
            expires_in: m
                .expires
                .map(|e| e.saturating_duration_since(Instant::now()).as_secs()),
            content_type: p.and_then(|p| p.content_type.clone()),
            response_topic: p.and_then(|p| p.response_topic.clone()),
            correlation_hex: p.and_then(|p| {
                p.correlation_data
                    .as_ref()
                    .map(|c| sluice_engine::hex::encode(c))
            }),
            payload_format_indicator: p.and_then(|p| p.payload_format_indicator),
            user_properties: p.map(|p| p.user_properties.clone()).unwrap_or_default(),
            lsn: 0,
            id: m.id.get().map(|id| (id.node, id.run, id.seq)),
            sent_to: m.sent_to.get().map(|t| t.to_vec()).unwrap_or_default(),
        }
    }

    /// With the LSN of its journal record.
    pub(crate) fn at(mut self, lsn: u64) -> Self {
        self.lsn = lsn;
        self
    }

    pub(crate) fn into_message(self) -> Arc<Message> {
        let has_props = self.content_type.is_some()
            || self.response_topic.is_some()
            || self.correlation_hex.is_some()
            || self.payload_format_indicator.is_some()
            || !self.user_properties.is_empty();
        Arc::new(Message {
            sent_to: match self.id {
                Some(_) => Arc::<[u64]>::from(self.sent_to).into(),
                None => Default::default(),
            },
            id: (self.id)
                .map(|(node, run, seq)| MessageId { node, run, seq }.into())
                .unwrap_or_default(),
            topic: Arc::from(self.topic),
            payload: sluice_engine::hex::decode(&self.payload_hex).into(),
            qos: qos(self.qos),
            retain: self.retain,
            properties: has_props.then(|| PublishProperties {
                payload_format_indicator: self.payload_format_indicator,
                message_expiry_interval: None,
                topic_alias: None,
                response_topic: self.response_topic,
                correlation_data: self
                    .correlation_hex
                    .map(|h| sluice_engine::hex::decode(&h).into()),
                user_properties: self.user_properties,
                subscription_identifiers: Vec::new(),
                content_type: self.content_type,
            }),
            expires: self
                .expires_in
                .and_then(|s| Instant::now().checked_add(Duration::from_secs(s))),
            origin: Arc::from(self.origin),
        })
    }
}

impl StoredDelivery {
    pub(crate) fn from(d: &Delivery, messages: &mut ByLsn) -> Self {
        let message = match d.lsn {
            0 => Some(StoredMessage::from(&d.message)),
            lsn => {
                (messages.entry(lsn)).or_insert_with(|| StoredMessage::from(&d.message));
                None
            }
        };
        Self {
            message,
            qos: d.qos as u8,
            retain: d.retain,
            subscription_ids: d.subscription_ids.clone(),
            lsn: d.lsn,
        }
    }

    /// The delivery; `None` if its message is missing (a damaged snapshot).
    pub(crate) fn into_delivery(
        self,
        messages: &std::collections::HashMap<u64, Arc<Message>>,
    ) -> Option<Delivery> {
        let message = match self.message {
            Some(m) => m.into_message(),
            None => messages.get(&self.lsn)?.clone(),
        };
        Some(Delivery {
            message,
            qos: qos(self.qos),
            retain: self.retain,
            subscription_ids: self.subscription_ids,
            lsn: self.lsn,
        })
    }
}

impl StoredSub {
    pub(crate) fn from(filter: &str, o: &SubOptions) -> Self {
        Self {
            filter: filter.to_string(),
            qos: o.qos as u8,
            no_local: o.no_local,
            retain_as_published: o.retain_as_published,
            id: o.id,
        }
    }

    pub(crate) fn options(&self) -> SubOptions {
        SubOptions {
            qos: qos(self.qos),
            no_local: self.no_local,
            retain_as_published: self.retain_as_published,
            id: self.id,
        }
    }
}

pub(crate) fn outgoing(o: &Outgoing, messages: &mut ByLsn) -> Option<StoredDelivery> {
    match o {
        Outgoing::Published(d) => Some(StoredDelivery::from(d, messages)),
        Outgoing::Released(_) => None,
    }
}

/// Where the state lives.
#[derive(Debug, Clone)]
pub(crate) struct Store {
    path: PathBuf,
}

impl Store {
    pub(crate) fn new(data_dir: &Path) -> Self {
        Self {
            path: data_dir.join("broker").join("state.json"),
        }
    }

    /// Loads the saved state into `router`; returns the LSN it covers. A missing file is an
    /// empty state, a damaged one is reported and set aside (renamed) rather than stopping
    /// the server.
    pub(crate) fn load(&self, router: &Router) -> u64 {
        match sluice_engine::read_state::<State>(&self.path, "broker state") {
            None => 0,
            Some(state) => {
                let (s, r) = (state.sessions.len(), state.retained.len());
                match restore(router, state) {
                    Ok(lsn) => {
                        tracing::info!(sessions = s, retained = r, lsn, "broker snapshot loaded");
                        lsn
                    }
                    Err(format) => {
                        tracing::error!(format, path = %self.path.display(), "unknown broker state format; starting without it");
                        0
                    }
                }
            }
        }
    }

    /// Writes the router's state atomically, as of a checkpoint of `db`'s log; returns the
    /// LSN it covers, or `None` when that is `unless` (nothing changed since that snapshot).
    pub(crate) fn save(
        &self,
        router: &Router,
        db: &dyn sluice_engine::IngestPort,
        unless: Option<u64>,
    ) -> std::io::Result<Option<u64>> {
        let Some((lsn, state)) = capture(router, db, unless, &mut || {}) else {
            return Ok(None);
        };
        let text = serde_json::to_vec(&state).map_err(std::io::Error::other)?;
        sluice_engine::replace_file(&self.path, &text)?;
        Ok(Some(lsn))
    }
}

/// The router's lasting state as of a checkpoint of `db`'s log (`also` runs at it, while
/// nothing commits), with the checkpoint's LSN; `None` when that is `unless` (nothing
/// changed since that snapshot).
pub(crate) fn capture(
    router: &Router,
    db: &dyn sluice_engine::IngestPort,
    unless: Option<u64>,
    also: &mut dyn FnMut(),
) -> Option<(u64, State)> {
    let mut taken = None;
    db.journal_checkpoint(&mut |lsn| {
        if unless != Some(lsn) {
            also();
            taken = Some((lsn, router.lasting_copy(), router.relayed_marks()));
        }
    });
    let (lsn, copy, relayed) = taken?;
    let (sessions, retained, messages) = Router::lasting_state(copy);
    let state = State {
        format: FORMAT,
        lsn,
        sessions,
        retained,
        messages: messages.into_iter().collect(),
        relayed,
    };
    Some((lsn, state))
}

/// Loads a saved state into `router`; the LSN it covers, or its format when unknown.
pub(crate) fn restore(router: &Router, state: State) -> Result<u64, u32> {
    if state.format != FORMAT {
        return Err(state.format);
    }
    router.restore(state.sessions, state.retained, state.messages);
    for (from, incarnation, last) in state.relayed {
        router.relayed(from, incarnation, last);
    }
    Ok(state.lsn)
}
