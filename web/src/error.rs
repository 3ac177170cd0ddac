//! The one place engine errors become HTTP statuses and JSON error bodies.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use sluice_engine::{Error, ErrorKind};

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

/// The HTTP status of each kind of engine error.
fn status_of(kind: ErrorKind) -> StatusCode {
    match kind {
        ErrorKind::BadSql
        | ErrorKind::InvalidDefinition
        | ErrorKind::BadRow
        | ErrorKind::BadPayload
        | ErrorKind::QueryFailed => StatusCode::BAD_REQUEST,
        ErrorKind::UnknownDatabase | ErrorKind::UnknownTable | ErrorKind::UnknownAlert => {
            StatusCode::NOT_FOUND
        }
        ErrorKind::AlreadyExists => StatusCode::CONFLICT,
        ErrorKind::Denied => StatusCode::FORBIDDEN,
        ErrorKind::TooLarge => StatusCode::PAYLOAD_TOO_LARGE,
        ErrorKind::Overloaded
        | ErrorKind::BuffersFull
        | ErrorKind::ShuttingDown
        | ErrorKind::NotCommitted
        | ErrorKind::LogUnavailable
        | ErrorKind::ResourcesExhausted => StatusCode::SERVICE_UNAVAILABLE,
        ErrorKind::DiskFull => StatusCode::INSUFFICIENT_STORAGE,
        ErrorKind::StorageFailed | ErrorKind::Internal => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

impl From<Error> for ApiError {
    fn from(e: Error) -> Self {
        let kind = e.kind();
        let (status, code) = (status_of(kind), kind.code());
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
