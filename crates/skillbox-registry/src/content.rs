//! The content store: file blobs addressed by SHA-256 and canonical manifests addressed by
//! revision digest, on the `object_store` crate. Objects are written create-if-absent and
//! never modified.
//!
//! Layout (keys): `blobs/sha256/<hex>`, `manifests/sha256/<hex>`.
//!
//! When the store is the local filesystem, blobs are added by hard-linking the staged upload
//! file into place (zero copy; `EEXIST` is deduplication) and durability comes from one
//! `syncfs` per publish instead of an fsync per file.

use crate::error::{RegistryError, Result};
use bytes::Bytes;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, path::Path as Key};
use skillbox_package::{Digest, Manifest, Sha256};
use std::path::{Path, PathBuf};
use std::sync::Arc;

#[derive(Clone)]
pub struct ContentStore {
    store: Arc<dyn ObjectStore>,
    /// Set when `store` is a `LocalFileSystem` rooted here: enables the hard-link fast paths.
    local_root: Option<PathBuf>,
}

pub fn blob_key(sha: &Sha256) -> Key {
    Key::from(format!("blobs/sha256/{sha}"))
}

pub fn manifest_key(digest: &Digest) -> Key {
    Key::from(format!("manifests/sha256/{}", digest.0))
}

impl ContentStore {
    /// A store on the local filesystem under `root`.
    pub fn local(root: &Path) -> Result<Self> {
        std::fs::create_dir_all(root.join("blobs/sha256"))?;
        std::fs::create_dir_all(root.join("manifests/sha256"))?;
        let fs = object_store::local::LocalFileSystem::new_with_prefix(root)?;
        Ok(ContentStore {
            store: Arc::new(fs),
            local_root: Some(root.to_path_buf()),
        })
    }

    /// A store on any `object_store` backend (S3 for scale-out).
    pub fn remote(store: Arc<dyn ObjectStore>) -> Self {
        ContentStore {
            store,
            local_root: None,
        }
    }

    pub fn object_store(&self) -> &Arc<dyn ObjectStore> {
        &self.store
    }

    /// The on-disk path of a blob when the store is local.
    pub fn local_blob_path(&self, sha: &Sha256) -> Option<PathBuf> {
        self.local_root
            .as_ref()
            .map(|r| r.join(format!("blobs/sha256/{sha}")))
    }

    /// Adds staged files as blobs, create-if-absent. Each `(sha, path)` must be a file whose
    /// content hashes to `sha` and that nobody modifies afterwards (it may become the blob).
    pub async fn put_blob_files(&self, files: Vec<(Sha256, PathBuf)>) -> Result<()> {
        if let Some(root) = self.local_root.clone() {
            return tokio::task::spawn_blocking(move || link_blobs(&root, &files))
                .await
                .map_err(RegistryError::internal)?;
        }
        for (sha, path) in files {
            let bytes = tokio::fs::read(&path).await?;
            self.put_create(&blob_key(&sha), Bytes::from(bytes)).await?;
        }
        Ok(())
    }

    /// Adds one blob from memory.
    pub async fn put_blob_bytes(&self, bytes: Bytes) -> Result<Sha256> {
        let sha = Sha256::of(&bytes);
        self.put_create(&blob_key(&sha), bytes).await?;
        Ok(sha)
    }

    pub async fn put_manifest(&self, manifest_bytes: Bytes) -> Result<Digest> {
        let digest = Digest(Sha256::of(&manifest_bytes));
        self.put_create(&manifest_key(&digest), manifest_bytes)
            .await?;
        Ok(digest)
    }

    async fn put_create(&self, key: &Key, bytes: Bytes) -> Result<()> {
        let opts = PutOptions {
            mode: PutMode::Create,
            ..Default::default()
        };
        match self.store.put_opts(key, bytes.into(), opts).await {
            Ok(_) | Err(object_store::Error::AlreadyExists { .. }) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Loads and parses a manifest; `None` if it is not in the store.
    pub async fn get_manifest(&self, digest: &Digest) -> Result<Option<Manifest>> {
        let bytes = match self.store.get(&manifest_key(digest)).await {
            Ok(r) => r.bytes().await?,
            Err(object_store::Error::NotFound { .. }) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        if Digest(Sha256::of(&bytes)) != *digest {
            return Err(RegistryError::broken(format!(
                "stored manifest {digest} does not match its digest"
            )));
        }
        Manifest::parse(&bytes)
            .map(Some)
            .map_err(RegistryError::internal)
    }

    pub async fn get_blob(&self, sha: &Sha256) -> Result<Option<Bytes>> {
        match self.store.get(&blob_key(sha)).await {
            Ok(r) => Ok(Some(r.bytes().await?)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// Makes everything written so far durable. Local: one `syncfs` of the store's filesystem.
    /// Remote stores acknowledge writes durably already.
    pub async fn sync(&self) -> Result<()> {
        if let Some(root) = self.local_root.clone() {
            tokio::task::spawn_blocking(move || -> std::io::Result<()> {
                let dir = std::fs::File::open(&root)?;
                nix::unistd::syncfs(&dir).map_err(std::io::Error::from)
            })
            .await
            .map_err(RegistryError::internal)??;
        }
        Ok(())
    }

    /// Every object under `prefix` named by a SHA-256: hash, size, last modified.
    async fn list_hashed(&self, prefix: &str) -> Result<Vec<(Sha256, u64, std::time::SystemTime)>> {
        use futures_util::TryStreamExt;
        let metas: Vec<_> = self
            .store
            .list(Some(&Key::from(prefix)))
            .try_collect()
            .await?;
        Ok(metas
            .into_iter()
            .filter_map(|m| {
                Some((
                    Sha256::from_hex(m.location.filename()?)?,
                    m.size,
                    std::time::SystemTime::from(m.last_modified),
                ))
            })
            .collect())
    }

    /// Every blob: hash, size, last modified.
    pub async fn list_blob_meta(&self) -> Result<Vec<(Sha256, u64, std::time::SystemTime)>> {
        self.list_hashed("blobs/sha256").await
    }

    /// How many blobs the store holds and their bytes, asked of the store itself (local or
    /// remote alike).
    pub async fn usage(&self) -> Result<StoreUsage> {
        let blobs = self.list_blob_meta().await?;
        Ok(StoreUsage {
            blobs: blobs.len() as u64,
            blob_bytes: blobs.iter().map(|(_, size, _)| size).sum(),
        })
    }

    /// Every manifest: digest, last modified.
    pub async fn list_manifests(&self) -> Result<Vec<(Digest, std::time::SystemTime)>> {
        Ok(self
            .list_hashed("manifests/sha256")
            .await?
            .into_iter()
            .map(|(sha, _, modified)| (Digest(sha), modified))
            .collect())
    }

    pub async fn delete_blob(&self, sha: &Sha256) -> Result<()> {
        match self.store.delete(&blob_key(sha)).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    pub async fn delete_manifest(&self, digest: &Digest) -> Result<()> {
        match self.store.delete(&manifest_key(digest)).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Whether all these objects are present (local stores only; a remote store answers
    /// true and relies on its own conditional writes).
    pub fn all_present_locally(&self, blobs: &[Sha256], manifest: &Digest) -> bool {
        let Some(root) = &self.local_root else {
            return true;
        };
        root.join(format!("manifests/sha256/{}", manifest.0))
            .is_file()
            && self.all_blobs_present_locally(blobs)
    }

    /// Like [`ContentStore::all_present_locally`], for blobs only.
    pub fn all_blobs_present_locally(&self, blobs: &[Sha256]) -> bool {
        let Some(root) = &self.local_root else {
            return true;
        };
        blobs
            .iter()
            .all(|b| root.join(format!("blobs/sha256/{b}")).is_file())
    }

    /// Every blob hash in the store.
    pub async fn list_blobs(&self) -> Result<Vec<Sha256>> {
        use futures_util::TryStreamExt;
        let prefix = Key::from("blobs/sha256");
        let metas: Vec<_> = self.store.list(Some(&prefix)).try_collect().await?;
        Ok(metas
            .iter()
            .filter_map(|m| m.location.filename().and_then(Sha256::from_hex))
            .collect())
    }
}

/// The directory of a `--store` URL: `file:///ABS/PATH`. Other schemes are refused with what
/// works (S3 is the scale-out issue's).
pub fn store_path(url: &str) -> Result<PathBuf> {
    let refuse = |why: &str| {
        RegistryError::BadRequest(format!(
            "--store {url:?}: {why}; use file:///ABSOLUTE/PATH (s3:// stores are not built yet)"
        ))
    };
    let path = url
        .strip_prefix("file://")
        .ok_or_else(|| refuse("unsupported store URL"))?;
    if !path.starts_with('/') {
        return Err(refuse("the path must be absolute"));
    }
    Ok(PathBuf::from(path))
}

fn link_blobs(root: &Path, files: &[(Sha256, PathBuf)]) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    for (sha, path) in files {
        let target = root.join(format!("blobs/sha256/{sha}"));
        // The staged file becomes the blob inode; blobs are read-only.
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o444))?;
        match std::fs::hard_link(path, &target) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            // A store on another file system than the data directory: copy, then link the
            // complete copy into place (a reader never sees a partial blob).
            Err(e) if e.kind() == std::io::ErrorKind::CrossesDevices => {
                let tmp = root.join(format!(
                    "blobs/.incoming-{}",
                    skillbox_package::staging::unique_name("")
                ));
                std::fs::copy(path, &tmp)?;
                std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o444))?;
                let linked = std::fs::hard_link(&tmp, &target);
                std::fs::remove_file(&tmp)?;
                match linked {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                    Err(e) => return Err(e.into()),
                }
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// What the content store holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StoreUsage {
    pub blobs: u64,
    pub blob_bytes: u64,
}
