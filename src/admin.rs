//! Where the broker meets the HTTP API (siblings, so the binary joins them): the bridge
//! routes (`GET /v1/bridges`, `POST /v1/bridges` with a `[[bridge]]` entry as JSON,
//! `DELETE /v1/bridges/{name}`, `POST /v1/bridges/{name}/restart`) and the broker's users
//! as the HTTP API's logins.

use axum::Router;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::{delete, get, post};
use sluice_broker::{BridgeError, Bridges, Broker};
use sluice_web::{ApiError, to_the_end};
use std::sync::Arc;

/// The bridge routes.
pub(crate) fn bridge_routes(bridges: Arc<Bridges>) -> Router {
    Router::new()
        .route("/v1/bridges", get(list).post(add))
        .route("/v1/bridges/{name}", delete(remove))
        .route("/v1/bridges/{name}/restart", post(restart))
        .with_state(bridges)
}

fn api_error(e: BridgeError) -> ApiError {
    let (status, code) = match &e {
        BridgeError::NotFound(_) => (StatusCode::NOT_FOUND, "unknown_bridge"),
        BridgeError::Exists(_) => (StatusCode::CONFLICT, "already_exists"),
        BridgeError::Invalid(_) => (StatusCode::BAD_REQUEST, "invalid_bridge"),
        BridgeError::Save { .. } => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
        BridgeError::Cluster(_) => (StatusCode::SERVICE_UNAVAILABLE, "unavailable"),
    };
    ApiError::new(status, code, e.to_string())
}

async fn list(State(b): State<Arc<Bridges>>) -> impl IntoResponse {
    axum::Json(b.status().await)
}

async fn add(
    State(b): State<Arc<Bridges>>,
    body: axum::body::Bytes,
) -> Result<StatusCode, ApiError> {
    let config: sluice_conf::BridgeConfig = serde_json::from_slice(&body).map_err(|e| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_bridge",
            format!("expected a bridge as JSON ({{\"name\", \"address\", \"topics\": [{{\"filter\", \"qos\"}}], ...}}): {e}"),
        )
    })?;
    to_the_end("adding a bridge", async move { b.add(config).await })
        .await?
        .map_err(api_error)?;
    Ok(StatusCode::CREATED)
}

async fn remove(
    State(b): State<Arc<Bridges>>,
    Path(name): Path<String>,
) -> Result<StatusCode, ApiError> {
    to_the_end("removing a bridge", async move { b.remove(&name).await })
        .await?
        .map_err(api_error)?;
    Ok(StatusCode::NO_CONTENT)
}

async fn restart(
    State(b): State<Arc<Bridges>>,
    Path(name): Path<String>,
) -> Result<StatusCode, ApiError> {
    to_the_end("restarting a bridge", async move { b.restart(&name).await })
        .await?
        .map_err(api_error)?;
    Ok(StatusCode::NO_CONTENT)
}

/// HTTP logins checked against the broker's users (`[[user]]` and `CREATE USER`).
#[derive(Debug)]
pub(crate) struct BrokerAuth(pub(crate) Broker);

impl sluice_web::Authenticator for BrokerAuth {
    fn required(&self) -> bool {
        self.0.auth_required()
    }

    fn password_hash(&self, user: &str) -> Option<String> {
        self.0.password_hash(user)
    }

    fn is_admin(&self, user: &str) -> bool {
        self.0.is_admin(user)
    }

    fn login_failed(&self, peer: std::net::IpAddr) -> std::time::Duration {
        self.0.logins().failed(peer)
    }

    fn login_succeeded(&self, peer: std::net::IpAddr) {
        self.0.logins().succeeded(peer)
    }
}
