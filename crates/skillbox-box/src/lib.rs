//! The box: the sandbox runtime. It knows packages (a digest and a read-only tree on the host)
//! and mounts — not skills, runs or workspaces; the server composes a sandbox's mount set
//! from a run's pins.
//!
//! Backends implement [`Backend`], driven identically by [`BoxRuntime`]: acquire a sandbox for
//! exactly the mount set, compare its prepared packages with the pins, prepare what is missing
//! or differs, execute, release. [`bwrap::Bwrap`] makes one bubblewrap process per execution
//! with read-only binds of exactly the mount set under `/skills`, a writable `/workspace`, a
//! read-only system, a private `/tmp`, every namespace unshared (network too unless allowed),
//! no capabilities, an unprivileged uid, rlimits, and a wall-clock timeout that kills the whole
//! sandbox. [`docker::Docker`] keeps a long-lived container per (run, mount set) on the local
//! engine. Both have a copy mode ([`prepare`] for bwrap) that copies and verifies packages
//! instead of binding them; [`deps`] builds dependency environments. A backend whose probe
//! fails is never used: there is no fallback to running on the host.

pub mod bwrap;
pub mod deps;
pub mod docker;
pub mod failpoint;
pub mod prepare;
pub mod workspace;

use skillbox_package::Digest;
use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// One read-only package in a sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    /// Path inside the sandbox, e.g. `/skills/<skill-id>/<revision>`.
    pub target: String,
    /// The verified, read-only tree on the host.
    pub source: PathBuf,
    pub digest: Digest,
    /// What the package must contain (copy mode verifies against it).
    pub manifest: Arc<skillbox_package::Manifest>,
}

/// What a [`Bind`] mounts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BindSource {
    /// A host path.
    Host(PathBuf),
    /// A named volume of the backend (backends that have them: Docker).
    Volume(String),
}

impl std::fmt::Display for BindSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BindSource::Host(p) => write!(f, "host:{}", p.display()),
            BindSource::Volume(v) => write!(f, "volume:{v}"),
        }
    }
}

/// Something mounted into a sandbox besides its packages: a dependency environment
/// (read-only), or the inputs and output of an environment build.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bind {
    pub source: BindSource,
    pub target: String,
    pub writable: bool,
}

/// What an execution runs in.
#[derive(Debug, Clone)]
pub struct Sandbox {
    /// Stable name of the sandbox (the server uses the run id): keys its prepared packages.
    pub id: String,
    /// Host directory bound writable at `/workspace`; outlives executions. `None` for the
    /// box's own work (probes, environment builds).
    pub workspace_dir: Option<PathBuf>,
    /// Exactly the packages of the run, nothing else.
    pub mounts: Vec<Mount>,
    /// Further binds; the runtime adds the dependency environment here.
    pub binds: Vec<Bind>,
    /// The mount target whose package's dependency environment (its `requirements.txt`) the
    /// execution activates, if any.
    pub environment_of: Option<String>,
    pub network: bool,
}

impl Sandbox {
    /// A sandbox for the box's own work (probes, environment builds): no workspace, no
    /// packages, no network — only `binds`.
    pub fn internal(id: impl Into<String>, binds: Vec<Bind>) -> Self {
        Sandbox {
            id: id.into(),
            workspace_dir: None,
            mounts: vec![],
            binds,
            environment_of: None,
            network: false,
        }
    }
}

#[derive(Debug, Clone)]
pub enum Program {
    Argv(Vec<String>),
    /// Run by `/bin/sh -c`.
    Shell(String),
}

#[derive(Debug, Clone)]
pub struct ExecRequest {
    pub program: Program,
    pub cwd: String,
    pub env: BTreeMap<String, String>,
    pub stdin: Option<Vec<u8>>,
    pub timeout: Duration,
    /// Bytes kept of each of stdout and stderr; the rest is read and dropped.
    pub output_cap: usize,
    /// Streamed execution: kept output is also sent here as it arrives.
    pub live: Option<OutputSink>,
}

/// `PATH` inside a sandbox unless the request sets one.
pub const DEFAULT_PATH: &str = "/usr/local/bin:/usr/bin:/bin";

impl ExecRequest {
    /// A box-internal shell command (probes, environment builds, workspace transfers): run in
    /// `/tmp`, 120 s, 64 KiB of each stream kept, no stdin. Callers adjust what differs.
    pub fn shell(script: &str, env: BTreeMap<String, String>) -> Self {
        ExecRequest {
            program: Program::Shell(script.into()),
            cwd: "/tmp".into(),
            env,
            stdin: None,
            timeout: Duration::from_secs(120),
            output_cap: 64 * 1024,
            live: None,
        }
    }

    /// The program as an argv, once the request is checked (absolute cwd, non-empty argv).
    pub fn command_line(&self) -> Result<Vec<String>, BoxError> {
        if !self.cwd.starts_with('/') {
            return Err(BoxError::BadRequest(format!(
                "cwd must be an absolute path inside the sandbox, not {:?}",
                self.cwd
            )));
        }
        match &self.program {
            Program::Argv(v) if v.is_empty() => Err(BoxError::BadRequest("argv is empty".into())),
            Program::Argv(v) => Ok(v.clone()),
            Program::Shell(c) => Ok(vec!["/bin/sh".into(), "-c".into(), c.clone()]),
        }
    }

    /// The environment the program sees: the request's, over the sandbox's defaults.
    pub fn environment(&self, workspace: bool) -> BTreeMap<String, String> {
        let mut env = self.env.clone();
        env.entry("PATH".into())
            .or_insert_with(|| DEFAULT_PATH.into());
        env.entry("HOME".into())
            .or_insert_with(|| if workspace { "/workspace" } else { "/tmp" }.into());
        env.entry("TMPDIR".into()).or_insert_with(|| "/tmp".into());
        env.entry("LANG".into()).or_insert_with(|| "C.UTF-8".into());
        env
    }
}

/// One output stream of an execution: keeps `cap` bytes (the rest is dropped and noted), and
/// forwards what it keeps to the live sink of a streamed execution.
pub(crate) struct Capped {
    pub kept: Vec<u8>,
    pub truncated: bool,
    cap: usize,
    live: Option<OutputSink>,
    kind: StreamKind,
}

impl Capped {
    pub fn new(cap: usize, live: Option<OutputSink>, kind: StreamKind) -> Self {
        Capped {
            kept: Vec::new(),
            truncated: false,
            cap,
            live,
            kind,
        }
    }

    pub fn push(&mut self, data: &[u8]) {
        let room = self.cap.saturating_sub(self.kept.len());
        let take = data.len().min(room);
        if take > 0
            && let Some(sink) = &self.live
        {
            let _ = sink.send((self.kind, data[..take].to_vec()));
        }
        self.kept.extend_from_slice(&data[..take]);
        self.truncated |= data.len() > room;
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StreamKind {
    Stdout,
    Stderr,
}

/// Where a streamed execution's output goes, chunk by chunk.
pub type OutputSink = tokio::sync::mpsc::UnboundedSender<(StreamKind, Vec<u8>)>;

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    Exited,
    Signaled,
    TimedOut,
    /// Killed because a package it mounts was revoked.
    Killed,
    /// The sandbox itself could not be set up; the program did not run.
    SandboxFailure,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct ExecResult {
    pub outcome: Outcome,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub timed_out: bool,
    #[serde(skip)]
    pub stdout: Vec<u8>,
    #[serde(skip)]
    pub stderr: Vec<u8>,
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
    pub duration_ms: u64,
}

impl ExecResult {
    /// What went wrong, for an error message: how it ended (exit code, signal, timeout,
    /// killed, or the sandbox failing) and the last lines it printed — never an empty reason.
    pub fn failure(&self) -> String {
        let how = match self.outcome {
            Outcome::TimedOut => format!("timed out after {} ms", self.duration_ms),
            Outcome::Killed => "killed (its package was revoked)".into(),
            Outcome::SandboxFailure => "the sandbox could not be set up".into(),
            Outcome::Exited | Outcome::Signaled => ended(self.exit_code, self.signal),
        };
        let text = if self.stderr.iter().any(|b| !b.is_ascii_whitespace()) {
            &self.stderr
        } else {
            &self.stdout
        };
        let text = String::from_utf8_lossy(text);
        let lines: Vec<&str> = text.trim().lines().collect();
        match lines.len() {
            0 => format!("{how} (no output)"),
            n => format!("{how}: {}", lines[n.saturating_sub(6)..].join(" | ")),
        }
    }
}

#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct Capabilities {
    pub backend: &'static str,
    /// Packages cannot be modified from inside the sandbox.
    pub immutable: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum BoxError {
    #[error("sandbox backend unavailable: {0}")]
    Unavailable(String),
    #[error("invalid execution request: {0}")]
    BadRequest(String),
    /// What the request names is not in the sandbox.
    #[error("{0}")]
    Missing(String),
    #[error("{0}")]
    TooLarge(String),
    /// A dependency environment could not be built (pip's reason is in the message).
    #[error("dependency environment: {0}")]
    Dependencies(String),
    /// A directory to export holds entries that are neither files nor directories (sockets,
    /// which tar would silently skip): their paths, relative to it.
    #[error("not only regular files and directories: {0:?}")]
    SpecialFiles(Vec<String>),
    #[error("sandbox I/O: {0}")]
    Io(#[from] std::io::Error),
}

pub type BoxFuture<'a, T> =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<T, BoxError>> + Send + 'a>>;
pub type ExecFuture<'a> = BoxFuture<'a, ExecResult>;

/// A sandbox acquired for an execution: the mount set as the backend presents it (sources
/// resolved, e.g. to prepared copies) and the backend's handle to where it runs (a container
/// id; empty for bwrap, which makes a fresh sandbox per execution).
#[derive(Debug, Clone)]
pub struct Lease {
    pub sandbox: Sandbox,
    pub handle: String,
}

/// A sandbox backend. The runtime drives it the same way for every backend:
/// `acquire` → `prepared` → `prepare` what is missing or differs → `exec` → `release`.
pub trait Backend: Send + Sync {
    fn capabilities(&self) -> Capabilities;
    /// What the sandbox's system is (an image id; `host` for a backend that binds the host's
    /// system): part of every dependency environment's key.
    fn system_identity(&self) -> String;
    /// Prepares a host directory the box's own work writes to (an environment build).
    fn prepare_writable_dir(&self, dir: &std::path::Path) -> Result<(), BoxError>;
    /// Prepares the sandbox's workspace (its `workspace_dir`) before an execution: made if
    /// missing, with the backend's quota, writable by the sandbox's user.
    fn prepare_workspace(&self, sandbox: &Sandbox) -> Result<(), BoxError> {
        match &sandbox.workspace_dir {
            Some(dir) => self.prepare_writable_dir(dir),
            None => Ok(()),
        }
    }
    /// Selects or creates a sandbox for exactly this mount set (never one holding packages
    /// outside it) and leases it.
    fn acquire<'a>(&'a self, sandbox: &'a Sandbox) -> BoxFuture<'a, Lease>;
    /// The packages ready in the leased sandbox, as verified now: mount target → digest.
    fn prepared<'a>(&'a self, lease: &'a Lease) -> BoxFuture<'a, BTreeMap<String, Digest>>;
    /// Makes `mount` (as the registry holds it: `source` is the verified host tree) ready in
    /// the leased sandbox: a fresh directory, verified against the manifest, ready marker
    /// last — never a package changed in place. Fails rather than leave anything unverified
    /// usable.
    fn prepare<'a>(&'a self, lease: &'a Lease, mount: &'a Mount) -> BoxFuture<'a, ()>;
    /// Runs one execution in the leased sandbox; `kill` resolves when it must be killed
    /// (revocation).
    fn exec<'a>(
        &'a self,
        lease: &'a Lease,
        req: ExecRequest,
        kill: tokio::sync::oneshot::Receiver<()>,
    ) -> ExecFuture<'a>;
    /// Ends a lease (the sandbox may be retired once no lease holds it).
    fn release(&self, lease: Lease);
    /// Removes everything of sandbox `id` — prepared packages, and its workspace — because
    /// its run ended. The runtime never calls it while an execution is in progress there.
    /// Called on a blocking thread (it may wait for the backend).
    fn destroy(&self, id: &str, workspace_dir: Option<&std::path::Path>) -> Result<(), BoxError>;
    /// Sandboxes the backend holds state for (so ended runs' sandboxes can be found).
    fn sandboxes(&self) -> Vec<String>;
    /// Removes every prepared copy of the package at `target` (its revision was revoked).
    /// Backends that bind the revision cache have none.
    fn discard<'a>(&'a self, target: &'a str) -> BoxFuture<'a, ()> {
        let _ = target;
        Box::pin(async { Ok(()) })
    }
    /// Whether dependency environments live in the backend's named volumes (else in host
    /// directories under the box's storage).
    fn environment_volumes(&self) -> bool {
        false
    }
    /// The name of the volume holding the dependency environment `key` (backends with
    /// volumes; named per owner, so servers sharing an engine never share a build).
    fn env_volume_name(&self, key: &str) -> String {
        format!("skillbox-env-{key}")
    }
    /// Creates (or keeps) a named volume for a dependency environment.
    fn create_env_volume<'a>(&'a self, name: &'a str) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            Err(BoxError::Unavailable(format!(
                "this backend has no volumes (asked for {name})"
            )))
        })
    }
    /// Removes a dependency environment's volume (an interrupted build's).
    fn remove_env_volume<'a>(&'a self, name: &'a str) -> BoxFuture<'a, ()> {
        self.create_env_volume(name)
    }
}

/// A lock whose holder panicked.
pub(crate) fn poisoned<T>(_: T) -> BoxError {
    BoxError::Unavailable("sandbox backend state is poisoned (a task panicked)".into())
}

/// How a process ended, for error messages: its exit code or the signal that killed it.
pub fn describe_status(status: std::process::ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    ended(status.code(), status.signal())
}

/// "exit code N", "killed by signal N", or that there was neither.
fn ended(code: Option<i32>, signal: Option<i32>) -> String {
    match (code, signal) {
        (Some(code), _) => format!("exit code {code}"),
        (None, Some(sig)) => format!("killed by signal {sig}"),
        _ => "ended without an exit code".into(),
    }
}

/// Creates `dir` (if missing) for the sandbox user `uid` to write: owned by it, mode 0700.
pub fn writable_dir(dir: &std::path::Path, uid: u32) -> Result<(), BoxError> {
    if !dir.is_dir() {
        std::fs::create_dir_all(dir)?;
        std::os::unix::fs::chown(dir, Some(uid), Some(uid))?;
        std::fs::set_permissions(dir, std::os::unix::fs::PermissionsExt::from_mode(0o700))?;
    }
    Ok(())
}

/// [`writable_dir`], and if `dir` existed with another owner (a uid from before), everything
/// in it handed to `uid`.
pub(crate) fn owned_dir(dir: &std::path::Path, uid: u32) -> Result<(), BoxError> {
    use std::os::unix::fs::MetadataExt;
    writable_dir(dir, uid)?;
    if std::fs::metadata(dir)?.uid() != uid {
        chown_tree(dir, uid)?;
    }
    Ok(())
}

/// `lchown -R uid:uid`, never following a symlink.
fn chown_tree(path: &std::path::Path, uid: u32) -> std::io::Result<()> {
    std::os::unix::fs::lchown(path, Some(uid), Some(uid))?;
    if std::fs::symlink_metadata(path)?.is_dir() {
        for e in std::fs::read_dir(path)? {
            chown_tree(&e?.path(), uid)?;
        }
    }
    Ok(())
}

/// Acquires, executes, releases: the box's own executions (probes, environment builds).
pub(crate) async fn run_once(
    backend: &dyn Backend,
    sandbox: &Sandbox,
    req: ExecRequest,
) -> Result<ExecResult, BoxError> {
    let lease = backend.acquire(sandbox).await?;
    let (_never, kill) = tokio::sync::oneshot::channel();
    let result = backend.exec(&lease, req, kill).await;
    backend.release(lease);
    result
}

/// One execution in progress: its sandbox, the mount targets it uses and the switch that
/// kills it.
struct Running {
    sandbox: String,
    targets: Vec<String>,
    kill: Option<tokio::sync::oneshot::Sender<()>>,
}

/// Executions in progress, by the mount targets they use, so a revocation can kill them.
#[derive(Default)]
pub struct Executions {
    next: AtomicU64,
    running: Mutex<HashMap<u64, Running>>,
}

/// Unregisters an execution when dropped.
struct ExecutionGuard<'a> {
    id: u64,
    set: &'a Executions,
}

impl Drop for ExecutionGuard<'_> {
    fn drop(&mut self) {
        if let Ok(mut r) = self.set.running.lock() {
            r.remove(&self.id);
        }
    }
}

impl Executions {
    fn register(
        &self,
        sandbox: &str,
        targets: Vec<String>,
    ) -> (ExecutionGuard<'_>, tokio::sync::oneshot::Receiver<()>) {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = tokio::sync::oneshot::channel();
        if let Ok(mut r) = self.running.lock() {
            r.insert(
                id,
                Running {
                    sandbox: sandbox.to_string(),
                    targets,
                    kill: Some(tx),
                },
            );
        }
        (ExecutionGuard { id, set: self }, rx)
    }

    /// Kills every execution in progress that mounts `target`; returns how many.
    pub fn kill_mounting(&self, target: &str) -> usize {
        let Ok(mut r) = self.running.lock() else {
            return 0;
        };
        let mut n = 0;
        for e in r.values_mut() {
            if e.targets.iter().any(|t| t == target)
                && let Some(k) = e.kill.take()
            {
                let _ = k.send(());
                n += 1;
            }
        }
        n
    }

    pub fn in_progress(&self) -> usize {
        self.running.lock().map(|r| r.len()).unwrap_or(0)
    }

    /// Executions in progress in `sandbox`.
    pub fn in_sandbox(&self, sandbox: &str) -> usize {
        self.running
            .lock()
            .map(|r| r.values().filter(|e| e.sandbox == sandbox).count())
            .unwrap_or(0)
    }
}

/// The box: a backend, the executions it runs and its dependency environments.
pub struct BoxRuntime {
    pub backend: Arc<dyn Backend>,
    pub executions: Executions,
    pub deps: Arc<deps::DepEnvs>,
}

impl BoxRuntime {
    pub fn new(backend: Arc<dyn Backend>, deps: Arc<deps::DepEnvs>) -> Self {
        BoxRuntime {
            backend,
            executions: Executions::default(),
            deps,
        }
    }

    /// Reconciles, then executes (SPEC §4.6). The dependency environment of the named skill
    /// joins the mount set first (built once, outside the execution's time budget); the
    /// backend leases a sandbox for exactly that set; its prepared packages are compared with
    /// the pins — a package outside the set refuses the sandbox, a missing or different one
    /// is prepared afresh; only then does the execution start, registered under its mount
    /// targets so a revocation can kill it.
    pub async fn exec(
        &self,
        sandbox: &Sandbox,
        mut req: ExecRequest,
    ) -> Result<ExecResult, BoxError> {
        self.backend.prepare_workspace(sandbox)?;
        let mut sandbox = sandbox.clone();
        if let Some(target) = &sandbox.environment_of {
            let mount = sandbox
                .mounts
                .iter()
                .find(|m| &m.target == target)
                .ok_or_else(|| {
                    BoxError::BadRequest(format!("{target} is not mounted in this sandbox"))
                })?;
            if let Some(env) = self.deps.ensure(self.backend.as_ref(), mount).await? {
                env.activate(&mut sandbox, &mut req.env);
            }
        }
        let lease = self.backend.acquire(&sandbox).await?;
        let result = self.reconcile_and_exec(&sandbox.mounts, &lease, req).await;
        self.backend.release(lease);
        result
    }

    /// `mounts`: the packages as the registry holds them (sources are the verified host
    /// trees that preparation copies from).
    async fn reconcile_and_exec(
        &self,
        mounts: &[Mount],
        lease: &Lease,
        req: ExecRequest,
    ) -> Result<ExecResult, BoxError> {
        let prepared = self.backend.prepared(lease).await?;
        if let Some(extra) = prepared
            .keys()
            .find(|t| !mounts.iter().any(|m| &m.target == *t))
        {
            return Err(BoxError::Unavailable(format!(
                "the sandbox holds {extra}, which is not in this run's set; it is not used"
            )));
        }
        for m in mounts {
            if prepared.get(&m.target) != Some(&m.digest) {
                self.backend.prepare(lease, m).await?;
            }
        }
        let (_guard, kill) = self.executions.register(
            &lease.sandbox.id,
            mounts.iter().map(|m| m.target.clone()).collect(),
        );
        self.backend.exec(lease, req, kill).await
    }

    /// Releases a sandbox whose run has ended — its workspace and prepared packages — unless
    /// an execution is still in progress in it (then `false`; a later sweep retries).
    pub fn release(
        &self,
        sandbox: &str,
        workspace_dir: &std::path::Path,
    ) -> Result<bool, BoxError> {
        if self.executions.in_sandbox(sandbox) > 0 {
            return Ok(false);
        }
        self.backend.destroy(sandbox, Some(workspace_dir))?;
        Ok(true)
    }

    /// Unpacks `tar` into `dir`, a new directory under `/workspace`, inside the sandbox and
    /// as its user: whatever an earlier execution planted in the workspace (symlinks, say)
    /// can redirect the write only to where the sandbox may write anyway.
    pub async fn import_tar(
        &self,
        sandbox: &Sandbox,
        dir: &str,
        tar: Vec<u8>,
    ) -> Result<(), BoxError> {
        let script = r#"set -e
mkdir -p "$(dirname "$D")"
mkdir "$D"
tar -x -f - -C "$D" --no-same-owner"#;
        let r = self
            .exec(
                sandbox,
                workspace_transfer(script, dir, Some(tar), 64 * 1024),
            )
            .await?;
        if r.outcome != Outcome::Exited || r.exit_code != Some(0) {
            return Err(BoxError::Unavailable(format!(
                "unpacking into {dir} in the sandbox failed: {}",
                r.failure()
            )));
        }
        Ok(())
    }

    /// Packs `dir` (under `/workspace`) as a tar, inside the sandbox and as its user, so only
    /// what the sandbox itself can see is ever read; at most `cap` bytes.
    pub async fn export_tar(
        &self,
        sandbox: &Sandbox,
        dir: &str,
        cap: usize,
    ) -> Result<Vec<u8>, BoxError> {
        // GNU tar skips sockets with a warning and exit 0: they are named and refused first,
        // like every other entry that is not a file or a directory.
        let script = r#"[ -d "$D" ] || exit 3
cd "$D" || exit 3
s=$(find . -type s | head -n 100)
if [ -n "$s" ]; then printf '%s\n' "$s" >&2; exit 5; fi
exec tar -c -f - ."#;
        let r = self
            .exec(sandbox, workspace_transfer(script, dir, None, cap))
            .await?;
        match (r.outcome, r.exit_code) {
            (Outcome::Exited, Some(3)) => Err(BoxError::Missing(format!(
                "{dir} is not a directory in the sandbox's workspace (removed or replaced)"
            ))),
            _ if r.stdout_truncated => Err(BoxError::TooLarge(format!(
                "{dir} holds more than {cap} bytes"
            ))),
            (Outcome::Exited, Some(0)) => Ok(r.stdout),
            (Outcome::Exited, Some(5)) => Err(BoxError::SpecialFiles(
                String::from_utf8_lossy(&r.stderr)
                    .lines()
                    .map(|l| l.trim_start_matches("./").to_string())
                    .collect(),
            )),
            // tar itself refused (unreadable files, say): the directory's fault, not the box's.
            (Outcome::Exited, Some(_)) => Err(BoxError::BadRequest(format!(
                "{dir} cannot be packed: {}",
                r.failure()
            ))),
            _ => Err(BoxError::Unavailable(format!(
                "packing {dir} in the sandbox failed: {}",
                r.failure()
            ))),
        }
    }
}

/// A shell script moving a tar in or out of `dir` (passed as `$D`, never spliced into the
/// script).
fn workspace_transfer(
    script: &str,
    dir: &str,
    stdin: Option<Vec<u8>>,
    output_cap: usize,
) -> ExecRequest {
    ExecRequest {
        cwd: "/workspace".into(),
        stdin,
        output_cap,
        ..ExecRequest::shell(script, BTreeMap::from([("D".to_string(), dir.to_string())]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_is_capped_and_the_cut_is_said() {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let mut keep = Capped::new(5, Some(tx), StreamKind::Stdout);
        keep.push(b"abc");
        assert!(!keep.truncated);
        keep.push(b"defgh");
        keep.push(b"ijk");
        assert_eq!(keep.kept, b"abcde");
        assert!(keep.truncated);
        // What is streamed is exactly what is kept.
        let mut streamed = Vec::new();
        while let Ok((kind, data)) = rx.try_recv() {
            assert_eq!(kind, StreamKind::Stdout);
            streamed.extend(data);
        }
        assert_eq!(streamed, b"abcde");
    }

    #[test]
    fn a_failure_says_how_it_ended_and_what_it_printed_last() {
        let result = |outcome, exit_code, signal, stderr: &[u8]| ExecResult {
            outcome,
            exit_code,
            signal,
            timed_out: outcome == Outcome::TimedOut,
            stdout: b"out\n".to_vec(),
            stderr: stderr.to_vec(),
            stdout_truncated: false,
            stderr_truncated: false,
            duration_ms: 7,
        };
        let r = result(Outcome::Exited, Some(3), None, b"1\n2\n3\n4\n5\n6\n7\n");
        assert_eq!(r.failure(), "exit code 3: 2 | 3 | 4 | 5 | 6 | 7");
        let r = result(Outcome::Signaled, None, Some(9), b"  \n");
        assert_eq!(
            r.failure(),
            "killed by signal 9: out",
            "stdout when stderr is blank"
        );
        let r = result(Outcome::TimedOut, None, Some(9), b"");
        assert!(r.failure().starts_with("timed out after 7 ms"));
    }
}
