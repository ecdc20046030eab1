//! Workspaces with a quota, and one uid per sandbox.
//!
//! A sandbox's `/workspace` is an ext4 file system in a sparse image file of the quota's size
//! (`<workspace dir>.ext4`), so a write past the quota fails inside the sandbox with `ENOSPC`
//! and the host's disk is never filled by one run. bwrap loop-mounts the image on the
//! workspace directory (once per sandbox; the mount is adopted after a restart); Docker gets a
//! volume on the image's loop device. A quota of 0 turns this off (plain directories).
//!
//! Every sandbox also runs as its own host uid from a pool ([`UidPool`]), so that the kernel's
//! per-uid process limit (`RLIMIT_NPROC`) is a per-sandbox budget: one tenant's fork bomb
//! cannot exhaust another's processes (what Nix does with its build users).

use crate::BoxError;
use std::collections::HashMap;
use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

/// A system tool by name: from `PATH`, else from the system directories a non-login
/// environment may leave out of it (`mkfs.ext4`, `losetup` live in /sbin).
fn tool(name: &str) -> PathBuf {
    let in_path = std::env::var_os("PATH")
        .map(|p| {
            std::env::split_paths(&p)
                .map(|d| d.join(name))
                .any(|p| p.is_file())
        })
        .unwrap_or(false);
    if in_path {
        return PathBuf::from(name);
    }
    ["/usr/sbin", "/sbin", "/usr/bin", "/bin"]
        .iter()
        .map(|d| Path::new(d).join(name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| PathBuf::from(name))
}

/// Runs a host tool; an error names the tool, its exit status and what it printed.
fn run(program: &str, args: &[&std::ffi::OsStr]) -> Result<String, BoxError> {
    let out = Command::new(tool(program)).args(args).output().map_err(|e| {
        BoxError::Unavailable(format!(
            "cannot run {program} ({e}); workspace quotas need util-linux (mount, losetup) and e2fsprogs (mkfs.ext4)"
        ))
    })?;
    if !out.status.success() {
        return Err(BoxError::Unavailable(format!(
            "{program} {} failed ({}): {}",
            args.iter()
                .map(|a| a.to_string_lossy())
                .collect::<Vec<_>>()
                .join(" "),
            crate::describe_status(out.status),
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// The image file holding the workspace at `dir`.
pub fn image_path(dir: &Path) -> PathBuf {
    let mut name = dir.as_os_str().to_owned();
    name.push(".ext4");
    PathBuf::from(name)
}

/// The workspace an entry of the workspaces directory belongs to: the directory itself, or
/// its image beside it (`<name>.ext4`, `<name>.ext4.new` while it is made).
pub fn workspace_of_entry(file_name: &str) -> &str {
    file_name.trim_end_matches(".new").trim_end_matches(".ext4")
}

/// Whether `dir` is a mount point (another file system than its parent's).
pub fn is_mountpoint(dir: &Path) -> bool {
    let (Ok(d), Some(Ok(p))) = (std::fs::metadata(dir), dir.parent().map(std::fs::metadata)) else {
        return false;
    };
    d.dev() != p.dev()
}

/// Creates the image of a workspace of `bytes` (sparse), its root owned by `uid`.
pub fn make_image(image: &Path, bytes: u64, uid: u32) -> Result<(), BoxError> {
    if image.exists() {
        return Ok(());
    }
    let staging = image.with_extension("ext4.new");
    if let Some(parent) = image.parent() {
        std::fs::create_dir_all(parent)?;
    }
    {
        let f = std::fs::File::create(&staging)?;
        f.set_len(bytes)?;
    }
    // Lazy table and journal initialisation: the image is a fresh sparse file, which reads as
    // zeros anyway, so nothing needs writing now (33 ms instead of ~400 ms for 1 GiB here).
    let owner = format!("root_owner={uid}:{uid},lazy_itable_init=1,lazy_journal_init=1");
    let made = run(
        "mkfs.ext4",
        &[
            "-q".as_ref(),
            "-F".as_ref(),
            "-m".as_ref(),
            "0".as_ref(),
            "-E".as_ref(),
            owner.as_ref(),
            staging.as_os_str(),
        ],
    );
    // The workspace starts empty: no lost+found for the sandbox to trip over.
    let made = made.and_then(|_| {
        run(
            "debugfs",
            &[
                "-w".as_ref(),
                "-R".as_ref(),
                "rmdir lost+found".as_ref(),
                staging.as_os_str(),
            ],
        )
    });
    if let Err(e) = made {
        let _ = std::fs::remove_file(&staging);
        return Err(e);
    }
    std::fs::rename(&staging, image)?;
    Ok(())
}

/// Loop-mounts `image` on `dir` (made if missing) unless something is mounted there already;
/// the file system's root then belongs to `uid`.
pub fn mount(image: &Path, dir: &Path, uid: u32) -> Result<(), BoxError> {
    std::fs::create_dir_all(dir)?;
    // Concurrent `mount -o loop`s (other sandboxes, other servers on the machine) can race
    // for the same free loop device; the loser fails and a retry picks another.
    let mut attempt = 0;
    while !is_mountpoint(dir) {
        attempt += 1;
        let mounted = run(
            "mount",
            &[
                "-o".as_ref(),
                "loop,nosuid,nodev".as_ref(),
                image.as_os_str(),
                dir.as_os_str(),
            ],
        );
        match mounted {
            Ok(_) => break,
            Err(e) if attempt < 4 => {
                tracing::warn!(error = %e, attempt, "mounting a workspace failed; retrying");
                std::thread::sleep(std::time::Duration::from_millis(50 * attempt));
            }
            Err(e) => return Err(e),
        }
    }
    let meta = std::fs::metadata(dir)?;
    if meta.uid() != uid {
        std::os::unix::fs::chown(dir, Some(uid), Some(uid))?;
    }
    Ok(())
}

/// Unmounts `dir` if it is a mount point (lazily: a process still inside keeps its view until
/// it ends, and the loop device is released with the last user).
pub fn unmount(dir: &Path) -> Result<(), BoxError> {
    if is_mountpoint(dir) {
        run("umount", &["--lazy".as_ref(), dir.as_os_str()])?;
    }
    Ok(())
}

/// The loop device backing `image`, attached now if none is.
pub fn attach(image: &Path) -> Result<String, BoxError> {
    let existing = run("losetup", &["--associated".as_ref(), image.as_os_str()])?;
    if let Some(dev) = existing.lines().next().and_then(|l| l.split(':').next())
        && !dev.is_empty()
    {
        return Ok(dev.to_string());
    }
    run(
        "losetup",
        &["--find".as_ref(), "--show".as_ref(), image.as_os_str()],
    )
}

/// Detaches every loop device backing `image`.
pub fn detach(image: &Path) -> Result<(), BoxError> {
    if !image.exists() {
        return Ok(());
    }
    let associated = || -> Result<Vec<String>, BoxError> {
        let listed = run("losetup", &["--associated".as_ref(), image.as_os_str()])?;
        Ok(listed
            .lines()
            .filter_map(|l| l.split(':').next())
            .filter(|dev| !dev.is_empty())
            .map(str::to_string)
            .collect())
    };
    for dev in associated()? {
        if let Err(e) = run("losetup", &["--detach".as_ref(), dev.as_ref()]) {
            // A device whose last user went meanwhile detaches itself (autoclear after a lazy
            // unmount): only a device still backing the image is a failure.
            if associated()?.contains(&dev) {
                return Err(e);
            }
        }
    }
    Ok(())
}

/// Removes a workspace: unmounted, its image and its directory gone.
pub fn remove(dir: &Path) -> Result<(), BoxError> {
    unmount(dir)?;
    let image = image_path(dir);
    detach(&image)?;
    skillbox_package::staging::remove_tree(dir)?;
    match std::fs::remove_file(&image) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e.into()),
        _ => Ok(()),
    }
}

/// Checks that quota'd workspaces work under `root` (what `serve` and `doctor` run): an image
/// is made, mounted, written and removed.
pub fn probe(root: &Path, uid: u32) -> Result<(), BoxError> {
    std::fs::create_dir_all(root)?;
    let dir = root.join(skillbox_package::staging::unique_name(".probe-"));
    let result = (|| {
        make_image(&image_path(&dir), 8 << 20, uid)?;
        mount(&image_path(&dir), &dir, uid)?;
        std::fs::write(dir.join("probe"), b"ok")?;
        Ok(())
    })();
    let removed = remove(&dir);
    result.and(removed).map_err(|e: BoxError| {
        BoxError::Unavailable(format!(
            "workspace quotas (an ext4 image loop-mounted per sandbox) do not work under {}: {e} \
— run as root on a host with loop devices and mkfs.ext4, or turn quotas off with --workspace-quota 0",
            root.display()
        ))
    })
}

/// Host uids handed out one per sandbox, recorded as files `<dir>/<uid>` holding the sandbox
/// id (created exclusively, so two servers on one directory never share one), so a restart
/// keeps each sandbox's uid — its workspace belongs to it.
#[derive(Debug)]
pub struct UidPool {
    dir: PathBuf,
    base: u32,
    count: u32,
    by_sandbox: Mutex<HashMap<String, u32>>,
}

impl UidPool {
    pub fn open(dir: PathBuf, base: u32, count: u32) -> Result<Self, BoxError> {
        std::fs::create_dir_all(&dir)?;
        let mut by_sandbox = HashMap::new();
        for e in std::fs::read_dir(&dir)?.flatten() {
            let (Some(uid), Ok(sandbox)) = (
                e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()),
                std::fs::read_to_string(e.path()),
            ) else {
                continue;
            };
            by_sandbox.insert(sandbox, uid);
        }
        Ok(UidPool {
            dir,
            base,
            count: count.max(1),
            by_sandbox: Mutex::new(by_sandbox),
        })
    }

    /// The first uid of the pool.
    pub fn base(&self) -> u32 {
        self.base
    }

    /// The uid of `sandbox`, allocated on first use.
    pub fn uid_of(&self, sandbox: &str) -> Result<u32, BoxError> {
        let mut map = self.by_sandbox.lock().map_err(crate::poisoned)?;
        if let Some(uid) = map.get(sandbox) {
            return Ok(*uid);
        }
        let start = skillbox_package::Sha256::of(sandbox.as_bytes()).0[..4]
            .iter()
            .fold(0u32, |acc, b| (acc << 8) | u32::from(*b))
            % self.count;
        for i in 0..self.count {
            let uid = self.base + (start + i) % self.count;
            match std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(self.dir.join(uid.to_string()))
            {
                Ok(mut f) => {
                    f.write_all(sandbox.as_bytes())?;
                    map.insert(sandbox.to_string(), uid);
                    return Ok(uid);
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(e.into()),
            }
        }
        Err(BoxError::Unavailable(format!(
            "all {} sandbox uids from {} are in use",
            self.count, self.base
        )))
    }

    /// Returns `sandbox`'s uid to the pool.
    pub fn release(&self, sandbox: &str) -> Result<(), BoxError> {
        let mut map = self.by_sandbox.lock().map_err(crate::poisoned)?;
        if let Some(uid) = map.remove(sandbox) {
            match std::fs::remove_file(self.dir.join(uid.to_string())) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e.into()),
                _ => {}
            }
        }
        Ok(())
    }

    /// Sandboxes holding a uid.
    pub fn sandboxes(&self) -> Vec<String> {
        self.by_sandbox
            .lock()
            .map(|m| m.keys().cloned().collect())
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uids_are_distinct_and_survive_reopening() {
        let dir = tempfile::tempdir().unwrap();
        let pool = UidPool::open(dir.path().to_path_buf(), 5000, 3).unwrap();
        let a = pool.uid_of("a").unwrap();
        let b = pool.uid_of("b").unwrap();
        let c = pool.uid_of("c").unwrap();
        assert_eq!(pool.uid_of("a").unwrap(), a);
        let mut all = vec![a, b, c];
        all.sort();
        all.dedup();
        assert_eq!(all.len(), 3, "every sandbox has its own uid");
        assert!(all.iter().all(|u| (5000..5003).contains(u)));
        assert!(pool.uid_of("d").is_err(), "a full pool refuses");
        let again = UidPool::open(dir.path().to_path_buf(), 5000, 3).unwrap();
        assert_eq!(again.uid_of("b").unwrap(), b, "a restart keeps each uid");
        again.release("b").unwrap();
        assert_eq!(again.uid_of("d").unwrap(), b, "a released uid is reused");
    }
}
