//! The broker's own state as SQL: `system.sessions`, `system.subscriptions` and
//! `system.retained`, read from the router at query time.

use crate::router::Router;
use crate::session::Session;
use arrow::array::{ArrayRef, BooleanArray, StringArray, UInt8Array, UInt32Array, UInt64Array};
use arrow::datatypes::{Field, Schema};
use arrow::record_batch::RecordBatch;
use std::sync::Arc;
use std::time::Instant;

/// Builds a table's rows from the router.
pub(crate) type Table = fn(&Router) -> RecordBatch;

/// The broker's system tables, by name.
pub(crate) const TABLES: [(&str, Table); 3] = [
    ("sessions", sessions_table),
    ("subscriptions", subscriptions_table),
    ("retained", retained_table),
];

/// A table of `(name, column, nullable)`.
fn batch(columns: Vec<(&str, ArrayRef, bool)>) -> RecordBatch {
    let fields: Vec<Field> = (columns.iter())
        .map(|(name, a, nullable)| Field::new(*name, a.data_type().clone(), *nullable))
        .collect();
    let arrays = columns.into_iter().map(|(_, a, _)| a).collect();
    RecordBatch::try_new(Arc::new(Schema::new(fields)), arrays).expect("columns match fields")
}

fn text(v: Vec<String>) -> ArrayRef {
    Arc::new(StringArray::from(v))
}

fn count(v: Vec<u64>) -> ArrayRef {
    Arc::new(UInt64Array::from(v))
}

/// Sessions by client id, for stable output.
fn sessions(router: &Router) -> Vec<Arc<Session>> {
    let mut all = router.sessions();
    all.sort_by(|a, b| a.client_id.cmp(&b.client_id));
    all
}

/// `system.sessions`: one row per session, online or offline, with the cluster node it
/// lives on (NULL on a single node).
pub(crate) fn sessions_table(router: &Router) -> RecordBatch {
    let all = sessions(router);
    let now = Instant::now();
    let (mut ids, mut users, mut connected, mut subs, mut queued, mut inflight) =
        (vec![], vec![], vec![], vec![], vec![], vec![]);
    let (mut expiry, mut offline_secs, mut dropped) = (vec![], vec![], vec![]);
    for s in &all {
        let st = s.state.lock();
        ids.push(s.client_id.to_string());
        users.push(s.user.lock().as_deref().map(str::to_string));
        connected.push(st.disconnected_at.is_none());
        subs.push(st.subscriptions.len() as u64);
        queued.push(st.queue.len() as u64);
        inflight.push(st.inflight.len() as u64);
        expiry.push(st.expiry_secs);
        offline_secs.push(st.disconnected_at.map(|t| now.duration_since(t).as_secs()));
        dropped.push(st.dropped);
    }
    batch(vec![
        ("client_id", text(ids), false),
        ("user", Arc::new(StringArray::from(users)), true),
        ("connected", Arc::new(BooleanArray::from(connected)), false),
        (
            "node",
            Arc::new(UInt64Array::from(vec![router.node; all.len()])),
            true,
        ),
        ("subscriptions", count(subs), false),
        ("queued", count(queued), false),
        ("inflight", count(inflight), false),
        ("expiry_secs", Arc::new(UInt32Array::from(expiry)), false),
        (
            "offline_secs",
            Arc::new(UInt64Array::from(offline_secs)),
            true,
        ),
        ("dropped", count(dropped), false),
    ])
}

/// `system.subscriptions`: one row per session and filter (`$share/group/...` as given,
/// with its group apart).
pub(crate) fn subscriptions_table(router: &Router) -> RecordBatch {
    let (mut ids, mut filters, mut groups, mut qos) = (vec![], vec![], vec![], vec![]);
    let (mut no_local, mut rap, mut sub_ids) = (vec![], vec![], vec![]);
    for s in sessions(router) {
        let st = s.state.lock();
        let mut subs: Vec<_> = st.subscriptions.iter().collect();
        subs.sort_by(|a, b| a.0.cmp(b.0));
        for (filter, o) in subs {
            ids.push(s.client_id.to_string());
            let group = filter
                .strip_prefix("$share/")
                .and_then(|r| r.split_once('/'));
            groups.push(group.map(|(g, _)| g.to_string()));
            filters.push(group.map_or(filter.clone(), |(_, f)| f.to_string()));
            qos.push(o.qos as u8);
            no_local.push(o.no_local);
            rap.push(o.retain_as_published);
            sub_ids.push(o.id.map(|i| i as u64));
        }
    }
    batch(vec![
        ("client_id", text(ids), false),
        ("filter", text(filters), false),
        ("share_group", Arc::new(StringArray::from(groups)), true),
        ("qos", Arc::new(UInt8Array::from(qos)), false),
        ("no_local", Arc::new(BooleanArray::from(no_local)), false),
        (
            "retain_as_published",
            Arc::new(BooleanArray::from(rap)),
            false,
        ),
        (
            "subscription_id",
            Arc::new(UInt64Array::from(sub_ids)),
            true,
        ),
    ])
}

/// `system.retained`: one row per retained message (payload as text, invalid UTF-8
/// replaced; `bytes` is its true size).
pub(crate) fn retained_table(router: &Router) -> RecordBatch {
    let mut all = router.retained_all();
    all.sort_by(|a, b| a.topic.cmp(&b.topic));
    let now = Instant::now();
    batch(vec![
        (
            "topic",
            text(all.iter().map(|m| m.topic.to_string()).collect()),
            false,
        ),
        (
            "payload",
            text(
                (all.iter())
                    .map(|m| String::from_utf8_lossy(&m.payload).into_owned())
                    .collect(),
            ),
            false,
        ),
        (
            "bytes",
            count(all.iter().map(|m| m.payload.len() as u64).collect()),
            false,
        ),
        (
            "qos",
            Arc::new(UInt8Array::from(
                all.iter().map(|m| m.qos as u8).collect::<Vec<_>>(),
            )),
            false,
        ),
        (
            "expires_in_secs",
            Arc::new(UInt64Array::from(
                (all.iter())
                    .map(|m| {
                        m.expires
                            .map(|e| e.saturating_duration_since(now).as_secs())
                    })
                    .collect::<Vec<_>>(),
            )),
            true,
        ),
    ])
}
