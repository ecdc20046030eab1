//! The `skillbox-tree-v1` canonical manifest and the tree digest (SPEC §2).
//!
//! ```text
//! skillbox-tree-v1\n
//! <kind> <size> <sha256> <path>\n     one line per regular file, sorted by the UTF-8 bytes of path
//! ```
//! `kind` is `x` when any execute bit is set, else `f`. The digest is `sha256:` + the SHA-256
//! of these bytes.

use crate::digest::{Digest, Sha256};
use crate::paths::check_path;
use serde::{Deserialize, Serialize};

pub const MANIFEST_HEADER: &str = "skillbox-tree-v1\n";

/// One regular file of a package.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileEntry {
    pub path: String,
    pub size: u64,
    pub sha256: Sha256,
    pub executable: bool,
}

/// Why manifest bytes or a list of entries do not form a canonical manifest.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ManifestError {
    #[error("manifest does not start with the header 'skillbox-tree-v1'")]
    MissingHeader,
    #[error("manifest line {line}: {message}")]
    BadLine { line: usize, message: String },
    #[error("manifest is not sorted by path bytes at line {line}")]
    NotSorted { line: usize },
    #[error("duplicate path in manifest: {0}")]
    Duplicate(String),
    #[error("invalid path {path:?} in manifest: {message}")]
    BadPath { path: String, message: String },
}

/// A canonical manifest: entries sorted by the bytes of their paths, no duplicates.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Manifest {
    entries: Vec<FileEntry>,
}

impl Manifest {
    /// Sorts `entries` into canonical order. Paths must be valid package paths, each once.
    pub fn new(mut entries: Vec<FileEntry>) -> Result<Self, ManifestError> {
        entries.sort_unstable_by(|a, b| a.path.as_bytes().cmp(b.path.as_bytes()));
        for w in entries.windows(2) {
            if w[0].path == w[1].path {
                return Err(ManifestError::Duplicate(w[0].path.clone()));
            }
        }
        for e in &entries {
            check_path(&e.path).map_err(|message| ManifestError::BadPath {
                path: e.path.clone(),
                message,
            })?;
        }
        Ok(Manifest { entries })
    }

    pub fn entries(&self) -> &[FileEntry] {
        &self.entries
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Sum of all file sizes.
    pub fn total_size(&self) -> u64 {
        self.entries.iter().map(|e| e.size).sum()
    }

    /// The entry for `path`, by binary search on the canonical order.
    pub fn get(&self, path: &str) -> Option<&FileEntry> {
        self.entries
            .binary_search_by(|e| e.path.as_bytes().cmp(path.as_bytes()))
            .ok()
            .map(|i| &self.entries[i])
    }

    /// The canonical manifest bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(MANIFEST_HEADER.len() + self.entries.len() * 100);
        out.extend_from_slice(MANIFEST_HEADER.as_bytes());
        for e in &self.entries {
            out.push(if e.executable { b'x' } else { b'f' });
            out.push(b' ');
            out.extend_from_slice(e.size.to_string().as_bytes());
            out.push(b' ');
            out.extend_from_slice(e.sha256.to_hex().as_bytes());
            out.push(b' ');
            out.extend_from_slice(e.path.as_bytes());
            out.push(b'\n');
        }
        out
    }

    /// The tree digest: SHA-256 of the canonical manifest bytes.
    pub fn digest(&self) -> Digest {
        Digest(Sha256::of(&self.encode()))
    }

    /// Parses canonical manifest bytes, accepting only the exact canonical form (so that
    /// `parse(b)?.encode() == b` always holds).
    pub fn parse(bytes: &[u8]) -> Result<Self, ManifestError> {
        let text = std::str::from_utf8(bytes).map_err(|_| ManifestError::BadLine {
            line: 0,
            message: "not UTF-8".into(),
        })?;
        let body = text
            .strip_prefix(MANIFEST_HEADER)
            .ok_or(ManifestError::MissingHeader)?;
        let mut entries = Vec::new();
        if body.is_empty() {
            return Ok(Manifest { entries });
        }
        let Some(body) = body.strip_suffix('\n') else {
            return Err(ManifestError::BadLine {
                line: body.lines().count() + 1,
                message: "last line does not end with a newline".into(),
            });
        };
        for (i, line) in body.split('\n').enumerate() {
            let line_no = i + 2;
            let bad = |message: &str| ManifestError::BadLine {
                line: line_no,
                message: message.into(),
            };
            let mut parts = line.splitn(4, ' ');
            let (Some(kind), Some(size), Some(hash), Some(path)) =
                (parts.next(), parts.next(), parts.next(), parts.next())
            else {
                return Err(bad("expected '<kind> <size> <sha256> <path>'"));
            };
            let executable = match kind {
                "x" => true,
                "f" => false,
                _ => return Err(bad("kind must be 'f' or 'x'")),
            };
            let canonical_number = !size.is_empty()
                && size.bytes().all(|b| b.is_ascii_digit())
                && (size == "0" || !size.starts_with('0'));
            if !canonical_number {
                return Err(bad("size must be a decimal number without leading zeros"));
            }
            let size: u64 = size.parse().map_err(|_| bad("size out of range"))?;
            let sha256 = Sha256::from_hex(hash)
                .ok_or_else(|| bad("sha256 must be 64 lowercase hex digits"))?;
            check_path(path).map_err(|message| ManifestError::BadPath {
                path: path.into(),
                message,
            })?;
            if let Some(prev) = entries.last() {
                let prev: &FileEntry = prev;
                match prev.path.as_bytes().cmp(path.as_bytes()) {
                    std::cmp::Ordering::Less => {}
                    std::cmp::Ordering::Equal => return Err(ManifestError::Duplicate(path.into())),
                    std::cmp::Ordering::Greater => {
                        return Err(ManifestError::NotSorted { line: line_no });
                    }
                }
            }
            entries.push(FileEntry {
                path: path.to_string(),
                size,
                sha256,
                executable,
            });
        }
        Ok(Manifest { entries })
    }
}
