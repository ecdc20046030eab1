//! Garbage collection (SPEC §4.10) and revocation.
//!
//! Roots: the current revision of every active skill, every revision pinned by a live run
//! (state `active`, lease not lapsed), every revision younger than the grace period, and every
//! blob a draft references. Collection marks revisions `collected` (a tombstone row stays;
//! numbers are never reused) in one transaction that re-evaluates the roots, so a concurrent
//! activation (which locks the revision row) lands before or after it, never between.
//!
//! Content is deleted inside a write transaction that re-reads the live digests, so it is
//! ordered against publication commits: a publisher that deduplicated against a blob (or
//! tree, or manifest) the collector removes finds it missing in its own commit transaction,
//! restores it from its staging copy, and commits again. Blobs and trees younger than the
//! grace period are never deleted either.

use crate::Registry;
use crate::error::{RegistryError, Result};
use crate::meta::{Dialect, MetaStore, now_ms};
use skillbox_api::{CollectedRevision, GcReport, Revoked};
use skillbox_package::{Digest, Sha256};
use sqlx::Row;
use std::collections::HashSet;
use std::time::Duration;

const COLLECTABLE: &str = "state = 'available' AND published_at <= $2
    AND NOT EXISTS (SELECT 1 FROM skills s WHERE s.id = revisions.skill_id AND s.state = 'active' AND s.current_revision = revisions.revision)
    AND NOT EXISTS (SELECT 1 FROM pins p JOIN runs r ON r.id = p.run_id
                    WHERE p.skill_id = revisions.skill_id AND p.revision = revisions.revision AND r.state = 'active' AND r.expires_at > $1)";

impl MetaStore {
    /// Blocks concurrent pin inserts and revision commits until `tx` ends (PostgreSQL; on
    /// SQLite the write transaction already excludes every other writer).
    pub(crate) async fn lock_for_gc(&self, tx: &mut crate::meta::Tx) -> Result<()> {
        if self.dialect() == Dialect::Postgres {
            sqlx::query("LOCK TABLE revisions, pins, draft_files IN SHARE ROW EXCLUSIVE MODE")
                .execute(&mut **tx)
                .await?;
        }
        Ok(())
    }
}

async fn live_digests(tx: &mut crate::meta::Tx) -> Result<HashSet<String>> {
    let rows = sqlx::query("SELECT DISTINCT digest FROM revisions WHERE state = 'available'")
        .fetch_all(&mut **tx)
        .await?;
    rows.iter()
        .map(|r| Ok(r.try_get::<String, _>(0)?))
        .collect()
}

impl Registry {
    /// Runs a collection. `dry_run` reports what would be collected and changes nothing.
    pub async fn gc(&self, dry_run: bool, grace: Duration) -> Result<GcReport> {
        let now = now_ms();
        let cutoff = now - grace.as_millis() as i64;
        let mut report = GcReport {
            dry_run,
            grace_seconds: grace.as_secs(),
            ..Default::default()
        };
        if !dry_run {
            report.runs_expired = self.expire_runs().await?;
        }

        // 1. revisions
        let collected = if dry_run {
            let q = format!("SELECT skill_id, revision, digest FROM revisions WHERE {COLLECTABLE}");
            sqlx::query(sqlx::AssertSqlSafe(q))
                .bind(now)
                .bind(cutoff)
                .fetch_all(self.meta.pool())
                .await?
        } else {
            let mut tx = self.meta.write_tx().await?;
            self.meta.lock_for_gc(&mut tx).await?;
            let q = format!(
                "UPDATE revisions SET state = 'collected', state_changed_at = $1 WHERE {COLLECTABLE} RETURNING skill_id, revision, digest"
            );
            let rows = sqlx::query(sqlx::AssertSqlSafe(q))
                .bind(now)
                .bind(cutoff)
                .fetch_all(&mut *tx)
                .await?;
            for r in &rows {
                let (skill_id, revision, digest): (String, i64, String) =
                    (r.try_get(0)?, r.try_get(1)?, r.try_get(2)?);
                let s = sqlx::query("SELECT workspace, name FROM skills WHERE id = $1")
                    .bind(&skill_id)
                    .fetch_one(&mut *tx)
                    .await?;
                let (ws, name): (String, String) = (s.try_get(0)?, s.try_get(1)?);
                MetaStore::append_event(
                    &mut tx,
                    &ws,
                    "revision.collected",
                    serde_json::json!({"skill": name, "skill_id": skill_id, "revision": revision, "digest": digest}),
                )
                .await?;
            }
            tx.commit().await?;
            rows
        };
        for r in &collected {
            let (skill_id, revision, digest): (String, i64, String) =
                (r.try_get(0)?, r.try_get(1)?, r.try_get(2)?);
            let s = self.meta.skill_by_id(&skill_id).await?;
            report.revisions.push(CollectedRevision {
                workspace: s.as_ref().map(|s| s.workspace.clone()).unwrap_or_default(),
                skill: s.map(|s| s.name).unwrap_or_default(),
                skill_id,
                revision,
                digest,
            });
        }
        if !collected.is_empty() && !dry_run {
            self.pin_cache.bump();
            self.notify_change();
        }

        // 2. content: what no live revision and no draft references, older than the grace.
        let mut snapshot_tx = self.meta.pool().begin().await?;
        let mut live = live_digests(&mut snapshot_tx).await?;
        snapshot_tx.commit().await?;
        if dry_run {
            for c in &report.revisions {
                live.remove(&c.digest);
            }
        }
        let mut referenced: HashSet<Sha256> = HashSet::new();
        for d in &live {
            let digest: Digest = d.parse().map_err(RegistryError::internal)?;
            if let Some(m) = self.content.get_manifest(&digest).await? {
                referenced.extend(m.entries().iter().map(|e| e.sha256));
            }
        }
        for h in self.meta.draft_blob_refs().await? {
            if let Some(sha) = Sha256::from_hex(&h) {
                referenced.insert(sha);
            }
        }
        let old_enough =
            |t: std::time::SystemTime| t.elapsed().map(|age| age >= grace).unwrap_or(false);
        let tree_candidates: Vec<Digest> = std::fs::read_dir(self.cache.root())?
            .flatten()
            .filter_map(|e| {
                let d = Digest(Sha256::from_hex(&e.file_name().to_string_lossy())?);
                let modified = e.metadata().ok()?.modified().ok()?;
                (!live.contains(&d.to_string()) && old_enough(modified)).then_some(d)
            })
            .collect();
        let manifest_candidates: Vec<Digest> = self
            .content
            .list_manifests()
            .await?
            .into_iter()
            .filter(|(d, modified)| !live.contains(&d.to_string()) && old_enough(*modified))
            .map(|(d, _)| d)
            .collect();
        let blob_candidates: Vec<(Sha256, u64)> = self
            .content
            .list_blob_meta()
            .await?
            .into_iter()
            .filter(|(sha, _, modified)| !referenced.contains(sha) && old_enough(*modified))
            .map(|(sha, size, _)| (sha, size))
            .collect();
        if dry_run {
            report.trees_removed = tree_candidates.len();
            report.manifests_removed = manifest_candidates.len();
            report.blobs_removed = blob_candidates.len();
            report.bytes_freed = blob_candidates.iter().map(|(_, s)| s).sum();
            return Ok(report);
        }

        // Delete under the write lock, after re-reading what became live meanwhile.
        let mut tx = self.meta.write_tx().await?;
        self.meta.lock_for_gc(&mut tx).await?;
        let live_now = live_digests(&mut tx).await?;
        for d in live_now.difference(&live) {
            let digest: Digest = d.parse().map_err(RegistryError::internal)?;
            if let Some(m) = self.content.get_manifest(&digest).await? {
                referenced.extend(m.entries().iter().map(|e| e.sha256));
            }
        }
        let drafts_now = sqlx::query("SELECT DISTINCT sha256 FROM draft_files")
            .fetch_all(&mut *tx)
            .await?;
        for r in drafts_now {
            if let Some(sha) = Sha256::from_hex(&r.try_get::<String, _>(0)?) {
                referenced.insert(sha);
            }
        }
        for d in tree_candidates
            .iter()
            .filter(|d| !live_now.contains(&d.to_string()))
        {
            self.cache.remove(d)?;
            report.trees_removed += 1;
        }
        for d in manifest_candidates
            .iter()
            .filter(|d| !live_now.contains(&d.to_string()))
        {
            self.content.delete_manifest(d).await?;
            report.manifests_removed += 1;
        }
        for (sha, size) in blob_candidates
            .iter()
            .filter(|(sha, _)| !referenced.contains(sha))
        {
            self.content.delete_blob(sha).await?;
            report.blobs_removed += 1;
            report.bytes_freed += size;
        }
        tx.commit().await?;
        self.manifests.retain(|d| live_now.contains(&d.to_string()));
        tracing::info!(
            revisions = report.revisions.len(),
            trees = report.trees_removed,
            blobs = report.blobs_removed,
            bytes = report.bytes_freed,
            "garbage collected"
        );
        Ok(report)
    }

    /// Emergency revocation of one revision: reads, activations and executions of it fail
    /// with `revision_revoked`; its tree is removed; if it was current the pointer falls back
    /// to the newest available older revision (or none), by compare-and-swap.
    pub async fn revoke(
        &self,
        workspace: &str,
        name: &str,
        revision: i64,
        reason: &str,
    ) -> Result<Revoked> {
        let skill = self.skill(workspace, name).await?;
        let now = now_ms();
        let mut tx = self.meta.write_tx().await?;
        let done = sqlx::query(
            "UPDATE revisions SET state = 'revoked', state_reason = $3, state_changed_at = $4
             WHERE skill_id = $1 AND revision = $2 AND state = 'available' RETURNING digest",
        )
        .bind(&skill.id)
        .bind(revision)
        .bind(reason)
        .bind(now)
        .fetch_optional(&mut *tx)
        .await?;
        let digest: String = match done {
            Some(r) => r.try_get(0)?,
            None => {
                let row = sqlx::query("SELECT state, digest, state_reason FROM revisions WHERE skill_id = $1 AND revision = $2")
                    .bind(&skill.id)
                    .bind(revision)
                    .fetch_optional(&mut *tx)
                    .await?;
                return match row {
                    Some(r) if r.try_get::<String, _>(0)? == "revoked" => {
                        let cur = sqlx::query("SELECT current_revision FROM skills WHERE id = $1")
                            .bind(&skill.id)
                            .fetch_one(&mut *tx)
                            .await?;
                        Ok(Revoked {
                            skill: name.into(),
                            skill_id: skill.id.clone(),
                            revision,
                            digest: r.try_get(1)?,
                            state: "revoked".into(),
                            reason: r.try_get::<Option<String>, _>(2)?.unwrap_or_default(),
                            current_revision: cur.try_get(0)?,
                        })
                    }
                    Some(r) => Err(RegistryError::NotFound(format!(
                        "revision {revision} of {name:?} is {}",
                        r.try_get::<String, _>(0)?
                    ))),
                    None => Err(RegistryError::NotFound(format!(
                        "skill {name:?} has no revision {revision}"
                    ))),
                };
            }
        };
        let cur: i64 = sqlx::query("SELECT current_revision FROM skills WHERE id = $1")
            .bind(&skill.id)
            .fetch_one(&mut *tx)
            .await?
            .try_get(0)?;
        let mut current_revision = cur;
        if cur == revision {
            let fallback: Option<i64> = sqlx::query("SELECT MAX(revision) FROM revisions WHERE skill_id = $1 AND revision < $2 AND state = 'available'")
                .bind(&skill.id)
                .bind(revision)
                .fetch_one(&mut *tx)
                .await?
                .try_get(0)?;
            let fallback = fallback.unwrap_or(0);
            sqlx::query("UPDATE skills SET current_revision = $3, updated_at = $4 WHERE id = $1 AND current_revision = $2")
                .bind(&skill.id)
                .bind(revision)
                .bind(fallback)
                .bind(now)
                .execute(&mut *tx)
                .await?;
            MetaStore::append_event(
                &mut tx,
                workspace,
                "skill.current_moved",
                serde_json::json!({"skill": name, "skill_id": skill.id, "revision": fallback, "base_revision": revision, "cause": "revocation"}),
            )
            .await?;
            current_revision = fallback;
        }
        MetaStore::append_event(
            &mut tx,
            workspace,
            "revision.revoked",
            serde_json::json!({"skill": name, "skill_id": skill.id, "revision": revision, "digest": digest, "reason": reason}),
        )
        .await?;
        // Is the tree shared with another available revision (same digest)?
        let shared: i64 =
            sqlx::query("SELECT COUNT(*) FROM revisions WHERE digest = $1 AND state = 'available'")
                .bind(&digest)
                .fetch_one(&mut *tx)
                .await?
                .try_get(0)?;
        tx.commit().await?;
        if shared == 0 {
            let d: Digest = digest.parse().map_err(RegistryError::internal)?;
            self.cache.remove(&d)?;
        }
        self.pin_cache.bump();
        self.notify_change();
        let _ = self.revocations.send((skill.id.clone(), revision));
        tracing::warn!(
            workspace,
            skill = name,
            revision,
            reason,
            "revision revoked"
        );
        Ok(Revoked {
            skill: name.into(),
            skill_id: skill.id,
            revision,
            digest,
            state: "revoked".into(),
            reason: reason.into(),
            current_revision,
        })
    }
}
