//! Drafts (server-side file sets) and run drafts (in a run's sandbox workspace).

use serde::{Deserialize, Serialize};

/// `POST /v1/workspaces/{ws}/drafts`: a draft of `skill` with the files of `base_revision`
/// (0: empty, for a new skill).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CreateDraft {
    pub skill: String,
    #[serde(default)]
    pub base_revision: i64,
}

/// A draft as created or rebased.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DraftCreated {
    pub draft_id: String,
    pub skill: String,
    pub base_revision: i64,
}

/// `GET /v1/workspaces/{ws}/drafts/{id}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DraftDetail {
    pub draft_id: String,
    pub skill: String,
    pub base_revision: i64,
    pub created_at: i64,
    pub updated_at: i64,
    pub files: Vec<DraftFile>,
}

/// One file of a draft (the answer to a file write, too).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DraftFile {
    pub path: String,
    pub sha256: String,
    pub size: i64,
    pub executable: bool,
}

/// `PUT /v1/workspaces/{ws}/drafts/{id}`: rebase.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Rebase {
    pub base_revision: i64,
}

/// `PUT …/drafts/{id}/files/{path}?executable=true`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PutFileQuery {
    #[serde(default)]
    pub executable: bool,
}

/// `POST /v1/workspaces/{ws}/runs/{run}/drafts`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CreateRunDraft {
    pub skill: String,
    pub base_revision: Option<i64>,
}

/// A run draft: its files are at `path` in the run's sandbox.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunDraftCreated {
    pub draft_id: String,
    pub skill: String,
    pub base_revision: i64,
    pub run_id: String,
    pub path: String,
}
