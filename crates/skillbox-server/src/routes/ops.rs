//! Operations: health, metrics, the OpenAPI document, identity.

use crate::SharedState;
use crate::auth::Caller;
use crate::error::ApiResult;
use axum::Json;
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use skillbox_api::{Health, WhoAmI};
use skillbox_registry::Principal;

pub async fn healthz(State(s): State<SharedState>) -> ApiResult<Json<Health>> {
    s.registry.ping().await?;
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
    let body = s.metrics.render(&[
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
    ]);
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], body).into_response()
}

pub async fn openapi() -> Json<serde_json::Value> {
    Json(crate::openapi::document())
}

pub async fn whoami(State(s): State<SharedState>, caller: Caller) -> ApiResult<Json<WhoAmI>> {
    let (role, workspace) = match caller.0 {
        Principal::ServerAdmin => ("admin", None),
        Principal::Workspace { workspace, role } => (role.as_str(), Some(workspace)),
    };
    Ok(Json(WhoAmI {
        role: role.into(),
        workspace,
        box_available: s.sandbox.is_some(),
    }))
}
