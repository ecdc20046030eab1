//! Runs, activations (pins), the prompt index and executions.

use crate::error::ErrorBody;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use skillbox_package::FileEntry;
use std::collections::BTreeMap;

/// `POST /v1/workspaces/{ws}/runs` (the body is optional).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CreateRun {
    /// The authorized skills; default: every skill of the workspace.
    pub skills: Option<Vec<String>>,
    pub ttl_seconds: Option<u64>,
    #[serde(default)]
    pub require_immutable: bool,
}

/// A run: its state, lease and pins.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunView {
    pub run_id: String,
    pub state: RunState,
    pub authorized_skills: Vec<String>,
    pub expires_at: i64,
    pub ttl_seconds: i64,
    pub require_immutable: bool,
    pub created_at: i64,
    pub activations: Vec<Pin>,
}

wire_enum! {
    /// A run's life: `active` until finished or until its lease lapses (`expired`).
    pub enum RunState {
        Active = "active", Finished = "finished", Expired = "expired",
    }
}

/// One skill pinned by a run: the revision every read and execution of the run sees.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Pin {
    pub skill: String,
    pub skill_id: String,
    pub revision: i64,
    pub digest: String,
    pub activated_at: i64,
}

/// `POST …/runs/{run}/activations`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Activate {
    pub skill: String,
    pub revision: Option<i64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Activation {
    pub skill: String,
    pub skill_id: String,
    pub revision: i64,
    pub digest: String,
    pub instructions: String,
    pub frontmatter: Value,
    pub files: Vec<FileEntry>,
    pub mount_path: String,
}

/// `GET …/runs/{run}/prompt`: the `<available_skills>` block and the skills in it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Prompt {
    pub prompt: String,
    pub skills: Vec<PromptSkill>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PromptSkill {
    pub name: String,
    pub description: String,
}

/// `POST …/runs/{run}/exec`: exactly one of `argv` and `command`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ExecRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skill: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub argv: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdin: Option<String>,
    /// `serve --box remote`: place a fresh sandbox on another live node, with the same pins
    /// (after `sandbox_lost`). The old sandbox's workspace is not carried over.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub new_sandbox: bool,
}

/// `?stream=true` answers NDJSON ([`ExecStreamLine`]).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ExecQuery {
    #[serde(default)]
    pub stream: bool,
}

wire_enum! {
    /// How an execution ended: `killed` because a package it mounts was revoked;
    /// `sandbox_failure` when the sandbox itself could not be set up (the program did not run).
    pub enum ExecOutcome {
        Exited = "exited", Signaled = "signaled", TimedOut = "timed_out",
        Killed = "killed", SandboxFailure = "sandbox_failure",
    }
}

/// A package mounted for an execution.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExecPackage {
    pub skill: String,
    pub revision: i64,
    pub digest: String,
}

/// The answer to an execution; in a stream, the `exit` line (without `stdout`/`stderr`, which
/// came as their own lines).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExecAnswer {
    pub sandbox_id: String,
    pub backend: String,
    /// `serve --box remote`: the node the run's sandbox is on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    pub packages: Vec<ExecPackage>,
    pub outcome: ExecOutcome,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub timed_out: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdout: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stderr: Option<String>,
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
    pub duration_ms: u64,
}

/// One line of a streamed execution.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ExecStreamLine {
    Stdout { data: String },
    Stderr { data: String },
    Exit(ExecAnswer),
    Error { error: ErrorBody },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_lines_are_tagged_by_type() {
        let line = ExecStreamLine::Stdout { data: "hi".into() };
        assert_eq!(
            serde_json::to_value(&line).unwrap(),
            serde_json::json!({"type": "stdout", "data": "hi"})
        );
        let exit: ExecStreamLine = serde_json::from_str(
            r#"{"type":"exit","sandbox_id":"r","backend":"bwrap","packages":[],"outcome":"exited",
                "exit_code":0,"signal":null,"timed_out":false,"stdout_truncated":false,
                "stderr_truncated":false,"duration_ms":3}"#,
        )
        .unwrap();
        let ExecStreamLine::Exit(answer) = exit else {
            panic!("not an exit line: {exit:?}")
        };
        assert_eq!(answer.exit_code, Some(0));
        assert_eq!(answer.stdout, None);
    }
}

/// `GET /v1/workspaces/{ws}/runs`: the workspace's live runs, newest first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunList {
    pub runs: Vec<LiveRun>,
}

/// A live run as the console shows it: the run, and where its sandbox is.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LiveRun {
    #[serde(flatten)]
    pub run: RunView,
    /// The backend of the run's sandbox on this server (`bwrap`, `docker`), when it has one.
    pub sandbox: Option<String>,
    /// The execution node its sandbox is placed on (`serve --box remote`), when placed.
    pub node: Option<String>,
}
