//! The OpenAPI document, generated from the route table the router is checked against.

use serde_json::{Map, Value, json};

/// One route: method, axum path, summary, the role it needs (`-` = none).
pub struct Route {
    pub method: &'static str,
    pub path: &'static str,
    pub summary: &'static str,
    pub role: &'static str,
}

macro_rules! routes {
    ($(($m:literal, $p:literal, $role:literal, $s:literal)),* $(,)?) => {
        pub const ROUTES: &[Route] = &[$(Route { method: $m, path: $p, summary: $s, role: $role }),*];
    };
}

routes![
    (
        "GET",
        "/healthz",
        "-",
        "Liveness: 200 when the server runs and its metadata store answers."
    ),
    ("GET", "/metrics", "-", "Prometheus metrics."),
    ("GET", "/openapi.json", "-", "This document."),
    (
        "GET",
        "/v1/workspaces/{ws}/skills",
        "reader",
        "List skills (not deleted)."
    ),
    (
        "GET",
        "/v1/workspaces/{ws}/skills/{name}",
        "reader",
        "Skill detail with its current revision and frontmatter."
    ),
    (
        "DELETE",
        "/v1/workspaces/{ws}/skills/{name}",
        "admin",
        "Soft-delete a skill."
    ),
    (
        "POST",
        "/v1/workspaces/{ws}/skills/{name}/revisions",
        "author",
        "Publish a revision (body: zip, tar or tar.gz; query base_revision)."
    ),
    (
        "GET",
        "/v1/workspaces/{ws}/skills/{name}/revisions",
        "reader",
        "Revision history, newest first."
    ),
    (
        "GET",
        "/v1/workspaces/{ws}/skills/{name}/revisions/{rev}",
        "reader",
        "One revision with its manifest; rev is a number or 'current'."
    ),
    (
        "GET",
        "/v1/workspaces/{ws}/skills/{name}/revisions/{rev}/files/{*path}",
        "reader",
        "File bytes; ETag is the file's sha256."
    ),
    (
        "GET",
        "/v1/workspaces/{ws}/skills/{name}/revisions/{rev}/archive",
        "reader",
        "Deterministic tar of the revision."
    ),
    (
        "PUT",
        "/v1/workspaces/{ws}/skills/{name}/current",
        "author",
        "Move the current pointer (rollback), compare-and-swap."
    ),
    (
        "POST",
        "/v1/workspaces/{ws}/drafts",
        "author",
        "Create a draft from a base revision (0 = empty)."
    ),
    (
        "GET",
        "/v1/workspaces/{ws}/drafts/{id}",
        "reader",
        "Draft detail and its file list."
    ),
    (
        "PUT",
        "/v1/workspaces/{ws}/drafts/{id}",
        "author",
        "Rebase: set the draft's base revision."
    ),
    (
        "DELETE",
        "/v1/workspaces/{ws}/drafts/{id}",
        "author",
        "Delete a draft."
    ),
    (
        "GET",
        "/v1/workspaces/{ws}/drafts/{id}/files/{*path}",
        "reader",
        "Read a draft file."
    ),
    (
        "PUT",
        "/v1/workspaces/{ws}/drafts/{id}/files/{*path}",
        "author",
        "Write a draft file (query executable=true for an executable)."
    ),
    (
        "DELETE",
        "/v1/workspaces/{ws}/drafts/{id}/files/{*path}",
        "author",
        "Delete a draft file."
    ),
    (
        "POST",
        "/v1/workspaces/{ws}/drafts/{id}/publish",
        "author",
        "Publish the draft with its base revision."
    ),
    (
        "POST",
        "/v1/workspaces/{ws}/skills/{name}/revisions/{rev}/revoke",
        "admin",
        "Emergency revocation of one revision {reason}: reads, activations and executions fail, running executions are killed."
    ),
    (
        "POST",
        "/v1/workspaces/{ws}/runs",
        "runner",
        "Create a run {skills?, ttl_seconds?, require_immutable?}."
    ),
    (
        "GET",
        "/v1/workspaces/{ws}/runs/{run}",
        "runner",
        "A run: state, lease and activations (pins)."
    ),
    (
        "DELETE",
        "/v1/workspaces/{ws}/runs/{run}",
        "runner",
        "Finish the run: release its pins and sandbox."
    ),
    (
        "POST",
        "/v1/workspaces/{ws}/runs/{run}/activations",
        "runner",
        "Activate (pin) a skill {skill, revision?}: instructions, files, mount path."
    ),
    (
        "GET",
        "/v1/workspaces/{ws}/runs/{run}/skills/{name}/files/{*path}",
        "runner",
        "Read a file of the run's pinned revision."
    ),
    (
        "POST",
        "/v1/workspaces/{ws}/runs/{run}/exec",
        "runner",
        "Execute in the run's sandbox {skill?, argv | command, cwd?, env?, timeout_ms?, stdin?}; ?stream=true answers NDJSON."
    ),
    (
        "POST",
        "/v1/workspaces/{ws}/runs/{run}/drafts",
        "runner",
        "Create a run draft {skill, base_revision?} at /workspace/skill-drafts/<draft-id>/ in the run's sandbox; publish it with the drafts publish call."
    ),
    (
        "POST",
        "/v1/workspaces/{ws}/runs/{run}/heartbeat",
        "runner",
        "Extend the run's lease."
    ),
    (
        "GET",
        "/v1/workspaces/{ws}/runs/{run}/prompt",
        "runner",
        "The authorized skills' <available_skills> index for a system prompt."
    ),
    (
        "POST",
        "/v1/admin/gc",
        "server-admin",
        "Collect unreferenced revisions and content {dry_run?, grace_seconds?}."
    ),
    (
        "GET",
        "/v1/workspaces/{ws}/events",
        "reader",
        "Event log as Server-Sent Events from ?after=SEQ (follow=false ends after the backlog)."
    ),
    (
        "POST",
        "/v1/admin/tokens",
        "server-admin",
        "Mint a workspace token {workspace, role}; shown once."
    ),
    (
        "POST",
        "/v1/admin/fsck",
        "server-admin",
        "Re-verify stored content; report problems, change nothing."
    ),
];

/// The OpenAPI 3.1 document.
pub fn document() -> Value {
    let mut paths: Map<String, Value> = Map::new();
    for r in ROUTES {
        let oa_path = r.path.replace("{*path}", "{path}");
        let params: Vec<Value> = oa_path
            .split('/')
            .filter_map(|seg| seg.strip_prefix('{').and_then(|s| s.strip_suffix('}')))
            .map(|name| json!({"name": name, "in": "path", "required": true, "schema": {"type": "string"}}))
            .collect();
        let mut op = json!({
            "summary": r.summary,
            "operationId": format!("{} {}", r.method, r.path),
            "parameters": params,
            "responses": {
                "default": {"description": "Error: {\"error\": {\"code\", \"message\", ...}}",
                    "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}},
                "200": {"description": "Success"},
            },
        });
        if r.role != "-" {
            op["security"] = json!([{"bearer": []}]);
            op["x-skillbox-role"] = json!(r.role);
        }
        let entry = paths.entry(oa_path).or_insert_with(|| json!({}));
        entry[r.method.to_lowercase()] = op;
    }
    json!({
        "openapi": "3.1.0",
        "info": {"title": "skillbox", "version": env!("CARGO_PKG_VERSION"),
                 "description": "Versioned registry for Agent Skills plus a sandbox runtime. See SPEC §5."},
        "paths": paths,
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": {"Error": {"type": "object", "properties": {"error": {"type": "object",
                "properties": {"code": {"type": "string"}, "message": {"type": "string"}}, "required": ["code", "message"]}}}}
        }
    })
}
