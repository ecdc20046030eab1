//! Execution nodes (SPEC §7.3): registration and heartbeats (node tokens), the admin's list.

use crate::SharedState;
use crate::auth::Caller;
use crate::error::{ApiError, ApiResult};
use crate::extract::{ApiJson, ApiPath};
use axum::Json;
use axum::extract::State;
use skillbox_api::{HeartbeatAck, NodeHeartbeat, NodeList, NodeRegistered, RegisterNode};

/// The node token's hash (the route's access check let only node tokens through).
fn node_token(caller: &Caller) -> ApiResult<&str> {
    match &caller.0 {
        skillbox_registry::Principal::Node { token_hash } => Ok(token_hash),
        _ => Err(ApiError::internal("a node route without a node token")),
    }
}

pub async fn register(
    State(s): State<SharedState>,
    caller: Caller,
    ApiJson(body): ApiJson<RegisterNode>,
) -> ApiResult<Json<NodeRegistered>> {
    let registered = s
        .registry
        .register_node(node_token(&caller)?, body, s.cfg.node_timeout)
        .await?;
    tracing::info!(node = %registered.id, "node registered");
    Ok(Json(registered))
}

pub async fn heartbeat(
    State(s): State<SharedState>,
    caller: Caller,
    ApiPath(id): ApiPath<String>,
    body: Option<ApiJson<NodeHeartbeat>>,
) -> ApiResult<Json<HeartbeatAck>> {
    let body = body.map(|ApiJson(b)| b).unwrap_or_default();
    s.registry
        .node_heartbeat(node_token(&caller)?, &id, body.load)
        .await?;
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
    caller: Caller,
    ApiPath(digest): ApiPath<String>,
) -> ApiResult<axum::response::Response> {
    use axum::response::IntoResponse;
    let tar = s
        .registry
        .archive_for_node(node_token(&caller)?, &digest)
        .await?;
    Ok((
        [(axum::http::header::CONTENT_TYPE, "application/x-tar")],
        tar,
    )
        .into_response())
}
