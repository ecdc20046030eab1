//! The HTTP surface of an execution node (`skillbox node`, SPEC §7.3): what Core calls. Every
//! route but `/healthz` demands the secret Core handed out at the node's latest registration,
//! so the node accepts requests from Core only.
//!
//! `POST /v1/node/exec` runs one execution of a run placed here: every package is fetched from
//! Core by digest (the deterministic archive), extracted into fresh staging, its manifest
//! recomputed and compared with the digest Core named, made read-only and renamed into the
//! node's tree cache only then; the box (always in copy mode on a node) copies and verifies it
//! again into the sandbox before anything runs. A tree found in the cache after a restart is
//! re-verified before its first use. (Fault tests arm `<data-dir>/staging/FAILPOINT` with
//! `truncate` or `flip` to corrupt the next transfer.)

use crate::error::{ApiError, ApiResult};
use crate::extract::ApiJson;
use axum::extract::{Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use skillbox_api::{ErrorCode, Health, NodeExec, NodeRevoke};
use skillbox_box::failpoint::Failpoint;
use skillbox_package::intake::verify_tree;
use skillbox_package::{Digest, Limits, Manifest};
use skillbox_registry::auth::constant_time_eq;
use std::sync::{Arc, RwLock};

/// What a node knows of itself.
#[derive(Debug, Default)]
pub struct NodeIdentity {
    /// Core's id for this node ("" until the first registration).
    pub id: String,
    /// Core's current secret ("" until the first registration: nothing is accepted).
    pub secret: String,
}

pub type SharedIdentity = Arc<RwLock<NodeIdentity>>;

/// `GET /v1/node` (Core only): the node's id, so Core can check it reached the node it meant.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct NodeInfo {
    pub id: String,
    pub version: String,
}

/// Core as the node calls it: its URL and the node token.
#[derive(Debug, Clone)]
pub struct CoreLink {
    pub url: String,
    pub token: String,
    pub http: reqwest::Client,
}

/// Everything the node's handlers use.
#[derive(Clone)]
pub struct NodeState {
    pub identity: SharedIdentity,
    pub runtime: Arc<skillbox_box::BoxRuntime>,
    pub core: CoreLink,
    pub layout: skillbox_registry::DataDir,
    /// Trees verified since this process started, with their files' stamps then (a tree left
    /// by an earlier one is checked again before its first use).
    verified: Arc<std::sync::Mutex<std::collections::HashMap<Digest, VerifiedTree>>>,
    /// Trees fetched ahead of use and not used yet.
    prefetched: Arc<std::sync::Mutex<std::collections::HashSet<Digest>>>,
    /// One preparation of a digest at a time: an execution and a prefetch of the same
    /// package (or two executions) share one download.
    preparing:
        Arc<std::sync::Mutex<std::collections::HashMap<Digest, Arc<tokio::sync::Mutex<()>>>>>,
    pub stats: Arc<NodeStats>,
}

/// A tree as it was verified: its manifest, and each file's inode, size and change time.
/// Writing a file, changing its mode or replacing it changes its stamp (the change time cannot
/// be set back), so a tree whose stamps still match is the tree that was verified; one that
/// does not is verified again in full.
#[derive(Clone)]
struct VerifiedTree {
    manifest: Arc<Manifest>,
    stamps: Arc<Vec<FileStamp>>,
}

#[derive(Debug, PartialEq, Eq)]
struct FileStamp {
    ino: u64,
    size: u64,
    ctime: i64,
    ctime_nsec: i64,
}

/// The stamps of the manifest's files under `tree`.
fn stamps(tree: &std::path::Path, manifest: &Manifest) -> std::io::Result<Vec<FileStamp>> {
    use std::os::unix::fs::MetadataExt;
    manifest
        .entries()
        .iter()
        .map(|e| {
            let md = std::fs::symlink_metadata(tree.join(&e.path))?;
            Ok(FileStamp {
                ino: md.ino(),
                size: md.size(),
                ctime: md.ctime(),
                ctime_nsec: md.ctime_nsec(),
            })
        })
        .collect()
}

/// The node's counters, at `GET /metrics`.
#[derive(Debug, Default)]
pub struct NodeStats {
    pub executions: std::sync::atomic::AtomicU64,
    /// Packages downloaded from Core and verified (for an execution or ahead of use).
    pub fetches: std::sync::atomic::AtomicU64,
    /// Transfers that failed verification or were cut: never used.
    pub fetch_failures: std::sync::atomic::AtomicU64,
    /// Packages fetched ahead of use because a skill's current revision moved.
    pub prefetched: std::sync::atomic::AtomicU64,
    /// Executions whose package was already there because it was prefetched.
    pub prefetch_hits: std::sync::atomic::AtomicU64,
}

impl NodeStats {
    fn bump(counter: &std::sync::atomic::AtomicU64) {
        counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// Prometheus text exposition.
    pub fn render(&self) -> String {
        use std::sync::atomic::Ordering::Relaxed;
        let mut out = String::new();
        for (name, help, value) in [
            (
                "skillbox_node_executions_total",
                "Executions run on this node.",
                &self.executions,
            ),
            (
                "skillbox_node_package_fetches_total",
                "Packages downloaded from Core and verified.",
                &self.fetches,
            ),
            (
                "skillbox_node_package_fetch_failures_total",
                "Package transfers cut short or failing verification (never used).",
                &self.fetch_failures,
            ),
            (
                "skillbox_node_prefetched_total",
                "Packages fetched ahead of use after a skill's current revision moved.",
                &self.prefetched,
            ),
            (
                "skillbox_node_prefetch_hits_total",
                "Executions that found their package prefetched.",
                &self.prefetch_hits,
            ),
        ] {
            out.push_str(&format!(
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {}\n",
                value.load(Relaxed)
            ));
        }
        out
    }
}

impl NodeState {
    pub fn new(
        identity: SharedIdentity,
        runtime: Arc<skillbox_box::BoxRuntime>,
        core: CoreLink,
        layout: skillbox_registry::DataDir,
    ) -> std::io::Result<Self> {
        std::fs::create_dir_all(layout.trees())?;
        std::fs::create_dir_all(layout.staging())?;
        Ok(NodeState {
            identity,
            runtime,
            core,
            layout,
            verified: Default::default(),
            prefetched: Default::default(),
            preparing: Default::default(),
            stats: Default::default(),
        })
    }

    /// The verified tree of `digest` for an execution (counting a prefetch hit).
    async fn package_for_exec(
        &self,
        digest: &Digest,
    ) -> ApiResult<(std::path::PathBuf, Arc<Manifest>)> {
        let (tree, manifest, _) = self.package(digest).await?;
        if self.prefetched.lock().is_ok_and(|mut p| p.remove(digest)) {
            NodeStats::bump(&self.stats.prefetch_hits);
        }
        Ok((tree, manifest))
    }

    /// Fetches and verifies `digest` ahead of use, unless the node has it already. A tree is
    /// only ever added: pinned revisions' trees are never touched.
    async fn prefetch(&self, digest: &Digest) -> ApiResult<()> {
        let (_, _, fetched) = self.package(digest).await?;
        if fetched {
            if let Ok(mut p) = self.prefetched.lock() {
                p.insert(*digest);
            }
            NodeStats::bump(&self.stats.prefetched);
        }
        Ok(())
    }

    /// The verified tree of `digest` and its manifest: from this node's cache, else fetched
    /// from Core and verified.
    async fn package(
        &self,
        digest: &Digest,
    ) -> ApiResult<(std::path::PathBuf, Arc<Manifest>, bool)> {
        let gate = self
            .preparing
            .lock()
            .map_err(|_| ApiError::internal("node preparation lock poisoned"))?
            .entry(*digest)
            .or_default()
            .clone();
        let prepared = {
            let _one_at_a_time = gate.lock().await;
            self.package_alone(digest).await
        };
        drop(gate);
        if let Ok(mut preparing) = self.preparing.lock()
            && preparing
                .get(digest)
                .is_some_and(|g| Arc::strong_count(g) == 1)
        {
            preparing.remove(digest);
        }
        prepared
    }

    /// [`NodeState::package`] while no other task prepares `digest`; whether it downloaded.
    async fn package_alone(
        &self,
        digest: &Digest,
    ) -> ApiResult<(std::path::PathBuf, Arc<Manifest>, bool)> {
        let tree = self.layout.trees().join(digest.0.to_hex());
        if tree.is_dir() {
            // Checked before every use (the box's prepared packages are links to these files):
            // unchanged since verified, else verified again in full. One left by an earlier
            // process has its manifest recomputed.
            let known = self
                .verified
                .lock()
                .ok()
                .and_then(|v| v.get(digest).cloned());
            if let Some(k) = &known
                && stamps(&tree, &k.manifest).is_ok_and(|now| now == *k.stamps)
            {
                return Ok((tree, k.manifest.clone(), false));
            }
            let (t, d, m) = (tree.clone(), *digest, known.map(|k| k.manifest));
            // The stamps are taken before the content is hashed: a change while it is hashed
            // moves them, and the next use verifies again.
            let checked = tokio::task::spawn_blocking(move || {
                let m = match m {
                    Some(m) => m,
                    None => Arc::new(recompute(&t, &d)?),
                };
                let before = stamps(&t, &m).map_err(|e| e.to_string())?;
                verify_tree(&t, &m)?;
                Ok::<_, String>((m, before))
            })
            .await
            .map_err(|e| ApiError::internal(e.to_string()))?;
            match checked {
                Ok((m, before)) => {
                    return Ok((tree, self.remember(*digest, m, before), false));
                }
                Err(why) => {
                    tracing::warn!(%digest, why, "a prepared tree does not verify: fetched afresh");
                    if let Ok(mut v) = self.verified.lock() {
                        v.remove(digest);
                    }
                    skillbox_package::staging::remove_tree(&tree)
                        .map_err(|e| ApiError::internal(e.to_string()))?;
                }
            }
        }
        match self.fetch(digest, &tree).await {
            Ok((manifest, built)) => {
                NodeStats::bump(&self.stats.fetches);
                let manifest = self.remember(*digest, Arc::new(manifest), built);
                Ok((tree, manifest, true))
            }
            Err(e) => {
                NodeStats::bump(&self.stats.fetch_failures);
                Err(e)
            }
        }
    }

    /// Downloads `digest` from Core and builds its verified tree at `tree`: its manifest and
    /// its files' stamps.
    async fn fetch(
        &self,
        digest: &Digest,
        tree: &std::path::Path,
    ) -> ApiResult<(Manifest, Vec<FileStamp>)> {
        let url = format!("{}/v1/nodes/archives/{digest}", self.core.url);
        let unavailable = |why: String| {
            ApiError::new(
                ErrorCode::BoxUnavailable,
                format!("the node cannot fetch package {digest} from Core: {why}"),
            )
        };
        let answer = self
            .core
            .http
            .get(&url)
            .bearer_auth(&self.core.token)
            .send()
            .await
            .map_err(|e| unavailable(e.to_string()))?;
        if !answer.status().is_success() {
            return Err(unavailable(format!("Core answered {}", answer.status())));
        }
        // Extracted as it arrives: the download and the writing overlap.
        let (chunks, reader) = ChunkReader::channel();
        let (staging_root, d, dest) = (self.layout.staging(), *digest, tree.to_path_buf());
        let builder =
            tokio::task::spawn_blocking(move || build_tree(&staging_root, reader, &d, &dest));
        let cut = feed(
            answer,
            &chunks,
            Failpoint::in_dir(&self.layout.staging()).take(),
        )
        .await;
        drop(chunks);
        let built = builder
            .await
            .map_err(|e| ApiError::internal(e.to_string()))?;
        match (cut, built) {
            (Some(why), _) | (None, Err(why)) => Err(unavailable(why)),
            (None, Ok(built)) => Ok(built),
        }
    }

    /// Records the tree of `digest` as verified against `manifest`, its files as `stamps` say.
    fn remember(
        &self,
        digest: Digest,
        manifest: Arc<Manifest>,
        stamps: Vec<FileStamp>,
    ) -> Arc<Manifest> {
        if let Ok(mut v) = self.verified.lock() {
            v.insert(
                digest,
                VerifiedTree {
                    manifest: manifest.clone(),
                    stamps: Arc::new(stamps),
                },
            );
        }
        manifest
    }
}

/// Passes the archive's body on to the extraction as it arrives; the reason if the transfer
/// broke off. (Fault tests, the box's `failpoints` feature: `truncate` ends the transfer
/// halfway, `flip` changes a byte of the first file's content on the way; neither may land.)
async fn feed(
    mut answer: reqwest::Response,
    chunks: &tokio::sync::mpsc::Sender<std::io::Result<bytes::Bytes>>,
    fault: Option<String>,
) -> Option<String> {
    let halfway = answer.content_length().map(|l| l / 2);
    let mut sent = 0u64;
    loop {
        let mut chunk = match answer.chunk().await {
            Ok(Some(chunk)) => chunk,
            Ok(None) => return None,
            Err(e) => {
                let why = e.to_string();
                let _ = chunks.send(Err(std::io::Error::other(why.clone()))).await;
                return Some(why);
            }
        };
        let len = chunk.len() as u64;
        match fault.as_deref() {
            Some("truncate") if halfway.is_some_and(|h| sent + len > h) => {
                let keep = halfway.unwrap_or(0).saturating_sub(sent) as usize;
                let _ = chunks.send(Ok(chunk.slice(..keep))).await;
                return None;
            }
            Some("flip") if (sent..sent + len).contains(&512) => {
                let mut flipped = chunk.to_vec();
                flipped[(512 - sent) as usize] ^= 0x01;
                chunk = flipped.into();
            }
            _ => {}
        }
        sent += len;
        if chunks.send(Ok(chunk)).await.is_err() {
            return None; // the extraction stopped: it says why
        }
    }
}

/// The archive's body as the blocking extraction reads it.
struct ChunkReader {
    chunks: tokio::sync::mpsc::Receiver<std::io::Result<bytes::Bytes>>,
    current: bytes::Bytes,
}

impl ChunkReader {
    fn channel() -> (
        tokio::sync::mpsc::Sender<std::io::Result<bytes::Bytes>>,
        ChunkReader,
    ) {
        let (tx, rx) = tokio::sync::mpsc::channel(64);
        (
            tx,
            ChunkReader {
                chunks: rx,
                current: bytes::Bytes::new(),
            },
        )
    }
}

impl std::io::Read for ChunkReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while self.current.is_empty() {
            match self.chunks.blocking_recv() {
                Some(Ok(chunk)) => self.current = chunk,
                Some(Err(e)) => return Err(e),
                None => return Ok(0),
            }
        }
        let n = buf.len().min(self.current.len());
        buf[..n].copy_from_slice(&self.current[..n]);
        self.current = self.current.slice(n..);
        Ok(n)
    }
}

/// The manifest of the tree at `tree`, if its digest is `digest`.
fn recompute(tree: &std::path::Path, digest: &Digest) -> Result<Manifest, String> {
    let intake = skillbox_package::intake::scan_dir_raw(tree, &Limits::unbounded())
        .map_err(|e| e.to_string())?;
    let manifest = Manifest::new(intake.files).map_err(|e| e.to_string())?;
    if manifest.digest() != *digest {
        return Err(format!("its digest is {}", manifest.digest()));
    }
    Ok(manifest)
}

/// Extracts `tar` into fresh staging, checks it is exactly `digest`, makes it read-only and
/// renames it to `dest` (a partial or corrupt transfer never lands): its manifest and its
/// files' stamps.
fn build_tree(
    staging_root: &std::path::Path,
    tar: impl std::io::Read,
    digest: &Digest,
    dest: &std::path::Path,
) -> Result<(Manifest, Vec<FileStamp>), String> {
    use skillbox_package::write::{DirWriteOptions, finish_tree};
    let staging =
        skillbox_package::StagingDir::new_in(staging_root, "fetch-").map_err(|e| e.to_string())?;
    let root = staging.path().join("t");
    std::fs::create_dir(&root).map_err(|e| e.to_string())?;
    let intake = skillbox_package::intake::extract_tar(tar, false, &root, &Limits::unbounded())
        .map_err(|e| e.to_string())?;
    if !intake.complete || !intake.problems.is_empty() {
        return Err("the archive is incomplete or malformed".into());
    }
    let manifest = Manifest::new(intake.files).map_err(|e| e.to_string())?;
    if manifest.digest() != *digest {
        return Err(format!(
            "the archive is {}, not the package asked for",
            manifest.digest()
        ));
    }
    finish_tree(
        &root,
        DirWriteOptions {
            read_only: true,
            sync: false,
        },
    )
    .map_err(|e| e.to_string())?;
    // Taken while the tree is still private: renaming it changes no file's stamp.
    let built = stamps(&root, &manifest).map_err(|e| e.to_string())?;
    match staging.commit(Some(std::path::Path::new("t")), dest) {
        Ok(()) => Ok((manifest, built)),
        // Another process put the same package there meanwhile: its stamps differ, so its
        // first use verifies it.
        Err(_) if dest.is_dir() => Ok((manifest, built)),
        Err(e) => Err(e.to_string()),
    }
}

/// Serves Core's calls on `listener` until `shutdown` resolves.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: NodeState,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, router(state))
        .with_graceful_shutdown(shutdown)
        .await
}

/// The node's router.
pub fn router(state: NodeState) -> Router {
    let from_core = Router::new()
        .route("/v1/node", get(info))
        .route("/v1/node/exec", axum::routing::post(exec))
        .route("/v1/node/revoke", axum::routing::post(revoke))
        .route(
            "/v1/node/sandboxes/{id}/workspace",
            axum::routing::put(import_workspace).get(export_workspace),
        )
        .route(
            "/v1/node/sandboxes/{id}/release",
            axum::routing::post(release),
        )
        // Only Core gets here; packages and workspace transfers are as large as its limits.
        .layer(axum::extract::DefaultBodyLimit::disable())
        .route_layer(axum::middleware::from_fn_with_state(
            state.identity.clone(),
            only_core,
        ));
    Router::new()
        .route(
            "/healthz",
            get(|| async {
                Json(Health {
                    status: "ok".into(),
                })
            }),
        )
        // Counters only, no tenant's data: open to the operator's scraper, as `/healthz` is.
        .route(
            "/metrics",
            get(|State(n): State<NodeState>| async move {
                (
                    [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
                    n.stats.render(),
                )
            }),
        )
        .merge(from_core)
        .with_state(state)
}

/// A sandbox id as Core sends it (a run id): it names directories here.
fn checked_sandbox_id(id: &str) -> ApiResult<&str> {
    if !id.is_empty()
        && id.len() <= 64
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    {
        Ok(id)
    } else {
        Err(ApiError::bad_request(format!("{id:?} is not a sandbox id")))
    }
}

/// The run's sandbox with no packages: for moving files in and out of its workspace.
fn workspace_sandbox(n: &NodeState, id: &str) -> skillbox_box::Sandbox {
    skillbox_box::Sandbox {
        id: id.to_string(),
        workspace_dir: Some(n.layout.run_workspace(id)),
        mounts: vec![],
        binds: vec![],
        environment_of: None,
        network: false,
    }
}

fn transfer_dir(headers: &axum::http::HeaderMap) -> ApiResult<String> {
    headers
        .get(crate::remote::DIR_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
        .ok_or_else(|| ApiError::bad_request("which workspace directory: x-skillbox-dir"))
}

/// Unpacks the body (a tar) into a new directory of the sandbox's workspace (a run draft).
async fn import_workspace(
    State(n): State<NodeState>,
    axum::extract::Path(id): axum::extract::Path<String>,
    headers: axum::http::HeaderMap,
    tar: axum::body::Bytes,
) -> ApiResult<axum::http::StatusCode> {
    let id = checked_sandbox_id(&id)?;
    let dir = transfer_dir(&headers)?;
    n.runtime
        .import_tar(&workspace_sandbox(&n, id), &dir, tar.to_vec())
        .await
        .map_err(crate::sandbox::box_error)?;
    Ok(axum::http::StatusCode::NO_CONTENT)
}

/// Packs a directory of the sandbox's workspace as a tar.
async fn export_workspace(
    State(n): State<NodeState>,
    axum::extract::Path(id): axum::extract::Path<String>,
    headers: axum::http::HeaderMap,
) -> ApiResult<Response> {
    let id = checked_sandbox_id(&id)?;
    let dir = transfer_dir(&headers)?;
    let cap = headers
        .get(crate::remote::CAP_HEADER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| ApiError::bad_request("how many bytes at most: x-skillbox-cap"))?;
    let tar = n
        .runtime
        .export_tar(&workspace_sandbox(&n, id), &dir, cap)
        .await
        .map_err(crate::sandbox::box_error)?;
    Ok(([(header::CONTENT_TYPE, "application/x-tar")], tar).into_response())
}

/// The run ended: its sandbox (workspace, prepared copies) goes, unless an execution is still
/// in progress in it.
async fn release(
    State(n): State<NodeState>,
    axum::extract::Path(id): axum::extract::Path<String>,
) -> ApiResult<Json<skillbox_api::SandboxReleased>> {
    let id = checked_sandbox_id(&id)?.to_string();
    let (runtime, dir) = (n.runtime.clone(), n.layout.run_workspace(&id));
    let released = tokio::task::spawn_blocking(move || runtime.release(&id, &dir))
        .await
        .map_err(|e| ApiError::internal(e.to_string()))?
        .map_err(crate::sandbox::box_error)?;
    Ok(Json(skillbox_api::SandboxReleased { released }))
}

/// One execution of a run placed on this node, as Core forwards it.
async fn exec(State(n): State<NodeState>, ApiJson(req): ApiJson<NodeExec>) -> ApiResult<Response> {
    checked_sandbox_id(&req.sandbox_id)?;
    let mut mounts = Vec::with_capacity(req.mounts.len());
    for m in &req.mounts {
        let digest: Digest = m
            .digest
            .parse()
            .map_err(|_| ApiError::bad_request(format!("{:?} is not a digest", m.digest)))?;
        let (tree, manifest) = n.package_for_exec(&digest).await?;
        mounts.push(skillbox_box::Mount {
            target: m.target.clone(),
            source: tree,
            manifest,
            digest,
        });
    }
    let program = match (req.argv, req.command) {
        (Some(argv), None) if !argv.is_empty() => skillbox_box::Program::Argv(argv),
        (None, Some(cmd)) => skillbox_box::Program::Shell(cmd),
        _ => return Err(ApiError::bad_request("give exactly one of argv or command")),
    };
    let sandbox = skillbox_box::Sandbox {
        mounts,
        environment_of: req.environment_of,
        ..workspace_sandbox(&n, &req.sandbox_id)
    };
    let box_req = skillbox_box::ExecRequest {
        program,
        cwd: req.cwd,
        env: req.env,
        stdin: req.stdin.map(String::into_bytes),
        timeout: std::time::Duration::from_millis(req.timeout_ms),
        output_cap: crate::routes::exec::OUTPUT_CAP,
        live: None,
    };
    NodeStats::bump(&n.stats.executions);
    let summary = crate::routes::exec::Summary {
        sandbox_id: req.sandbox_id,
        backend: n.runtime.backend.capabilities().backend.to_string(),
        node: None,
        packages: vec![],
    };
    Ok(
        crate::routes::exec::run_in_box(n.runtime.clone(), sandbox, box_req, summary, req.stream)
            .await,
    )
}

/// A revision was revoked: its executions here are killed, its copies removed.
async fn revoke(
    State(n): State<NodeState>,
    ApiJson(req): ApiJson<NodeRevoke>,
) -> ApiResult<Json<Health>> {
    let killed = n.runtime.executions.kill_mounting(&req.target);
    if let Err(e) = n.runtime.backend.discard(&req.target).await {
        tracing::warn!(target = %req.target, error = %e, "cannot remove prepared copies of a revoked revision");
    }
    if let Ok(digest) = req.digest.parse::<Digest>() {
        if let Ok(mut v) = n.verified.lock() {
            v.remove(&digest);
        }
        let tree = n.layout.trees().join(digest.0.to_hex());
        if let Err(e) = skillbox_package::staging::remove_tree(&tree) {
            tracing::warn!(%digest, error = %e, "cannot remove the tree of a revoked revision");
        }
    }
    tracing::warn!(target = %req.target, killed, "revision revoked");
    Ok(Json(Health {
        status: "ok".into(),
    }))
}

async fn info(State(n): State<NodeState>) -> ApiResult<Json<NodeInfo>> {
    let id = n
        .identity
        .read()
        .map_err(|_| ApiError::internal("node identity lock poisoned"))?
        .id
        .clone();
    Ok(Json(NodeInfo {
        id,
        version: env!("CARGO_PKG_VERSION").into(),
    }))
}

/// Lets through only requests bearing Core's current secret.
async fn only_core(State(identity): State<SharedIdentity>, req: Request, next: Next) -> Response {
    let presented = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("");
    let accepted = identity.read().is_ok_and(|id| {
        !id.secret.is_empty() && constant_time_eq(presented.as_bytes(), id.secret.as_bytes())
    });
    if !accepted {
        return ApiError::new(
            ErrorCode::Unauthorized,
            "this node accepts requests from its Core only",
        )
        .into_response();
    }
    next.run(req).await
}

/// Follows Core's prefetch stream for this node (`GET /v1/nodes/{id}/prefetch`) for as long as
/// the node runs, fetching and verifying each package it names that the node lacks. Reconnects
/// after Core restarts or the stream drops; a failed prefetch is only logged (the execution that
/// needs the package fetches it then).
pub async fn follow_prefetch(n: NodeState) {
    loop {
        let id = n.identity.read().map(|i| i.id.clone()).unwrap_or_default();
        if !id.is_empty()
            && let Err(e) = prefetch_stream(&n, &id).await
        {
            tracing::debug!(error = %e, "prefetch stream ended");
        }
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    }
}

async fn prefetch_stream(n: &NodeState, id: &str) -> Result<(), String> {
    let mut answer = n
        .core
        .http
        .get(format!("{}/v1/nodes/{id}/prefetch", n.core.url))
        .bearer_auth(&n.core.token)
        .send()
        .await
        .map_err(|e| e.to_string())?;
    if !answer.status().is_success() {
        return Err(format!("Core answered {}", answer.status()));
    }
    let mut pending = Vec::new();
    while let Some(chunk) = answer.chunk().await.map_err(|e| e.to_string())? {
        pending.extend_from_slice(&chunk);
        // SSE events end with a blank line; `data:` lines carry the set.
        while let Some(end) = pending.windows(2).position(|w| w == b"\n\n") {
            let frame: Vec<u8> = pending.drain(..end + 2).collect();
            let frame = String::from_utf8_lossy(&frame);
            for data in frame.lines().filter_map(|l| l.strip_prefix("data:")) {
                let Ok(set) = serde_json::from_str::<skillbox_api::PrefetchSet>(data.trim()) else {
                    continue;
                };
                for p in set.packages {
                    let Ok(digest) = p.digest.parse::<Digest>() else {
                        continue;
                    };
                    match n.prefetch(&digest).await {
                        Ok(()) => {
                            tracing::debug!(%digest, skill = %p.skill_id, revision = p.revision, "prefetched")
                        }
                        Err(e) => tracing::warn!(%digest, error = %e.message, "prefetch failed"),
                    }
                }
            }
        }
    }
    Ok(())
}
