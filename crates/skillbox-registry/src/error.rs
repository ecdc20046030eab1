//! Registry errors, one variant per SPEC §5 error code the registry can produce.

use skillbox_package::Problem;

#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error("{0}")]
    BadRequest(String),
    #[error("{0}")]
    NotFound(String),
    #[error(
        "the skill's current revision is {current_revision}, not the base revision {base_revision}; fetch the current revision and publish again with base_revision={current_revision}"
    )]
    RevisionConflict {
        current_revision: i64,
        base_revision: i64,
    },
    #[error("{0}")]
    SkillDeleted(String),
    #[error("{0}")]
    RevisionRevoked(String),
    #[error("{0}")]
    TooLarge(String),
    #[error("invalid package: {} problem(s)", problems.len())]
    InvalidPackage {
        problems: Vec<Problem>,
        warnings: Vec<Problem>,
    },
    #[error("{0}")]
    SkillNotAuthorized(String),
    #[error("{0}")]
    NotActivated(String),
    #[error(
        "skill {skill:?} is pinned to revision {pinned_revision} in this run; revision {requested_revision} cannot be activated too"
    )]
    ActivationConflict {
        skill: String,
        pinned_revision: i64,
        requested_revision: i64,
    },
    #[error("revision {revision} of skill {skill:?}, pinned by this run, is unavailable: {reason}")]
    PinnedRevisionUnavailable {
        skill: String,
        skill_id: String,
        revision: i64,
        reason: String,
    },
    #[error("{0}")]
    BoxUnavailable(String),
    #[error("{0}")]
    Internal(String),
}

impl RegistryError {
    /// The SPEC §5 error code.
    pub fn code(&self) -> &'static str {
        match self {
            RegistryError::BadRequest(_) => "bad_request",
            RegistryError::NotFound(_) => "not_found",
            RegistryError::RevisionConflict { .. } => "revision_conflict",
            RegistryError::SkillDeleted(_) => "skill_deleted",
            RegistryError::RevisionRevoked(_) => "revision_revoked",
            RegistryError::TooLarge(_) => "too_large",
            RegistryError::InvalidPackage { .. } => "invalid_package",
            RegistryError::SkillNotAuthorized(_) => "skill_not_authorized",
            RegistryError::NotActivated(_) => "not_activated",
            RegistryError::ActivationConflict { .. } => "activation_conflict",
            RegistryError::PinnedRevisionUnavailable { .. } => "pinned_revision_unavailable",
            RegistryError::BoxUnavailable(_) => "box_unavailable",
            RegistryError::Internal(_) => "internal",
        }
    }

    pub fn internal(e: impl std::fmt::Display) -> Self {
        RegistryError::Internal(e.to_string())
    }
}

impl From<sqlx::Error> for RegistryError {
    fn from(e: sqlx::Error) -> Self {
        RegistryError::Internal(format!("metadata store: {e}"))
    }
}

impl From<std::io::Error> for RegistryError {
    fn from(e: std::io::Error) -> Self {
        RegistryError::Internal(format!("I/O: {e}"))
    }
}

impl From<object_store::Error> for RegistryError {
    fn from(e: object_store::Error) -> Self {
        match e {
            object_store::Error::NotFound { path, .. } => {
                RegistryError::Internal(format!("content missing from the store: {path}"))
            }
            e => RegistryError::Internal(format!("content store: {e}")),
        }
    }
}

pub type Result<T, E = RegistryError> = std::result::Result<T, E>;
