//! Skills: list, detail, delete, publish, the current pointer.

use super::published;
use crate::SharedState;
use crate::auth::Caller;
use crate::error::{ApiError, ApiResult};
use crate::extract::{ApiJson, ApiPath, ApiQuery};
use axum::Json;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use futures_util::StreamExt;
use serde_json::Value;
use skillbox_api::ErrorCode;
use skillbox_api::{
    CurrentMoved, MoveCurrent, PublishQuery, Published, SkillDeleted, SkillDetail, SkillList,
};
use skillbox_package::ArchiveFormat;
use tokio::io::AsyncWriteExt;

pub async fn list(
    State(s): State<SharedState>,
    ApiPath(ws): ApiPath<String>,
) -> ApiResult<Json<SkillList>> {
    let skills = s.registry.list_skills(&ws).await?;
    Ok(Json(SkillList { skills }))
}

pub async fn detail(
    State(s): State<SharedState>,
    ApiPath((ws, name)): ApiPath<(String, String)>,
) -> ApiResult<Json<SkillDetail>> {
    let (summary, current) = s.registry.skill_summary(&ws, &name).await?;
    Ok(Json(SkillDetail {
        summary,
        frontmatter: current.map(|r| r.frontmatter).unwrap_or(Value::Null),
    }))
}

pub async fn delete(
    State(s): State<SharedState>,
    ApiPath((ws, name)): ApiPath<(String, String)>,
) -> ApiResult<Json<SkillDeleted>> {
    let skill = s.registry.delete_skill(&ws, &name).await?;
    Ok(Json(SkillDeleted {
        skill_id: skill.id,
        name: skill.name,
        state: "deleted".into(),
    }))
}

pub async fn publish(
    State(s): State<SharedState>,
    caller: Caller,
    ApiPath((ws, name)): ApiPath<(String, String)>,
    ApiQuery(q): ApiQuery<PublishQuery>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<(StatusCode, Json<Published>)> {
    let base = q.base_revision.unwrap_or(0);
    if base < 0 {
        return Err(ApiError::bad_request(
            "base_revision must be 0 (create) or a revision number",
        ));
    }
    let cap = s.cfg.max_upload_bytes;
    if let Some(len) = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
        && len > cap
    {
        return Err(ApiError::new(
            ErrorCode::TooLarge,
            format!("upload is {len} bytes; the limit is {cap}"),
        ));
    }
    let format = match headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()) {
        None | Some("application/octet-stream") => None,
        Some(ct) => Some(ArchiveFormat::from_content_type(ct).ok_or_else(|| {
            ApiError::bad_request(format!(
                "unsupported content type {ct:?}: send application/zip, application/x-tar or application/gzip"
            ))
        })?),
    };
    let staging = s.registry.new_staging("upload-")?;
    spool(body, &staging.path().join("upload"), cap).await?;
    let result = s
        .registry
        .publish_archive(&ws, &name, base, staging, format, &caller.label())
        .await;
    s.metrics.count_publish(&result, true);
    Ok(published(result?))
}

/// Streams a request body to `path`, refusing more than `cap` bytes.
async fn spool(body: Body, path: &std::path::Path, cap: u64) -> ApiResult<()> {
    let mut file = tokio::fs::File::create(path)
        .await
        .map_err(|e| ApiError::internal(e.to_string()))?;
    let mut stream = body.into_data_stream();
    let mut total = 0u64;
    while let Some(chunk) = stream.next().await {
        let chunk =
            chunk.map_err(|e| ApiError::bad_request(format!("reading the upload failed: {e}")))?;
        total += chunk.len() as u64;
        if total > cap {
            return Err(ApiError::new(
                ErrorCode::TooLarge,
                format!("upload exceeds the limit of {cap} bytes"),
            ));
        }
        file.write_all(&chunk)
            .await
            .map_err(|e| ApiError::internal(e.to_string()))?;
    }
    file.flush()
        .await
        .map_err(|e| ApiError::internal(e.to_string()))?;
    Ok(())
}

pub async fn move_current(
    State(s): State<SharedState>,
    ApiPath((ws, name)): ApiPath<(String, String)>,
    ApiJson(body): ApiJson<MoveCurrent>,
) -> ApiResult<Json<CurrentMoved>> {
    let r = s
        .registry
        .move_current(&ws, &name, body.revision, body.base_revision)
        .await;
    s.metrics.count_publish(&r, false);
    r?;
    Ok(Json(CurrentMoved {
        skill: name,
        current_revision: body.revision,
    }))
}
