//! Execution nodes (SPEC §7.3): registration and heartbeats (node tokens), the admin's list.

use crate::SharedState;
use crate::auth::Caller;
use crate::error::{ApiError, ApiResult};
use crate::extract::{ApiJson, ApiPath};
use axum::Json;
use axum::extract::State;
use skillbox_api::{
    HeartbeatAck, NodeHeartbeat, NodeList, NodeRegistered, PrefetchSet, RegisterNode,
};

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

/// `GET /v1/nodes/{id}/prefetch`: Server-Sent Events, one `prefetch` event with the node's
/// whole prefetch set when it connects and again whenever Core's event log moves the set (a
/// publish or rollback of a skill its live runs pinned, a run placed or ended).
pub async fn prefetch(
    State(s): State<SharedState>,
    caller: Caller,
    ApiPath(id): ApiPath<String>,
) -> ApiResult<axum::response::Response> {
    use axum::response::IntoResponse;
    use axum::response::sse::{Event, KeepAlive, Sse};
    let token_hash = node_token(&caller)?.to_string();
    let first = s.registry.prefetch_set(&token_hash, &id).await?;
    struct Follower {
        changes: tokio::sync::watch::Receiver<u64>,
        s: SharedState,
        token_hash: String,
        id: String,
        sent: Option<PrefetchSet>,
        next: Option<PrefetchSet>,
    }
    let init = Follower {
        changes: s.registry.subscribe(),
        s,
        token_hash,
        id,
        sent: None,
        next: Some(first),
    };
    let stream = futures_util::stream::unfold(init, |mut st| async move {
        loop {
            if let Some(set) = st.next.take()
                && st.sent.as_ref() != Some(&set)
            {
                let data = serde_json::to_string(&set).unwrap_or_default();
                st.sent = Some(set);
                let ev = Event::default().event("prefetch").data(data);
                return Some((Ok::<_, std::convert::Infallible>(ev), st));
            }
            crate::routes::events::wait_for_change(&st.s, &mut st.changes).await;
            match st.s.registry.prefetch_set(&st.token_hash, &st.id).await {
                Ok(set) => st.next = Some(set),
                // The node was forgotten (a fresh database): it registers again and reconnects.
                Err(skillbox_registry::RegistryError::NotFound(_)) => return None,
                Err(e) => {
                    tracing::warn!(node = %st.id, error = %e, "prefetch set query failed");
                    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                }
            }
        }
    });
    Ok(Sse::new(stream)
        .keep_alive(KeepAlive::default())
        .into_response())
}
