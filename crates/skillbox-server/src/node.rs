//! The HTTP surface of an execution node (`skillbox node`, SPEC §7.3): what Core calls. Every
//! route but `/healthz` demands the secret Core handed out at the node's latest registration,
//! so the node accepts requests from Core only.
//!
//! Executions on the node (`serve --box remote`) are not served yet: today a node registers,
//! heartbeats and answers Core's identity check.

use crate::error::{ApiError, ApiResult};
use axum::extract::{Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use skillbox_api::{ErrorCode, Health};
use skillbox_registry::auth::constant_time_eq;
use std::sync::{Arc, RwLock};

/// What a node knows of itself.
#[derive(Debug, Default)]
pub struct NodeIdentity {
    /// Core's id for this node ("" until the first registration).
    pub id: String,
    /// Core's current secret ("" until the first registration: nothing is accepted).
    pub secret: String,
}

pub type SharedIdentity = Arc<RwLock<NodeIdentity>>;

/// `GET /v1/node` (Core only): the node's id, so Core can check it reached the node it meant.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct NodeInfo {
    pub id: String,
    pub version: String,
}

/// Serves Core's calls on `listener` until `shutdown` resolves.
pub async fn serve(
    listener: tokio::net::TcpListener,
    identity: SharedIdentity,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, router(identity))
        .with_graceful_shutdown(shutdown)
        .await
}

/// The node's router.
pub fn router(identity: SharedIdentity) -> Router {
    let from_core = Router::new().route("/v1/node", get(info)).route_layer(
        axum::middleware::from_fn_with_state(identity.clone(), only_core),
    );
    Router::new()
        .route(
            "/healthz",
            get(|| async {
                Json(Health {
                    status: "ok".into(),
                })
            }),
        )
        .merge(from_core)
        .with_state(identity)
}

async fn info(State(identity): State<SharedIdentity>) -> ApiResult<Json<NodeInfo>> {
    let id = identity
        .read()
        .map_err(|_| ApiError::internal("node identity lock poisoned"))?
        .id
        .clone();
    Ok(Json(NodeInfo {
        id,
        version: env!("CARGO_PKG_VERSION").into(),
    }))
}

/// Lets through only requests bearing Core's current secret.
async fn only_core(State(identity): State<SharedIdentity>, req: Request, next: Next) -> Response {
    let presented = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("");
    let accepted = identity.read().is_ok_and(|id| {
        !id.secret.is_empty() && constant_time_eq(presented.as_bytes(), id.secret.as_bytes())
    });
    if !accepted {
        return ApiError::new(
            ErrorCode::Unauthorized,
            "this node accepts requests from its Core only",
        )
        .into_response();
    }
    next.run(req).await
}
