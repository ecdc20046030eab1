//! Execution nodes (SPEC §7.3): registration and heartbeats (node tokens), the admin's list.

use crate::SharedState;
use crate::error::ApiResult;
use crate::extract::{ApiJson, ApiPath};
use axum::Json;
use axum::extract::State;
use skillbox_api::{HeartbeatAck, NodeHeartbeat, NodeList, NodeRegistered, RegisterNode};

pub async fn register(
    State(s): State<SharedState>,
    ApiJson(body): ApiJson<RegisterNode>,
) -> ApiResult<Json<NodeRegistered>> {
    let registered = s.registry.register_node(body, s.cfg.node_timeout).await?;
    tracing::info!(node = %registered.id, "node registered");
    Ok(Json(registered))
}

pub async fn heartbeat(
    State(s): State<SharedState>,
    ApiPath(id): ApiPath<String>,
    body: Option<ApiJson<NodeHeartbeat>>,
) -> ApiResult<Json<HeartbeatAck>> {
    let body = body.map(|ApiJson(b)| b).unwrap_or_default();
    s.registry.node_heartbeat(&id, body.load).await?;
    Ok(Json(HeartbeatAck {
        heartbeat_seconds: skillbox_registry::nodes::heartbeat_interval(s.cfg.node_timeout)
            .as_secs(),
    }))
}

pub async fn list(State(s): State<SharedState>) -> ApiResult<Json<NodeList>> {
    Ok(Json(NodeList {
        nodes: s.registry.nodes(s.cfg.node_timeout).await?,
    }))
}

/// `GET /v1/nodes/archives/{digest}`: the deterministic archive of a revision tree that a run
/// placed on a node has pinned (the node verifies it against the digest).
pub async fn archive(
    State(s): State<SharedState>,
    ApiPath(digest): ApiPath<String>,
) -> ApiResult<axum::response::Response> {
    use axum::response::IntoResponse;
    let tar = s.registry.archive_for_node(&digest).await?;
    Ok((
        [(axum::http::header::CONTENT_TYPE, "application/x-tar")],
        tar,
    )
        .into_response())
}
