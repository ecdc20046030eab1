//! Runs: create, detail, finish, heartbeat, activation (pinning), pinned reads, the prompt
//! index.

use super::file_response;
use crate::SharedState;
use crate::error::ApiResult;
use crate::extract::{ApiJson, ApiPath};
use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use skillbox_api::{Activate, CreateRun, LiveRun, Prompt, PromptSkill, RunList, RunView};

pub async fn create(
    State(s): State<SharedState>,
    ApiPath(ws): ApiPath<String>,
    body: Option<ApiJson<CreateRun>>,
) -> ApiResult<(StatusCode, Json<RunView>)> {
    let body = body.map(|ApiJson(b)| b).unwrap_or_default();
    let run = s
        .registry
        .create_run(&ws, body.skills, body.ttl_seconds, body.require_immutable)
        .await?;
    Ok((StatusCode::CREATED, Json(run)))
}

/// The live runs, each with where its sandbox is: this server's box when it holds one for the
/// run, else the node it is placed on.
pub async fn list(
    State(s): State<SharedState>,
    ApiPath(ws): ApiPath<String>,
) -> ApiResult<Json<RunList>> {
    let local: std::collections::HashSet<String> = match &s.sandbox {
        Some(b) => b.backend.sandboxes().into_iter().collect(),
        None => Default::default(),
    };
    let backend = s
        .sandbox
        .as_ref()
        .map(|b| b.backend.capabilities().backend.to_string());
    let mut runs = Vec::new();
    for run in s.registry.live_runs(&ws).await? {
        let sandbox = local
            .contains(&run.run_id)
            .then(|| backend.clone())
            .flatten();
        let node = match s.remote {
            Some(_) => s.registry.placed_on(&run.run_id).await?,
            None => None,
        };
        runs.push(LiveRun { run, sandbox, node });
    }
    Ok(Json(RunList { runs }))
}

pub async fn detail(
    State(s): State<SharedState>,
    ApiPath((ws, run)): ApiPath<(String, String)>,
) -> ApiResult<Json<RunView>> {
    Ok(Json(s.registry.run(&ws, &run).await?))
}

pub async fn finish(
    State(s): State<SharedState>,
    ApiPath((ws, run)): ApiPath<(String, String)>,
) -> ApiResult<Json<RunView>> {
    let view = s.registry.finish_run(&ws, &run).await?;
    s.release_sandboxes(Some(&run)).await;
    Ok(Json(view))
}

pub async fn heartbeat(
    State(s): State<SharedState>,
    ApiPath((ws, run)): ApiPath<(String, String)>,
) -> ApiResult<Json<RunView>> {
    Ok(Json(s.registry.heartbeat(&ws, &run).await?))
}

pub async fn activate(
    State(s): State<SharedState>,
    ApiPath((ws, run)): ApiPath<(String, String)>,
    ApiJson(body): ApiJson<Activate>,
) -> ApiResult<Response> {
    // An `Activation`, serialized once per revision by the registry.
    let answer = s
        .registry
        .activate_json(&ws, &run, &body.skill, body.revision)
        .await?;
    let json = HeaderValue::from_static("application/json");
    Ok(([(header::CONTENT_TYPE, json)], answer).into_response())
}

pub async fn pinned_file(
    State(s): State<SharedState>,
    ApiPath((ws, run, name, path)): ApiPath<(String, String, String, String)>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let (entry, content) = s.registry.pinned_file(&ws, &run, &name, &path).await?;
    file_response(&headers, &entry, content).await
}

pub async fn prompt(
    State(s): State<SharedState>,
    ApiPath((ws, run)): ApiPath<(String, String)>,
) -> ApiResult<Json<Prompt>> {
    let (prompt, skills) = s.registry.prompt(&ws, &run).await?;
    Ok(Json(Prompt {
        prompt,
        skills: skills
            .into_iter()
            .map(|(name, description)| PromptSkill { name, description })
            .collect(),
    }))
}
