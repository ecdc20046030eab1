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
    /// Tests only: a file naming a fault (`truncate`, `flip`, `missing`, `extra`, `crash`) to
    /// inject into the next copy-mode transfer (consumed).
    pub failpoint: Option<std::path::PathBuf>,
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
            failpoint: None,
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

/// What the signature covers: every package (target, digest, ro), every other bind (target,
/// source, mode), the image, the network flag and the workspace.
/// In copy mode packages are not part of the container (they are prepared into its volume),
/// so they are not part of the signature either.
fn signature(sandbox: &Sandbox, image_id: &str, bound_packages: bool) -> String {
    let mut lines: Vec<String> = sandbox
        .mounts
        .iter()
        .filter(|_| bound_packages)
        .map(|m| format!("pkg {} {} ro", m.target, m.digest))
        .chain(sandbox.binds.iter().map(|b| {
            format!(
                "bind {} {} {}",
                b.target,
                b.source,
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

/// Copy mode: the volume the sandbox's packages are prepared into (mounted at `/skills`).
fn packages_volume(sandbox: &str) -> String {
    format!("skillbox-pk-{sandbox}")
}

/// Copy mode: where the ready marker of `target` is (`target digest`, written last).
const READY_DIR: &str = "/skills/.ready";

/// Verifies the staged package in `$S` against the manifest on stdin (`<hex>  ./<path>`
/// lines, then `x ./<path>` lines naming the executables): every file's SHA-256, no file
/// missing or extra, nothing but files and directories, the executable bits. Then makes it
/// read-only, moves anything at `$T` aside (never changed in place), renames it into place and
/// writes the ready marker last.
const PREPARE_SCRIPT: &str = r#"set -e
m=/tmp/.skillbox-m.$$
cat > "$m"
cd "$S"
grep -v '^x ' "$m" > "$m.sha" || true
sha256sum -c --quiet --strict "$m.sha" >/dev/null 2>&1 || { echo "content differs from the manifest" >&2; exit 4; }
find . -type f | sort > "$m.have"
sed 's/^[0-9a-f]*  //' "$m.sha" | sort > "$m.want"
cmp -s "$m.have" "$m.want" || { echo "files differ from the manifest" >&2; exit 4; }
[ -z "$(find . ! -type f ! -type d)" ] || { echo "not only files and directories" >&2; exit 4; }
find . -type f -perm -u+x | sort > "$m.xhave"
{ grep '^x ' "$m" || true; } | sed 's/^x //' | sort > "$m.xwant"
cmp -s "$m.xhave" "$m.xwant" || { echo "executable bits differ from the manifest" >&2; exit 4; }
# Files read-only; directories stay writable by their owner (root) only, which a rename
# across directories needs (it rewrites the directory's `..`).
find . -type f -exec chmod a-w {} +
chmod -R go-w .
cd /
mkdir -p "$(dirname "$T")" "$READY_DIR"
rm -f "$READY_DIR/$K"
if [ -e "$T" ]; then a="/skills/.stale-$$"; mv "$T" "$a"; chmod -R u+w "$a"; rm -rf "$a"; fi
mv "$S" "$T"
echo "$T $D" > "$READY_DIR/$K.tmp"
mv "$READY_DIR/$K.tmp" "$READY_DIR/$K"
rm -f "$m" "$m".*
"#;

/// Lists the ready packages (`<target> <digest>` from the markers) and re-verifies each one
/// named on stdin (`<target>\t<hex>\t<path>` lines) against its manifest: prints `ok <target>
/// <digest>` for a verified one, `extra <target> <digest>` for a marker outside the list.
const PREPARED_SCRIPT: &str = r#"m=/tmp/.skillbox-v.$$
cat > "$m"
for f in "$READY_DIR"/*; do
  [ -f "$f" ] || continue
  read -r t d < "$f" || continue
  if ! grep -q "^$t	" "$m"; then echo "extra $t $d"; continue; fi
  grep "^$t	" "$m" | awk -F'	' '{print $2"  ./"$3}' > "$m.sha"
  ( cd "$t" 2>/dev/null && sha256sum -c --quiet --strict "$m.sha" >/dev/null 2>&1     && [ "$(find . -type f | wc -l)" = "$(wc -l < "$m.sha")" ] ) && echo "ok $t $d"
done
rm -f "$m" "$m".*
"#;

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
            let packages = labels
                .get(LABEL_PACKAGES)
                .and_then(|p| serde_json::from_str::<Vec<(String, String)>>(p).ok());
            let internal = labels.contains_key(LABEL_INTERNAL);
            let consistent =
                packages.is_some() && !sandbox.is_empty() && !internal && image_id == self.image_id;
            let running = self.is_running(&id).await;
            if consistent && running {
                let signature = labels.get(LABEL_SIGNATURE).cloned().unwrap_or_default();
                tracing::info!(container = %id, %sandbox, "adopted a sandbox container");
                if self.cfg.copy_mode {
                    // Uploads abandoned by the previous process.
                    let swept = self
                        .command(
                            &id,
                            "0:0",
                            "chmod -R u+w /skills/.staging 2>/dev/null; rm -rf /skills/.staging",
                            BTreeMap::new(),
                            vec![],
                        )
                        .await;
                    if let Err(e) = swept {
                        tracing::warn!(container = %id, error = %e, "cannot sweep abandoned staging");
                    }
                }
                self.known.lock().map_err(poisoned)?.insert(sandbox.clone());
                self.containers.lock().map_err(poisoned)?.insert(
                    id,
                    Container {
                        sandbox,
                        signature,
                        packages: sorted(packages.unwrap_or_default()),
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
        remove_container(&self.engine, id).await
    }

    async fn create(&self, sandbox: &Sandbox, signature: &str) -> Result<String, BoxError> {
        let mut mounts: Vec<EngineMount> = sandbox
            .mounts
            .iter()
            .filter(|_| !self.cfg.copy_mode)
            .map(|m| self.bind(&m.source, &m.target, false))
            .collect();
        for b in &sandbox.binds {
            mounts.push(match &b.source {
                crate::BindSource::Host(p) => self.bind(p, &b.target, b.writable),
                crate::BindSource::Volume(v) => EngineMount {
                    target: Some(b.target.clone()),
                    source: Some(v.clone()),
                    typ: Some(MountType::VOLUME),
                    read_only: Some(!b.writable),
                    ..Default::default()
                },
            });
        }
        let mut labels = HashMap::from([
            (LABEL_OWNER.to_string(), self.cfg.owner.clone()),
            (LABEL_SANDBOX.to_string(), sandbox.id.clone()),
            (LABEL_SIGNATURE.to_string(), signature.to_string()),
            (
                LABEL_LEASE.to_string(),
                format!("pid-{}", std::process::id()),
            ),
        ]);
        if sandbox.workspace_dir.is_none() {
            labels.insert(LABEL_INTERNAL.to_string(), "true".to_string());
        }
        let packages = package_list(sandbox);
        labels.insert(
            LABEL_PACKAGES.to_string(),
            serde_json::to_string(&packages).unwrap_or_default(),
        );
        if self.cfg.copy_mode {
            let volume = packages_volume(&sandbox.id);
            self.create_volume(&volume, &sandbox.id).await?;
            mounts.push(EngineMount {
                target: Some("/skills".into()),
                source: Some(volume),
                typ: Some(MountType::VOLUME),
                read_only: Some(false),
                ..Default::default()
            });
        }
        if let Some(dir) = &sandbox.workspace_dir {
            let volume = volume_name(&sandbox.id);
            self.create_workspace_volume(&volume, &sandbox.id, dir)
                .await?;
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
                format!("rw,nosuid,nodev,size={}", self.cfg.tmp_bytes),
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
        // A fresh volume's root belongs to root; the sandbox user writes into the writable
        // ones (environment builds). Root owns it, so it may chmod it without capabilities.
        for b in sandbox.binds.iter().filter(|b| b.writable) {
            if let crate::BindSource::Volume(_) = b.source {
                let r = self
                    .command(
                        &created.id,
                        "0:0",
                        r#"chmod 0777 "$T""#,
                        BTreeMap::from([("T".to_string(), b.target.clone())]),
                        vec![],
                    )
                    .await?;
                if r.exit_code != Some(0) {
                    self.remove_container(&created.id).await;
                    return Err(BoxError::Unavailable(format!(
                        "docker: cannot open {} to the sandbox user: {}",
                        b.target,
                        r.failure()
                    )));
                }
            }
        }
        Ok(created.id)
    }

    /// A bind mount; read-only ones are made recursively read-only where the engine can
    /// (API ≥ 1.44 fails rather than silently downgrading). Package trees have no submounts,
    /// so on older engines a plain read-only bind is read-only all the way down.
    fn bind(&self, source: &Path, target: &str, writable: bool) -> EngineMount {
        EngineMount {
            target: Some(target.to_string()),
            source: Some(source.display().to_string()),
            typ: Some(MountType::BIND),
            read_only: Some(!writable),
            bind_options: (!writable && self.recursive_read_only()).then(|| {
                bollard::models::MountBindOptions {
                    read_only_force_recursive: Some(true),
                    ..Default::default()
                }
            }),
            ..Default::default()
        }
    }

    async fn create_volume(&self, name: &str, sandbox: &str) -> Result<(), BoxError> {
        self.create_volume_with(name, sandbox, None).await
    }

    async fn create_volume_with(
        &self,
        name: &str,
        sandbox: &str,
        driver_opts: Option<HashMap<String, String>>,
    ) -> Result<(), BoxError> {
        self.engine
            .create_volume(bollard::models::VolumeCreateRequest {
                name: Some(name.to_string()),
                labels: Some(HashMap::from([
                    (LABEL_OWNER.to_string(), self.cfg.owner.clone()),
                    (LABEL_SANDBOX.to_string(), sandbox.to_string()),
                ])),
                driver_opts,
                ..Default::default()
            })
            .await
            .map_err(|e| engine_error("creating a volume", e))?;
        Ok(())
    }

    /// The workspace volume. With a quota it is the ext4 image beside the workspace's host
    /// directory, on a loop device (the engine's local driver mounts a block device but not an
    /// image file); a volume left on another device (the host restarted since) is made anew
    /// on the same image, so the workspace's files survive.
    async fn create_workspace_volume(
        &self,
        name: &str,
        sandbox: &str,
        dir: &Path,
    ) -> Result<(), BoxError> {
        if self.cfg.workspace_bytes == 0 {
            return self.create_volume(name, sandbox).await;
        }
        let (image, bytes, uid) = (
            crate::workspace::image_path(dir),
            self.cfg.workspace_bytes,
            self.cfg.uid,
        );
        let device = tokio::task::spawn_blocking(move || {
            crate::workspace::make_image(&image, bytes, uid)?;
            crate::workspace::attach(&image)
        })
        .await
        .map_err(|e| BoxError::Unavailable(format!("workspace image task failed: {e}")))??;
        if let Ok(v) = self.engine.inspect_volume(name).await {
            let current = v.options.get("device").cloned().unwrap_or_default();
            if current == device {
                return Ok(());
            }
            remove_volume(&self.engine, name)
                .await
                .map_err(|e| engine_error("replacing a workspace volume", e))?;
        }
        let opts = HashMap::from([
            ("type".to_string(), "ext4".to_string()),
            ("device".to_string(), device),
            ("o".to_string(), "nosuid,nodev".to_string()),
        ]);
        self.create_volume_with(name, sandbox, Some(opts)).await
    }

    /// Runs a box-internal command in a container as `user`.
    async fn command(
        &self,
        container: &str,
        user: &str,
        script: &str,
        env: BTreeMap<String, String>,
        stdin: Vec<u8>,
    ) -> Result<ExecResult, BoxError> {
        let req = ExecRequest {
            cwd: "/".into(),
            stdin: Some(stdin),
            timeout: std::time::Duration::from_secs(300),
            output_cap: 1 << 20,
            ..ExecRequest::shell(script, env)
        };
        let (_never, kill) = tokio::sync::oneshot::channel();
        self.run_exec_as(container, user, false, req, kill).await
    }

    fn take_failpoint(&self) -> Option<String> {
        crate::take_failpoint(self.cfg.failpoint.as_ref()?)
    }

    /// Copy mode: uploads the package as a tar into a fresh staging directory on the
    /// packages volume, then verifies and seals it inside the container (`PREPARE_SCRIPT`).
    async fn prepare_copy(&self, lease: &Lease, mount: &Mount) -> Result<(), BoxError> {
        let staging = format!(
            "/skills/.staging/{}",
            skillbox_package::staging::unique_name("")
        );
        let r = self
            .command(
                &lease.handle,
                "0:0",
                r#"mkdir -p /skills/.staging && mkdir "$S""#,
                BTreeMap::from([("S".to_string(), staging.clone())]),
                vec![],
            )
            .await?;
        if r.exit_code != Some(0) {
            return Err(BoxError::Unavailable(format!(
                "docker: cannot make a staging directory: {}",
                r.failure()
            )));
        }
        let (source, manifest) = (mount.source.clone(), mount.manifest.clone());
        let fault = self.take_failpoint();
        let tar =
            tokio::task::spawn_blocking(move || package_tar(&source, &manifest, fault.as_deref()))
                .await
                .map_err(|e| BoxError::Unavailable(format!("packing task failed: {e}")))??;
        let crash = tar.1;
        // The engine's answer is not trusted (it reports success for some failed uploads):
        // whatever arrived is verified next.
        let uploaded = self
            .engine
            .upload_to_container(
                &lease.handle,
                Some(bollard::query_parameters::UploadToContainerOptions {
                    path: staging.clone(),
                    ..Default::default()
                }),
                bollard::body_full(tar.0.into()),
            )
            .await;
        if let Err(e) = &uploaded {
            tracing::warn!(target = %mount.target, error = %e, "copy-mode upload failed");
        }
        if crash {
            return Err(BoxError::Unavailable(
                "package preparation was interrupted; nothing was executed".into(),
            ));
        }
        let mut listing = String::new();
        for e in mount.manifest.entries() {
            listing.push_str(&format!(
                "{}  ./{}
",
                e.sha256.to_hex(),
                e.path
            ));
        }
        for e in mount.manifest.entries().iter().filter(|e| e.executable) {
            listing.push_str(&format!(
                "x ./{}
",
                e.path
            ));
        }
        let env = BTreeMap::from([
            ("S".to_string(), staging.clone()),
            ("T".to_string(), mount.target.clone()),
            ("K".to_string(), marker_key(&mount.target)),
            ("D".to_string(), mount.digest.to_string()),
            ("READY_DIR".to_string(), READY_DIR.to_string()),
        ]);
        let r = self
            .command(
                &lease.handle,
                "0:0",
                PREPARE_SCRIPT,
                env,
                listing.into_bytes(),
            )
            .await?;
        if r.exit_code != Some(0) {
            let _ = self
                .command(
                    &lease.handle,
                    "0:0",
                    r#"chmod -R u+w "$S" 2>/dev/null; rm -rf "$S""#,
                    BTreeMap::from([("S".to_string(), staging)]),
                    vec![],
                )
                .await;
            return Err(BoxError::Unavailable(format!(
                "the copy of {} failed verification in the container ({}); nothing was executed — retry",
                mount.target,
                r.failure()
            )));
        }
        Ok(())
    }

    /// Copy mode: the verified ready packages of the container, and any marker outside the set.
    async fn prepared_copies(&self, lease: &Lease) -> Result<BTreeMap<String, Digest>, BoxError> {
        let mut listing = String::new();
        for m in &lease.sandbox.mounts {
            for e in m.manifest.entries() {
                listing.push_str(&format!(
                    "{}	{}	{}
",
                    m.target,
                    e.sha256.to_hex(),
                    e.path
                ));
            }
        }
        let env = BTreeMap::from([("READY_DIR".to_string(), READY_DIR.to_string())]);
        let uid = format!("{0}:{0}", self.cfg.uid);
        let out = self
            .command(
                &lease.handle,
                &uid,
                PREPARED_SCRIPT,
                env,
                listing.into_bytes(),
            )
            .await?
            .stdout;
        let mut ready = BTreeMap::new();
        for line in String::from_utf8_lossy(&out).lines() {
            let mut it = line.split(' ');
            if let (Some(_), Some(target), Some(digest)) = (it.next(), it.next(), it.next())
                && let Ok(d) = digest.parse::<Digest>()
            {
                ready.insert(target.to_string(), d);
            }
        }
        Ok(ready)
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

    /// The host pid of a running exec's first process: the leader of its process group.
    async fn exec_pid(&self, exec_id: &str) -> Option<i32> {
        let e = self.engine.inspect_exec(exec_id).await.ok()?;
        e.pid.filter(|p| *p > 1).map(|p| p as i32)
    }

    /// Kills the exec's process group from the host: the processes whose process group is
    /// the exec's leader's pid *and* that live in this container's cgroup. The pid alone is
    /// not enough: once the group is empty the kernel may give that pid to a new process —
    /// another container's exec leader, say — and a bare `killpg` would kill it.
    fn kill_group(pid: Option<i32>, container: &str) {
        let Some(group) = pid else {
            return;
        };
        // A member may fork while we look: look again until none is left (bounded).
        for _ in 0..5 {
            let members = group_members_in(group, container);
            if members.is_empty() {
                return;
            }
            for p in members {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(p),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
    }

    async fn run_exec_as(
        &self,
        container: &str,
        user: &str,
        workspace: bool,
        req: ExecRequest,
        kill: tokio::sync::oneshot::Receiver<()>,
    ) -> Result<ExecResult, BoxError> {
        let cmd = req.command_line()?;
        let env = req.environment(workspace);
        let start = Instant::now();
        let exec = self
            .engine
            .create_exec(
                container,
                CreateExecOptions {
                    cmd: Some(cmd),
                    env: Some(env.iter().map(|(k, v)| format!("{k}={v}")).collect()),
                    working_dir: Some(req.cwd.clone()),
                    user: Some(user.to_string()),
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
        // As with bwrap, an execution's processes end with it: background children still in
        // its process group are killed when it ends (and on timeout or revocation). Its host
        // pid is asked of the engine only when needed.
        let mut group = None;
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
                    if group.is_none() { group = self.exec_pid(&exec.id).await; }
                    Self::kill_group(group, container);
                }
                Ok(()) = &mut kill, if ended_by.is_none() => {
                    ended_by = Some(Outcome::Killed);
                    if group.is_none() { group = self.exec_pid(&exec.id).await; }
                    Self::kill_group(group, container);
                }
            }
        }
        // One inspection gives both the process group to clean up and, once the exec has
        // ended, its exit code.
        let mut exit_code = None;
        for attempt in 0..50 {
            let e = self
                .engine
                .inspect_exec(&exec.id)
                .await
                .map_err(|e| engine_error("inspecting an exec", e))?;
            if attempt == 0 {
                group = group.or(e.pid.filter(|p| *p > 1).map(|p| p as i32));
                Self::kill_group(group, container);
            }
            if e.running == Some(false) {
                exit_code = e.exit_code.map(|c| c as i32);
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
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

/// Force-removes a container (running or not); a failure is logged.
async fn remove_container(engine: &Engine, id: &str) {
    let r = engine
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

/// Host processes in process group `group` whose cgroup names `container` (its full id).
fn group_members_in(group: i32, container: &str) -> Vec<i32> {
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return vec![];
    };
    procs
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|p| {
            // `pid (comm) state ppid pgrp …`: comm may hold spaces and parentheses.
            let stat = std::fs::read_to_string(format!("/proc/{p}/stat")).unwrap_or_default();
            let pgrp = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().nth(2))
                .and_then(|g| g.parse::<i32>().ok());
            pgrp == Some(group)
                && std::fs::read_to_string(format!("/proc/{p}/cgroup"))
                    .is_ok_and(|c| c.contains(container))
        })
        .collect()
}

/// Removes a volume; one that is already gone is not an error.
async fn remove_volume(engine: &Engine, name: &str) -> Result<(), bollard::errors::Error> {
    match engine
        .remove_volume(
            name,
            Some(bollard::query_parameters::RemoveVolumeOptions { force: true }),
        )
        .await
    {
        Err(bollard::errors::Error::DockerResponseServerError {
            status_code: 404, ..
        }) => Ok(()),
        other => other,
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

fn marker_key(target: &str) -> String {
    Sha256::of(target.as_bytes()).to_hex()[..32].to_string()
}

/// The package as a tar for upload, with a test fault injected if asked; `true` = simulate a
/// crash after the upload.
fn package_tar(
    source: &Path,
    manifest: &skillbox_package::Manifest,
    fault: Option<&str>,
) -> Result<(Vec<u8>, bool), BoxError> {
    let Some(fault) = fault else {
        let tar = skillbox_package::write::write_tar(
            Vec::new(),
            manifest,
            &skillbox_package::write::DirSource(source),
        )?;
        return Ok((tar, false));
    };
    let fault = Some(fault);
    let victim = manifest
        .entries()
        .iter()
        .max_by_key(|e| e.size)
        .map(|e| e.path.clone());
    let entries: Vec<skillbox_package::FileEntry> = manifest
        .entries()
        .iter()
        .filter(|e| !(fault == Some("missing") && Some(&e.path) == victim.as_ref()))
        .cloned()
        .collect();
    let mut b = tar::Builder::new(Vec::new());
    for e in &entries {
        let mut data = std::fs::read(source.join(&e.path))?;
        if fault == Some("flip")
            && Some(&e.path) == victim.as_ref()
            && let Some(x) = data.first_mut()
        {
            *x ^= 1;
        }
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(if e.executable { 0o755 } else { 0o644 });
        h.set_entry_type(tar::EntryType::Regular);
        h.set_mtime(0);
        b.append_data(&mut h, &e.path, &data[..])?;
    }
    if fault == Some("extra") {
        let data = b"#!/bin/sh\necho planted\n";
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(0o755);
        b.append_data(&mut h, "planted.sh", &data[..])?;
    }
    let mut bytes = b.into_inner()?;
    if fault == Some("truncate") {
        bytes.truncate(bytes.len() / 2);
    }
    Ok((bytes, fault == Some("crash")))
}
