//! Reads: skills, revisions, files, archives; pointer moves and deletion.

use crate::Registry;
use crate::error::{RegistryError, Result};
use crate::meta::{Revision, SkillRow};
use skillbox_api::SkillSummary;
use skillbox_package::{Digest, FileEntry, Manifest, Sha256};
use std::path::PathBuf;
use std::sync::Arc;

/// Files up to this size are read whole and answered in one write.
const SMALL_FILE: u64 = 1024 * 1024;

/// `rev` in a path: a number or `current`.
#[derive(Debug, Clone, Copy)]
pub enum RevSel {
    Current,
    Number(i64),
}

impl std::str::FromStr for RevSel {
    type Err = RegistryError;
    fn from_str(s: &str) -> Result<Self> {
        if s == "current" {
            return Ok(RevSel::Current);
        }
        s.parse::<i64>()
            .ok()
            .filter(|n| *n > 0)
            .map(RevSel::Number)
            .ok_or_else(|| {
                RegistryError::BadRequest(format!(
                    "revision must be a positive number or 'current', not {s:?}"
                ))
            })
    }
}

/// One revision with its manifest.
#[derive(Debug, Clone)]
pub struct RevisionView {
    pub skill: SkillRow,
    pub revision: Revision,
    pub digest: Digest,
    pub manifest: Arc<Manifest>,
}

/// Where a file's bytes are.
#[derive(Debug)]
pub enum FileContent {
    /// In the revision cache on local disk (serve without copying through memory).
    Path(PathBuf),
    Bytes(bytes::Bytes),
}

impl Registry {
    /// The active skill `name`, or `not_found`.
    pub async fn skill(&self, workspace: &str, name: &str) -> Result<SkillRow> {
        self.meta
            .active_skill(workspace, name)
            .await?
            .ok_or_else(|| {
                RegistryError::NotFound(format!("no skill {name:?} in workspace {workspace:?}"))
            })
    }

    pub async fn list_skills(&self, workspace: &str) -> Result<Vec<SkillSummary>> {
        let skills = self.meta.list_skills(workspace).await?;
        let mut current: std::collections::HashMap<String, Revision> = self
            .meta
            .current_revisions(workspace)
            .await?
            .into_iter()
            .map(|r| (r.skill_id.clone(), r))
            .collect();
        let mut out = Vec::with_capacity(skills.len());
        for s in &skills {
            let cur = match current.remove(&s.id) {
                Some(r) if r.revision == s.current_revision => Some(r),
                // The pointer moved between the two reads: this skill's own read.
                _ if s.current_revision > 0 => {
                    self.meta.revision(&s.id, s.current_revision).await?
                }
                _ => None,
            };
            out.push(summary(s, cur.as_ref()));
        }
        Ok(out)
    }

    pub async fn skill_summary(
        &self,
        workspace: &str,
        name: &str,
    ) -> Result<(SkillSummary, Option<Revision>)> {
        let s = self.skill(workspace, name).await?;
        let cur = if s.current_revision > 0 {
            self.meta.revision(&s.id, s.current_revision).await?
        } else {
            None
        };
        Ok((summary(&s, cur.as_ref()), cur))
    }

    pub async fn revisions(&self, workspace: &str, name: &str) -> Result<Vec<Revision>> {
        let s = self.skill(workspace, name).await?;
        self.meta.revisions(&s.id).await
    }

    /// A revision by number or `current`, with its manifest. Revoked revisions answer
    /// `revision_revoked`.
    pub async fn revision(&self, workspace: &str, name: &str, sel: RevSel) -> Result<RevisionView> {
        let skill = self.skill(workspace, name).await?;
        let n = match sel {
            RevSel::Current if skill.current_revision == 0 => {
                return Err(RegistryError::NotFound(format!(
                    "skill {name:?} has no current revision"
                )));
            }
            RevSel::Current => skill.current_revision,
            RevSel::Number(n) => n,
        };
        let revision = self.meta.revision(&skill.id, n).await?.ok_or_else(|| {
            RegistryError::NotFound(format!("skill {name:?} has no revision {n}"))
        })?;
        match revision.state.as_str() {
            "available" => {}
            "revoked" => {
                return Err(RegistryError::RevisionRevoked(format!(
                    "revision {n} of {name:?} is revoked: {}",
                    revision
                        .state_reason
                        .as_deref()
                        .unwrap_or("no reason given")
                )));
            }
            other => {
                return Err(RegistryError::NotFound(format!(
                    "revision {n} of {name:?} is {other}"
                )));
            }
        }
        let digest: Digest = revision.digest.parse().map_err(RegistryError::internal)?;
        let manifest = self.manifest(&digest).await?;
        Ok(RevisionView {
            skill,
            revision,
            digest,
            manifest,
        })
    }

    /// A file of a revision: the entry and where its bytes are.
    pub async fn file(&self, view: &RevisionView, path: &str) -> Result<(FileEntry, FileContent)> {
        let entry = view.manifest.get(path).cloned().ok_or_else(|| {
            RegistryError::NotFound(format!(
                "revision {} has no file {path:?}",
                view.revision.revision
            ))
        })?;
        match self
            .file_content(&view.digest, &view.manifest, &entry)
            .await?
        {
            Some(content) => Ok((entry, content)),
            None => Err(RegistryError::broken(format!(
                "blob {} missing from the content store",
                entry.sha256
            ))),
        }
    }

    /// Where a file of a revision is: its revision-cache tree (files up to 1 MiB read whole,
    /// answered in one write; larger ones streamed). A tree this server does not have yet is
    /// built from the content store first, every object verified; failing that, the file's own
    /// blob, verified; `None` when it is missing from the store or fails verification (never
    /// wrong bytes).
    pub(crate) async fn file_content(
        &self,
        digest: &Digest,
        manifest: &Arc<Manifest>,
        entry: &FileEntry,
    ) -> Result<Option<FileContent>> {
        if let Some(bytes) = self.cache.remembered(&entry.sha256) {
            return Ok(Some(FileContent::Bytes(bytes)));
        }
        let content = self.file_content_read(digest, manifest, entry).await?;
        if let Some(FileContent::Bytes(bytes)) = &content {
            self.cache.remember(entry.sha256, bytes);
        }
        Ok(content)
    }

    /// [`Registry::file_content`] from the revision cache's tree, else from the store.
    async fn file_content_read(
        &self,
        digest: &Digest,
        manifest: &Arc<Manifest>,
        entry: &FileEntry,
    ) -> Result<Option<FileContent>> {
        let tree = self.cache.tree_path(digest);
        if let Some(content) = from_tree(&tree, entry) {
            return Ok(Some(content));
        }
        if !tree.is_dir() {
            match self.tree(digest, manifest).await {
                Ok(_) => {
                    if let Some(content) = from_tree(&tree, entry) {
                        return Ok(Some(content));
                    }
                }
                Err(e) if e.is_outage() => return Err(e),
                // Another of its objects is missing or corrupt: this file's own blob may
                // still be whole.
                Err(e) => {
                    tracing::error!(%digest, error = %e, "cannot build a revision's tree from the store")
                }
            }
        }
        // No whole tree, or a tree whose file is unreadable: the file's blob, verified.
        Ok(self
            .content
            .get_blob(&entry.sha256)
            .await?
            .map(FileContent::Bytes))
    }

    pub(crate) async fn blob(&self, sha: &Sha256) -> Result<bytes::Bytes> {
        self.content.get_blob(sha).await?.ok_or_else(|| {
            RegistryError::broken(format!("blob {sha} missing from the content store"))
        })
    }

    /// The revision-cache tree of `digest`, built from the content store (every object
    /// verified) when this server's cache does not have it: another server published it, or
    /// the cache was deleted while the server was stopped.
    pub(crate) async fn tree(&self, digest: &Digest, manifest: &Arc<Manifest>) -> Result<PathBuf> {
        let tree = self.cache.tree_path(digest);
        if tree.is_dir() {
            return Ok(tree);
        }
        let (cache, content, d, m) = (
            self.cache.clone(),
            self.content.clone(),
            *digest,
            manifest.clone(),
        );
        let rt = tokio::runtime::Handle::current();
        tokio::task::spawn_blocking(move || cache.ensure(&d, &m, None, &content, &rt)).await?
    }

    /// The deterministic tar of a revision.
    pub async fn archive(&self, view: &RevisionView) -> Result<Vec<u8>> {
        self.tar_of(&view.digest, &view.manifest).await
    }

    /// The deterministic tar of the revision tree `digest` (built from the store if this
    /// server's cache lacks it).
    pub(crate) async fn tar_of(
        &self,
        digest: &Digest,
        manifest: &Arc<Manifest>,
    ) -> Result<Vec<u8>> {
        let tree = self.tree(digest, manifest).await?;
        let manifest = manifest.clone();
        tokio::task::spawn_blocking(move || {
            skillbox_package::write::write_tar(
                Vec::new(),
                &manifest,
                &skillbox_package::write::DirSource(&tree),
            )
        })
        .await
        .map_err(RegistryError::internal)?
        .map_err(|e| RegistryError::context("building the archive", e))
    }
}

/// A file from a revision-cache tree, if the tree has it whole.
fn from_tree(tree: &std::path::Path, entry: &FileEntry) -> Option<FileContent> {
    let on_disk = tree.join(&entry.path);
    if entry.size <= SMALL_FILE {
        // A page-cache read of up to 1 MiB costs less than streaming it through the blocking
        // pool in chunks.
        use std::io::Read;
        let mut file = std::fs::File::open(&on_disk).ok()?;
        let mut bytes = Vec::with_capacity(entry.size as usize);
        file.read_to_end(&mut bytes).ok()?;
        // Tree files are read-only and never rewritten, so a large one can be sent from its
        // file (zero-copy) as well as from these bytes.
        (bytes.len() as u64 == entry.size)
            .then(|| FileContent::Bytes(crate::zero_copy::file_backed(bytes, file)))
    } else {
        on_disk.is_file().then_some(FileContent::Path(on_disk))
    }
}

fn summary(s: &SkillRow, cur: Option<&Revision>) -> SkillSummary {
    SkillSummary {
        id: s.id.clone(),
        name: s.name.clone(),
        description: cur
            .and_then(|r| r.frontmatter.get("description"))
            .and_then(|d| d.as_str())
            .map(str::to_string),
        current_revision: s.current_revision,
        current_digest: cur.map(|r| r.digest.clone()),
        state: s.state.clone(),
        created_at: s.created_at,
        updated_at: s.updated_at,
    }
}
