//! Reading packages: from a directory (with excludes and `.skillignore`), or by streaming a
//! zip, tar or tar.gz archive into a target directory.
//!
//! Archive entries are never unpacked by the archive library. Each entry's path and type is
//! checked here first; only regular files and directories are created, by path components
//! that passed the SPEC §2 rules, inside a directory this process created and into which it
//! never writes a link. Files are opened with `O_EXCL`, so nothing existing is ever
//! overwritten or followed. Limits are enforced on the bytes actually read, not on what the
//! archive declares.

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

/// Counts the compressed bytes a decoder consumes.
struct CountingReader<R> {
    inner: R,
    count: Rc<Cell<u64>>,
}

impl<R: Read> Read for CountingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.count.set(self.count.get() + n as u64);
        Ok(n)
    }
}

/// Why writing an entry stopped.
enum CopyError {
    /// The archive could not be read (truncated, corrupt): the upload's fault.
    Source(io::Error),
    /// More bytes than declared, or fewer.
    SizeMismatch { declared: u64, actual: u64 },
    /// The target directory could not be written: our fault.
    Target(io::Error),
}

/// Creates `dest/path` (never existing before) and copies `src` into it while hashing.
/// Reads at most `declared + 1` bytes so a lying header cannot make it write more.
fn write_new_file(
    dest: &Path,
    path: &str,
    src: &mut dyn Read,
    declared: u64,
    executable: bool,
) -> Result<Sha256, CopyError> {
    let target = dest.join(path);
    if let Some(parent) = target.parent() {
        std::fs::create_dir_all(parent).map_err(CopyError::Target)?;
    }
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(if executable { 0o755 } else { 0o644 })
        .open(&target)
        .map_err(CopyError::Target)?;
    let mut hasher = Hasher::new();
    let mut buf = vec![0u8; 64 * 1024];
    let mut limited = src.take(declared + 1);
    let mut actual = 0u64;
    loop {
        let n = match limited.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(CopyError::Source(e)),
        };
        actual += n as u64;
        if actual > declared {
            return Err(CopyError::SizeMismatch { declared, actual });
        }
        hasher.update(&buf[..n]);
        file.write_all(&buf[..n]).map_err(CopyError::Target)?;
    }
    if actual != declared {
        return Err(CopyError::SizeMismatch { declared, actual });
    }
    Ok(hasher.finish())
}

/// Writes one file entry; records a problem (and aborts) when the archive misbehaves.
fn extract_file(
    c: &mut Collector<'_>,
    dest: &Path,
    path: String,
    src: &mut dyn Read,
    size: u64,
    executable: bool,
) -> io::Result<()> {
    if !c.admit_size(&path, size) {
        return Ok(());
    }
    match write_new_file(dest, &path, src, size, executable) {
        Ok(sha256) => {
            c.total += size;
            c.files.push(FileEntry {
                path,
                size,
                sha256,
                executable,
            });
            Ok(())
        }
        Err(CopyError::Source(e)) => {
            c.abort(Problem::at_path(
                path,
                format!("archive is truncated or corrupt: {e}"),
            ));
            Ok(())
        }
        Err(CopyError::SizeMismatch { declared, actual }) => {
            c.abort(Problem::at_path(
                path,
                format!(
                    "entry declares {declared} bytes but holds {}{actual}",
                    if actual > declared { "more than " } else { "" }
                ),
            ));
            Ok(())
        }
        Err(CopyError::Target(e)) => Err(e),
    }
}

/// Streams a tar (optionally gzip-compressed) archive into `dest`, an empty directory the
/// caller owns. `Err` only for failures writing `dest`; everything wrong with the archive is a
/// problem in the returned [`Intake`].
pub fn extract_tar(
    reader: impl Read,
    gzip: bool,
    dest: &Path,
    limits: &Limits,
) -> io::Result<Intake> {
    let compressed = Rc::new(Cell::new(0u64));
    let counting = CountingReader {
        inner: reader,
        count: compressed.clone(),
    };
    let stream: Box<dyn Read> = if gzip {
        Box::new(flate2::read::GzDecoder::new(counting))
    } else {
        Box::new(counting)
    };
    let mut archive = tar::Archive::new(stream);
    let mut c = Collector::new(limits);
    let entries = match archive.entries() {
        Ok(e) => e,
        Err(e) => {
            c.abort(Problem::general(format!("not a readable tar archive: {e}")));
            return Ok(c.finish(dest, true));
        }
    };
    for entry in entries {
        let mut entry = match entry {
            Ok(e) => e,
            Err(e) => {
                c.abort(Problem::general(format!(
                    "archive is truncated or corrupt: {e}"
                )));
                break;
            }
        };
        if !c.count_entry() {
            break;
        }
        // A PAX record the reader cannot parse is otherwise skipped, and the entry stored under
        // its plain header name: a path other than the one the archive's writer meant.
        match entry.pax_extensions() {
            Ok(Some(records)) => {
                if let Some(Err(e)) = records.into_iter().find(|r| r.is_err()) {
                    let name = display_path(&entry.header().path_bytes());
                    c.abort(Problem::at_path(
                        name,
                        format!("malformed PAX extended header: {e}"),
                    ));
                    break;
                }
            }
            Ok(None) => {}
            Err(e) => {
                c.abort(Problem::general(format!(
                    "malformed PAX extended header: {e}"
                )));
                break;
            }
        }
        let raw = entry.path_bytes().into_owned();
        let kind = entry.header().entry_type();
        use tar::EntryType as T;
        match kind {
            T::Regular | T::Continuous => {
                let Some(path) = c.archive_path(&raw, false) else {
                    continue;
                };
                let size = entry.size();
                let executable = entry
                    .header()
                    .mode()
                    .map(|m| m & 0o111 != 0)
                    .unwrap_or(false);
                extract_file(&mut c, dest, path, &mut entry, size, executable)?;
            }
            T::Directory => {
                if let Some(path) = c.archive_path(&raw, true) {
                    std::fs::create_dir_all(dest.join(path))?;
                }
            }
            other => {
                let what = match other {
                    T::Symlink => "symbolic links are not allowed",
                    T::Link => "hard links are not allowed",
                    T::Char | T::Block => "device files are not allowed",
                    T::Fifo => "FIFOs are not allowed",
                    T::GNUSparse => "sparse files are not allowed",
                    _ => {
                        "unsupported tar entry type (only regular files and directories are allowed)"
                    }
                };
                c.problems.push(Problem::at_path(display_path(&raw), what));
            }
        }
        if gzip {
            c.check_ratio(compressed.get());
        }
        if c.aborted {
            break;
        }
    }
    Ok(c.finish(dest, true))
}

const S_IFMT: u32 = 0o170000;
const S_IFREG: u32 = 0o100000;
const S_IFDIR: u32 = 0o040000;
const S_IFLNK: u32 = 0o120000;

/// Reads a zip archive into `dest`. Zip needs its central directory, so the caller spools an
/// upload to a file first. Declared sizes are checked before decompression and again against
/// the bytes actually produced.
pub fn extract_zip(reader: impl Read + Seek, dest: &Path, limits: &Limits) -> io::Result<Intake> {
    let mut c = Collector::new(limits);
    let mut archive = match zip::ZipArchive::new(reader) {
        Ok(a) => a,
        Err(e) => {
            c.abort(Problem::general(format!("not a readable zip archive: {e}")));
            return Ok(c.finish(dest, true));
        }
    };
    if archive.has_duplicate_names() {
        // The zip reader keeps only the last entry of a name: which ones repeat is read from
        // the central directory itself, so every duplicate is named.
        let start = archive.central_directory_start();
        let mut reader = archive.into_inner();
        let names = central_directory_names(&mut reader, start).unwrap_or_default();
        let mut seen = std::collections::HashSet::new();
        let mut reported = std::collections::HashSet::new();
        for name in names {
            if !seen.insert(name.clone()) && reported.insert(name.clone()) {
                c.problems
                    .push(Problem::at_path(display_path(&name), "duplicate entry"));
            }
        }
        if c.problems.is_empty() {
            c.problems
                .push(Problem::general("archive has duplicate entry names"));
        }
        c.aborted = true;
        return Ok(c.finish(dest, true));
    }
    if archive.len() > limits.max_archive_entries {
        c.abort(Problem::general(format!(
            "archive has {} entries; the limit is {}",
            archive.len(),
            limits.max_archive_entries
        )));
        return Ok(c.finish(dest, true));
    }
    for i in 0..archive.len() {
        let mut file = match archive.by_index(i) {
            Ok(f) => f,
            Err(e) => {
                c.abort(Problem::general(format!(
                    "zip entry {i} cannot be read: {e}"
                )));
                break;
            }
        };
        c.entries += 1;
        let raw = file.name_raw().to_vec();
        let mode = file.unix_mode();
        let kind = mode.map(|m| m & S_IFMT).filter(|k| *k != 0);
        let is_dir = file.is_dir() || kind == Some(S_IFDIR);
        match kind {
            None | Some(S_IFREG) | Some(S_IFDIR) => {}
            Some(S_IFLNK) => {
                c.problems.push(Problem::at_path(
                    display_path(&raw),
                    "symbolic links are not allowed",
                ));
                continue;
            }
            Some(_) => {
                c.problems.push(Problem::at_path(
                    display_path(&raw),
                    "device files, FIFOs and sockets are not allowed",
                ));
                continue;
            }
        }
        if is_dir {
            if let Some(path) = c.archive_path(&raw, true) {
                std::fs::create_dir_all(dest.join(path))?;
            }
            continue;
        }
        let Some(path) = c.archive_path(&raw, false) else {
            continue;
        };
        let size = file.size();
        let compressed = file.compressed_size();
        if size > limits.ratio_floor
            && size
                > limits
                    .max_compression_ratio
                    .saturating_mul(compressed.max(1))
        {
            c.abort(Problem::at_path(
                path,
                format!(
                    "compression ratio exceeds {}:1 ({size} bytes from {compressed}): refusing a likely archive bomb",
                    limits.max_compression_ratio
                ),
            ));
            break;
        }
        let executable = mode.map(|m| m & 0o111 != 0).unwrap_or(false);
        extract_file(&mut c, dest, path, &mut file, size, executable)?;
        if c.aborted {
            break;
        }
    }
    Ok(c.finish(dest, true))
}

/// The raw entry names of a zip's central directory, in order, duplicates included (at most
/// 65,536 of them).
fn central_directory_names(r: &mut (impl Read + Seek), start: u64) -> io::Result<Vec<Vec<u8>>> {
    const SIGNATURE: [u8; 4] = [0x50, 0x4b, 0x01, 0x02];
    r.seek(io::SeekFrom::Start(start))?;
    let mut names = Vec::new();
    let mut header = [0u8; 46];
    while names.len() < 65_536 && read_up_to(r, &mut header)? == 46 && header[..4] == SIGNATURE {
        let field = |at: usize| u16::from_le_bytes([header[at], header[at + 1]]) as usize;
        let (name_len, extra_len, comment_len) = (field(28), field(30), field(32));
        let mut name = vec![0u8; name_len];
        r.read_exact(&mut name)?;
        r.seek(io::SeekFrom::Current((extra_len + comment_len) as i64))?;
        names.push(name);
    }
    Ok(names)
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

/// A file found by a directory scan, not yet hashed.
struct Found {
    path: String,
    abs: PathBuf,
    executable: bool,
}

/// Reads a package directory in place: walks it (skipping the default excludes and what
/// `.skillignore` names), checks every path, and hashes files in parallel.
pub fn scan_dir(root: &Path, limits: &Limits) -> io::Result<Intake> {
    scan(root, limits, build_ignore(root)?)
}

/// Reads a package directory exactly as it is, without excludes (a stored revision tree, a
/// draft): what is there is the package.
pub fn scan_dir_raw(root: &Path, limits: &Limits) -> io::Result<Intake> {
    scan(root, limits, ignore::gitignore::Gitignore::empty())
}

fn scan(root: &Path, limits: &Limits, ignore: ignore::gitignore::Gitignore) -> io::Result<Intake> {
    let mut c = Collector::new(limits);
    let mut found = Vec::new();
    walk(root, root, &ignore, &mut c, &mut found)?;
    let mut declared_total = 0u64;
    for f in &found {
        declared_total += std::fs::symlink_metadata(&f.abs)?.len();
    }
    if found.len() > limits.max_files {
        c.problems.push(Problem::general(format!(
            "package has {} files; the limit is {}",
            found.len(),
            limits.max_files
        )));
    }
    if declared_total > limits.max_total_size {
        c.problems.push(Problem::general(format!(
            "package content is {declared_total} bytes; the limit is {} bytes",
            limits.max_total_size
        )));
    }
    if !c.problems.is_empty()
        && (found.len() > limits.max_files || declared_total > limits.max_total_size)
    {
        return Ok(c.finish(root, false));
    }
    let hashed = hash_parallel(&found)?;
    for (f, (sha256, size)) in found.into_iter().zip(hashed) {
        if size > limits.max_file_size {
            c.problems.push(Problem::at_path(
                f.path.clone(),
                format!(
                    "file is {size} bytes; the limit is {} per file",
                    limits.max_file_size
                ),
            ));
        }
        c.total += size;
        c.files.push(FileEntry {
            path: f.path,
            size,
            sha256,
            executable: f.executable,
        });
    }
    Ok(c.finish(root, false))
}

fn build_ignore(root: &Path) -> io::Result<ignore::gitignore::Gitignore> {
    let mut b = ignore::gitignore::GitignoreBuilder::new(root);
    for pattern in DEFAULT_EXCLUDES {
        b.add_line(None, pattern).map_err(io::Error::other)?;
    }
    let skillignore = root.join(SKILLIGNORE);
    if skillignore.is_file()
        && let Some(e) = b.add(&skillignore)
    {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{SKILLIGNORE}: {e}"),
        ));
    }
    b.build().map_err(io::Error::other)
}

fn walk(
    root: &Path,
    dir: &Path,
    ignore: &ignore::gitignore::Gitignore,
    c: &mut Collector<'_>,
    found: &mut Vec<Found>,
) -> io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let abs = entry.path();
        let meta = entry.metadata()?; // does not follow symlinks
        let rel = abs.strip_prefix(root).map_err(io::Error::other)?;
        let is_dir = meta.is_dir();
        if ignore.matched(rel, is_dir).is_ignore() {
            continue;
        }
        let Some(rel_str) = rel.to_str() else {
            c.problems.push(Problem::at_path(
                rel.to_string_lossy(),
                "path is not valid UTF-8",
            ));
            continue;
        };
        let ft = meta.file_type();
        if is_dir {
            walk(root, &abs, ignore, c, found)?;
        } else if ft.is_file() {
            if let Err(m) = check_path(rel_str) {
                c.problems.push(Problem::at_path(rel_str, m));
                continue;
            }
            if let Err(m) = c.paths.add_file(rel_str) {
                c.problems.push(Problem::at_path(rel_str, m));
                continue;
            }
            found.push(Found {
                path: rel_str.to_string(),
                abs,
                executable: meta.permissions().mode() & 0o111 != 0,
            });
        } else {
            let what = if ft.is_symlink() {
                "symbolic links are not allowed"
            } else {
                "only regular files and directories are allowed (device, FIFO or socket)"
            };
            c.problems.push(Problem::at_path(rel_str, what));
        }
    }
    Ok(())
}

/// One file's hashing result, filled by whichever thread hashed it.
type HashSlot = std::sync::Mutex<Option<io::Result<(Sha256, u64)>>>;

/// Hashes files on all cores; small trees stay on one thread.
fn hash_parallel(files: &[Found]) -> io::Result<Vec<(Sha256, u64)>> {
    let threads = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .min(files.len().max(1));
    if threads <= 1 {
        return files
            .iter()
            .map(|f| Sha256::of_reader(File::open(&f.abs)?))
            .collect();
    }
    let next = std::sync::atomic::AtomicUsize::new(0);
    let results: Vec<HashSlot> = files.iter().map(|_| std::sync::Mutex::new(None)).collect();
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some(f) = files.get(i) else { break };
                    let r = File::open(&f.abs).and_then(Sha256::of_reader);
                    if let Ok(mut slot) = results[i].lock() {
                        *slot = Some(r);
                    }
                }
            });
        }
    });
    results
        .into_iter()
        .map(|m| {
            m.into_inner()
                .ok()
                .flatten()
                .unwrap_or_else(|| Err(io::Error::other("hashing thread failed")))
        })
        .collect()
}
