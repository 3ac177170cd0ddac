//! The one place engine errors become HTTP statuses and JSON error bodies.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use sluice_engine::Error;

/// An error as the API returns it.
#[derive(Debug, thiserror::Error)]
#[error("{status} {code}: {message}")]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// Stable machine-readable code.
    pub code: &'static str,
    /// Human-readable message.
    pub message: String,
}

impl ApiError {
    /// An error with a status and code.
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: message.into(),
        }
    }

    /// A server-side failure.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", message)
    }
}

impl From<Error> for ApiError {
    fn from(e: Error) -> Self {
        let (status, code) = match &e {
            Error::Sql { .. } => (StatusCode::BAD_REQUEST, "bad_sql"),
            Error::InvalidDefinition { .. } => (StatusCode::BAD_REQUEST, "invalid_definition"),
            Error::UnknownDatabase { .. } => (StatusCode::NOT_FOUND, "unknown_database"),
            Error::UnknownTable { .. } => (StatusCode::NOT_FOUND, "unknown_table"),
            Error::UnknownAlert { .. } => (StatusCode::NOT_FOUND, "unknown_alert"),
            Error::AlreadyExists { .. } => (StatusCode::CONFLICT, "already_exists"),
            Error::BadRow { .. } => (StatusCode::BAD_REQUEST, "bad_row"),
            Error::BadPayload { .. } => (StatusCode::BAD_REQUEST, "bad_payload"),
            Error::TooLarge { .. } => (StatusCode::PAYLOAD_TOO_LARGE, "too_large"),
            Error::Overloaded { .. } => (StatusCode::SERVICE_UNAVAILABLE, "overloaded"),
            Error::BuffersFull { .. } => (StatusCode::SERVICE_UNAVAILABLE, "buffers_full"),
            Error::ShuttingDown => (StatusCode::SERVICE_UNAVAILABLE, "shutting_down"),
            Error::Replication { .. } => (StatusCode::SERVICE_UNAVAILABLE, "not_committed"),
            Error::Wal { source, .. } if source.kind() == std::io::ErrorKind::StorageFull => {
                (StatusCode::INSUFFICIENT_STORAGE, "disk_full")
            }
            Error::Wal { .. } | Error::WalPoisoned { .. } => {
                (StatusCode::SERVICE_UNAVAILABLE, "log_unavailable")
            }
            Error::DataFusion { source } => match source.as_ref() {
                datafusion::error::DataFusionError::ResourcesExhausted(_) => {
                    (StatusCode::SERVICE_UNAVAILABLE, "resources_exhausted")
                }
                datafusion::error::DataFusionError::ArrowError(..)
                | datafusion::error::DataFusionError::Execution(_) => {
                    (StatusCode::BAD_REQUEST, "query_failed")
                }
                _ => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
            },
            Error::Io { .. }
            | Error::Corrupt { .. }
            | Error::ObjectStore { .. }
            | Error::Parquet { .. }
            | Error::Arrow { .. } => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
        };
        if status.is_server_error() {
            tracing::warn!(code, error = %e, "request failed");
        } else {
            tracing::info!(code, error = %e, "request refused");
        }
        ApiError::new(status, code, e.to_string())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = serde_json::json!({"error": {"code": self.code, "message": self.message}});
        (self.status, axum::Json(body)).into_response()
    }
}
