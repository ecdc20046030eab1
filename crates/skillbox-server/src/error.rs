//! API errors: `{"error": {"code", "message", ...}}` with the SPEC §5 status codes.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use skillbox_registry::RegistryError;

#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
    pub extra: Option<Value>,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            code,
            message: message.into(),
            extra: None,
        }
    }
    pub fn bad_request(m: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "bad_request", m)
    }
    pub fn unauthorized(m: impl Into<String>) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, "unauthorized", m)
    }
    pub fn forbidden(m: impl Into<String>) -> Self {
        Self::new(StatusCode::FORBIDDEN, "forbidden", m)
    }
    pub fn not_found(m: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found", m)
    }
    pub fn too_large(m: impl Into<String>) -> Self {
        Self::new(StatusCode::PAYLOAD_TOO_LARGE, "too_large", m)
    }
    pub fn internal(m: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", m)
    }
}

impl From<RegistryError> for ApiError {
    fn from(e: RegistryError) -> Self {
        let code = e.code();
        let message = e.to_string();
        let (status, extra) = match &e {
            RegistryError::BadRequest(_) => (StatusCode::BAD_REQUEST, None),
            RegistryError::NotFound(_) => (StatusCode::NOT_FOUND, None),
            RegistryError::RevisionConflict {
                current_revision,
                base_revision,
            } => (
                StatusCode::CONFLICT,
                Some(json!({"current_revision": current_revision, "base_revision": base_revision})),
            ),
            RegistryError::SkillDeleted(_) | RegistryError::RevisionRevoked(_) => {
                (StatusCode::GONE, None)
            }
            RegistryError::TooLarge(_) => (StatusCode::PAYLOAD_TOO_LARGE, None),
            RegistryError::InvalidPackage { problems, warnings } => (
                StatusCode::UNPROCESSABLE_ENTITY,
                Some(json!({"problems": problems, "warnings": warnings})),
            ),
            RegistryError::SkillNotAuthorized(_) => (StatusCode::FORBIDDEN, None),
            RegistryError::NotActivated(_) => (StatusCode::NOT_FOUND, None),
            RegistryError::ActivationConflict {
                pinned_revision,
                requested_revision,
                ..
            } => (
                StatusCode::CONFLICT,
                Some(
                    json!({"pinned_revision": pinned_revision, "requested_revision": requested_revision}),
                ),
            ),
            RegistryError::PinnedRevisionUnavailable {
                skill,
                skill_id,
                revision,
                ..
            } => (
                StatusCode::GONE,
                Some(json!({"skill": skill, "skill_id": skill_id, "revision": revision})),
            ),
            RegistryError::BoxUnavailable(_) => (StatusCode::SERVICE_UNAVAILABLE, None),
            RegistryError::Internal(m) => {
                tracing::error!(error = %m, "internal error");
                (StatusCode::INTERNAL_SERVER_ERROR, None)
            }
        };
        ApiError {
            status,
            code,
            message,
            extra,
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut body = json!({"code": self.code, "message": self.message});
        if let (Some(Value::Object(extra)), Value::Object(obj)) = (self.extra, &mut body) {
            obj.extend(extra);
        }
        (self.status, axum::Json(json!({"error": body}))).into_response()
    }
}

pub type ApiResult<T> = Result<T, ApiError>;
