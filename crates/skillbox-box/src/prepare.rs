//! Copy mode: packages copied into sandbox storage and verified before anything runs.
//!
//! Used when the executor cannot see the revision cache (and forced for tests). Layout per
//! sandbox: `<root>/<sandbox>/<key>/pkg/…` (the package) and `<root>/<sandbox>/<key>/READY`
//! (the digest), where `<key>` is derived from the mount target. A package is built in a fresh
//! `.staging-*` directory — copied, every file's size and SHA-256 checked against the manifest,
//! no extra file allowed, made read-only, `READY` written last — and only then renamed into
//! place. A prepared package is re-verified before every execution; one that differs is moved
//! aside and prepared afresh, never repaired in place. Abandoned staging is removed.
//!
//! Failpoints (the `failpoints` feature, see [`crate::failpoint`]): `<root>/FAILPOINT` naming `truncate`, `flip`, `missing`,
//! `extra` or `crash` corrupts the next transfer that way (and is consumed), so the tests can
//! show that a bad transfer never executes and the next attempt prepares a complete package.

use crate::{BoxError, Mount};
use skillbox_package::intake::verify_tree;
use skillbox_package::write::{DirWriteOptions, finish_tree};
use skillbox_package::{Manifest, Sha256, staging::remove_tree};
use std::path::{Path, PathBuf};

pub const READY: &str = "READY";

#[derive(Debug, Clone)]
pub struct PreparedStore {
    root: PathBuf,
    /// Hard-link files from the source instead of copying their bytes (see
    /// [`PreparedStore::linking`]).
    link: bool,
}

fn key_of(target: &str) -> String {
    Sha256::of(target.as_bytes()).to_hex()[..32].to_string()
}

impl PreparedStore {
    pub fn new(root: PathBuf) -> std::io::Result<Self> {
        std::fs::create_dir_all(&root)?;
        Ok(PreparedStore { root, link: false })
    }

    /// Prepares packages by hard-linking each file of the source tree (copying where the
    /// source is on another filesystem): no file is created or written, which on a busy ext4
    /// is most of a preparation's cost. For a source whose owner keeps it read-only and
    /// verifies it before every use (an execution node's tree cache): a prepared package then
    /// shares its files' inodes with the source, and is verified as any copy is.
    pub fn linking(mut self) -> Self {
        self.link = true;
        self
    }

    /// Removes abandoned staging of every sandbox (a crash between copy and rename).
    pub fn sweep(&self) -> std::io::Result<usize> {
        let mut n = 0;
        for sandbox in std::fs::read_dir(&self.root)?.flatten() {
            if !sandbox.file_type()?.is_dir() {
                continue;
            }
            for e in std::fs::read_dir(sandbox.path())?.flatten() {
                if e.file_name().to_string_lossy().starts_with('.') {
                    remove_tree(&e.path())?;
                    n += 1;
                }
            }
        }
        Ok(n)
    }

    /// Removes every prepared package of `sandbox`.
    pub fn release(&self, sandbox: &str) -> std::io::Result<()> {
        remove_tree(&self.root.join(sandbox))
    }

    /// Removes the prepared copy of `target` from every sandbox (a revoked revision).
    pub fn discard(&self, target: &str) -> std::io::Result<usize> {
        let mut n = 0;
        for sandbox in self.sandboxes()? {
            let place = self.root.join(&sandbox).join(key_of(target));
            if place.exists() {
                remove_tree(&place)?;
                n += 1;
            }
        }
        Ok(n)
    }

    /// The sandboxes that have prepared packages.
    pub fn sandboxes(&self) -> std::io::Result<Vec<String>> {
        Ok(std::fs::read_dir(&self.root)?
            .flatten()
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect())
    }

    /// Where the package of `target` in `sandbox` is (or will be) prepared.
    pub fn package_dir(&self, sandbox: &str, target: &str) -> PathBuf {
        self.root.join(sandbox).join(key_of(target)).join("pkg")
    }

    /// Whether the package of `mount` in `sandbox` is ready: `READY` names its digest and
    /// every file verifies against the manifest, with nothing extra.
    pub fn is_prepared(&self, sandbox: &str, mount: &Mount) -> bool {
        let place = self.root.join(sandbox).join(key_of(&mount.target));
        let ready = std::fs::read_to_string(place.join(READY)).unwrap_or_default();
        ready == mount.digest.to_string()
            && verify_tree(&place.join("pkg"), &mount.manifest).is_ok()
    }

    /// The verified read-only package directory for `mount` in `sandbox`, prepared if needed.
    pub fn ensure(&self, sandbox: &str, mount: &Mount) -> Result<PathBuf, BoxError> {
        let manifest = &mount.manifest;
        let dir = self.root.join(sandbox);
        std::fs::create_dir_all(&dir)?;
        let place = dir.join(key_of(&mount.target));
        let pkg = place.join("pkg");
        if place.exists() {
            if self.is_prepared(sandbox, mount) {
                return Ok(pkg);
            }
            tracing::warn!(target = %mount.target, "prepared package failed verification; preparing it afresh");
            let aside = dir.join(format!(
                ".stale-{}",
                skillbox_package::staging::unique_name("")
            ));
            std::fs::rename(&place, &aside)?;
            remove_tree(&aside)?;
        }
        let (staging, copy) = skillbox_package::write::staged_tree(&dir, ".staging-", "pkg")?;
        for e in manifest.entries() {
            let to = copy.join(&e.path);
            if let Some(p) = to.parent() {
                std::fs::create_dir_all(p)?;
            }
            let from = mount.source.join(&e.path);
            if !(self.link && std::fs::hard_link(&from, &to).is_ok()) {
                std::fs::copy(&from, &to)?;
            }
        }
        let fault = crate::failpoint::Failpoint::in_dir(&self.root).take();
        match fault.as_deref() {
            Some("truncate") | Some("flip") | Some("missing") | Some("extra") => {
                inject(&copy, manifest, fault.as_deref().unwrap_or(""))?
            }
            Some("crash") => {
                // As if the process died here: staging stays behind, nothing is in place.
                let _ = staging.keep();
                return Err(BoxError::Unavailable(
                    "package preparation was interrupted; nothing was executed".into(),
                ));
            }
            _ => {}
        }
        if let Err(why) = verify_tree(&copy, manifest) {
            return Err(BoxError::Unavailable(format!(
                "the copy of {} failed verification ({why}); nothing was executed — retry",
                mount.target
            )));
        }
        finish_tree(
            &copy,
            DirWriteOptions {
                read_only: true,
                sync: false,
            },
        )?;
        std::fs::write(staging.path().join(READY), mount.digest.to_string())?;
        // Staging is private (0700); the sandbox uid must traverse the placed package.
        std::fs::set_permissions(
            staging.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )?;
        staging.commit(None, &place)?;
        Ok(pkg)
    }
}

fn inject(copy: &Path, manifest: &Manifest, fault: &str) -> std::io::Result<()> {
    let Some(victim) = manifest.entries().iter().max_by_key(|e| e.size) else {
        return Ok(());
    };
    let path = copy.join(&victim.path);
    // A linked file shares its inode with the source: the fault goes to a copy of its own.
    let bytes = std::fs::read(&path)?;
    std::fs::remove_file(&path)?;
    std::fs::write(&path, bytes)?;
    match fault {
        "truncate" => std::fs::OpenOptions::new()
            .write(true)
            .open(&path)?
            .set_len(victim.size / 2),
        "flip" => {
            let mut bytes = std::fs::read(&path)?;
            if let Some(b) = bytes.first_mut() {
                *b ^= 0x01;
            }
            std::fs::write(&path, bytes)
        }
        "missing" => std::fs::remove_file(&path),
        "extra" => std::fs::write(copy.join("planted.sh"), b"#!/bin/sh\necho planted\n"),
        _ => Ok(()),
    }
}
