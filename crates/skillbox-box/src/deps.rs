//! Dependency environments: a Python virtualenv for a package that has a `requirements.txt`.
//!
//! An environment is keyed by a hash of what determines its contents: the SHA-256 of the
//! package's `requirements.txt` (from its manifest, so two revisions with the same
//! requirements share one environment), the sandbox system (the backend's
//! [`Backend::system_identity`] and the interpreter's version, platform and ABI tag as
//! reported inside the sandbox) and the package index the operator configured. It lives at
//! `<root>/<key>/` on the host and at `/envs/<key>/` in every sandbox that activates it.
//!
//! A build runs inside the backend's sandbox (the build's code — pip, and any `setup.py` of
//! an sdist — is as untrusted as the skill), as the sandbox uid, with a fresh
//! `<root>/.build-*` directory bound writable at `/envs/<key>` (a venv records its absolute
//! path, so it is built where it will be mounted), the requirements file and a local wheel
//! directory bound read-only, and the network only when the index is a URL. Builds are
//! single-flight per key in this process, and never count against an execution's timeout.
//! When pip succeeds, the tree is handed to the server's uid, made read-only, synced, `READY`
//! is written last, and the directory is renamed into place: a half-built or interrupted
//! environment never has a `READY` and is never mounted. Abandoned builds are removed at
//! start; a directory in place without a valid `READY` is moved aside and rebuilt.
//!
//! Failpoint (the `failpoints` feature, see [`crate::failpoint`]): `<root>/FAILPOINT` containing `hang` makes the next build
//! stop after pip, before `READY`, and write `<root>/FAILPOINT.reached` — so a test can kill
//! the server in the middle of a build.

use crate::{Backend, Bind, BindSource, BoxError, ExecRequest, Mount, Outcome, Sandbox, run_once};
use skillbox_package::Sha256;
use skillbox_package::staging::{remove_tree, unique_name};
use std::collections::{BTreeMap, HashMap};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// The file of a package that asks for an environment.
pub const REQUIREMENTS: &str = "requirements.txt";
/// Where environments appear inside a sandbox.
pub const MOUNT_ROOT: &str = "/envs";
const READY: &str = "READY";
const BUILD_PREFIX: &str = ".build-";

/// Where packages come from; set by the operator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PackageIndex {
    /// No index: a package with a `requirements.txt` cannot run.
    None,
    /// A local directory of wheels (and sdists), bound read-only into builds (`--find-links`,
    /// no index, no network).
    FindLinks(PathBuf),
    /// A PEP 503 index URL; builds get the network.
    Url(String),
}

#[derive(Debug, Clone)]
pub struct DepsConfig {
    pub index: PackageIndex,
    /// Wall-clock limit of one build.
    pub build_timeout: Duration,
}

impl Default for DepsConfig {
    fn default() -> Self {
        DepsConfig {
            index: PackageIndex::None,
            build_timeout: Duration::from_secs(600),
        }
    }
}

/// A ready environment.
#[derive(Debug, Clone)]
pub struct DepEnv {
    pub key: String,
    /// Where it is stored: a read-only tree on the host, or a backend volume.
    pub source: BindSource,
    /// Where it is mounted in the sandbox.
    pub target: String,
}

/// Volume storage: the ready marker inside the environment, written last.
const VOLUME_READY: &str = ".skillbox-ready";

impl DepEnv {
    /// Mounts the environment read-only and puts it first on `PATH` (as `activate` would).
    pub fn activate(&self, sandbox: &mut Sandbox, env: &mut BTreeMap<String, String>) {
        sandbox.binds.push(Bind {
            source: self.source.clone(),
            target: self.target.clone(),
            writable: false,
        });
        let path = env
            .get("PATH")
            .cloned()
            .unwrap_or_else(|| crate::DEFAULT_PATH.into());
        env.insert("PATH".into(), format!("{}/bin:{path}", self.target));
        env.insert("VIRTUAL_ENV".into(), self.target.clone());
    }
}

/// The environments of one box.
pub struct DepEnvs {
    root: PathBuf,
    cfg: DepsConfig,
    /// One lock per key being built: concurrent executions wait for the one build.
    flights: tokio::sync::Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// The interpreter as seen inside the sandbox, asked once.
    interpreter: tokio::sync::OnceCell<String>,
    builds: AtomicU64,
    /// Volume storage: keys seen ready (environments never change once ready).
    ready_volumes: std::sync::Mutex<std::collections::HashSet<String>>,
}

impl DepEnvs {
    /// Opens the store at `root`, removing builds abandoned by a dead process.
    pub fn new(root: PathBuf, cfg: DepsConfig) -> std::io::Result<Self> {
        std::fs::create_dir_all(&root)?;
        // The sandbox uid must traverse to the environments it mounts.
        std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o755))?;
        for e in std::fs::read_dir(&root)?.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with(BUILD_PREFIX) || name.starts_with(".stale-") {
                tracing::info!(dir = %name, "removing an abandoned dependency environment build");
                remove_tree(&e.path())?;
            }
        }
        Ok(DepEnvs {
            root,
            cfg,
            flights: Default::default(),
            interpreter: Default::default(),
            builds: AtomicU64::new(0),
            ready_volumes: Default::default(),
        })
    }

    /// Builds completed by this process.
    pub fn builds(&self) -> u64 {
        self.builds.load(Ordering::Relaxed)
    }

    /// The ready environment of `pkg`, built first if needed; `None` if it has no
    /// `requirements.txt`.
    pub async fn ensure(
        &self,
        backend: &dyn Backend,
        pkg: &Mount,
    ) -> Result<Option<DepEnv>, BoxError> {
        let Some(req) = pkg.manifest.get(REQUIREMENTS) else {
            return Ok(None);
        };
        let index = match &self.cfg.index {
            PackageIndex::None => {
                return Err(BoxError::Dependencies(format!(
                    "{} has a {REQUIREMENTS} but this server has no package index configured \
(serve --deps-find-links DIR or --deps-index-url URL)",
                    pkg.target
                )));
            }
            PackageIndex::FindLinks(dir) => format!("find-links:{}", dir.display()),
            PackageIndex::Url(url) => format!("index-url:{url}"),
        };
        let interpreter = self
            .interpreter
            .get_or_try_init(|| ask_interpreter(backend))
            .await?;
        let key = Sha256::of(
            format!(
                "skillbox-depenv-v1\nrequirements {}\nsystem {}\ninterpreter {interpreter}\nindex {index}\n",
                req.sha256.to_hex(),
                backend.system_identity(),
            )
            .as_bytes(),
        )
        .to_hex();
        let env = DepEnv {
            source: if backend.environment_volumes() {
                BindSource::Volume(backend.env_volume_name(&key))
            } else {
                BindSource::Host(self.root.join(&key))
            },
            target: format!("{MOUNT_ROOT}/{key}"),
            key,
        };
        if self.is_ready(backend, &env).await? {
            return Ok(Some(env));
        }
        let flight = {
            let mut f = self.flights.lock().await;
            f.entry(env.key.clone()).or_default().clone()
        };
        let building = flight.lock().await;
        let built = if self.is_ready(backend, &env).await? {
            Ok(())
        } else {
            self.build(backend, &env, &pkg.source.join(REQUIREMENTS))
                .await
        };
        drop(building);
        self.flights.lock().await.remove(&env.key);
        built.map(|()| Some(env))
    }

    async fn is_ready(&self, backend: &dyn Backend, env: &DepEnv) -> Result<bool, BoxError> {
        let volume = match &env.source {
            BindSource::Host(dir) => {
                return Ok(
                    std::fs::read_to_string(dir.join(READY)).is_ok_and(|k| k.trim() == env.key)
                );
            }
            BindSource::Volume(v) => v,
        };
        if self
            .ready_volumes
            .lock()
            .is_ok_and(|r| r.contains(&env.key))
        {
            return Ok(true);
        }
        // Made if missing (with the owner's labels), so that looking never creates an
        // unlabelled one.
        backend.create_env_volume(volume).await?;
        let sandbox = Sandbox::internal(
            format!("depenv-check-{}", env.key),
            vec![Bind {
                source: env.source.clone(),
                target: env.target.clone(),
                writable: false,
            }],
        );
        let r = run_once(
            backend,
            &sandbox,
            ExecRequest::shell(
                &format!("cat {}/{VOLUME_READY} 2>/dev/null", env.target),
                BTreeMap::new(),
            ),
        )
        .await?;
        let ready = String::from_utf8_lossy(&r.stdout).trim() == env.key;
        if ready && let Ok(mut set) = self.ready_volumes.lock() {
            set.insert(env.key.clone());
        }
        Ok(ready)
    }

    async fn build(
        &self,
        backend: &dyn Backend,
        env: &DepEnv,
        requirements: &Path,
    ) -> Result<(), BoxError> {
        let dir = match &env.source {
            BindSource::Host(dir) => dir,
            BindSource::Volume(volume) => {
                // Whatever an interrupted build left is discarded: a fresh volume.
                backend.remove_env_volume(volume).await?;
                backend.create_env_volume(volume).await?;
                let result = self
                    .run_build(backend, env, requirements, env.source.clone())
                    .await;
                if result.is_err() {
                    let _ = backend.remove_env_volume(volume).await;
                }
                return result;
            }
        };
        if dir.exists() {
            tracing::warn!(key = %env.key, "dependency environment without a valid READY; rebuilding it");
            let aside = self.root.join(unique_name(".stale-"));
            std::fs::rename(dir, &aside)?;
            remove_tree(&aside)?;
        }
        let staging = self.root.join(unique_name(BUILD_PREFIX));
        backend.prepare_writable_dir(&staging)?;
        let result = self
            .run_build(
                backend,
                env,
                requirements,
                BindSource::Host(staging.clone()),
            )
            .await;
        if result.is_err() {
            remove_tree(&staging)?;
        }
        result
    }

    async fn run_build(
        &self,
        backend: &dyn Backend,
        env: &DepEnv,
        requirements: &Path,
        staging: BindSource,
    ) -> Result<(), BoxError> {
        tracing::info!(key = %env.key, "building a dependency environment");
        let started = std::time::Instant::now();
        let mut binds = vec![
            Bind {
                source: staging.clone(),
                target: env.target.clone(),
                writable: true,
            },
            Bind {
                source: BindSource::Host(requirements.to_path_buf()),
                target: "/inputs/requirements.txt".into(),
                writable: false,
            },
        ];
        let mut vars = BTreeMap::from([
            ("E".to_string(), env.target.clone()),
            ("PIP_NO_CACHE_DIR".into(), "1".into()),
            ("PIP_NO_INPUT".into(), "1".into()),
            ("PIP_DISABLE_PIP_VERSION_CHECK".into(), "1".into()),
        ]);
        let network = match &self.cfg.index {
            PackageIndex::FindLinks(dir) => {
                binds.push(Bind {
                    source: BindSource::Host(dir.clone()),
                    target: "/index".into(),
                    writable: false,
                });
                vars.insert("PIP_NO_INDEX".into(), "1".into());
                vars.insert("PIP_FIND_LINKS".into(), "/index".into());
                false
            }
            PackageIndex::Url(url) => {
                vars.insert("PIP_INDEX_URL".into(), url.clone());
                true
            }
            PackageIndex::None => false,
        };
        let sandbox = Sandbox {
            network,
            ..Sandbox::internal(format!("depenv-{}", env.key), binds)
        };
        // A venv without pip (smaller, faster); the system's pip installs into it.
        let script = r#"set -e
python3 -m venv --without-pip "$E"
python3 -m pip --python "$E/bin/python" install -r /inputs/requirements.txt"#;
        // Tests only: `stall` keeps the build (and its container) running.
        let failpoint = crate::failpoint::Failpoint::in_dir(&self.root);
        let script = if failpoint.take_if("stall") {
            failpoint.reached();
            format!("{script}\nsleep 600")
        } else {
            script.to_string()
        };
        let req = ExecRequest {
            timeout: self.cfg.build_timeout,
            ..ExecRequest::shell(&script, vars)
        };
        let r = run_once(backend, &sandbox, req).await?;
        if r.outcome != Outcome::Exited || r.exit_code != Some(0) {
            let why = match r.outcome {
                Outcome::TimedOut => {
                    format!("the build took longer than {:?}", self.cfg.build_timeout)
                }
                _ => r.failure(),
            };
            return Err(BoxError::Dependencies(format!(
                "pip could not install {REQUIREMENTS}: {why}"
            )));
        }
        if failpoint.take_if("hang") {
            failpoint.reached();
            std::future::pending::<()>().await;
        }
        match (&staging, &env.source) {
            (BindSource::Host(staging_dir), BindSource::Host(dest)) => {
                let (root, staging_dir, key) =
                    (self.root.clone(), staging_dir.clone(), env.key.clone());
                let dest = dest.clone();
                tokio::task::spawn_blocking(move || seal(&root, &staging_dir, &key, &dest))
                    .await
                    .map_err(|e| BoxError::Unavailable(format!("sealing task failed: {e}")))??;
            }
            _ => {
                // In the volume, by the sandbox user who built it: write bits stripped, synced,
                // the ready marker written last. Sandboxes mount it read-only.
                let script = format!(
                    "set -e\nfind \"$E\" -mindepth 1 ! -type l -exec chmod a-w {{}} +\nsync -f \"$E\"\n\
printf '%s\\n' \"$K\" > \"$E/{VOLUME_READY}.tmp\"\nmv \"$E/{VOLUME_READY}.tmp\" \"$E/{VOLUME_READY}\"\nsync -f \"$E\""
                );
                let vars = BTreeMap::from([
                    ("E".to_string(), env.target.clone()),
                    ("K".to_string(), env.key.clone()),
                ]);
                let r = run_once(backend, &sandbox, ExecRequest::shell(&script, vars)).await?;
                if r.outcome != Outcome::Exited || r.exit_code != Some(0) {
                    return Err(BoxError::Dependencies(format!(
                        "sealing the environment failed: {}",
                        r.failure()
                    )));
                }
                if let Ok(mut set) = self.ready_volumes.lock() {
                    set.insert(env.key.clone());
                }
            }
        }
        self.builds.fetch_add(1, Ordering::Relaxed);
        tracing::info!(key = %env.key, ms = started.elapsed().as_millis() as u64, "dependency environment ready");
        Ok(())
    }
}

/// Hands the built tree to the store's owner, makes it read-only and durable, writes `READY`
/// last and renames it into place (a concurrent builder in another process may have won:
/// then ours is discarded).
fn seal(root: &Path, staging: &Path, key: &str, dest: &Path) -> std::io::Result<()> {
    let owner = std::fs::metadata(root)?;
    let (uid, gid) = (owner.uid(), owner.gid());
    lock_down(staging, uid, gid)?;
    let ready = staging.join(READY);
    std::fs::write(&ready, format!("{key}\n"))?;
    std::fs::set_permissions(&ready, std::fs::Permissions::from_mode(0o444))?;
    let dir = std::fs::File::open(staging)?;
    nix::unistd::syncfs(&dir).map_err(std::io::Error::from)?;
    std::fs::set_permissions(staging, std::fs::Permissions::from_mode(0o555))?;
    match std::fs::rename(staging, dest) {
        Ok(()) => {}
        Err(_) if dest.join(READY).exists() => remove_tree(staging)?,
        Err(e) => return Err(e),
    }
    skillbox_package::write::sync_dir(root)
}

/// Owner `uid:gid`, no write bits, below `dir` (not `dir` itself); symlinks keep their target.
fn lock_down(dir: &Path, uid: u32, gid: u32) -> std::io::Result<()> {
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        let path = e.path();
        let meta = std::fs::symlink_metadata(&path)?;
        std::os::unix::fs::lchown(&path, Some(uid), Some(gid))?;
        if meta.file_type().is_symlink() {
            continue;
        }
        if meta.is_dir() {
            lock_down(&path, uid, gid)?;
        }
        let mode = meta.mode() & 0o7777 & !0o222 & !0o6000;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode))?;
    }
    Ok(())
}

/// The interpreter inside the sandbox: version, platform and ABI tag.
async fn ask_interpreter(backend: &dyn Backend) -> Result<String, BoxError> {
    let sandbox = Sandbox::internal("depenv-probe", vec![]);
    let req = ExecRequest {
        timeout: Duration::from_secs(30),
        ..ExecRequest::shell(
            "python3 -c 'import sys, sysconfig; print(sys.version.split()[0], sysconfig.get_platform(), sys.implementation.cache_tag)'",
            BTreeMap::new(),
        )
    };
    let r = run_once(backend, &sandbox, req).await?;
    let out = String::from_utf8_lossy(&r.stdout).trim().to_string();
    if r.exit_code != Some(0) || out.is_empty() {
        return Err(BoxError::Dependencies(format!(
            "python3 does not run inside the sandbox ({}); dependency environments need python3 \
with the venv and pip modules in the sandbox's system (Debian: python3-venv python3-pip)",
            r.failure()
        )));
    }
    Ok(out)
}
