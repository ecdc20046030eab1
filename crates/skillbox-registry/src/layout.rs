//! The data directory's layout: the one place that names what lives where under
//! `--data-dir`. Everything else asks a [`DataDir`] for its paths.
//!
//! ```text
//! <data-dir>/
//!   admin-token            the generated admin token (0600), when none is configured
//!   skillbox.db            embedded metadata (SQLite), unless --database-url says otherwise
//!   store/                 the local content store (blobs/, manifests/ by SHA-256)
//!   trees/                 the revision cache: one read-only tree per digest
//!   staging/               uploads and trees being built (swept at start-up)
//!   pin-cache-generation   bumped by every revocation/finish (other processes drop caches)
//!   box/uids/              the sandbox uid pool
//!   box/workspaces/<run>   each run's /workspace (with <run>.ext4 beside it)
//!   box/prepared/          verified package copies (copy mode)
//!   box/envs/              dependency environments
//!   node-id                an execution node's identity, as Core assigned it (`skillbox node`)
//! ```

use std::path::{Path, PathBuf};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DataDir {
    root: PathBuf,
}

impl DataDir {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        DataDir { root: root.into() }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn admin_token(&self) -> PathBuf {
        self.root.join("admin-token")
    }

    /// An execution node's identity: restarted on the same data directory it is the same node.
    pub fn node_identity(&self) -> PathBuf {
        self.root.join("node-id")
    }

    /// The embedded database's URL (used when no `--database-url` is given).
    pub fn sqlite_url(&self) -> String {
        format!(
            "sqlite://{}?mode=rwc",
            self.root.join("skillbox.db").display()
        )
    }

    pub fn store(&self) -> PathBuf {
        self.root.join("store")
    }

    pub fn trees(&self) -> PathBuf {
        self.root.join("trees")
    }

    pub fn staging(&self) -> PathBuf {
        self.root.join("staging")
    }

    pub fn pin_cache_generation(&self) -> PathBuf {
        self.root.join("pin-cache-generation")
    }

    /// The sandbox runtime's own directory.
    pub fn box_root(&self) -> PathBuf {
        self.root.join("box")
    }

    pub fn box_uids(&self) -> PathBuf {
        self.box_root().join("uids")
    }

    pub fn box_prepared(&self) -> PathBuf {
        self.box_root().join("prepared")
    }

    pub fn box_envs(&self) -> PathBuf {
        self.box_root().join("envs")
    }

    /// Where runs' workspaces live (one entry per run, see
    /// `skillbox_box::workspace::workspace_of_entry`).
    pub fn workspaces(&self) -> PathBuf {
        self.box_root().join("workspaces")
    }

    /// The host directory of a run's `/workspace`.
    pub fn run_workspace(&self, run: &str) -> PathBuf {
        self.workspaces().join(run)
    }
}
