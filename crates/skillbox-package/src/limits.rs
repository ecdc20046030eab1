//! Package and archive limits (SPEC §3), configurable by the operator.

use serde::{Deserialize, Serialize};

pub const MIB: u64 = 1024 * 1024;

/// Bounds on what a package (and the archive carrying it) may contain.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limits {
    /// Regular files in the package.
    pub max_files: usize,
    /// Bytes in one file.
    pub max_file_size: u64,
    /// Uncompressed bytes of all files together.
    pub max_total_size: u64,
    /// Uncompressed file bytes per compressed archive byte. Enforced once the uncompressed
    /// content passes [`Limits::ratio_floor`]: below that a package cannot be a bomb, and tar
    /// padding alone makes tiny archives compress more than 100×.
    pub max_compression_ratio: u64,
    /// Uncompressed bytes below which the ratio is not checked.
    pub ratio_floor: u64,
    /// Entries in an archive (files and directories).
    pub max_archive_entries: usize,
    /// Bytes of YAML between the frontmatter fences of `SKILL.md`.
    pub max_frontmatter_bytes: usize,
}

impl Limits {
    /// No size or count limits (path rules still apply): for computing the digest of any
    /// tree, which is defined whatever its size.
    pub fn unbounded() -> Self {
        Limits {
            max_files: usize::MAX,
            max_file_size: u64::MAX / 4,
            max_total_size: u64::MAX / 4,
            max_compression_ratio: u64::MAX,
            ratio_floor: u64::MAX / 4,
            max_archive_entries: usize::MAX,
            max_frontmatter_bytes: usize::MAX,
        }
    }
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_files: 2_000,
            max_file_size: 32 * MIB,
            max_total_size: 64 * MIB,
            max_compression_ratio: 100,
            ratio_floor: MIB,
            max_archive_entries: 4_000,
            max_frontmatter_bytes: 64 * 1024,
        }
    }
}
