//! `skillbox serve`: the server on the embedded default (SQLite + local content store).

use anyhow::{Context, bail};
use skillbox_package::Limits;
use skillbox_registry::{DataDir, Registry, RegistryConfig};
use skillbox_server::{AppState, ServerConfig};
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

#[derive(clap::Args)]
pub struct ServeArgs {
    /// Address to listen on.
    #[arg(long, env = "SKILLBOX_LISTEN", default_value = "127.0.0.1:7420")]
    pub listen: String,
    /// Data directory: embedded SQLite, local content store, revision cache, admin token.
    #[arg(long, env = "SKILLBOX_DATA_DIR", default_value = "./skillbox-data")]
    pub data_dir: PathBuf,
    /// Sandbox backend: bwrap, docker, remote (executions on `skillbox node`s) or none
    /// (default: bwrap when its probe passes, else none).
    #[arg(long = "box", env = "SKILLBOX_BOX")]
    pub box_backend: Option<String>,
    /// Copy packages into sandbox storage and verify them (instead of binding the revision
    /// cache read-only). Used when the executor cannot see the revision cache; forced in tests.
    #[arg(long, env = "SKILLBOX_BOX_COPY_MODE")]
    pub box_copy_mode: bool,
    #[command(flatten)]
    pub boxes: BoxArgs,
    /// Metadata database URL (sqlite://… or postgres://…); default: <data-dir>/skillbox.db.
    #[arg(long, env = "SKILLBOX_DATABASE_URL")]
    pub database_url: Option<String>,
    /// Content store URL: file:///ABS/PATH (default: <data-dir>/store) or s3://BUCKET[/PREFIX]
    /// (endpoint, region and credentials from AWS_ENDPOINT_URL, AWS_REGION, AWS_ACCESS_KEY_ID,
    /// AWS_SECRET_ACCESS_KEY; AWS_ALLOW_HTTP=true for a plain-HTTP endpoint). Servers sharing a
    /// PostgreSQL database share the store too; each keeps its own --data-dir, a cache.
    #[arg(long, env = "SKILLBOX_STORE")]
    pub store: Option<String>,
    /// Most client connections open at once (more wait in the listen backlog).
    #[arg(long, env = "SKILLBOX_MAX_CONNECTIONS", default_value_t = skillbox_server::ConnectionLimits::default().max_connections)]
    pub max_connections: usize,
    /// Threads that serve client connections, each with its own event loop (a connection stays
    /// on one thread); 0 serves them on the shared work-stealing runtime. Default: one per core.
    #[arg(long, env = "SKILLBOX_CONNECTION_THREADS")]
    pub connection_threads: Option<usize>,
    /// Seconds a client may take to send a request's headers before it is dropped.
    #[arg(long, env = "SKILLBOX_HEADER_TIMEOUT", default_value_t = 10)]
    pub header_timeout: u64,
    /// Reject unknown SKILL.md frontmatter keys instead of warning.
    #[arg(long, env = "SKILLBOX_STRICT")]
    pub strict: bool,
    /// Most files in a package.
    #[arg(long, env = "SKILLBOX_MAX_FILES", default_value_t = Limits::default().max_files)]
    pub max_files: usize,
    /// Largest file in a package, bytes.
    #[arg(long, env = "SKILLBOX_MAX_FILE_SIZE", default_value_t = Limits::default().max_file_size)]
    pub max_file_size: u64,
    /// Largest package, uncompressed bytes.
    #[arg(long, env = "SKILLBOX_MAX_TOTAL_SIZE", default_value_t = Limits::default().max_total_size)]
    pub max_total_size: u64,
    /// Request timeout in seconds.
    #[arg(long, env = "SKILLBOX_REQUEST_TIMEOUT", default_value_t = 300)]
    pub request_timeout: u64,
    /// Grace period of garbage collection, seconds: younger revisions and content are kept.
    #[arg(long, env = "SKILLBOX_GC_GRACE", default_value_t = 3600)]
    pub gc_grace: u64,
    /// Run garbage collection every this many seconds (0: only on request).
    #[arg(long, env = "SKILLBOX_GC_INTERVAL", default_value_t = 3600)]
    pub gc_interval: u64,
    /// Execution nodes: a node whose heartbeats stop for this many seconds is lost; nodes
    /// heartbeat at a third of it.
    #[arg(long, env = "SKILLBOX_NODE_TIMEOUT", default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..))]
    pub node_timeout: u64,
    /// Log format: text or json.
    #[arg(long, env = "SKILLBOX_LOG_FORMAT", default_value = "text")]
    pub log_format: String,
}

/// How sandboxes are built: shared by `serve` and `node`.
#[derive(clap::Args)]
pub struct BoxArgs {
    /// Dependency environments: a local directory of wheels pip installs from (no index, no
    /// network). Skills with a requirements.txt get a virtualenv built from it.
    #[arg(
        long,
        env = "SKILLBOX_DEPS_FIND_LINKS",
        conflicts_with = "deps_index_url"
    )]
    pub deps_find_links: Option<PathBuf>,
    /// Dependency environments: a package index URL (PEP 503) pip installs from; builds get
    /// the network.
    #[arg(long, env = "SKILLBOX_DEPS_INDEX_URL")]
    pub deps_index_url: Option<String>,
    /// Longest a dependency environment build may take, seconds.
    #[arg(long, env = "SKILLBOX_DEPS_BUILD_TIMEOUT", default_value_t = 600)]
    pub deps_build_timeout: u64,
    /// Docker backend: the image sandboxes run in (needs sh, sleep, tar; python3 with venv and
    /// pip for dependency environments).
    #[arg(long, env = "SKILLBOX_DOCKER_IMAGE")]
    pub docker_image: Option<String>,
    /// Docker backend: the owner label of this server's containers and volumes (servers
    /// sharing an engine use different owners).
    #[arg(long, env = "SKILLBOX_DOCKER_OWNER", default_value = "skillbox")]
    pub docker_owner: String,
    #[command(flatten)]
    pub sandbox: SandboxArgs,
}

/// Sandbox limits shared by `serve` and `doctor` (which probes with them).
#[derive(clap::Args)]
pub struct SandboxArgs {
    /// Size of each sandbox's /tmp (a tmpfs: host memory), bytes.
    #[arg(long, env = "SKILLBOX_TMP_SIZE", default_value_t = skillbox_box::bwrap::DEFAULT_TMP_BYTES)]
    pub tmp_size: u64,
    /// Quota of each sandbox's /workspace, bytes (an ext4 image per sandbox; 0: no quota).
    #[arg(long, env = "SKILLBOX_WORKSPACE_QUOTA", default_value_t = skillbox_box::bwrap::DEFAULT_WORKSPACE_BYTES)]
    pub workspace_quota: u64,
    /// bwrap: the first host uid of the pool sandboxes run as (one uid per sandbox, so each
    /// has its own process budget); 65,536 uids from here must belong to no one else.
    #[arg(long, env = "SKILLBOX_SANDBOX_UID_BASE", default_value_t = 1_000_000)]
    pub sandbox_uid_base: u32,
}

pub(crate) fn init_logging(format: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("SKILLBOX_LOG")
        // The S3 client's retries are expected on a flaky network: said once as a failure if
        // they do not help, not line by line.
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,object_store=warn"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if format == "json" {
        builder.json().init();
    } else {
        builder.init();
    }
}

/// The admin token: `SKILLBOX_ADMIN_TOKEN`, else `<data-dir>/admin-token` (generated, 0600).
fn admin_token(data_dir: &DataDir) -> anyhow::Result<String> {
    if let Ok(t) = std::env::var("SKILLBOX_ADMIN_TOKEN")
        && !t.trim().is_empty()
    {
        return Ok(t.trim().to_string());
    }
    let path = data_dir.admin_token();
    match std::fs::read_to_string(&path) {
        Ok(t) if !t.trim().is_empty() => return Ok(t.trim().to_string()),
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).context(format!("reading {}", path.display())),
    }
    let token = skillbox_registry::auth::generate_token();
    let tmp = path.with_file_name(format!(".admin-token.{}", std::process::id()));
    {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(token.as_bytes())?;
        f.sync_all()?;
    }
    // Another server starting on the same directory may have won: theirs is kept.
    match std::fs::hard_link(&tmp, &path) {
        Ok(()) => {
            tracing::info!(path = %path.display(), "generated the admin token");
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e.into()),
    }
    std::fs::remove_file(&tmp)?;
    Ok(std::fs::read_to_string(&path)?.trim().to_string())
}

pub fn run(a: ServeArgs) -> anyhow::Result<ExitCode> {
    init_logging(&a.log_format);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let sandbox = match a.box_backend.as_deref() {
            // Executions go to execution nodes (`skillbox node`).
            Some("remote") => None,
            asked => {
                let packages = if a.box_copy_mode { Packages::Copied } else { Packages::Bound };
                choose_box(&DataDir::new(&a.data_dir), asked, packages, &a.boxes).await?
            }
        };
        std::fs::create_dir_all(&a.data_dir).with_context(|| format!("creating {}", a.data_dir.display()))?;
        let admin_token = admin_token(&DataDir::new(&a.data_dir))?;
        let limits = Limits { max_files: a.max_files, max_file_size: a.max_file_size, max_total_size: a.max_total_size, ..Limits::default() };
        let cfg = RegistryConfig { data_dir: a.data_dir.clone(), database_url: a.database_url.clone(), store: a.store.clone(), limits, strict: a.strict };
        let registry = Registry::open(cfg).await.context("opening the registry")?;
        let state = Arc::new(AppState {
            registry,
            remote: (a.box_backend.as_deref() == Some("remote")).then(skillbox_server::remote::RemoteBox::default),
            sandbox,
            cfg: ServerConfig {
                admin_token,
                // Archive overhead (headers, padding, central directory) on top of the content.
                max_upload_bytes: limits.max_total_size + 16 * 1024 * 1024,
                request_timeout: std::time::Duration::from_secs(a.request_timeout),
                gc_grace: std::time::Duration::from_secs(a.gc_grace),
                node_timeout: std::time::Duration::from_secs(a.node_timeout),
                connections: skillbox_server::ConnectionLimits {
                    max_connections: a.max_connections,
                    header_timeout: std::time::Duration::from_secs(a.header_timeout.max(1)),
                    threads: a.connection_threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get())),
                },
            },
            metrics: Default::default(),
        });
        let listener = tokio::net::TcpListener::bind(&a.listen).await.with_context(|| format!("listening on {}", a.listen))?;
        tracing::info!(listen = %listener.local_addr()?, data_dir = %a.data_dir.display(), "skillbox serving");
        let gc_every = (a.gc_interval > 0).then(|| std::time::Duration::from_secs(a.gc_interval));
        skillbox_server::spawn_upkeep(state.clone(), std::time::Duration::from_secs(5), gc_every);
        skillbox_server::spawn_revocation_killer(state.clone());
        skillbox_server::remote::spawn_revocation_relay(state.clone());
        // The MCP endpoint's sessions call this server's own API: in-process through its
        // router (the loopback address is the fallback until the router is set).
        let local = listener.local_addr()?;
        let loopback = match local.ip() {
            ip if ip.is_unspecified() && ip.is_ipv4() => std::net::SocketAddr::from(([127, 0, 0, 1], local.port())),
            ip if ip.is_unspecified() => std::net::SocketAddr::from((std::net::Ipv6Addr::LOCALHOST, local.port())),
            _ => local,
        };
        let local_api = crate::client::LocalApi::default();
        let mcp = crate::client::mcp_http_service(format!("http://{loopback}"), local_api.clone(), state.box_available())?;
        let mounted = skillbox_server::routes::mount(
            &state,
            "/v1/workspaces/{ws}/mcp",
            skillbox_server::auth::Access::Workspace(skillbox_registry::Role::Reader),
            axum::routing::any_service(mcp),
        );
        let limits = state.cfg.connections;
        let app = skillbox_server::router_with(state, mounted);
        local_api.set(app.clone());
        let served = skillbox_server::serve(listener, app, limits, shutdown_signal()).await;
        local_api.clear();
        served?;
        tracing::info!("stopped");
        Ok(ExitCode::SUCCESS)
    })
}

/// The sandbox uid: `nobody`.
pub const SANDBOX_UID: u32 = 65534;

/// The bwrap backend as configured (not yet probed): its own uid per sandbox from the pool
/// recorded under `<data-dir>/box/uids`, the `/tmp` size and the workspace quota.
pub fn bwrap_backend(
    data_dir: &DataDir,
    a: &SandboxArgs,
) -> anyhow::Result<skillbox_box::bwrap::Bwrap> {
    let box_dir = data_dir.box_root();
    let mut b = skillbox_box::bwrap::Bwrap::new(SANDBOX_UID);
    b.limits.tmp_bytes = a.tmp_size;
    b.limits.workspace_bytes = a.workspace_quota;
    b.uids = Some(Arc::new(
        skillbox_box::workspace::UidPool::open(data_dir.box_uids(), a.sandbox_uid_base, 65_536)
            .map_err(|e| anyhow::anyhow!("{e}"))
            .with_context(|| format!("opening the sandbox uid pool in {}", box_dir.display()))?,
    ));
    b.state_dir = Some(box_dir);
    Ok(b)
}

/// How packages reach the sandboxes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Packages {
    /// The revision trees, bound read-only (bwrap on the server's own disk).
    Bound,
    /// Copied into sandbox storage and verified before every execution (`--box-copy-mode`).
    Copied,
    /// As `Copied`, the files hard-linked from a tree whose owner verifies it before every
    /// use (an execution node's tree cache).
    Linked,
}

/// `--box`: bwrap when asked (refusing to start if its probe fails), none when asked, and by
/// default bwrap if its probe passes, else none — said loudly.
pub(crate) async fn choose_box(
    data_dir: &DataDir,
    asked: Option<&str>,
    packages: Packages,
    a: &BoxArgs,
) -> anyhow::Result<Option<Arc<skillbox_box::BoxRuntime>>> {
    let copy_mode = packages != Packages::Bound;
    let index = match (&a.deps_find_links, &a.deps_index_url) {
        (Some(dir), _) => skillbox_box::deps::PackageIndex::FindLinks(
            std::fs::canonicalize(dir)
                .with_context(|| format!("--deps-find-links {}", dir.display()))?,
        ),
        (None, Some(url)) => skillbox_box::deps::PackageIndex::Url(url.clone()),
        (None, None) => skillbox_box::deps::PackageIndex::None,
    };
    let deps_cfg = skillbox_box::deps::DepsConfig {
        index,
        build_timeout: std::time::Duration::from_secs(a.deps_build_timeout),
    };
    let bwrap = || -> anyhow::Result<Arc<skillbox_box::BoxRuntime>> {
        let b = bwrap_backend(data_dir, &a.sandbox)?;
        let ok = b.probe().map_err(|e| anyhow::anyhow!("{e}"))?;
        tracing::info!(backend = "bwrap", "{ok}");
        let mut b = b;
        if copy_mode {
            let mut store = skillbox_box::prepare::PreparedStore::new(data_dir.box_prepared())?;
            if packages == Packages::Linked {
                store = store.linking();
            }
            let swept = store.sweep()?;
            tracing::info!(
                swept,
                "copy mode: packages are copied into sandbox storage and verified before every execution"
            );
            b.copies = Some(store);
        }
        let deps = skillbox_box::deps::DepEnvs::new(data_dir.box_envs(), deps_cfg.clone())?;
        Ok(Arc::new(skillbox_box::BoxRuntime::new(
            Arc::new(b),
            Arc::new(deps),
        )))
    };
    match asked {
        Some("none") => Ok(None),
        Some("bwrap") => bwrap().map(Some).context("--box bwrap"),
        Some("docker") => {
            let Some(image) = a.docker_image.clone() else {
                bail!(
                    "--box docker needs --docker-image IMAGE (SKILLBOX_DOCKER_IMAGE): the image sandboxes run in"
                );
            };
            let mut cfg = skillbox_box::docker::DockerConfig::new(image);
            cfg.uid = SANDBOX_UID;
            cfg.tmp_bytes = a.sandbox.tmp_size;
            cfg.workspace_bytes = a.sandbox.workspace_quota;
            cfg.owner = a.docker_owner.clone();
            if copy_mode {
                let dir = data_dir.box_prepared();
                std::fs::create_dir_all(&dir)?;
                cfg.copy_mode = true;
                cfg.failpoint = skillbox_box::failpoint::Failpoint::in_dir(&dir);
                tracing::info!(
                    "copy mode: packages are uploaded into each sandbox's volume and verified inside it"
                );
            }
            let d = skillbox_box::docker::Docker::connect(cfg)
                .await
                .map_err(|e| anyhow::anyhow!("{e}"))
                .context("--box docker")?;
            tracing::info!(
                backend = "docker",
                api = d.api_version(),
                recursive_read_only = d.recursive_read_only(),
                "docker sandbox backend"
            );
            let deps = skillbox_box::deps::DepEnvs::new(data_dir.box_envs(), deps_cfg)?;
            Ok(Some(Arc::new(skillbox_box::BoxRuntime::new(
                Arc::new(d),
                Arc::new(deps),
            ))))
        }
        Some(other) => bail!("unknown sandbox backend {other:?}: use bwrap, docker or none"),
        None => match bwrap() {
            Ok(b) => Ok(Some(b)),
            Err(e) => {
                tracing::warn!(
                    "NO SANDBOX: the bwrap probe failed ({e:#}), so `--box none` is in effect: \
activation and reads work, exec answers box_unavailable"
                );
                Ok(None)
            }
        },
    }
}

pub(crate) async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = match signal(SignalKind::terminate()) {
        Ok(s) => s,
        Err(_) => return std::future::pending().await,
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    tracing::info!("shutting down: finishing in-flight requests");
}
