//! The skill package format, pure: no network, no database.
//!
//! A skill package is a directory tree with `SKILL.md` at its root. This crate
//! - parses and validates `SKILL.md` frontmatter ([`frontmatter`]),
//! - enforces the path rules and limits of SPEC §2–§3 ([`paths`], [`limits`]),
//! - reads packages from directories and from zip / tar / tar.gz archives without ever writing
//!   outside a target directory ([`intake`]),
//! - computes the `skillbox-tree-v1` canonical manifest and tree digest ([`manifest`]),
//! - writes packages as deterministic tars and atomically as directories ([`write`]).
//!
//! Every rejection is a list of [`Problem`]s: all of them, not just the first.

pub mod digest;
pub mod frontmatter;
pub mod intake;
pub mod limits;
pub mod manifest;
pub mod package;
pub mod paths;
pub mod problem;
pub mod staging;
pub mod write;

pub use digest::{Digest, Sha256};
pub use frontmatter::{Frontmatter, SkillMd, is_valid_name};
pub use intake::{ArchiveFormat, Intake};
pub use limits::Limits;
pub use manifest::{FileEntry, Manifest};
pub use package::{CheckOptions, Package, Rejection, check};
pub use problem::Problem;
pub use staging::StagingDir;

/// The file every package has at its root.
pub const SKILL_MD: &str = "SKILL.md";

/// Reads a package from a directory or an archive file and validates it. Archives are
/// extracted under `scratch` (a fresh staging directory is made there and kept alive by the
/// returned guard).
pub fn open_and_check(
    source: &std::path::Path,
    scratch: &std::path::Path,
    opts: &CheckOptions,
) -> std::io::Result<(Result<Package, Rejection>, Option<StagingDir>)> {
    if source.is_dir() {
        let intake = intake::scan_dir(source, &opts.limits)?;
        return Ok((check(intake, opts), None));
    }
    let staging = StagingDir::new_in(scratch, ".skillbox-extract-")?;
    let intake = intake::extract_archive_file(source, staging.path(), &opts.limits)?;
    Ok((check(intake, opts), Some(staging)))
}
