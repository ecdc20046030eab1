//! Writing packages out: as a deterministic tar, and as a directory made atomically.

use crate::manifest::{FileEntry, Manifest};
use crate::staging::StagingDir;
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// Opens the content of one manifest entry.
pub trait ContentSource {
    fn open(&self, entry: &FileEntry) -> io::Result<Box<dyn Read + '_>>;
}

/// Content laid out as a directory tree (a package root on disk).
pub struct DirSource<'a>(pub &'a Path);

impl ContentSource for DirSource<'_> {
    fn open(&self, entry: &FileEntry) -> io::Result<Box<dyn Read + '_>> {
        Ok(Box::new(std::fs::File::open(self.0.join(&entry.path))?))
    }
}

/// Copies exactly `entry.size` bytes from `src` or fails: a short or long source is an error,
/// never a silently different file.
fn copy_exact(entry: &FileEntry, src: impl Read, mut out: impl Write) -> io::Result<()> {
    let copied = io::copy(&mut src.take(entry.size + 1), &mut out)?;
    if copied != entry.size {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "{}: expected {} bytes, source has {}",
                entry.path, entry.size, copied
            ),
        ));
    }
    Ok(())
}

/// Writes the package as a tar whose bytes depend only on the manifest and the content:
/// canonical order, mode 0644/0755, uid/gid 0, mtime 0, no user or group names.
pub fn write_tar<W: Write>(
    out: W,
    manifest: &Manifest,
    source: &dyn ContentSource,
) -> io::Result<W> {
    let mut builder = tar::Builder::new(out);
    builder.mode(tar::HeaderMode::Deterministic);
    for entry in manifest.entries() {
        let mut header = tar::Header::new_gnu();
        header.set_entry_type(tar::EntryType::Regular);
        header.set_size(entry.size);
        header.set_mode(if entry.executable { 0o755 } else { 0o644 });
        header.set_mtime(0);
        header.set_uid(0);
        header.set_gid(0);
        let src = source.open(entry)?;
        let mut checked = Vec::new();
        let mut reader: Box<dyn Read> = if entry.size <= 1024 * 1024 {
            copy_exact(entry, src, &mut checked)?;
            Box::new(io::Cursor::new(checked))
        } else {
            Box::new(ExactReader {
                inner: src,
                remaining: entry.size,
                path: &entry.path,
            })
        };
        builder.append_data(&mut header, &entry.path, &mut reader)?;
    }
    builder.into_inner()
}

/// Yields exactly `remaining` bytes and fails if the source ends early.
struct ExactReader<'a, R> {
    inner: R,
    remaining: u64,
    path: &'a str,
}

impl<R: Read> Read for ExactReader<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.remaining == 0 {
            return Ok(0);
        }
        let max = buf
            .len()
            .min(self.remaining.min(usize::MAX as u64) as usize);
        let n = self.inner.read(&mut buf[..max])?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("{}: source ended early", self.path),
            ));
        }
        self.remaining -= n as u64;
        Ok(n)
    }
}

/// Options for [`write_dir_atomic`].
#[derive(Debug, Clone, Copy, Default)]
pub struct DirWriteOptions {
    /// Make files 0444/0555 and directories 0555 once written.
    pub read_only: bool,
    /// fsync every file and directory before the rename.
    pub sync: bool,
}

/// A fresh private staging directory in `parent` with an empty directory `name` in it, where
/// a tree is built before it is renamed into place.
pub fn staged_tree(parent: &Path, prefix: &str, name: &str) -> io::Result<(StagingDir, PathBuf)> {
    let staging = StagingDir::new_in(parent, prefix)?;
    let tree = staging.path().join(name);
    std::fs::create_dir(&tree)?;
    Ok((staging, tree))
}

/// Creates the file at `rel` under `root` (and its parent directories): new (never an
/// existing file, never through a link), mode 0755 if `executable` else 0644.
pub fn create_file(root: &Path, rel: &str, executable: bool) -> io::Result<File> {
    let target = root.join(rel);
    if let Some(p) = target.parent() {
        std::fs::create_dir_all(p)?;
    }
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(if executable { 0o755 } else { 0o644 })
        .open(&target)
}

/// Writes the package into a fresh staging directory beside `dest`, then renames it to
/// `dest`. Readers see no directory or the complete one. `dest` must not exist.
pub fn write_dir_atomic(
    dest: &Path,
    manifest: &Manifest,
    source: &dyn ContentSource,
    opts: DirWriteOptions,
) -> io::Result<()> {
    let parent = dest
        .parent()
        .ok_or_else(|| io::Error::other("destination has no parent directory"))?;
    let (staging, tree) = staged_tree(parent, ".staging-", "tree")?;
    for entry in manifest.entries() {
        let mut file = create_file(&tree, &entry.path, entry.executable)?;
        copy_exact(entry, source.open(entry)?, &mut file)?;
        if opts.sync {
            file.sync_all()?;
        }
    }
    finish_tree(&tree, opts)?;
    staging.commit(Some(Path::new("tree")), dest)?;
    if opts.sync {
        sync_dir(parent)?;
    }
    Ok(())
}

/// Applies read-only modes bottom-up and syncs directories, as `opts` asks.
pub fn finish_tree(dir: &Path, opts: DirWriteOptions) -> io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        let ft = e.file_type()?;
        if ft.is_dir() {
            finish_tree(&e.path(), opts)?;
        } else if opts.read_only {
            let mode = e.metadata()?.permissions().mode() & 0o7777;
            let ro = if mode & 0o111 != 0 { 0o555 } else { 0o444 };
            // Already so (a file linked from a read-only tree): left alone, its change time too.
            if mode != ro {
                std::fs::set_permissions(e.path(), std::fs::Permissions::from_mode(ro))?;
            }
        }
    }
    if opts.sync {
        sync_dir(dir)?;
    }
    if opts.read_only {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o555))?;
    }
    Ok(())
}

/// fsync a directory, making the names in it durable.
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    std::fs::File::open(dir)?.sync_all()
}
