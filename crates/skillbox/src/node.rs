//! `skillbox node`: an execution node (SPEC §7.3). It registers with Core under the identity
//! kept in its data directory (Core assigns one the first time), heartbeats at the interval
//! Core gives, registers again when Core has forgotten it (or was restarted onto a fresh
//! database), and serves Core — and only Core, by the secret of its latest registration — on
//! `--listen`.
//!
//! Core (`serve --box remote`) places runs' sandboxes on nodes and forwards their executions;
//! the node fetches packages by digest from Core and verifies them before anything runs
//! (`skillbox_server::node`). Its box always copies packages in and verifies them again.

use anyhow::Context;
use skillbox_api::{HeartbeatAck, NodeHeartbeat, NodeRegistered, RegisterNode};
use skillbox_registry::DataDir;
use skillbox_server::node::{NodeIdentity, SharedIdentity};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, RwLock};
use std::time::Duration;

#[derive(clap::Args)]
pub struct NodeArgs {
    /// Core's URL (a `skillbox serve`).
    #[arg(long, env = "SKILLBOX_CORE")]
    pub core: String,
    /// A node token (`skillbox token create --role node`).
    #[arg(long, env = "SKILLBOX_NODE_TOKEN", hide_env_values = true)]
    pub token: String,
    /// Address to listen on for Core's calls.
    #[arg(long, env = "SKILLBOX_NODE_LISTEN", default_value = "127.0.0.1:7421")]
    pub listen: String,
    /// The URL Core reaches this node at (default: http://<listen address>).
    #[arg(long, env = "SKILLBOX_NODE_ADVERTISE")]
    pub advertise: Option<String>,
    /// Data directory: the node's identity, prepared packages, sandboxes.
    #[arg(long, env = "SKILLBOX_DATA_DIR", default_value = "./skillbox-node")]
    pub data_dir: PathBuf,
    /// Sandbox backend: bwrap or docker.
    #[arg(long = "box", env = "SKILLBOX_BOX", default_value = "bwrap")]
    pub box_backend: String,
    #[command(flatten)]
    pub boxes: crate::serve::BoxArgs,
    /// Log format: text or json.
    #[arg(long, env = "SKILLBOX_LOG_FORMAT", default_value = "text")]
    pub log_format: String,
}

pub fn run(a: NodeArgs) -> anyhow::Result<ExitCode> {
    crate::serve::init_logging(&a.log_format);
    anyhow::ensure!(
        matches!(a.box_backend.as_str(), "bwrap" | "docker"),
        "--box {:?}: a node runs sandboxes with bwrap or docker",
        a.box_backend
    );
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let layout = DataDir::new(&a.data_dir);
        std::fs::create_dir_all(layout.root())
            .with_context(|| format!("creating {}", layout.root().display()))?;
        let listener = tokio::net::TcpListener::bind(&a.listen)
            .await
            .with_context(|| format!("listening on {}", a.listen))?;
        let address = a
            .advertise
            .clone()
            .unwrap_or_else(|| format!("http://{}", listener.local_addr().map(|l| l.to_string()).unwrap_or_default()));
        let known_id = std::fs::read_to_string(layout.node_identity())
            .ok()
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty());
        let identity: SharedIdentity = Arc::new(RwLock::new(NodeIdentity {
            id: known_id.unwrap_or_default(),
            secret: String::new(),
        }));
        // A node always copies packages into its sandboxes and verifies them; bwrap's copies
        // are links into the node's tree cache, which the node verifies before every use.
        let packages = crate::serve::Packages::Linked;
        let runtime = crate::serve::choose_box(&layout, Some(&a.box_backend), packages, &a.boxes)
            .await?
            .ok_or_else(|| anyhow::anyhow!("a node needs a sandbox backend"))?;
        let core = Core {
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(10))
                .build()?,
            url: a.core.trim_end_matches('/').to_string(),
            token: a.token.clone(),
        };
        let link = skillbox_server::node::CoreLink {
            url: core.url.clone(),
            token: core.token.clone(),
            http: reqwest::Client::builder()
                .connect_timeout(Duration::from_secs(5))
                .build()?,
        };
        let interval = core
            .register(&identity, &address, &layout)
            .await
            .context("registering with Core")?;
        tracing::info!(core = %core.url, address, id = %identity.read().map(|i| i.id.clone()).unwrap_or_default(), "node registered");
        let state = skillbox_server::node::NodeState::new(identity.clone(), runtime.clone(), link, layout.clone())?;
        tokio::spawn(skillbox_server::node::follow_prefetch(state.clone()));
        tokio::spawn(heartbeats(core, identity, address, layout, interval, runtime));
        skillbox_server::node::serve(listener, state, crate::serve::shutdown_signal()).await?;
        Ok(ExitCode::SUCCESS)
    })
}

/// Core, as the node calls it with its node token.
struct Core {
    http: reqwest::Client,
    url: String,
    token: String,
}

impl Core {
    /// Registers (under the kept identity, if any), keeps the identity and Core's secret, and
    /// returns the heartbeat interval.
    async fn register(
        &self,
        identity: &SharedIdentity,
        address: &str,
        layout: &DataDir,
    ) -> anyhow::Result<Duration> {
        let known = identity.read().map(|i| i.id.clone()).unwrap_or_default();
        let body = RegisterNode {
            id: (!known.is_empty()).then_some(known),
            address: address.to_string(),
            version: env!("CARGO_PKG_VERSION").into(),
        };
        let answer = self
            .http
            .post(format!("{}/v1/nodes", self.url))
            .bearer_auth(&self.token)
            .json(&body)
            .send()
            .await?;
        let status = answer.status();
        if !status.is_success() {
            anyhow::bail!(
                "Core answered {status}: {}",
                answer.text().await.unwrap_or_default()
            );
        }
        let registered: NodeRegistered = answer.json().await?;
        // Kept before use: a node restarted on this data directory is the same node.
        let path = layout.node_identity();
        let staged = path.with_extension("new");
        std::fs::write(&staged, format!("{}\n", registered.id))?;
        std::fs::rename(&staged, &path)?;
        if let Ok(mut id) = identity.write() {
            id.id = registered.id;
            id.secret = registered.secret;
        }
        Ok(Duration::from_secs(registered.heartbeat_seconds.max(1)))
    }

    async fn heartbeat(&self, id: &str, load: u64) -> anyhow::Result<Option<Duration>> {
        let answer = self
            .http
            .post(format!("{}/v1/nodes/{id}/heartbeat", self.url))
            .bearer_auth(&self.token)
            .json(&NodeHeartbeat { load })
            .send()
            .await?;
        if answer.status() == reqwest::StatusCode::NOT_FOUND {
            return Ok(None);
        }
        let status = answer.status();
        if !status.is_success() {
            anyhow::bail!("Core answered {status}");
        }
        let ack: HeartbeatAck = answer.json().await?;
        Ok(Some(Duration::from_secs(ack.heartbeat_seconds.max(1))))
    }
}

/// Heartbeats forever; registers again when Core no longer knows the node. Core being
/// unreachable is logged and retried at the same pace (the node stays up for when it returns).
async fn heartbeats(
    core: Core,
    identity: SharedIdentity,
    address: String,
    layout: DataDir,
    mut interval: Duration,
    runtime: Arc<skillbox_box::BoxRuntime>,
) {
    loop {
        tokio::time::sleep(interval).await;
        let id = identity.read().map(|i| i.id.clone()).unwrap_or_default();
        let load = runtime.executions.in_progress() as u64;
        match core.heartbeat(&id, load).await {
            Ok(Some(next)) => interval = next,
            Ok(None) => match core.register(&identity, &address, &layout).await {
                Ok(next) => {
                    tracing::info!("registered again: Core had forgotten this node");
                    interval = next;
                }
                Err(e) => tracing::warn!(error = %format!("{e:#}"), "registering again failed"),
            },
            Err(e) => tracing::warn!(error = %format!("{e:#}"), "heartbeat failed"),
        }
    }
}
