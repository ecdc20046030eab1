//! Reading packages: from a directory (with excludes and `.skillignore`), or by streaming a
//! zip, tar or tar.gz archive into a target directory.
//!
//! Archive entries are never unpacked by the archive library. Each entry's path and type is
//! checked here first; only regular files and directories are created, by path components
//! that passed the SPEC §2 rules, inside a directory this process created and into which it
//! never writes a link. Files are opened with `O_EXCL`, so nothing existing is ever
//! overwritten or followed. Limits are enforced on the bytes actually read, not on what the
//! archive declares.

mod archive;
mod dir;

pub use archive::{extract_tar, extract_zip};
pub use dir::{scan_dir, scan_dir_raw};

use crate::digest::{Hasher, Sha256};
use crate::limits::Limits;
use crate::manifest::{FileEntry, Manifest};
use crate::paths::{MAX_COMPONENT_BYTES, MAX_PATH_BYTES, PathSet, check_path, check_path_with_max};
use crate::problem::Problem;
use std::cell::Cell;
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::rc::Rc;

/// Names a directory publish skips (SPEC §3), in gitignore syntax.
pub const DEFAULT_EXCLUDES: [&str; 6] = [
    ".git/",
    "__pycache__/",
    "*.pyc",
    ".DS_Store",
    "node_modules/",
    ".venv/",
];

/// The file at a package root whose gitignore-syntax lines add excludes.
pub const SKILLIGNORE: &str = ".skillignore";

/// What reading a package produced: where its root is on disk, its files (hashed while read)
/// and every problem met on the way. Entries with problems were not written.
#[derive(Debug)]
pub struct Intake {
    pub root: PathBuf,
    pub files: Vec<FileEntry>,
    pub problems: Vec<Problem>,
    /// False when reading stopped early (a limit guarding against bombs, a corrupt archive):
    /// then `files` is only part of the package.
    pub complete: bool,
}

/// Archive formats accepted for upload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArchiveFormat {
    Zip,
    Tar,
    TarGz,
}

impl ArchiveFormat {
    /// Recognises a format by its leading bytes (at least 262 for tar).
    pub fn sniff(head: &[u8]) -> Option<Self> {
        if head.starts_with(b"PK\x03\x04") || head.starts_with(b"PK\x05\x06") {
            Some(ArchiveFormat::Zip)
        } else if head.starts_with(&[0x1f, 0x8b]) {
            Some(ArchiveFormat::TarGz)
        } else if head.len() >= 262 && &head[257..262] == b"ustar" {
            Some(ArchiveFormat::Tar)
        } else {
            None
        }
    }

    /// From an HTTP content type, e.g. `application/zip`.
    pub fn from_content_type(ct: &str) -> Option<Self> {
        match ct.split(';').next().unwrap_or("").trim() {
            "application/zip" | "application/x-zip-compressed" => Some(ArchiveFormat::Zip),
            "application/x-tar" | "application/tar" => Some(ArchiveFormat::Tar),
            "application/gzip"
            | "application/x-gzip"
            | "application/x-compressed-tar"
            | "application/x-tar+gzip" => Some(ArchiveFormat::TarGz),
            _ => None,
        }
    }
}

/// Reads an archive file of any accepted format into `dest`.
pub fn extract_archive_file(archive: &Path, dest: &Path, limits: &Limits) -> io::Result<Intake> {
    let mut file = File::open(archive)?;
    let mut head = [0u8; 512];
    let n = read_up_to(&mut file, &mut head)?;
    file.rewind()?;
    match ArchiveFormat::sniff(&head[..n]) {
        Some(format) => extract_archive(file, format, dest, limits),
        None => Ok(Intake {
            root: dest.to_path_buf(),
            files: Vec::new(),
            problems: vec![Problem::general("not a zip, tar or tar.gz archive")],
            complete: false,
        }),
    }
}

/// Dispatches on `format`; zip input must be seekable.
pub fn extract_archive<R: Read + Seek>(
    reader: R,
    format: ArchiveFormat,
    dest: &Path,
    limits: &Limits,
) -> io::Result<Intake> {
    match format {
        ArchiveFormat::Zip => extract_zip(reader, dest, limits),
        ArchiveFormat::Tar => extract_tar(reader, false, dest, limits),
        ArchiveFormat::TarGz => extract_tar(reader, true, dest, limits),
    }
}

fn read_up_to(r: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match r.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}

/// Does the tree at `pkg` hold exactly `manifest`'s files, with their sizes, hashes and exec
/// bits, and nothing else? (Prepared copies, revision-cache trees.) The error says what differs.
pub fn verify_tree(pkg: &Path, manifest: &Manifest) -> Result<(), String> {
    let scanned = scan_dir_raw(pkg, &Limits::unbounded()).map_err(|e| e.to_string())?;
    if !scanned.problems.is_empty() {
        return Err(format!("{:?}", scanned.problems));
    }
    let found = Manifest::new(scanned.files).map_err(|e| e.to_string())?;
    if found != *manifest {
        let missing = manifest
            .entries()
            .iter()
            .filter(|e| found.get(&e.path) != Some(e))
            .map(|e| e.path.as_str())
            .collect::<Vec<_>>();
        let extra = found
            .entries()
            .iter()
            .filter(|e| manifest.get(&e.path).is_none())
            .map(|e| e.path.as_str())
            .collect::<Vec<_>>();
        return Err(format!(
            "differs from the manifest (wrong or missing: {missing:?}; extra: {extra:?})"
        ));
    }
    Ok(())
}

/// One file's hashing result, filled by whichever thread hashed it.
type HashSlot = std::sync::Mutex<Option<io::Result<(Sha256, u64)>>>;

/// Bookkeeping shared by every reader: path rules, collisions and limits.
struct Collector<'a> {
    limits: &'a Limits,
    paths: PathSet,
    files: Vec<FileEntry>,
    problems: Vec<Problem>,
    total: u64,
    entries: usize,
    /// Set when reading must stop (a limit that guards against bombs was hit).
    aborted: bool,
}

/// The archive path, shown even when it is not valid UTF-8.
fn display_path(raw: &[u8]) -> String {
    String::from_utf8_lossy(raw).into_owned()
}

impl<'a> Collector<'a> {
    fn new(limits: &'a Limits) -> Self {
        Collector {
            limits,
            paths: PathSet::new(),
            files: Vec::new(),
            problems: Vec::new(),
            total: 0,
            entries: 0,
            aborted: false,
        }
    }

    fn abort(&mut self, problem: Problem) {
        self.problems.push(problem);
        self.aborted = true;
    }

    /// Counts an archive entry; false (and aborted) past the entry limit.
    fn count_entry(&mut self) -> bool {
        self.entries += 1;
        if self.entries > self.limits.max_archive_entries {
            self.abort(Problem::general(format!(
                "archive has more than {} entries",
                self.limits.max_archive_entries
            )));
            return false;
        }
        true
    }

    /// Normalises an archive entry name and checks it as a package path. `None` means: skip
    /// (the entry is the archive root itself, or a problem was recorded).
    fn archive_path(&mut self, raw: &[u8], is_dir: bool) -> Option<String> {
        let Ok(text) = std::str::from_utf8(raw) else {
            self.problems.push(Problem::at_path(
                display_path(raw),
                "path is not valid UTF-8",
            ));
            return None;
        };
        // `tar -C dir -cf x.tar .` writes "./name": an encoding artefact, not a path component.
        let mut name = text.strip_prefix("./").unwrap_or(text);
        if is_dir {
            name = name.strip_suffix('/').unwrap_or(name);
        }
        if name.is_empty() || name == "." {
            return None;
        }
        // The top-level directory may be stripped later, so allow one component of slack
        // here; the final paths are checked against the exact limit in `finish`.
        if let Err(m) = check_path_with_max(name, MAX_PATH_BYTES + MAX_COMPONENT_BYTES + 1) {
            self.problems.push(Problem::at_path(name, m));
            return None;
        }
        let added = if is_dir {
            self.paths.add_dir(name)
        } else {
            self.paths.add_file(name)
        };
        if let Err(m) = added {
            self.problems.push(Problem::at_path(name, m));
            return None;
        }
        Some(name.to_string())
    }

    /// Checks a file's declared size against the limits before any byte is written.
    fn admit_size(&mut self, path: &str, size: u64) -> bool {
        if self.files.len() >= self.limits.max_files {
            self.abort(Problem::general(format!(
                "package has more than {} files",
                self.limits.max_files
            )));
            return false;
        }
        if size > self.limits.max_file_size {
            self.abort(Problem::at_path(
                path,
                format!(
                    "file is {size} bytes; the limit is {} per file",
                    self.limits.max_file_size
                ),
            ));
            return false;
        }
        if self.total + size > self.limits.max_total_size {
            self.abort(Problem::general(format!(
                "package content exceeds the limit of {} bytes uncompressed",
                self.limits.max_total_size
            )));
            return false;
        }
        true
    }

    fn check_ratio(&mut self, compressed: u64) {
        let l = self.limits;
        if self.total > l.ratio_floor
            && self.total > l.max_compression_ratio.saturating_mul(compressed.max(1))
        {
            self.abort(Problem::general(format!(
                "compression ratio exceeds {}:1 ({} bytes from {compressed} compressed): refusing a likely archive bomb",
                l.max_compression_ratio, self.total
            )));
        }
    }

    /// Ends intake: strips a single top-level directory and re-checks final paths.
    fn finish(mut self, dest: &Path, strip_single_top: bool) -> Intake {
        let mut root = dest.to_path_buf();
        if strip_single_top
            && !self.aborted
            && let Some(top) = single_top_dir(&self.files)
        {
            let prefix_len = top.len() + 1;
            root = dest.join(&top);
            for f in &mut self.files {
                f.path.drain(..prefix_len);
            }
        }
        for f in &self.files {
            if let Err(m) = check_path(&f.path) {
                self.problems.push(Problem::at_path(f.path.clone(), m));
            }
        }
        Intake {
            root,
            files: self.files,
            problems: self.problems,
            complete: !self.aborted,
        }
    }
}

/// The one top-level directory every file lives under, if there is exactly one and no file
/// at the top level.
fn single_top_dir(files: &[FileEntry]) -> Option<String> {
    let mut top: Option<&str> = None;
    for f in files {
        let (first, _) = f.path.split_once('/')?;
        match top {
            None => top = Some(first),
            Some(t) if t == first => {}
            Some(_) => return None,
        }
    }
    top.map(str::to_string)
}
