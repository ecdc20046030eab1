//! Execution nodes (SPEC §7.3) as Core sees them: registrations, heartbeats, liveness.
//!
//! A node is `live` while its last heartbeat is younger than Core's node timeout. The rows are
//! in the database, so every Core server sees the same nodes.

use crate::Registry;
use crate::auth::generate_token;
use crate::error::{RegistryError, Result};
use crate::meta::{NodeRow, new_id, now_ms};
use skillbox_api::{
    NodeRegistered, NodeState, NodeView, PrefetchPackage, PrefetchSet, RegisterNode,
};
use std::time::Duration;

/// The heartbeat interval Core gives a node: a third of the timeout (at least a second), so
/// that two lost heartbeats in a row still leave it live.
pub fn heartbeat_interval(node_timeout: Duration) -> Duration {
    (node_timeout / 3).max(Duration::from_secs(1))
}

impl Registry {
    /// Registers a node (a new one, or a known identity at its new address) and hands it a
    /// fresh secret for Core's calls.
    pub async fn register_node(
        &self,
        token_hash: &str,
        req: RegisterNode,
        node_timeout: Duration,
    ) -> Result<NodeRegistered> {
        let id = match req.id {
            Some(id) if is_node_id(&id) => id,
            Some(id) => {
                return Err(RegistryError::BadRequest(format!(
                    "node id {id:?} is not one Core assigned (32 hex digits)"
                )));
            }
            None => new_id(),
        };
        let address = req.address.trim_end_matches('/').to_string();
        if !(address.starts_with("http://") || address.starts_with("https://")) {
            return Err(RegistryError::BadRequest(format!(
                "node address {address:?} must be an http:// or https:// URL (use --advertise)"
            )));
        }
        let now = now_ms();
        let secret = generate_token();
        let registered = self
            .meta
            .register_node(&NodeRow {
                id: id.clone(),
                token_hash: token_hash.to_string(),
                address,
                version: req.version,
                secret: secret.clone(),
                load: 0,
                registered_at: now,
                last_heartbeat: now,
            })
            .await?;
        if !registered {
            return Err(RegistryError::Forbidden(format!(
                "node {id} was registered with another node token"
            )));
        }
        Ok(NodeRegistered {
            id,
            secret,
            heartbeat_seconds: heartbeat_interval(node_timeout).as_secs(),
        })
    }

    /// Records a node's heartbeat; `not_found` for an identity Core does not know (the node
    /// should register again).
    pub async fn node_heartbeat(&self, token_hash: &str, id: &str, load: u64) -> Result<()> {
        let load = i64::try_from(load).unwrap_or(i64::MAX);
        if !self
            .meta
            .node_heartbeat(id, token_hash, load, now_ms())
            .await?
        {
            return Err(RegistryError::NotFound(format!(
                "no node {id:?}: register again"
            )));
        }
        Ok(())
    }

    /// Every node with its state now.
    pub async fn nodes(&self, node_timeout: Duration) -> Result<Vec<NodeView>> {
        Ok(self
            .meta
            .nodes()
            .await?
            .into_iter()
            .map(|n| NodeView {
                state: if n.is_live(node_timeout) {
                    NodeState::Live
                } else {
                    NodeState::Lost
                },
                id: n.id,
                address: n.address,
                load: u64::try_from(n.load).unwrap_or(0),
                last_heartbeat: n.last_heartbeat,
                version: n.version,
            })
            .collect())
    }
}

/// Where a run's sandbox is, for an execution through `serve --box remote`.
#[derive(Debug, Clone)]
pub enum Placement {
    /// On this live node (its address and Core's secret for it).
    On(NodeRow),
    /// On this node, which is lost: the sandbox with its workspace is gone.
    Lost(String),
    /// Nowhere yet and no live node to place it on.
    NoLiveNode,
}

impl Registry {
    /// The node run `run_id`'s sandbox is placed on, if it is placed (no placement made).
    pub async fn placed_on(&self, run_id: &str) -> Result<Option<String>> {
        self.meta.placement(run_id).await
    }

    /// The node of run `run_id`'s sandbox: where it was placed, or — at its first execution,
    /// or when a new sandbox is asked for — the least loaded live node.
    pub async fn placement(
        &self,
        run_id: &str,
        new_sandbox: bool,
        node_timeout: Duration,
    ) -> Result<Placement> {
        let nodes = self.meta.nodes().await?;
        let live = |n: &NodeRow| n.is_live(node_timeout);
        let current = self.meta.placement(run_id).await?;
        if let Some(placed) = &current
            && !new_sandbox
        {
            return Ok(match nodes.into_iter().find(|n| &n.id == placed) {
                Some(n) if live(&n) => Placement::On(n),
                _ => Placement::Lost(placed.clone()),
            });
        }
        // Least loaded first; a new sandbox goes elsewhere than the lost one when it can.
        let mut candidates: Vec<NodeRow> = nodes.into_iter().filter(live).collect();
        candidates.sort_by_key(|n| (current.as_ref() == Some(&n.id), n.load, n.id.clone()));
        let Some(best) = candidates.first().cloned() else {
            return Ok(Placement::NoLiveNode);
        };
        let chosen = if new_sandbox {
            self.meta.replace_placement(run_id, &best.id).await?;
            best.id.clone()
        } else {
            self.meta.place_run(run_id, &best.id).await?
        };
        Ok(match candidates.into_iter().find(|n| n.id == chosen) {
            Some(n) => Placement::On(n),
            None => Placement::Lost(chosen),
        })
    }

    /// The deterministic archive of the revision tree `digest`, for a node of the node token
    /// `token_hash`: only a digest that a run placed on one of its nodes has pinned, or the
    /// current revision of a skill such a live run pinned (prefetch).
    pub async fn archive_for_node(&self, token_hash: &str, digest: &str) -> Result<Vec<u8>> {
        let parsed: skillbox_package::Digest = digest
            .parse()
            .map_err(|_| RegistryError::BadRequest(format!("{digest:?} is not a digest")))?;
        if !self
            .meta
            .digest_fetchable_by_nodes_of(token_hash, digest, now_ms())
            .await?
        {
            return Err(RegistryError::NotFound(format!(
                "no run placed on this node pins {digest} or a skill whose current revision it is"
            )));
        }
        let manifest = self.manifest(&parsed).await?;
        self.tar_of(&parsed, &manifest).await
    }
}

impl Registry {
    /// What node `node_id` (of the node token `token_hash`) may prefetch now.
    pub async fn prefetch_set(&self, token_hash: &str, node_id: &str) -> Result<PrefetchSet> {
        if !self.meta.node_of_token(token_hash, node_id).await? {
            return Err(RegistryError::NotFound(format!(
                "no node {node_id} of this node token: register first"
            )));
        }
        let packages = self
            .meta
            .prefetch_set(node_id, now_ms())
            .await?
            .into_iter()
            .map(|(skill_id, revision, digest)| PrefetchPackage {
                skill_id,
                revision,
                digest,
            })
            .collect();
        Ok(PrefetchSet { packages })
    }
}

fn is_node_id(id: &str) -> bool {
    id.len() == 32
        && id
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}
