//! The Docker backend: long-lived containers on the local engine, one per (sandbox, mount set).
//!
//! A container is created with read-only bind mounts of exactly the mount set's package trees
//! at `/skills/<skill-id>/<revision>/` (and of a dependency environment, if any), a named
//! volume `skillbox-ws-<sandbox>` at `/workspace` that belongs to the run and outlives
//! containers, a read-only root filesystem, a tmpfs `/tmp`, no network unless allowed, no
//! capabilities, `no-new-privileges`, a non-root user, memory / pids / CPU limits, and labels
//! naming the owner, the sandbox, the mount-set signature (a hash of the sorted (target,
//! digest, mode) list, the image and the network flag) and the packages it holds.
//!
//! Bind mounts cannot be added to a running container, so a different mount set means a
//! different container: `acquire` selects an idle-or-busy container of this sandbox with the
//! exact signature or creates one (same workspace volume), and retires the sandbox's other
//! containers — removing each only when its last lease is released (leases are counted here,
//! never inferred from labels). At start, containers with the owner label are listed: one whose
//! labels are consistent (the signature recomputed from its recorded packages matches) and
//! whose image is the configured one is adopted; any other is removed unless an exec is still
//! running in it.
//!
//! Executions are `exec` create/start with stdout and stderr demultiplexed, capped and
//! optionally streamed; the exit code comes from exec inspect. A timeout or a revocation kills
//! the exec's process group from the host (the engine runs each exec as a session leader; its
//! host pid comes from exec inspect), not the container's other work. The server must
//! therefore run on the engine's host with the right to signal its processes (root).

use crate::{
    Backend, BoxError, BoxFuture, Capabilities, ExecFuture, ExecRequest, ExecResult, Lease, Mount,
    Outcome, OutputSink, Program, Sandbox, StreamKind,
};
use bollard::Docker as Engine;
use bollard::exec::{CreateExecOptions, StartExecResults};
use bollard::models::{ContainerCreateBody, HostConfig, Mount as EngineMount, MountType};
use futures_util::StreamExt;
use skillbox_package::{Digest, Sha256};
use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::Mutex;
use std::time::Instant;
use tokio::io::AsyncWriteExt;

const LABEL_OWNER: &str = "skillbox.owner";
const LABEL_SANDBOX: &str = "skillbox.sandbox";
const LABEL_SIGNATURE: &str = "skillbox.signature";
const LABEL_PACKAGES: &str = "skillbox.packages";
const LABEL_LEASE: &str = "skillbox.lease";

#[derive(Debug, Clone)]
pub struct DockerConfig {
    /// The image every sandbox runs (the operator's; it needs `sleep`, `sh` and, for
    /// dependency environments, python3 with venv and pip).
    pub image: String,
    /// User the sandbox runs as.
    pub uid: u32,
    /// Names this server's containers and volumes (`skillbox.owner` label): tests use their
    /// own owner so they can clean up exactly what they made.
    pub owner: String,
    pub memory_bytes: i64,
    pub pids: i64,
    pub nano_cpus: i64,
}

impl DockerConfig {
    pub fn new(image: impl Into<String>) -> Self {
        DockerConfig {
            image: image.into(),
            uid: 65534,
            owner: "skillbox".into(),
            memory_bytes: 2 << 30,
            pids: 256,
            nano_cpus: 1_000_000_000,
        }
    }
}

/// A container this process knows about.
#[derive(Debug)]
struct Container {
    sandbox: String,
    signature: String,
    /// Executions and other uses holding it.
    leases: usize,
    /// Superseded by a container with another mount set: removed once unleased.
    retired: bool,
}

pub struct Docker {
    engine: Engine,
    cfg: DockerConfig,
    image_id: String,
    api_version: String,
    containers: Mutex<HashMap<String, Container>>,
    /// Serializes container selection/creation per sandbox.
    creating: tokio::sync::Mutex<HashMap<String, std::sync::Arc<tokio::sync::Mutex<()>>>>,
    /// Sandboxes this process holds state for (containers or volumes).
    known: Mutex<std::collections::BTreeSet<String>>,
}

fn engine_error(what: &str, e: bollard::errors::Error) -> BoxError {
    BoxError::Unavailable(format!("docker: {what}: {e}"))
}

/// The engine's API version as a comparable pair.
fn api_pair(v: &str) -> (u32, u32) {
    let mut it = v.split('.').map(|p| p.parse().unwrap_or(0));
    (it.next().unwrap_or(0), it.next().unwrap_or(0))
}

/// What the signature covers: every package (target, digest, ro), every other bind (target,
/// source, mode), the image, the network flag and the workspace.
fn signature(sandbox: &Sandbox, image_id: &str) -> String {
    let mut lines: Vec<String> = sandbox
        .mounts
        .iter()
        .map(|m| format!("pkg {} {} ro", m.target, m.digest))
        .chain(sandbox.binds.iter().map(|b| {
            format!(
                "bind {} {} {}",
                b.target,
                b.source.display(),
                if b.writable { "rw" } else { "ro" }
            )
        }))
        .collect();
    lines.sort();
    lines.push(format!("image {image_id}"));
    lines.push(format!("network {}", sandbox.network));
    lines.push(format!("workspace {}", sandbox.workspace_dir.is_some()));
    Sha256::of(lines.join("\n").as_bytes()).to_hex()
}

fn volume_name(sandbox: &str) -> String {
    format!("skillbox-ws-{sandbox}")
}

impl Docker {
    /// Connects to the local engine (`DOCKER_HOST` or `/var/run/docker.sock`), negotiates the
    /// API version, checks the image, and adopts or removes this owner's containers.
    pub async fn connect(cfg: DockerConfig) -> Result<Self, BoxError> {
        let engine = Engine::connect_with_local_defaults()
            .map_err(|e| engine_error("cannot connect to the engine", e))?
            .negotiate_version()
            .await
            .map_err(|e| engine_error("the engine does not answer", e))?;
        let api_version = engine
            .version()
            .await
            .map_err(|e| engine_error("version", e))?
            .api_version
            .unwrap_or_default();
        let image = engine.inspect_image(&cfg.image).await.map_err(|e| {
            BoxError::Unavailable(format!(
                "docker: image {:?} is not in the engine ({e}); build or load it first \
(the tests build one with scripts/docker-test-image)",
                cfg.image
            ))
        })?;
        let image_id = image.id.unwrap_or_default();
        let d = Docker {
            engine,
            cfg,
            image_id,
            api_version,
            containers: Mutex::new(HashMap::new()),
            creating: Default::default(),
            known: Default::default(),
        };
        d.recover().await?;
        Ok(d)
    }

    pub fn api_version(&self) -> &str {
        &self.api_version
    }

    /// Whether the engine can make read-only bind mounts recursively read-only (API ≥ 1.44).
    pub fn recursive_read_only(&self) -> bool {
        api_pair(&self.api_version) >= (1, 44)
    }

    /// Containers of this owner, by id, with their labels.
    async fn owned(&self) -> Result<Vec<(String, HashMap<String, String>, String)>, BoxError> {
        let filters = HashMap::from([(
            "label".to_string(),
            vec![format!("{LABEL_OWNER}={}", self.cfg.owner)],
        )]);
        let list = self
            .engine
            .list_containers(Some(bollard::query_parameters::ListContainersOptions {
                all: true,
                filters: Some(filters),
                ..Default::default()
            }))
            .await
            .map_err(|e| engine_error("listing containers", e))?;
        Ok(list
            .into_iter()
            .filter_map(|c| {
                Some((
                    c.id?,
                    c.labels.unwrap_or_default(),
                    c.image_id.unwrap_or_default(),
                ))
            })
            .collect())
    }

    /// Restart recovery: adopt consistent, running containers of the configured image; remove
    /// the rest unless an exec is still running in them.
    async fn recover(&self) -> Result<(), BoxError> {
        for (id, labels, image_id) in self.owned().await? {
            let sandbox = labels.get(LABEL_SANDBOX).cloned().unwrap_or_default();
            let consistent = labels
                .get(LABEL_PACKAGES)
                .and_then(|p| serde_json::from_str::<Vec<(String, String)>>(p).ok())
                .is_some()
                && !sandbox.is_empty()
                && image_id == self.image_id;
            let running = self.is_running(&id).await;
            if consistent && running {
                let signature = labels.get(LABEL_SIGNATURE).cloned().unwrap_or_default();
                tracing::info!(container = %id, %sandbox, "adopted a sandbox container");
                self.known.lock().map_err(poisoned)?.insert(sandbox.clone());
                self.containers.lock().map_err(poisoned)?.insert(
                    id,
                    Container {
                        sandbox,
                        signature,
                        leases: 0,
                        retired: false,
                    },
                );
            } else if !self.exec_running(&id).await {
                tracing::warn!(container = %id, "removing an inconsistent or stopped sandbox container");
                self.remove_container(&id).await;
            }
        }
        Ok(())
    }

    async fn is_running(&self, container: &str) -> bool {
        self.engine
            .inspect_container(container, None)
            .await
            .ok()
            .and_then(|c| c.state.and_then(|s| s.running))
            .unwrap_or(false)
    }

    async fn exec_running(&self, container: &str) -> bool {
        let Ok(c) = self.engine.inspect_container(container, None).await else {
            return false;
        };
        for exec in c.exec_ids.unwrap_or_default() {
            if let Ok(e) = self.engine.inspect_exec(&exec).await
                && e.running == Some(true)
            {
                return true;
            }
        }
        false
    }

    async fn remove_container(&self, id: &str) {
        let r = self
            .engine
            .remove_container(
                id,
                Some(bollard::query_parameters::RemoveContainerOptions {
                    force: true,
                    ..Default::default()
                }),
            )
            .await;
        if let Err(e) = r {
            tracing::warn!(container = %id, error = %e, "cannot remove a sandbox container");
        }
    }

    async fn create(&self, sandbox: &Sandbox, signature: &str) -> Result<String, BoxError> {
        let mut mounts: Vec<EngineMount> = sandbox
            .mounts
            .iter()
            .map(|m| EngineMount {
                target: Some(m.target.clone()),
                source: Some(m.source.display().to_string()),
                typ: Some(MountType::BIND),
                read_only: Some(true),
                ..Default::default()
            })
            .collect();
        mounts.extend(sandbox.binds.iter().map(|b| EngineMount {
            target: Some(b.target.clone()),
            source: Some(b.source.display().to_string()),
            typ: Some(MountType::BIND),
            read_only: Some(!b.writable),
            ..Default::default()
        }));
        let mut labels = HashMap::from([
            (LABEL_OWNER.to_string(), self.cfg.owner.clone()),
            (LABEL_SANDBOX.to_string(), sandbox.id.clone()),
            (LABEL_SIGNATURE.to_string(), signature.to_string()),
            (
                LABEL_LEASE.to_string(),
                format!("pid-{}", std::process::id()),
            ),
        ]);
        let packages: Vec<(String, String)> = sandbox
            .mounts
            .iter()
            .map(|m| (m.target.clone(), m.digest.to_string()))
            .collect();
        labels.insert(
            LABEL_PACKAGES.to_string(),
            serde_json::to_string(&packages).unwrap_or_default(),
        );
        if sandbox.workspace_dir.is_some() {
            let volume = volume_name(&sandbox.id);
            self.engine
                .create_volume(bollard::models::VolumeCreateRequest {
                    name: Some(volume.clone()),
                    labels: Some(HashMap::from([
                        (LABEL_OWNER.to_string(), self.cfg.owner.clone()),
                        (LABEL_SANDBOX.to_string(), sandbox.id.clone()),
                    ])),
                    ..Default::default()
                })
                .await
                .map_err(|e| engine_error("creating the workspace volume", e))?;
            mounts.push(EngineMount {
                target: Some("/workspace".into()),
                source: Some(volume),
                typ: Some(MountType::VOLUME),
                read_only: Some(false),
                ..Default::default()
            });
        }
        let host = HostConfig {
            mounts: Some(mounts),
            readonly_rootfs: Some(true),
            tmpfs: Some(HashMap::from([(
                "/tmp".to_string(),
                "rw,nosuid,nodev,size=268435456".to_string(),
            )])),
            network_mode: Some(if sandbox.network { "bridge" } else { "none" }.into()),
            cap_drop: Some(vec!["ALL".into()]),
            security_opt: Some(vec!["no-new-privileges".into()]),
            pids_limit: Some(self.cfg.pids),
            memory: Some(self.cfg.memory_bytes),
            nano_cpus: Some(self.cfg.nano_cpus),
            init: Some(true),
            ..Default::default()
        };
        let body = ContainerCreateBody {
            image: Some(self.cfg.image.clone()),
            cmd: Some(vec!["sleep".into(), "infinity".into()]),
            user: Some(format!("{0}:{0}", self.cfg.uid)),
            labels: Some(labels),
            host_config: Some(host),
            network_disabled: Some(!sandbox.network),
            ..Default::default()
        };
        let created = self
            .engine
            .create_container(
                None::<bollard::query_parameters::CreateContainerOptions>,
                body,
            )
            .await
            .map_err(|e| engine_error("creating a sandbox container", e))?;
        if let Err(e) = self.engine.start_container(&created.id, None).await {
            self.remove_container(&created.id).await;
            return Err(engine_error("starting a sandbox container", e));
        }
        Ok(created.id)
    }

    /// Removes containers that are retired and unleased.
    async fn reap(&self) {
        let idle: Vec<String> = match self.containers.lock() {
            Ok(mut c) => {
                let ids: Vec<String> = c
                    .iter()
                    .filter(|(_, e)| e.retired && e.leases == 0)
                    .map(|(id, _)| id.clone())
                    .collect();
                for id in &ids {
                    c.remove(id);
                }
                ids
            }
            Err(_) => return,
        };
        for id in idle {
            self.remove_container(&id).await;
        }
    }

    /// Kills the exec's process group from the host.
    async fn kill_exec(&self, exec_id: &str) {
        if let Ok(e) = self.engine.inspect_exec(exec_id).await
            && let Some(pid) = e.pid.filter(|p| *p > 1)
        {
            let pid = nix::unistd::Pid::from_raw(pid as i32);
            let _ = nix::sys::signal::killpg(pid, nix::sys::signal::Signal::SIGKILL);
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
        }
    }

    async fn run_exec(
        &self,
        lease: &Lease,
        req: ExecRequest,
        kill: tokio::sync::oneshot::Receiver<()>,
    ) -> Result<ExecResult, BoxError> {
        if !req.cwd.starts_with('/') {
            return Err(BoxError::BadRequest(format!(
                "cwd must be an absolute path inside the sandbox, not {:?}",
                req.cwd
            )));
        }
        let cmd: Vec<String> = match &req.program {
            Program::Argv(v) if v.is_empty() => {
                return Err(BoxError::BadRequest("argv is empty".into()));
            }
            Program::Argv(v) => v.clone(),
            Program::Shell(c) => vec!["/bin/sh".into(), "-c".into(), c.clone()],
        };
        let mut env = req.env.clone();
        env.entry("PATH".into())
            .or_insert_with(|| "/usr/local/bin:/usr/bin:/bin".into());
        env.entry("HOME".into()).or_insert_with(|| {
            if lease.sandbox.workspace_dir.is_some() {
                "/workspace".into()
            } else {
                "/tmp".into()
            }
        });
        env.entry("TMPDIR".into()).or_insert_with(|| "/tmp".into());
        env.entry("LANG".into()).or_insert_with(|| "C.UTF-8".into());
        let start = Instant::now();
        let exec = self
            .engine
            .create_exec(
                &lease.handle,
                CreateExecOptions {
                    cmd: Some(cmd),
                    env: Some(env.iter().map(|(k, v)| format!("{k}={v}")).collect()),
                    working_dir: Some(req.cwd.clone()),
                    user: Some(format!("{0}:{0}", self.cfg.uid)),
                    attach_stdin: Some(req.stdin.is_some()),
                    attach_stdout: Some(true),
                    attach_stderr: Some(true),
                    ..Default::default()
                },
            )
            .await
            .map_err(|e| engine_error("creating an exec", e))?;
        let started = self
            .engine
            .start_exec(&exec.id, None)
            .await
            .map_err(|e| engine_error("starting an exec", e))?;
        let StartExecResults::Attached {
            mut output,
            mut input,
        } = started
        else {
            return Err(BoxError::Unavailable(
                "docker: exec started detached".into(),
            ));
        };
        if let Some(data) = req.stdin {
            tokio::spawn(async move {
                let _ = input.write_all(&data).await;
                let _ = input.shutdown().await;
            });
        } else {
            drop(input);
        }
        let mut out = Capped::new(req.output_cap, req.live.clone(), StreamKind::Stdout);
        let mut err = Capped::new(req.output_cap, req.live.clone(), StreamKind::Stderr);
        let deadline = tokio::time::sleep(req.timeout);
        tokio::pin!(deadline);
        let mut kill = kill;
        let mut ended_by = None;
        loop {
            tokio::select! {
                chunk = output.next() => match chunk {
                    Some(Ok(bollard::container::LogOutput::StdOut { message })) => out.push(&message),
                    Some(Ok(bollard::container::LogOutput::StdErr { message })) => err.push(&message),
                    Some(Ok(_)) => {}
                    Some(Err(_)) | None => break,
                },
                _ = &mut deadline, if ended_by.is_none() => {
                    ended_by = Some(Outcome::TimedOut);
                    self.kill_exec(&exec.id).await;
                }
                Ok(()) = &mut kill, if ended_by.is_none() => {
                    ended_by = Some(Outcome::Killed);
                    self.kill_exec(&exec.id).await;
                }
            }
        }
        let mut exit_code = None;
        for _ in 0..50 {
            match self.engine.inspect_exec(&exec.id).await {
                Ok(e) if e.running == Some(false) => {
                    exit_code = e.exit_code.map(|c| c as i32);
                    break;
                }
                Ok(_) => tokio::time::sleep(std::time::Duration::from_millis(10)).await,
                Err(e) => return Err(engine_error("inspecting an exec", e)),
            }
        }
        let outcome = match (ended_by, exit_code) {
            (Some(o), _) => o,
            // 126/127: the engine could not start the program (not found, not executable).
            (None, Some(_)) => Outcome::Exited,
            (None, None) => Outcome::SandboxFailure,
        };
        Ok(ExecResult {
            outcome,
            exit_code: if ended_by.is_some() { None } else { exit_code },
            signal: None,
            timed_out: outcome == Outcome::TimedOut,
            stdout_truncated: out.truncated,
            stderr_truncated: err.truncated,
            stdout: out.kept,
            stderr: err.kept,
            duration_ms: start.elapsed().as_millis() as u64,
        })
    }
}

fn poisoned<T>(_: T) -> BoxError {
    BoxError::Unavailable("docker backend state is poisoned".into())
}

/// One output stream: keeps `cap` bytes, forwards what it keeps to the live sink.
struct Capped {
    kept: Vec<u8>,
    truncated: bool,
    cap: usize,
    live: Option<OutputSink>,
    kind: StreamKind,
}

impl Capped {
    fn new(cap: usize, live: Option<OutputSink>, kind: StreamKind) -> Self {
        Capped {
            kept: Vec::new(),
            truncated: false,
            cap,
            live,
            kind,
        }
    }

    fn push(&mut self, data: &[u8]) {
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

impl Backend for Docker {
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            backend: "docker",
            immutable: true,
        }
    }

    fn system_identity(&self) -> String {
        format!("docker-image {}", self.image_id)
    }

    /// Host directories bound writable (environment builds). The workspace itself is a
    /// volume; its host directory stays empty.
    fn prepare_writable_dir(&self, dir: &Path) -> Result<(), BoxError> {
        crate::writable_dir(dir, self.cfg.uid)
    }

    fn acquire<'a>(&'a self, sandbox: &'a Sandbox) -> BoxFuture<'a, Lease> {
        Box::pin(async move {
            let signature = signature(sandbox, &self.image_id);
            let gate = {
                let mut g = self.creating.lock().await;
                g.entry(sandbox.id.clone()).or_default().clone()
            };
            let _one_at_a_time = gate.lock().await;
            let chosen = {
                let mut c = self.containers.lock().map_err(poisoned)?;
                let mut chosen = None;
                for (id, e) in c.iter_mut() {
                    if e.sandbox != sandbox.id {
                        continue;
                    }
                    if e.signature == signature && !e.retired && chosen.is_none() {
                        e.leases += 1;
                        chosen = Some(id.clone());
                    } else if e.signature != signature {
                        e.retired = true;
                    }
                }
                chosen
            };
            // A container that died (box restart, OOM of its init, `docker kill`) is not used:
            // it is dropped and a fresh one made on the same workspace volume.
            let chosen = match chosen {
                Some(id) if !self.is_running(&id).await => {
                    tracing::warn!(container = %id, sandbox = %sandbox.id, "sandbox container is not running; replacing it");
                    self.containers.lock().map_err(poisoned)?.remove(&id);
                    self.remove_container(&id).await;
                    None
                }
                other => other,
            };
            let handle = match chosen {
                Some(id) => id,
                None => {
                    let id = self.create(sandbox, &signature).await?;
                    self.known
                        .lock()
                        .map_err(poisoned)?
                        .insert(sandbox.id.clone());
                    self.containers.lock().map_err(poisoned)?.insert(
                        id.clone(),
                        Container {
                            sandbox: sandbox.id.clone(),
                            signature,
                            leases: 1,
                            retired: false,
                        },
                    );
                    id
                }
            };
            self.reap().await;
            Ok(Lease {
                sandbox: sandbox.clone(),
                handle,
            })
        })
    }

    /// The container's packages are its bind mounts, fixed at creation: the mount set its
    /// signature was computed from.
    fn prepared<'a>(&'a self, lease: &'a Lease) -> BoxFuture<'a, BTreeMap<String, Digest>> {
        Box::pin(async move {
            Ok(lease
                .sandbox
                .mounts
                .iter()
                .map(|m| (m.target.clone(), m.digest))
                .collect())
        })
    }

    fn prepare<'a>(&'a self, _lease: &'a Lease, mount: &'a Mount) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            Err(BoxError::Unavailable(format!(
                "docker: {} is not bound in the container; copy mode is not built for docker yet",
                mount.target
            )))
        })
    }

    fn exec<'a>(
        &'a self,
        lease: &'a Lease,
        req: ExecRequest,
        kill: tokio::sync::oneshot::Receiver<()>,
    ) -> ExecFuture<'a> {
        Box::pin(self.run_exec(lease, req, kill))
    }

    /// The last lease of a retired container removes it; so does the end of the box's own
    /// one-shot sandboxes (no workspace: probes, environment builds).
    fn release(&self, lease: Lease) {
        let one_shot = lease.sandbox.workspace_dir.is_none();
        let reap = match self.containers.lock() {
            Ok(mut c) => match c.get_mut(&lease.handle) {
                Some(e) => {
                    e.leases = e.leases.saturating_sub(1);
                    e.retired |= one_shot;
                    e.retired && e.leases == 0
                }
                None => false,
            },
            Err(_) => false,
        };
        if reap && let Ok(mut c) = self.containers.lock() {
            c.remove(&lease.handle);
            let engine = self.engine.clone();
            let id = lease.handle.clone();
            tokio::spawn(async move {
                let _ = engine
                    .remove_container(
                        &id,
                        Some(bollard::query_parameters::RemoveContainerOptions {
                            force: true,
                            ..Default::default()
                        }),
                    )
                    .await;
            });
        }
    }

    fn destroy(&self, id: &str, workspace_dir: Option<&Path>) -> Result<(), BoxError> {
        if let Some(dir) = workspace_dir {
            skillbox_package::staging::remove_tree(dir)?;
        }
        let ids: Vec<String> = {
            let mut c = self.containers.lock().map_err(poisoned)?;
            let ids: Vec<String> = c
                .iter()
                .filter(|(_, e)| e.sandbox == id)
                .map(|(k, _)| k.clone())
                .collect();
            for k in &ids {
                c.remove(k);
            }
            ids
        };
        self.known.lock().map_err(poisoned)?.remove(id);
        let engine = self.engine.clone();
        let volume = volume_name(id);
        // Called from a blocking context: the removal runs on the runtime, in order.
        let handle = tokio::runtime::Handle::try_current()
            .map_err(|e| BoxError::Unavailable(format!("no runtime: {e}")))?;
        handle.block_on(async move {
            for c in ids {
                let _ = engine
                    .remove_container(
                        &c,
                        Some(bollard::query_parameters::RemoveContainerOptions {
                            force: true,
                            ..Default::default()
                        }),
                    )
                    .await;
            }
            let _ = engine
                .remove_volume(
                    &volume,
                    Some(bollard::query_parameters::RemoveVolumeOptions { force: true }),
                )
                .await;
        });
        Ok(())
    }

    fn sandboxes(&self) -> Vec<String> {
        self.known
            .lock()
            .map(|k| k.iter().cloned().collect())
            .unwrap_or_default()
    }
}
