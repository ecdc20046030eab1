//! API errors: the `{"error": {"code", "message", ...}}` envelope, with the status each
//! [`ErrorCode`] has (SPEC §5).

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value};
use skillbox_api::{ErrorBody, ErrorCode, ErrorEnvelope};
use skillbox_registry::RegistryError;

#[derive(Debug)]
pub struct ApiError {
    pub code: ErrorCode,
    pub message: String,
    /// The code's details beside `code` and `message` (`current_revision`, `problems`, …).
    pub details: Map<String, Value>,
}

impl ApiError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        ApiError {
            code,
            message: message.into(),
            details: Map::new(),
        }
    }
    pub fn bad_request(m: impl Into<String>) -> Self {
        Self::new(ErrorCode::BadRequest, m)
    }
    /// A fault of the server's: logged here, answered 500 `internal`.
    pub fn internal(m: impl Into<String>) -> Self {
        let message = m.into();
        tracing::error!(error = %message, "internal error");
        Self::new(ErrorCode::Internal, message)
    }

    pub fn status(&self) -> StatusCode {
        StatusCode::from_u16(self.code.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
    }

    /// The error as the envelope carries it.
    pub fn body(&self) -> ErrorBody {
        ErrorBody {
            code: self.code.as_str().to_string(),
            message: self.message.clone(),
            details: self.details.clone(),
        }
    }
}

impl From<RegistryError> for ApiError {
    fn from(e: RegistryError) -> Self {
        let code = e.code();
        if code == ErrorCode::Unavailable {
            tracing::warn!(error = %e, "storage outage");
            return ApiError::new(
                code,
                format!(
                    "{e} (an outage of the server's storage: nothing was changed; retry later)"
                ),
            );
        }
        if code == ErrorCode::Internal {
            // The whole chain: the registry keeps each failure's source.
            let mut chain = e.to_string();
            let mut source = std::error::Error::source(&e);
            while let Some(s) = source {
                chain.push_str(&format!(" <- {s}"));
                source = s.source();
            }
            tracing::error!(error = %chain, "internal error");
        }
        ApiError {
            code,
            message: e.to_string(),
            details: e.details(),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        (status, axum::Json(ErrorEnvelope { error: self.body() })).into_response()
    }
}

pub type ApiResult<T> = Result<T, ApiError>;
