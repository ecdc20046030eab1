//! The registry: immutable revisions of skills, published by compare-and-swap.
//!
//! - [`meta`]: the metadata store (SQL on SQLite or PostgreSQL): skills, revisions, drafts,
//!   tokens, the event log; the pointer moves only by `UPDATE … WHERE current_revision = base`.
//! - [`content`]: the content store on `object_store`: blobs by SHA-256, manifests by digest,
//!   create-if-absent, never modified.
//! - [`cache`]: the revision cache of read-only trees, one per digest.
//! - [`zero_copy`]: large files' bytes that a socket writer may send from their tree file.
//! - [`Registry`]: publication, reads, pointer moves, deletion, drafts, tokens, events, fsck.
//!
//! Write order is content first, metadata last: a crash before the metadata commit leaves only
//! unreferenced content and staging litter (swept at startup), never a partial revision.

pub mod auth;
pub mod cache;
pub mod content;
pub mod drafts;
pub mod error;
pub mod fsck;
pub mod gc;
pub mod layout;
pub mod meta;
pub mod nodes;
mod notify;
mod publish;
mod reads;
mod revoke;
pub mod runs;
mod skills;
pub mod zero_copy;

pub use auth::{Principal, Role};
pub use error::{RegistryError, Result};
pub use layout::DataDir;
pub use meta::{DraftRow, MetaStore, RunState, SkillRow};
pub use reads::{FileContent, RevSel, RevisionView};
pub use runs::{ExecContext, PinnedTree};
pub use skillbox_api::{
    Activation, DraftFile, Event, FsckReport, GcReport, Pin, Published, Revision, Revoked, RunView,
    SkillSummary,
};

use cache::RevisionCache;
use content::ContentStore;
use skillbox_package::{Digest, Limits, Manifest, StagingDir};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// How to open a registry.
#[derive(Debug, Clone)]
pub struct RegistryConfig {
    pub data_dir: PathBuf,
    /// `sqlite://…` or `postgres://…`; default: `<data_dir>/skillbox.db`.
    pub database_url: Option<String>,
    /// Where content lives: `file:///ABS/PATH` (default `<data_dir>/store`) or
    /// `s3://BUCKET[/PREFIX]`; servers that share a database share it.
    pub store: Option<String>,
    pub limits: Limits,
    /// Reject unknown frontmatter keys.
    pub strict: bool,
}

impl RegistryConfig {
    pub fn new(data_dir: impl Into<PathBuf>) -> Self {
        RegistryConfig {
            data_dir: data_dir.into(),
            database_url: None,
            store: None,
            limits: Limits::default(),
            strict: false,
        }
    }
}

pub struct Registry {
    pub(crate) cfg: RegistryConfig,
    layout: DataDir,
    pub(crate) meta: MetaStore,
    pub(crate) content: ContentStore,
    pub(crate) cache: RevisionCache,
    staging: PathBuf,
    pub(crate) manifests: Memo<Manifest>,
    /// Every revocation (skill id, revision), for the box to kill executions using it.
    pub(crate) revocations: tokio::sync::broadcast::Sender<(String, i64)>,
    pub(crate) pin_cache: runs::PinCache,
    /// Resolved workspace tokens by hash (immutable once minted).
    pub(crate) tokens: Mutex<HashMap<skillbox_package::digest::Sha256, Principal>>,
    instructions: Memo<String>,
    /// Revisions' frontmatter by digest (it is parsed from the SKILL.md the digest covers).
    pub(crate) frontmatters: Memo<serde_json::Value>,
    /// Activation answers' JSON by digest, one per publication of it (see
    /// `Registry::activate_json`).
    pub(crate) activation_answers: Memo<Vec<runs::AnswerJson>>,
    /// Bumped after every committed change (here, or on PostgreSQL on any server): wakes
    /// event streams.
    changes: Arc<tokio::sync::watch::Sender<u64>>,
    /// PostgreSQL: hears other servers' changes for as long as the registry lives.
    _listener: Option<notify::Listener>,
}

/// A bounded memo of what a digest determines (its manifest, its instructions): immutable
/// once known, so entries never go stale; past the bound the memo starts afresh.
pub(crate) struct Memo<T> {
    entries: Mutex<HashMap<Digest, Arc<T>>>,
}

impl<T> Default for Memo<T> {
    fn default() -> Self {
        Memo {
            entries: Mutex::new(HashMap::new()),
        }
    }
}

impl<T> Memo<T> {
    const MAX_ENTRIES: usize = 4096;

    pub(crate) fn get(&self, digest: &Digest) -> Option<Arc<T>> {
        self.entries.lock().ok()?.get(digest).cloned()
    }

    pub(crate) fn insert(&self, digest: Digest, value: T) -> Arc<T> {
        let value = Arc::new(value);
        if let Ok(mut entries) = self.entries.lock() {
            if entries.len() >= Self::MAX_ENTRIES {
                entries.clear();
            }
            entries.insert(digest, value.clone());
        }
        value
    }

    /// Keeps only the digests `keep` says (the others' content was collected).
    pub(crate) fn retain(&self, keep: impl Fn(&Digest) -> bool) {
        if let Ok(mut entries) = self.entries.lock() {
            entries.retain(|d, _| keep(d));
        }
    }
}

impl Registry {
    /// Opens (creating if needed) the registry in `cfg.data_dir`, sweeping staging leftovers
    /// of a previous process.
    pub async fn open(cfg: RegistryConfig) -> Result<Arc<Self>> {
        let layout = DataDir::new(&cfg.data_dir);
        std::fs::create_dir_all(layout.root())?;
        let staging = layout.staging();
        sweep_staging(&staging)?;
        std::fs::create_dir_all(&staging)?;
        let content = match &cfg.store {
            None => ContentStore::local(&layout.store())?,
            Some(url) => ContentStore::open(&content::StoreUrl::parse(url)?)?,
        };
        let store_url = cfg.store.as_deref().unwrap_or("(local)");
        let mut answer = content.ping().await;
        // A first start on an empty S3 server: make the bucket if the credentials may.
        if let (Err(e), Some(url)) = (&answer, &cfg.store)
            && e.to_string().contains("NoSuchBucket")
            && let content::StoreUrl::S3 { bucket, .. } = content::StoreUrl::parse(url)?
        {
            tracing::warn!(bucket, "the bucket does not exist: creating it");
            content::create_bucket(&bucket).await.map_err(|created| {
                RegistryError::Unusable(format!(
                    "the content store {store_url}: the bucket does not exist, and {created}"
                ))
            })?;
            answer = content.ping().await;
        }
        answer.map_err(|e| {
            tracing::debug!(error = ?e, "the content store does not answer");
            RegistryError::Unusable(format!(
                "the content store {store_url} does not answer: {} (is it running, are AWS_ENDPOINT_URL and the AWS_* credentials right?)",
                e.one_line()
            ))
        })?;
        let cache = RevisionCache::new(layout.trees(), staging.clone())?;
        let url = match &cfg.database_url {
            Some(u) => u.clone(),
            None => layout.sqlite_url(),
        };
        let meta = MetaStore::connect(&url).await.map_err(|e| {
            tracing::debug!(error = ?e, "the metadata database does not answer");
            RegistryError::Unusable(format!(
                "the metadata database {} cannot be used: {} (is it running, are the URL and credentials right?)",
                meta::redacted_url(&url),
                e.one_line()
            ))
        })?;
        let changes = Arc::new(tokio::sync::watch::channel(0).0);
        let (revocations, _) = tokio::sync::broadcast::channel(1024);
        let (pin_generation, listener) = match meta.dialect() {
            meta::Dialect::Sqlite => {
                let path = layout.pin_cache_generation();
                let file = runs::GenerationFile::open(path.clone()).map_err(|e| {
                    RegistryError::Unusable(format!(
                        "the pin-cache generation file {} cannot be opened: {e}",
                        path.display()
                    ))
                })?;
                (runs::Generation::File(file), None)
            }
            meta::Dialect::Postgres => {
                let notified = Arc::new(notify::NotifiedGeneration::default());
                let hearers = notify::Hearers {
                    pins: notified.clone(),
                    changes: changes.clone(),
                    revocations: revocations.clone(),
                };
                let listener = notify::listen(meta.url().to_string(), hearers);
                (runs::Generation::Notified(notified), Some(listener))
            }
        };
        let pin_cache = runs::PinCache::new(pin_generation);
        Ok(Arc::new(Registry {
            cfg,
            layout,
            meta,
            content,
            cache,
            staging,
            manifests: Memo::default(),
            revocations,
            tokens: Mutex::new(HashMap::new()),
            pin_cache,
            instructions: Memo::default(),
            frontmatters: Memo::default(),
            activation_answers: Memo::default(),
            changes,
            _listener: listener,
        }))
    }

    pub fn config(&self) -> &RegistryConfig {
        &self.cfg
    }

    pub fn meta(&self) -> &MetaStore {
        &self.meta
    }

    pub fn content(&self) -> &ContentStore {
        &self.content
    }

    /// The data directory and what lives where in it.
    pub fn data_dir(&self) -> &DataDir {
        &self.layout
    }

    pub fn cache(&self) -> &RevisionCache {
        &self.cache
    }

    /// A fresh private staging directory for an upload.
    pub fn new_staging(&self, prefix: &str) -> Result<StagingDir> {
        Ok(StagingDir::new_in(&self.staging, prefix)?)
    }

    pub fn staging_path(&self) -> &Path {
        &self.staging
    }

    /// The on-disk tree of a revision (revision cache).
    pub fn tree_path(&self, digest: &Digest) -> PathBuf {
        self.cache.tree_path(digest)
    }

    /// Subscribes to change notifications (any committed change in any workspace).
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.changes.subscribe()
    }

    /// Whether other servers' changes are pushed to this one now (PostgreSQL's notifications,
    /// while listening), so that [`Registry::subscribe`] wakes for them too; else other
    /// processes must be polled.
    pub fn hears_other_servers(&self) -> bool {
        self.pin_cache.hears_other_servers()
    }

    /// Subscribes to revocations (skill id, revision).
    pub fn subscribe_revocations(&self) -> tokio::sync::broadcast::Receiver<(String, i64)> {
        self.revocations.subscribe()
    }

    pub(crate) fn notify_change(&self) {
        self.changes.send_modify(|v| *v += 1);
    }

    /// The manifest of `digest`, from memory when hot.
    pub async fn manifest(&self, digest: &Digest) -> Result<Arc<Manifest>> {
        if let Some(m) = self.manifests.get(digest) {
            return Ok(m);
        }
        let m = self.content.get_manifest(digest).await?.ok_or_else(|| {
            RegistryError::broken(format!("manifest {digest} missing from the content store"))
        })?;
        Ok(self.manifests.insert(*digest, m))
    }

    /// The instructions (SKILL.md body) of a revision, from memory when hot.
    pub async fn instructions(&self, digest: &Digest, manifest: &Manifest) -> Result<Arc<String>> {
        if let Some(s) = self.instructions.get(digest) {
            return Ok(s);
        }
        let entry = manifest
            .get(skillbox_package::SKILL_MD)
            .ok_or_else(|| RegistryError::broken("revision without SKILL.md"))?;
        let tree_file = self
            .cache
            .tree_path(digest)
            .join(skillbox_package::SKILL_MD);
        let bytes = match tokio::fs::read(&tree_file).await {
            Ok(b) => bytes::Bytes::from(b),
            Err(_) => self
                .content
                .get_blob(&entry.sha256)
                .await?
                .ok_or_else(|| RegistryError::broken("SKILL.md blob missing"))?,
        };
        let parsed = skillbox_package::frontmatter::parse_skill_md(&bytes, usize::MAX);
        let body = parsed.skill.map(|s| s.body).unwrap_or_default();
        Ok(self.instructions.insert(*digest, body))
    }

    /// Whether the metadata store answers (for `/healthz`).
    pub async fn ping(&self) -> Result<()> {
        self.meta.ping().await
    }

    /// Whether the content store answers (for `/healthz`).
    pub async fn ping_store(&self) -> Result<()> {
        self.content.ping().await
    }
}

/// Removes staging entries whose creating process is gone. Another server may share this data
/// directory, so entries of live processes stay. Names end in `<pid>-<nanos>-<n>` (see
/// [`skillbox_package::staging::unique_name`]).
fn sweep_staging(staging: &Path) -> std::io::Result<()> {
    let Ok(rd) = std::fs::read_dir(staging) else {
        return Ok(());
    };
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let owner = name
            .rsplitn(3, '-')
            .nth(2)
            .and_then(|head| head.rsplit('-').next())
            .and_then(|p| {
                let digits = p.trim_start_matches(|c: char| !c.is_ascii_digit());
                digits.parse::<u32>().ok()
            });
        let alive = owner.is_some_and(|pid| {
            pid != std::process::id() && Path::new(&format!("/proc/{pid}")).exists()
        });
        if !alive {
            skillbox_package::staging::remove_tree(&e.path())?;
        }
    }
    Ok(())
}
