//! Drafts: server-side file sets edited file by file, and run drafts, whose files live in a
//! run's sandbox workspace; both publish with their base revision.

use super::{file_response, published};
use crate::SharedState;
use crate::auth::Caller;
use crate::error::{ApiError, ApiResult};
use crate::extract::{ApiJson, ApiPath, ApiQuery};
use crate::sandbox::box_error;
use axum::Json;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use skillbox_api::ErrorCode;
use skillbox_api::{
    CreateDraft, CreateRunDraft, DraftCreated, DraftDetail, DraftFile, Published, PutFileQuery,
    Rebase, RunDraftCreated,
};
use skillbox_registry::{DraftRow, FileContent};

fn created(d: DraftRow) -> DraftCreated {
    DraftCreated {
        draft_id: d.id,
        skill: d.skill,
        base_revision: d.base_revision,
    }
}

pub async fn create(
    State(s): State<SharedState>,
    ApiPath(ws): ApiPath<String>,
    ApiJson(body): ApiJson<CreateDraft>,
) -> ApiResult<(StatusCode, Json<DraftCreated>)> {
    let d = s
        .registry
        .create_draft(&ws, &body.skill, body.base_revision)
        .await?;
    Ok((StatusCode::CREATED, Json(created(d))))
}

pub async fn detail(
    State(s): State<SharedState>,
    ApiPath((ws, id)): ApiPath<(String, String)>,
) -> ApiResult<Json<DraftDetail>> {
    let d = s.registry.draft(&ws, &id).await?;
    let files = s.registry.draft_files(&ws, &id).await?;
    Ok(Json(DraftDetail {
        draft_id: d.id,
        skill: d.skill,
        base_revision: d.base_revision,
        created_at: d.created_at,
        updated_at: d.updated_at,
        files,
    }))
}

pub async fn rebase(
    State(s): State<SharedState>,
    ApiPath((ws, id)): ApiPath<(String, String)>,
    ApiJson(body): ApiJson<Rebase>,
) -> ApiResult<Json<DraftCreated>> {
    let d = s
        .registry
        .set_draft_base(&ws, &id, body.base_revision)
        .await?;
    Ok(Json(created(d)))
}

pub async fn delete(
    State(s): State<SharedState>,
    ApiPath((ws, id)): ApiPath<(String, String)>,
) -> ApiResult<StatusCode> {
    s.registry.delete_draft(&ws, &id).await?;
    Ok(StatusCode::NO_CONTENT)
}

pub async fn file_get(
    State(s): State<SharedState>,
    ApiPath((ws, id, path)): ApiPath<(String, String, String)>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let (f, bytes) = s.registry.draft_file(&ws, &id, &path).await?;
    let sha = skillbox_package::Sha256::from_hex(&f.sha256)
        .ok_or_else(|| ApiError::internal(format!("draft file {path:?} has a malformed hash")))?;
    let entry = skillbox_package::FileEntry {
        path: f.path,
        size: f.size as u64,
        sha256: sha,
        executable: f.executable,
    };
    file_response(&headers, &entry, FileContent::Bytes(bytes)).await
}

pub async fn file_put(
    State(s): State<SharedState>,
    ApiPath((ws, id, path)): ApiPath<(String, String, String)>,
    ApiQuery(q): ApiQuery<PutFileQuery>,
    body: Body,
) -> ApiResult<Json<DraftFile>> {
    let cap = s.registry.config().limits.max_file_size as usize;
    let bytes = axum::body::to_bytes(body, cap).await.map_err(|_| {
        ApiError::new(
            ErrorCode::TooLarge,
            format!("file exceeds the limit of {cap} bytes"),
        )
    })?;
    let f = s
        .registry
        .put_draft_file(&ws, &id, &path, bytes, q.executable)
        .await?;
    Ok(Json(f))
}

pub async fn file_delete(
    State(s): State<SharedState>,
    ApiPath((ws, id, path)): ApiPath<(String, String, String)>,
) -> ApiResult<StatusCode> {
    s.registry.delete_draft_file(&ws, &id, &path).await?;
    Ok(StatusCode::NO_CONTENT)
}

pub async fn publish(
    State(s): State<SharedState>,
    caller: Caller,
    ApiPath((ws, id)): ApiPath<(String, String)>,
) -> ApiResult<(StatusCode, Json<Published>)> {
    let draft = s.registry.draft(&ws, &id).await?;
    let r = match &draft.run_id {
        None => s.registry.publish_draft(&ws, &id, &caller.label()).await,
        Some(run) => {
            // The draft's current files, read from the run's sandbox.
            s.registry.exec_context(&ws, run).await?;
            let cap = s.registry.config().limits.max_total_size as usize + 16 * 1024 * 1024;
            let dir = skillbox_registry::drafts::run_draft_path(&id);
            let tar = if s.remote.is_some() {
                crate::remote::export_workspace(&s, run, &dir, cap).await?
            } else {
                s.running_box()?
                    .export_tar(&s.workspace_sandbox(run), &dir, cap)
                    .await
                    .map_err(box_error)?
            };
            s.registry
                .publish_run_draft(&ws, &id, tar, &caller.label())
                .await
        }
    };
    s.metrics.count_publish(&r, true);
    Ok(published(r?))
}

/// Creates a run draft: the base revision's files unpacked at
/// `/workspace/skill-drafts/<draft-id>/` in the run's sandbox.
pub async fn create_in_run(
    State(s): State<SharedState>,
    ApiPath((ws, run)): ApiPath<(String, String)>,
    ApiJson(body): ApiJson<CreateRunDraft>,
) -> ApiResult<(StatusCode, Json<RunDraftCreated>)> {
    let local = match &s.remote {
        Some(_) => None,
        None => Some(s.running_box()?),
    };
    let (draft, tar) = s
        .registry
        .create_run_draft(&ws, &run, &body.skill, body.base_revision)
        .await?;
    let path = skillbox_registry::drafts::run_draft_path(&draft.id);
    let imported = match local {
        Some(sandbox_rt) => sandbox_rt
            .import_tar(&s.workspace_sandbox(&run), &path, tar)
            .await
            .map_err(box_error),
        None => crate::remote::import_workspace(&s, &run, &path, tar).await,
    };
    if let Err(e) = imported {
        s.registry.delete_draft(&ws, &draft.id).await?;
        return Err(e);
    }
    Ok((
        StatusCode::CREATED,
        Json(RunDraftCreated {
            draft_id: draft.id,
            skill: draft.skill,
            base_revision: draft.base_revision,
            run_id: run,
            path,
        }),
    ))
}
