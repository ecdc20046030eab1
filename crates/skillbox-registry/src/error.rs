//! Registry errors: one variant per SPEC §5 error code the registry can produce, and the
//! failures of what it stands on (metadata store, content store, disk), each keeping its source.

use serde_json::json;
use skillbox_api::ErrorCode;
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
    /// The caller may not do this (a node token speaking for another token's node).
    #[error("{0}")]
    Forbidden(String),
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
    /// The configured database or store cannot be used at all (at start): one line saying which
    /// and why; the full failure is logged.
    #[error("{0}")]
    Unusable(String),
    /// The metadata store failed (connection, query, constraint).
    #[error("metadata store: {0}")]
    Metadata(#[from] sqlx::Error),
    /// The content store failed.
    #[error("content store: {0}")]
    Store(#[from] object_store::Error),
    #[error("I/O: {0}")]
    Io(#[from] std::io::Error),
    /// A background task of the registry's died (it panicked or was cancelled).
    #[error("registry task failed: {0}")]
    Task(#[from] tokio::task::JoinError),
    /// Stored data contradicts itself (a row naming content that is not there, a malformed
    /// digest in a row), or another fault that is not the caller's.
    #[error("{message}")]
    Internal {
        message: String,
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    },
}

impl RegistryError {
    /// The SPEC §5 error code.
    pub fn code(&self) -> ErrorCode {
        match self {
            RegistryError::BadRequest(_) => ErrorCode::BadRequest,
            RegistryError::NotFound(_) => ErrorCode::NotFound,
            RegistryError::RevisionConflict { .. } => ErrorCode::RevisionConflict,
            RegistryError::SkillDeleted(_) => ErrorCode::SkillDeleted,
            RegistryError::RevisionRevoked(_) => ErrorCode::RevisionRevoked,
            RegistryError::TooLarge(_) => ErrorCode::TooLarge,
            RegistryError::InvalidPackage { .. } => ErrorCode::InvalidPackage,
            RegistryError::SkillNotAuthorized(_) => ErrorCode::SkillNotAuthorized,
            RegistryError::Forbidden(_) => ErrorCode::Forbidden,
            RegistryError::NotActivated(_) => ErrorCode::NotActivated,
            RegistryError::ActivationConflict { .. } => ErrorCode::ActivationConflict,
            RegistryError::PinnedRevisionUnavailable { .. } => ErrorCode::PinnedRevisionUnavailable,
            RegistryError::Unusable(_) => ErrorCode::Unavailable,
            RegistryError::Metadata(e) if metadata_outage(e) => ErrorCode::Unavailable,
            RegistryError::Store(e) if store_outage(e) => ErrorCode::Unavailable,
            RegistryError::Metadata(_)
            | RegistryError::Store(_)
            | RegistryError::Io(_)
            | RegistryError::Task(_)
            | RegistryError::Internal { .. } => ErrorCode::Internal,
        }
    }

    /// The code's details beside `code` and `message` in the error envelope.
    pub fn details(&self) -> serde_json::Map<String, serde_json::Value> {
        let value = match self {
            RegistryError::RevisionConflict {
                current_revision,
                base_revision,
            } => json!({"current_revision": current_revision, "base_revision": base_revision}),
            RegistryError::InvalidPackage { problems, warnings } => {
                json!({"problems": problems, "warnings": warnings})
            }
            RegistryError::ActivationConflict {
                pinned_revision,
                requested_revision,
                ..
            } => {
                json!({"pinned_revision": pinned_revision, "requested_revision": requested_revision})
            }
            RegistryError::PinnedRevisionUnavailable {
                skill,
                skill_id,
                revision,
                ..
            } => json!({"skill": skill, "skill_id": skill_id, "revision": revision}),
            _ => return serde_json::Map::new(),
        };
        match value {
            serde_json::Value::Object(map) => map,
            _ => serde_json::Map::new(),
        }
    }

    /// A fault that is not the caller's, keeping `source` for the logs.
    pub fn internal(source: impl std::error::Error + Send + Sync + 'static) -> Self {
        RegistryError::Internal {
            message: source.to_string(),
            source: Some(Box::new(source)),
        }
    }

    /// A fault that is not the caller's, with what was being done: `"{message}: {source}"`.
    pub fn context(
        message: impl std::fmt::Display,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        RegistryError::Internal {
            message: format!("{message}: {source}"),
            source: Some(Box::new(source)),
        }
    }

    /// Stored data that contradicts itself, or an invariant broken: `message` says which.
    pub fn broken(message: impl Into<String>) -> Self {
        RegistryError::Internal {
            message: message.into(),
            source: None,
        }
    }
}

/// Whether a metadata failure is the database being unreachable (connection refused or lost,
/// no connection free in time, the server shutting down) rather than a fault in a statement.
fn metadata_outage(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => true,
        // SQLSTATE classes 08 (connection exception) and 57 (operator intervention: shutdown,
        // admin terminating the connection).
        sqlx::Error::Database(db) => db
            .code()
            .is_some_and(|c| c.starts_with("08") || c.starts_with("57")),
        _ => false,
    }
}

/// Whether a content-store failure is the store being unreachable or failing (network, 5xx,
/// credentials refused) rather than an answer about an object.
fn store_outage(e: &object_store::Error) -> bool {
    !matches!(
        e,
        object_store::Error::NotFound { .. }
            | object_store::Error::AlreadyExists { .. }
            | object_store::Error::Precondition { .. }
            | object_store::Error::NotModified { .. }
            | object_store::Error::InvalidPath { .. }
            | object_store::Error::NotSupported { .. }
            | object_store::Error::NotImplemented { .. }
    )
}

/// The `<Code>` of an S3 error document.
pub(crate) fn s3_error_code(text: &str) -> Option<String> {
    let start = text.find("<Code>")? + "<Code>".len();
    let end = start + text[start..].find("</Code>")?;
    Some(text[start..end].to_string())
}

impl RegistryError {
    /// One line saying why: the S3 error code and message where a server sent one, else the
    /// innermost cause (connection refused, a timeout, a refused login), without the chain.
    pub fn one_line(&self) -> String {
        let text = self.to_string();
        let message = text.find("<Message>").and_then(|start| {
            let start = start + "<Message>".len();
            text[start..]
                .find("</Message>")
                .map(|end| &text[start..start + end])
        });
        match (s3_error_code(&text), message) {
            (Some(code), Some(message)) => format!("{code}: {message}"),
            (Some(code), None) => code,
            _ => {
                let mut cause: &dyn std::error::Error = self;
                while let Some(next) = cause.source() {
                    cause = next;
                }
                cause
                    .to_string()
                    .lines()
                    .next()
                    .unwrap_or_default()
                    .to_string()
            }
        }
    }

    /// Whether this is an outage of the database or the store (`unavailable`, 503).
    pub fn is_outage(&self) -> bool {
        self.code() == ErrorCode::Unavailable
    }
}

pub type Result<T, E = RegistryError> = std::result::Result<T, E>;
