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

mod containers;
mod copy;
mod exec;

use containers::{packages_volume, remove_container, remove_volume, signature, volume_name};
use copy::{READY_DIR, marker_key};

use crate::{
    Backend, BoxError, BoxFuture, Capabilities, Capped, ExecFuture, ExecRequest, ExecResult, Lease,
    Mount, Outcome, Sandbox, StreamKind, poisoned,
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
/// On the box's own one-shot containers (probes, environment builds): never a run's sandbox,
/// so never released by the sweep of ended runs, and removed (not adopted) after a restart.
const LABEL_INTERNAL: &str = "skillbox.internal";

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
    /// Size of the sandbox's `/tmp` tmpfs, bytes.
    pub tmp_bytes: u64,
    /// Quota of the sandbox's `/workspace` volume, bytes (an ext4 image on a loop device; 0:
    /// a plain volume).
    pub workspace_bytes: u64,
    /// Copy mode: packages are uploaded into a per-sandbox volume at `/skills` and verified
    /// inside the container instead of bound from the revision cache.
    pub copy_mode: bool,
    /// Fault tests (the `failpoints` feature): a fault (`truncate`, `flip`, `missing`,
    /// `extra`, `crash`) to inject into the next copy-mode transfer.
    pub failpoint: crate::failpoint::Failpoint,
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
            tmp_bytes: crate::bwrap::DEFAULT_TMP_BYTES,
            workspace_bytes: crate::bwrap::DEFAULT_WORKSPACE_BYTES,
            copy_mode: false,
            failpoint: crate::failpoint::Failpoint::none(),
        }
    }
}

/// A container this process knows about.
#[derive(Debug)]
struct Container {
    sandbox: String,
    signature: String,
    /// The run's packages when it was made, (target, digest) sorted: a run's pins only grow,
    /// so a container with another set is an older one.
    packages: Vec<(String, String)>,
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
            let signature = signature(sandbox, &self.image_id, !self.cfg.copy_mode);
            let wanted = package_list(sandbox);
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
                    } else if !self.cfg.copy_mode && superseded(&e.packages, &wanted) {
                        // The run has activated more since. A sibling with the same packages
                        // but another environment mounted is kept for the executions that
                        // need it, and so is one with more packages than asked for (a
                        // workspace transfer mounts none). Copy mode prepares new packages
                        // into the same container instead.
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
                    // Only a run's sandbox (it has a workspace) is the sweep's to release: a
                    // one-shot build container listed here would be destroyed mid-build.
                    if sandbox.workspace_dir.is_some() {
                        self.known
                            .lock()
                            .map_err(poisoned)?
                            .insert(sandbox.id.clone());
                    }
                    self.containers.lock().map_err(poisoned)?.insert(
                        id.clone(),
                        Container {
                            sandbox: sandbox.id.clone(),
                            signature,
                            packages: wanted,
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
            if self.cfg.copy_mode {
                return self.prepared_copies(lease).await;
            }
            Ok(lease
                .sandbox
                .mounts
                .iter()
                .map(|m| (m.target.clone(), m.digest))
                .collect())
        })
    }

    fn prepare<'a>(&'a self, lease: &'a Lease, mount: &'a Mount) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            if self.cfg.copy_mode {
                return self.prepare_copy(lease, mount).await;
            }
            Err(BoxError::Unavailable(format!(
                "docker: {} is not bound in the container",
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
        let user = format!("{0}:{0}", self.cfg.uid);
        Box::pin(async move {
            self.run_exec_as(
                &lease.handle,
                &user,
                lease.sandbox.workspace_dir.is_some(),
                req,
                kill,
            )
            .await
        })
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
            tokio::spawn(async move { remove_container(&engine, &id).await });
        }
    }

    fn destroy(&self, id: &str, workspace_dir: Option<&Path>) -> Result<(), BoxError> {
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
        self.creating.blocking_lock().remove(id);
        let engine = self.engine.clone();
        let volume = volume_name(id);
        let packages = packages_volume(id);
        // Called from a blocking context: the removal runs on the runtime, in order.
        let handle = tokio::runtime::Handle::try_current()
            .map_err(|e| BoxError::Unavailable(format!("no runtime: {e}")))?;
        handle.block_on(async move {
            for c in ids {
                remove_container(&engine, &c).await;
            }
            for v in [volume, packages] {
                if let Err(e) = remove_volume(&engine, &v).await {
                    tracing::warn!(volume = %v, error = %e, "cannot remove a sandbox volume");
                }
            }
        });
        // The volume is gone, so its loop device is free: then the image and directory.
        if let Some(dir) = workspace_dir {
            crate::workspace::remove(dir)?;
        }
        Ok(())
    }

    /// Copy mode: the package is removed from every container's packages volume (marker
    /// first, so it is never seen ready half-removed).
    fn discard<'a>(&'a self, target: &'a str) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            if !self.cfg.copy_mode {
                return Ok(());
            }
            let ids: Vec<String> = self
                .containers
                .lock()
                .map_err(poisoned)?
                .keys()
                .cloned()
                .collect();
            let env = BTreeMap::from([
                ("T".to_string(), target.to_string()),
                ("K".to_string(), marker_key(target)),
                ("READY_DIR".to_string(), READY_DIR.to_string()),
            ]);
            for id in ids {
                let r = self
                    .command(
                        &id,
                        "0:0",
                        r#"rm -f "$READY_DIR/$K"; [ -e "$T" ] || exit 0; chmod -R u+w "$T"; rm -rf "$T""#,
                        env.clone(),
                        vec![],
                    )
                    .await;
                if let Err(e) = r {
                    tracing::warn!(container = %id, error = %e, "cannot discard a revoked package");
                }
            }
            Ok(())
        })
    }

    fn environment_volumes(&self) -> bool {
        true
    }

    fn env_volume_name(&self, key: &str) -> String {
        format!("skillbox-env-{}-{key}", self.cfg.owner)
    }

    fn create_env_volume<'a>(&'a self, name: &'a str) -> BoxFuture<'a, ()> {
        Box::pin(self.create_volume(name, "environments"))
    }

    fn remove_env_volume<'a>(&'a self, name: &'a str) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            // The one-shot containers that used it (a readiness check, a failed build) are
            // removed in the background: an "in use" answer is waited out briefly.
            let mut attempts = 0;
            loop {
                match remove_volume(&self.engine, name).await {
                    Ok(()) => return Ok(()),
                    Err(bollard::errors::Error::DockerResponseServerError {
                        status_code: 409,
                        ..
                    }) if attempts < 50 => {
                        attempts += 1;
                        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    }
                    Err(e) => return Err(engine_error("removing an environment volume", e)),
                }
            }
        })
    }

    fn sandboxes(&self) -> Vec<String> {
        self.known
            .lock()
            .map(|k| k.iter().cloned().collect())
            .unwrap_or_default()
    }
}

/// The sandbox's packages as (target, digest), sorted.
fn package_list(sandbox: &Sandbox) -> Vec<(String, String)> {
    sorted(
        sandbox
            .mounts
            .iter()
            .map(|m| (m.target.clone(), m.digest.to_string()))
            .collect(),
    )
}

/// Whether a container made for `old` is outdated by a run now needing `new`: its packages
/// are a strict subset (a run's pins only grow).
fn superseded(old: &[(String, String)], new: &[(String, String)]) -> bool {
    old.len() < new.len() && old.iter().all(|p| new.contains(p))
}

fn sorted(mut v: Vec<(String, String)>) -> Vec<(String, String)> {
    v.sort();
    v
}
