//! The client CLI against a real server, as a user drives it: every command with `--json`,
//! exit codes, and the human output of the main ones.

use crate::support::*;
use serde_json::Value;
use std::process::Command;

struct Cli<'a> {
    s: &'a Server,
    token: String,
    /// `-w`; `None`: no workspace named, by flag or environment.
    workspace: Option<&'static str>,
}

impl Cli<'_> {
    fn run(&self, args: &[&str]) -> (i32, String, String) {
        let out = Command::new(bin())
            .env_remove("SKILLBOX_WORKSPACE")
            .args(["--url", &self.s.url, "--token", &self.token])
            .args(self.workspace.iter().flat_map(|w| ["-w", w]))
            .args(args)
            .output()
            .unwrap();
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    fn json(&self, args: &[&str]) -> Value {
        let mut a = vec!["--json"];
        a.extend_from_slice(args);
        let (code, out, err) = self.run(&a);
        assert_eq!(code, 0, "{args:?}: {err}");
        serde_json::from_str(out.trim())
            .unwrap_or_else(|e| panic!("{args:?}: not JSON ({e}): {out}"))
    }
}

#[test]
fn client_commands_end_to_end() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), &[]);
    let admin = Cli {
        s: &s,
        token: ADMIN.into(),
        workspace: Some("acme"),
    };
    let author_token = admin.json(&["token", "create", "--role", "admin"])["token"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(author_token.starts_with("sbx_"));
    let cli = Cli {
        s: &s,
        token: author_token,
        workspace: Some("acme"),
    };

    let work = tempfile::tempdir().unwrap();
    let pkg = work.path().join("demo");
    std::fs::create_dir_all(pkg.join("scripts")).unwrap();
    std::fs::write(pkg.join("SKILL.md"), skill_md("demo", "first")).unwrap();
    std::fs::write(pkg.join("scripts/a.txt"), "line one\nline two\n").unwrap();
    std::fs::write(pkg.join("gone.txt"), "bye").unwrap();

    let p1 = cli.json(&["publish", pkg.to_str().unwrap()]);
    assert_eq!(
        (p1["name"].as_str(), p1["revision"].as_i64()),
        (Some("demo"), Some(1))
    );
    std::fs::write(pkg.join("scripts/a.txt"), "line one\nline 2\n").unwrap();
    std::fs::remove_file(pkg.join("gone.txt")).unwrap();
    std::fs::write(pkg.join("new.txt"), "hi").unwrap();
    let p2 = cli.json(&["publish", pkg.to_str().unwrap()]);
    assert_eq!(p2["revision"], 2);
    // the same publish again is a replay of r2; different content on a stale base is refused
    // with exit 1 and the code on stderr
    assert_eq!(
        cli.json(&["publish", pkg.to_str().unwrap(), "--base", "1"])["revision"],
        2
    );
    std::fs::write(pkg.join("later.txt"), "x").unwrap();
    let (code, _, err) = cli.run(&["publish", pkg.to_str().unwrap(), "--base", "1"]);
    assert_eq!(code, 1);
    assert!(err.contains("revision_conflict"), "{err}");
    std::fs::remove_file(pkg.join("later.txt")).unwrap();
    // an invalid package never reaches the server: exit 2 with the problems
    let bad = work.path().join("bad");
    std::fs::create_dir_all(&bad).unwrap();
    std::fs::write(bad.join("SKILL.md"), "---\nname: Bad\n---\n").unwrap();
    let (code, _, err) = cli.run(&["publish", bad.to_str().unwrap()]);
    assert_ne!(code, 0);
    assert!(err.contains("description"), "{err}");

    let skills = cli.json(&["skills"]);
    assert_eq!(skills["skills"][0]["current_revision"], 2);
    assert_eq!(cli.json(&["show", "demo"])["frontmatter"]["name"], "demo");
    assert_eq!(
        cli.json(&["revisions", "demo"])["revisions"]
            .as_array()
            .unwrap()
            .len(),
        2
    );
    let (code, out, _) = cli.run(&["cat", "demo@1", "scripts/a.txt"]);
    assert_eq!((code, out.as_str()), (0, "line one\nline two\n"));
    let (_, out, _) = cli.run(&["cat", "demo", "scripts/a.txt"]);
    assert_eq!(out, "line one\nline 2\n");

    let d = cli.json(&["diff", "demo@1", "demo@2"]);
    assert_eq!(d["added"], serde_json::json!(["new.txt"]));
    assert_eq!(d["removed"], serde_json::json!(["gone.txt"]));
    assert_eq!(d["modified"], serde_json::json!(["scripts/a.txt"]));
    let (_, human, _) = cli.run(&["diff", "demo@1", "demo@2"]);
    assert!(human.contains("1 added, 1 removed, 1 modified"), "{human}");
    assert!(human.contains("-line two\n+line 2"), "{human}");

    let target = work.path().join("pulled");
    let pulled = cli.json(&["pull", "demo@1", target.to_str().unwrap()]);
    assert_eq!(pulled["verified"], true);
    assert_eq!(
        std::fs::read_to_string(target.join("gone.txt")).unwrap(),
        "bye"
    );
    let (code, _, err) = cli.run(&["pull", "demo@1", target.to_str().unwrap()]);
    assert_eq!(
        code, 2,
        "pull into an existing directory must refuse: {err}"
    );

    cli.json(&["rollback", "demo", "1"]);
    assert_eq!(cli.json(&["show", "demo"])["current_revision"], 1);

    // drafts
    let draft = cli.json(&["draft", "create", "demo", "--base", "1"]);
    let id = draft["draft_id"].as_str().unwrap().to_string();
    let file = work.path().join("x.txt");
    std::fs::write(&file, "draft text").unwrap();
    cli.json(&["draft", "put", &id, "notes/x.txt", file.to_str().unwrap()]);
    let (_, out, _) = cli.run(&["draft", "get", &id, "notes/x.txt"]);
    assert_eq!(out, "draft text");
    cli.json(&["draft", "rm", &id, "gone.txt"]);
    let shown = cli.json(&["draft", "show", &id]);
    assert_eq!(shown["files"].as_array().unwrap().len(), 3);
    let pd = cli.json(&["draft", "publish", &id]);
    assert_eq!(pd["revision"], 3);

    // runs
    let run = cli.json(&["run", "create"])["run_id"]
        .as_str()
        .unwrap()
        .to_string();
    let act = cli.json(&["run", "activate", &run, "demo"]);
    assert_eq!(act["revision"], 3);
    let (_, out, _) = cli.run(&["run", "read", &run, "demo", "notes/x.txt"]);
    assert_eq!(out, "draft text");
    let prompt = cli.json(&["run", "prompt", &run]);
    assert!(
        prompt["prompt"]
            .as_str()
            .unwrap()
            .contains("<name>demo</name>")
    );
    assert_eq!(cli.json(&["run", "heartbeat", &run])["state"], "active");
    assert_eq!(
        cli.json(&["run", "show", &run])["activations"][0]["revision"],
        3
    );
    let (code, _, err) = cli.run(&["run", "exec", &run, "--", "true"]);
    assert_eq!(code, 1);
    assert!(err.contains("box_unavailable"), "{err}");
    assert_eq!(cli.json(&["run", "finish", &run])["state"], "finished");

    // events, revoke, gc, fsck, delete
    let (code, out, _) = cli.run(&["events", "--json"]);
    assert_eq!(code, 0);
    let kinds: Vec<String> = out
        .lines()
        .map(|l| {
            serde_json::from_str::<Value>(l).unwrap()["kind"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(
        kinds,
        [
            "skill.published",
            "skill.published",
            "skill.current_moved",
            "skill.published"
        ]
    );
    let rv = cli.json(&["revoke", "demo@2", "--reason", "test"]);
    assert_eq!(rv["state"], "revoked");
    let g = admin.json(&["gc", "--dry-run", "--grace", "0"]);
    assert_eq!(g["dry_run"], true);
    let g = admin.json(&["gc", "--grace", "0"]);
    assert_eq!(g["revisions"].as_array().unwrap().len(), 1, "{g}");
    assert_eq!(admin.json(&["fsck"])["ok"], true);
    let (code, _, err) = cli.run(&["fsck"]);
    assert_eq!(code, 1, "fsck needs the admin token: {err}");
    cli.json(&["delete", "demo"]);
    assert_eq!(cli.json(&["skills"])["skills"].as_array().unwrap().len(), 0);

    // wrong token, unreachable server
    let nobody = Cli {
        s: &s,
        token: "sbx_nope".into(),
        workspace: Some("acme"),
    };
    let (code, _, err) = nobody.run(&["skills"]);
    assert_eq!(code, 1);
    assert!(err.contains("unauthorized"), "{err}");
    let out = Command::new(bin())
        .args(["skills", "--url", "http://127.0.0.1:1"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot reach the server"));
}

/// SPEC §6: refusals exit 1 whether the package is found invalid here or by the server; with
/// `--json` every error is the `{"error": …}` object on stdout; `run exec` exits with the
/// command's own status and prints its output byte-exact.
#[test]
fn cli_errors_and_exec_status() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), &["--box", "bwrap"]);
    let cli = Cli {
        s: &s,
        token: ADMIN.into(),
        workspace: Some("acme"),
    };
    let work = tempfile::tempdir().unwrap();
    let error_of = |out: &str| -> Value {
        serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("not JSON ({e}): {out:?}"))
    };

    // Invalid locally: exit 1, the same as the server's refusal of the same package.
    let bad = work.path().join("bad");
    std::fs::create_dir_all(&bad).unwrap();
    std::fs::write(bad.join("SKILL.md"), "no frontmatter\n").unwrap();
    let (code, out, err) = cli.run(&["publish", bad.to_str().unwrap()]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(err.contains("invalid_package"), "{err}");
    let (code, out, _) = cli.run(&["--json", "publish", bad.to_str().unwrap()]);
    assert_eq!(code, 1);
    assert_eq!(error_of(&out)["error"]["code"], "invalid_package", "{out}");
    assert!(
        error_of(&out)["error"]["problems"]
            .as_array()
            .is_some_and(|p| !p.is_empty())
    );

    // Refused by the server: exit 1, its error object on stdout.
    let good = work.path().join("demo");
    std::fs::create_dir_all(&good).unwrap();
    std::fs::write(good.join("SKILL.md"), skill_md("demo", "d")).unwrap();
    let (code, out, _) = cli.run(&["--json", "publish", good.to_str().unwrap(), "--base", "7"]);
    assert_eq!(code, 1, "{out}");
    assert_eq!(
        error_of(&out)["error"]["code"],
        "revision_conflict",
        "{out}"
    );
    let (code, out, _) = cli.run(&[
        "--json",
        "pull",
        "nothing@1",
        work.path().join("o").to_str().unwrap(),
    ]);
    assert_eq!(code, 1, "{out}");
    assert_eq!(error_of(&out)["error"]["code"], "not_found", "{out}");

    // Usage and connection errors: exit 2, still an error object with --json.
    let (code, out, _) = cli.run(&["validate", "--json", "/no/such/package"]);
    assert_eq!(code, 2, "{out}");
    assert!(
        error_of(&out)["error"]["message"]
            .as_str()
            .unwrap()
            .contains("/no/such/package")
    );
    let out = Command::new(bin())
        .args([
            "--json",
            "--url",
            "http://127.0.0.1:1",
            "--token",
            "x",
            "skills",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        error_of(&String::from_utf8_lossy(&out.stdout))["error"]["code"],
        "connection_failed"
    );

    // run exec: the command's status and bytes.
    let (code, _, err) = cli.run(&["publish", good.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    let (_, run, _) = cli.run(&["run", "create"]);
    let run = run.trim();
    let (code, out, err) = cli.run(&[
        "run",
        "exec",
        run,
        "--",
        "sh",
        "-c",
        "printf abc; printf err >&2; exit 3",
    ]);
    assert_eq!((code, out.as_str(), err.as_str()), (3, "abc", "err"));
    let (code, _, _) = cli.run(&[
        "run",
        "exec",
        run,
        "--timeout-ms",
        "300",
        "--",
        "sleep",
        "10",
    ]);
    assert_eq!(code, 124, "a timeout exits 124");
    let (code, _, _) = cli.run(&["run", "exec", run, "--", "sh", "-c", "kill -9 $$"]);
    assert_eq!(code, 128 + 9, "a signal N exits 128+N");
}

/// Without `--workspace`, a workspace token's commands go to its own workspace (the server
/// says which); the admin token, of no workspace, stays in `default`.
#[test]
fn a_workspace_token_needs_no_workspace_named() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), &[]);
    let admin = Cli {
        s: &s,
        token: ADMIN.into(),
        workspace: Some("acme"),
    };
    let token = admin.json(&["token", "create", "--role", "author"])["token"]
        .as_str()
        .unwrap()
        .to_string();
    let unnamed = |token: String| Cli {
        s: &s,
        token,
        workspace: None,
    };
    let work = tempfile::tempdir().unwrap();
    let pkg = work.path().join("demo");
    std::fs::create_dir_all(&pkg).unwrap();
    std::fs::write(pkg.join("SKILL.md"), skill_md("demo", "first")).unwrap();
    let author = unnamed(token);
    author.json(&["publish", pkg.to_str().unwrap()]);
    let names = |listed: &Value| -> Vec<String> {
        let skills = listed["skills"].as_array().unwrap();
        skills
            .iter()
            .filter_map(|s| s["name"].as_str().map(String::from))
            .collect()
    };
    // In acme, the token's workspace: the admin finds it there by name.
    let listed = admin.json(&["skills"]);
    assert_eq!(names(&listed), ["demo"], "{listed}");
    let mine = author.json(&["skills"]);
    assert_eq!(names(&mine), ["demo"], "{mine}");
    // The admin token names no workspace: `default`, which has nothing.
    let (code, default, _) = unnamed(ADMIN.into()).run(&["--json", "skills"]);
    assert!(!default.contains("\"demo\""), "{code} {default}");
}
