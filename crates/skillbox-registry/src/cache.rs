//! The revision cache: every published revision as a read-only directory tree
//! (`trees/<digest-hex>/`, files 0444 or 0555, directories 0555), for bind-mounting into
//! sandboxes and for serving reads without touching the blob store.
//!
//! Trees are keyed by digest, so identical packages share one tree. A tree is built in
//! staging — hard-linked from local blobs where modes allow, else copied and hashed —
//! verified against the manifest, made read-only, then renamed into place. A tree is never
//! modified or replaced once in place.

use crate::content::ContentStore;
use crate::error::{RegistryError, Result};
use skillbox_package::write::{DirWriteOptions, create_file, finish_tree, staged_tree};
use skillbox_package::{Digest, Manifest, Sha256};
use std::io::Write;
use std::path::{Path, PathBuf};

#[derive(Clone)]
pub struct RevisionCache {
    root: PathBuf,
    staging: PathBuf,
    memory: std::sync::Arc<SmallFiles>,
}

impl RevisionCache {
    pub fn new(root: PathBuf, staging: PathBuf) -> std::io::Result<Self> {
        std::fs::create_dir_all(&root)?;
        std::fs::create_dir_all(&staging)?;
        Ok(RevisionCache {
            root,
            staging,
            memory: Default::default(),
        })
    }

    pub fn tree_path(&self, digest: &Digest) -> PathBuf {
        self.root.join(digest.0.to_hex())
    }

    /// Builds the tree for `manifest` unless it exists, from `source_dir` (a package root whose
    /// files were verified against the manifest) or else from the content store. Blocking;
    /// call from a blocking task. Does not sync: the caller batches durability.
    pub fn ensure(
        &self,
        digest: &Digest,
        manifest: &Manifest,
        source_dir: Option<&Path>,
        content: &ContentStore,
        rt: &tokio::runtime::Handle,
    ) -> Result<PathBuf> {
        let dest = self.tree_path(digest);
        if dest.is_dir() {
            return Ok(dest);
        }
        let (staging, tree) = staged_tree(&self.staging, "tree-", "t")?;
        for entry in manifest.entries() {
            let target = tree.join(&entry.path);
            if let Some(p) = target.parent() {
                std::fs::create_dir_all(p)?;
            }
            // Prefer the caller's verified local copy (a publisher's staging), then the blob.
            let local = match source_dir {
                Some(dir) => Some(dir.join(&entry.path)),
                None => content.local_blob_path(&entry.sha256),
            };
            let linked = match &local {
                Some(blob) if !entry.executable => std::fs::hard_link(blob, &target).is_ok(),
                _ => false,
            };
            if linked {
                let len = std::fs::metadata(&target)?.len();
                if len != entry.size {
                    return Err(RegistryError::broken(format!(
                        "blob {} has {len} bytes, manifest says {}",
                        entry.sha256, entry.size
                    )));
                }
                continue;
            }
            let bytes = match &local {
                Some(blob) => std::fs::read(blob).map_err(|e| missing(&entry.sha256, e))?,
                None => rt
                    .block_on(content.get_blob(&entry.sha256))?
                    .ok_or_else(|| {
                        RegistryError::broken(format!(
                            "blob {} missing from the store",
                            entry.sha256
                        ))
                    })?
                    .to_vec(),
            };
            if bytes.len() as u64 != entry.size || Sha256::of(&bytes) != entry.sha256 {
                return Err(RegistryError::broken(format!(
                    "blob {} does not match its hash",
                    entry.sha256
                )));
            }
            create_file(&tree, &entry.path, entry.executable)?.write_all(&bytes)?;
        }
        finish_tree(
            &tree,
            DirWriteOptions {
                read_only: true,
                sync: false,
            },
        )?;
        match staging.commit(Some(Path::new("t")), &dest) {
            Ok(()) => Ok(dest),
            // Another publisher of the same digest won the rename: theirs is identical.
            Err(_) if dest.is_dir() => Ok(dest),
            Err(e) => Err(e.into()),
        }
    }

    /// The directory holding all trees.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// How many trees the cache holds. Blocking (a directory scan).
    pub fn tree_count(&self) -> u64 {
        std::fs::read_dir(&self.root)
            .map(|rd| rd.count() as u64)
            .unwrap_or(0)
    }

    /// Removes a tree (revocation, collection), and forgets every small file held in memory:
    /// whatever was cached is gone, and removals are rare enough that sorting out which
    /// files were the tree's is not worth it.
    pub fn remove(&self, digest: &Digest) -> std::io::Result<()> {
        self.memory.clear();
        skillbox_package::staging::remove_tree(&self.tree_path(digest))
    }

    /// A small file's bytes held in memory, by content hash.
    pub fn remembered(&self, sha: &Sha256) -> Option<bytes::Bytes> {
        self.memory.get(sha)
    }

    /// Holds a small file's verified bytes in memory for later reads.
    pub fn remember(&self, sha: Sha256, bytes: &bytes::Bytes) {
        self.memory.insert(sha, bytes)
    }
}

/// Small files' bytes by content hash, in memory, for the pinned-read hot path (no open,
/// read and close per request). Content never changes under its hash, so an entry never goes
/// stale; whether a file may be read at all (run, pin, revocation) is decided before it is
/// looked up here. Bounded by bytes: past the bound it starts afresh.
#[derive(Default)]
struct SmallFiles {
    entries: std::sync::Mutex<(std::collections::HashMap<Sha256, bytes::Bytes>, usize)>,
}

impl SmallFiles {
    const MAX_BYTES: usize = 64 << 20;
    /// Larger files are rare on the hot path and would crowd out many small ones.
    const MAX_FILE: usize = 256 << 10;

    fn get(&self, sha: &Sha256) -> Option<bytes::Bytes> {
        self.entries.lock().ok()?.0.get(sha).cloned()
    }

    fn insert(&self, sha: Sha256, bytes: &bytes::Bytes) {
        if bytes.len() > Self::MAX_FILE {
            return;
        }
        if let Ok(mut guard) = self.entries.lock() {
            let (entries, held) = &mut *guard;
            if *held + bytes.len() > Self::MAX_BYTES {
                entries.clear();
                *held = 0;
            }
            if entries.insert(sha, bytes.clone()).is_none() {
                *held += bytes.len();
            }
        }
    }

    fn clear(&self) {
        if let Ok(mut guard) = self.entries.lock() {
            *guard = Default::default();
        }
    }
}

fn missing(sha: &Sha256, e: std::io::Error) -> RegistryError {
    RegistryError::context(format!("blob {sha} cannot be read"), e)
}
