//! Error codes (SPEC §5) and the error envelope `{"error": {"code", "message", ...}}`.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

wire_enum! {
    /// Every error code the API answers with; [`ErrorCode::status`] pairs each with its HTTP
    /// status, in one place. `timeout`: the request took longer than the server's request
    /// timeout. `unavailable`: the metadata database or the content store does not answer
    /// (an outage; nothing was changed, retry later).
    pub enum ErrorCode {
        BadRequest = "bad_request", Unauthorized = "unauthorized", Forbidden = "forbidden",
        SkillNotAuthorized = "skill_not_authorized", NotFound = "not_found",
        NotActivated = "not_activated", MethodNotAllowed = "method_not_allowed",
        RevisionConflict = "revision_conflict", ActivationConflict = "activation_conflict",
        SkillDeleted = "skill_deleted", RevisionRevoked = "revision_revoked",
        PinnedRevisionUnavailable = "pinned_revision_unavailable", SandboxLost = "sandbox_lost",
        TooLarge = "too_large", InvalidPackage = "invalid_package",
        DependencyBuildFailed = "dependency_build_failed", Internal = "internal",
        BoxUnavailable = "box_unavailable", Timeout = "timeout", Unavailable = "unavailable",
    }
}

impl ErrorCode {
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
            ErrorCode::BoxUnavailable | ErrorCode::Timeout | ErrorCode::Unavailable => 503,
        }
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
