//! The content store: file blobs addressed by SHA-256 and canonical manifests addressed by
//! revision digest, on the `object_store` crate. Objects are written create-if-absent and
//! never modified.
//!
//! Layout (keys): `blobs/sha256/<hex>`, `manifests/sha256/<hex>`.
//!
//! When the store is the local filesystem, blobs are added by hard-linking the staged upload
//! file into place (zero copy; `EEXIST` is deduplication) and durability comes from one
//! `syncfs` per publish instead of an fsync per file. On S3 (`s3://BUCKET[/PREFIX]`) every
//! object is a conditional `PUT` (`If-None-Match: *`), durable when acknowledged.
//!
//! Every object read back is verified against its hash; one that fails is treated as missing
//! (and logged), so wrong bytes are never served, cached or mounted.

use crate::error::{RegistryError, Result};
use bytes::Bytes;
use futures_util::future::BoxFuture;
use futures_util::{StreamExt, TryStreamExt};
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, path::Path as Key};
use skillbox_package::{Digest, Manifest, Sha256};
use std::path::{Path, PathBuf};
use std::sync::Arc;

#[derive(Clone)]
pub struct ContentStore {
    store: Arc<dyn ObjectStore>,
    /// Set when `store` is a `LocalFileSystem` rooted here: enables the hard-link fast paths.
    local_root: Option<PathBuf>,
    /// The last [`ContentStore::usage`] of a remote store and when it was measured: a listing
    /// of a whole bucket is too dear for every metrics scrape.
    usage_memo: Arc<std::sync::Mutex<Option<(std::time::Instant, StoreUsage)>>>,
}

/// How long a remote store's measured usage is reused.
const REMOTE_USAGE_TTL: std::time::Duration = std::time::Duration::from_secs(60);

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
            usage_memo: Default::default(),
        })
    }

    /// A store on any `object_store` backend (S3 for scale-out).
    pub fn remote(store: Arc<dyn ObjectStore>) -> Self {
        ContentStore {
            store,
            local_root: None,
            usage_memo: Default::default(),
        }
    }

    /// The store a `--store` URL names. An S3 store takes its endpoint, region and credentials
    /// from the standard `AWS_*` variables; it is not contacted here (see [`ContentStore::ping`]).
    pub fn open(url: &StoreUrl) -> Result<Self> {
        match url {
            StoreUrl::Local(root) => Self::local(root),
            StoreUrl::S3 { bucket, prefix } => {
                use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
                use object_store::{ClientConfigKey, RetryConfig};
                // Fail fast on an outage (a 503 to the client, `/healthz` red) instead of the
                // crate's default of retrying for minutes.
                let retry = RetryConfig {
                    max_retries: 3,
                    retry_timeout: std::time::Duration::from_secs(10),
                    ..Default::default()
                };
                // Set as keys, not as a whole `ClientOptions`, so that the AWS_* variables'
                // client settings (AWS_ALLOW_HTTP) stay.
                let mut builder = AmazonS3Builder::from_env()
                    .with_bucket_name(bucket)
                    .with_retry(retry)
                    .with_config(
                        AmazonS3ConfigKey::Client(ClientConfigKey::ConnectTimeout),
                        "3s",
                    )
                    .with_config(AmazonS3ConfigKey::Client(ClientConfigKey::Timeout), "60s");
                if std::env::var_os("AWS_REGION").is_none()
                    && std::env::var_os("AWS_DEFAULT_REGION").is_none()
                {
                    builder = builder.with_region("us-east-1");
                }
                let s3 = builder.build().map_err(|e| {
                    RegistryError::BadRequest(format!(
                        "--store {url}: {e}; S3 settings come from AWS_ENDPOINT_URL, AWS_REGION, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and AWS_ALLOW_HTTP"
                    ))
                })?;
                let store: Arc<dyn ObjectStore> = match prefix {
                    Some(p) => Arc::new(object_store::prefix::PrefixStore::new(s3, p.as_str())),
                    None => Arc::new(s3),
                };
                Ok(Self::remote(store))
            }
        }
    }

    /// A round trip to the store: a listing of the manifests' top level (cheap on any size).
    pub async fn ping(&self) -> Result<()> {
        self.store
            .list_with_delimiter(Some(&Key::from("manifests")))
            .await?;
        Ok(())
    }

    /// Whether the store is the local file system (hard links, `syncfs`) rather than remote.
    pub fn is_local(&self) -> bool {
        self.local_root.is_some()
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
        // Several uploads in flight: a remote store's latency, not its bandwidth, is the cost.
        futures_util::stream::iter(files)
            .map(|(sha, path)| async move {
                let bytes = tokio::fs::read(&path).await?;
                self.put_create(&blob_key(&sha), Bytes::from(bytes)).await
            })
            .buffer_unordered(REMOTE_CONCURRENCY)
            .try_collect::<()>()
            .await
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

    /// Loads and parses a manifest; `None` if it is not in the store or fails verification.
    pub async fn get_manifest(&self, digest: &Digest) -> Result<Option<Manifest>> {
        let Some(bytes) = self.get_verified(&manifest_key(digest), &digest.0).await? else {
            return Ok(None);
        };
        Manifest::parse(&bytes)
            .map(Some)
            .map_err(RegistryError::internal)
    }

    /// A blob's bytes; `None` if it is not in the store or fails verification.
    pub async fn get_blob(&self, sha: &Sha256) -> Result<Option<Bytes>> {
        self.get_verified(&blob_key(sha), sha).await
    }

    /// What the store holds under a blob's key, unverified (for `fsck`, which reports).
    pub async fn get_blob_unverified(&self, sha: &Sha256) -> Result<Option<Bytes>> {
        self.get_raw(&blob_key(sha)).await
    }

    async fn get_raw(&self, key: &Key) -> Result<Option<Bytes>> {
        match self.store.get(key).await {
            Ok(r) => Ok(Some(r.bytes().await?)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    async fn get_verified(&self, key: &Key, sha: &Sha256) -> Result<Option<Bytes>> {
        let Some(bytes) = self.get_raw(key).await? else {
            return Ok(None);
        };
        if Sha256::of(&bytes) != *sha {
            tracing::error!(object = %key, "stored object does not match its hash: treated as missing");
            return Ok(None);
        }
        Ok(Some(bytes))
    }

    /// Whether these objects are all in the store (and, when given, the revision-cache tree
    /// exists): what a commit checks under the metadata write lock, which a collection's sweep
    /// also takes, so that a concurrent collection cannot leave a commit naming deleted
    /// content. Local: file tests. Remote: a `HEAD` per object, several in flight.
    pub fn presence_check(
        &self,
        blobs: Vec<Sha256>,
        manifest: Option<Digest>,
        tree: Option<PathBuf>,
    ) -> impl Fn() -> BoxFuture<'static, Result<bool>> + Send + Sync + use<> {
        let content = self.clone();
        let (blobs, tree) = (Arc::new(blobs), Arc::new(tree));
        move || {
            let (content, blobs, tree) = (content.clone(), blobs.clone(), tree.clone());
            Box::pin(async move {
                if let Some(tree) = tree.as_ref()
                    && content.is_local()
                    && !tree.is_dir()
                {
                    return Ok(false);
                }
                content.all_present(&blobs, manifest.as_ref()).await
            })
        }
    }

    async fn all_present(&self, blobs: &[Sha256], manifest: Option<&Digest>) -> Result<bool> {
        if let Some(root) = &self.local_root {
            return Ok(manifest
                .is_none_or(|m| root.join(format!("manifests/sha256/{}", m.0)).is_file())
                && blobs
                    .iter()
                    .all(|b| root.join(format!("blobs/sha256/{b}")).is_file()));
        }
        let keys = blobs.iter().map(blob_key).chain(manifest.map(manifest_key));
        let missing = futures_util::stream::iter(keys)
            .map(|key| async move {
                match self.store.head(&key).await {
                    Ok(_) => Ok(false),
                    Err(object_store::Error::NotFound { .. }) => Ok(true),
                    Err(e) => Err(RegistryError::from(e)),
                }
            })
            .buffer_unordered(REMOTE_CONCURRENCY)
            .try_any(std::future::ready)
            .await?;
        Ok(!missing)
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
    /// remote alike; a remote store's answer is reused for a minute).
    pub async fn usage(&self) -> Result<StoreUsage> {
        let remembered = self.usage_memo.lock().ok().and_then(|memo| *memo);
        if let Some((at, usage)) = remembered
            && !self.is_local()
            && at.elapsed() < REMOTE_USAGE_TTL
        {
            return Ok(usage);
        }
        let blobs = self.list_blob_meta().await?;
        let usage = StoreUsage {
            blobs: blobs.len() as u64,
            blob_bytes: blobs.iter().map(|(_, size, _)| size).sum(),
        };
        if let Ok(mut memo) = self.usage_memo.lock() {
            *memo = Some((std::time::Instant::now(), usage));
        }
        Ok(usage)
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

    /// Every blob hash in the store.
    pub async fn list_blobs(&self) -> Result<Vec<Sha256>> {
        let prefix = Key::from("blobs/sha256");
        let metas: Vec<_> = self.store.list(Some(&prefix)).try_collect().await?;
        Ok(metas
            .iter()
            .filter_map(|m| m.location.filename().and_then(Sha256::from_hex))
            .collect())
    }
}

/// Creates `bucket` on the S3 server the `AWS_*` variables name (a signed `PUT /BUCKET`), for
/// a first start on an empty server. An answer that the caller owns it already counts as done;
/// any other refusal (no right to create buckets, a name taken by someone else) is an error
/// saying what the server answered.
pub async fn create_bucket(bucket: &str) -> Result<()> {
    use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey, AwsAuthorizer, AwsCredential};
    use object_store::client::{HttpConnector, HttpRequestBody, ReqwestConnector};
    use object_store::{ClientConfigKey, ClientOptions};
    let env = AmazonS3Builder::from_env();
    let get = |key: AmazonS3ConfigKey| env.get_config_value(&key);
    let refuse =
        |why: String| RegistryError::BadRequest(format!("cannot create bucket {bucket:?}: {why}"));
    let region = get(AmazonS3ConfigKey::Region).unwrap_or_else(|| "us-east-1".into());
    let endpoint = get(AmazonS3ConfigKey::Endpoint)
        .unwrap_or_else(|| format!("https://s3.{region}.amazonaws.com"));
    let (Some(key_id), Some(secret_key)) = (
        get(AmazonS3ConfigKey::AccessKeyId),
        get(AmazonS3ConfigKey::SecretAccessKey),
    ) else {
        return Err(refuse(
            "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY are not set".into(),
        ));
    };
    let credential = AwsCredential {
        key_id,
        secret_key,
        token: get(AmazonS3ConfigKey::Token),
    };
    // Outside us-east-1, S3 wants the region in the body.
    let body = if region == "us-east-1" {
        String::new()
    } else {
        format!(
            "<CreateBucketConfiguration xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\"><LocationConstraint>{region}</LocationConstraint></CreateBucketConfiguration>"
        )
    };
    let mut request = http::Request::builder()
        .method(http::Method::PUT)
        .uri(format!("{}/{bucket}", endpoint.trim_end_matches('/')))
        .body(HttpRequestBody::from(body))
        .map_err(|e| refuse(e.to_string()))?;
    AwsAuthorizer::new(&credential, "s3", &region).try_authorize(&mut request, None)?;
    let allow_http = get(AmazonS3ConfigKey::Client(ClientConfigKey::AllowHttp))
        .is_some_and(|v| v.eq_ignore_ascii_case("true"));
    let client =
        ReqwestConnector::default().connect(&ClientOptions::new().with_allow_http(allow_http))?;
    let response = client
        .execute(request)
        .await
        .map_err(|e| refuse(format!("{endpoint} does not answer: {e}")))?;
    let status = response.status();
    let body = response.into_body().bytes().await.unwrap_or_default();
    let text = String::from_utf8_lossy(&body);
    let code = crate::error::s3_error_code(&text);
    if status.is_success() || code.as_deref() == Some("BucketAlreadyOwnedByYou") {
        return Ok(());
    }
    Err(refuse(format!(
        "the server answered {status} {}",
        code.unwrap_or_default()
    )))
}

/// Uploads or existence checks in flight at once on a remote store.
const REMOTE_CONCURRENCY: usize = 16;

/// Where content lives: a `--store` URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreUrl {
    /// `file:///ABS/PATH`
    Local(PathBuf),
    /// `s3://BUCKET[/PREFIX]`
    S3 {
        bucket: String,
        prefix: Option<String>,
    },
}

impl StoreUrl {
    pub fn parse(url: &str) -> Result<Self> {
        let refuse = |why: &str| {
            RegistryError::BadRequest(format!(
                "--store {url:?}: {why}; use file:///ABSOLUTE/PATH or s3://BUCKET[/PREFIX]"
            ))
        };
        if let Some(path) = url.strip_prefix("file://") {
            if !path.starts_with('/') {
                return Err(refuse("the path must be absolute"));
            }
            return Ok(StoreUrl::Local(PathBuf::from(path)));
        }
        let Some(rest) = url.strip_prefix("s3://") else {
            return Err(refuse("unsupported store URL"));
        };
        let (bucket, prefix) = match rest.split_once('/') {
            Some((b, p)) => (b, p.trim_matches('/')),
            None => (rest, ""),
        };
        // S3's bucket naming rules: 3–63 of lowercase letters, digits, dots and hyphens.
        let bucket_ok = (3..=63).contains(&bucket.len())
            && bucket
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'.' || b == b'-');
        if !bucket_ok {
            return Err(refuse("not a valid bucket name"));
        }
        if prefix.split('/').any(|seg| seg == "." || seg == "..") {
            return Err(refuse("the prefix may not contain . or .. segments"));
        }
        Ok(StoreUrl::S3 {
            bucket: bucket.to_string(),
            prefix: (!prefix.is_empty()).then(|| prefix.to_string()),
        })
    }
}

impl std::fmt::Display for StoreUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StoreUrl::Local(path) => write!(f, "file://{}", path.display()),
            StoreUrl::S3 {
                bucket,
                prefix: None,
            } => write!(f, "s3://{bucket}"),
            StoreUrl::S3 {
                bucket,
                prefix: Some(p),
            } => write!(f, "s3://{bucket}/{p}"),
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_urls() {
        assert_eq!(
            StoreUrl::parse("file:///srv/store").unwrap(),
            StoreUrl::Local("/srv/store".into())
        );
        assert_eq!(
            StoreUrl::parse("s3://my-bucket").unwrap(),
            StoreUrl::S3 {
                bucket: "my-bucket".into(),
                prefix: None
            }
        );
        let with_prefix = StoreUrl::parse("s3://my-bucket/team/a/").unwrap();
        assert_eq!(
            with_prefix,
            StoreUrl::S3 {
                bucket: "my-bucket".into(),
                prefix: Some("team/a".into())
            }
        );
        assert_eq!(with_prefix.to_string(), "s3://my-bucket/team/a");
        for bad in [
            "file://relative",
            "http://x",
            "s3://",
            "s3://Upper",
            "s3://ab",
            "s3://bucket/../x",
            "/abs/path",
        ] {
            let err = StoreUrl::parse(bad).unwrap_err();
            assert!(matches!(err, RegistryError::BadRequest(_)), "{bad}: {err}");
        }
    }
}
