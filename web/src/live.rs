//! `GET /v1/live`: server-sent events, one JSON object a second, for the console's live page:
//! the engine's figures, the alerts by state, and what the other layers add (the broker's
//! MQTT counters and bridges). Counters are totals; the page derives rates from consecutive
//! events. The stream ends when the server shuts down.

use axum::extract::State;
use axum::response::sse::{Event, KeepAlive, Sse};
use futures::{Stream, StreamExt};
use sluice_engine::QueryPort;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Figures of other layers, merged into each event (`{"mqtt": {...}, "bridges": [...]}`).
pub type LiveSource = Arc<dyn Fn() -> serde_json::Value + Send + Sync>;

#[derive(Clone)]
pub(crate) struct Live {
    pub(crate) db: Arc<dyn QueryPort>,
    pub(crate) source: LiveSource,
    pub(crate) cancel: CancellationToken,
}

/// One event's JSON.
pub(crate) fn snapshot(db: &dyn QueryPort, source: &LiveSource) -> serde_json::Value {
    let mut alerts = serde_json::Map::new();
    for state in ["pending", "ok", "firing", "error"] {
        alerts.insert(state.into(), 0.into());
    }
    for a in db.alerts() {
        if let Some(n) = alerts.get_mut(a.state.as_str()) {
            *n = (n.as_u64().unwrap_or(0) + 1).into();
        }
    }
    let time_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0);
    let mut out = serde_json::json!({
        "time_ms": time_ms,
        "engine": db.health(),
        "alerts": alerts,
    });
    if let (Some(out), serde_json::Value::Object(extra)) = (out.as_object_mut(), source()) {
        out.extend(extra);
    }
    out
}

pub(crate) async fn live(
    State(l): State<Live>,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let ticks = ticks(Duration::from_secs(1));
    let stop = l.cancel.clone().cancelled_owned();
    let events = ticks
        .map(move |_| {
            let data = snapshot(l.db.as_ref(), &l.source).to_string();
            Ok(Event::default().data(data))
        })
        .take_until(stop);
    Sse::new(events).keep_alive(KeepAlive::default())
}

/// A tick now and then every `period`.
fn ticks(period: Duration) -> impl Stream<Item = ()> {
    futures::stream::unfold(
        None,
        move |timer: Option<tokio::time::Interval>| async move {
            let mut timer = timer.unwrap_or_else(|| {
                let mut t = tokio::time::interval(period);
                t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
                t
            });
            timer.tick().await;
            Some(((), Some(timer)))
        },
    )
}
