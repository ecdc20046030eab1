//! Drafts. Workspace drafts are writable working copies kept as (path → blob) rows. Run
//! drafts live in a run's sandbox at `/workspace/skill-drafts/<draft-id>/`, where an agent
//! edits them; the registry keeps only their row (skill, base revision, run) and publishes
//! the tree the box exports from the sandbox. Both publish through the same pipeline as an
//! upload, with the draft's base revision.

use crate::error::{RegistryError, Result};
use crate::meta::{DraftFile, DraftRow, new_id};
use crate::publish::validate_names;
use crate::reads::RevSel;
use crate::{Published, Registry};
use skillbox_package::{Sha256, paths::check_path};
use std::io::Write;

impl Registry {
    /// Creates a draft of `skill` from `base_revision` (0 = empty).
    pub async fn create_draft(
        &self,
        workspace: &str,
        skill: &str,
        base_revision: i64,
    ) -> Result<DraftRow> {
        validate_names(workspace, skill)?;
        let files = if base_revision == 0 {
            Vec::new()
        } else {
            let view = self
                .revision(workspace, skill, RevSel::Number(base_revision))
                .await?;
            view.manifest
                .entries()
                .iter()
                .map(|e| DraftFile {
                    path: e.path.clone(),
                    sha256: e.sha256.to_hex(),
                    size: e.size as i64,
                    executable: e.executable,
                })
                .collect()
        };
        let id = new_id();
        let hashes: Vec<Sha256> = files
            .iter()
            .filter_map(|f| Sha256::from_hex(&f.sha256))
            .collect();
        let present = self.content.presence_check(hashes, None, None);
        if !self
            .meta
            .insert_draft(&id, workspace, skill, base_revision, &files, &present)
            .await?
        {
            return Err(RegistryError::NotFound(format!(
                "revision {base_revision} of {skill:?} was collected meanwhile"
            )));
        }
        self.draft(workspace, &id).await
    }

    pub async fn draft(&self, workspace: &str, id: &str) -> Result<DraftRow> {
        self.meta.draft(workspace, id).await?.ok_or_else(|| {
            RegistryError::NotFound(format!("no draft {id:?} in workspace {workspace:?}"))
        })
    }

    /// A draft whose files the registry holds (not a run draft).
    async fn workspace_draft(&self, workspace: &str, id: &str) -> Result<DraftRow> {
        let d = self.draft(workspace, id).await?;
        if let Some(run) = &d.run_id {
            return Err(RegistryError::BadRequest(format!(
                "draft {id} is a run draft: its files are in run {run}'s sandbox at {}; edit them \
there (exec) and publish with POST …/drafts/{id}/publish",
                run_draft_path(id)
            )));
        }
        Ok(d)
    }

    pub async fn draft_files(&self, workspace: &str, id: &str) -> Result<Vec<DraftFile>> {
        self.workspace_draft(workspace, id).await?;
        self.meta.draft_files(id).await
    }

    pub async fn draft_file(
        &self,
        workspace: &str,
        id: &str,
        path: &str,
    ) -> Result<(DraftFile, bytes::Bytes)> {
        let f = self
            .draft_files(workspace, id)
            .await?
            .into_iter()
            .find(|f| f.path == path)
            .ok_or_else(|| RegistryError::NotFound(format!("draft {id} has no file {path:?}")))?;
        let sha = Sha256::from_hex(&f.sha256)
            .ok_or_else(|| RegistryError::broken("bad hash in draft row"))?;
        Ok((f, self.blob(&sha).await?))
    }

    pub async fn put_draft_file(
        &self,
        workspace: &str,
        id: &str,
        path: &str,
        bytes: bytes::Bytes,
        executable: bool,
    ) -> Result<DraftFile> {
        self.workspace_draft(workspace, id).await?;
        check_path(path)
            .map_err(|m| RegistryError::BadRequest(format!("invalid path {path:?}: {m}")))?;
        if bytes.len() as u64 > self.cfg.limits.max_file_size {
            return Err(RegistryError::TooLarge(format!(
                "file is {} bytes; the limit is {}",
                bytes.len(),
                self.cfg.limits.max_file_size
            )));
        }
        let size = bytes.len() as i64;
        for _ in 0..5 {
            let sha = self.content.put_blob_bytes(bytes.clone()).await?;
            let f = DraftFile {
                path: path.to_string(),
                sha256: sha.to_hex(),
                size,
                executable,
            };
            let present = self.content.presence_check(vec![sha], None, None);
            // A concurrent collection may delete a blob we deduplicated against: put it again.
            if self.meta.put_draft_file(id, &f, &present).await? {
                return Ok(f);
            }
        }
        Err(RegistryError::broken(
            "content kept vanishing while writing the draft file; retry",
        ))
    }

    pub async fn delete_draft_file(&self, workspace: &str, id: &str, path: &str) -> Result<()> {
        self.workspace_draft(workspace, id).await?;
        if !self.meta.delete_draft_file(id, path).await? {
            return Err(RegistryError::NotFound(format!(
                "draft {id} has no file {path:?}"
            )));
        }
        Ok(())
    }

    pub async fn delete_draft(&self, workspace: &str, id: &str) -> Result<()> {
        self.draft(workspace, id).await?;
        self.meta.delete_draft(id).await
    }

    /// Rebase: sets the base revision the next publish will compare against.
    pub async fn set_draft_base(&self, workspace: &str, id: &str, base: i64) -> Result<DraftRow> {
        self.draft(workspace, id).await?;
        self.meta.set_draft_base(id, base).await?;
        self.draft(workspace, id).await
    }

    /// Publishes the draft with its base revision. On success the draft's base becomes the new
    /// revision (the author can keep editing); on conflict the draft is kept unchanged.
    pub async fn publish_draft(
        &self,
        workspace: &str,
        id: &str,
        publisher: &str,
    ) -> Result<Published> {
        let draft = self.workspace_draft(workspace, id).await?;
        let files = self.meta.draft_files(id).await?;
        let (staging, root) =
            skillbox_package::write::staged_tree(self.staging_path(), "draft-", "tree")?;
        for f in &files {
            let sha = Sha256::from_hex(&f.sha256)
                .ok_or_else(|| RegistryError::broken("bad hash in draft row"))?;
            let bytes = self.blob(&sha).await?;
            skillbox_package::write::create_file(&root, &f.path, f.executable)?
                .write_all(&bytes)?;
        }
        self.publish_draft_tree(workspace, &draft, staging, root, false, publisher)
            .await
    }
}

/// Where a run draft lives inside its run's sandbox.
pub fn run_draft_path(id: &str) -> String {
    format!("/workspace/skill-drafts/{id}")
}

impl Registry {
    /// Creates a run draft of `skill` in `run`: from `base_revision` if given, else from the
    /// run's pin of the skill, else from its current revision. Returns the draft and the
    /// deterministic tar of its base, which the box unpacks into the run's workspace.
    pub async fn create_run_draft(
        &self,
        workspace: &str,
        run_id: &str,
        skill: &str,
        base_revision: Option<i64>,
    ) -> Result<(DraftRow, Vec<u8>)> {
        validate_names(workspace, skill)?;
        let context = self.exec_context(workspace, run_id).await?;
        if !context.run.authorized_skills.iter().any(|s| s == skill) {
            return Err(RegistryError::SkillNotAuthorized(format!(
                "skill {skill:?} is not in run {run_id}'s authorized set"
            )));
        }
        let pinned = context
            .pinned
            .iter()
            .find(|p| p.pin.skill == skill && base_revision.is_none_or(|b| b == p.pin.revision));
        let (base, tar) = match pinned {
            // The pinned revision is read through the pin: it works for a deleted skill too.
            Some(crate::PinnedTree {
                pin,
                tree,
                manifest,
            }) => {
                let (tree, manifest) = (tree.clone(), manifest.clone());
                let tar = tokio::task::spawn_blocking(move || {
                    skillbox_package::write::write_tar(
                        Vec::new(),
                        &manifest,
                        &skillbox_package::write::DirSource(&tree),
                    )
                })
                .await
                .map_err(RegistryError::internal)??;
                (pin.revision, tar)
            }
            None => {
                let sel = base_revision.map_or(RevSel::Current, RevSel::Number);
                let rev = self.revision(workspace, skill, sel).await?;
                (rev.revision.revision, self.archive(&rev).await?)
            }
        };
        let id = new_id();
        self.meta
            .insert_run_draft(&id, workspace, skill, base, run_id)
            .await?;
        Ok((self.draft(workspace, &id).await?, tar))
    }

    /// Publishes a run draft from `tar`, the box's export of its directory in the sandbox:
    /// unpacked and checked like an upload (links, devices and hostile paths are refused),
    /// then read like an author's directory (default excludes and `.skillignore` apply), with
    /// the draft's base revision.
    pub async fn publish_run_draft(
        &self,
        workspace: &str,
        id: &str,
        tar: Vec<u8>,
        publisher: &str,
    ) -> Result<Published> {
        let draft = self.draft(workspace, id).await?;
        let staging = self.new_staging("rundraft-")?;
        let root = staging.path().join("tree");
        let limits = self.cfg.limits;
        let (staging, intake) = {
            let root = root.clone();
            tokio::task::spawn_blocking(move || -> Result<_> {
                std::fs::create_dir(&root)?;
                let intake =
                    skillbox_package::intake::extract_tar(&tar[..], false, &root, &limits)?;
                Ok((staging, intake))
            })
            .await
            .map_err(RegistryError::internal)??
        };
        if !intake.problems.is_empty() {
            return Err(RegistryError::InvalidPackage {
                problems: intake.problems,
                warnings: vec![],
            });
        }
        self.publish_draft_tree(workspace, &draft, staging, root, true, publisher)
            .await
    }
}

impl Registry {
    /// Publishes a draft's tree with the draft's base revision (`excludes`: read it as an
    /// author's directory, with the default excludes and `.skillignore`); on success the
    /// draft's base becomes the new revision (it can go on being edited and published).
    async fn publish_draft_tree(
        &self,
        workspace: &str,
        draft: &DraftRow,
        staging: skillbox_package::StagingDir,
        root: std::path::PathBuf,
        excludes: bool,
        publisher: &str,
    ) -> Result<Published> {
        let published = self
            .publish_tree(
                workspace,
                &draft.skill,
                draft.base_revision,
                staging,
                root,
                excludes,
                publisher,
            )
            .await?;
        self.meta
            .set_draft_base(&draft.id, published.revision)
            .await?;
        Ok(published)
    }
}
