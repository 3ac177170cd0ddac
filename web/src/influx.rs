//! InfluxDB's write API, so Telegraf, the InfluxDB client libraries and `curl` scripts
//! written for InfluxDB write to Sluice unchanged: `POST /api/v2/write?bucket=DB&precision=`
//! (v2; `org` is ignored) and `POST /write?db=DB&precision=` (v1). The body is line protocol,
//! gzip-compressed when `Content-Encoding: gzip` says so; each measurement is a table of the
//! database ([`sluice_engine::Engine::write_line_protocol`]). The token is a Sluice user and
//! password (`Authorization: Token user:password`), or Basic. 204 once every row is durable;
//! errors in InfluxDB's shape, `{"code": ..., "message": ...}`.

use crate::auth::Caller;
use axum::Router;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use sluice_engine::QueryPort;
use std::sync::Arc;

#[derive(Clone)]
struct Influx {
    db: Arc<dyn QueryPort>,
    max_body: usize,
    publish: Option<crate::Publish>,
}

#[derive(serde::Deserialize)]
struct Params {
    /// v2: the database.
    bucket: Option<String>,
    /// v1: the database.
    db: Option<String>,
    /// `ns` (default), `us`, `ms` or `s`.
    precision: Option<String>,
    /// `false`: one line that cannot be stored refuses the whole request (default `true`:
    /// the others are stored and it is reported).
    accept_partial: Option<bool>,
}

pub(crate) fn routes(
    db: Arc<dyn QueryPort>,
    max_body: usize,
    publish: Option<crate::Publish>,
) -> Router {
    Router::new()
        .route("/api/v2/write", post(write))
        .route("/write", post(write))
        .with_state(Influx {
            db,
            max_body,
            publish,
        })
}

/// An error as InfluxDB answers it.
fn error(status: StatusCode, code: &str, message: impl Into<String>) -> Response {
    let body = serde_json::json!({"code": code, "message": message.into()});
    (status, axum::Json(body)).into_response()
}

/// A refusal before the engine is asked: status, InfluxDB's code, message.
type Refusal = (StatusCode, &'static str, String);

/// Nanoseconds per unit of `precision`.
fn ns_per_unit(precision: Option<&str>) -> Option<i64> {
    Some(match precision.unwrap_or("ns") {
        "ns" | "n" => 1,
        "us" | "u" => 1_000,
        "ms" => 1_000_000,
        "s" => 1_000_000_000,
        _ => return None,
    })
}

/// The body, decompressed if it says it is gzip; at most `limit` bytes either way.
fn body_text(headers: &HeaderMap, body: &[u8], limit: usize) -> Result<String, Refusal> {
    let gzip = (headers.get(header::CONTENT_ENCODING))
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("gzip"));
    let bytes = if gzip {
        use std::io::Read;
        let mut out = Vec::new();
        let mut reader = flate2::read::GzDecoder::new(body).take(limit as u64 + 1);
        let read = reader.read_to_end(&mut out);
        read.map_err(|e| {
            (
                StatusCode::BAD_REQUEST,
                "invalid",
                format!("gzip body: {e}"),
            )
        })?;
        if out.len() > limit {
            let m =
                format!("body larger than {limit} bytes once decompressed (http.max_body_bytes)");
            return Err((StatusCode::PAYLOAD_TOO_LARGE, "too large", m));
        }
        out
    } else {
        body.to_vec()
    };
    String::from_utf8(bytes).map_err(|_| {
        let m = "line protocol must be UTF-8".to_string();
        (StatusCode::BAD_REQUEST, "invalid", m)
    })
}

async fn write(
    State(s): State<Influx>,
    caller: Option<axum::Extension<Caller>>,
    Query(q): Query<Params>,
    headers: HeaderMap,
    body: axum::body::Body,
) -> Response {
    let Some(database) = q.bucket.or(q.db) else {
        return error(
            StatusCode::BAD_REQUEST,
            "invalid",
            "name the database: ?bucket=DB (v2) or ?db=DB (v1)",
        );
    };
    let Some(ns) = ns_per_unit(q.precision.as_deref()) else {
        return error(
            StatusCode::BAD_REQUEST,
            "invalid",
            "precision must be ns, us, ms or s",
        );
    };
    let body = match crate::read_body(body, s.max_body).await {
        Ok(b) => b,
        Err(e) => return error(e.status, "too large", e.message),
    };
    let text = match body_text(&headers, &body, s.max_body) {
        Ok(t) => t,
        Err((status, code, message)) => return error(status, code, message),
    };
    let user = caller.and_then(|c| c.0.0);
    // As InfluxDB: the lines that fit are stored and the others reported, unless the client
    // asks for all or nothing (InfluxDB 3's `accept_partial=false`).
    let partial = q.accept_partial != Some(false);
    match s
        .db
        .write_line_protocol(user.as_deref(), &database, &text, ns, partial)
        .await
    {
        Ok(w) => {
            // Stored: each measurement's lines go to the subscribers of its table's topic,
            // as sent.
            if let Some(publish) = &s.publish {
                for (table, lines) in &w.stored {
                    let topic = format!("/{database}/{table}");
                    publish(topic, bytes::Bytes::from(lines.clone())).await;
                }
            }
            match w.rejected.is_empty() {
                true => StatusCode::NO_CONTENT.into_response(),
                false => partial_write(&w),
            }
        }
        Err(e) => {
            let api = crate::ApiError::from(e);
            let code = match api.status {
                StatusCode::NOT_FOUND => "not found",
                StatusCode::FORBIDDEN => "forbidden",
                StatusCode::PAYLOAD_TOO_LARGE => "too large",
                s if s.is_server_error() => "internal error",
                _ => "invalid",
            };
            error(api.status, code, api.message)
        }
    }
}

/// 400 naming the lines not stored, in both InfluxDB 2's shape (`code`, `message`) and
/// InfluxDB 3's (`error`, `data` with each line's number, text and error).
fn partial_write(w: &sluice_engine::LineProtocolWrite) -> Response {
    let first = &w.rejected[0];
    let message = format!(
        "partial write: {} lines rejected, {} rows stored; line {}: {}",
        w.rejected.len(),
        w.rows,
        first.line,
        first.error
    );
    let data: Vec<serde_json::Value> = (w.rejected.iter())
        .map(|r| {
            serde_json::json!({
                "line_number": r.line,
                "original_line": r.text,
                "error_message": r.error,
            })
        })
        .collect();
    let body = serde_json::json!({
        "code": "invalid",
        "message": message,
        "error": "partial write of line protocol occurred",
        "data": data,
    });
    (StatusCode::BAD_REQUEST, axum::Json(body)).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn precisions() {
        assert_eq!(ns_per_unit(None), Some(1));
        assert_eq!(ns_per_unit(Some("s")), Some(1_000_000_000));
        assert_eq!(ns_per_unit(Some("ms")), Some(1_000_000));
        assert_eq!(ns_per_unit(Some("h")), None);
    }
}
