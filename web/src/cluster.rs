//! The cluster routes, over [`ClusterAdmin`] (the `sluice-cluster` crate implements it):
//! this node's view, nodes added and removed, shard leaderships moved.

use crate::error::ApiError;
use axum::Router;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::{delete, get, post};
use sluice_engine::{ClusterAdmin, LeaderMoveError, NodeChangeError};
use std::sync::Arc;

type Admin = Arc<dyn ClusterAdmin>;

/// The cluster routes: `GET /v1/cluster` (this node's view: `system.nodes` and
/// `system.shards` as JSON), `POST /v1/cluster/shards/{shard}/leader` with
/// `{"node": N}` (make N the shard's preferred leader and wait, up to 10 s, for the
/// leadership to move there), `POST /v1/cluster/nodes` with `{"node": N, "address":
/// "host:port"}` (add a node) and `DELETE /v1/cluster/nodes/{node}` (remove one); both wait
/// up to `?wait_secs=` (default 60) for the shards to have moved.
pub fn cluster_routes(cluster: Arc<dyn ClusterAdmin>) -> Router {
    Router::new()
        .route("/v1/cluster", get(cluster_state))
        .route("/v1/cluster/shards/{shard}/leader", post(move_leader))
        .route("/v1/cluster/nodes", post(add_node))
        .route("/v1/cluster/nodes/{node}", delete(remove_node))
        .with_state(cluster)
}

#[derive(serde::Deserialize)]
struct NewNode {
    node: u64,
    address: String,
}

#[derive(serde::Deserialize)]
struct Wait {
    wait_secs: Option<u64>,
}

async fn add_node(
    State(c): State<Admin>,
    axum::extract::Query(w): axum::extract::Query<Wait>,
    body: axum::body::Bytes,
) -> Result<impl IntoResponse, ApiError> {
    let bad = |m: String| ApiError::new(StatusCode::BAD_REQUEST, "invalid_request", m);
    let n: NewNode = serde_json::from_slice(&body).map_err(|e| {
        bad(format!(
            "expected {{\"node\": <id>, \"address\": \"host:port\"}}: {e}"
        ))
    })?;
    if n.node == 0 {
        return Err(bad("a node id is a positive integer".into()));
    }
    if !sluice_conf::is_host_port(&n.address) {
        return Err(bad(format!("address {:?}: expected host:port", n.address)));
    }
    change_node(c, n.node, Some(n.address), w).await
}

async fn remove_node(
    State(c): State<Admin>,
    Path(node): Path<u64>,
    axum::extract::Query(w): axum::extract::Query<Wait>,
) -> Result<impl IntoResponse, ApiError> {
    let t = c.node_ids();
    if !t.contains(&node) {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "unknown_node",
            format!("node {node} is not a member (members: {t:?})"),
        ));
    }
    change_node(c, node, None, w).await
}

/// Commits a node's addition or removal and waits for the shards to move (the move goes on
/// if the client goes away, or past the wait).
async fn change_node(
    c: Admin,
    node: u64,
    address: Option<String>,
    w: Wait,
) -> Result<axum::Json<serde_json::Value>, ApiError> {
    let wait = std::time::Duration::from_secs(w.wait_secs.unwrap_or(60).min(600));
    let added = address.is_some();
    let changed = to_the_end("changing the nodes", async move {
        c.change_node(node, address, wait).await
    })
    .await?;
    match changed {
        Ok((topology, done)) => Ok(axum::Json(serde_json::json!({
            "node": node,
            "added": added,
            "done": done,
            "topology": topology,
        }))),
        Err(e) => {
            let (status, code) = match &e {
                NodeChangeError::Conflict(_) => (StatusCode::CONFLICT, "node_conflict"),
                NodeChangeError::Invalid(_) => (StatusCode::BAD_REQUEST, "invalid_request"),
                NodeChangeError::NotCommitted(_) => {
                    (StatusCode::SERVICE_UNAVAILABLE, "not_committed")
                }
            };
            Err(ApiError::new(status, code, e.to_string()))
        }
    }
}

fn rows_json(batch: &arrow::record_batch::RecordBatch) -> Result<serde_json::Value, ApiError> {
    let internal = |e: String| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", e);
    let mut w = arrow::json::ArrayWriter::new(Vec::new());
    w.write(batch).map_err(|e| internal(e.to_string()))?;
    w.finish().map_err(|e| internal(e.to_string()))?;
    let bytes = w.into_inner();
    if bytes.is_empty() {
        return Ok(serde_json::Value::Array(Vec::new()));
    }
    serde_json::from_slice(&bytes).map_err(|e| internal(e.to_string()))
}

async fn cluster_state(State(c): State<Admin>) -> Result<impl IntoResponse, ApiError> {
    Ok(axum::Json(serde_json::json!({
        "node_id": c.node_id(),
        "nodes": rows_json(&c.nodes_table())?,
        "shards": rows_json(&c.shards_table())?,
    })))
}

#[derive(serde::Deserialize)]
struct MoveTo {
    node: u64,
}

async fn move_leader(
    State(c): State<Admin>,
    Path(shard): Path<u32>,
    body: axum::body::Bytes,
) -> Result<impl IntoResponse, ApiError> {
    let to: MoveTo = serde_json::from_slice(&body).map_err(|e| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_request",
            format!("expected {{\"node\": <node id>}}: {e}"),
        )
    })?;
    let wait = std::time::Duration::from_secs(10);
    let moved = to_the_end("moving a leadership", async move {
        c.move_leader(shard, to.node, wait).await
    })
    .await?;
    match moved {
        Ok(leader) => Ok(axum::Json(serde_json::json!({
            "shard": shard,
            "preferred_leader": to.node,
            "leader": leader,
            "moved": leader == Some(to.node),
        }))),
        Err(e) => {
            let (status, code) = match &e {
                LeaderMoveError::NoShard { .. } => (StatusCode::NOT_FOUND, "unknown_shard"),
                LeaderMoveError::NotReplica { .. } => (StatusCode::BAD_REQUEST, "not_a_replica"),
                LeaderMoveError::NotCommitted(_) => {
                    (StatusCode::SERVICE_UNAVAILABLE, "not_committed")
                }
            };
            Err(ApiError::new(status, code, e.to_string()))
        }
    }
}

/// Runs a change to its end even if the client goes away meanwhile (axum drops a handler
/// whose connection closed, which would leave a bridge half stopped or a cluster change
/// half waited for); `what` names it in the error if the task itself fails.
pub async fn to_the_end<F, T>(what: &str, change: F) -> Result<T, ApiError>
where
    F: std::future::Future<Output = T> + Send + 'static,
    T: Send + 'static,
{
    tokio::spawn(change)
        .await
        .map_err(|e| ApiError::internal(format!("{what}: {e}")))
}
