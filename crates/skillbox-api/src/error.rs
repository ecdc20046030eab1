//! Error codes (SPEC §5) and the error envelope `{"error": {"code", "message", ...}}`.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// Every error code the API answers with, and its HTTP status: the one place that pairs them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    BadRequest,
    Unauthorized,
    Forbidden,
    SkillNotAuthorized,
    NotFound,
    NotActivated,
    MethodNotAllowed,
    RevisionConflict,
    ActivationConflict,
    SkillDeleted,
    RevisionRevoked,
    PinnedRevisionUnavailable,
    SandboxLost,
    TooLarge,
    InvalidPackage,
    DependencyBuildFailed,
    Internal,
    BoxUnavailable,
    /// The request took longer than the server's request timeout.
    Timeout,
}

impl ErrorCode {
    pub const ALL: &[ErrorCode] = &[
        ErrorCode::BadRequest,
        ErrorCode::Unauthorized,
        ErrorCode::Forbidden,
        ErrorCode::SkillNotAuthorized,
        ErrorCode::NotFound,
        ErrorCode::NotActivated,
        ErrorCode::MethodNotAllowed,
        ErrorCode::RevisionConflict,
        ErrorCode::ActivationConflict,
        ErrorCode::SkillDeleted,
        ErrorCode::RevisionRevoked,
        ErrorCode::PinnedRevisionUnavailable,
        ErrorCode::SandboxLost,
        ErrorCode::TooLarge,
        ErrorCode::InvalidPackage,
        ErrorCode::DependencyBuildFailed,
        ErrorCode::Internal,
        ErrorCode::BoxUnavailable,
        ErrorCode::Timeout,
    ];

    /// The HTTP status the code is answered with.
    pub fn status(self) -> u16 {
        match self {
            ErrorCode::BadRequest => 400,
            ErrorCode::Unauthorized => 401,
            ErrorCode::Forbidden | ErrorCode::SkillNotAuthorized => 403,
            ErrorCode::NotFound | ErrorCode::NotActivated => 404,
            ErrorCode::MethodNotAllowed => 405,
            ErrorCode::RevisionConflict | ErrorCode::ActivationConflict => 409,
            ErrorCode::SkillDeleted
            | ErrorCode::RevisionRevoked
            | ErrorCode::PinnedRevisionUnavailable
            | ErrorCode::SandboxLost => 410,
            ErrorCode::TooLarge => 413,
            ErrorCode::InvalidPackage | ErrorCode::DependencyBuildFailed => 422,
            ErrorCode::Internal => 500,
            ErrorCode::BoxUnavailable | ErrorCode::Timeout => 503,
        }
    }

    /// The code as it appears on the wire (`"revision_conflict"`).
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::BadRequest => "bad_request",
            ErrorCode::Unauthorized => "unauthorized",
            ErrorCode::Forbidden => "forbidden",
            ErrorCode::SkillNotAuthorized => "skill_not_authorized",
            ErrorCode::NotFound => "not_found",
            ErrorCode::NotActivated => "not_activated",
            ErrorCode::MethodNotAllowed => "method_not_allowed",
            ErrorCode::RevisionConflict => "revision_conflict",
            ErrorCode::ActivationConflict => "activation_conflict",
            ErrorCode::SkillDeleted => "skill_deleted",
            ErrorCode::RevisionRevoked => "revision_revoked",
            ErrorCode::PinnedRevisionUnavailable => "pinned_revision_unavailable",
            ErrorCode::SandboxLost => "sandbox_lost",
            ErrorCode::TooLarge => "too_large",
            ErrorCode::InvalidPackage => "invalid_package",
            ErrorCode::DependencyBuildFailed => "dependency_build_failed",
            ErrorCode::Internal => "internal",
            ErrorCode::BoxUnavailable => "box_unavailable",
            ErrorCode::Timeout => "timeout",
        }
    }

    pub fn parse(code: &str) -> Option<ErrorCode> {
        ErrorCode::ALL.iter().copied().find(|c| c.as_str() == code)
    }
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The body of an error answer: `{"error": {...}}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorEnvelope {
    pub error: ErrorBody,
}

/// An error: its code, a message that says what to do, and the code's details
/// (`current_revision` for `revision_conflict`, `problems` for `invalid_package`, …).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorBody {
    /// A code of [`ErrorCode`]; a string so that a newer server's codes still parse.
    pub code: String,
    pub message: String,
    #[serde(flatten)]
    pub details: Map<String, Value>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_round_trips_through_its_wire_name() {
        for &code in ErrorCode::ALL {
            assert_eq!(ErrorCode::parse(code.as_str()), Some(code));
            let json = serde_json::to_value(code).unwrap();
            assert_eq!(json, Value::String(code.as_str().into()));
        }
    }

    #[test]
    fn statuses_are_the_specs() {
        assert_eq!(ErrorCode::RevisionConflict.status(), 409);
        assert_eq!(ErrorCode::PinnedRevisionUnavailable.status(), 410);
        assert_eq!(ErrorCode::Timeout.status(), 503);
        assert_eq!(ErrorCode::Internal.status(), 500);
        assert_eq!(ErrorCode::InvalidPackage.status(), 422);
    }

    #[test]
    fn details_sit_beside_code_and_message() {
        let body: ErrorEnvelope = serde_json::from_str(
            r#"{"error":{"code":"revision_conflict","message":"m","current_revision":3}}"#,
        )
        .unwrap();
        assert_eq!(body.error.code, "revision_conflict");
        assert_eq!(body.error.details["current_revision"], 3);
    }
}
