//! The route table — one list that builds the router ([`router`]), enforces each route's
//! access ([`crate::auth`]) and writes the OpenAPI document ([`crate::openapi`]) — and the
//! handlers, one file per concern. A handler parses, calls the registry (or the box through
//! [`crate::sandbox`]) and answers with a `skillbox_api` type.

mod admin;
mod drafts;
mod events;
pub(crate) mod exec;
mod nodes;
mod ops;
mod revisions;
mod runs;
mod skills;

use crate::SharedState;
use crate::auth::Access;
use crate::error::{ApiError, ApiResult};
use axum::Router;
use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodFilter, MethodRouter};
use skillbox_api::ErrorCode;
use skillbox_registry::{FileContent, Role};

/// One route: method, axum path, who may call it, what it does, and its handler.
pub struct Route {
    pub method: Method,
    pub path: &'static str,
    pub access: Access,
    pub summary: &'static str,
    handler: fn(MethodFilter) -> MethodRouter<SharedState>,
}

macro_rules! route {
    ($method:ident $path:literal, $access:expr, $handler:path, $summary:literal) => {
        Route {
            method: Method::$method,
            path: $path,
            access: $access,
            summary: $summary,
            handler: |m| axum::routing::on(m, $handler),
        }
    };
}

const READER: Access = Access::Workspace(Role::Reader);
const AUTHOR: Access = Access::Workspace(Role::Author);
const RUNNER: Access = Access::Workspace(Role::Runner);
const ADMIN: Access = Access::Workspace(Role::Admin);

/// Every route the server answers (SPEC §5).
pub static ROUTES: &[Route] = &[
    route!(GET "/healthz", Access::Public, ops::healthz,
        "Liveness: 200 when the server runs and its metadata store answers."),
    route!(GET "/metrics", Access::Public, ops::metrics, "Prometheus metrics."),
    route!(GET "/openapi.json", Access::Public, ops::openapi, "This document."),
    route!(GET "/v1/whoami", Access::AnyToken, ops::whoami,
        "The bearer token's identity: {role, workspace (null for the admin token), box_available}."),
    route!(GET "/v1/workspaces/{ws}/skills", READER, skills::list, "List skills (not deleted)."),
    route!(GET "/v1/workspaces/{ws}/skills/{name}", READER, skills::detail,
        "Skill detail with its current revision and frontmatter."),
    route!(DELETE "/v1/workspaces/{ws}/skills/{name}", ADMIN, skills::delete, "Soft-delete a skill."),
    route!(POST "/v1/workspaces/{ws}/skills/{name}/revisions", AUTHOR, skills::publish,
        "Publish a revision (body: zip, tar or tar.gz; query base_revision)."),
    route!(PUT "/v1/workspaces/{ws}/skills/{name}/current", AUTHOR, skills::move_current,
        "Move the current pointer (rollback), compare-and-swap."),
    route!(GET "/v1/workspaces/{ws}/skills/{name}/revisions", READER, revisions::list,
        "Revision history, newest first."),
    route!(GET "/v1/workspaces/{ws}/skills/{name}/revisions/{rev}", READER, revisions::detail,
        "One revision with its manifest; rev is a number or 'current'."),
    route!(GET "/v1/workspaces/{ws}/skills/{name}/revisions/{rev}/files/{*path}", READER,
        revisions::file, "File bytes; ETag is the file's sha256."),
    route!(GET "/v1/workspaces/{ws}/skills/{name}/revisions/{rev}/archive", READER,
        revisions::archive, "Deterministic tar of the revision."),
    route!(POST "/v1/workspaces/{ws}/skills/{name}/revisions/{rev}/revoke", ADMIN, revisions::revoke,
        "Emergency revocation of one revision {reason}: reads, activations and executions fail, running executions are killed."),
    route!(POST "/v1/workspaces/{ws}/drafts", AUTHOR, drafts::create,
        "Create a draft from a base revision (0 = empty)."),
    route!(GET "/v1/workspaces/{ws}/drafts/{id}", READER, drafts::detail,
        "Draft detail and its file list."),
    route!(PUT "/v1/workspaces/{ws}/drafts/{id}", AUTHOR, drafts::rebase,
        "Rebase: set the draft's base revision."),
    route!(DELETE "/v1/workspaces/{ws}/drafts/{id}", AUTHOR, drafts::delete, "Delete a draft."),
    route!(GET "/v1/workspaces/{ws}/drafts/{id}/files/{*path}", READER, drafts::file_get,
        "Read a draft file."),
    route!(PUT "/v1/workspaces/{ws}/drafts/{id}/files/{*path}", AUTHOR, drafts::file_put,
        "Write a draft file (query executable=true for an executable)."),
    route!(DELETE "/v1/workspaces/{ws}/drafts/{id}/files/{*path}", AUTHOR, drafts::file_delete,
        "Delete a draft file."),
    route!(POST "/v1/workspaces/{ws}/drafts/{id}/publish", AUTHOR, drafts::publish,
        "Publish the draft with its base revision."),
    route!(POST "/v1/workspaces/{ws}/runs", RUNNER, runs::create,
        "Create a run {skills?, ttl_seconds?, require_immutable?}."),
    route!(GET "/v1/workspaces/{ws}/runs", RUNNER, runs::list,
        "The workspace's live runs, newest first: authorized skills, pins, lease, sandbox backend, node."),
    route!(GET "/v1/workspaces/{ws}/runs/{run}", RUNNER, runs::detail,
        "A run: state, lease and activations (pins)."),
    route!(DELETE "/v1/workspaces/{ws}/runs/{run}", RUNNER, runs::finish,
        "Finish the run: release its pins and sandbox."),
    route!(POST "/v1/workspaces/{ws}/runs/{run}/activations", RUNNER, runs::activate,
        "Activate (pin) a skill {skill, revision?}: instructions, files, mount path."),
    route!(GET "/v1/workspaces/{ws}/runs/{run}/skills/{name}/files/{*path}", RUNNER,
        runs::pinned_file, "Read a file of the run's pinned revision."),
    route!(POST "/v1/workspaces/{ws}/runs/{run}/heartbeat", RUNNER, runs::heartbeat,
        "Extend the run's lease."),
    route!(GET "/v1/workspaces/{ws}/runs/{run}/prompt", RUNNER, runs::prompt,
        "The authorized skills' <available_skills> index for a system prompt."),
    route!(POST "/v1/workspaces/{ws}/runs/{run}/exec", RUNNER, exec::exec,
        "Execute in the run's sandbox {skill?, argv | command, cwd?, env?, timeout_ms?, stdin?}; ?stream=true answers NDJSON."),
    route!(POST "/v1/workspaces/{ws}/runs/{run}/drafts", RUNNER, drafts::create_in_run,
        "Create a run draft {skill, base_revision?} at /workspace/skill-drafts/<draft-id>/ in the run's sandbox; publish it with the drafts publish call."),
    route!(GET "/v1/workspaces/{ws}/events", READER, events::stream,
        "Event log as Server-Sent Events from ?after=SEQ (follow=false ends after the backlog)."),
    route!(POST "/v1/admin/tokens", Access::ServerAdmin, admin::create_token,
        "Mint a token {workspace, role} (role node: no workspace); shown once."),
    route!(POST "/v1/admin/gc", Access::ServerAdmin, admin::gc,
        "Collect unreferenced revisions and content {dry_run?, grace_seconds?}."),
    route!(POST "/v1/admin/fsck", Access::ServerAdmin, admin::fsck,
        "Re-verify stored content; report problems, change nothing."),
    route!(GET "/v1/admin/workspaces", Access::ServerAdmin, admin::workspaces,
        "The workspaces that have skills or tokens, by name."),
    route!(GET "/v1/admin/nodes", Access::ServerAdmin, nodes::list,
        "Execution nodes: id, address, state (live | lost), load, last heartbeat, version."),
    route!(POST "/v1/nodes", Access::Node, nodes::register,
        "A node registers {id?, address, version}: its id, Core's secret, the heartbeat interval."),
    route!(POST "/v1/nodes/{id}/heartbeat", Access::Node, nodes::heartbeat,
        "A node's heartbeat {load}."),
    route!(GET "/v1/nodes/archives/{digest}", Access::Node, nodes::archive,
        "The archive of a revision tree by digest, for a node whose runs pinned it or whose live runs' skills have it current."),
    route!(GET "/v1/nodes/{id}/prefetch", Access::Node, nodes::prefetch,
        "Server-Sent Events: the node's prefetch set {packages: [{skill_id, revision, digest}]}, again whenever it moves."),
];

/// `methods` behind the access check of `access`. A router of methods has its check on
/// those methods (another method is a 405, checked or not); a service that answers every
/// method (`any_service`: no method routes, only a fallback) has it on the whole.
fn guarded(
    state: &SharedState,
    access: Access,
    methods: MethodRouter<SharedState>,
    every_method: bool,
) -> MethodRouter<SharedState> {
    if access == Access::Public {
        return methods;
    }
    let check = axum::middleware::from_fn_with_state(
        state.clone(),
        move |state: axum::extract::State<SharedState>,
              req: axum::extract::Request,
              next: axum::middleware::Next| {
            crate::auth::check(state, access, req, next)
        },
    );
    if every_method {
        methods.layer(check)
    } else {
        methods.route_layer(check)
    }
}

/// A service the binary builds (the MCP endpoint, `axum::routing::any_service`), answering
/// every method at `path` behind the access check of `access`: for [`crate::router_with`].
pub fn mount(
    state: &SharedState,
    path: &str,
    access: Access,
    service: MethodRouter<SharedState>,
) -> Router<SharedState> {
    Router::new().route(path, guarded(state, access, service, true))
}

/// The router of [`ROUTES`], each route behind its access check.
pub fn router(state: &SharedState) -> Router<SharedState> {
    let mut router = Router::new();
    for route in ROUTES {
        let filter = MethodFilter::try_from(route.method.clone())
            .unwrap_or_else(|_| panic!("route table: {} is not a routable method", route.method));
        router = router.route(
            route.path,
            guarded(state, route.access, (route.handler)(filter), false),
        );
    }
    router
        .merge(crate::console::router())
        .layer(axum::extract::DefaultBodyLimit::max(2 * 1024 * 1024))
        .fallback(|| async {
            ApiError::new(ErrorCode::NotFound, "no such route; see /openapi.json")
        })
        .method_not_allowed_fallback(|| async {
            ApiError::new(
                ErrorCode::MethodNotAllowed,
                "this route does not take that method; see /openapi.json",
            )
        })
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

/// A file's bytes with `ETag: "sha256:<hex>"`; `If-None-Match` answers 304.
async fn file_response(
    headers: &HeaderMap,
    entry: &skillbox_package::FileEntry,
    content: FileContent,
) -> ApiResult<Response> {
    let etag = etag_of(&entry.sha256);
    if headers.get(header::IF_NONE_MATCH) == Some(&etag) {
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
    h.insert(header::ETAG, etag);
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(content_type_for(&entry.path)),
    );
    h.insert(header::CONTENT_LENGTH, HeaderValue::from(entry.size));
    Ok(resp)
}

/// A file's ETag, `"sha256:<hex>"`, written straight into its bytes: it is on every pinned
/// read, where `format!` through the digest's `Display` (and a `String` for its hex) showed
/// in `perf` of `scripts/bench-runs`.
fn etag_of(sha256: &skillbox_package::Sha256) -> HeaderValue {
    const PREFIX: &[u8] = b"\"sha256:";
    let mut bytes = [b'"'; PREFIX.len() + 64 + 1];
    bytes[..PREFIX.len()].copy_from_slice(PREFIX);
    bytes[PREFIX.len()..PREFIX.len() + 64].copy_from_slice(&sha256.hex_bytes());
    HeaderValue::from_bytes(&bytes).expect("quotes, ASCII letters, digits and a colon")
}

/// A publish's answer: 201 for a new revision, 200 for a replayed retry.
fn published(p: skillbox_api::Published) -> (StatusCode, axum::Json<skillbox_api::Published>) {
    let status = if p.replayed {
        StatusCode::OK
    } else {
        StatusCode::CREATED
    };
    (status, axum::Json(p))
}
