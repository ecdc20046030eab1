//! `SKILL.md`: the YAML frontmatter (SPEC §3) and the instructions body.

use crate::problem::Problem;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

pub const MAX_NAME_CHARS: usize = 64;
pub const MAX_DESCRIPTION_CHARS: usize = 1024;
pub const MAX_COMPATIBILITY_CHARS: usize = 500;

/// The frontmatter keys SPEC §3 defines; anything else is "unknown".
pub const KNOWN_KEYS: [&str; 6] = [
    "name",
    "description",
    "license",
    "compatibility",
    "metadata",
    "allowed-tools",
];

/// Parsed frontmatter. Unknown keys are kept (the stored file is byte-exact anyway) and
/// reported as warnings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Frontmatter {
    pub name: String,
    pub description: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub license: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compatibility: Option<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub metadata: BTreeMap<String, String>,
    #[serde(
        default,
        rename = "allowed-tools",
        skip_serializing_if = "Option::is_none"
    )]
    pub allowed_tools: Option<String>,
    #[serde(flatten)]
    pub unknown: BTreeMap<String, serde_json::Value>,
}

/// A parsed `SKILL.md`.
#[derive(Debug, Clone, PartialEq)]
pub struct SkillMd {
    pub frontmatter: Frontmatter,
    /// The instructions: everything after the closing `---` line.
    pub body: String,
}

/// The outcome of parsing `SKILL.md`: the document when it is usable, every problem found,
/// and warnings (unknown keys) that strict mode turns into problems.
#[derive(Debug, Default)]
pub struct Parsed {
    pub skill: Option<SkillMd>,
    pub problems: Vec<Problem>,
    pub warnings: Vec<Problem>,
}

/// Is `name` a valid skill (and workspace) name: `^[a-z0-9]+(-[a-z0-9]+)*$`, 1–64 chars.
pub fn is_valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_NAME_CHARS
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-')
        && !name.contains("--")
}

/// Splits `SKILL.md` text into (frontmatter YAML, body). The opening fence must be the first
/// line; the closing fence is the next line consisting of `---` (trailing spaces and `\r`
/// are tolerated on both).
fn split_fences(text: &str) -> Result<(&str, &str), &'static str> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let first_end = text
        .find('\n')
        .ok_or("must start with a YAML frontmatter block: '---' on the first line")?;
    if text[..first_end].trim_end() != "---" {
        return Err("must start with a YAML frontmatter block: '---' on the first line");
    }
    let rest = &text[first_end + 1..];
    let mut offset = 0;
    for line in rest.split_inclusive('\n') {
        if line.trim_end() == "---" {
            return Ok((&rest[..offset], &rest[offset + line.len()..]));
        }
        offset += line.len();
    }
    Err("frontmatter is not closed: no '---' line after the opening one")
}

/// Parses `SKILL.md` bytes, collecting every problem. `max_frontmatter_bytes` bounds the YAML
/// handed to the parser.
pub fn parse_skill_md(bytes: &[u8], max_frontmatter_bytes: usize) -> Parsed {
    let mut out = Parsed::default();
    let path_problem = |m: String| Problem::at_path(crate::SKILL_MD, m);
    let Ok(text) = std::str::from_utf8(bytes) else {
        out.problems.push(path_problem("is not valid UTF-8".into()));
        return out;
    };
    let (yaml, body) = match split_fences(text) {
        Ok(parts) => parts,
        Err(m) => {
            out.problems.push(path_problem(m.into()));
            return out;
        }
    };
    if yaml.len() > max_frontmatter_bytes {
        out.problems.push(path_problem(format!(
            "frontmatter is {} bytes; the limit is {max_frontmatter_bytes}",
            yaml.len()
        )));
        return out;
    }
    let value: serde_json::Value = match serde_saphyr::from_str(yaml) {
        Ok(v) => v,
        Err(e) => {
            out.problems.push(path_problem(format!(
                "frontmatter is not valid YAML: {}",
                first_line(&e.to_string())
            )));
            return out;
        }
    };
    let serde_json::Value::Object(map) = value else {
        out.problems.push(path_problem(
            "frontmatter must be a YAML mapping of keys to values".into(),
        ));
        return out;
    };

    let mut fm = Frontmatter {
        name: String::new(),
        description: String::new(),
        license: None,
        compatibility: None,
        metadata: BTreeMap::new(),
        allowed_tools: None,
        unknown: BTreeMap::new(),
    };
    let problems = &mut out.problems;
    let mut string_field =
        |key: &str, max_chars: Option<usize>, required: bool| -> Option<String> {
            match map.get(key) {
                None | Some(serde_json::Value::Null) if required => {
                    problems.push(Problem::at_field(key, "is required"));
                    None
                }
                None | Some(serde_json::Value::Null) => None,
                Some(serde_json::Value::String(s)) => {
                    let chars = s.chars().count();
                    if required && s.trim().is_empty() {
                        problems.push(Problem::at_field(key, "must not be empty"));
                    } else if let Some(max) = max_chars.filter(|max| chars > *max) {
                        problems.push(Problem::at_field(
                            key,
                            format!("is {chars} characters; the limit is {max}"),
                        ));
                    }
                    Some(s.clone())
                }
                Some(other) => {
                    problems.push(Problem::at_field(
                        key,
                        format!("must be a string, found {}", json_kind(other)),
                    ));
                    None
                }
            }
        };

    let name = string_field("name", None, true);
    let description = string_field("description", Some(MAX_DESCRIPTION_CHARS), true);
    fm.license = string_field("license", None, false);
    fm.compatibility = string_field("compatibility", Some(MAX_COMPATIBILITY_CHARS), false);
    fm.allowed_tools = string_field("allowed-tools", None, false);
    if let Some(n) = &name
        && !n.is_empty()
        && !is_valid_name(n)
    {
        out.problems.push(Problem::at_field(
                "name",
                format!("{n:?} is not a valid name: 1–64 characters of a-z, 0-9 and single hyphens, not starting or ending with a hyphen"),
            ));
    }
    match map.get("metadata") {
        None | Some(serde_json::Value::Null) => {}
        Some(serde_json::Value::Object(m)) => {
            for (k, v) in m {
                match v {
                    serde_json::Value::String(s) => {
                        fm.metadata.insert(k.clone(), s.clone());
                    }
                    other => out.problems.push(Problem::at_field(
                        format!("metadata.{k}"),
                        format!(
                            "must be a string, found {} (quote the value)",
                            json_kind(other)
                        ),
                    )),
                }
            }
        }
        Some(other) => out.problems.push(Problem::at_field(
            "metadata",
            format!(
                "must be a mapping of strings to strings, found {}",
                json_kind(other)
            ),
        )),
    }
    for (k, v) in &map {
        if !KNOWN_KEYS.contains(&k.as_str()) {
            out.warnings.push(Problem::at_field(
                k.clone(),
                "unknown frontmatter key (kept as is)",
            ));
            fm.unknown.insert(k.clone(), v.clone());
        }
    }
    if out.problems.is_empty() {
        fm.name = name.unwrap_or_default();
        fm.description = description.unwrap_or_default();
        out.skill = Some(SkillMd {
            frontmatter: fm,
            body: body.to_string(),
        });
    }
    out
}

fn first_line(s: &str) -> &str {
    s.lines().next().unwrap_or(s)
}

fn json_kind(v: &serde_json::Value) -> &'static str {
    match v {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "a list",
        serde_json::Value::Object(_) => "a mapping",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Parsed {
        parse_skill_md(s.as_bytes(), 64 * 1024)
    }

    #[test]
    fn full_frontmatter() {
        let p = parse(
            "---\nname: pdf-tools\ndescription: Work with PDFs.\nlicense: MIT\ncompatibility: python3\nmetadata:\n  author: me\n  version: \"1.0\"\nallowed-tools: Bash(python:*)\nx-extra: [1, 2]\n---\n# Body\nline\n",
        );
        assert!(p.problems.is_empty(), "{:?}", p.problems);
        let s = p.skill.unwrap();
        assert_eq!(s.frontmatter.name, "pdf-tools");
        assert_eq!(s.frontmatter.license.as_deref(), Some("MIT"));
        assert_eq!(s.frontmatter.metadata["version"], "1.0");
        assert_eq!(
            s.frontmatter.allowed_tools.as_deref(),
            Some("Bash(python:*)")
        );
        assert_eq!(s.body, "# Body\nline\n");
        assert_eq!(p.warnings.len(), 1);
        assert_eq!(p.warnings[0].field.as_deref(), Some("x-extra"));
        let json = serde_json::to_value(&s.frontmatter).unwrap();
        assert_eq!(json["allowed-tools"], "Bash(python:*)");
        assert_eq!(json["x-extra"], serde_json::json!([1, 2]));
    }

    #[test]
    fn all_problems_reported() {
        let p = parse(&format!(
            "---\nname: Bad_Name\ndescription: {}\ncompatibility: {}\nmetadata:\n  v: 1\nlicense: [a]\n---\n",
            "d".repeat(1025),
            "c".repeat(501)
        ));
        let fields: Vec<_> = p.problems.iter().filter_map(|p| p.field.clone()).collect();
        for f in [
            "name",
            "description",
            "compatibility",
            "metadata.v",
            "license",
        ] {
            assert!(
                fields.iter().any(|x| x == f),
                "missing {f}: {:?}",
                p.problems
            );
        }
        assert!(p.skill.is_none());
    }

    #[test]
    fn fences() {
        assert!(
            parse("name: x\n").problems[0]
                .message
                .contains("first line")
        );
        assert!(
            parse("---\nname: x\n").problems[0]
                .message
                .contains("not closed")
        );
        assert!(parse("---\n---\n").problems[0].message.contains("mapping"));
        assert!(
            parse("---\n: : :\n  - [\n---\n").problems[0]
                .message
                .contains("YAML")
        );
        let p = parse("---\r\nname: a\r\ndescription: b\r\n---\r\nbody");
        assert!(p.problems.is_empty(), "{:?}", p.problems);
        assert_eq!(p.skill.unwrap().body, "body");
        let missing = parse("---\nlicense: MIT\n---\n");
        assert_eq!(missing.problems.len(), 2);
    }

    #[test]
    fn names() {
        for ok in ["a", "pdf", "a-b-c", "x1", &"a".repeat(64)] {
            assert!(is_valid_name(ok), "{ok}");
        }
        for bad in [
            "",
            "-a",
            "a-",
            "a--b",
            "A",
            "a_b",
            "a b",
            &"a".repeat(65),
            "é",
        ] {
            assert!(!is_valid_name(bad), "{bad}");
        }
    }

    #[test]
    fn huge_frontmatter_rejected_before_parsing() {
        let p = parse_skill_md(
            format!("---\nname: a\ndescription: {}\n---\n", "x".repeat(100)).as_bytes(),
            50,
        );
        assert!(p.problems[0].message.contains("limit"));
    }
}
