//! Structured problems: every rejection names what is wrong and where.

use serde::{Deserialize, Serialize};
use std::fmt;

/// One thing wrong (or, as a warning, questionable) with a package.
///
/// `path` names the file inside the package, `field` the frontmatter key; either may be
/// absent when the problem concerns the package as a whole.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Problem {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
    pub message: String,
}

impl Problem {
    pub fn general(message: impl Into<String>) -> Self {
        Problem {
            path: None,
            field: None,
            message: message.into(),
        }
    }

    pub fn at_path(path: impl Into<String>, message: impl Into<String>) -> Self {
        Problem {
            path: Some(path.into()),
            field: None,
            message: message.into(),
        }
    }

    /// A problem with a frontmatter field of `SKILL.md`.
    pub fn at_field(field: impl Into<String>, message: impl Into<String>) -> Self {
        Problem {
            path: Some(crate::SKILL_MD.to_string()),
            field: Some(field.into()),
            message: message.into(),
        }
    }
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.path, &self.field) {
            (Some(p), Some(k)) => write!(f, "{p}: {k}: {}", self.message),
            (Some(p), None) => write!(f, "{p}: {}", self.message),
            (None, Some(k)) => write!(f, "{k}: {}", self.message),
            (None, None) => f.write_str(&self.message),
        }
    }
}
