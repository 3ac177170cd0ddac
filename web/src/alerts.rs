//! `/v1/alerts`: the alerts API the console uses, beside SQL's `CREATE ALERT` / `DROP ALERT`
//! (both reach the same engine calls).

use crate::ApiError;
use crate::auth::Caller;
use axum::Router;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::{delete, get};
use sluice_engine::{AlertDef, Condition, QueryPort};
use std::sync::Arc;

type Db = Arc<dyn QueryPort>;

/// An alert as POSTed.
#[derive(serde::Deserialize)]
struct NewAlert {
    name: String,
    query: String,
    /// `t > 90`, `any rows`.
    condition: String,
    #[serde(default = "one_second")]
    interval_ms: u64,
    #[serde(default = "yes")]
    publish: bool,
    #[serde(default)]
    webhook: Option<String>,
    /// The database of the query's unqualified names.
    #[serde(default)]
    db: Option<String>,
}

fn one_second() -> u64 {
    1000
}

fn yes() -> bool {
    true
}

pub(crate) fn routes(db: Db) -> Router {
    Router::new()
        .route("/v1/alerts", get(list).post(create))
        .route("/v1/alerts/{name}", delete(remove))
        .with_state(db)
}

type Who = Option<axum::Extension<Caller>>;

/// Every alert to an administrator; its own to a plain user.
async fn list(State(db): State<Db>, who: Who) -> impl IntoResponse {
    let user = who.and_then(|c| c.0.0);
    let mut all = db.alerts();
    if !db.is_admin(user.as_deref()) {
        all.retain(|a| a.owner == user);
    }
    axum::Json(all)
}

async fn create(
    State(db): State<Db>,
    who: Who,
    body: axum::body::Bytes,
) -> Result<StatusCode, ApiError> {
    let a: NewAlert = serde_json::from_slice(&body).map_err(|e| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "bad_request",
            format!("expected {{\"name\", \"query\", \"condition\", \"interval_ms\", \"publish\", \"webhook\"}}: {e}"),
        )
    })?;
    let def = AlertDef {
        name: a.name,
        query: a.query,
        database: a
            .db
            .unwrap_or_else(|| sluice_engine::DEFAULT_DATABASE.into()),
        condition: Condition::parse(&a.condition)?,
        interval_ms: a.interval_ms,
        publish: a.publish,
        webhook: a.webhook.filter(|w| !w.trim().is_empty()),
        owner: who.and_then(|c| c.0.0),
    };
    db.create_alert(def, false).await?;
    Ok(StatusCode::CREATED)
}

async fn remove(
    State(db): State<Db>,
    who: Who,
    Path(name): Path<String>,
) -> Result<StatusCode, ApiError> {
    let user = who.and_then(|c| c.0.0);
    db.drop_alert(&name, false, user.as_deref()).await?;
    Ok(StatusCode::NO_CONTENT)
}
