//! The bubblewrap backend: one `bwrap` process per execution.
//!
//! The command line is `prlimit <limits> -- setpriv --reuid=U --regid=U --clear-groups --
//! bwrap <namespaces and mounts> -- program`. bwrap is started as an unprivileged host uid so
//! that `RLIMIT_NPROC` applies (the kernel exempts root) and the sandbox holds no privilege
//! it could regain. Because bwrap resolves bind sources as that uid, package trees and the
//! workspace must be reachable by it (the server makes its data directory traversable).

use crate::prepare::PreparedStore;
use crate::{
    Backend, BoxError, BoxFuture, Capabilities, Capped, ExecFuture, ExecRequest, ExecResult, Lease,
    Mount, Outcome, Sandbox, StreamKind,
};
use skillbox_package::Digest;
use std::collections::BTreeMap;
use std::ffi::OsString;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Instant;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};

/// Resource limits of one execution.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Address space, bytes.
    pub memory: u64,
    /// Processes of the sandbox uid (fork bombs).
    pub processes: u64,
    /// Largest file a process may write, bytes.
    pub file_size: u64,
    pub open_files: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            memory: 2 << 30,
            processes: 256,
            file_size: 256 << 20,
            open_files: 1024,
        }
    }
}

#[derive(Debug, Clone)]
pub struct Bwrap {
    pub bwrap: PathBuf,
    /// Host uid (and gid) the sandbox runs as.
    pub uid: u32,
    pub limits: Limits,
    /// Copy mode: packages are copied into this store and verified, instead of binding the
    /// revision-cache trees.
    pub copies: Option<PreparedStore>,
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

impl Bwrap {
    pub fn new(uid: u32) -> Self {
        Bwrap {
            bwrap: PathBuf::from("bwrap"),
            uid,
            limits: Limits::default(),
            copies: None,
        }
    }

    /// Runs `/bin/true` in a minimal sandbox: Ok with what works, or why not and what to do.
    pub fn probe(&self) -> Result<String, BoxError> {
        let sandbox = Sandbox::internal("probe", vec![]);
        let mut args = self.wrapper_args();
        let env = ExecRequest::shell("", Default::default()).environment(false);
        args.extend(self.bwrap_args(&sandbox, "/", &env));
        args.push("/bin/true".into());
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
                "bwrap creates user, pid, net, ipc, uts and mount namespaces here, as uid {}",
                self.uid
            )),
            Ok(o) => {
                let err = String::from_utf8_lossy(&o.stderr).trim().to_string();
                Err(BoxError::Unavailable(
                    if err.contains("No such file") && err.contains("bwrap") {
                        "bwrap is not installed: install bubblewrap (Debian: apt-get install bubblewrap)".into()
                    } else {
                        format!(
                            "bwrap cannot create a sandbox here: {err} — unprivileged user namespaces are probably \
restricted (sysctl kernel.unprivileged_userns_clone / user.max_user_namespaces, or AppArmor's userns \
restriction); skillbox never falls back to running unsandboxed"
                        )
                    },
                ))
            }
        }
    }

    fn wrapper_args(&self) -> Vec<OsString> {
        let l = &self.limits;
        let uid = self.uid.to_string();
        [
            format!("--as={}", l.memory),
            format!("--nproc={}", l.processes),
            format!("--fsize={}", l.file_size),
            format!("--nofile={}", l.open_files),
            "--".into(),
            "setpriv".into(),
            format!("--reuid={uid}"),
            format!("--regid={uid}"),
            "--clear-groups".into(),
            "--".into(),
            self.bwrap.to_string_lossy().into_owned(),
        ]
        .into_iter()
        .map(OsString::from)
        .collect()
    }

    fn bwrap_args(
        &self,
        sandbox: &Sandbox,
        cwd: &str,
        env: &std::collections::BTreeMap<String, String>,
    ) -> Vec<OsString> {
        let mut a: Vec<OsString> = Vec::new();
        let mut push = |items: &[&str]| a.extend(items.iter().map(OsString::from));
        push(&[
            "--unshare-all",
            "--die-with-parent",
            "--new-session",
            "--cap-drop",
            "ALL",
            "--clearenv",
        ]);
        if sandbox.network {
            push(&["--share-net"]);
        }
        for p in SYSTEM_RO {
            push(&["--ro-bind-try", p, p]);
        }
        push(&[
            "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--dir", "/skills",
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
        a.push("--chdir".into());
        a.push(cwd.into());
        a.push("--".into());
        a
    }
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
            skillbox_package::staging::remove_tree(dir)?;
        }
        Ok(())
    }

    fn sandboxes(&self) -> Vec<String> {
        self.copies
            .as_ref()
            .and_then(|s| s.sandboxes().ok())
            .unwrap_or_default()
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
            args.extend(self.bwrap_args(sandbox, &req.cwd, &env));
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
            let out = tokio::spawn(read_capped(
                child
                    .stdout
                    .take()
                    .ok_or_else(|| BoxError::BadRequest("no stdout".into()))?,
                Capped::new(req.output_cap, req.live.clone(), StreamKind::Stdout),
            ));
            let err = tokio::spawn(read_capped(
                child
                    .stderr
                    .take()
                    .ok_or_else(|| BoxError::BadRequest("no stderr".into()))?,
                Capped::new(req.output_cap, req.live.clone(), StreamKind::Stderr),
            ));
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
