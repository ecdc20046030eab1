//! `skillbox mcp`: an MCP server over stdio for one workspace (SPEC §9.1), on the official
//! Rust SDK (`rmcp`). The process is the session and the session is one run: created before
//! the server answers `initialize` (whose `instructions` carry the run's
//! `<available_skills>` index), its lease renewed while the process lives, finished when the
//! client closes stdin. Every tool speaks the HTTP API through the client's [`Client`], so the
//! pins, the checks and the errors are the server's own; an error is a tool error whose text
//! starts with the SPEC code and whose structured content is the error envelope.

use super::{Client, Conn, ServerError};
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{
    CallToolResult, ContentBlock, Implementation, ListResourceTemplatesResult, ListResourcesResult,
    PaginatedRequestParams, ReadResourceRequestParams, ReadResourceResponse, ReadResourceResult,
    Resource, ResourceContents, ResourceTemplate, ServerCapabilities, ServerConfig,
};
use rmcp::service::{RequestContext, RoleServer};
use rmcp::{
    ErrorData as McpError, ServerHandler, ServiceExt, schemars, tool, tool_handler, tool_router,
};
use serde_json::{Value, json};
use std::process::ExitCode;
use std::sync::Arc;

#[derive(clap::Args)]
pub struct McpArgs {
    /// Restrict the session's authorized skills to these (repeatable; default: all).
    #[arg(long = "skill")]
    pub skills: Vec<String>,
    /// The run's lease in seconds (renewed while the session lives).
    #[arg(long, default_value_t = 600)]
    pub ttl_seconds: u64,
}

#[derive(Debug, serde::Deserialize, schemars::JsonSchema)]
pub struct ActivateSkill {
    /// The skill's name.
    pub name: String,
    /// A revision to pin (default: the current one).
    pub revision: Option<i64>,
}

#[derive(Debug, serde::Deserialize, schemars::JsonSchema)]
pub struct ReadSkillFile {
    /// The activated skill's name.
    pub name: String,
    /// A path inside the package, such as `SKILL.md` or `scripts/run.sh`.
    pub path: String,
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
}

#[derive(Debug, serde::Deserialize, schemars::JsonSchema)]
pub struct CreateSkillDraft {
    /// The skill to draft a new revision of (from its current revision).
    pub name: String,
}

#[derive(Debug, serde::Deserialize, schemars::JsonSchema)]
pub struct PublishSkillDraft {
    /// The draft's id, as `create_skill_draft` answered.
    pub draft_id: String,
}

/// The MCP session: a run of the workspace.
#[derive(Clone)]
pub struct Session {
    client: Arc<Client>,
    /// The session's run: none for a token that may not run skills (reader, author), whose
    /// session only lists them.
    run_id: Option<String>,
    instructions: String,
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

#[tool_router]
impl Session {
    #[tool(
        description = "List the skills this session may use: name, description, current revision, and the pinned revision once activated."
    )]
    async fn list_skills(&self) -> Result<CallToolResult, McpError> {
        answer(self.list().await)
    }

    #[tool(
        description = "Activate a skill: pins its revision for this session and returns its instructions (SKILL.md body), revision, digest, files and mount path."
    )]
    async fn activate_skill(
        &self,
        Parameters(a): Parameters<ActivateSkill>,
    ) -> Result<CallToolResult, McpError> {
        let mut body = json!({"skill": a.name});
        if let Some(r) = a.revision {
            body["revision"] = json!(r);
        }
        let url = self
            .client
            .ws_url(&format!("runs/{}/activations", self.run()?));
        answer(
            self.client
                .send_json::<_, Value>(reqwest::Method::POST, url, &body)
                .await
                .map(|mut v| {
                    v["run_id"] = json!(self.run_id);
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
    ) -> Result<CallToolResult, McpError> {
        let url = self.client.ws_url(&format!(
            "runs/{}/skills/{}/files/{}",
            self.run()?,
            r.name,
            r.path
        ));
        answer(
            self.client
                .bytes(url)
                .await
                .map(|b| match std::str::from_utf8(&b) {
                    Ok(text) => json!({"name": r.name, "path": r.path, "text": text}),
                    Err(_) => {
                        use base64::Engine;
                        let blob = base64::engine::general_purpose::STANDARD.encode(&b);
                        json!({"name": r.name, "path": r.path, "blob": blob})
                    }
                }),
        )
    }

    #[tool(
        description = "Run a command in this session's sandbox, which holds exactly the pinned revisions of the activated skills under /skills, read-only: exit_code, stdout, stderr."
    )]
    async fn run_command(
        &self,
        Parameters(c): Parameters<RunCommand>,
    ) -> Result<CallToolResult, McpError> {
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
        let url = self.client.ws_url(&format!("runs/{}/exec", self.run()?));
        answer(
            self.client
                .send_json::<_, Value>(reqwest::Method::POST, url, &body)
                .await,
        )
    }

    #[tool(
        description = "Create a draft of a new revision of a skill in this session's sandbox, at /workspace/skill-drafts/<draft_id>/: edit it with run_command, then publish_skill_draft."
    )]
    async fn create_skill_draft(
        &self,
        Parameters(d): Parameters<CreateSkillDraft>,
    ) -> Result<CallToolResult, McpError> {
        let url = self.client.ws_url(&format!("runs/{}/drafts", self.run()?));
        answer(
            self.client
                .send_json::<_, Value>(reqwest::Method::POST, url, &json!({"skill": d.name}))
                .await,
        )
    }

    #[tool(
        description = "Publish a draft as the skill's next revision (compare-and-swap on the draft's base revision)."
    )]
    async fn publish_skill_draft(
        &self,
        Parameters(p): Parameters<PublishSkillDraft>,
    ) -> Result<CallToolResult, McpError> {
        let url = self
            .client
            .ws_url(&format!("drafts/{}/publish", p.draft_id));
        answer(
            self.client
                .call::<Value>(self.client.req(reqwest::Method::POST, url))
                .await,
        )
    }
}

impl Session {
    /// The session's run id (the tools that need one are listed only when there is one).
    fn run(&self) -> Result<&str, McpError> {
        self.run_id
            .as_deref()
            .ok_or_else(|| McpError::invalid_request("this session has no run", None))
    }

    async fn list(&self) -> anyhow::Result<Value> {
        let skills: Value = self.client.get(self.client.ws_url("skills")).await?;
        let run: Value = match &self.run_id {
            Some(id) => {
                self.client
                    .get(self.client.ws_url(&format!("runs/{id}")))
                    .await?
            }
            None => json!({}),
        };
        let authorized: Vec<&str> = run["authorized_skills"]
            .as_array()
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
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

/// The URI of a file of a pinned revision.
fn resource_uri(name: &str, revision: &Value, path: &str) -> String {
    format!("skill://{name}/{revision}/{path}")
}

impl Session {
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
        let run_id = self.run()?;
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

#[tool_handler(router = self.tool_router)]
impl ServerHandler for Session {
    fn get_info(&self) -> ServerConfig {
        let capabilities = ServerCapabilities::builder()
            .enable_tools()
            .enable_resources()
            .enable_resources_list_changed()
            .build();
        ServerConfig::new(capabilities)
            .with_server_info(Implementation::new("skillbox", env!("CARGO_PKG_VERSION")))
            .with_instructions(self.instructions.clone())
    }

    async fn list_resources(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, McpError> {
        let resources = self
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
        _context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, McpError> {
        let contents = self.read_pinned(&request.uri).await?;
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
    let client = Arc::new(Client::new(conn)?);
    let who: Value = client.get(client.url("/v1/whoami")).await?;
    let mut body = json!({"ttl_seconds": a.ttl_seconds});
    if !a.skills.is_empty() {
        body["skills"] = json!(a.skills);
    }
    let role = who["role"].as_str().unwrap_or("");
    let runner = matches!(role, "runner" | "admin");
    let (run_id, instructions) = if runner {
        let run: Value = client
            .send_json(reqwest::Method::POST, client.ws_url("runs"), &body)
            .await?;
        let run_id = run["run_id"]
            .as_str()
            .ok_or_else(|| anyhow::anyhow!("the server created a run without an id: {run}"))?
            .to_string();
        let prompt: Value = client
            .get(client.ws_url(&format!("runs/{run_id}/prompt")))
            .await?;
        let index = prompt["prompt"].as_str().unwrap_or_default().to_string();
        (Some(run_id), index)
    } else {
        let skills: Value = client.get(client.ws_url("skills")).await?;
        (None, index_of(&skills, &a.skills))
    };
    // A tool the token's role cannot use is not listed; nor is run_command without a box.
    let mut tool_router = Session::tool_router();
    if !runner {
        for name in ["activate_skill", "read_skill_file"] {
            tool_router.remove_route(name);
        }
    }
    if !(runner && who["box_available"].as_bool() == Some(true)) {
        // Run drafts live in the session's sandbox: they need a box too.
        for name in ["run_command", "create_skill_draft", "publish_skill_draft"] {
            tool_router.remove_route(name);
        }
    }
    let session = Session {
        client: client.clone(),
        run_id: run_id.clone(),
        instructions,
        tool_router,
    };
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
        let service = session.serve(rmcp::transport::stdio()).await?;
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
