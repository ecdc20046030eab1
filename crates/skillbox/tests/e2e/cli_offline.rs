//! The offline CLI commands, run as a user would: exit codes, human and JSON output.

use std::process::Command;

fn skillbox(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_skillbox"))
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn package(dir: &std::path::Path, skill_md: &str) {
    std::fs::create_dir_all(dir.join("scripts")).unwrap();
    std::fs::write(dir.join("SKILL.md"), skill_md).unwrap();
    std::fs::write(dir.join("scripts/a.sh"), "echo a\n").unwrap();
}

#[test]
fn validate_valid_and_invalid() {
    let t = tempfile::tempdir().unwrap();
    let good = t.path().join("good");
    package(&good, "---\nname: good\ndescription: fine\n---\nbody\n");
    let (code, out, _) = skillbox(&["validate", good.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("valid: good (2 files"), "{out}");

    let bad = t.path().join("bad");
    package(&bad, "---\nname: Bad\n---\n");
    let (code, out, _) = skillbox(&["validate", bad.to_str().unwrap()]);
    assert_eq!(code, 1);
    assert!(out.contains("invalid: 2 problems"), "{out}");
    assert!(out.contains("description: is required"), "{out}");

    let (code, out, _) = skillbox(&["validate", "--json", bad.to_str().unwrap()]);
    assert_eq!(code, 1);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["valid"], false);
    let mut fields: Vec<_> = v["problems"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["field"].as_str().unwrap())
        .collect();
    fields.sort();
    assert_eq!(fields, ["description", "name"]);

    let (code, _, err) = skillbox(&["validate", "/nonexistent/x"]);
    assert_eq!(code, 2, "{err}");
}

#[test]
fn digest_of_dir_and_archive_agree() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("demo");
    package(&dir, "---\nname: demo\ndescription: d\n---\n");
    let (code, from_dir, _) = skillbox(&["digest", dir.to_str().unwrap()]);
    assert_eq!(code, 0);
    assert!(
        from_dir.trim().starts_with("sha256:") && from_dir.trim().len() == 71,
        "{from_dir}"
    );
    let tgz = t.path().join("demo.tgz");
    let st = Command::new("tar")
        .args([
            "czf",
            tgz.to_str().unwrap(),
            "-C",
            t.path().to_str().unwrap(),
            "demo",
        ])
        .status()
        .unwrap();
    assert!(st.success());
    let (_, from_tgz, _) = skillbox(&["digest", tgz.to_str().unwrap()]);
    assert_eq!(from_dir, from_tgz);

    let (_, manifest, _) = skillbox(&["digest", "--manifest", dir.to_str().unwrap()]);
    assert!(manifest.starts_with("skillbox-tree-v1\nf "), "{manifest}");
    let lines: Vec<_> = manifest.lines().collect();
    assert_eq!(lines.len(), 3);
    assert!(
        lines[2].starts_with("f 7 ") && lines[2].ends_with(" scripts/a.sh"),
        "{manifest}"
    );
    // the printed digest is the SHA-256 of the printed manifest
    let (_, json, _) = skillbox(&["digest", "--json", dir.to_str().unwrap()]);
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["digest"].as_str().unwrap(), from_dir.trim());
    assert_eq!(v["file_count"], 2);
    let expected = format!(
        "sha256:{}",
        skillbox_package::Sha256::of(manifest.as_bytes())
    );
    assert_eq!(from_dir.trim(), expected);
}

#[test]
fn doctor_reports_every_backend() {
    let (code, out, _) = skillbox(&["doctor", "--json"]);
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let backends = v["backends"].as_array().unwrap();
    let names: Vec<_> = backends
        .iter()
        .map(|b| b["backend"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["bwrap", "docker", "none"]);
    for b in backends {
        assert!(!b["detail"].as_str().unwrap().is_empty());
        // Nothing claims to be usable unless it is built and works here.
        assert_eq!(
            b["usable"],
            b["built"].as_bool().unwrap() && b["works_here"].as_bool().unwrap()
        );
    }
    assert_eq!(backends[2]["usable"], true);
    assert_eq!(backends[0]["built"], true, "bwrap is built");
    assert_eq!(backends[1]["built"], true, "docker is built");
    let detail = backends[1]["detail"].as_str().unwrap();
    assert!(
        !backends[1]["works_here"].as_bool().unwrap() || detail.contains("recursive read-only"),
        "doctor says whether recursive read-only mounts are supported: {detail}"
    );
    let (code, human, _) = skillbox(&["doctor"]);
    assert_eq!(code, 0);
    assert!(
        human.contains("bwrap") && human.contains("docker") && human.contains("none    usable"),
        "{human}"
    );
}

#[test]
fn output_into_a_closed_pipe_ends_quietly() {
    // `skillbox … | head -1` where head has already gone: no panic, no error.
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let out = Command::new(env!("CARGO_BIN_EXE_skillbox"))
        .args(["doctor", "--json"])
        .stdout(writer)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(!stderr.contains("error"), "{stderr}");
    assert_eq!(out.status.code(), Some(0), "{stderr}");
}
