//! Execution in a run's sandbox, with exactly the run's pinned packages mounted; answered
//! whole or, with `?stream=true`, as NDJSON lines ([`ExecStreamLine`]).

use crate::SharedState;
use crate::auth::truncated;
use crate::error::{ApiError, ApiResult};
use crate::extract::{ApiJson, ApiPath, ApiQuery};
use crate::sandbox::box_error;
use axum::Json;
use axum::body::Body;
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use skillbox_api::ErrorCode;
pub(crate) use skillbox_api::{
    ExecAnswer, ExecOutcome, ExecPackage, ExecQuery, ExecRequest, ExecStreamLine,
};
use skillbox_box::{ExecResult, Outcome, Program, StreamKind};
use skillbox_registry::RegistryError;

const MAX_TIMEOUT_MS: u64 = 600_000;
const DEFAULT_TIMEOUT_MS: u64 = 60_000;
pub(crate) const OUTPUT_CAP: usize = 1024 * 1024;

/// What the kernel cannot take (a NUL ends a C string; `=` ends an environment name) is refused
/// here, naming the field, instead of failing in the sandbox.
pub(crate) fn check_request(body: &ExecRequest) -> ApiResult<()> {
    let nul = |field: String| {
        Err(ApiError::bad_request(format!(
            "{field} contains a NUL byte, which no program can receive"
        )))
    };
    for (i, arg) in body.argv.iter().flatten().enumerate() {
        if arg.contains('\0') {
            return nul(format!("argv[{i}]"));
        }
    }
    if body.command.as_deref().is_some_and(|c| c.contains('\0')) {
        return nul("command".into());
    }
    if body.cwd.as_deref().is_some_and(|c| c.contains('\0')) {
        return nul("cwd".into());
    }
    for (name, value) in &body.env {
        if name.is_empty() || name.contains(['=', '\0']) {
            return Err(ApiError::bad_request(format!(
                "env: {:?} is not a variable name (names are non-empty, without '=' or NUL)",
                truncated(name, 80)
            )));
        }
        if value.contains('\0') {
            return nul(format!("env[{:?}]", truncated(name, 80)));
        }
    }
    Ok(())
}

pub async fn exec(
    State(s): State<SharedState>,
    ApiPath((ws, run)): ApiPath<(String, String)>,
    ApiQuery(q): ApiQuery<ExecQuery>,
    ApiJson(body): ApiJson<ExecRequest>,
) -> ApiResult<Response> {
    check_request(&body)?;
    let context = s.registry.exec_context(&ws, &run).await?;
    let program = match (body.argv, body.command) {
        (Some(argv), None) if !argv.is_empty() => Program::Argv(argv),
        (None, Some(cmd)) => Program::Shell(cmd),
        _ => {
            return Err(ApiError::bad_request(
                "give exactly one of argv (non-empty) or command",
            ));
        }
    };
    // The skill named by the request: its mount path is the default cwd, and its dependency
    // environment (if its package has a requirements.txt) is activated.
    let skill_mount = match &body.skill {
        Some(skill) => Some(
            context
                .pinned
                .iter()
                .find(|p| &p.pin.skill == skill)
                .ok_or_else(|| {
                    RegistryError::NotActivated(format!(
                        "skill {skill:?} is not activated in run {run}; activate it first"
                    ))
                })?
                .mount_path(),
        ),
        None => None,
    };
    let cwd = body
        .cwd
        .clone()
        .or_else(|| skill_mount.clone())
        .unwrap_or_else(|| "/workspace".into());
    let timeout_ms = body
        .timeout_ms
        .unwrap_or(DEFAULT_TIMEOUT_MS)
        .clamp(1, MAX_TIMEOUT_MS);
    let packages: Vec<ExecPackage> = context
        .pinned
        .iter()
        .map(|p| ExecPackage {
            skill: p.pin.skill.clone(),
            revision: p.pin.revision,
            digest: p.pin.digest.clone(),
        })
        .collect();
    if s.remote.is_some() {
        let node_exec = skillbox_api::NodeExec {
            sandbox_id: run.clone(),
            mounts: context
                .pinned
                .iter()
                .map(|p| skillbox_api::NodeMount {
                    target: p.mount_path(),
                    digest: p.pin.digest.clone(),
                })
                .collect(),
            environment_of: skill_mount,
            argv: match &program {
                Program::Argv(argv) => Some(argv.clone()),
                Program::Shell(_) => None,
            },
            command: match program {
                Program::Shell(cmd) => Some(cmd),
                Program::Argv(_) => None,
            },
            cwd,
            env: body.env,
            stdin: body.stdin,
            timeout_ms,
            stream: q.stream,
        };
        return crate::remote::exec(&s, &run, node_exec, packages, body.new_sandbox).await;
    }
    let sandbox_rt = s.running_box()?;
    let caps = sandbox_rt.backend.capabilities();
    if context.run.require_immutable && !caps.immutable {
        return Err(ApiError::new(
            ErrorCode::BoxUnavailable,
            format!(
                "this run requires read-only packages and the {} backend cannot enforce them",
                caps.backend
            ),
        ));
    }
    let sandbox = s.run_sandbox(&run, &context, skill_mount)?;
    let req = skillbox_box::ExecRequest {
        program,
        cwd,
        env: body.env,
        stdin: body.stdin.map(String::into_bytes),
        timeout: std::time::Duration::from_millis(timeout_ms),
        output_cap: OUTPUT_CAP,
        live: None,
    };
    let summary = Summary {
        sandbox_id: run,
        backend: caps.backend.to_string(),
        node: None,
        packages,
    };
    Ok(run_in_box(sandbox_rt, sandbox, req, summary, q.stream).await)
}

/// Runs `req` in `sandbox` on this process's box and answers: whole, or NDJSON lines as the
/// output comes (`stream`). Core's local executions and an execution node's share it.
pub(crate) async fn run_in_box(
    sandbox_rt: std::sync::Arc<skillbox_box::BoxRuntime>,
    sandbox: skillbox_box::Sandbox,
    mut req: skillbox_box::ExecRequest,
    summary: Summary,
    stream: bool,
) -> Response {
    if !stream {
        let result = match finish(sandbox_rt.exec(&sandbox, req).await) {
            Ok(r) => r,
            Err(e) => return e.into_response(),
        };
        let stdout = String::from_utf8_lossy(&result.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&result.stderr).into_owned();
        let mut answer = summary.answer(&result);
        answer.stdout = Some(stdout);
        answer.stderr = Some(stderr);
        return Json(answer).into_response();
    }
    let (tx, chunks) = tokio::sync::mpsc::unbounded_channel();
    req.live = Some(tx);
    let running = tokio::spawn(async move { sandbox_rt.exec(&sandbox, req).await });
    let lines =
        futures_util::stream::unfold(Some((chunks, running, summary)), |state| async move {
            let (mut chunks, running, summary) = state?;
            if let Some((kind, data)) = chunks.recv().await {
                let data = String::from_utf8_lossy(&data).into_owned();
                let line = match kind {
                    StreamKind::Stdout => ExecStreamLine::Stdout { data },
                    StreamKind::Stderr => ExecStreamLine::Stderr { data },
                };
                return Some((Ok(ndjson(&line)), Some((chunks, running, summary))));
            }
            let outcome = match running.await {
                Ok(r) => finish(r),
                Err(e) => Err(ApiError::internal(format!("execution task failed: {e}"))),
            };
            let line = match outcome {
                Ok(result) => ExecStreamLine::Exit(summary.answer(&result)),
                Err(e) => ExecStreamLine::Error { error: e.body() },
            };
            Some((Ok::<_, std::convert::Infallible>(ndjson(&line)), None))
        });
    (
        [(header::CONTENT_TYPE, "application/x-ndjson")],
        Body::from_stream(lines),
    )
        .into_response()
}

pub(crate) fn ndjson(line: &ExecStreamLine) -> String {
    let mut text = serde_json::to_string(line).unwrap_or_else(|e| {
        format!(r#"{{"type":"error","error":{{"code":"internal","message":"{e}"}}}}"#)
    });
    text.push('\n');
    text
}

/// What every answer of one execution says besides its result.
pub(crate) struct Summary {
    pub sandbox_id: String,
    pub backend: String,
    pub node: Option<String>,
    pub packages: Vec<ExecPackage>,
}

impl Summary {
    /// The answer for `result`, without its output (which the caller adds or streamed).
    fn answer(&self, result: &ExecResult) -> ExecAnswer {
        ExecAnswer {
            sandbox_id: self.sandbox_id.clone(),
            backend: self.backend.clone(),
            node: self.node.clone(),
            packages: self.packages.clone(),
            outcome: match result.outcome {
                Outcome::Exited => ExecOutcome::Exited,
                Outcome::Signaled => ExecOutcome::Signaled,
                Outcome::TimedOut => ExecOutcome::TimedOut,
                Outcome::Killed => ExecOutcome::Killed,
                Outcome::SandboxFailure => ExecOutcome::SandboxFailure,
            },
            exit_code: result.exit_code,
            signal: result.signal,
            timed_out: result.timed_out,
            stdout: None,
            stderr: None,
            stdout_truncated: result.stdout_truncated,
            stderr_truncated: result.stderr_truncated,
            duration_ms: result.duration_ms,
        }
    }
}

/// Maps the box's answer: a revocation kill is `revision_revoked`.
fn finish(r: Result<ExecResult, skillbox_box::BoxError>) -> ApiResult<ExecResult> {
    let result = r.map_err(box_error)?;
    if result.outcome == Outcome::Killed {
        return Err(RegistryError::RevisionRevoked(
            "the execution was killed: a revision it mounts was revoked".into(),
        )
        .into());
    }
    Ok(result)
}
