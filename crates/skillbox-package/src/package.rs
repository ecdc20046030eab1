//! Validation of a whole package: intake problems, `SKILL.md`, the name, the manifest.

use crate::SKILL_MD;
use crate::digest::Digest;
use crate::frontmatter::{SkillMd, parse_skill_md};
use crate::intake::Intake;
use crate::limits::Limits;
use crate::manifest::Manifest;
use crate::problem::Problem;
use std::path::PathBuf;

/// How strictly to validate.
#[derive(Debug, Clone, Default)]
pub struct CheckOptions {
    /// Reject unknown frontmatter keys instead of warning.
    pub strict: bool,
    /// The skill name the package is published under; `name` must equal it.
    pub expected_name: Option<String>,
    pub limits: Limits,
}

/// A valid package on disk, with its manifest and digest.
#[derive(Debug, Clone)]
pub struct Package {
    pub root: PathBuf,
    pub manifest: Manifest,
    pub digest: Digest,
    pub skill: SkillMd,
    pub warnings: Vec<Problem>,
}

/// Why a package was refused: all problems found, plus the warnings.
#[derive(Debug, Clone, thiserror::Error)]
#[error("invalid package: {}", summarize(.problems))]
pub struct Rejection {
    pub problems: Vec<Problem>,
    pub warnings: Vec<Problem>,
}

fn summarize(problems: &[Problem]) -> String {
    let mut s = problems
        .iter()
        .take(3)
        .map(|p| p.to_string())
        .collect::<Vec<_>>()
        .join("; ");
    if problems.len() > 3 {
        s.push_str(&format!(" (and {} more)", problems.len() - 3));
    }
    s
}

/// Turns an [`Intake`] into a [`Package`], collecting every problem.
pub fn check(intake: Intake, opts: &CheckOptions) -> Result<Package, Rejection> {
    let Intake {
        root,
        files,
        mut problems,
        complete,
    } = intake;
    let mut warnings = Vec::new();
    let mut skill = None;
    if files.iter().any(|f| f.path == SKILL_MD) {
        match std::fs::read(root.join(SKILL_MD)) {
            Ok(bytes) => {
                let parsed = parse_skill_md(&bytes, opts.limits.max_frontmatter_bytes);
                problems.extend(parsed.problems);
                if opts.strict {
                    problems.extend(parsed.warnings.into_iter().map(|mut w| {
                        w.message = "unknown frontmatter key (strict mode rejects it)".into();
                        w
                    }));
                } else {
                    warnings.extend(parsed.warnings);
                }
                skill = parsed.skill;
            }
            Err(e) => problems.push(Problem::at_path(SKILL_MD, format!("cannot be read: {e}"))),
        }
    } else if complete && !problems.iter().any(|p| p.path.as_deref() == Some(SKILL_MD)) {
        problems.push(Problem::at_path(
            SKILL_MD,
            "missing: a package needs SKILL.md at its root",
        ));
    }
    if let (Some(s), Some(expected)) = (&skill, &opts.expected_name)
        && &s.frontmatter.name != expected
    {
        problems.push(Problem::at_field(
            "name",
            format!(
                "is {:?} but the package is published as {expected:?}; they must be equal",
                s.frontmatter.name
            ),
        ));
    }
    let manifest = match Manifest::new(files) {
        Ok(m) => Some(m),
        Err(e) => {
            problems.push(Problem::general(e.to_string()));
            None
        }
    };
    match (manifest, skill) {
        (Some(manifest), Some(skill)) if problems.is_empty() => {
            let digest = manifest.digest();
            Ok(Package {
                root,
                manifest,
                digest,
                skill,
                warnings,
            })
        }
        _ => Err(Rejection { problems, warnings }),
    }
}
