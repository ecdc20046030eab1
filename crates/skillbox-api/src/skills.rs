//! Skills, revisions, the current pointer and revocation.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use skillbox_package::{FileEntry, Problem};

/// A skill as listed: `GET /v1/workspaces/{ws}/skills`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SkillSummary {
    pub id: String,
    pub name: String,
    pub description: Option<String>,
    pub current_revision: i64,
    pub current_digest: Option<String>,
    pub state: String,
    pub created_at: i64,
    pub updated_at: i64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SkillList {
    pub skills: Vec<SkillSummary>,
}

/// `GET /v1/workspaces/{ws}/skills/{name}`: the summary and the current revision's
/// frontmatter (`null` while there is none).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SkillDetail {
    #[serde(flatten)]
    pub summary: SkillSummary,
    pub frontmatter: Value,
}

/// `DELETE /v1/workspaces/{ws}/skills/{name}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SkillDeleted {
    pub skill_id: String,
    pub name: String,
    pub state: String,
}

/// `POST …/skills/{name}/revisions?base_revision=N` (the body is the archive).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PublishQuery {
    pub base_revision: Option<i64>,
}

/// The answer to a publish (201, or 200 for a replayed retry).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Published {
    pub skill_id: String,
    pub name: String,
    pub revision: i64,
    pub digest: String,
    pub file_count: i64,
    pub size: i64,
    pub published_at: i64,
    pub warnings: Vec<Problem>,
    /// True when this answers a retry of a publish that had already committed.
    pub replayed: bool,
}

/// One revision of a skill, as its history lists it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Revision {
    pub skill_id: String,
    pub revision: i64,
    pub digest: String,
    pub parent_revision: i64,
    pub state: RevisionState,
    pub publisher: String,
    pub published_at: i64,
    pub file_count: i64,
    pub size: i64,
    pub frontmatter: Value,
    /// Why the revision left `available` (a revocation's reason).
    pub state_reason: Option<String>,
}

wire_enum! {
    /// A revision's life: `available` until revoked (an emergency) or collected (unreferenced,
    /// content removed).
    pub enum RevisionState {
        Available = "available", Revoked = "revoked", Collected = "collected",
    }
}

/// `GET …/skills/{name}/revisions`, newest first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RevisionList {
    pub revisions: Vec<Revision>,
}

/// `GET …/skills/{name}/revisions/{rev}`: one revision with its manifest.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RevisionDetail {
    pub skill: String,
    #[serde(flatten)]
    pub revision: Revision,
    pub manifest: Vec<FileEntry>,
}

/// `PUT …/skills/{name}/current`: move the pointer, compare-and-swap on `base_revision`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MoveCurrent {
    pub revision: i64,
    pub base_revision: i64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CurrentMoved {
    pub skill: String,
    pub current_revision: i64,
}

/// `POST …/revisions/{rev}/revoke`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RevokeRequest {
    pub reason: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Revoked {
    pub skill: String,
    pub skill_id: String,
    pub revision: i64,
    pub digest: String,
    pub state: RevisionState,
    pub reason: String,
    /// The skill's current revision after the revocation (it falls back when the revoked one
    /// was current).
    pub current_revision: i64,
}
