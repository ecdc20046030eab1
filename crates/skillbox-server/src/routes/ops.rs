//! Operations: health, metrics, the OpenAPI document, identity.

use crate::SharedState;
use crate::auth::Caller;
use crate::error::{ApiError, ApiResult};
use axum::Json;
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use skillbox_api::{ErrorCode, Health, WhoAmI};
use skillbox_registry::Principal;

/// `ok` when the metadata database and the content store both answer within a few seconds,
/// else 503 `unavailable` naming which does not.
pub async fn healthz(State(s): State<SharedState>) -> ApiResult<Json<Health>> {
    const WITHIN: std::time::Duration = std::time::Duration::from_secs(3);
    let (db, store) = tokio::join!(
        tokio::time::timeout(WITHIN, s.registry.ping()),
        tokio::time::timeout(WITHIN, s.registry.ping_store()),
    );
    let mut down = Vec::new();
    for (what, answer) in [("the metadata database", db), ("the content store", store)] {
        match answer {
            Ok(Ok(())) => {}
            Ok(Err(e)) => down.push(format!("{what}: {e}")),
            Err(_) => down.push(format!("{what}: no answer within {}s", WITHIN.as_secs())),
        }
    }
    if !down.is_empty() {
        return Err(ApiError::new(
            ErrorCode::Unavailable,
            format!("unavailable: {}", down.join("; ")),
        ));
    }
    Ok(Json(Health {
        status: "ok".into(),
    }))
}

pub async fn metrics(State(s): State<SharedState>) -> Response {
    // Asked of the content store and the revision cache, so a remote store counts too.
    let usage = match s.registry.content().usage().await {
        Ok(u) => u,
        Err(e) => {
            tracing::warn!(error = %e, "cannot measure the content store for /metrics");
            Default::default()
        }
    };
    let registry = s.registry.clone();
    let trees = tokio::task::spawn_blocking(move || registry.cache().tree_count())
        .await
        .unwrap_or(0);
    let (builds, executing) = s
        .sandbox
        .as_ref()
        .map(|b| (b.deps.builds(), b.executions.in_progress() as u64))
        .unwrap_or((0, 0));
    let (pin_commits, pins_written) = s.registry.meta().pin_commits();
    let counters = [
        (
            "skillbox_pin_commits_total",
            "Durable commits that wrote activations' pins (on SQLite: WAL flushes, each covering one or more batches).",
            pin_commits,
        ),
        (
            "skillbox_pins_written_total",
            "Pins written by activations.",
            pins_written,
        ),
        (
            "skillbox_zero_copy_bytes_total",
            "Response body bytes sent with sendfile from revision-cache files instead of copied.",
            crate::zero_copy_io::ZERO_COPY_BYTES.load(std::sync::atomic::Ordering::Relaxed),
        ),
    ];
    let body = s.metrics.render(
        &counters,
        &[
            (
                "skillbox_dep_env_builds",
                "Dependency environments built by this process.",
                builds,
            ),
            (
                "skillbox_box_executions_in_progress",
                "Sandbox executions running now.",
                executing,
            ),
            (
                "skillbox_store_blobs",
                "Blobs in the content store.",
                usage.blobs,
            ),
            (
                "skillbox_store_blob_bytes",
                "Bytes of blobs in the content store.",
                usage.blob_bytes,
            ),
            (
                "skillbox_revision_cache_trees",
                "Trees in the revision cache.",
                trees,
            ),
        ],
    );
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], body).into_response()
}

pub async fn openapi() -> Json<serde_json::Value> {
    Json(crate::openapi::document())
}

pub async fn whoami(State(s): State<SharedState>, caller: Caller) -> ApiResult<Json<WhoAmI>> {
    let (role, workspace) = match caller.0 {
        Principal::ServerAdmin => ("admin", None),
        Principal::Node { .. } => ("node", None),
        Principal::Workspace { workspace, role } => (role.as_str(), Some(workspace)),
    };
    Ok(Json(WhoAmI {
        role: role.into(),
        workspace,
        box_available: s.box_available(),
    }))
}
