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
    let map = match parse_yaml_mapping(yaml) {
        Ok(map) => map,
        Err(m) => {
            out.problems.push(path_problem(m));
            return out;
        }
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
                None | Some(Yaml::Null) if required => {
                    problems.push(Problem::at_field(key, "is required"));
                    None
                }
                None | Some(Yaml::Null) => None,
                Some(Yaml::Str(s)) => {
                    let chars = s.chars().count();
                    // `compatibility` is 1–500 characters when present (SPEC §3).
                    if (required || key == "compatibility") && s.trim().is_empty() {
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
                        format!("must be a string, found {}", other.kind()),
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
        None | Some(Yaml::Null) => {}
        Some(Yaml::Map(m)) => {
            // Plain scalars (`version: 1.0`) keep their source text, as a string.
            let source = metadata_source_text(yaml);
            for (k, v) in m {
                match (v, source.get(k)) {
                    (Yaml::Str(s), _) => {
                        fm.metadata.insert(k.clone(), s.clone());
                    }
                    (Yaml::Bool(_) | Yaml::Int(_) | Yaml::Float(_), Some(Some(text))) => {
                        fm.metadata.insert(k.clone(), text.clone());
                    }
                    (other, _) => out.problems.push(Problem::at_field(
                        format!("metadata.{k}"),
                        format!("must be a string, found {} (quote the value)", other.kind()),
                    )),
                }
            }
        }
        Some(other) => out.problems.push(Problem::at_field(
            "metadata",
            format!(
                "must be a mapping of strings to strings, found {}",
                other.kind()
            ),
        )),
    }
    for (k, v) in &map {
        if !KNOWN_KEYS.contains(&k.as_str()) {
            out.warnings.push(Problem::at_field(
                k.clone(),
                "unknown frontmatter key (kept as is)",
            ));
            fm.unknown.insert(k.clone(), v.to_json());
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

/// A YAML node under the YAML 1.2 core schema (`yes`/`on` are strings; `.inf` is a float).
#[derive(Debug, Clone, PartialEq)]
enum Yaml {
    Null,
    Bool(bool),
    Int(i64),
    /// Any other number, `.inf` and `.nan` included.
    Float(f64),
    Str(String),
    Seq(Vec<Yaml>),
    Map(BTreeMap<String, Yaml>),
}

impl Yaml {
    fn kind(&self) -> &'static str {
        match self {
            Yaml::Null => "null",
            Yaml::Bool(_) => "a boolean",
            Yaml::Int(_) | Yaml::Float(_) => "a number",
            Yaml::Str(_) => "a string",
            Yaml::Seq(_) => "a list",
            Yaml::Map(_) => "a mapping",
        }
    }

    /// As JSON, for unknown keys kept in the frontmatter (a non-finite number as its text).
    fn to_json(&self) -> serde_json::Value {
        use serde_json::Value as V;
        match self {
            Yaml::Null => V::Null,
            Yaml::Bool(b) => V::Bool(*b),
            Yaml::Int(n) => V::from(*n),
            Yaml::Float(n) => serde_json::Number::from_f64(*n)
                .map(V::Number)
                .unwrap_or_else(|| V::String(n.to_string())),
            Yaml::Str(s) => V::String(s.clone()),
            Yaml::Seq(v) => V::Array(v.iter().map(Yaml::to_json).collect()),
            Yaml::Map(m) => V::Object(m.iter().map(|(k, v)| (k.clone(), v.to_json())).collect()),
        }
    }
}

impl<'de> Deserialize<'de> for Yaml {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = Yaml;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a YAML value")
            }
            fn visit_bool<E>(self, b: bool) -> Result<Yaml, E> {
                Ok(Yaml::Bool(b))
            }
            fn visit_i64<E>(self, n: i64) -> Result<Yaml, E> {
                Ok(Yaml::Int(n))
            }
            fn visit_u64<E>(self, n: u64) -> Result<Yaml, E> {
                Ok(i64::try_from(n).map_or(Yaml::Float(n as f64), Yaml::Int))
            }
            fn visit_i128<E>(self, n: i128) -> Result<Yaml, E> {
                Ok(i64::try_from(n).map_or(Yaml::Float(n as f64), Yaml::Int))
            }
            fn visit_u128<E>(self, n: u128) -> Result<Yaml, E> {
                Ok(i64::try_from(n).map_or(Yaml::Float(n as f64), Yaml::Int))
            }
            fn visit_f64<E>(self, n: f64) -> Result<Yaml, E> {
                Ok(Yaml::Float(n))
            }
            fn visit_str<E>(self, s: &str) -> Result<Yaml, E> {
                Ok(Yaml::Str(s.to_string()))
            }
            fn visit_string<E>(self, s: String) -> Result<Yaml, E> {
                Ok(Yaml::Str(s))
            }
            fn visit_unit<E>(self) -> Result<Yaml, E> {
                Ok(Yaml::Null)
            }
            fn visit_none<E>(self) -> Result<Yaml, E> {
                Ok(Yaml::Null)
            }
            fn visit_some<D: serde::Deserializer<'de>>(self, d: D) -> Result<Yaml, D::Error> {
                Yaml::deserialize(d)
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut a: A) -> Result<Yaml, A::Error> {
                let mut v = Vec::new();
                while let Some(x) = a.next_element()? {
                    v.push(x);
                }
                Ok(Yaml::Seq(v))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut a: A) -> Result<Yaml, A::Error> {
                let mut m = BTreeMap::new();
                while let Some((k, v)) = a.next_entry::<String, Yaml>()? {
                    m.insert(k, v);
                }
                Ok(Yaml::Map(m))
            }
        }
        d.deserialize_any(V)
    }
}

/// The YAML 1.2 core schema: `yes`, `on`, `y` … are strings; `.inf` and `.nan` are numbers.
fn yaml_options() -> serde_saphyr::Options {
    serde_saphyr::options! {
        strict_booleans: true,
        non_finite_float_policy: serde_saphyr::options::NonFiniteFloatPolicy::PassThrough,
    }
}

/// The frontmatter as a mapping, or why it is not one.
fn parse_yaml_mapping(yaml: &str) -> Result<BTreeMap<String, Yaml>, String> {
    match serde_saphyr::from_str_with_options::<Yaml>(yaml, yaml_options()) {
        Ok(Yaml::Map(m)) => Ok(m),
        Ok(_) => Err("frontmatter must be a YAML mapping of keys to values".into()),
        Err(e) => Err(format!(
            "frontmatter is not valid YAML: {}",
            first_line(&e.to_string())
        )),
    }
}

/// `metadata`'s scalar values as their source text (`1.0` stays "1.0", not 1); empty when
/// `metadata` holds anything but scalars (then the typed pass reports it).
fn metadata_source_text(yaml: &str) -> BTreeMap<String, Option<String>> {
    #[derive(Deserialize)]
    struct OnlyMetadata {
        #[serde(default)]
        metadata: Option<BTreeMap<String, Option<String>>>,
    }
    serde_saphyr::from_str_with_options::<OnlyMetadata>(yaml, yaml_options())
        .ok()
        .and_then(|m| m.metadata)
        .unwrap_or_default()
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
            "---\nname: Bad_Name\ndescription: {}\ncompatibility: {}\nmetadata:\n  v: [1]\nlicense: [a]\n---\n",
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

    #[test]
    fn yaml_1_2_core_schema() {
        // YAML 1.1 booleans are strings; `on` is even a valid name.
        let p = parse("---\nname: on\ndescription: yes\nlicense: off\n---\n");
        assert!(p.problems.is_empty(), "{:?}", p.problems);
        let fm = p.skill.unwrap().frontmatter;
        assert_eq!((fm.name.as_str(), fm.description.as_str()), ("on", "yes"));
        assert_eq!(fm.license.as_deref(), Some("off"));
        // A non-finite float is a number where a string is expected: reported by field.
        let p = parse("---\nname: demo\ndescription: .inf\n---\n");
        assert_eq!(p.problems.len(), 1, "{:?}", p.problems);
        assert_eq!(p.problems[0].field.as_deref(), Some("description"));
        assert!(
            p.problems[0].message.contains("a number"),
            "{:?}",
            p.problems
        );
        let p = parse("---\nname: true\ndescription: d\n---\n");
        assert_eq!(p.problems[0].field.as_deref(), Some("name"));
        assert!(
            p.problems[0].message.contains("a boolean"),
            "{:?}",
            p.problems
        );
    }

    #[test]
    fn metadata_plain_scalars_keep_their_source_text() {
        let p = parse(
            "---\nname: demo\ndescription: d\nmetadata:\n  version: 1.0\n  build: 010\n  flag: yes\n  on: true\n  q: \"2.50\"\n---\n",
        );
        assert!(p.problems.is_empty(), "{:?}", p.problems);
        let m = p.skill.unwrap().frontmatter.metadata;
        assert_eq!(m["version"], "1.0");
        assert_eq!(m["build"], "010");
        assert_eq!(m["flag"], "yes");
        assert_eq!(m["on"], "true");
        assert_eq!(m["q"], "2.50");
        let p = parse("---\nname: demo\ndescription: d\nmetadata:\n  nested: [1]\n---\n");
        assert_eq!(p.problems[0].field.as_deref(), Some("metadata.nested"));
    }

    #[test]
    fn empty_compatibility_is_refused() {
        let p = parse("---\nname: demo\ndescription: d\ncompatibility: \"\"\n---\n");
        assert_eq!(p.problems.len(), 1, "{:?}", p.problems);
        assert_eq!(p.problems[0].field.as_deref(), Some("compatibility"));
    }
}
