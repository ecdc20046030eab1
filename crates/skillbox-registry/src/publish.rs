//! Publication (SPEC §4.1–4.2): staging → validation → content → one sync → one transaction.

use crate::Registry;
use crate::error::{RegistryError, Result};
use crate::meta::{CommitOutcome, NewRevision, Revision, SkillRow};
use skillbox_api::Published;
use skillbox_package::{ArchiveFormat, CheckOptions, Package, Problem, StagingDir, intake};
use std::path::PathBuf;

/// The answer to a publish of `rev`.
pub(crate) fn published(
    skill: &SkillRow,
    rev: &Revision,
    warnings: Vec<Problem>,
    replayed: bool,
) -> Published {
    Published {
        skill_id: skill.id.clone(),
        name: skill.name.clone(),
        revision: rev.revision,
        digest: rev.digest.clone(),
        file_count: rev.file_count,
        size: rev.size,
        published_at: rev.published_at,
        warnings,
        replayed,
    }
}

impl Registry {
    fn check_options(&self, name: &str) -> CheckOptions {
        CheckOptions {
            strict: self.cfg.strict,
            expected_name: Some(name.to_string()),
            limits: self.cfg.limits,
        }
    }

    /// Publishes the archive at `staging/upload`. `format` comes from the content type; when
    /// absent the archive's leading bytes decide.
    pub async fn publish_archive(
        &self,
        workspace: &str,
        name: &str,
        base_revision: i64,
        staging: StagingDir,
        format: Option<ArchiveFormat>,
        publisher: &str,
    ) -> Result<Published> {
        validate_names(workspace, name)?;
        let pkg = self
            .read_and_check(name, staging, move |staging, limits| {
                let upload = staging.path().join("upload");
                let tree = staging.path().join("tree");
                std::fs::create_dir(&tree)?;
                let intake = match format {
                    Some(f) => {
                        intake::extract_archive(std::fs::File::open(&upload)?, f, &tree, limits)?
                    }
                    None => intake::extract_archive_file(&upload, &tree, limits)?,
                };
                // The upload is not needed any more; free the space before storing content.
                std::fs::remove_file(&upload)?;
                Ok(intake)
            })
            .await?;
        let (staging, pkg) = pkg;
        self.publish_package(workspace, name, base_revision, staging, pkg, publisher)
            .await
    }

    /// Reads the package in `staging` on a blocking thread and validates it.
    async fn read_and_check(
        &self,
        name: &str,
        staging: StagingDir,
        read: impl FnOnce(&StagingDir, &skillbox_package::Limits) -> Result<intake::Intake>
        + Send
        + 'static,
    ) -> Result<(StagingDir, Package)> {
        let opts = self.check_options(name);
        let (staging, checked) = tokio::task::spawn_blocking(move || -> Result<_> {
            let intake = read(&staging, &opts.limits)?;
            Ok((staging, skillbox_package::check(intake, &opts)))
        })
        .await
        .map_err(RegistryError::internal)??;
        let pkg = checked.map_err(|r| RegistryError::InvalidPackage {
            problems: r.problems,
            warnings: r.warnings,
        })?;
        Ok((staging, pkg))
    }

    /// Publishes a package directory already inside `staging` (draft publication).
    /// Publishes the directory `root` inside `staging`. `excludes`: apply the default excludes
    /// and `.skillignore`, as for any directory an author hands in (a run draft); without, the
    /// tree is taken exactly as it is (a workspace draft, whose files were chosen one by one).
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn publish_tree(
        &self,
        workspace: &str,
        name: &str,
        base_revision: i64,
        staging: StagingDir,
        root: PathBuf,
        excludes: bool,
        publisher: &str,
    ) -> Result<Published> {
        let (staging, pkg) = self
            .read_and_check(name, staging, move |_, limits| {
                Ok(if excludes {
                    intake::scan_dir(&root, limits)?
                } else {
                    intake::scan_dir_raw(&root, limits)?
                })
            })
            .await?;
        self.publish_package(workspace, name, base_revision, staging, pkg, publisher)
            .await
    }

    async fn publish_package(
        &self,
        workspace: &str,
        name: &str,
        base_revision: i64,
        // Kept alive to the end: its files are what a restore after a collection relinks from.
        _staging: StagingDir,
        pkg: Package,
        publisher: &str,
    ) -> Result<Published> {
        let digest = pkg.digest.to_string();
        // Cheap early answer for a stale base (the commit below re-checks under the database's
        // concurrency control, so this is only an optimisation).
        if let Some(skill) = self.meta.active_skill(workspace, name).await? {
            // Publishing exactly what is current changes nothing: answer with the current
            // revision instead of minting an identical one.
            if skill.current_revision == base_revision
                && base_revision > 0
                && let Some(cur) = self.meta.revision(&skill.id, base_revision).await?
                && cur.digest == digest
            {
                return Ok(published(&skill, &cur, pkg.warnings, true));
            }
            if skill.current_revision != base_revision {
                if let Some(rev) = self.meta.replay(&skill.id, base_revision, &digest).await? {
                    return Ok(published(&skill, &rev, pkg.warnings, true));
                }
                return Err(RegistryError::RevisionConflict {
                    current_revision: skill.current_revision,
                    base_revision,
                });
            }
        } else if base_revision != 0 {
            return Err(RegistryError::RevisionConflict {
                current_revision: 0,
                base_revision,
            });
        }

        let frontmatter =
            serde_json::to_value(&pkg.skill.frontmatter).map_err(RegistryError::internal)?;
        let blob_hashes: Vec<_> = pkg.manifest.entries().iter().map(|e| e.sha256).collect();
        let tree = self.cache.tree_path(&pkg.digest);
        let present =
            self.content
                .presence_check(blob_hashes, Some(pkg.digest), Some(tree.clone()));
        let mut attempts = 0;
        loop {
            attempts += 1;
            self.store_content(&pkg).await?;
            let outcome = self
                .meta
                .commit_revision(
                    &NewRevision {
                        workspace,
                        skill: name,
                        base_revision,
                        digest: &digest,
                        publisher,
                        file_count: pkg.manifest.len() as i64,
                        size: pkg.manifest.total_size() as i64,
                        frontmatter: &frontmatter,
                    },
                    &present,
                )
                .await?;
            match outcome {
                // A concurrent collection removed deduplicated content: restore it from
                // staging (still ours) and commit again.
                CommitOutcome::ContentMissing if attempts < 5 => continue,
                CommitOutcome::ContentMissing => {
                    return Err(RegistryError::broken(
                        "content kept vanishing during publication; retry",
                    ));
                }
                CommitOutcome::Created { skill, revision } => {
                    self.notify_change();
                    tracing::info!(
                        workspace,
                        skill = name,
                        revision = revision.revision,
                        digest,
                        "published"
                    );
                    return Ok(published(&skill, &revision, pkg.warnings, false));
                }
                CommitOutcome::Replayed { skill, revision } => {
                    return Ok(published(&skill, &revision, pkg.warnings, true));
                }
                CommitOutcome::Conflict { current_revision } => {
                    return Err(RegistryError::RevisionConflict {
                        current_revision,
                        base_revision,
                    });
                }
            }
        }
    }

    /// Content first: blobs, manifest, revision-cache tree; then one sync for all of it.
    async fn store_content(&self, pkg: &Package) -> Result<()> {
        let blobs = pkg
            .manifest
            .entries()
            .iter()
            .map(|e| (e.sha256, pkg.root.join(&e.path)))
            .collect();
        self.content.put_blob_files(blobs).await?;
        self.content
            .put_manifest(pkg.manifest.encode().into())
            .await?;
        let (cache, content, manifest, d) = (
            self.cache.clone(),
            self.content.clone(),
            pkg.manifest.clone(),
            pkg.digest,
        );
        let rt = tokio::runtime::Handle::current();
        let root = pkg.root.clone();
        tokio::task::spawn_blocking(move || {
            cache.ensure(&d, &manifest, Some(&root), &content, &rt)
        })
        .await
        .map_err(RegistryError::internal)??;
        self.content.sync().await
    }
}

/// Workspace and skill names follow the skill-name rule (SPEC §1).
pub(crate) fn validate_names(workspace: &str, name: &str) -> Result<()> {
    if !skillbox_package::is_valid_name(workspace) {
        return Err(RegistryError::BadRequest(format!(
            "invalid workspace name {workspace:?}: use 1–64 of a-z, 0-9 and single hyphens"
        )));
    }
    if !skillbox_package::is_valid_name(name) {
        return Err(RegistryError::BadRequest(format!(
            "invalid skill name {name:?}: use 1–64 of a-z, 0-9 and single hyphens"
        )));
    }
    Ok(())
}
