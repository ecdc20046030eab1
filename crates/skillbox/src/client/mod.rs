//! Client commands: talk to a skillbox server over HTTP (`--url`, `--token`, `--workspace`),
//! sending and reading the `skillbox_api` wire types the server answers with.
//!
//! - [`skills`]: publish, list, show, revisions, cat, pull, diff, rollback, delete, revoke;
//! - [`drafts`]: `draft …`; [`runs`]: `run …`; [`admin`]: events, gc, fsck, tokens.

mod admin;
mod drafts;
mod mcp;
mod runs;
mod skills;

pub use admin::TokenCommand;
pub use drafts::DraftCommand;
pub use mcp::{McpArgs, http_service as mcp_http_service};
pub use runs::RunCommand;

use anyhow::Context;
use serde::Serialize;
use serde::de::DeserializeOwned;
use skillbox_api::{ErrorBody, ErrorCode, ErrorEnvelope};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

#[derive(clap::Args, Clone)]
pub struct Conn {
    /// Server URL.
    #[arg(
        long,
        env = "SKILLBOX_URL",
        default_value = "http://127.0.0.1:7420",
        global = true
    )]
    pub url: String,
    /// Bearer token (a workspace token, or the admin token).
    #[arg(long, env = "SKILLBOX_TOKEN", global = true, hide_env_values = true)]
    pub token: Option<String>,
    /// Workspace (tenant). Default: a workspace token's own workspace (asked of the server,
    /// `GET /v1/whoami`), else `default`.
    #[arg(long, short = 'w', env = "SKILLBOX_WORKSPACE", global = true)]
    pub workspace: Option<String>,
    /// Machine-readable output.
    #[arg(long, global = true)]
    pub json: bool,
}

#[derive(clap::Subcommand)]
pub enum ClientCommand {
    /// Publish a package directory or archive as a new revision (compare-and-swap on --base).
    Publish {
        path: PathBuf,
        /// Skill name (default: the frontmatter name).
        #[arg(long)]
        skill: Option<String>,
        /// The revision this publish replaces (default: the current one; 0 creates the skill).
        #[arg(long)]
        base: Option<i64>,
    },
    /// List the workspace's skills.
    Skills,
    /// Show a skill and its current revision.
    Show { name: String },
    /// List a skill's revisions.
    Revisions { name: String },
    /// Print one file of a revision: NAME[@REV] PATH.
    Cat { spec: String, path: String },
    /// Download a revision into DIR and verify it against its digest: NAME[@REV] DIR.
    Pull { spec: String, dir: PathBuf },
    /// Compare two revisions: NAME@A NAME@B (per-file summary, text diffs).
    Diff { a: String, b: String },
    /// Move the current pointer back to REV (compare-and-swap against the current one).
    Rollback { name: String, revision: i64 },
    /// Soft-delete a skill (runs that pinned it keep working).
    Delete { name: String },
    /// Work with drafts.
    #[command(subcommand)]
    Draft(DraftCommand),
    /// Print the workspace's event log (SSE), from --after.
    Events {
        #[arg(long, default_value_t = 0)]
        after: i64,
        /// Keep streaming new events.
        #[arg(long)]
        follow: bool,
    },
    /// Runs: create, activate skills, read pinned files, finish.
    #[command(subcommand)]
    Run(RunCommand),
    /// Emergency revocation of one revision: NAME@REV --reason "...".
    Revoke {
        spec: String,
        #[arg(long)]
        reason: String,
    },
    /// Garbage collection (admin).
    Gc {
        /// Report what would be collected; change nothing.
        #[arg(long)]
        dry_run: bool,
        /// Grace period in seconds (default: the server's).
        #[arg(long)]
        grace: Option<u64>,
    },
    /// Tokens (admin).
    #[command(subcommand)]
    Token(TokenCommand),
    /// Serve MCP on stdin/stdout for one workspace: one session is one run (pinned skills,
    /// a sandbox), finished when the client closes the session.
    Mcp(McpArgs),
    /// Re-verify stored content against digests (admin).
    Fsck,
}

/// A refusal, shown with its code and details; exit status 1. Usually the server's; a package
/// found invalid before upload is refused here with the body the server would answer, so both
/// print and exit the same way.
#[derive(Debug)]
pub struct ServerError {
    pub status: u16,
    pub body: ErrorEnvelope,
}

impl ServerError {
    pub fn invalid_package(r: &skillbox_package::Rejection) -> Self {
        let mut details = serde_json::Map::new();
        details.insert("problems".into(), serde_json::json!(r.problems));
        details.insert("warnings".into(), serde_json::json!(r.warnings));
        ServerError {
            status: ErrorCode::InvalidPackage.status(),
            body: ErrorEnvelope {
                error: ErrorBody {
                    code: ErrorCode::InvalidPackage.as_str().into(),
                    message: format!("the package is invalid: {} problem(s)", r.problems.len()),
                    details,
                },
            },
        }
    }
}

impl std::fmt::Display for ServerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let e = &self.body.error;
        write!(f, "{} ({}): {}", e.code, self.status, e.message)?;
        let problems: Vec<skillbox_package::Problem> = e
            .details
            .get("problems")
            .and_then(|p| serde_json::from_value(p.clone()).ok())
            .unwrap_or_default();
        for p in problems {
            let loc = [p.path.as_deref(), p.field.as_deref()]
                .into_iter()
                .flatten()
                .collect::<Vec<_>>()
                .join(": ");
            let sep = if loc.is_empty() { "" } else { ": " };
            write!(f, "\n  {loc}{sep}{}", p.message)?;
        }
        Ok(())
    }
}

impl std::error::Error for ServerError {}

/// The HTTP client of one command: the connection settings and typed requests.
struct Client {
    http: reqwest::Client,
    conn: Conn,
    /// `conn`'s workspace, or the one [`Client::connect`] found for its token.
    workspace: String,
    /// Set inside the server (its MCP endpoint's sessions): requests go to the server's own
    /// router in-process — the same routes, access checks and limits, without a socket.
    local: Option<LocalApi>,
}

/// The server's router, for clients running inside it: set once the router is built, and
/// cleared when the server stops (the router holds the MCP endpoint, whose sessions hold this:
/// clearing it lets the server's state go).
#[derive(Clone, Default)]
pub struct LocalApi(Arc<std::sync::RwLock<Option<axum::Router>>>);

impl LocalApi {
    /// Routes this client's requests to `router` from now on.
    pub fn set(&self, router: axum::Router) {
        if let Ok(mut slot) = self.0.write() {
            *slot = Some(router);
        }
    }

    /// Forgets the router (the server stopped).
    pub fn clear(&self) {
        if let Ok(mut slot) = self.0.write() {
            *slot = None;
        }
    }

    /// The router, while set.
    fn router(&self) -> Option<axum::Router> {
        self.0.read().ok()?.clone()
    }
}

/// `request` answered by `router` in-process, as if it had come over HTTP. The answer's body
/// streams (an event stream stays open).
async fn answer_locally(
    router: axum::Router,
    request: reqwest::Request,
) -> anyhow::Result<reqwest::Response> {
    let request = axum::http::Request::<reqwest::Body>::try_from(request)?;
    let answer = routed(router, request.map(axum::body::Body::new)).await;
    let answer = answer.map(|b| reqwest::Body::wrap_stream(b.into_data_stream()));
    Ok(reqwest::Response::from(answer))
}

/// `request` answered by `router`, in-process.
async fn routed(
    router: axum::Router,
    request: axum::http::Request<axum::body::Body>,
) -> axum::response::Response {
    use tower::ServiceExt;
    match router.oneshot(request).await {
        Ok(answer) => answer,
        Err(never) => match never {},
    }
}

/// The workspace of a command run with neither `--workspace` nor a workspace token.
const DEFAULT_WORKSPACE: &str = "default";

impl Client {
    fn new(conn: Conn) -> anyhow::Result<Self> {
        Ok(Client {
            http: reqwest::Client::builder().build()?,
            workspace: conn
                .workspace
                .clone()
                .unwrap_or_else(|| DEFAULT_WORKSPACE.into()),
            conn,
            local: None,
        })
    }

    /// [`Self::new`], in the token's own workspace when none is named: a user holding a
    /// workspace token should not have to repeat its workspace. Whatever the server does
    /// not answer here (no token, an unknown one, the admin's, no server) leaves `default`,
    /// and the command itself reports what is wrong.
    async fn connect(conn: Conn) -> anyhow::Result<Self> {
        let mut client = Self::new(conn)?;
        if client.conn.workspace.is_none() && client.conn.token.is_some() {
            let who: anyhow::Result<skillbox_api::WhoAmI> =
                client.get(client.url("/v1/whoami")).await;
            if let Ok(who) = who {
                client.adopt_workspace(who.workspace.as_deref());
            }
        }
        Ok(client)
    }

    /// Takes the token's own workspace (as `GET /v1/whoami` answered it) when the command
    /// named none.
    fn adopt_workspace(&mut self, token_workspace: Option<&str>) {
        if let (None, Some(workspace)) = (&self.conn.workspace, token_workspace) {
            self.workspace = workspace.to_string();
        }
    }

    /// A URL under the workspace: `…/v1/workspaces/{ws}/{rest}`.
    fn ws_url(&self, rest: &str) -> String {
        format!(
            "{}/v1/workspaces/{}/{rest}",
            self.conn.url.trim_end_matches('/'),
            self.workspace
        )
    }

    /// A URL of the server: `…{rest}` (`rest` starts with `/`).
    fn url(&self, rest: &str) -> String {
        format!("{}{rest}", self.conn.url.trim_end_matches('/'))
    }

    fn req(&self, method: reqwest::Method, url: String) -> reqwest::RequestBuilder {
        let r = self.http.request(method, url);
        match &self.conn.token {
            Some(t) => r.bearer_auth(t),
            None => r,
        }
    }

    /// Sends a request; a non-2xx answer is a [`ServerError`] with the server's error body.
    async fn send(&self, rb: reqwest::RequestBuilder) -> anyhow::Result<reqwest::Response> {
        let resp = match self.local.as_ref().and_then(LocalApi::router) {
            Some(router) => answer_locally(router, rb.build()?).await?,
            None => rb.send().await.with_context(|| {
                format!(
                    "cannot reach the server at {} (is `skillbox serve` running?)",
                    self.conn.url
                )
            })?,
        };
        if resp.status().is_success() {
            return Ok(resp);
        }
        let status = resp.status().as_u16();
        Err(server_error(
            status,
            &resp.bytes().await.unwrap_or_default(),
        ))
    }

    /// Sends a request and reads its answer as `T`.
    async fn call<T: DeserializeOwned>(&self, rb: reqwest::RequestBuilder) -> anyhow::Result<T> {
        let resp = self.send(rb).await?;
        let url = resp.url().clone();
        resp.json::<T>()
            .await
            .with_context(|| format!("the server's answer to {url} is not what this client reads"))
    }

    /// Sends `body` as JSON and reads the answer as `T`.
    async fn send_json<B: Serialize, T: DeserializeOwned>(
        &self,
        method: reqwest::Method,
        url: String,
        body: &B,
    ) -> anyhow::Result<T> {
        self.call(self.req(method, url).json(body)).await
    }

    async fn get<T: DeserializeOwned>(&self, url: String) -> anyhow::Result<T> {
        self.call(self.req(reqwest::Method::GET, url)).await
    }

    /// The workspace's events after `after`; with `follow`, new ones as they come.
    async fn events(&self, after: i64, follow: bool) -> anyhow::Result<EventFeed> {
        let url = self.ws_url(&format!("events?after={after}&follow={follow}"));
        Ok(EventFeed {
            resp: self.send(self.req(reqwest::Method::GET, url)).await?,
            pending: Vec::new(),
        })
    }

    async fn bytes(&self, url: String) -> anyhow::Result<bytes::Bytes> {
        // In-process, without reqwest's request building and URL parsing: this is the MCP
        // endpoint's hot read. A URL that is not a valid URI as it stands (a space or a
        // non-ASCII character in a file's path) takes reqwest's way, which percent-encodes it.
        let uri = axum::http::Uri::try_from(url.as_str());
        if let (Some(router), Ok(uri)) = (self.local.as_ref().and_then(LocalApi::router), uri) {
            let mut request = axum::http::Request::get(uri);
            if let Some(t) = &self.conn.token {
                request = request.header(axum::http::header::AUTHORIZATION, format!("Bearer {t}"));
            }
            let answer = routed(router, request.body(axum::body::Body::empty())?).await;
            let status = answer.status();
            let body = axum::body::to_bytes(answer.into_body(), usize::MAX).await?;
            if status.is_success() {
                return Ok(body);
            }
            return Err(server_error(status.as_u16(), &body));
        }
        Ok(self
            .send(self.req(reqwest::Method::GET, url))
            .await?
            .bytes()
            .await?)
    }
}

/// A non-2xx answer as a [`ServerError`]: the server's error envelope, or what it was.
fn server_error(status: u16, body: &[u8]) -> anyhow::Error {
    let body = serde_json::from_slice::<ErrorEnvelope>(body).unwrap_or_else(|_| ErrorEnvelope {
        error: ErrorBody {
            code: "http".into(),
            message: "no error body".into(),
            details: Default::default(),
        },
    });
    ServerError { status, body }.into()
}

/// The workspace's event log as it arrives: Server-Sent Events frames read into events.
struct EventFeed {
    resp: reqwest::Response,
    pending: Vec<u8>,
}

impl EventFeed {
    /// The next event; `None` when the server ended the stream.
    async fn next(&mut self) -> anyhow::Result<Option<skillbox_api::Event>> {
        loop {
            if let Some(end) = self.pending.windows(2).position(|w| w == b"\n\n") {
                let frame: Vec<u8> = self.pending.drain(..end + 2).collect();
                let frame = String::from_utf8_lossy(&frame);
                if let Some(data) = frame
                    .lines()
                    .find_map(|l| l.strip_prefix("data:"))
                    .map(str::trim)
                {
                    return Ok(Some(serde_json::from_str(data)?));
                }
                continue;
            }
            match self.resp.chunk().await? {
                Some(chunk) => self.pending.extend_from_slice(&chunk),
                None => return Ok(None),
            }
        }
    }
}

/// `NAME[@REV]`: the name and the revision (`current` when absent).
fn split_spec(spec: &str) -> (&str, &str) {
    spec.split_once('@').unwrap_or((spec, "current"))
}

/// Prints `v` as one JSON line with `--json`, else `human()`.
fn print<T: Serialize>(json_mode: bool, v: &T, human: impl FnOnce() -> String) {
    if json_mode {
        outln!("{}", serde_json::to_string(v).unwrap_or_default());
    } else {
        outln!("{}", human());
    }
}

pub fn run(conn: Conn, cmd: ClientCommand) -> anyhow::Result<ExitCode> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(run_async(conn, cmd))
}

async fn run_async(conn: Conn, cmd: ClientCommand) -> anyhow::Result<ExitCode> {
    if let ClientCommand::Mcp(a) = cmd {
        return mcp::serve(conn, a).await;
    }
    let j = conn.json;
    let c = Client::connect(conn).await?;
    match cmd {
        ClientCommand::Publish { path, skill, base } => {
            skills::publish(&c, &path, skill, base).await?
        }
        ClientCommand::Skills => skills::list(&c, j).await?,
        ClientCommand::Show { name } => skills::show(&c, &name, j).await?,
        ClientCommand::Revisions { name } => skills::revisions(&c, &name, j).await?,
        ClientCommand::Cat { spec, path } => skills::cat(&c, &spec, &path).await?,
        ClientCommand::Pull { spec, dir } => skills::pull(&c, &spec, &dir, j).await?,
        ClientCommand::Diff { a, b } => skills::diff(&c, &a, &b, j).await?,
        ClientCommand::Rollback { name, revision } => {
            skills::rollback(&c, &name, revision, j).await?
        }
        ClientCommand::Delete { name } => skills::delete(&c, &name, j).await?,
        ClientCommand::Revoke { spec, reason } => skills::revoke(&c, &spec, reason, j).await?,
        ClientCommand::Draft(d) => drafts::run(&c, d, j).await?,
        ClientCommand::Run(r) => return runs::run(&c, r, j).await,
        ClientCommand::Events { after, follow } => admin::events(&c, after, follow, j).await?,
        ClientCommand::Gc { dry_run, grace } => admin::gc(&c, dry_run, grace, j).await?,
        ClientCommand::Token(TokenCommand::Create { role }) => {
            admin::create_token(&c, role, j).await?
        }
        ClientCommand::Fsck => return admin::fsck(&c, j).await,
        ClientCommand::Mcp(_) => unreachable!("served above"),
    }
    Ok(ExitCode::SUCCESS)
}
