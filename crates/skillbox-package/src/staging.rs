//! Private staging directories: created fresh, removed on drop unless committed by rename.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

static COUNTER: AtomicU64 = AtomicU64::new(0);

/// A name no other staging directory of this or another process will pick.
pub fn unique_name(prefix: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!(
        "{prefix}{}-{nanos:x}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

/// A directory under construction. Nobody else knows its name; dropping it removes it.
#[derive(Debug)]
pub struct StagingDir {
    path: PathBuf,
    armed: bool,
}

impl StagingDir {
    /// Creates `parent/<prefix><unique>` with mode 0700.
    pub fn new_in(parent: &Path, prefix: &str) -> io::Result<Self> {
        std::fs::create_dir_all(parent)?;
        let path = parent.join(unique_name(prefix));
        std::os::unix::fs::DirBuilderExt::mode(&mut std::fs::DirBuilder::new(), 0o700)
            .create(&path)?;
        Ok(StagingDir { path, armed: true })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Renames the staged directory (or `sub`, a directory inside it) to `dest`. The rest of the
    /// staging directory is removed.
    pub fn commit(mut self, sub: Option<&Path>, dest: &Path) -> io::Result<()> {
        let from = match sub {
            Some(s) => self.path.join(s),
            None => self.path.clone(),
        };
        std::fs::rename(&from, dest)?;
        if sub.is_none() {
            self.armed = false;
        }
        Ok(())
    }

    /// Keeps the directory on disk and returns its path.
    pub fn keep(mut self) -> PathBuf {
        self.armed = false;
        std::mem::take(&mut self.path)
    }
}

impl Drop for StagingDir {
    fn drop(&mut self) {
        if self.armed {
            let _ = remove_tree(&self.path);
        }
    }
}

/// Removes a directory tree even when it was made read-only (as revision trees are).
pub fn remove_tree(path: &Path) -> io::Result<()> {
    match std::fs::remove_dir_all(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(_) => {
            make_writable(path);
            match std::fs::remove_dir_all(path) {
                Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
                other => other,
            }
        }
    }
}

fn make_writable(path: &Path) {
    use std::os::unix::fs::PermissionsExt;
    let Ok(meta) = std::fs::symlink_metadata(path) else {
        return;
    };
    if meta.is_dir() {
        let _ = std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o700));
        if let Ok(rd) = std::fs::read_dir(path) {
            for e in rd.flatten() {
                make_writable(&e.path());
            }
        }
    }
}
