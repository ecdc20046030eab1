//! The bubblewrap backend: one `bwrap` process per execution.
//!
//! The command line is `prlimit <limits> -- bwrap <namespaces and mounts> -- setpriv
//! --reuid=U --regid=U --clear-groups --inh-caps=-all --bounding-set=-all -- program`. bwrap
//! runs as root without a user namespace, so it resolves bind sources as root — any data
//! directory works, even one under a 0700 home — and mounts in a fresh mount namespace; its
//! child keeps only the capabilities that `setpriv` needs to become the sandbox's uid `U`, and
//! `setpriv` drops every capability (and the bounding set) before the program starts, with
//! `no_new_privs` set by bwrap (setuid binaries in `/usr` stay powerless). Each sandbox has its
//! own `U` from a [`UidPool`], so `RLIMIT_NPROC` (which the kernel counts per uid and never
//! applies to root) is a process budget per sandbox. The root of the sandbox, `/skills` and
//! every directory above a mount are read-only (`--remount-ro /` last); `/tmp` is a tmpfs of
//! capped size; `/workspace` is the sandbox's quota'd workspace ([`crate::workspace`]).

use crate::prepare::PreparedStore;
use crate::workspace::UidPool;
use crate::{
    Backend, BoxError, BoxFuture, Capabilities, Capped, ExecFuture, ExecRequest, ExecResult, Lease,
    Mount, Outcome, Sandbox, StreamKind,
};
use skillbox_package::Digest;
use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsString;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Instant;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};

/// Resource limits of one sandbox.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Address space, bytes.
    pub memory: u64,
    /// Processes of the sandbox's uid (fork bombs).
    pub processes: u64,
    /// Largest file a process may write, bytes.
    pub file_size: u64,
    pub open_files: u64,
    /// Size of the sandbox's `/tmp` (a tmpfs, so host memory), bytes.
    pub tmp_bytes: u64,
    /// Quota of the sandbox's `/workspace`, bytes (0: no quota, a plain directory).
    pub workspace_bytes: u64,
}

/// Default `/tmp` size of a sandbox: 256 MiB.
pub const DEFAULT_TMP_BYTES: u64 = 256 << 20;
/// Default `/workspace` quota of a sandbox: 1 GiB.
pub const DEFAULT_WORKSPACE_BYTES: u64 = 1 << 30;

impl Default for Limits {
    fn default() -> Self {
        Limits {
            memory: 2 << 30,
            processes: 256,
            file_size: 256 << 20,
            open_files: 1024,
            tmp_bytes: DEFAULT_TMP_BYTES,
            workspace_bytes: DEFAULT_WORKSPACE_BYTES,
        }
    }
}

#[derive(Debug, Clone)]
pub struct Bwrap {
    pub bwrap: PathBuf,
    /// Host uid (and gid) of the box's own work: probes and dependency environment builds.
    pub uid: u32,
    pub limits: Limits,
    /// Copy mode: packages are copied into this store and verified, instead of binding the
    /// revision-cache trees.
    pub copies: Option<PreparedStore>,
    /// One uid per sandbox (without a pool every sandbox runs as `uid`).
    pub uids: Option<Arc<UidPool>>,
    /// The box's directory in the data directory: the probe binds from it, so it proves the
    /// real layout works.
    pub state_dir: Option<PathBuf>,
}

/// System paths bound read-only when they exist.
const SYSTEM_RO: [&str; 13] = [
    "/usr",
    "/bin",
    "/sbin",
    "/lib",
    "/lib64",
    "/lib32",
    "/etc/alternatives",
    "/etc/ld.so.cache",
    "/etc/ssl",
    "/etc/localtime",
    "/etc/passwd",
    "/etc/group",
    "/etc/nsswitch.conf",
];

/// Capabilities bwrap leaves to its child: exactly what `setpriv` needs to change uid, gid
/// and groups and to empty the bounding set. `setpriv` drops them all before the program.
const SETPRIV_CAPS: [&str; 3] = ["CAP_SETUID", "CAP_SETGID", "CAP_SETPCAP"];

impl Bwrap {
    pub fn new(uid: u32) -> Self {
        Bwrap {
            bwrap: PathBuf::from("bwrap"),
            uid,
            limits: Limits::default(),
            copies: None,
            uids: None,
            state_dir: None,
        }
    }

    /// Runs a command in a sandbox built like an execution's — a package bound from the box's
    /// directory in the data directory (so a data directory under a 0700 home is tried for
    /// real), read-only `/skills`, capped `/tmp`, quota'd `/workspace` — as the sandbox user:
    /// Ok with what works, or why not and what to do.
    pub fn probe(&self) -> Result<String, BoxError> {
        let state = self
            .state_dir
            .clone()
            .unwrap_or_else(|| std::env::temp_dir().join("skillbox-probe"));
        let probe_dir = state.join(skillbox_package::staging::unique_name(".probe-"));
        let package = probe_dir.join("package");
        let workspace = probe_dir.join("workspace");
        std::fs::create_dir_all(&package)?;
        std::fs::write(package.join("SKILL.md"), b"probe")?;
        let result = (|| {
            self.prepare_workspace_for(&workspace, self.uid)?;
            let manifest = Arc::new(skillbox_package::Manifest::default());
            let sandbox = Sandbox {
                id: "probe".into(),
                workspace_dir: Some(workspace.clone()),
                mounts: vec![Mount {
                    target: "/skills/probe/1".into(),
                    source: package.clone(),
                    digest: manifest.digest(),
                    manifest,
                }],
                binds: vec![],
                environment_of: None,
                network: false,
            };
            let env = ExecRequest::shell("", Default::default()).environment(true);
            // The probe runs as the box's own uid, which other sandboxes on the host may share
            // (docker containers run as it too) and whose process count they may have filled:
            // RLIMIT_NPROC counts every process of the uid, so the probe keeps the server's own
            // limit instead of the sandboxes' (what it checks is that a sandbox can be built at
            // all, not the limit).
            let mut args = self.wrapper_args();
            args.retain(|a| !a.to_string_lossy().starts_with("--nproc="));
            args.extend(self.bwrap_args(&sandbox, "/", &env, self.uid));
            args.extend(
                [
                    "/bin/sh",
                    "-c",
                    "cat /skills/probe/1/SKILL.md >/dev/null && touch /workspace/.probe && ! touch /skills/.probe 2>/dev/null",
                ]
                .map(OsString::from),
            );
            let out = std::process::Command::new("prlimit")
                .args(&args)
                .stdin(Stdio::null())
                .output();
            match out {
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(BoxError::Unavailable(
                    "prlimit (util-linux) is not installed".into(),
                )),
                Err(e) => Err(BoxError::Unavailable(format!(
                    "cannot start the sandbox: {e}"
                ))),
                Ok(o) if o.status.success() => Ok(format!(
                    "bwrap creates pid, net, ipc, uts and mount namespaces here and runs each sandbox as \
its own uid (from {}); packages under {} are readable in it, /skills is read-only, /workspace is \
writable{}",
                    self.uids.as_ref().map(|p| p.base()).unwrap_or(self.uid),
                    state.display(),
                    if self.limits.workspace_bytes > 0 {
                        format!(" with a quota of {} bytes", self.limits.workspace_bytes)
                    } else {
                        " (no quota)".into()
                    }
                )),
                Ok(o) => {
                    let err = String::from_utf8_lossy(&o.stderr).trim().to_string();
                    Err(BoxError::Unavailable(
                        if err.contains("No such file") && err.contains("bwrap") {
                            "bwrap is not installed: install bubblewrap (Debian: apt-get install bubblewrap)".into()
                        } else if not_root() {
                            format!(
                                "bwrap must be started as root (it mounts as root and then becomes the sandbox's own uid): {err}"
                            )
                        } else {
                            format!(
                                "a bwrap sandbox does not work here ({}): {err} — bwrap needs to run as root \
with mount namespaces available; skillbox never falls back to running unsandboxed",
                                crate::describe_status(o.status)
                            )
                        },
                    ))
                }
            }
        })();
        let removed = crate::workspace::remove(&workspace)
            .and_then(|_| Ok(skillbox_package::staging::remove_tree(&probe_dir)?));
        let ok = result?;
        removed?;
        Ok(ok)
    }

    fn wrapper_args(&self) -> Vec<OsString> {
        let l = &self.limits;
        [
            format!("--as={}", l.memory),
            format!("--nproc={}", l.processes),
            format!("--fsize={}", l.file_size),
            format!("--nofile={}", l.open_files),
            "--".into(),
            self.bwrap.to_string_lossy().into_owned(),
        ]
        .into_iter()
        .map(OsString::from)
        .collect()
    }

    /// The sandbox's uid: its own from the pool, or the box's for its own work.
    fn uid_of(&self, sandbox: &Sandbox) -> Result<u32, BoxError> {
        match (&self.uids, &sandbox.workspace_dir) {
            (Some(pool), Some(_)) => pool.uid_of(&sandbox.id),
            _ => Ok(self.uid),
        }
    }

    /// Makes the workspace at `dir` ready for `uid`: a loop-mounted ext4 image of the quota's
    /// size, or (no quota) a plain directory.
    fn prepare_workspace_for(&self, dir: &Path, uid: u32) -> Result<(), BoxError> {
        if self.limits.workspace_bytes == 0 || crate::workspace::is_mountpoint(dir) {
            return crate::owned_dir(dir, uid);
        }
        let image = crate::workspace::image_path(dir);
        if dir.is_dir() && !image.exists() {
            // A workspace from before quotas: kept as it is, without one.
            tracing::warn!(dir = %dir.display(), "workspace made without a quota; keeping it");
            return crate::owned_dir(dir, uid);
        }
        crate::workspace::make_image(&image, self.limits.workspace_bytes, uid)?;
        crate::workspace::mount(&image, dir, uid)
    }

    fn bwrap_args(
        &self,
        sandbox: &Sandbox,
        cwd: &str,
        env: &std::collections::BTreeMap<String, String>,
        uid: u32,
    ) -> Vec<OsString> {
        let mut a: Vec<OsString> = Vec::new();
        let mut push = |items: &[&str]| a.extend(items.iter().map(OsString::from));
        push(&[
            "--unshare-ipc",
            "--unshare-pid",
            "--unshare-uts",
            "--unshare-cgroup-try",
            "--die-with-parent",
            "--new-session",
            "--clearenv",
        ]);
        if !sandbox.network {
            push(&["--unshare-net"]);
        }
        for cap in SETPRIV_CAPS {
            push(&["--cap-add", cap]);
        }
        // Every directory bwrap makes on the way to a mount is made explicitly, 0755 and
        // root's (implicit ones would be 0700, unreadable to the sandbox user); `--remount-ro
        // /` at the end leaves them all read-only.
        let targets: Vec<String> = SYSTEM_RO
            .iter()
            .filter(|p| Path::new(p).exists())
            .map(|p| p.to_string())
            .chain(sandbox.mounts.iter().map(|m| m.target.clone()))
            .chain(sandbox.binds.iter().map(|b| b.target.clone()))
            .collect();
        let mut parents = BTreeSet::from(["/skills".to_string()]);
        for t in &targets {
            let mut p = Path::new(t).parent();
            while let Some(dir) = p.filter(|d| *d != Path::new("/")) {
                parents.insert(dir.to_string_lossy().into_owned());
                p = dir.parent();
            }
        }
        for dir in &parents {
            push(&["--perms", "0755", "--dir", dir]);
        }
        for p in SYSTEM_RO {
            push(&["--ro-bind-try", p, p]);
        }
        let tmp_size = self.limits.tmp_bytes.to_string();
        push(&[
            "--proc", "/proc", "--dev", "/dev", "--perms", "1777", "--size", &tmp_size, "--tmpfs",
            "/tmp",
        ]);
        for m in &sandbox.mounts {
            a.push("--ro-bind".into());
            a.push(m.source.clone().into_os_string());
            a.push(m.target.clone().into());
        }
        if let Some(dir) = &sandbox.workspace_dir {
            a.push("--bind".into());
            a.push(dir.clone().into_os_string());
            a.push("/workspace".into());
        }
        for b in &sandbox.binds {
            // Only host paths exist here (`environment_volumes` is false for bwrap).
            if let crate::BindSource::Host(source) = &b.source {
                a.push(if b.writable { "--bind" } else { "--ro-bind" }.into());
                a.push(source.clone().into_os_string());
                a.push(b.target.clone().into());
            }
        }
        for (k, v) in env {
            a.push("--setenv".into());
            a.push(k.into());
            a.push(v.into());
        }
        let uid = uid.to_string();
        a.extend(
            [
                "--remount-ro",
                "/",
                "--chdir",
                cwd,
                "--",
                SETPRIV,
                &format!("--reuid={uid}"),
                &format!("--regid={uid}"),
                "--clear-groups",
                "--inh-caps=-all",
                "--bounding-set=-all",
                "--",
            ]
            .map(OsString::from),
        );
        a
    }
}

/// `setpriv` inside the sandbox, by absolute path: a `PATH` from the request must never choose
/// the program that still holds capabilities. Debian's util-linux puts it here, under the
/// read-only `/usr`.
const SETPRIV: &str = "/usr/bin/setpriv";

/// Whether this process is not root (bwrap then cannot mount as root or change uid).
fn not_root() -> bool {
    !nix::unistd::Uid::effective().is_root()
}

/// Reads a stream to its end through a [`Capped`] keeper.
async fn read_capped(mut r: impl AsyncRead + Unpin, mut keep: Capped) -> (Vec<u8>, bool) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match r.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => keep.push(&buf[..n]),
        }
    }
    (keep.kept, keep.truncated)
}

impl Backend for Bwrap {
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            backend: "bwrap",
            immutable: true,
        }
    }

    fn system_identity(&self) -> String {
        "host".into()
    }

    fn prepare_writable_dir(&self, dir: &Path) -> Result<(), BoxError> {
        crate::writable_dir(dir, self.uid)
    }

    fn prepare_workspace(&self, sandbox: &Sandbox) -> Result<(), BoxError> {
        let Some(dir) = &sandbox.workspace_dir else {
            return Ok(());
        };
        self.prepare_workspace_for(dir, self.uid_of(sandbox)?)
    }

    /// Nothing to select: every execution is a fresh bwrap made of exactly the mount set. In
    /// copy mode the mounts' sources become the sandbox's prepared copies.
    fn acquire<'a>(&'a self, sandbox: &'a Sandbox) -> BoxFuture<'a, Lease> {
        Box::pin(async move {
            let mut sandbox = sandbox.clone();
            if let Some(store) = &self.copies {
                for m in &mut sandbox.mounts {
                    m.source = store.package_dir(&sandbox.id, &m.target);
                }
            }
            Ok(Lease {
                sandbox,
                handle: String::new(),
            })
        })
    }

    /// Bind mode: the revision-cache trees, verified when they were built, are the packages.
    /// Copy mode: each copy is re-verified now.
    fn prepared<'a>(&'a self, lease: &'a Lease) -> BoxFuture<'a, BTreeMap<String, Digest>> {
        Box::pin(async move {
            let Some(store) = self.copies.clone() else {
                return Ok(lease
                    .sandbox
                    .mounts
                    .iter()
                    .map(|m| (m.target.clone(), m.digest))
                    .collect());
            };
            let (id, mounts) = (lease.sandbox.id.clone(), lease.sandbox.mounts.clone());
            tokio::task::spawn_blocking(move || {
                mounts
                    .iter()
                    .filter(|m| store.is_prepared(&id, m))
                    .map(|m| (m.target.clone(), m.digest))
                    .collect()
            })
            .await
            .map_err(|e| BoxError::Unavailable(format!("verification task failed: {e}")))
        })
    }

    fn prepare<'a>(&'a self, lease: &'a Lease, mount: &'a Mount) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            let Some(store) = self.copies.clone() else {
                return Err(BoxError::Unavailable(format!(
                    "the package tree of {} is not ready",
                    mount.target
                )));
            };
            let (id, mount) = (lease.sandbox.id.clone(), mount.clone());
            tokio::task::spawn_blocking(move || store.ensure(&id, &mount).map(|_| ()))
                .await
                .map_err(|e| BoxError::Unavailable(format!("preparation task failed: {e}")))?
        })
    }

    fn release(&self, _lease: Lease) {}

    fn discard<'a>(&'a self, target: &'a str) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            let Some(store) = self.copies.clone() else {
                return Ok(());
            };
            let target = target.to_string();
            tokio::task::spawn_blocking(move || store.discard(&target))
                .await
                .map_err(|e| BoxError::Unavailable(format!("discard task failed: {e}")))??;
            Ok(())
        })
    }

    fn destroy(&self, id: &str, workspace_dir: Option<&Path>) -> Result<(), BoxError> {
        if let Some(store) = &self.copies {
            store.release(id)?;
        }
        if let Some(dir) = workspace_dir {
            crate::workspace::remove(dir)?;
        }
        if let Some(pool) = &self.uids {
            pool.release(id)?;
        }
        Ok(())
    }

    fn sandboxes(&self) -> Vec<String> {
        let mut all: BTreeSet<String> = self
            .copies
            .as_ref()
            .and_then(|s| s.sandboxes().ok())
            .unwrap_or_default()
            .into_iter()
            .collect();
        if let Some(pool) = &self.uids {
            all.extend(pool.sandboxes());
        }
        all.into_iter().collect()
    }

    fn exec<'a>(
        &'a self,
        lease: &'a Lease,
        req: ExecRequest,
        kill: tokio::sync::oneshot::Receiver<()>,
    ) -> ExecFuture<'a> {
        let sandbox = &lease.sandbox;
        Box::pin(async move {
            let program = req.command_line()?;
            let env = req.environment(sandbox.workspace_dir.is_some());
            let mut args = self.wrapper_args();
            let uid = self.uid_of(sandbox)?;
            args.extend(self.bwrap_args(sandbox, &req.cwd, &env, uid));
            args.extend(program.into_iter().map(OsString::from));
            let start = Instant::now();
            let mut child = tokio::process::Command::new("prlimit")
                .args(&args)
                .stdin(if req.stdin.is_some() {
                    Stdio::piped()
                } else {
                    Stdio::null()
                })
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .kill_on_drop(true)
                .spawn()?;
            if let (Some(mut sin), Some(data)) = (child.stdin.take(), req.stdin) {
                tokio::spawn(async move {
                    let _ = sin.write_all(&data).await;
                });
            }
            let keeper = |kind| Capped::new(req.output_cap, req.live.clone(), kind);
            let (stdout, stderr) =
                child
                    .stdout
                    .take()
                    .zip(child.stderr.take())
                    .ok_or_else(|| {
                        BoxError::Unavailable("bwrap started without output pipes".into())
                    })?;
            let out = tokio::spawn(read_capped(stdout, keeper(StreamKind::Stdout)));
            let err = tokio::spawn(read_capped(stderr, keeper(StreamKind::Stderr)));
            // Killing bwrap kills the sandbox: its init dies (--die-with-parent), and with it
            // every process of the pid namespace.
            let (status, ended_by) = tokio::select! {
                s = child.wait() => (s?, None),
                _ = tokio::time::sleep(req.timeout) => { child.kill().await?; (child.wait().await?, Some(Outcome::TimedOut)) }
                Ok(()) = kill => { child.kill().await?; (child.wait().await?, Some(Outcome::Killed)) }
            };
            let (stdout, stdout_truncated) = out.await.unwrap_or_default();
            let (stderr, stderr_truncated) = err.await.unwrap_or_default();
            let outcome = match (ended_by, status.code(), status.signal()) {
                (Some(o), _, _) => o,
                // bwrap reports its own setup failures as "bwrap: …" with status 1.
                (None, Some(1), _) if stderr.starts_with(b"bwrap: ") => Outcome::SandboxFailure,
                (None, Some(_), _) => Outcome::Exited,
                (None, None, _) => Outcome::Signaled,
            };
            Ok(ExecResult {
                outcome,
                exit_code: if ended_by.is_some() {
                    None
                } else {
                    status.code()
                },
                signal: status.signal(),
                timed_out: outcome == Outcome::TimedOut,
                stdout,
                stderr,
                stdout_truncated,
                stderr_truncated,
                duration_ms: start.elapsed().as_millis() as u64,
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Mount, Sandbox};

    fn sandbox(network: bool) -> Sandbox {
        let manifest = Arc::new(skillbox_package::Manifest::new(vec![]).unwrap());
        Sandbox {
            id: "run_1".into(),
            workspace_dir: Some(PathBuf::from("/data/box/workspaces/run_1")),
            mounts: vec![Mount {
                target: "/skills/sk1/3".into(),
                source: PathBuf::from("/data/trees/abc"),
                digest: manifest.digest(),
                manifest,
            }],
            binds: vec![],
            environment_of: None,
            network,
        }
    }

    fn args(b: &Bwrap, s: &Sandbox) -> Vec<String> {
        b.bwrap_args(
            s,
            "/skills/sk1/3",
            &BTreeMap::from([("K".into(), "v".into())]),
            1_000_007,
        )
        .into_iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect()
    }

    /// The position of the run `seq` in `args`.
    fn find(args: &[String], seq: &[&str]) -> Option<usize> {
        args.windows(seq.len()).position(|w| w == seq)
    }

    #[test]
    fn packages_are_bound_read_only_and_the_workspace_writable() {
        let a = args(&Bwrap::new(65534), &sandbox(false));
        assert!(find(&a, &["--ro-bind", "/data/trees/abc", "/skills/sk1/3"]).is_some());
        assert!(find(&a, &["--bind", "/data/box/workspaces/run_1", "/workspace"]).is_some());
        // Nothing but the workspace is bound writable.
        let writable: Vec<_> = a
            .iter()
            .enumerate()
            .filter(|(_, x)| *x == "--bind")
            .collect();
        assert_eq!(writable.len(), 1, "{a:?}");
    }

    #[test]
    fn the_root_is_remounted_read_only_after_every_mount() {
        let a = args(&Bwrap::new(65534), &sandbox(false));
        let remount = find(&a, &["--remount-ro", "/"]).expect("--remount-ro /");
        let last_mount = a
            .iter()
            .rposition(|x| x.ends_with("bind") || x == "--tmpfs" || x == "--dir")
            .unwrap();
        assert!(remount > last_mount, "{a:?}");
        // Parents of the mounts are made explicitly, 0755.
        assert!(find(&a, &["--perms", "0755", "--dir", "/skills"]).is_some());
        assert!(find(&a, &["--perms", "0755", "--dir", "/skills/sk1"]).is_some());
    }

    #[test]
    fn the_program_runs_as_the_sandbox_uid_without_capabilities() {
        let a = args(&Bwrap::new(65534), &sandbox(false));
        let sep = find(&a, &["--", SETPRIV]).expect("setpriv by absolute path");
        let tail = &a[sep + 1..];
        for want in [
            "--reuid=1000007",
            "--regid=1000007",
            "--clear-groups",
            "--inh-caps=-all",
            "--bounding-set=-all",
        ] {
            assert!(tail.contains(&want.to_string()), "{want} missing: {tail:?}");
        }
        assert_eq!(a.last().map(String::as_str), Some("--"));
        // Only what setpriv needs is kept until then.
        let caps: Vec<_> = a
            .windows(2)
            .filter(|w| w[0] == "--cap-add")
            .map(|w| w[1].clone())
            .collect();
        assert_eq!(caps, SETPRIV_CAPS.map(String::from).to_vec());
    }

    #[test]
    fn network_is_cut_unless_allowed_and_tmp_is_capped() {
        let mut b = Bwrap::new(65534);
        b.limits.tmp_bytes = 12345;
        let cut = args(&b, &sandbox(false));
        assert!(cut.contains(&"--unshare-net".to_string()));
        assert!(!args(&b, &sandbox(true)).contains(&"--unshare-net".to_string()));
        assert!(
            find(&cut, &["--size", "12345", "--tmpfs", "/tmp"]).is_some(),
            "{cut:?}"
        );
        assert!(find(&cut, &["--setenv", "K", "v"]).is_some());
        assert!(cut.contains(&"--clearenv".to_string()));
        assert!(find(&cut, &["--chdir", "/skills/sk1/3"]).is_some());
    }
}
