//! Offline commands: `validate` and `digest`.

use anyhow::Context;
use serde_json::json;
use skillbox_package::{CheckOptions, Limits, Manifest, Problem, StagingDir, intake};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct ValidateArgs {
    /// Package directory, or a zip / tar / tar.gz archive.
    pub path: PathBuf,
    /// The skill name it will be published under (frontmatter `name` must equal it).
    #[arg(long)]
    pub skill: Option<String>,
    /// Reject unknown frontmatter keys instead of warning.
    #[arg(long, env = "SKILLBOX_STRICT")]
    pub strict: bool,
    /// Machine-readable output.
    #[arg(long)]
    pub json: bool,
}

#[derive(clap::Args)]
pub struct DigestArgs {
    /// Package directory, or a zip / tar / tar.gz archive.
    pub path: PathBuf,
    /// Print the canonical manifest bytes instead of the digest.
    #[arg(long)]
    pub manifest: bool,
    /// Machine-readable output.
    #[arg(long)]
    pub json: bool,
}

/// Reads `path` (directory in place, archive extracted to a temporary directory).
fn read_package(
    path: &Path,
    limits: &Limits,
) -> anyhow::Result<(intake::Intake, Option<StagingDir>)> {
    if path.is_dir() {
        let i = intake::scan_dir(path, limits)
            .with_context(|| format!("reading {}", path.display()))?;
        return Ok((i, None));
    }
    anyhow::ensure!(
        path.exists(),
        "{}: no such file or directory",
        path.display()
    );
    let staging = StagingDir::new_in(&std::env::temp_dir(), "skillbox-extract-")?;
    let i = intake::extract_archive_file(path, staging.path(), limits)
        .with_context(|| format!("extracting {}", path.display()))?;
    Ok((i, Some(staging)))
}

pub fn validate(a: ValidateArgs) -> anyhow::Result<ExitCode> {
    let opts = CheckOptions {
        strict: a.strict,
        expected_name: a.skill.clone(),
        limits: Limits::default(),
    };
    let (intake, _staging) = read_package(&a.path, &opts.limits)?;
    let result = skillbox_package::check(intake, &opts);
    let out = &mut std::io::stdout().lock();
    match result {
        Ok(pkg) => {
            if a.json {
                let v = json!({
                    "valid": true,
                    "name": pkg.skill.frontmatter.name,
                    "digest": pkg.digest,
                    "file_count": pkg.manifest.len(),
                    "size": pkg.manifest.total_size(),
                    "frontmatter": pkg.skill.frontmatter,
                    "problems": [],
                    "warnings": pkg.warnings,
                });
                writeln!(out, "{v}")?;
            } else {
                writeln!(
                    out,
                    "valid: {} ({} files, {} bytes)\n{}",
                    pkg.skill.frontmatter.name,
                    pkg.manifest.len(),
                    pkg.manifest.total_size(),
                    pkg.digest
                )?;
                print_list(out, "warning", &pkg.warnings)?;
            }
            Ok(ExitCode::SUCCESS)
        }
        Err(r) => {
            if a.json {
                let v = json!({"valid": false, "problems": r.problems, "warnings": r.warnings});
                writeln!(out, "{v}")?;
            } else {
                writeln!(
                    out,
                    "invalid: {} problem{}",
                    r.problems.len(),
                    if r.problems.len() == 1 { "" } else { "s" }
                )?;
                print_list(out, "error", &r.problems)?;
                print_list(out, "warning", &r.warnings)?;
            }
            Ok(ExitCode::from(1))
        }
    }
}

fn print_list(out: &mut impl Write, label: &str, items: &[Problem]) -> std::io::Result<()> {
    for p in items {
        writeln!(out, "  {label}: {p}")?;
    }
    Ok(())
}

pub fn digest(a: DigestArgs) -> anyhow::Result<ExitCode> {
    // The digest is defined for any tree; size limits belong to publication, not to it.
    let (intake, _staging) = read_package(&a.path, &Limits::unbounded())?;
    if !intake.problems.is_empty() {
        eprintln!(
            "cannot digest {}: the tree breaks the path rules or limits",
            a.path.display()
        );
        print_list(&mut std::io::stderr(), "error", &intake.problems)?;
        return Ok(ExitCode::from(1));
    }
    let manifest = Manifest::new(intake.files)?;
    let out = &mut std::io::stdout().lock();
    if a.manifest {
        out.write_all(&manifest.encode())?;
    } else if a.json {
        let v = json!({"digest": manifest.digest(), "file_count": manifest.len(), "size": manifest.total_size()});
        writeln!(out, "{v}")?;
    } else {
        writeln!(out, "{}", manifest.digest())?;
    }
    Ok(ExitCode::SUCCESS)
}
