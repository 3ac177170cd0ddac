//! The HTTP API of Sluice: SQL in, rows out; rows in, durable acknowledgement out.
//!
//! Routes ([`router`]): `POST /v1/sql` runs one statement and returns its rows as JSON, JSON
//! lines, CSV, Arrow IPC or Parquet; `POST /v1/write/{db}/{table}` stores a CSV or JSON body
//! and answers 204 only once it is durable; `GET /health`; `/v1/alerts` ([`alerts`]);
//! `/v1/live`, a second-by-second event stream ([`live`]); `/v1/session`, the console's login
//! ([`auth`], which also guards every route when users exist); and the console itself at `/`
//! ([`console`]); on a cluster node, `/v1/cluster` ([`cluster_routes`]). Every failure is `{"error": {"code", "message"}}` with the status chosen in
//! one place ([`error`]). Handlers talk only to [`sluice_engine::QueryPort`], never to storage
//! directly; the broker's parts come in as plain routes and a [`LiveSource`].

mod alerts;
mod auth;
mod cluster;
mod console;
mod error;
mod format;
mod influx;
mod live;
mod pg;
mod spin;
mod tls;
mod ws;

pub use auth::{Authenticator, Open};
pub use cluster::{cluster_routes, to_the_end};
pub use error::ApiError;
pub use live::LiveSource;
pub use pg::serve_pg;
pub use ws::{StreamHandler, stream_route};

use axum::Router;
use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use datafusion::common::ScalarValue;
use futures::StreamExt;
use sluice_conf::HttpConfig;
use sluice_engine::{Format, QueryOptions, QueryPort};
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

#[derive(Clone)]
struct AppState {
    db: Arc<dyn QueryPort>,
    max_body: usize,
    publish: Option<Publish>,
}

/// Delivers a message (topic, payload) to MQTT subscribers: the broker's, on every node of
/// a cluster; resolves once it is queued for them.
pub type Publish =
    Arc<dyn Fn(String, bytes::Bytes) -> futures::future::BoxFuture<'static, ()> + Send + Sync>;

/// What other layers add to the HTTP server.
#[derive(Clone)]
pub struct Extras {
    /// Their routes (the broker's `/metrics`, `/mqtt`, `/v1/bridges`).
    pub routes: Router,
    /// Checks users' passwords.
    pub auth: Arc<dyn Authenticator>,
    /// Their figures for `/v1/live`.
    pub live: LiveSource,
    /// Where rows written to `/v1/write/{db}/{table}` are delivered, as a message on the
    /// table's topic `/{db}/{table}`.
    pub publish: Option<Publish>,
}

impl std::fmt::Debug for Extras {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Extras").finish_non_exhaustive()
    }
}

/// Every route over a database, guarded by [`auth`]; `cancel` ends live streams.
pub fn router(
    db: Arc<dyn QueryPort>,
    config: &HttpConfig,
    extras: Extras,
    cancel: CancellationToken,
) -> Router {
    let live = live::Live {
        db: db.clone(),
        source: extras.live,
        cancel,
    };
    let gate = Arc::new(auth::Gate::new(extras.auth));
    let session = Router::new()
        .route(
            "/v1/session",
            get(auth::whoami).post(auth::login).delete(auth::logout),
        )
        .with_state(gate.clone());
    Router::new()
        .route("/v1/sql", post(sql))
        .route("/v1/write/{db}/{table}", post(write))
        .route("/health", get(health))
        .fallback(|| async {
            ApiError::new(StatusCode::NOT_FOUND, "not_found", "no such endpoint")
        })
        .with_state(AppState {
            db: db.clone(),
            max_body: config.max_body_bytes,
            publish: extras.publish.clone(),
        })
        .route("/v1/live", get(live::live).with_state(live))
        .merge(influx::routes(
            db.clone(),
            config.max_body_bytes,
            extras.publish.clone(),
        ))
        .merge(alerts::routes(db))
        .merge(session)
        .merge(console::routes())
        .merge(extras.routes)
        .layer(axum::middleware::from_fn_with_state(gate, auth::check))
}

/// Serves [`router`] until `cancel` fires, then stops accepting and lets requests in flight
/// finish; over TLS (HTTPS only) when `tls` is given.
pub async fn serve(
    listener: tokio::net::TcpListener,
    db: Arc<dyn QueryPort>,
    config: &HttpConfig,
    extras: Extras,
    tls: Option<tokio_rustls::TlsAcceptor>,
    cancel: CancellationToken,
) -> std::io::Result<()> {
    use axum::serve::ListenerExt;
    let app = router(db, config, extras, cancel.clone());
    let listener = spin::SpinListener::new(
        listener,
        std::time::Duration::from_micros(config.busy_poll_us),
    );
    // Responses go out at once, not held back until the client acknowledges the previous
    // segment (Nagle's algorithm costs an alert query's round trip).
    let listener = listener.tap_io(|tcp| {
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(error = %e, "TCP_NODELAY not set on an HTTP connection");
        }
    });
    let app = app.into_make_service_with_connect_info::<std::net::SocketAddr>();
    let stop = cancel.cancelled_owned();
    let listener = tls::Limited::new(listener, config.max_connections);
    // The outer `tap_io` gives each listener the peer address axum's ConnectInfo reads.
    match tls {
        None => {
            let listener = listener.tap_io(|_| ());
            axum::serve(listener, app)
                .with_graceful_shutdown(stop)
                .await
        }
        Some(tls) => {
            let listener = tls::TlsListener::new(listener, tls).tap_io(|_| ());
            axum::serve(listener, app)
                .with_graceful_shutdown(stop)
                .await
        }
    }
}

pub(crate) async fn read_body(body: Body, limit: usize) -> Result<bytes::Bytes, ApiError> {
    axum::body::to_bytes(body, limit).await.map_err(|_| {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "too_large",
            format!("request body is larger than {limit} bytes (http.max_body_bytes)"),
        )
    })
}

#[derive(serde::Deserialize)]
struct SqlParams {
    format: Option<String>,
    /// The database of unqualified table names.
    db: Option<String>,
    /// `off`: compute the answer even if a kept result is still valid (for measuring).
    cache: Option<String>,
}

/// A JSON request body: `{"sql": "... $1 ...", "params": [1, "x"], "db": "benchmark"}`.
#[derive(serde::Deserialize)]
struct SqlRequest {
    sql: String,
    #[serde(default)]
    params: Vec<serde_json::Value>,
    db: Option<String>,
}

fn bad_request(message: impl Into<String>) -> ApiError {
    ApiError::new(StatusCode::BAD_REQUEST, "bad_request", message)
}

/// A JSON parameter as an SQL value; the engine casts it to the type its place asks for.
fn param(i: usize, v: serde_json::Value) -> Result<ScalarValue, ApiError> {
    use serde_json::Value as J;
    Ok(match v {
        J::Null => ScalarValue::Null,
        J::Bool(b) => ScalarValue::Boolean(Some(b)),
        J::Number(n) => match (n.as_i64(), n.as_u64(), n.as_f64()) {
            (Some(i), _, _) => ScalarValue::Int64(Some(i)),
            (_, Some(u), _) => ScalarValue::UInt64(Some(u)),
            (_, _, Some(f)) => ScalarValue::Float64(Some(f)),
            _ => {
                return Err(bad_request(format!(
                    "parameter ${}: number out of range",
                    i + 1
                )));
            }
        },
        J::String(s) => ScalarValue::Utf8(Some(s)),
        J::Array(_) | J::Object(_) => {
            return Err(bad_request(format!(
                "parameter ${}: only null, booleans, numbers and strings can be parameters",
                i + 1
            )));
        }
    })
}

async fn sql(
    State(s): State<AppState>,
    caller: Option<axum::Extension<auth::Caller>>,
    Query(q): Query<SqlParams>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let out_format = format::OutputFormat::parse(q.format.as_deref())?;
    let body = read_body(body, s.max_body).await?;
    let json = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| ct.starts_with("application/json"));
    let mut options = QueryOptions {
        database: q.db,
        params: Vec::new(),
        no_result_cache: q.cache.as_deref() == Some("off"),
        user: caller.and_then(|c| c.0.0),
        ..QueryOptions::default()
    };
    let sql_owned;
    let text = if json {
        let request = serde_json::from_slice::<SqlRequest>(&body).map_err(|e| {
            bad_request(format!(
                "expected {{\"sql\": \"...\", \"params\": [...], \"db\": \"...\"}}: {e}"
            ))
        })?;
        options.database = request.db.or(options.database);
        options.params = (request.params.into_iter().enumerate())
            .map(|(i, v)| param(i, v))
            .collect::<Result<_, _>>()?;
        sql_owned = request.sql;
        sql_owned.as_str()
    } else {
        std::str::from_utf8(&body).map_err(|_| bad_request("SQL must be UTF-8 text"))?
    };
    if text.trim().is_empty() {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "bad_sql",
            "empty SQL statement",
        ));
    }
    let started = std::time::Instant::now();
    let output = s.db.query(text, &options).await?;
    let columns = columns_header(&output.schema);
    let mut stream = output.stream;
    let mut encoder = out_format.encoder(output.schema)?;
    // The first batch decides the status: an error before any row is still a clean 4xx/5xx.
    // Later errors can only cut the body short (and are logged).
    let first = match stream.next().await {
        Some(batch) => Some(encoder.batch(&batch.map_err(sluice_engine::Error::from)?)?),
        None => None,
    };
    let elapsed = started.elapsed().as_micros().to_string();
    // A result that ends with its first batch (an alert's one row) goes out in one piece,
    // with its length: one write, read by the client at once. (A longer result's headers
    // wait for its second batch.)
    let second = match first {
        Some(_) => stream.next().await,
        None => None,
    };
    let body = match second {
        None => {
            let mut whole = first.map(Vec::from).unwrap_or_default();
            whole.extend_from_slice(&encoder.finish()?);
            Body::from(whole)
        }
        Some(batch) => {
            let second = encoder.batch(&batch.map_err(sluice_engine::Error::from)?)?;
            let first = first.into_iter().chain([second]).collect();
            Body::from_stream(body_chunks(first, stream, encoder))
        }
    };
    Ok((
        [
            (header::CONTENT_TYPE, out_format.content_type().to_string()),
            (
                header::HeaderName::from_static("x-sluice-first-batch-us"),
                elapsed,
            ),
            (header::HeaderName::from_static("x-sluice-columns"), columns),
        ],
        body,
    )
        .into_response())
}

/// `[{"name": ..., "type": ...}, ...]`: the result's columns in order with their Arrow
/// types, for clients that show types or read JSON rows whose key order is lost.
fn columns_header(schema: &datafusion::arrow::datatypes::Schema) -> String {
    let cols: Vec<_> = (schema.fields().iter())
        .map(|f| serde_json::json!({"name": f.name(), "type": f.data_type().to_string()}))
        .collect();
    // Header values are visible ASCII: escape everything else as JSON \u escapes.
    let text = serde_json::Value::Array(cols).to_string();
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if c.is_ascii() && !c.is_ascii_control() {
            out.push(c);
        } else {
            let mut buf = [0u16; 2];
            for unit in c.encode_utf16(&mut buf) {
                out.push_str(&format!("\\u{unit:04x}"));
            }
        }
    }
    out
}

/// The rest of the result as body chunks: the batches encoded already, then each batch
/// encoded as it arrives, then the closing bytes of the format.
fn body_chunks(
    ready: std::collections::VecDeque<bytes::Bytes>,
    stream: datafusion::execution::SendableRecordBatchStream,
    encoder: format::Encoder,
) -> impl futures::Stream<Item = Result<bytes::Bytes, std::io::Error>> + Send {
    let state = (stream, Some(encoder), ready);
    futures::stream::unfold(state, |(mut stream, mut encoder, mut ready)| async move {
        if let Some(chunk) = ready.pop_front() {
            return Some((Ok(chunk), (stream, encoder, ready)));
        }
        let enc = encoder.as_mut()?;
        let chunk = match stream.next().await {
            Some(Ok(batch)) => enc.batch(&batch),
            Some(Err(e)) => {
                tracing::warn!(error = %e, "query failed while streaming its result; response cut short");
                return Some((
                    Err(std::io::Error::other(e.to_string())),
                    (stream, None, ready),
                ));
            }
            None => encoder.take()?.finish(),
        };
        let chunk = chunk.map_err(|e| std::io::Error::other(e.message));
        Some((chunk, (stream, encoder, ready)))
    })
}

async fn write(
    State(s): State<AppState>,
    caller: Option<axum::Extension<auth::Caller>>,
    Path((db, table)): Path<(String, String)>,
    headers: HeaderMap,
    body: Body,
) -> Result<StatusCode, ApiError> {
    let body = read_body(body, s.max_body).await?;
    let ct = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let format = if ct.contains("json") {
        Format::Json
    } else if ct.contains("csv") {
        Format::Csv
    } else {
        Format::sniff(&body)
    };
    let user = caller.and_then(|c| c.0.0);
    s.db.write(user.as_deref(), &db, &table, format, &body)
        .await?;
    // Stored: its subscribers get it as if it had been published on the table's topic.
    if let Some(publish) = &s.publish {
        publish(format!("/{db}/{table}"), body).await;
    }
    Ok(StatusCode::NO_CONTENT)
}

async fn health(State(s): State<AppState>) -> Response {
    let h = s.db.health();
    axum::Json(serde_json::json!({"status": "ok", "applied_lsn": h.applied_lsn, "wal_segments": h.wal_segments, "buffered_rows": h.buffered_rows})).into_response()
}
