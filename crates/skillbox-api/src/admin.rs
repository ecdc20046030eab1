//! Administration (tokens, garbage collection, fsck), identity, health and the event log.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// `POST /v1/admin/tokens`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CreateToken {
    /// The token's workspace; absent for a node token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace: Option<String>,
    /// `reader`, `author`, `runner` or `admin` (of the workspace), or `node` (an execution
    /// node's, of no workspace).
    pub role: String,
}

/// A minted token: shown once, stored hashed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TokenCreated {
    pub token: String,
    /// `null` for a node token.
    pub workspace: Option<String>,
    pub role: String,
}

/// `GET /v1/whoami`: what the bearer token may do.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WhoAmI {
    /// `reader`, `author`, `runner` or `admin` (the server's admin token is `admin` of every
    /// workspace).
    pub role: String,
    /// The token's workspace; `null` for the server's admin token.
    pub workspace: Option<String>,
    /// Whether executions and run drafts can run (a sandbox backend is up).
    pub box_available: bool,
}

/// `GET /healthz`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Health {
    pub status: String,
}

/// `POST /v1/admin/gc` (the body is optional).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct GcRequest {
    #[serde(default)]
    pub dry_run: bool,
    pub grace_seconds: Option<u64>,
}

/// What a collection removed (or, dry, would remove).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct GcReport {
    pub dry_run: bool,
    pub grace_seconds: u64,
    pub runs_expired: u64,
    pub revisions: Vec<CollectedRevision>,
    pub trees_removed: usize,
    pub manifests_removed: usize,
    pub blobs_removed: usize,
    pub bytes_freed: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CollectedRevision {
    pub workspace: String,
    pub skill: String,
    pub skill_id: String,
    pub revision: i64,
    pub digest: String,
}

/// `POST /v1/admin/fsck`: stored content re-verified; nothing changed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FsckReport {
    pub ok: bool,
    pub blobs_checked: usize,
    pub revisions_checked: usize,
    pub trees_checked: usize,
    pub problems: Vec<FsckProblem>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FsckProblem {
    pub object: String,
    pub message: String,
}

/// `GET /v1/workspaces/{ws}/events?after=SEQ&follow=false`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EventsQuery {
    pub after: Option<i64>,
    #[serde(default = "follow_by_default")]
    pub follow: bool,
}

fn follow_by_default() -> bool {
    true
}

/// An event of a workspace's durable log: the `data` of its Server-Sent Event.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Event {
    pub seq: i64,
    /// `skill.published`, `skill.current_moved`, `skill.deleted`, `revision.revoked`,
    /// `revision.collected`.
    pub kind: String,
    pub at: i64,
    pub data: Value,
}

/// `GET /v1/admin/workspaces`: the workspaces that have skills or tokens, by name.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkspaceList {
    pub workspaces: Vec<String>,
}
