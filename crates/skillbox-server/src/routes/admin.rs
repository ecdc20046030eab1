//! Server administration: tokens, garbage collection, fsck.

use crate::SharedState;
use crate::error::{ApiError, ApiResult};
use crate::extract::ApiJson;
use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use skillbox_api::{CreateToken, FsckReport, GcReport, GcRequest, TokenCreated, WorkspaceList};
use skillbox_registry::Role;

pub async fn create_token(
    State(s): State<SharedState>,
    ApiJson(body): ApiJson<CreateToken>,
) -> ApiResult<(StatusCode, Json<TokenCreated>)> {
    if body.role == "node" {
        if body.workspace.is_some() {
            return Err(ApiError::bad_request(
                "a node token has no workspace: send {\"role\": \"node\"} alone",
            ));
        }
        let token = s.registry.create_node_token().await?;
        return Ok((
            StatusCode::CREATED,
            Json(TokenCreated {
                token,
                workspace: None,
                role: body.role,
            }),
        ));
    }
    let role = Role::parse(&body.role).ok_or_else(|| {
        ApiError::bad_request(format!(
            "unknown role {:?}: use reader, author, runner, admin (of a workspace) or node",
            body.role
        ))
    })?;
    let workspace = body.workspace.ok_or_else(|| {
        ApiError::bad_request(format!("a {} token needs a workspace", role.as_str()))
    })?;
    let token = s.registry.create_token(&workspace, role).await?;
    Ok((
        StatusCode::CREATED,
        Json(TokenCreated {
            token,
            workspace: Some(workspace),
            role: role.as_str().into(),
        }),
    ))
}

pub async fn gc(
    State(s): State<SharedState>,
    body: Option<ApiJson<GcRequest>>,
) -> ApiResult<Json<GcReport>> {
    let body = body.map(|ApiJson(b)| b).unwrap_or_default();
    let grace =
        std::time::Duration::from_secs(body.grace_seconds.unwrap_or(s.cfg.gc_grace.as_secs()));
    Ok(Json(s.registry.gc(body.dry_run, grace).await?))
}

pub async fn fsck(State(s): State<SharedState>) -> ApiResult<Json<FsckReport>> {
    Ok(Json(s.registry.fsck().await?))
}

pub async fn workspaces(State(s): State<SharedState>) -> ApiResult<Json<WorkspaceList>> {
    Ok(Json(WorkspaceList {
        workspaces: s.registry.workspaces().await?,
    }))
}
