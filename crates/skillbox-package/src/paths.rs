//! Package path rules (SPEC §2) and collision detection under Unicode case folding.

use std::collections::{HashMap, HashSet};

pub const MAX_COMPONENT_BYTES: usize = 255;
pub const MAX_PATH_BYTES: usize = 1024;

/// Checks one package path against the rules of SPEC §2; the error says which rule it breaks.
pub fn check_path(path: &str) -> Result<(), String> {
    check_path_with_max(path, MAX_PATH_BYTES)
}

/// Like [`check_path`], for raw bytes that may not be UTF-8. Returns the path as text.
pub fn check_path_bytes(bytes: &[u8]) -> Result<&str, String> {
    let path = std::str::from_utf8(bytes).map_err(|_| "path is not valid UTF-8".to_string())?;
    check_path(path)?;
    Ok(path)
}

pub(crate) fn check_path_with_max(path: &str, max_bytes: usize) -> Result<(), String> {
    if path.is_empty() {
        return Err("path is empty".into());
    }
    if path.starts_with('/') {
        return Err("absolute paths are not allowed".into());
    }
    if let Some(c) = path.chars().find(|c| is_forbidden_char(*c)) {
        return Err(match c {
            '\\' => "backslash is not allowed in paths".into(),
            '\0' => "NUL is not allowed in paths".into(),
            c => format!(
                "control character U+{:04X} is not allowed in paths",
                c as u32
            ),
        });
    }
    if path.len() > max_bytes {
        return Err(format!(
            "path is {} bytes long; the limit is {max_bytes}",
            path.len()
        ));
    }
    for component in path.split('/') {
        match component {
            "" => return Err("empty path component (leading, trailing or doubled '/')".into()),
            "." => return Err("'.' is not allowed as a path component".into()),
            ".." => return Err("'..' is not allowed as a path component".into()),
            c if c.len() > MAX_COMPONENT_BYTES => {
                return Err(format!(
                    "path component is {} bytes long; the limit is {MAX_COMPONENT_BYTES}",
                    c.len()
                ));
            }
            _ => {}
        }
    }
    Ok(())
}

fn is_forbidden_char(c: char) -> bool {
    c == '\\' || (c as u32) <= 0x1f || c == '\u{7f}'
}

/// The form two paths share when they collide: Unicode canonical caseless matching
/// (NFD, default case folding, NFD again), so `A.md`/`a.md` and `café.md` composed/decomposed
/// (equal after NFC normalization) are one name, as on case-insensitive or normalizing file
/// systems.
pub fn case_fold(s: &str) -> String {
    use unicode_normalization::UnicodeNormalization;
    let folded = caseless::default_case_fold_str(&s.nfd().collect::<String>());
    folded.nfd().collect()
}

/// Tracks the paths of one package and reports collisions: exact duplicates, paths equal under
/// Unicode case folding, a path used both as a file and as a directory, and one directory
/// spelled two ways.
#[derive(Default)]
pub struct PathSet {
    /// folded path → (original spelling, is a directory)
    seen: HashMap<String, (String, bool)>,
    explicit_dirs: HashSet<String>,
}

impl PathSet {
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers a file path (already checked by [`check_path`]) and its parent directories.
    pub fn add_file(&mut self, path: &str) -> Result<(), String> {
        self.add_ancestors(path)?;
        let folded = case_fold(path);
        match self.seen.get(&folded) {
            Some((_, true)) => Err(format!("'{path}' is both a file and a directory")),
            Some((other, false)) if other == path => Err("duplicate entry".into()),
            Some((other, false)) => Err(format!(
                "collides with '{other}' under Unicode case folding and normalization"
            )),
            None => {
                self.seen.insert(folded, (path.to_string(), false));
                Ok(())
            }
        }
    }

    /// Registers an explicit directory entry of an archive.
    pub fn add_dir(&mut self, path: &str) -> Result<(), String> {
        if !self.explicit_dirs.insert(path.to_string()) {
            return Err("duplicate entry".into());
        }
        self.add_ancestors(path)?;
        self.add_dir_component(path)
    }

    fn add_ancestors(&mut self, path: &str) -> Result<(), String> {
        for (i, _) in path.match_indices('/') {
            self.add_dir_component(&path[..i])?;
        }
        Ok(())
    }

    fn add_dir_component(&mut self, dir: &str) -> Result<(), String> {
        let folded = case_fold(dir);
        match self.seen.get(&folded) {
            Some((_, false)) => Err(format!("'{dir}' is both a file and a directory")),
            Some((other, true)) if other != dir => Err(format!(
                "directory '{dir}' collides with '{other}' under Unicode case folding and normalization"
            )),
            Some(_) => Ok(()),
            None => {
                self.seen.insert(folded, (dir.to_string(), true));
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules() {
        for ok in [
            "SKILL.md",
            "a/b/c.txt",
            "dir with space/ü.md",
            "a-b",
            ".hidden",
            "a..b",
        ] {
            assert_eq!(check_path(ok), Ok(()), "{ok}");
        }
        let bad = [
            ("", "empty"),
            ("/etc/passwd", "absolute"),
            ("../x", "'..'"),
            ("a/../b", "'..'"),
            ("./a", "'.'"),
            ("a//b", "empty path component"),
            ("a/", "empty path component"),
            ("a\\b", "backslash"),
            ("a\u{0}b", "NUL"),
            ("a\nb", "U+000A"),
            ("a\u{7f}", "U+007F"),
        ];
        for (p, want) in bad {
            let err = check_path(p).unwrap_err();
            assert!(err.contains(want), "{p:?}: {err}");
        }
        let long_component = "x".repeat(256);
        assert!(
            check_path(&long_component)
                .unwrap_err()
                .contains("component")
        );
        let long_path = vec!["y".repeat(200); 6].join("/");
        assert!(check_path(&long_path).unwrap_err().contains("1024"));
        assert_eq!(
            check_path_bytes(b"\xff\xfe").unwrap_err(),
            "path is not valid UTF-8"
        );
    }

    #[test]
    fn collisions() {
        let mut set = PathSet::new();
        set.add_file("README.md").unwrap();
        assert!(
            set.add_file("readme.md")
                .unwrap_err()
                .contains("case folding")
        );
        assert_eq!(set.add_file("README.md").unwrap_err(), "duplicate entry");
        // ß folds to "ss"
        set.add_file("straße.txt").unwrap();
        assert!(
            set.add_file("STRASSE.txt")
                .unwrap_err()
                .contains("case folding")
        );
        set.add_file("a/b").unwrap();
        assert!(
            set.add_file("a")
                .unwrap_err()
                .contains("both a file and a directory")
        );
        assert!(
            set.add_file("README.md/x")
                .unwrap_err()
                .contains("both a file")
        );
        assert!(set.add_file("A/c").unwrap_err().contains("collides"));
        set.add_dir("a").unwrap();
        assert_eq!(set.add_dir("a").unwrap_err(), "duplicate entry");
        set.add_file("a-b").unwrap();
        set.add_file("a/b2").unwrap();
    }
}
