//! Executions on the real bubblewrap, in process (no server): exit codes, stdin and
//! environment, timeouts, output caps, read-only packages, the workspace, no network.
//! Needs root and `bwrap` (as `scripts/test` provides).

use skillbox_box::bwrap::Bwrap;
use skillbox_box::deps::{DepEnvs, DepsConfig};
use skillbox_box::{BoxRuntime, ExecRequest, ExecResult, Mount, Outcome, Program, Sandbox};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

struct Box {
    runtime: BoxRuntime,
    sandbox: Sandbox,
    _dir: tempfile::TempDir,
}

/// A box with one package (`run.sh` printing its argument, `data.txt`) at `/skills/demo/1`
/// and a workspace without a quota (no loop mount in these tests).
fn new_box() -> Box {
    let dir = tempfile::tempdir().unwrap();
    // The sandbox user must reach the package and the workspace.
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let pkg = dir.path().join("pkg");
    std::fs::create_dir_all(&pkg).unwrap();
    std::fs::write(
        pkg.join("SKILL.md"),
        "---\nname: demo\ndescription: d\n---\n",
    )
    .unwrap();
    std::fs::write(pkg.join("run.sh"), "#!/bin/sh\necho \"ran $1\"\n").unwrap();
    std::fs::write(pkg.join("data.txt"), "data\n").unwrap();
    let mode = |p: &Path, m| {
        std::fs::set_permissions(p, std::os::unix::fs::PermissionsExt::from_mode(m)).unwrap()
    };
    mode(&pkg.join("run.sh"), 0o755);
    mode(&pkg, 0o755);
    let intake =
        skillbox_package::intake::scan_dir_raw(&pkg, &skillbox_package::Limits::default()).unwrap();
    let manifest = Arc::new(skillbox_package::Manifest::new(intake.files).unwrap());
    let mut bwrap = Bwrap::new(65534);
    bwrap.limits.workspace_bytes = 0;
    let deps = DepEnvs::new(dir.path().join("envs"), DepsConfig::default()).unwrap();
    let sandbox = Sandbox {
        id: "run_test".into(),
        workspace_dir: Some(dir.path().join("workspace")),
        mounts: vec![Mount {
            target: "/skills/demo/1".into(),
            source: pkg,
            digest: manifest.digest(),
            manifest,
        }],
        binds: vec![],
        environment_of: None,
        network: false,
    };
    Box {
        runtime: BoxRuntime::new(Arc::new(bwrap), Arc::new(deps)),
        sandbox,
        _dir: dir,
    }
}

fn shell(script: &str) -> ExecRequest {
    ExecRequest {
        cwd: "/skills/demo/1".into(),
        timeout: Duration::from_secs(30),
        ..ExecRequest::shell(script, BTreeMap::new())
    }
}

async fn run(b: &Box, req: ExecRequest) -> ExecResult {
    b.runtime.exec(&b.sandbox, req).await.unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[tokio::test]
async fn argv_stdin_env_and_exit_codes_come_through() {
    let b = new_box();
    let r = run(
        &b,
        ExecRequest {
            program: Program::Argv(vec!["./run.sh".into(), "x y".into()]),
            ..shell("")
        },
    )
    .await;
    assert_eq!(
        (r.outcome, r.exit_code, text(&r.stdout)),
        (Outcome::Exited, Some(0), "ran x y\n".into())
    );

    let mut req = shell("read line; echo \"$line $GREETING\"; exit 7");
    req.stdin = Some(b"hello\n".to_vec());
    req.env.insert("GREETING".into(), "world".into());
    let r = run(&b, req).await;
    assert_eq!(
        (r.exit_code, text(&r.stdout)),
        (Some(7), "hello world\n".into())
    );
    assert_eq!(r.failure(), "exit code 7: hello world");
}

#[tokio::test]
async fn a_timeout_kills_the_whole_process_group() {
    let b = new_box();
    let mut req = shell("sleep 30 & sleep 30; echo never");
    req.timeout = Duration::from_millis(500);
    let r = run(&b, req).await;
    assert_eq!(r.outcome, Outcome::TimedOut);
    assert!(r.timed_out);
    assert!(!text(&r.stdout).contains("never"));
    assert!(r.duration_ms < 20_000, "{r:?}");
}

#[tokio::test]
async fn output_past_the_cap_is_dropped_and_said() {
    let b = new_box();
    let mut req = shell("head -c 100000 /dev/zero | tr '\\0' a; echo done >&2");
    req.output_cap = 1000;
    let r = run(&b, req).await;
    assert_eq!(r.exit_code, Some(0));
    assert_eq!(r.stdout.len(), 1000);
    assert!(r.stdout_truncated && !r.stderr_truncated);
    assert_eq!(text(&r.stderr), "done\n");
}

#[tokio::test]
async fn packages_are_read_only_the_workspace_is_not_and_there_is_no_network() {
    let b = new_box();
    let r = run(
        &b,
        shell(
            "echo x >> data.txt 2>/dev/null && echo wrote-package; \
             echo kept > /workspace/note && cat /workspace/note; \
             id -u; \
             awk -F: 'NR > 2 { gsub(/ /, \"\", $1); print \"if:\" $1 }' /proc/net/dev",
        ),
    )
    .await;
    let out = text(&r.stdout);
    assert!(!out.contains("wrote-package"), "{out}");
    assert!(out.contains("kept\n"), "{out}");
    // The box's own uid (no per-sandbox pool here), not root.
    assert!(out.contains("\n65534\n"), "{out}");
    // A network namespace of its own: loopback only.
    let interfaces: Vec<&str> = out.lines().filter(|l| l.starts_with("if:")).collect();
    assert_eq!(interfaces, ["if:lo"], "{out}");
    // The workspace outlives the execution; the package is unchanged.
    let r = run(&b, shell("cat /workspace/note data.txt")).await;
    assert_eq!(text(&r.stdout), "kept\ndata\n");
}
