//! A client's session moving between a cluster's nodes. When a client connects, the node
//! it reaches asks the others to end any session of its client id (their connection gets
//! DISCONNECT 0x8E, session taken over); unless the client starts clean, a node that had a
//! lasting session hands over what it held: its subscriptions and the messages queued or
//! in flight, as journal records (`Subscribe`, `Queued`). The new node logs them for its
//! session, applying each as it is logged (as a replay would), before its CONNACK, which
//! then says the session is present. A message the old node had sent but not seen
//! acknowledged is sent again from the new node.

use crate::BrokerState;
use crate::journal::{self, Record};
use crate::session::{Outgoing, Session};
use bytes::{Buf, Bytes};
use std::sync::Arc;

/// On the node a client connects to: the other nodes end their session of `client` and,
/// unless `clean`, hand over what it held; returns those records.
pub(crate) async fn take_over(shared: &BrokerState, client: &Arc<str>, clean: bool) -> Vec<Record> {
    let Some(relay) = shared.db.relay() else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for mut b in relay.take_session(client, clean).await {
        while b.len() >= 4 {
            let len = b.get_u32_le() as usize;
            if b.len() < len {
                break;
            }
            match Record::decode(&b.split_to(len)) {
                // Only what belongs to this client, and only what a hand-over carries.
                Some(r @ (Record::Subscribe { .. } | Record::Queued { .. }))
                    if record_client(&r) == Some(client) =>
                {
                    out.push(r)
                }
                _ => {
                    tracing::warn!(%client, "a handed-over session record that does not decode; skipped")
                }
            }
        }
    }
    out
}

fn record_client(r: &Record) -> Option<&Arc<str>> {
    match r {
        Record::Subscribe { client, .. } | Record::Queued { client, .. } => Some(client),
        _ => None,
    }
}

/// Logs `records` (handed over from another node) for this node's session, each applied to
/// the router as it is logged.
pub(crate) async fn import(
    shared: &Arc<BrokerState>,
    records: Vec<Record>,
) -> sluice_engine::Result<()> {
    let entries = records
        .into_iter()
        .map(|r| {
            let (state, record) = (shared.clone(), r.clone());
            let then: sluice_engine::Then =
                Box::new(move |lsn| state.router.replay(lsn, record, state.db.as_ref()));
            journal::entry(&r, Some(then))
        })
        .collect();
    shared.db.journal(entries, true).await.map(|_| ())
}

/// On the node that has session `client`: ends it (its connection is told it was taken
/// over) and, unless `clean`, returns what a lasting one held.
pub(crate) async fn hand_over(
    shared: Arc<BrokerState>,
    client: String,
    clean: bool,
) -> Option<Bytes> {
    let session = shared.router.session(&client)?;
    if let Some((_, token)) = session.connection.lock().take() {
        token.cancel();
    }
    let lasting = session.lasting();
    let held = (!clean && lasting).then(|| export(&session));
    shared.router.discard(&session);
    if lasting && shared.db.journals() {
        let record = Record::End {
            client: session.client_id.clone(),
        };
        if let Err(e) = shared
            .db
            .journal(vec![journal::entry(&record, None)], true)
            .await
        {
            tracing::warn!(%client, error = %e, "a session handed over not logged as ended");
        }
    }
    tracing::info!(%client, clean, "session taken over by another node");
    held
}

/// What `session` holds, as records: its subscriptions, then its messages in flight and
/// queued (in that order), each as a u32 length and the record.
fn export(session: &Session) -> Bytes {
    let st = session.state.lock();
    let client = session.client_id.clone();
    let subscriptions = (st.subscriptions.iter()).map(|(filter, options)| Record::Subscribe {
        client: client.clone(),
        filter: filter.clone(),
        options: options.clone(),
        retained: false,
    });
    let inflight = st.inflight.values().filter_map(|o| match o {
        Outgoing::Published(d) => Some(d),
        Outgoing::Released(_) => None,
    });
    let messages = inflight.chain(st.queue.iter()).map(|d| Record::Queued {
        client: client.clone(),
        qos: d.qos,
        retain: d.retain,
        ids: d.subscription_ids.clone(),
        message: d.message.clone(),
    });
    let mut out = Vec::new();
    for r in subscriptions.chain(messages) {
        let b = r.encode();
        out.extend_from_slice(&(b.len() as u32).to_le_bytes());
        out.extend_from_slice(&b);
    }
    out.into()
}
