//! The MCP server (SPEC §9.1) on the official Rust SDK (`rmcp`), one [`Session`] handler for
//! both transports:
//! - `skillbox mcp` over stdio: the process is the session, opened before the server answers
//!   `initialize`, its run's lease renewed while the process lives, the run finished when the
//!   client closes stdin;
//! - Streamable HTTP at `/v1/workspaces/{ws}/mcp` on the server ([`http_service`]): a session
//!   (protocol revisions with `initialize`) is opened by `initialize` from the request's
//!   workspace and bearer token and ends when the client deletes it or it idles past its run's
//!   lease; the run is finished then. On the stateless revision (2026-07-28) every request
//!   stands alone: a tool call carries `run_id` (as `activate_skill` answered), and a call
//!   without one gets a fresh run.
//!
//! Every tool speaks the HTTP API through the client's [`Client`] (inside the server: through
//! its router, in-process), so the pins, the checks and the errors are the server's own; an
//! error is a tool error whose text starts with the SPEC code and whose structured content is
//! the error envelope.

use super::{Client, Conn, LocalApi, ServerError};
use axum::response::IntoResponse;
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::tool::ToolCallContext;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, DiscoverResult,
    Implementation, InitializeRequestParams, InitializeResult, ListResourceTemplatesResult,
    ListResourcesResult, ListToolsResult, PaginatedRequestParams, ReadResourceRequestParams,
    ReadResourceResponse, ReadResourceResult, Resource, ResourceContents, ResourceTemplate,
    ServerCapabilities, ServerConfig, ServerJsonRpcMessage, ServerResult,
};
use rmcp::service::{RequestContext, RoleServer};
use rmcp::{
    ErrorData as McpError, ServerHandler, ServiceExt, schemars, tool, tool_handler, tool_router,
};
use serde_json::{Value, json};
use std::process::ExitCode;
use std::sync::{Arc, Mutex};

#[derive(clap::Args)]
pub struct McpArgs {
    /// Restrict the session's authorized skills to these (repeatable; default: all).
    #[arg(long = "skill")]
    pub skills: Vec<String>,
    /// The run's lease in seconds (renewed while the session lives).
    #[arg(long, default_value_t = DEFAULT_TTL_SECONDS)]
    pub ttl_seconds: u64,
}

/// A session's run lease when the client names none (stdio `--ttl-seconds`; over HTTP, also
/// how long an idle session lives).
const DEFAULT_TTL_SECONDS: u64 = 600;

#[derive(Debug, serde::Deserialize, schemars::JsonSchema)]
pub struct ActivateSkill {
    /// The skill's name.
    pub name: String,
    /// A revision to pin (default: the current one).
    pub revision: Option<i64>,
    /// Stateless protocol only: the run to pin in (as an earlier call answered; default: a
    /// fresh run).
    pub run_id: Option<String>,
}

#[derive(Debug, serde::Deserialize, schemars::JsonSchema)]
pub struct ReadSkillFile {
    /// The activated skill's name.
    pub name: String,
    /// A path inside the package, such as `SKILL.md` or `scripts/run.sh`.
    pub path: String,
    /// Stateless protocol only: the run whose pin to read (as `activate_skill` answered).
    pub run_id: Option<String>,
}

#[derive(Debug, serde::Deserialize, schemars::JsonSchema)]
pub struct RunCommand {
    /// The program and its arguments (give this or `command`).
    pub argv: Option<Vec<String>>,
    /// A shell command line (give this or `argv`).
    pub command: Option<String>,
    /// Run in this activated skill's directory, with its dependency environment.
    pub skill: Option<String>,
    /// Working directory (default: the skill's directory, else /workspace).
    pub cwd: Option<String>,
    /// Standard input.
    pub stdin: Option<String>,
    /// Time limit in milliseconds.
    pub timeout_ms: Option<u64>,
    /// Stateless protocol only: the run whose sandbox to use (as `activate_skill` answered).
    pub run_id: Option<String>,
}

#[derive(Debug, serde::Deserialize, schemars::JsonSchema)]
pub struct CreateSkillDraft {
    /// The skill to draft a new revision of (from its current revision).
    pub name: String,
    /// Stateless protocol only: the run whose sandbox holds the draft.
    pub run_id: Option<String>,
}

#[derive(Debug, serde::Deserialize, schemars::JsonSchema)]
pub struct PublishSkillDraft {
    /// The draft's id, as `create_skill_draft` answered.
    pub draft_id: String,
}

#[derive(Debug, Default, serde::Deserialize, schemars::JsonSchema)]
pub struct ListSkills {
    /// Stateless protocol only: the run whose pins to show.
    pub run_id: Option<String>,
}

/// What a session is, settled when it opens: who, its run, its index, its tools.
struct Opened {
    client: Arc<Client>,
    /// The bearer token it was opened with: every later request of an HTTP session carries it.
    token: String,
    /// The session's run: none for a token that may not run skills (reader, author), and none
    /// on the stateless protocol, where each call names its run.
    run_id: Option<String>,
    instructions: String,
    /// The tools this session lists and answers (by role and box).
    tools: Vec<&'static str>,
    /// The authorized set of runs this session creates (empty: every skill).
    skills: Vec<String>,
    ttl_seconds: u64,
    /// Over HTTP: ends the session's run and notifications when rmcp drops the session.
    end: Option<SessionEnd>,
}

/// The end of an HTTP session: rmcp drops the handler when the client deletes the session or
/// it idles out; the run is finished then (stdio finishes its run itself, before exiting).
struct SessionEnd {
    announcer: Mutex<Option<tokio::task::AbortHandle>>,
}

impl Drop for Opened {
    fn drop(&mut self) {
        let Some(end) = &self.end else { return };
        if let Ok(mut a) = end.announcer.lock()
            && let Some(a) = a.take()
        {
            a.abort();
        }
        if let (Some(run_id), Ok(rt)) = (self.run_id.clone(), tokio::runtime::Handle::try_current())
        {
            let client = self.client.clone();
            rt.spawn(async move {
                let url = client.ws_url(&format!("runs/{run_id}"));
                if let Err(e) = client.send(client.req(reqwest::Method::DELETE, url)).await {
                    tracing::warn!(%run_id, error = %format!("{e:#}"), "finishing an MCP session's run failed");
                }
            });
        }
    }
}

/// Where sessions come from: stdio opens its one session before serving; the HTTP endpoint
/// opens one per `initialize` (or per stateless request) from the request.
struct HttpOrigin {
    /// This server's own API, which the sessions' tools call: in-process through `local` once
    /// the router is set, else over HTTP at `base_url`.
    base_url: String,
    http: reqwest::Client,
    local: LocalApi,
    /// Whether the server has a box (its sessions list `run_command` then).
    box_available: bool,
}

/// The MCP handler: one per session (rmcp clones it per request).
#[derive(Clone)]
pub struct Session {
    opened: Arc<tokio::sync::OnceCell<Arc<Opened>>>,
    http: Option<Arc<HttpOrigin>>,
    tool_router: ToolRouter<Session>,
}

/// A tool's answer: its JSON as structured content (and as text, for clients without it), or
/// the server's error as a tool error.
fn answer(result: anyhow::Result<Value>) -> Result<CallToolResult, McpError> {
    match result {
        Ok(v) => Ok(CallToolResult::structured(v)),
        Err(e) => {
            let (code, message, envelope) = match e.downcast_ref::<ServerError>() {
                Some(se) => (
                    se.body.error.code.clone(),
                    se.body.error.message.clone(),
                    serde_json::to_value(&se.body).unwrap_or_default(),
                ),
                None => {
                    let m = format!("{e:#}");
                    let env = json!({"error": {"code": "unavailable", "message": m}});
                    ("unavailable".to_string(), m, env)
                }
            };
            let mut r =
                CallToolResult::error(vec![ContentBlock::text(format!("{code}: {message}"))]);
            r.structured_content = Some(envelope);
            Ok(r)
        }
    }
}

/// Adds `run_id` to an answer when the call ran in a run it did not name (a fresh one), so a
/// stateless client can carry it on.
fn with_run(v: anyhow::Result<Value>, run: &RunOf) -> anyhow::Result<Value> {
    v.map(|mut v| {
        if run.fresh && v.is_object() {
            v["run_id"] = json!(run.id);
        }
        v
    })
}

/// `read_skill_file`'s structured content.
#[derive(serde::Serialize)]
struct FileRead<'a> {
    name: &'a str,
    path: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    text: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    blob: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    run_id: Option<&'a str>,
}

/// The run a tool call works in.
struct RunOf {
    id: String,
    /// Created for this call (stateless protocol, no `run_id` given).
    fresh: bool,
}

#[tool_router]
impl Session {
    #[tool(
        description = "List the skills this session may use: name, description, current revision, and the pinned revision once activated."
    )]
    async fn list_skills(
        &self,
        Parameters(l): Parameters<ListSkills>,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, McpError> {
        let s = self.opened(&context).await?;
        answer(s.list(l.run_id.as_deref().or(s.run_id.as_deref())).await)
    }

    #[tool(
        description = "Activate a skill: pins its revision for this session and returns its instructions (SKILL.md body), revision, digest, files, mount path and run_id."
    )]
    async fn activate_skill(
        &self,
        Parameters(a): Parameters<ActivateSkill>,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, McpError> {
        let s = self.opened(&context).await?;
        let run = match s.run_of(a.run_id).await {
            Ok(run) => run,
            Err(e) => return answer(Err(e)),
        };
        let mut body = json!({"skill": a.name});
        if let Some(r) = a.revision {
            body["revision"] = json!(r);
        }
        let url = s.client.ws_url(&format!("runs/{}/activations", run.id));
        answer(
            s.client
                .send_json::<_, Value>(reqwest::Method::POST, url, &body)
                .await
                .map(|mut v| {
                    v["run_id"] = json!(run.id);
                    v
                }),
        )
    }

    #[tool(
        description = "Read a file of an activated skill, from the revision pinned in this session: text, or base64 for binary files."
    )]
    async fn read_skill_file(
        &self,
        Parameters(r): Parameters<ReadSkillFile>,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, McpError> {
        self.opened(&context).await?.read_file(r).await
    }

    #[tool(
        description = "Run a command in this session's sandbox, which holds exactly the pinned revisions of the activated skills under /skills, read-only: exit_code, stdout, stderr."
    )]
    async fn run_command(
        &self,
        Parameters(c): Parameters<RunCommand>,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, McpError> {
        let s = self.opened(&context).await?;
        let run = match s.run_of(c.run_id).await {
            Ok(run) => run,
            Err(e) => return answer(Err(e)),
        };
        let mut body = json!({});
        for (key, value) in [
            ("argv", c.argv.map(|a| json!(a))),
            ("command", c.command.map(|a| json!(a))),
            ("skill", c.skill.map(|a| json!(a))),
            ("cwd", c.cwd.map(|a| json!(a))),
            ("stdin", c.stdin.map(|a| json!(a))),
            ("timeout_ms", c.timeout_ms.map(|a| json!(a))),
        ] {
            if let Some(v) = value {
                body[key] = v;
            }
        }
        let url = s.client.ws_url(&format!("runs/{}/exec", run.id));
        let ran = s
            .client
            .send_json::<_, Value>(reqwest::Method::POST, url, &body)
            .await;
        answer(with_run(ran, &run))
    }

    #[tool(
        description = "Create a draft of a new revision of a skill in this session's sandbox, at /workspace/skill-drafts/<draft_id>/: edit it with run_command, then publish_skill_draft."
    )]
    async fn create_skill_draft(
        &self,
        Parameters(d): Parameters<CreateSkillDraft>,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, McpError> {
        let s = self.opened(&context).await?;
        let run = match s.run_of(d.run_id).await {
            Ok(run) => run,
            Err(e) => return answer(Err(e)),
        };
        let url = s.client.ws_url(&format!("runs/{}/drafts", run.id));
        let created = s
            .client
            .send_json::<_, Value>(reqwest::Method::POST, url, &json!({"skill": d.name}))
            .await;
        answer(with_run(created, &run))
    }

    #[tool(
        description = "Publish a draft as the skill's next revision (compare-and-swap on the draft's base revision)."
    )]
    async fn publish_skill_draft(
        &self,
        Parameters(p): Parameters<PublishSkillDraft>,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, McpError> {
        let s = self.opened(&context).await?;
        let url = s.client.ws_url(&format!("drafts/{}/publish", p.draft_id));
        answer(
            s.client
                .call::<Value>(s.client.req(reqwest::Method::POST, url))
                .await,
        )
    }
}

/// The tools a session lists: by the token's role, and whether the server has a box (run
/// drafts live in the session's sandbox, so the draft tools need one too).
fn tools_for(role: &str, box_available: bool) -> Vec<&'static str> {
    let runner = matches!(role, "runner" | "admin");
    let mut tools = vec!["list_skills"];
    if runner {
        tools.extend(["activate_skill", "read_skill_file"]);
        if box_available {
            tools.extend(["run_command", "create_skill_draft", "publish_skill_draft"]);
        }
    }
    tools
}

/// Who opens a session: the token's role and whether the server has a box.
struct Who {
    role: String,
    box_available: bool,
}

impl Who {
    /// As the server says (`GET /v1/whoami`); the same answer gives `client` the token's own
    /// workspace when none was named (see [`Client::connect`]).
    async fn asked(client: &mut Client) -> anyhow::Result<Who> {
        let who: Value = client.get(client.url("/v1/whoami")).await?;
        client.adopt_workspace(who["workspace"].as_str());
        Ok(Who {
            role: who["role"].as_str().unwrap_or_default().to_string(),
            box_available: who["box_available"].as_bool() == Some(true),
        })
    }
}

/// How a session opens.
#[derive(PartialEq)]
enum Opening {
    /// A session of its own (stdio, HTTP `initialize`): a run when the role may run skills,
    /// and the index as instructions.
    Session,
    /// One stateless request: no run until a call needs one, no index until asked.
    Request,
}

impl Opened {
    /// Opens a session for the client's token: with a run of its own whose prompt index is
    /// the instructions, or without one (the index of the workspace's skills).
    async fn open(
        client: Arc<Client>,
        who: Who,
        skills: Vec<String>,
        ttl_seconds: u64,
        opening: Opening,
    ) -> anyhow::Result<Opened> {
        let tools = tools_for(&who.role, who.box_available);
        let mut opened = Opened {
            token: client.conn.token.clone().unwrap_or_default(),
            client,
            run_id: None,
            instructions: String::new(),
            tools,
            skills,
            ttl_seconds,
            end: None,
        };
        if opening == Opening::Request {
            return Ok(opened);
        }
        if opened.tools.contains(&"activate_skill") {
            let run_id = opened.create_run().await?;
            let prompt: Value = opened
                .client
                .get(opened.client.ws_url(&format!("runs/{run_id}/prompt")))
                .await?;
            opened.instructions = prompt["prompt"].as_str().unwrap_or_default().to_string();
            opened.run_id = Some(run_id);
        } else {
            opened.instructions = opened.index().await?;
        }
        Ok(opened)
    }

    /// The `<available_skills>` index of the session's skills, without a run.
    async fn index(&self) -> anyhow::Result<String> {
        let listed: Value = self.client.get(self.client.ws_url("skills")).await?;
        Ok(index_of(&listed, &self.skills))
    }

    async fn create_run(&self) -> anyhow::Result<String> {
        let mut body = json!({"ttl_seconds": self.ttl_seconds});
        if !self.skills.is_empty() {
            body["skills"] = json!(self.skills);
        }
        let run: Value = self
            .client
            .send_json(reqwest::Method::POST, self.client.ws_url("runs"), &body)
            .await?;
        run["run_id"]
            .as_str()
            .map(str::to_string)
            .ok_or_else(|| anyhow::anyhow!("the server created a run without an id: {run}"))
    }

    /// The run a call works in: the one it names, else the session's, else a fresh one (the
    /// stateless protocol; for a token that may not create runs, the server's refusal).
    async fn run_of(&self, given: Option<String>) -> anyhow::Result<RunOf> {
        match given.or_else(|| self.run_id.clone()) {
            Some(id) => Ok(RunOf { id, fresh: false }),
            None => Ok(RunOf {
                id: self.create_run().await?,
                fresh: true,
            }),
        }
    }

    /// `read_skill_file`: the file of the pinned revision, as text or a base64 blob.
    async fn read_file(&self, r: ReadSkillFile) -> Result<CallToolResult, McpError> {
        answer(
            self.read_file_json(r)
                .await
                .and_then(|json| Ok(serde_json::from_str(&json)?)),
        )
    }

    /// [`Opened::read_file`]'s structured content, as JSON text (the endpoint's read fast path
    /// sends it as it is), or the server's error.
    async fn read_file_json(&self, r: ReadSkillFile) -> anyhow::Result<String> {
        let run = self.run_of(r.run_id).await?;
        let url = self.client.ws_url(&format!(
            "runs/{}/skills/{}/files/{}",
            run.id, r.name, r.path
        ));
        let bytes = self.client.bytes(url).await?;
        let (text, blob) = match std::str::from_utf8(&bytes) {
            Ok(text) => (Some(text), None),
            Err(_) => {
                use base64::Engine;
                (
                    None,
                    Some(base64::engine::general_purpose::STANDARD.encode(&bytes)),
                )
            }
        };
        Ok(serde_json::to_string(&FileRead {
            name: &r.name,
            path: &r.path,
            text,
            blob,
            // A call that ran in a fresh run (stateless protocol) says which.
            run_id: run.fresh.then_some(run.id.as_str()),
        })?)
    }

    async fn list(&self, run_id: Option<&str>) -> anyhow::Result<Value> {
        let skills: Value = self.client.get(self.client.ws_url("skills")).await?;
        let run: Value = match run_id {
            Some(id) => {
                self.client
                    .get(self.client.ws_url(&format!("runs/{id}")))
                    .await?
            }
            None => json!({}),
        };
        let authorized: Vec<&str> = match run["authorized_skills"].as_array() {
            Some(a) => a.iter().filter_map(Value::as_str).collect(),
            None => self.skills.iter().map(String::as_str).collect(),
        };
        let pinned = |name: &str| {
            run["activations"]
                .as_array()
                .and_then(|a| a.iter().find(|x| x["skill"] == name))
                .map(|x| x["revision"].clone())
        };
        let list: Vec<Value> = skills["skills"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|s| {
                let name = s["name"].as_str()?;
                (authorized.is_empty() || authorized.contains(&name)).then(|| {
                    let mut v = json!({
                        "name": name,
                        "description": s["description"],
                        "current_revision": s["current_revision"],
                    });
                    if let Some(p) = pinned(name) {
                        v["pinned_revision"] = p;
                    }
                    v
                })
            })
            .collect();
        Ok(json!({"skills": list}))
    }
}

/// The bearer token of an HTTP request.
fn bearer(parts: &axum::http::request::Parts) -> Option<&str> {
    parts
        .headers
        .get(axum::http::header::AUTHORIZATION)?
        .to_str()
        .ok()?
        .strip_prefix("Bearer ")
        .map(str::trim)
}

/// `{ws}` of `/v1/workspaces/{ws}/mcp`.
fn workspace_of(parts: &axum::http::request::Parts) -> Option<String> {
    let rest = parts.uri.path().strip_prefix("/v1/workspaces/")?;
    let ws = rest.split('/').next().filter(|w| !w.is_empty())?;
    Some(ws.to_string())
}

/// The values of `?{key}=…` (repeatable) of the endpoint's URL: `skill` (the authorized set
/// of the session's run, as `--skill` over stdio) and `ttl_seconds` (its lease and how long
/// the session may idle, as `--ttl-seconds`).
fn query_values(parts: &axum::http::request::Parts, key: &str) -> Vec<String> {
    parts
        .uri
        .query()
        .unwrap_or_default()
        .split('&')
        .filter_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
        .filter(|v| !v.is_empty())
        .map(str::to_string)
        .collect()
}

impl HttpOrigin {
    /// Opens a session from an HTTP request of the MCP endpoint, whose access check passed
    /// and left the caller in the request.
    async fn open(
        &self,
        parts: &axum::http::request::Parts,
        opening: Opening,
    ) -> Result<Opened, McpError> {
        let (Some(token), Some(workspace), Some(caller)) = (
            bearer(parts),
            workspace_of(parts),
            parts.extensions.get::<skillbox_server::auth::Caller>(),
        ) else {
            return Err(McpError::invalid_request(
                "the MCP endpoint needs a bearer token and /v1/workspaces/{ws}/mcp",
                None,
            ));
        };
        let role = match &caller.0 {
            skillbox_registry::Principal::Workspace { role, .. } => role.as_str(),
            // The server's admin token (a node token fails the access check).
            _ => "admin",
        };
        let who = Who {
            role: role.to_string(),
            box_available: self.box_available,
        };
        let client = Arc::new(Client {
            http: self.http.clone(),
            local: Some(self.local.clone()),
            workspace: workspace.clone(),
            conn: Conn {
                url: self.base_url.clone(),
                token: Some(token.to_string()),
                workspace: Some(workspace),
                json: true,
            },
        });
        let ttl_seconds = match query_values(parts, "ttl_seconds").last() {
            None => DEFAULT_TTL_SECONDS,
            Some(t) => t.parse().map_err(|_| {
                McpError::invalid_request(
                    format!("bad_request: ttl_seconds={t:?} is not a whole number of seconds"),
                    None,
                )
            })?,
        };
        Opened::open(
            client,
            who,
            query_values(parts, "skill"),
            ttl_seconds,
            opening,
        )
        .await
        .map_err(tool_setup_error)
    }
}

/// An error opening a session, as the protocol's error (the SPEC code first).
fn tool_setup_error(e: anyhow::Error) -> McpError {
    match e.downcast_ref::<ServerError>() {
        Some(se) => McpError::invalid_request(
            format!("{}: {}", se.body.error.code, se.body.error.message),
            serde_json::to_value(&se.body).ok(),
        ),
        None => McpError::internal_error(format!("{e:#}"), None),
    }
}

impl Session {
    fn new(opened: Option<Opened>, http: Option<Arc<HttpOrigin>>) -> Session {
        let cell = match opened {
            Some(o) => tokio::sync::OnceCell::new_with(Some(Arc::new(o))),
            None => tokio::sync::OnceCell::new(),
        };
        Session {
            opened: Arc::new(cell),
            http,
            tool_router: Session::tool_router(),
        }
    }

    /// This request's session: the opened one (an HTTP request must carry the token that
    /// opened it), or, on the stateless protocol, one opened for this request alone.
    async fn opened(&self, context: &RequestContext<RoleServer>) -> Result<Arc<Opened>, McpError> {
        let parts = context.extensions.get::<axum::http::request::Parts>();
        if let Some(o) = self.opened.get() {
            if let Some(p) = parts
                && bearer(p) != Some(o.token.as_str())
            {
                return Err(McpError::invalid_request(
                    "forbidden: this MCP session was opened with another token",
                    None,
                ));
            }
            return Ok(o.clone());
        }
        let (Some(origin), Some(parts)) = (&self.http, parts) else {
            return Err(McpError::internal_error("the session is not open", None));
        };
        self.opened
            .get_or_try_init(|| async { origin.open(parts, Opening::Request).await.map(Arc::new) })
            .await
            .cloned()
    }
}

/// The URI of a file of a pinned revision.
fn resource_uri(name: &str, revision: &Value, path: &str) -> String {
    format!("skill://{name}/{revision}/{path}")
}

impl Opened {
    /// Every file of every revision this session pinned, as resources.
    async fn pinned_resources(&self) -> anyhow::Result<Vec<Resource>> {
        let Some(run_id) = &self.run_id else {
            return Ok(vec![]);
        };
        let run: Value = self
            .client
            .get(self.client.ws_url(&format!("runs/{run_id}")))
            .await?;
        let mut resources = Vec::new();
        for pin in run["activations"].as_array().into_iter().flatten() {
            let (Some(name), revision) = (pin["skill"].as_str(), &pin["revision"]) else {
                continue;
            };
            let detail: Value = self
                .client
                .get(
                    self.client
                        .ws_url(&format!("skills/{name}/revisions/{revision}")),
                )
                .await?;
            for file in detail["manifest"].as_array().into_iter().flatten() {
                let path = file["path"].as_str().unwrap_or_default();
                resources.push(
                    Resource::new(resource_uri(name, revision, path), format!("{name}/{path}"))
                        .with_description(format!("{path} of {name} r{revision} (pinned)"))
                        .with_size(file["size"].as_u64().unwrap_or(0)),
                );
            }
        }
        Ok(resources)
    }

    /// `skill://{name}/{revision}/{path}` of a revision this session pinned: its bytes.
    async fn read_pinned(&self, uri: &str) -> Result<ResourceContents, McpError> {
        let not_found = |why: String| McpError::resource_not_found(why, Some(json!({"uri": uri})));
        let rest = uri
            .strip_prefix("skill://")
            .ok_or_else(|| not_found("not a skill:// URI".into()))?;
        let mut parts = rest.splitn(3, '/');
        let (Some(name), Some(revision), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            return Err(not_found(
                "expected skill://{name}/{revision}/{path}".into(),
            ));
        };
        let run_id = self
            .run_id
            .as_deref()
            .ok_or_else(|| not_found("this session has no run: nothing is pinned".into()))?;
        let run: Value = self
            .client
            .get(self.client.ws_url(&format!("runs/{run_id}")))
            .await
            .map_err(|e| McpError::internal_error(format!("{e:#}"), None))?;
        let pinned = run["activations"]
            .as_array()
            .and_then(|a| a.iter().find(|p| p["skill"] == name))
            .map(|p| p["revision"].to_string());
        if pinned.as_deref() != Some(revision) {
            return Err(not_found(format!(
                "{name} r{revision} is not pinned in this session (pinned: {})",
                pinned.unwrap_or_else(|| "none".into())
            )));
        }
        let url = self
            .client
            .ws_url(&format!("runs/{run_id}/skills/{name}/files/{path}"));
        let bytes =
            self.client
                .bytes(url)
                .await
                .map_err(|e| match e.downcast_ref::<ServerError>() {
                    Some(se) => McpError::resource_not_found(
                        format!("{}: {}", se.body.error.code, se.body.error.message),
                        serde_json::to_value(&se.body).ok(),
                    ),
                    None => McpError::internal_error(format!("{e:#}"), None),
                })?;
        Ok(match String::from_utf8(bytes.to_vec()) {
            Ok(text) => ResourceContents::text(text, uri),
            Err(_) => {
                use base64::Engine;
                let blob = base64::engine::general_purpose::STANDARD.encode(&bytes);
                ResourceContents::blob(blob, uri).with_mime_type("application/octet-stream")
            }
        })
    }
}

fn server_config(instructions: String) -> ServerConfig {
    let capabilities = ServerCapabilities::builder()
        .enable_tools()
        .enable_resources()
        .enable_resources_list_changed()
        .build();
    ServerConfig::new(capabilities)
        .with_server_info(Implementation::new("skillbox", env!("CARGO_PKG_VERSION")))
        .with_instructions(instructions)
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for Session {
    fn get_info(&self) -> ServerConfig {
        server_config(
            self.opened
                .get()
                .map(|o| o.instructions.clone())
                .unwrap_or_default(),
        )
    }

    /// Over HTTP, `initialize` opens the session (its run, its index) from the request.
    async fn initialize(
        &self,
        request: InitializeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<InitializeResult, McpError> {
        if let (Some(origin), Some(parts), None) = (
            &self.http,
            context.extensions.get::<axum::http::request::Parts>(),
            self.opened.get(),
        ) {
            let mut opened = origin.open(parts, Opening::Session).await?;
            let announcer = tokio::spawn(announce_list_changes(
                opened.client.clone(),
                context.peer.clone(),
                latest_event(&opened.client)
                    .await
                    .map_err(tool_setup_error)?,
            ));
            opened.end = Some(SessionEnd {
                announcer: Mutex::new(Some(announcer.abort_handle())),
            });
            let opened = Arc::new(opened);
            if let Some(slot) = parts.extensions.get::<OpenedSlot>() {
                let _ = slot.0.set(Arc::downgrade(&opened));
            }
            // A concurrent initialize of the same session cannot happen: rmcp serves a
            // session's handshake once.
            let _ = self.opened.set(opened);
        }
        context.peer.set_peer_info(request.clone());
        self.negotiate_initialize(&request)
    }

    /// The stateless protocol's discovery: the index of the workspace's skills.
    async fn discover(
        &self,
        context: RequestContext<RoleServer>,
    ) -> Result<DiscoverResult, McpError> {
        let opened = self.opened(&context).await?;
        let instructions = match opened.run_id {
            Some(_) => opened.instructions.clone(),
            None => opened.index().await.map_err(tool_setup_error)?,
        };
        Ok(DiscoverResult::from_server_info(
            self.supported_protocol_versions().into_owned(),
            server_config(instructions),
        ))
    }

    /// A tool the session's role cannot use is not listed.
    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        let opened = self.opened(&context).await?;
        let tools = self
            .tool_router
            .list_all()
            .into_iter()
            .filter(|t| opened.tools.contains(&t.name.as_ref()))
            .collect();
        Ok(ListToolsResult::with_all_items(tools))
    }

    /// … nor answered.
    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let opened = self.opened(&context).await?;
        if !opened.tools.contains(&request.name.as_ref()) {
            return Err(McpError::invalid_params(
                format!(
                    "tool {} is not available to this session (its tools: {})",
                    request.name,
                    opened.tools.join(", ")
                ),
                None,
            ));
        }
        let call = ToolCallContext::new(self, request, context);
        self.tool_router.call(call).await
    }

    async fn list_resources(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, McpError> {
        let resources = self
            .opened(&context)
            .await?
            .pinned_resources()
            .await
            .map_err(|e| McpError::internal_error(format!("{e:#}"), None))?;
        Ok(ListResourcesResult::with_all_items(resources))
    }

    async fn list_resource_templates(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, McpError> {
        Ok(ListResourceTemplatesResult::with_all_items(vec![
            ResourceTemplate::new("skill://{name}/{revision}/{path}", "skill-file")
                .with_description("A file of a skill revision pinned in this session"),
        ]))
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, McpError> {
        let contents = self
            .opened(&context)
            .await?
            .read_pinned(&request.uri)
            .await?;
        Ok(ReadResourceResult::new(vec![contents]).into())
    }
}

/// Tells the client `notifications/resources/list_changed` whenever a skill's current revision
/// moves (the workspace's event log, followed from `after`); the session's pins do not move.
async fn announce_list_changes(client: Arc<Client>, peer: rmcp::Peer<RoleServer>, mut after: i64) {
    loop {
        if let Ok(mut feed) = client.events(after, true).await {
            while let Ok(Some(event)) = feed.next().await {
                after = event.seq;
                let moved = matches!(
                    event.kind.as_str(),
                    "skill.published" | "skill.current_moved" | "skill.deleted"
                );
                if moved && peer.notify_resource_list_changed().await.is_err() {
                    return; // the session is over
                }
            }
        }
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    }
}

/// The sequence number of the workspace's latest event (0 if none).
async fn latest_event(client: &Client) -> anyhow::Result<i64> {
    let mut feed = client.events(0, false).await?;
    let mut latest = 0;
    while let Some(event) = feed.next().await? {
        latest = event.seq;
    }
    Ok(latest)
}

/// `skillbox mcp`: serves one session on stdin/stdout until the client closes it.
pub(super) async fn serve(conn: Conn, a: McpArgs) -> anyhow::Result<ExitCode> {
    // Standard output is the protocol's: logs (`SKILLBOX_LOG`, default warnings) go to stderr.
    let filter = tracing_subscriber::EnvFilter::try_from_env("SKILLBOX_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(filter)
        .try_init();
    let mut client = Client::new(conn)?;
    let who = Who::asked(&mut client).await?;
    let client = Arc::new(client);
    let opened = Opened::open(
        client.clone(),
        who,
        a.skills,
        a.ttl_seconds,
        Opening::Session,
    )
    .await?;
    let run_id = opened.run_id.clone();
    let renew = run_id.clone().map(|run_id| {
        let client = client.clone();
        let every = std::time::Duration::from_secs((a.ttl_seconds / 3).max(1));
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                let url = client.ws_url(&format!("runs/{run_id}/heartbeat"));
                if let Err(e) = client.send(client.req(reqwest::Method::POST, url)).await {
                    tracing::warn!(error = %format!("{e:#}"), "renewing the session's run failed");
                }
            }
        })
    });
    let after = latest_event(&client).await?;
    let served = async {
        let service = Session::new(Some(opened), None)
            .serve(rmcp::transport::stdio())
            .await?;
        let announcer = tokio::spawn(announce_list_changes(
            client.clone(),
            service.peer().clone(),
            after,
        ));
        let waited = service.waiting().await;
        announcer.abort();
        waited?;
        anyhow::Ok(())
    }
    .await;
    if let Some(renew) = renew {
        renew.abort();
    }
    if let Some(run_id) = run_id {
        let url = client.ws_url(&format!("runs/{run_id}"));
        client
            .send(client.req(reqwest::Method::DELETE, url))
            .await?;
    }
    served?;
    Ok(ExitCode::SUCCESS)
}

/// The Streamable HTTP endpoint (mounted at `/v1/workspaces/{ws}/mcp` behind the route's
/// access check): rmcp's service, whose sessions' tools call this server's API — through
/// `local` (the server's router, in-process) once it is set, else at `base_url` — behind
/// [`endpoint`], which answers a session's `read_skill_file` calls itself and ends sessions
/// that idle past their run's lease.
pub fn http_service(
    base_url: String,
    local: LocalApi,
    box_available: bool,
) -> anyhow::Result<axum::Router> {
    use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
    let live = Arc::new(LiveSessions::default());
    let origin = Arc::new(HttpOrigin {
        base_url,
        http: reqwest::Client::builder().build()?,
        local,
        box_available,
    });
    // rmcp would end a session that it has not seen for its keep-alive, but it does not see
    // the calls `endpoint` answers: sessions idle out by `LiveSessions`, which sees them all.
    let mut sessions = LocalSessionManager::default();
    sessions.session_config.keep_alive = None;
    let sessions = Arc::new(sessions);
    tokio::spawn(end_idle_sessions(live.clone(), Arc::downgrade(&sessions)));
    // The endpoint is authenticated by bearer token, which a DNS-rebinding page cannot send:
    // any Host may reach it (a public deployment names its own).
    // No priming event before each answer: it exists to resume a broken stream from an event
    // store, which this server does not keep (a session's notifications are re-derived from
    // the workspace's event log), and it cost every tool call an extra SSE frame.
    let config = rmcp::transport::StreamableHttpServerConfig::default()
        .disable_allowed_hosts()
        .with_sse_retry(None);
    let front = Front {
        live,
        max_body: config.max_request_body_bytes,
    };
    let service = rmcp::transport::StreamableHttpService::new(
        move || Ok(Session::new(None, Some(origin.clone()))),
        sessions,
        config,
    );
    Ok(axum::Router::new()
        .fallback_service(service)
        .layer(axum::middleware::from_fn_with_state(front, endpoint)))
}

/// What [`endpoint`] keeps: the sessions, and rmcp's limit on a message (it reads a body
/// before rmcp does).
#[derive(Clone)]
struct Front {
    live: Arc<LiveSessions>,
    max_body: usize,
}

/// The HTTP sessions as the endpoint sees them: each one's handler state (once `initialize`
/// opened it) and when the client last sent anything.
#[derive(Default)]
struct LiveSessions(Mutex<std::collections::HashMap<String, LiveSession>>);

struct LiveSession {
    opened: Option<std::sync::Weak<Opened>>,
    last_active: std::time::Instant,
}

/// Put into an `initialize` request for its handler to say which session it opened.
#[derive(Clone, Default)]
struct OpenedSlot(Arc<std::sync::OnceLock<std::sync::Weak<Opened>>>);

impl LiveSessions {
    fn started(&self, id: String, opened: Option<std::sync::Weak<Opened>>) {
        if let Ok(mut all) = self.0.lock() {
            let last_active = std::time::Instant::now();
            all.insert(
                id,
                LiveSession {
                    opened,
                    last_active,
                },
            );
        }
    }

    /// The client sent something in session `id`: its open session, if any.
    fn touched(&self, id: &str) -> Option<Arc<Opened>> {
        let mut all = self.0.lock().ok()?;
        let session = all.get_mut(id)?;
        session.last_active = std::time::Instant::now();
        session.opened.as_ref()?.upgrade()
    }

    fn ended(&self, id: &str) {
        if let Ok(mut all) = self.0.lock() {
            all.remove(id);
        }
    }

    /// Forgets the sessions idle for their run's lease (the session's end finishes its run),
    /// and those whose handler is gone; returns their ids.
    fn idle(&self) -> Vec<String> {
        let Ok(mut all) = self.0.lock() else {
            return vec![];
        };
        let now = std::time::Instant::now();
        let mut idle = vec![];
        all.retain(|id, s| {
            let ttl = match &s.opened {
                None => DEFAULT_TTL_SECONDS,
                Some(o) => match o.upgrade() {
                    Some(o) => o.ttl_seconds,
                    None => 0,
                },
            };
            let keep = now.duration_since(s.last_active) < std::time::Duration::from_secs(ttl);
            if !keep {
                idle.push(id.clone());
            }
            keep
        });
        idle
    }
}

/// Ends the sessions idle past their run's lease, until the endpoint is gone. Activity renews
/// a lease once less than half of it is left, so when a session has been idle a whole lease
/// its run's lease has lapsed too.
async fn end_idle_sessions(
    live: Arc<LiveSessions>,
    sessions: std::sync::Weak<
        rmcp::transport::streamable_http_server::session::local::LocalSessionManager,
    >,
) {
    use rmcp::transport::streamable_http_server::session::SessionManager;
    loop {
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        let Some(sessions) = sessions.upgrade() else {
            return;
        };
        for id in live.idle() {
            if let Err(e) = sessions.close_session(&id.clone().into()).await {
                tracing::warn!(session = %id, error = %e, "ending an idle MCP session failed");
            }
        }
    }
}

/// In front of rmcp: registers the sessions `initialize` opens, notes every request of a
/// session as activity, answers `DELETE` with `204 No Content` (rmcp answers `202`, which the
/// official Python SDK logs as a failed termination although the session ended), and answers
/// a session's `tools/call read_skill_file` itself, as JSON (see [`read_directly`]).
async fn endpoint(
    axum::extract::State(Front { live, max_body }): axum::extract::State<Front>,
    mut request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use rmcp::transport::common::http_header::HEADER_SESSION_ID;
    let Some(id) = request
        .headers()
        .get(HEADER_SESSION_ID)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
    else {
        let slot = OpenedSlot::default();
        request.extensions_mut().insert(slot.clone());
        let response = next.run(request).await;
        if let Some(id) = response
            .headers()
            .get(HEADER_SESSION_ID)
            .and_then(|v| v.to_str().ok())
        {
            live.started(id.to_string(), slot.0.get().cloned());
        }
        return response;
    };
    match (request.method().clone(), live.touched(&id)) {
        (axum::http::Method::DELETE, _) => {
            live.ended(&id);
            let response = next.run(request).await;
            if response.status() == axum::http::StatusCode::ACCEPTED {
                return axum::http::StatusCode::NO_CONTENT.into_response();
            }
            response
        }
        (axum::http::Method::POST, Some(opened)) => {
            let (parts, body) = request.into_parts();
            let Ok(body) = axum::body::to_bytes(body, max_body).await else {
                return (
                    axum::http::StatusCode::PAYLOAD_TOO_LARGE,
                    format!("Payload Too Large: an MCP message is at most {max_body} bytes"),
                )
                    .into_response();
            };
            if let Some(answer) = read_directly(&opened, &parts, &body).await {
                return answer;
            }
            next.run(axum::extract::Request::from_parts(parts, body.into()))
                .await
        }
        _ => next.run(request).await,
    }
}

/// A session's `tools/call read_skill_file`, answered without rmcp's session machinery (its
/// worker task, its answer channel, an SSE stream per answer): the agent's hot path. The tool
/// runs as rmcp would run it ([`Opened::read_file`]) and its result is the same message, as
/// one JSON answer (which Streamable HTTP lets a server give any request). `None` — rmcp
/// answers — for anything else, including every request rmcp would refuse or answer with an
/// error: another token than the session's, an unknown protocol version, a tool the session
/// lacks, arguments that do not fit.
async fn read_directly(
    opened: &Opened,
    parts: &axum::http::request::Parts,
    body: &[u8],
) -> Option<axum::response::Response> {
    let header = |name: &str| parts.headers.get(name).and_then(|v| v.to_str().ok());
    let accepts_json = header("accept").is_some_and(|a| a.contains("application/json"));
    let known_version = header("mcp-protocol-version").is_none_or(|v| {
        rmcp::model::ProtocolVersion::KNOWN_VERSIONS
            .iter()
            .any(|k| k.as_str() == v)
    });
    let standard_headers = header("mcp-method").is_some() || header("mcp-name").is_some();
    if !accepts_json
        || !known_version
        || standard_headers
        || bearer(parts) != Some(opened.token.as_str())
        || !opened.tools.contains(&"read_skill_file")
    {
        return None;
    }
    let call: DirectRead = serde_json::from_slice(body).ok()?;
    if call.method != "tools/call"
        || call.params.name != "read_skill_file"
        || call.params.input_responses.is_some()
        || call.params.request_state.is_some()
    {
        return None;
    }
    let message = match opened.read_file_json(call.params.arguments).await {
        Ok(structured) => tool_result_message(&call.id, &structured),
        Err(e) => {
            let mut result = ServerResult::CallToolResult(answer(Err(e)).ok()?);
            // As rmcp answers a peer of a revision before 2026-07-28 (every session's).
            result.strip_result_type_for_legacy_peer();
            serde_json::to_vec(&ServerJsonRpcMessage::response(result, call.id)).ok()?
        }
    };
    Some(
        (
            [(axum::http::header::CONTENT_TYPE, "application/json")],
            message,
        )
            .into_response(),
    )
}

/// The one request [`read_directly`] answers: `tools/call` of `read_skill_file` (any other
/// message does not parse, or is checked after).
#[derive(serde::Deserialize)]
struct DirectRead {
    #[allow(dead_code)] // parsed to refuse a message that is not JSON-RPC 2.0
    jsonrpc: rmcp::model::JsonRpcVersion2_0,
    id: rmcp::model::RequestId,
    method: String,
    params: DirectReadParams,
}

#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct DirectReadParams {
    name: String,
    arguments: ReadSkillFile,
    input_responses: Option<serde::de::IgnoredAny>,
    request_state: Option<serde::de::IgnoredAny>,
}

/// The answer to request `id` whose tool succeeded with `structured` (JSON text): the message
/// rmcp sends for `CallToolResult::structured` to a peer before 2026-07-28 — the structured
/// content, and the same as JSON text for clients without it — written straight from the
/// text, so the file's bytes are escaped once for the text block and copied once as they are.
fn tool_result_message(id: &rmcp::model::RequestId, structured: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(structured.len() * 2 + 128);
    out.extend_from_slice(br#"{"jsonrpc":"2.0","id":"#);
    // Neither can fail: a request id and a string always serialize.
    let _ = serde_json::to_writer(&mut out, id);
    out.extend_from_slice(br#","result":{"content":[{"type":"text","text":"#);
    let _ = serde_json::to_writer(&mut out, structured);
    out.extend_from_slice(br#"}],"structuredContent":"#);
    out.extend_from_slice(structured.as_bytes());
    out.extend_from_slice(br#","isError":false}}"#);
    out
}

/// The `<available_skills>` index of the workspace's skills (those named in `only`, if any),
/// for a session without a run: each skill's name and description, escaped.
fn index_of(skills: &Value, only: &[String]) -> String {
    let escape = |s: &str| {
        s.replace('&', "&amp;")
            .replace('<', "&lt;")
            .replace('>', "&gt;")
    };
    let entries: Vec<String> = skills["skills"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|s| {
            let name = s["name"].as_str()?;
            (only.is_empty() || only.iter().any(|o| o == name)).then(|| {
                format!(
                    "<skill>\n<name>{}</name>\n<description>{}</description>\n</skill>",
                    escape(name),
                    escape(s["description"].as_str().unwrap_or_default())
                )
            })
        })
        .collect();
    if entries.is_empty() {
        return String::new();
    }
    format!(
        "<available_skills>\n{}\n</available_skills>",
        entries.join("\n")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The read fast path's answer is the message rmcp sends for the same result: a client
    /// cannot tell which answered.
    #[test]
    fn a_direct_answer_is_the_message_rmcp_would_send() {
        let structured = serde_json::to_string(&FileRead {
            name: "hello",
            path: "notes/\"quoted\".md",
            text: Some("line one\nline \"two\" \\ \u{1F600} \u{0007}\n"),
            blob: None,
            run_id: None,
        })
        .unwrap();
        for id in [
            rmcp::model::RequestId::Number(42),
            rmcp::model::RequestId::String("call-7".into()),
        ] {
            let direct: Value =
                serde_json::from_slice(&tool_result_message(&id, &structured)).unwrap();
            let value: Value = serde_json::from_str(&structured).unwrap();
            let mut result = ServerResult::CallToolResult(CallToolResult::structured(value));
            result.strip_result_type_for_legacy_peer();
            let by_rmcp = serde_json::to_value(ServerJsonRpcMessage::response(result, id)).unwrap();
            assert_eq!(direct, by_rmcp);
        }
    }

    /// Only a well-formed `tools/call` of `read_skill_file` is taken off rmcp's hands.
    #[test]
    fn only_a_read_call_parses_as_one() {
        let read = json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
            "params": {"name": "read_skill_file", "arguments": {"name": "a", "path": "SKILL.md"},
                       "_meta": {"progressToken": 1}}});
        let call: DirectRead = serde_json::from_value(read.clone()).unwrap();
        assert_eq!(
            (call.method.as_str(), call.params.arguments.path.as_str()),
            ("tools/call", "SKILL.md")
        );
        let mut wrong_version = read.clone();
        wrong_version["jsonrpc"] = json!("1.0");
        let mut no_path = read.clone();
        no_path["params"]["arguments"] = json!({"name": "a"});
        let notification = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
        for other in [wrong_version, no_path, notification] {
            assert!(
                serde_json::from_value::<DirectRead>(other.clone()).is_err(),
                "{other}"
            );
        }
    }
}
