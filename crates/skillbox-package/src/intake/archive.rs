//! Archives: zip, tar and tar.gz streamed into a directory this process creates, every
//! entry's path and type checked first, limits enforced on the bytes actually read.

use super::*;

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
