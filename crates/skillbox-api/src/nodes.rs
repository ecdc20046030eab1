//! Execution nodes (SPEC §7.3): registration, heartbeats, and the admin's list.

use serde::{Deserialize, Serialize};

/// `POST /v1/nodes` (node token): a node announcing itself, at start and after a restart.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RegisterNode {
    /// The identity the node kept in its data directory from an earlier registration; absent
    /// the first time (Core assigns one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// Where Core reaches the node (`--advertise`, else its listen address), e.g.
    /// `http://10.0.0.5:7421`.
    pub address: String,
    /// The node's skillbox version.
    pub version: String,
}

/// The answer to a registration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeRegistered {
    pub id: String,
    /// What Core presents (as a bearer token) when it calls the node; the node accepts nothing
    /// else. New at every registration.
    pub secret: String,
    /// How often to heartbeat: at most a third of Core's `--node-timeout`.
    pub heartbeat_seconds: u64,
}

/// `POST /v1/nodes/{id}/heartbeat` (node token).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct NodeHeartbeat {
    /// Executions in progress on the node.
    #[serde(default)]
    pub load: u64,
}

/// The answer to a heartbeat.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HeartbeatAck {
    pub heartbeat_seconds: u64,
}

wire_enum! {
    /// A node is `live` while its heartbeats arrive within Core's `--node-timeout`, else
    /// `lost` (and stays listed).
    pub enum NodeState { Live = "live", Lost = "lost", }
}

/// A node as `GET /v1/admin/nodes` lists it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeView {
    pub id: String,
    pub address: String,
    pub state: NodeState,
    pub load: u64,
    /// Milliseconds since the epoch.
    pub last_heartbeat: i64,
    pub version: String,
}

/// `GET /v1/admin/nodes`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeList {
    pub nodes: Vec<NodeView>,
}

/// A package an execution on a node mounts: where, and which revision tree by digest (the node
/// fetches it from Core and verifies it).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeMount {
    pub target: String,
    pub digest: String,
}

/// `POST /v1/node/exec` (Core → node, with Core's secret): one execution in a run's sandbox.
/// Core has checked the run, its pins and the request; the node prepares the packages and runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeExec {
    pub sandbox_id: String,
    pub mounts: Vec<NodeMount>,
    /// The mount target whose dependency environment is activated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub environment_of: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub argv: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
    pub cwd: String,
    #[serde(default)]
    pub env: std::collections::BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdin: Option<String>,
    pub timeout_ms: u64,
    /// Answer NDJSON lines ([`crate::ExecStreamLine`]) as the output comes.
    #[serde(default)]
    pub stream: bool,
}

/// `POST /v1/node/revoke` (Core → node): a revision was revoked. The node kills the executions
/// that mount `target` and removes its prepared copies and its tree of `digest`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeRevoke {
    pub target: String,
    pub digest: String,
}

/// `POST /v1/node/sandboxes/{id}/release` (Core → node): whether the ended run's sandbox was
/// released (false while an execution is still in progress in it; Core asks again later).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SandboxReleased {
    pub released: bool,
}

/// A package a node may fetch ahead of use: the current revision of a skill that a live run
/// placed on it has pinned.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PrefetchPackage {
    pub skill_id: String,
    pub revision: i64,
    pub digest: String,
}

/// `GET /v1/nodes/{id}/prefetch` (node → Core, SSE): each `prefetch` event carries the whole
/// set, sent when the node connects and whenever Core's event log moves it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PrefetchSet {
    pub packages: Vec<PrefetchPackage>,
}
