//! Route handlers. Each: authenticate, authorize for the workspace, call the registry.

use crate::error::{ApiError, ApiResult};
use crate::extract::{ApiJson, ApiPath, ApiQuery};
use crate::{AppState, SharedState};
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use futures_util::StreamExt;
use serde::Deserialize;
use serde_json::{Value, json};
use skillbox_package::ArchiveFormat;
use skillbox_registry::{FileContent, Principal, RevSel, Role};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use tokio::io::AsyncWriteExt;

pub fn routes() -> Router<SharedState> {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/metrics", get(metrics))
        .route("/openapi.json", get(openapi))
        .route("/v1/workspaces/{ws}/skills", get(list_skills))
        .route(
            "/v1/workspaces/{ws}/skills/{name}",
            get(skill_detail).delete(delete_skill),
        )
        .route(
            "/v1/workspaces/{ws}/skills/{name}/revisions",
            post(publish).get(list_revisions),
        )
        .route(
            "/v1/workspaces/{ws}/skills/{name}/revisions/{rev}",
            get(revision_detail),
        )
        .route(
            "/v1/workspaces/{ws}/skills/{name}/revisions/{rev}/files/{*path}",
            get(revision_file),
        )
        .route(
            "/v1/workspaces/{ws}/skills/{name}/revisions/{rev}/archive",
            get(revision_archive),
        )
        .route(
            "/v1/workspaces/{ws}/skills/{name}/current",
            axum::routing::put(move_current),
        )
        .route("/v1/workspaces/{ws}/drafts", post(create_draft))
        .route(
            "/v1/workspaces/{ws}/drafts/{id}",
            get(draft_detail).put(rebase_draft).delete(delete_draft),
        )
        .route(
            "/v1/workspaces/{ws}/drafts/{id}/files/{*path}",
            get(draft_file_get)
                .put(draft_file_put)
                .delete(draft_file_delete),
        )
        .route(
            "/v1/workspaces/{ws}/drafts/{id}/publish",
            post(publish_draft),
        )
        .route("/v1/workspaces/{ws}/events", get(events))
        .route(
            "/v1/workspaces/{ws}/skills/{name}/revisions/{rev}/revoke",
            post(revoke),
        )
        .route("/v1/workspaces/{ws}/runs", post(create_run))
        .route(
            "/v1/workspaces/{ws}/runs/{run}",
            get(run_detail).delete(finish_run),
        )
        .route("/v1/workspaces/{ws}/runs/{run}/activations", post(activate))
        .route(
            "/v1/workspaces/{ws}/runs/{run}/skills/{name}/files/{*path}",
            get(pinned_file),
        )
        .route("/v1/workspaces/{ws}/runs/{run}/heartbeat", post(heartbeat))
        .route("/v1/workspaces/{ws}/runs/{run}/prompt", get(prompt))
        .route("/v1/workspaces/{ws}/runs/{run}/exec", post(exec))
        .route("/v1/workspaces/{ws}/runs/{run}/drafts", post(run_draft))
        .route("/v1/admin/gc", post(gc))
        .route("/v1/admin/tokens", post(create_token))
        .route("/v1/admin/fsck", post(fsck))
        .layer(axum::extract::DefaultBodyLimit::max(2 * 1024 * 1024))
        .fallback(|| async { ApiError::not_found("no such route; see /openapi.json") })
        .method_not_allowed_fallback(|| async {
            ApiError::new(
                StatusCode::METHOD_NOT_ALLOWED,
                "method_not_allowed",
                "this route does not take that method; see /openapi.json",
            )
        })
}

/// Serializes an answer body.
fn to_json<T: serde::Serialize>(v: T) -> ApiResult<Value> {
    serde_json::to_value(v).map_err(|e| ApiError::internal(e.to_string()))
}

// ---------- auth ----------

async fn principal(state: &AppState, headers: &HeaderMap) -> ApiResult<Principal> {
    let value = headers
        .get(header::AUTHORIZATION)
        .ok_or_else(|| ApiError::unauthorized("missing Authorization: Bearer <token>"))?;
    let token = value
        .to_str()
        .ok()
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .ok_or_else(|| ApiError::unauthorized("Authorization must be 'Bearer <token>'"))?;
    state
        .registry
        .authenticate(token, &state.cfg.admin_token)
        .await?
        .ok_or_else(|| ApiError::unauthorized("unknown token"))
}

/// Authorizes `role` in workspace `ws`. A token of another workspace learns nothing: `not_found`.
async fn authorize(
    state: &AppState,
    headers: &HeaderMap,
    ws: &str,
    role: Role,
) -> ApiResult<Principal> {
    let p = principal(state, headers).await?;
    if !skillbox_package::is_valid_name(ws) {
        return Err(ApiError::bad_request(format!(
            "invalid workspace name {:?}: 1-64 characters of a-z, 0-9 and single hyphens",
            truncated(ws, 80)
        )));
    }
    match &p {
        Principal::ServerAdmin => {}
        Principal::Workspace {
            workspace,
            role: have,
        } => {
            if workspace != ws {
                return Err(ApiError::not_found(format!("no workspace {ws:?}")));
            }
            if *have < role {
                return Err(ApiError::forbidden(format!(
                    "this needs the {} role; the token has {}",
                    role.as_str(),
                    have.as_str()
                )));
            }
        }
    }
    Ok(p)
}

/// At most `max` characters of `s` (an echoed input stays short).
fn truncated(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_string(),
    }
}

async fn authorize_server_admin(state: &AppState, headers: &HeaderMap) -> ApiResult<()> {
    match principal(state, headers).await? {
        Principal::ServerAdmin => Ok(()),
        _ => Err(ApiError::forbidden("this needs the server's admin token")),
    }
}

// ---------- operational ----------

async fn healthz(State(s): State<SharedState>) -> ApiResult<Json<Value>> {
    sqlx_ping(&s).await?;
    Ok(Json(json!({"status": "ok"})))
}

async fn sqlx_ping(s: &AppState) -> ApiResult<()> {
    s.registry
        .events_after("healthz", i64::MAX, 1)
        .await
        .map(|_| ())
        .map_err(ApiError::from)
}

async fn metrics(State(s): State<SharedState>) -> Response {
    let blobs = s.registry.data_dir().join("store/blobs/sha256");
    let trees = s.registry.data_dir().join("trees");
    let (count, bytes, tree_count) = tokio::task::spawn_blocking(move || {
        let mut count = 0u64;
        let mut bytes = 0u64;
        if let Ok(rd) = std::fs::read_dir(&blobs) {
            for e in rd.flatten() {
                count += 1;
                bytes += e.metadata().map(|m| m.len()).unwrap_or(0);
            }
        }
        let trees = std::fs::read_dir(&trees)
            .map(|rd| rd.count() as u64)
            .unwrap_or(0);
        (count, bytes, trees)
    })
    .await
    .unwrap_or((0, 0, 0));
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
        ("skillbox_store_blobs", "Blobs in the content store.", count),
        (
            "skillbox_store_blob_bytes",
            "Bytes of blobs in the content store.",
            bytes,
        ),
        (
            "skillbox_revision_cache_trees",
            "Trees in the revision cache.",
            tree_count,
        ),
    ]);
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], body).into_response()
}

async fn openapi() -> Json<Value> {
    Json(crate::openapi::document())
}

// ---------- skills and revisions ----------

async fn list_skills(
    State(s): State<SharedState>,
    ApiPath(ws): ApiPath<String>,
    headers: HeaderMap,
) -> ApiResult<Json<Value>> {
    authorize(&s, &headers, &ws, Role::Reader).await?;
    let skills = s.registry.list_skills(&ws).await?;
    Ok(Json(json!({"skills": skills})))
}

async fn skill_detail(
    State(s): State<SharedState>,
    ApiPath((ws, name)): ApiPath<(String, String)>,
    headers: HeaderMap,
) -> ApiResult<Json<Value>> {
    authorize(&s, &headers, &ws, Role::Reader).await?;
    let (summary, current) = s.registry.skill_summary(&ws, &name).await?;
    let mut v = to_json(&summary)?;
    v["frontmatter"] = current.map(|r| r.frontmatter).unwrap_or(Value::Null);
    Ok(Json(v))
}

async fn delete_skill(
    State(s): State<SharedState>,
    ApiPath((ws, name)): ApiPath<(String, String)>,
    headers: HeaderMap,
) -> ApiResult<Json<Value>> {
    authorize(&s, &headers, &ws, Role::Admin).await?;
    let skill = s.registry.delete_skill(&ws, &name).await?;
    Ok(Json(
        json!({"skill_id": skill.id, "name": skill.name, "state": "deleted"}),
    ))
}

#[derive(Deserialize)]
struct PublishQuery {
    base_revision: Option<i64>,
}

async fn publish(
    State(s): State<SharedState>,
    ApiPath((ws, name)): ApiPath<(String, String)>,
    ApiQuery(q): ApiQuery<PublishQuery>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<(StatusCode, Json<Value>)> {
    let who = authorize(&s, &headers, &ws, Role::Author).await?;
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
        return Err(ApiError::too_large(format!(
            "upload is {len} bytes; the limit is {cap}"
        )));
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
        .publish_archive(&ws, &name, base, staging, format, &who.label())
        .await;
    count_publish(&s, &result, true);
    let published = result?;
    let status = if published.replayed {
        StatusCode::OK
    } else {
        StatusCode::CREATED
    };
    Ok((status, Json(to_json(&published)?)))
}

/// Counts a publish (or, with `published = false`, a pointer move) by its outcome.
fn count_publish<T>(
    s: &AppState,
    r: &Result<T, skillbox_registry::RegistryError>,
    published: bool,
) {
    let counter = match r {
        Ok(_) if published => &s.metrics.publishes,
        Ok(_) => return,
        Err(skillbox_registry::RegistryError::RevisionConflict { .. }) => &s.metrics.conflicts,
        Err(skillbox_registry::RegistryError::InvalidPackage { .. }) => &s.metrics.invalid_packages,
        Err(_) => return,
    };
    counter.fetch_add(1, Ordering::Relaxed);
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
            return Err(ApiError::too_large(format!(
                "upload exceeds the limit of {cap} bytes"
            )));
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

async fn list_revisions(
    State(s): State<SharedState>,
    ApiPath((ws, name)): ApiPath<(String, String)>,
    headers: HeaderMap,
) -> ApiResult<Json<Value>> {
    authorize(&s, &headers, &ws, Role::Reader).await?;
    let revs = s.registry.revisions(&ws, &name).await?;
    Ok(Json(json!({"revisions": revs})))
}

async fn revision_detail(
    State(s): State<SharedState>,
    ApiPath((ws, name, rev)): ApiPath<(String, String, String)>,
    headers: HeaderMap,
) -> ApiResult<Json<Value>> {
    authorize(&s, &headers, &ws, Role::Reader).await?;
    let view = s
        .registry
        .revision(&ws, &name, rev.parse::<RevSel>()?)
        .await?;
    let r = &view.revision;
    Ok(Json(json!({
        "skill": view.skill.name,
        "skill_id": view.skill.id,
        "revision": r.revision,
        "digest": r.digest,
        "parent_revision": r.parent_revision,
        "state": r.state,
        "publisher": r.publisher,
        "published_at": r.published_at,
        "file_count": r.file_count,
        "size": r.size,
        "manifest": view.manifest.entries(),
        "frontmatter": r.frontmatter,
    })))
}

fn content_type_for(path: &str) -> &'static str {
    let ext = path.rsplit('.').next().unwrap_or("");
    match ext {
        "md" => "text/markdown; charset=utf-8",
        "txt" | "py" | "sh" | "js" | "ts" | "toml" | "yaml" | "yml" | "csv" | "rs" => {
            "text/plain; charset=utf-8"
        }
        "json" => "application/json",
        "html" => "text/html; charset=utf-8",
        _ => "application/octet-stream",
    }
}

async fn revision_file(
    State(s): State<SharedState>,
    ApiPath((ws, name, rev, path)): ApiPath<(String, String, String, String)>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    authorize(&s, &headers, &ws, Role::Reader).await?;
    let view = s
        .registry
        .revision(&ws, &name, rev.parse::<RevSel>()?)
        .await?;
    let (entry, content) = s.registry.file(&view, &path).await?;
    file_response(&headers, &entry, content).await
}

/// A file's bytes with `ETag: "sha256:<hex>"`; `If-None-Match` answers 304.
pub(crate) async fn file_response(
    headers: &HeaderMap,
    entry: &skillbox_package::FileEntry,
    content: FileContent,
) -> ApiResult<Response> {
    let etag = format!("\"sha256:{}\"", entry.sha256);
    if headers
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        == Some(etag.as_str())
    {
        return Ok((StatusCode::NOT_MODIFIED, [(header::ETAG, etag)]).into_response());
    }
    let body = match content {
        FileContent::Bytes(b) => Body::from(b),
        // The registry reads small files whole (`file_content`); only large ones stream.
        FileContent::Path(p) => {
            let f = tokio::fs::File::open(&p)
                .await
                .map_err(|e| ApiError::internal(e.to_string()))?;
            Body::from_stream(tokio_util::io::ReaderStream::with_capacity(f, 256 * 1024))
        }
    };
    let mut resp = Response::new(body);
    let h = resp.headers_mut();
    h.insert(
        header::ETAG,
        HeaderValue::from_str(&etag).map_err(|e| ApiError::internal(e.to_string()))?,
    );
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(content_type_for(&entry.path)),
    );
    h.insert(header::CONTENT_LENGTH, HeaderValue::from(entry.size));
    Ok(resp)
}

async fn revision_archive(
    State(s): State<SharedState>,
    ApiPath((ws, name, rev)): ApiPath<(String, String, String)>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    authorize(&s, &headers, &ws, Role::Reader).await?;
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

#[derive(Deserialize)]
struct MoveCurrent {
    revision: i64,
    base_revision: i64,
}

async fn move_current(
    State(s): State<SharedState>,
    ApiPath((ws, name)): ApiPath<(String, String)>,
    headers: HeaderMap,
    ApiJson(body): ApiJson<MoveCurrent>,
) -> ApiResult<Json<Value>> {
    authorize(&s, &headers, &ws, Role::Author).await?;
    let r = s
        .registry
        .move_current(&ws, &name, body.revision, body.base_revision)
        .await;
    count_publish(&s, &r, false);
    r?;
    Ok(Json(
        json!({"skill": name, "current_revision": body.revision}),
    ))
}

// ---------- drafts ----------

#[derive(Deserialize)]
struct CreateDraft {
    skill: String,
    #[serde(default)]
    base_revision: i64,
}

async fn create_draft(
    State(s): State<SharedState>,
    ApiPath(ws): ApiPath<String>,
    headers: HeaderMap,
    ApiJson(body): ApiJson<CreateDraft>,
) -> ApiResult<(StatusCode, Json<Value>)> {
    authorize(&s, &headers, &ws, Role::Author).await?;
    let d = s
        .registry
        .create_draft(&ws, &body.skill, body.base_revision)
        .await?;
    Ok((
        StatusCode::CREATED,
        Json(json!({"draft_id": d.id, "skill": d.skill, "base_revision": d.base_revision})),
    ))
}

async fn draft_detail(
    State(s): State<SharedState>,
    ApiPath((ws, id)): ApiPath<(String, String)>,
    headers: HeaderMap,
) -> ApiResult<Json<Value>> {
    authorize(&s, &headers, &ws, Role::Reader).await?;
    let d = s.registry.draft(&ws, &id).await?;
    let files = s.registry.draft_files(&ws, &id).await?;
    Ok(Json(
        json!({"draft_id": d.id, "skill": d.skill, "base_revision": d.base_revision,
                   "created_at": d.created_at, "updated_at": d.updated_at, "files": files}),
    ))
}

#[derive(Deserialize)]
struct Rebase {
    base_revision: i64,
}

async fn rebase_draft(
    State(s): State<SharedState>,
    ApiPath((ws, id)): ApiPath<(String, String)>,
    headers: HeaderMap,
    ApiJson(body): ApiJson<Rebase>,
) -> ApiResult<Json<Value>> {
    authorize(&s, &headers, &ws, Role::Author).await?;
    let d = s
        .registry
        .set_draft_base(&ws, &id, body.base_revision)
        .await?;
    Ok(Json(
        json!({"draft_id": d.id, "skill": d.skill, "base_revision": d.base_revision}),
    ))
}

async fn delete_draft(
    State(s): State<SharedState>,
    ApiPath((ws, id)): ApiPath<(String, String)>,
    headers: HeaderMap,
) -> ApiResult<StatusCode> {
    authorize(&s, &headers, &ws, Role::Author).await?;
    s.registry.delete_draft(&ws, &id).await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn draft_file_get(
    State(s): State<SharedState>,
    ApiPath((ws, id, path)): ApiPath<(String, String, String)>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    authorize(&s, &headers, &ws, Role::Reader).await?;
    let (f, bytes) = s.registry.draft_file(&ws, &id, &path).await?;
    let sha = skillbox_package::Sha256::from_hex(&f.sha256)
        .ok_or_else(|| ApiError::internal("bad hash"))?;
    let entry = skillbox_package::FileEntry {
        path: f.path,
        size: f.size as u64,
        sha256: sha,
        executable: f.executable,
    };
    file_response(&headers, &entry, FileContent::Bytes(bytes)).await
}

#[derive(Deserialize)]
struct PutFileQuery {
    #[serde(default)]
    executable: bool,
}

async fn draft_file_put(
    State(s): State<SharedState>,
    ApiPath((ws, id, path)): ApiPath<(String, String, String)>,
    ApiQuery(q): ApiQuery<PutFileQuery>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<Json<Value>> {
    authorize(&s, &headers, &ws, Role::Author).await?;
    let cap = s.registry.config().limits.max_file_size as usize;
    let bytes = axum::body::to_bytes(body, cap)
        .await
        .map_err(|_| ApiError::too_large(format!("file exceeds the limit of {cap} bytes")))?;
    let f = s
        .registry
        .put_draft_file(&ws, &id, &path, bytes, q.executable)
        .await?;
    Ok(Json(to_json(f)?))
}

async fn draft_file_delete(
    State(s): State<SharedState>,
    ApiPath((ws, id, path)): ApiPath<(String, String, String)>,
    headers: HeaderMap,
) -> ApiResult<StatusCode> {
    authorize(&s, &headers, &ws, Role::Author).await?;
    s.registry.delete_draft_file(&ws, &id, &path).await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn publish_draft(
    State(s): State<SharedState>,
    ApiPath((ws, id)): ApiPath<(String, String)>,
    headers: HeaderMap,
) -> ApiResult<(StatusCode, Json<Value>)> {
    let who = authorize(&s, &headers, &ws, Role::Author).await?;
    let draft = s.registry.draft(&ws, &id).await?;
    let r = match &draft.run_id {
        None => s.registry.publish_draft(&ws, &id, &who.label()).await,
        Some(run) => {
            // The draft's current files, read from the run's sandbox.
            s.registry.exec_context(&ws, run).await?;
            let cap = s.registry.config().limits.max_total_size as usize + 16 * 1024 * 1024;
            let tar = running_box(&s)?
                .export_tar(
                    &workspace_sandbox(&s, run),
                    &skillbox_registry::drafts::run_draft_path(&id),
                    cap,
                )
                .await
                .map_err(box_error)?;
            s.registry
                .publish_run_draft(&ws, &id, tar, &who.label())
                .await
        }
    };
    count_publish(&s, &r, true);
    let p = r?;
    let status = if p.replayed {
        StatusCode::OK
    } else {
        StatusCode::CREATED
    };
    Ok((status, Json(to_json(p)?)))
}

// ---------- events ----------

#[derive(Deserialize)]
struct EventsQuery {
    after: Option<i64>,
    #[serde(default = "yes")]
    follow: bool,
}

fn yes() -> bool {
    true
}

/// The event log as SSE, resuming after `?after=SEQ` (or `Last-Event-ID`). New events are
/// noticed through an in-process signal, and by polling for writers in other processes.
async fn events(
    State(s): State<SharedState>,
    ApiPath(ws): ApiPath<String>,
    ApiQuery(q): ApiQuery<EventsQuery>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    authorize(&s, &headers, &ws, Role::Reader).await?;
    let last_event_id = headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok());
    let after = q.after.or(last_event_id).unwrap_or(0);
    struct St {
        s: SharedState,
        ws: String,
        after: i64,
        pending: std::collections::VecDeque<skillbox_registry::Event>,
        rx: tokio::sync::watch::Receiver<u64>,
        follow: bool,
    }
    let rx = s.registry.subscribe();
    let init = St {
        s,
        ws,
        after,
        pending: Default::default(),
        rx,
        follow: q.follow,
    };
    let stream = futures_util::stream::unfold(init, |mut st| async move {
        loop {
            if let Some(e) = st.pending.pop_front() {
                st.after = e.seq;
                let data =
                    json!({"seq": e.seq, "kind": e.kind, "at": e.at, "data": e.data}).to_string();
                let ev = SseEvent::default()
                    .id(e.seq.to_string())
                    .event(e.kind)
                    .data(data);
                return Some((Ok::<_, std::convert::Infallible>(ev), st));
            }
            match st.s.registry.events_after(&st.ws, st.after, 256).await {
                Ok(batch) if !batch.is_empty() => st.pending.extend(batch),
                Ok(_) if !st.follow => return None,
                Ok(_) => {
                    let _ = tokio::time::timeout(
                        std::time::Duration::from_millis(500),
                        st.rx.changed(),
                    )
                    .await;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "event stream query failed");
                    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                }
            }
        }
    });
    Ok(Sse::new(stream)
        .keep_alive(KeepAlive::default())
        .into_response())
}

// ---------- admin ----------

#[derive(Deserialize)]
struct CreateToken {
    workspace: String,
    role: String,
}

async fn create_token(
    State(s): State<SharedState>,
    headers: HeaderMap,
    ApiJson(body): ApiJson<CreateToken>,
) -> ApiResult<(StatusCode, Json<Value>)> {
    authorize_server_admin(&s, &headers).await?;
    let role = Role::parse(&body.role).ok_or_else(|| {
        ApiError::bad_request(format!(
            "unknown role {:?}: use reader, author, runner or admin",
            body.role
        ))
    })?;
    let token = s.registry.create_token(&body.workspace, role).await?;
    Ok((
        StatusCode::CREATED,
        Json(json!({"token": token, "workspace": body.workspace, "role": role.as_str()})),
    ))
}

async fn fsck(State(s): State<SharedState>, headers: HeaderMap) -> ApiResult<Json<Value>> {
    authorize_server_admin(&s, &headers).await?;
    let report = s.registry.fsck().await?;
    Ok(Json(to_json(report)?))
}

// ---------- revocation ----------

#[derive(Deserialize)]
struct RevokeBody {
    reason: String,
}

async fn revoke(
    State(s): State<SharedState>,
    ApiPath((ws, name, rev)): ApiPath<(String, String, String)>,
    headers: HeaderMap,
    ApiJson(body): ApiJson<RevokeBody>,
) -> ApiResult<Json<Value>> {
    authorize(&s, &headers, &ws, Role::Admin).await?;
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
    Ok(Json(to_json(r)?))
}

// ---------- runs ----------

#[derive(Deserialize, Default)]
struct CreateRun {
    skills: Option<Vec<String>>,
    ttl_seconds: Option<u64>,
    #[serde(default)]
    require_immutable: bool,
}

async fn create_run(
    State(s): State<SharedState>,
    ApiPath(ws): ApiPath<String>,
    headers: HeaderMap,
    body: Option<ApiJson<CreateRun>>,
) -> ApiResult<(StatusCode, Json<Value>)> {
    authorize(&s, &headers, &ws, Role::Runner).await?;
    let body = body.map(|ApiJson(b)| b).unwrap_or_default();
    let run = s
        .registry
        .create_run(&ws, body.skills, body.ttl_seconds, body.require_immutable)
        .await?;
    Ok((StatusCode::CREATED, Json(to_json(run)?)))
}

async fn run_detail(
    State(s): State<SharedState>,
    ApiPath((ws, run)): ApiPath<(String, String)>,
    headers: HeaderMap,
) -> ApiResult<Json<Value>> {
    authorize(&s, &headers, &ws, Role::Runner).await?;
    let run = s.registry.run(&ws, &run).await?;
    Ok(Json(to_json(run)?))
}

async fn finish_run(
    State(s): State<SharedState>,
    ApiPath((ws, run)): ApiPath<(String, String)>,
    headers: HeaderMap,
) -> ApiResult<Json<Value>> {
    authorize(&s, &headers, &ws, Role::Runner).await?;
    let view = s.registry.finish_run(&ws, &run).await?;
    s.release_sandboxes(Some(&run)).await;
    Ok(Json(to_json(view)?))
}

async fn heartbeat(
    State(s): State<SharedState>,
    ApiPath((ws, run)): ApiPath<(String, String)>,
    headers: HeaderMap,
) -> ApiResult<Json<Value>> {
    authorize(&s, &headers, &ws, Role::Runner).await?;
    let run = s.registry.heartbeat(&ws, &run).await?;
    Ok(Json(to_json(run)?))
}

#[derive(Deserialize)]
struct ActivateBody {
    skill: String,
    revision: Option<i64>,
}

async fn activate(
    State(s): State<SharedState>,
    ApiPath((ws, run)): ApiPath<(String, String)>,
    headers: HeaderMap,
    ApiJson(body): ApiJson<ActivateBody>,
) -> ApiResult<Json<Value>> {
    authorize(&s, &headers, &ws, Role::Runner).await?;
    let a = s
        .registry
        .activate(&ws, &run, &body.skill, body.revision)
        .await?;
    Ok(Json(to_json(a)?))
}

async fn pinned_file(
    State(s): State<SharedState>,
    ApiPath((ws, run, name, path)): ApiPath<(String, String, String, String)>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    authorize(&s, &headers, &ws, Role::Runner).await?;
    let (entry, content) = s.registry.pinned_file(&ws, &run, &name, &path).await?;
    file_response(&headers, &entry, content).await
}

async fn prompt(
    State(s): State<SharedState>,
    ApiPath((ws, run)): ApiPath<(String, String)>,
    headers: HeaderMap,
) -> ApiResult<Json<Value>> {
    authorize(&s, &headers, &ws, Role::Runner).await?;
    let (text, skills) = s.registry.prompt(&ws, &run).await?;
    let skills: Vec<Value> = skills
        .into_iter()
        .map(|(name, description)| json!({"name": name, "description": description}))
        .collect();
    Ok(Json(json!({"prompt": text, "skills": skills})))
}

#[derive(Deserialize)]
struct ExecBody {
    skill: Option<String>,
    argv: Option<Vec<String>>,
    command: Option<String>,
    cwd: Option<String>,
    #[serde(default)]
    env: std::collections::BTreeMap<String, String>,
    timeout_ms: Option<u64>,
    stdin: Option<String>,
}

/// What the kernel cannot take (a NUL ends a C string; `=` ends an environment name) is refused
/// here, naming the field, instead of failing in the sandbox.
fn check_exec_body(body: &ExecBody) -> ApiResult<()> {
    let nul = |field: String| {
        Err(ApiError::bad_request(format!(
            "{field} contains a NUL byte, which no program can receive"
        )))
    };
    for (i, arg) in body.argv.iter().flatten().enumerate() {
        if arg.contains('\0') {
            return nul(format!("argv[{i}]"));
        }
    }
    if body.command.as_deref().is_some_and(|c| c.contains('\0')) {
        return nul("command".into());
    }
    if body.cwd.as_deref().is_some_and(|c| c.contains('\0')) {
        return nul("cwd".into());
    }
    for (name, value) in &body.env {
        if name.is_empty() || name.contains(['=', '\0']) {
            return Err(ApiError::bad_request(format!(
                "env: {:?} is not a variable name (names are non-empty, without '=' or NUL)",
                truncated(name, 80)
            )));
        }
        if value.contains('\0') {
            return nul(format!("env[{:?}]", truncated(name, 80)));
        }
    }
    Ok(())
}

const MAX_TIMEOUT_MS: u64 = 600_000;
const OUTPUT_CAP: usize = 1024 * 1024;

#[derive(Deserialize)]
struct ExecQuery {
    #[serde(default)]
    stream: bool,
}

/// Executes in the run's sandbox with exactly its pinned packages mounted. With
/// `?stream=true` the answer is NDJSON: `{"type":"stdout"|"stderr","data":…}` lines as output
/// arrives, then one `{"type":"exit",…}` (or `{"type":"error","error":…}`) line.
async fn exec(
    State(s): State<SharedState>,
    ApiPath((ws, run)): ApiPath<(String, String)>,
    ApiQuery(q): ApiQuery<ExecQuery>,
    headers: HeaderMap,
    ApiJson(body): ApiJson<ExecBody>,
) -> ApiResult<Response> {
    authorize(&s, &headers, &ws, Role::Runner).await?;
    check_exec_body(&body)?;
    let (view, pins) = s.registry.exec_context(&ws, &run).await?;
    let sandbox_rt = running_box(&s)?;
    let caps = sandbox_rt.backend.capabilities();
    if view.require_immutable && !caps.immutable {
        return Err(skillbox_registry::RegistryError::BoxUnavailable(format!(
            "this run requires read-only packages and the {} backend cannot enforce them",
            caps.backend
        ))
        .into());
    }
    let program = match (body.argv, body.command) {
        (Some(argv), None) if !argv.is_empty() => skillbox_box::Program::Argv(argv),
        (None, Some(cmd)) => skillbox_box::Program::Shell(cmd),
        _ => {
            return Err(ApiError::bad_request(
                "give exactly one of argv (non-empty) or command",
            ));
        }
    };
    // The skill named by the request: its mount path is the default cwd, and its dependency
    // environment (if its package has a requirements.txt) is activated.
    let skill_mount = match &body.skill {
        Some(skill) => {
            let (pin, _, _) = pins
                .iter()
                .find(|(p, _, _)| &p.skill == skill)
                .ok_or_else(|| {
                    skillbox_registry::RegistryError::NotActivated(format!(
                        "skill {skill:?} is not activated in run {run}; activate it first"
                    ))
                })?;
            Some(skillbox_registry::runs::mount_path(
                &pin.skill_id,
                pin.revision,
            ))
        }
        None => None,
    };
    let cwd = body
        .cwd
        .clone()
        .or_else(|| skill_mount.clone())
        .unwrap_or_else(|| "/workspace".into());
    let mounts: Vec<skillbox_box::Mount> =
        pins.iter()
            .map(|(p, tree, manifest)| {
                Ok(skillbox_box::Mount {
                    target: skillbox_registry::runs::mount_path(&p.skill_id, p.revision),
                    source: tree.clone(),
                    manifest: manifest.clone(),
                    digest: p.digest.parse().map_err(
                        |e: skillbox_package::digest::BadDigest| ApiError::internal(e.to_string()),
                    )?,
                })
            })
            .collect::<ApiResult<_>>()?;
    let sandbox = skillbox_box::Sandbox {
        id: run.clone(),
        workspace_dir: Some(s.run_workspace(&run)),
        mounts,
        binds: vec![],
        environment_of: skill_mount,
        network: false,
    };
    let (live, chunks) = if q.stream {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        (Some(tx), Some(rx))
    } else {
        (None, None)
    };
    let req = skillbox_box::ExecRequest {
        program,
        cwd,
        env: body.env,
        stdin: body.stdin.map(String::into_bytes),
        timeout: std::time::Duration::from_millis(
            body.timeout_ms.unwrap_or(60_000).clamp(1, MAX_TIMEOUT_MS),
        ),
        output_cap: OUTPUT_CAP,
        live,
    };
    let mut summary = json!({
        "sandbox_id": run,
        "backend": caps.backend,
        "packages": pins.iter().map(|(p, _, _)| json!({"skill": p.skill, "revision": p.revision, "digest": p.digest})).collect::<Vec<_>>(),
    });
    let Some(chunks) = chunks else {
        let result = finish_exec(sandbox_rt.exec(&sandbox, req).await)?;
        summary["stdout"] = json!(String::from_utf8_lossy(&result.stdout));
        summary["stderr"] = json!(String::from_utf8_lossy(&result.stderr));
        merge(&mut summary, to_json(&result)?);
        return Ok(Json(summary).into_response());
    };
    let running = tokio::spawn(async move { sandbox_rt.exec(&sandbox, req).await });
    let lines =
        futures_util::stream::unfold(Some((chunks, running, summary)), |state| async move {
            let (mut chunks, running, summary) = state?;
            if let Some((kind, data)) = chunks.recv().await {
                let line = json!({"type": kind, "data": String::from_utf8_lossy(&data)});
                return Some((
                    Ok::<_, std::convert::Infallible>(format!("{line}\n")),
                    Some((chunks, running, summary)),
                ));
            }
            let outcome = match running.await {
                Ok(r) => finish_exec(r),
                Err(e) => Err(ApiError::internal(format!("execution task failed: {e}"))),
            };
            let line = match outcome.and_then(|r| to_json(&r)) {
                Ok(result) => {
                    let mut v = summary;
                    merge(&mut v, result);
                    v["type"] = json!("exit");
                    v
                }
                Err(e) => json!({"type": "error", "error": {"code": e.code, "message": e.message}}),
            };
            Some((Ok(format!("{line}\n")), None))
        });
    Ok((
        [(header::CONTENT_TYPE, "application/x-ndjson")],
        Body::from_stream(lines),
    )
        .into_response())
}

/// Maps the box's answer: a revocation kill is `revision_revoked`.
fn finish_exec(
    r: Result<skillbox_box::ExecResult, skillbox_box::BoxError>,
) -> ApiResult<skillbox_box::ExecResult> {
    let result = r.map_err(box_error)?;
    if result.outcome == skillbox_box::Outcome::Killed {
        return Err(skillbox_registry::RegistryError::RevisionRevoked(
            "the execution was killed: a revision it mounts was revoked".into(),
        )
        .into());
    }
    Ok(result)
}

fn box_error(e: skillbox_box::BoxError) -> ApiError {
    use skillbox_box::BoxError as B;
    match e {
        B::BadRequest(m) => ApiError::bad_request(m),
        B::Missing(m) => ApiError::not_found(m),
        B::TooLarge(m) => ApiError::too_large(m),
        B::Unavailable(m) => skillbox_registry::RegistryError::BoxUnavailable(m).into(),
        B::Dependencies(m) => ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "dependency_build_failed",
            m,
        ),
        B::SpecialFiles(paths) => skillbox_registry::RegistryError::InvalidPackage {
            problems: paths
                .into_iter()
                .map(|p| {
                    skillbox_package::Problem::at_path(
                        p,
                        "only regular files and directories are allowed (this is a socket)",
                    )
                })
                .collect(),
            warnings: vec![],
        }
        .into(),
        B::Io(e) => ApiError::internal(format!("sandbox: {e}")),
    }
}

fn merge(into: &mut Value, from: Value) {
    if let (Value::Object(a), Value::Object(b)) = (into, from) {
        a.extend(b);
    }
}

#[derive(Deserialize)]
struct RunDraftBody {
    skill: String,
    base_revision: Option<i64>,
}

/// The running box, or `box_unavailable` saying what still works.
fn running_box(s: &AppState) -> ApiResult<Arc<skillbox_box::BoxRuntime>> {
    s.sandbox.clone().ok_or_else(|| {
        skillbox_registry::RegistryError::BoxUnavailable(
            "no sandbox backend is running (--box none): activation and reads work; execution and run drafts do not".into(),
        )
        .into()
    })
}

/// The run's sandbox with no packages: for moving files in and out of its workspace.
fn workspace_sandbox(s: &AppState, run: &str) -> skillbox_box::Sandbox {
    skillbox_box::Sandbox {
        id: run.to_string(),
        workspace_dir: Some(s.run_workspace(run)),
        mounts: vec![],
        binds: vec![],
        environment_of: None,
        network: false,
    }
}

/// Creates a run draft: the base revision's files unpacked at
/// `/workspace/skill-drafts/<draft-id>/` in the run's sandbox.
async fn run_draft(
    State(s): State<SharedState>,
    ApiPath((ws, run)): ApiPath<(String, String)>,
    headers: HeaderMap,
    ApiJson(body): ApiJson<RunDraftBody>,
) -> ApiResult<(StatusCode, Json<Value>)> {
    authorize(&s, &headers, &ws, Role::Runner).await?;
    let sandbox_rt = running_box(&s)?;
    let (draft, tar) = s
        .registry
        .create_run_draft(&ws, &run, &body.skill, body.base_revision)
        .await?;
    let path = skillbox_registry::drafts::run_draft_path(&draft.id);
    if let Err(e) = sandbox_rt
        .import_tar(&workspace_sandbox(&s, &run), &path, tar)
        .await
    {
        s.registry.delete_draft(&ws, &draft.id).await?;
        return Err(box_error(e));
    }
    Ok((
        StatusCode::CREATED,
        Json(json!({
            "draft_id": draft.id,
            "skill": draft.skill,
            "base_revision": draft.base_revision,
            "run_id": run,
            "path": path,
        })),
    ))
}

// ---------- gc ----------

#[derive(Deserialize, Default)]
struct GcBody {
    #[serde(default)]
    dry_run: bool,
    grace_seconds: Option<u64>,
}

async fn gc(
    State(s): State<SharedState>,
    headers: HeaderMap,
    body: Option<ApiJson<GcBody>>,
) -> ApiResult<Json<Value>> {
    authorize_server_admin(&s, &headers).await?;
    let body = body.map(|ApiJson(b)| b).unwrap_or_default();
    let grace =
        std::time::Duration::from_secs(body.grace_seconds.unwrap_or(s.cfg.gc_grace.as_secs()));
    let report = s.registry.gc(body.dry_run, grace).await?;
    Ok(Json(to_json(report)?))
}
