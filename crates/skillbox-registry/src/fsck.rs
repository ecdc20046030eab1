//! `fsck`: re-verify stored content against digests. Reports; changes nothing.

use crate::Registry;
use crate::error::Result;
use skillbox_api::{FsckProblem, FsckReport};
use skillbox_package::{Digest, Sha256, intake};
use std::collections::HashSet;

impl Registry {
    pub async fn fsck(&self) -> Result<FsckReport> {
        let mut problems = Vec::new();
        let mut push =
            |object: String, message: String| problems.push(FsckProblem { object, message });
        let blobs = self.content.list_blobs().await?;
        let present: HashSet<Sha256> = blobs.iter().copied().collect();
        let mut corrupt: HashSet<Sha256> = HashSet::new();
        for sha in &blobs {
            match self.content.get_blob_unverified(sha).await? {
                Some(bytes) if Sha256::of(&bytes) == *sha => {}
                Some(_) => {
                    corrupt.insert(*sha);
                    push(
                        format!("blob {sha}"),
                        "content does not match its hash (treated as missing: never served)".into(),
                    )
                }
                None => push(format!("blob {sha}"), "listed but unreadable".into()),
            }
        }
        let revisions = self.meta.available_revisions().await?;
        let mut trees_checked = 0;
        for rev in &revisions {
            let object = format!(
                "revision {} of skill {} ({})",
                rev.revision, rev.skill_id, rev.digest
            );
            let Ok(digest) = rev.digest.parse::<Digest>() else {
                push(object, "digest is malformed".into());
                continue;
            };
            let manifest = match self.content.get_manifest(&digest).await {
                Ok(Some(m)) => m,
                Ok(None) => {
                    push(
                        object,
                        "manifest missing from the content store or not matching its digest".into(),
                    );
                    continue;
                }
                Err(e) => {
                    push(object, format!("manifest unusable: {e}"));
                    continue;
                }
            };
            for e in manifest.entries() {
                if !present.contains(&e.sha256) || corrupt.contains(&e.sha256) {
                    push(
                        object.clone(),
                        format!("blob {} of {} is missing or corrupt", e.sha256, e.path),
                    );
                }
            }
            // This server's revision cache is filled on demand from the store: a tree it does
            // not hold is not a problem, a tree it holds must match.
            let tree = self.cache.tree_path(&digest);
            if !tree.is_dir() {
                continue;
            }
            trees_checked += 1;
            let checked =
                tokio::task::spawn_blocking(move || intake::verify_tree(&tree, &manifest))
                    .await
                    .map_err(crate::RegistryError::internal)?;
            if let Err(why) = checked {
                push(
                    object,
                    format!("revision-cache tree does not match the manifest: {why}"),
                );
            }
        }
        Ok(FsckReport {
            ok: problems.is_empty(),
            blobs_checked: blobs.len(),
            revisions_checked: revisions.len(),
            trees_checked,
            problems,
        })
    }
}
