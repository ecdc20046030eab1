//! Directories: a package read from disk, with the default excludes and `.skillignore`,
//! hashed in parallel.

use super::*;

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
