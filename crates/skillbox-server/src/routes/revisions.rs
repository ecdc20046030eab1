//! Revisions: history, detail with manifest, files, the deterministic archive, revocation.

use super::file_response;
use crate::SharedState;
use crate::error::{ApiError, ApiResult};
use crate::extract::{ApiJson, ApiPath};
use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, header};
use axum::response::{IntoResponse, Response};
use skillbox_api::{RevisionDetail, RevisionList, RevokeRequest, Revoked};
use skillbox_registry::RevSel;

pub async fn list(
    State(s): State<SharedState>,
    ApiPath((ws, name)): ApiPath<(String, String)>,
) -> ApiResult<Json<RevisionList>> {
    let revisions = s.registry.revisions(&ws, &name).await?;
    Ok(Json(RevisionList { revisions }))
}

pub async fn detail(
    State(s): State<SharedState>,
    ApiPath((ws, name, rev)): ApiPath<(String, String, String)>,
) -> ApiResult<Json<RevisionDetail>> {
    let view = s
        .registry
        .revision(&ws, &name, rev.parse::<RevSel>()?)
        .await?;
    Ok(Json(RevisionDetail {
        skill: view.skill.name,
        manifest: view.manifest.entries().to_vec(),
        revision: view.revision,
    }))
}

pub async fn file(
    State(s): State<SharedState>,
    ApiPath((ws, name, rev, path)): ApiPath<(String, String, String, String)>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let view = s
        .registry
        .revision(&ws, &name, rev.parse::<RevSel>()?)
        .await?;
    let (entry, content) = s.registry.file(&view, &path).await?;
    file_response(&headers, &entry, content).await
}

pub async fn archive(
    State(s): State<SharedState>,
    ApiPath((ws, name, rev)): ApiPath<(String, String, String)>,
) -> ApiResult<Response> {
    let view = s
        .registry
        .revision(&ws, &name, rev.parse::<RevSel>()?)
        .await?;
    let tar = s.registry.archive(&view).await?;
    let disposition = format!(
        "attachment; filename=\"{}-{}.tar\"",
        view.skill.name, view.revision.revision
    );
    Ok((
        [
            (header::CONTENT_TYPE, "application/x-tar".to_string()),
            (header::CONTENT_DISPOSITION, disposition),
            (
                header::HeaderName::from_static("x-skillbox-digest"),
                view.digest.to_string(),
            ),
        ],
        tar,
    )
        .into_response())
}

pub async fn revoke(
    State(s): State<SharedState>,
    ApiPath((ws, name, rev)): ApiPath<(String, String, String)>,
    ApiJson(body): ApiJson<RevokeRequest>,
) -> ApiResult<Json<Revoked>> {
    let revision = match rev.parse::<RevSel>()? {
        RevSel::Number(n) => n,
        RevSel::Current => s.registry.skill(&ws, &name).await?.current_revision,
    };
    if body.reason.trim().is_empty() {
        return Err(ApiError::bad_request("a revocation needs a reason"));
    }
    let r = s
        .registry
        .revoke(&ws, &name, revision, &body.reason)
        .await?;
    Ok(Json(r))
}
