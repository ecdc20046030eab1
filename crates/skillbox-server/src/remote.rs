//! `serve --box remote` (SPEC §7.3): a run's executions on an execution node. The run's
//! sandbox is placed on the least loaded live node at its first execution (the placement is a
//! row in the database, so every Core server routes the run alike); every later execution of
//! the run goes to that node, which fetches the pinned packages from Core by digest, verifies
//! them and runs. A placed node that is lost answers `sandbox_lost` (naming it) — never a
//! silent re-run on a blank workspace elsewhere — until the client asks for `new_sandbox`.

use crate::SharedState;
use crate::error::{ApiError, ApiResult};
use crate::routes::exec::{ExecPackage, ExecStreamLine, ndjson};
use axum::Json;
use axum::body::Body;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use skillbox_api::{ErrorCode, ErrorEnvelope, ExecAnswer, NodeExec};
use skillbox_registry::nodes::Placement;

/// Core's side of the nodes: the HTTP client it calls them with.
#[derive(Debug, Clone)]
pub struct RemoteBox {
    http: reqwest::Client,
}

impl Default for RemoteBox {
    fn default() -> Self {
        RemoteBox {
            // No overall timeout: an execution takes as long as its own timeout allows.
            http: reqwest::Client::builder()
                .connect_timeout(std::time::Duration::from_secs(5))
                .build()
                .unwrap_or_default(),
        }
    }
}

/// Forwards one execution of run `run` to its node and answers as a local execution would,
/// with `backend: "remote"` and the node's id.
pub async fn exec(
    s: &SharedState,
    run: &str,
    req: NodeExec,
    packages: Vec<ExecPackage>,
    new_sandbox: bool,
) -> ApiResult<Response> {
    let remote = remote_box(s)?;
    let node = node_for(s, run, new_sandbox).await?;
    let stream = req.stream;
    let answer = remote
        .http
        .post(format!("{}/v1/node/exec", node.address))
        .bearer_auth(&node.secret)
        .json(&req)
        .send()
        .await
        .map_err(|e| {
            ApiError::new(
                ErrorCode::BoxUnavailable,
                format!(
                    "execution node {} at {} does not answer: {e}",
                    node.id, node.address
                ),
            )
        })?;
    if !answer.status().is_success() {
        return Err(node_error(&node, answer).await);
    }
    let node_id = node.id.clone();
    let dress = move |mut a: ExecAnswer| {
        a.backend = "remote".into();
        a.node = Some(node_id.clone());
        a.packages = packages.clone();
        a
    };
    if !stream {
        let a: ExecAnswer = answer
            .json()
            .await
            .map_err(|e| ApiError::internal(format!("execution node {}'s answer: {e}", node.id)))?;
        return Ok((StatusCode::OK, Json(dress(a))).into_response());
    }
    // Line by line as the node sends them; the last (exit) line is Core's.
    use futures_util::StreamExt;
    let mut chunks = answer.bytes_stream();
    let lines = async_stream_lines(move |tx| async move {
        let mut buf = Vec::new();
        while let Some(chunk) = chunks.next().await {
            let Ok(chunk) = chunk else { break };
            buf.extend_from_slice(&chunk);
            while let Some(end) = buf.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = buf.drain(..=end).collect();
                let out = match serde_json::from_slice::<ExecStreamLine>(&line) {
                    Ok(ExecStreamLine::Exit(a)) => ndjson(&ExecStreamLine::Exit(dress(a))),
                    Ok(other) => ndjson(&other),
                    Err(_) => continue,
                };
                if tx.send(out).is_err() {
                    return;
                }
            }
        }
    });
    Ok((
        [(header::CONTENT_TYPE, "application/x-ndjson")],
        Body::from_stream(lines),
    )
        .into_response())
}

/// The workspace directory a transfer is about (a header: the path is the caller's choice of
/// characters, not a URL's).
pub const DIR_HEADER: &str = "x-skillbox-dir";
/// The most bytes a packed workspace directory may hold.
pub const CAP_HEADER: &str = "x-skillbox-cap";

fn remote_box(s: &SharedState) -> ApiResult<&RemoteBox> {
    s.remote
        .as_ref()
        .ok_or_else(|| ApiError::internal("no remote box"))
}

/// The live node of run `run`'s sandbox (placing it at its first use, or afresh when
/// `new_sandbox`): `sandbox_lost` when its node is lost, `box_unavailable` when no node is live.
async fn node_for(
    s: &SharedState,
    run: &str,
    new_sandbox: bool,
) -> ApiResult<skillbox_registry::meta::NodeRow> {
    match s
        .registry
        .placement(run, new_sandbox, s.cfg.node_timeout)
        .await?
    {
        Placement::On(node) => Ok(node),
        Placement::Lost(node) => {
            let mut e = ApiError::new(
                ErrorCode::SandboxLost,
                format!(
                    "the sandbox of run {run} was on node {node}, which is lost; its workspace is gone. Ask for a fresh one with the same pins: exec {{\"new_sandbox\": true, ...}}"
                ),
            );
            e.details.insert("node".into(), node.into());
            Err(e)
        }
        Placement::NoLiveNode => Err(ApiError::new(
            ErrorCode::BoxUnavailable,
            "no live execution node (skillbox node) to run on: activation and reads work",
        )),
    }
}

/// A node's refusal, as the client gets it: the node's error code and message.
async fn node_error(
    node: &skillbox_registry::meta::NodeRow,
    answer: reqwest::Response,
) -> ApiError {
    let status = answer.status().as_u16();
    let body: Option<ErrorEnvelope> = answer.json().await.ok();
    let error = body
        .map(|b| b.error)
        .unwrap_or_else(|| skillbox_api::ErrorBody {
            code: "internal".into(),
            message: format!("execution node {} answered {status}", node.id),
            details: Default::default(),
        });
    let mut e = ApiError::new(
        ErrorCode::parse(&error.code).unwrap_or(ErrorCode::Internal),
        error.message,
    );
    e.details = error.details;
    e
}

fn unreachable(node: &skillbox_registry::meta::NodeRow, e: reqwest::Error) -> ApiError {
    ApiError::new(
        ErrorCode::BoxUnavailable,
        format!(
            "execution node {} at {} does not answer: {e}",
            node.id, node.address
        ),
    )
}

/// Unpacks `tar` into `dir` (under `/workspace`) of run `run`'s sandbox on its node.
pub async fn import_workspace(
    s: &SharedState,
    run: &str,
    dir: &str,
    tar: Vec<u8>,
) -> ApiResult<()> {
    let remote = remote_box(s)?;
    let node = node_for(s, run, false).await?;
    let answer = remote
        .http
        .put(format!(
            "{}/v1/node/sandboxes/{run}/workspace",
            node.address
        ))
        .header(DIR_HEADER, dir)
        .bearer_auth(&node.secret)
        .body(tar)
        .send()
        .await
        .map_err(|e| unreachable(&node, e))?;
    if !answer.status().is_success() {
        return Err(node_error(&node, answer).await);
    }
    Ok(())
}

/// Packs `dir` (under `/workspace`) of run `run`'s sandbox on its node: at most `cap` bytes.
pub async fn export_workspace(
    s: &SharedState,
    run: &str,
    dir: &str,
    cap: usize,
) -> ApiResult<Vec<u8>> {
    let remote = remote_box(s)?;
    let node = node_for(s, run, false).await?;
    let answer = remote
        .http
        .get(format!(
            "{}/v1/node/sandboxes/{run}/workspace",
            node.address
        ))
        .header(DIR_HEADER, dir)
        .header(CAP_HEADER, cap.to_string())
        .bearer_auth(&node.secret)
        .send()
        .await
        .map_err(|e| unreachable(&node, e))?;
    if !answer.status().is_success() {
        return Err(node_error(&node, answer).await);
    }
    Ok(answer
        .bytes()
        .await
        .map_err(|e| unreachable(&node, e))?
        .to_vec())
}

/// Asks the nodes of ended runs to release their sandboxes (workspace, prepared copies), and
/// forgets each placement its node released; returns how many. A lost node keeps its
/// placements until it is back.
pub async fn release_ended(s: &SharedState) -> usize {
    let Some(remote) = &s.remote else {
        return 0;
    };
    let ended = match s
        .registry
        .meta()
        .ended_placements(skillbox_registry::meta::now_ms())
        .await
    {
        Ok(ended) => ended,
        Err(e) => {
            tracing::warn!(error = %e, "cannot list ended runs' placements");
            return 0;
        }
    };
    if ended.is_empty() {
        return 0;
    }
    let nodes = s.registry.meta().nodes().await.unwrap_or_default();
    let mut released = 0;
    for (run, node_id) in ended {
        let Some(node) = nodes
            .iter()
            .find(|n| n.id == node_id && n.is_live(s.cfg.node_timeout))
        else {
            continue;
        };
        let answer = remote
            .http
            .post(format!("{}/v1/node/sandboxes/{run}/release", node.address))
            .bearer_auth(&node.secret)
            .send()
            .await;
        let done = match answer {
            Ok(a) if a.status().is_success() => a
                .json::<skillbox_api::SandboxReleased>()
                .await
                .is_ok_and(|r| r.released),
            Ok(a) => {
                tracing::warn!(%run, node = %node.id, status = %a.status(), "a node refused to release a sandbox");
                false
            }
            Err(e) => {
                tracing::warn!(%run, node = %node.id, error = %e, "cannot ask a node to release a sandbox");
                false
            }
        };
        if done {
            if let Err(e) = s.registry.meta().forget_placement(&run, &node.id).await {
                tracing::warn!(%run, error = %e, "cannot forget a released placement");
            }
            released += 1;
        }
    }
    released
}

/// A stream of the strings `produce` sends, produced on a task of its own.
fn async_stream_lines<F, Fut>(
    produce: F,
) -> impl futures_util::Stream<Item = Result<String, std::convert::Infallible>>
where
    F: FnOnce(tokio::sync::mpsc::UnboundedSender<String>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(produce(tx));
    futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|line| (Ok(line), rx))
    })
}

/// `--box remote`: every revocation (through this server or, on PostgreSQL, any server) is
/// sent to every live node, which kills the executions mounting the revision and removes its
/// copies.
pub fn spawn_revocation_relay(state: SharedState) {
    let Some(remote) = state.remote.clone() else {
        return;
    };
    let mut rx = state.registry.subscribe_revocations();
    tokio::spawn(async move {
        loop {
            let (skill_id, revision) = match rx.recv().await {
                Ok(r) => r,
                Err(tokio::sync::broadcast::error::RecvError::Lagged(n)) => {
                    tracing::error!(missed = n, "revocation notices lagged");
                    continue;
                }
                Err(tokio::sync::broadcast::error::RecvError::Closed) => break,
            };
            let digest = match state.registry.meta().revision(&skill_id, revision).await {
                Ok(Some(r)) => r.digest,
                _ => String::new(),
            };
            let notice = skillbox_api::NodeRevoke {
                target: skillbox_registry::runs::mount_path(&skill_id, revision),
                digest,
            };
            let rows = match state.registry.meta().nodes().await {
                Ok(rows) => rows,
                Err(e) => {
                    tracing::error!(error = %e, "cannot list nodes to relay a revocation");
                    continue;
                }
            };
            for row in rows.iter().filter(|r| r.is_live(state.cfg.node_timeout)) {
                let sent = remote
                    .http
                    .post(format!("{}/v1/node/revoke", row.address))
                    .bearer_auth(&row.secret)
                    .json(&notice)
                    .send()
                    .await;
                if let Err(e) = sent {
                    tracing::warn!(node = %row.id, error = %e, "cannot tell a node of a revocation");
                }
            }
        }
    });
}
