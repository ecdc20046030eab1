//! Garbage collection (SPEC §4.10).
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
//!
//! One collection at a time: in the process by a mutex, across servers on PostgreSQL by an
//! advisory lock held for the whole collection ([`MetaStore::gc_lock`]). A collection that
//! cannot read a live revision's manifest deletes no blobs at all (it cannot know which of
//! them that revision needs).
//!
//! [`MetaStore::gc_lock`]: crate::MetaStore::gc_lock

use crate::Registry;
use crate::error::{RegistryError, Result};
use crate::meta::now_ms;
use skillbox_api::{CollectedRevision, GcReport};
use skillbox_package::{Digest, Sha256};
use std::collections::HashSet;
use std::time::Duration;

impl Registry {
    /// Runs a collection. `dry_run` reports what would be collected and changes nothing.
    pub async fn gc(&self, dry_run: bool, grace: Duration) -> Result<GcReport> {
        let _one_at_a_time = if dry_run {
            None
        } else {
            Some(self.meta.gc_lock().await?)
        };
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
            self.meta.collectable(now, cutoff).await?
        } else {
            self.meta.collect(now, cutoff).await?
        };
        for c in collected.iter().cloned() {
            let s = self.meta.skill_by_id(&c.skill_id).await?;
            report.revisions.push(CollectedRevision {
                workspace: s.as_ref().map(|s| s.workspace.clone()).unwrap_or_default(),
                skill: s.map(|s| s.name).unwrap_or_default(),
                skill_id: c.skill_id,
                revision: c.revision,
                digest: c.digest,
            });
        }
        if !collected.is_empty() && !dry_run {
            self.pin_cache.bump();
            self.notify_change();
        }

        // 2. content: what no live revision and no draft references, older than the grace.
        let mut live = self.meta.live_digests().await?;
        if dry_run {
            for c in &report.revisions {
                live.remove(&c.digest);
            }
        }
        let mut referenced: HashSet<Sha256> = HashSet::new();
        let mut unreadable_live_manifests = 0;
        for d in &live {
            let digest: Digest = d.parse().map_err(RegistryError::internal)?;
            match self.content.get_manifest(&digest).await? {
                Some(m) => referenced.extend(m.entries().iter().map(|e| e.sha256)),
                None => unreadable_live_manifests += 1,
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
        let blob_candidates: Vec<(Sha256, u64)> = if unreadable_live_manifests > 0 {
            tracing::error!(
                unreadable_live_manifests,
                "live revisions whose manifest is missing or corrupt: no blob is collected (run fsck)"
            );
            Vec::new()
        } else {
            self.content.list_blob_meta().await?
        }
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
        let sweep = self.meta.content_sweep().await?;
        let live_now = sweep.live.clone();
        let mut sweep_blobs = true;
        for d in live_now.difference(&live) {
            let digest: Digest = d.parse().map_err(RegistryError::internal)?;
            match self.content.get_manifest(&digest).await? {
                Some(m) => referenced.extend(m.entries().iter().map(|e| e.sha256)),
                None => sweep_blobs = false,
            }
        }
        referenced.extend(sweep.draft_blobs.iter().copied());
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
            .filter(|(sha, _)| sweep_blobs && !referenced.contains(sha))
        {
            self.content.delete_blob(sha).await?;
            report.blobs_removed += 1;
            report.bytes_freed += size;
        }
        sweep.finish().await?;
        self.manifests.retain(|d| live_now.contains(&d.to_string()));
        self.frontmatters
            .retain(|d| live_now.contains(&d.to_string()));
        self.activation_answers
            .retain(|d| live_now.contains(&d.to_string()));
        tracing::info!(
            revisions = report.revisions.len(),
            trees = report.trees_removed,
            blobs = report.blobs_removed,
            bytes = report.bytes_freed,
            "garbage collected"
        );
        Ok(report)
    }
}
