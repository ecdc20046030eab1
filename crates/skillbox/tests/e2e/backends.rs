//! The sandbox backends the end-to-end scenarios run under, and the scenarios every backend
//! must pass, each written once: `backend_test!(scenario)` (in `main.rs`) makes
//! `scenario::bwrap`, `scenario::docker` and `scenario::remote` (Core with `--box remote` and a
//! bwrap `skillbox node`). What a scenario needs to see of a backend's insides (its prepared
//! copies, its containers, its workspaces) is asked of [`Backend`], not written per backend in
//! the scenario.

use crate::support::*;
use serde_json::json;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::time::Duration;

/// A sandbox backend as a test starts the server with it.
pub enum Backend {
    Bwrap,
    /// The Docker engine, with a unique owner label per test.
    Docker(Owner),
    /// Core (`serve --box remote`) and one bwrap execution node of its own.
    Remote(RemoteNode),
}

/// The execution node behind a `Backend::Remote` Core: started with Core's first start (with
/// the scenario's sandbox arguments), in a directory of its own; kept across Core restarts.
pub struct RemoteNode {
    node: Mutex<Option<Node>>,
    /// Nodes killed by a restart, kept (mounts and all, as `kill -9` leaves them) until the end.
    killed: Mutex<Vec<Node>>,
    args: Mutex<Vec<String>>,
    token: Mutex<String>,
    /// Declared last: removed after the nodes stopped.
    dir: tempfile::TempDir,
}

impl RemoteNode {
    pub fn new() -> RemoteNode {
        RemoteNode {
            node: Mutex::new(None),
            killed: Mutex::new(Vec::new()),
            args: Mutex::new(Vec::new()),
            token: Mutex::new(String::new()),
            dir: tempfile::tempdir().unwrap(),
        }
    }

    fn data_dir(&self) -> PathBuf {
        self.dir.path().join("node")
    }

    /// Starts the node for `core` unless it runs; `extra` are the scenario's sandbox arguments.
    fn ensure_started(&self, core: &Server, extra: &[&str]) {
        let mut node = self.node.lock().unwrap();
        if node.is_some() {
            return;
        }
        let mut token = self.token.lock().unwrap();
        if token.is_empty() {
            *token = node_token_by_cli(&core.url)["token"]
                .as_str()
                .unwrap()
                .to_string();
        }
        let mut args = self.args.lock().unwrap();
        if args.is_empty() {
            // A node always copies and verifies: the flag is Core's business only.
            *args = ["--box", "bwrap"]
                .into_iter()
                .chain(extra.iter().copied().filter(|a| *a != "--box-copy-mode"))
                .map(str::to_string)
                .collect();
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        *node = Some(Node::start_for(&core.url, &token, &self.data_dir(), &args));
    }

    /// `kill -9` of the node.
    fn kill9(&self) {
        if let Some(mut node) = self.node.lock().unwrap().take() {
            node.kill9();
            self.killed.lock().unwrap().push(node);
        }
    }
}

impl Backend {
    /// What exec answers name as their `backend`.
    pub fn name(&self) -> &'static str {
        match self {
            Backend::Bwrap => "bwrap",
            Backend::Docker(_) => "docker",
            Backend::Remote(_) => "remote",
        }
    }

    pub fn start_on(&self, dir: &Path, port: u16, extra: &[&str]) -> Server {
        let mut args: Vec<String> = match self {
            Backend::Bwrap => vec!["--box".into(), "bwrap".into()],
            Backend::Docker(owner) => owner.args(),
            Backend::Remote(_) => vec!["--box".into(), "remote".into()],
        };
        if !matches!(self, Backend::Remote(_)) {
            args.extend(extra.iter().map(|a| a.to_string()));
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let s = Server::start_on(dir, port, &args);
        if let Backend::Remote(node) = self {
            node.ensure_started(&s, extra);
        }
        s
    }

    pub fn start(&self, dir: &Path, extra: &[&str]) -> Server {
        self.start_on(dir, free_port(), extra)
    }

    /// `kill -9` of whatever holds the sandboxes (the server; Core and its node for remote),
    /// then a start again on the same directories and port.
    pub fn restart(&self, s: &mut Server, dir: &Path, extra: &[&str]) -> Server {
        s.kill9();
        if let Backend::Remote(node) = self {
            node.kill9();
        }
        self.start_on(dir, s.port, extra)
    }

    /// The data directory whose `box/` holds the sandboxes: the server's, or the node's.
    pub fn sandbox_root(&self, dir: &Path) -> PathBuf {
        match self {
            Backend::Bwrap | Backend::Docker(_) => dir.to_path_buf(),
            Backend::Remote(node) => node.data_dir(),
        }
    }

    /// The run's workspace as the host sees it (bwrap and remote: a directory).
    pub fn workspace(&self, dir: &Path, run: &str) -> PathBuf {
        self.sandbox_root(dir).join(format!("box/workspaces/{run}"))
    }

    /// The box's copy-mode failpoint (armed by writing a fault's name into it).
    pub fn copy_failpoint(&self, dir: &Path) -> PathBuf {
        self.sandbox_root(dir).join("box/prepared/FAILPOINT")
    }

    /// Where the run's sandbox runs: its containers (docker); nothing for bwrap, which makes a
    /// fresh sandbox per execution.
    pub fn sandbox_handles(&self, run: &str) -> Vec<String> {
        match self {
            Backend::Bwrap | Backend::Remote(_) => vec![],
            Backend::Docker(owner) => owner.containers(&[format!("skillbox.sandbox={run}")]),
        }
    }

    /// A shell command run as root where the run's prepared copies (copy mode) are: on the
    /// host for bwrap, in the run's container for docker; its stdout.
    fn in_prepared(&self, dir: &Path, run: &str, script: &str) -> String {
        let out = match self {
            Backend::Bwrap | Backend::Remote(_) => Command::new("sh")
                .arg("-c")
                .arg(script)
                .env(
                    "P",
                    self.sandbox_root(dir).join(format!("box/prepared/{run}")),
                )
                .output()
                .unwrap(),
            Backend::Docker(_) => {
                let container = self.sandbox_handles(run);
                assert_eq!(container.len(), 1, "the run's container: {container:?}");
                Command::new("docker")
                    .args(["exec", "-u", "0", "-e", "P=/skills", &container[0]])
                    .args(["sh", "-c", script])
                    .output()
                    .unwrap()
            }
        };
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Interrupted preparations of the run left in its staging area.
    pub fn staging_left(&self, dir: &Path, run: &str) -> usize {
        let script = match self {
            Backend::Bwrap | Backend::Remote(_) => r#"ls -A "$P" | grep -c '^\.staging-' || true"#,
            Backend::Docker(_) => r#"ls -A "$P/.staging" 2>/dev/null | wc -l"#,
        };
        self.in_prepared(dir, run, script).trim().parse().unwrap()
    }

    /// Prepared copies of the run's packages (verified, in place).
    pub fn prepared_copies(&self, dir: &Path, run: &str) -> usize {
        let script = match self {
            Backend::Bwrap | Backend::Remote(_) => r#"ls "$P" | wc -l"#,
            Backend::Docker(_) => r#"ls -d "$P"/*/* 2>/dev/null | wc -l"#,
        };
        self.in_prepared(dir, run, script).trim().parse().unwrap()
    }

    /// Appends to the prepared copy of `scripts/run.sh`, as an attacker with the disk would.
    pub fn tamper_with_prepared_script(&self, dir: &Path, run: &str) {
        let script = match self {
            Backend::Bwrap | Backend::Remote(_) => {
                r#"f=$(ls -d "$P"/*/pkg)/scripts/run.sh; chmod u+w $(dirname $f) $f; echo 'echo TAMPERED' >> $f && echo done"#
            }
            Backend::Docker(_) => {
                r#"f=$(ls -d "$P"/*/1)/scripts/run.sh; chmod u+w $f; echo 'echo TAMPERED' >> $f && echo done"#
            }
        };
        assert_eq!(self.in_prepared(dir, run, script).trim(), "done");
    }

    /// After the run finished: its workspace (and, for docker, every container and volume
    /// of this test) is gone, and nothing of it stays mounted.
    pub async fn assert_run_released(&self, dir: &Path, run: &str) {
        let root = std::fs::canonicalize(self.sandbox_root(dir)).unwrap();
        let image = root.join(format!("box/workspaces/{run}.ext4"));
        let mounted = || {
            std::fs::read_to_string("/proc/self/mountinfo")
                .unwrap()
                .lines()
                .any(|l| {
                    l.split(' ')
                        .nth(4)
                        .is_some_and(|m| Path::new(m).starts_with(&root))
                })
        };
        assert!(
            holds_within(Duration::from_secs(30), || async {
                !mounted() && !image.exists()
            })
            .await,
            "the workspace of a finished run is still mounted or stored"
        );
        if let Backend::Docker(owner) = self {
            owner.assert_clean();
        }
    }
}

pub fn image() -> String {
    std::env::var("SKILLBOX_TEST_IMAGE")
        .unwrap_or_else(|_| "skillbox-test/debian-py3:bookworm-1".into())
}

/// A unique owner label per test, and removal of whatever it left (after the test's own
/// assertions about cleanup).
pub struct Owner(pub String);

impl Owner {
    pub fn new(test: &str) -> Owner {
        Owner(format!("skillbox-test-{test}-{}", std::process::id()))
    }

    pub fn args(&self) -> Vec<String> {
        vec![
            "--box".into(),
            "docker".into(),
            "--docker-image".into(),
            image(),
            "--docker-owner".into(),
            self.0.clone(),
        ]
    }

    /// Container ids of this owner (`filter` adds label filters), running or not.
    pub fn containers(&self, filter: &[String]) -> Vec<String> {
        let mut cmd = Command::new("docker");
        cmd.args(["ps", "-aq", "--no-trunc", "--filter"])
            .arg(format!("label=skillbox.owner={}", self.0));
        for f in filter {
            cmd.arg("--filter").arg(format!("label={f}"));
        }
        let out = cmd.output().expect("docker ps");
        String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .map(str::to_string)
            .collect()
    }

    pub fn volumes(&self) -> Vec<String> {
        let out = Command::new("docker")
            .args(["volume", "ls", "-q", "--filter"])
            .arg(format!("label=skillbox.owner={}", self.0))
            .output()
            .expect("docker volume ls");
        String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .map(str::to_string)
            .collect()
    }
}

impl Owner {
    /// Cleanup: nothing of this owner is left in the engine.
    pub fn assert_clean(&self) {
        assert!(
            self.containers(&[]).is_empty(),
            "containers left: {:?}",
            self.containers(&[])
        );
        assert!(
            self.volumes().is_empty(),
            "volumes left: {:?}",
            self.volumes()
        );
    }
}

impl Drop for Owner {
    fn drop(&mut self) {
        for c in self.containers(&[]) {
            let _ = Command::new("docker").args(["rm", "-f", &c]).output();
        }
        for v in self.volumes() {
            let _ = Command::new("docker")
                .args(["volume", "rm", "-f", &v])
                .output();
        }
    }
}

async fn finish(c: &reqwest::Client, s: &Server, run: &str) {
    let r = c
        .delete(s.ws("acme", &format!("runs/{run}")))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
}

/// `?stream=true`: NDJSON lines as output arrives, then the exit line.
async fn streamed_exec_delivers_output_as_it_comes(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let s = backend.start(dir.path(), &[]);
    let c = http();
    publish(
        &c,
        &s,
        ADMIN,
        "acme",
        "hello",
        0,
        versioned("hello", "v1", &[]),
    )
    .await;
    assert_streamed_exec(&c, &s).await;
}
backend_test!(streamed_exec_delivers_output_as_it_comes);

/// A write past `/tmp`'s size or the workspace quota fails with ENOSPC and the server keeps
/// serving; the run's end releases its workspace (image, mount, volume).
async fn tmp_and_workspace_are_capped(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let (s, c, run) = hello_run_on(backend.start(dir.path(), &SMALL_SANDBOX)).await;
    assert_tmp_and_workspace_capped(&c, &s, &run).await;
    let (st, _) = get(&c, &format!("{}/healthz", s.url), ADMIN).await;
    assert_eq!(st, 200);
    finish(&c, &s, &run).await;
    backend.assert_run_released(dir.path(), &run).await;
}
backend_test!(tmp_and_workspace_are_capped);

/// SPEC §8.2 in copy mode: a truncated, corrupted, incomplete, padded or interrupted transfer
/// never executes; the next attempt prepares a complete, verified package; an interrupted one
/// is left for the sweep, never used, and a restart sweeps it. A prepared copy tampered with
/// is detected and prepared afresh (§8.3, box part); revocation removes the copies.
async fn copy_mode_never_executes_a_bad_transfer(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let mut s = backend.start(dir.path(), &["--box-copy-mode"]);
    let c = http();
    publish(
        &c,
        &s,
        ADMIN,
        "acme",
        "hello",
        0,
        versioned("hello", "v1", &[("data.bin", &[7u8; 4096])]),
    )
    .await;
    let failpoint = backend.copy_failpoint(dir.path());
    let body = json!({"skill": "hello", "command": "touch /workspace/ran; ./scripts/run.sh"});
    for fault in ["truncate", "flip", "missing", "extra", "crash"] {
        let run = new_run(&c, &s, &["hello"]).await;
        std::fs::write(&failpoint, fault).unwrap();
        let (st, v) = exec(&c, &s, &run, body.clone()).await;
        assert_eq!(
            (st, error_code(&v)),
            (503, "box_unavailable"),
            "{fault}: {v}"
        );
        assert!(!failpoint.exists(), "{fault}: failpoint not consumed");
        let v = sh(
            &c,
            &s,
            &run,
            None,
            "test -e /workspace/ran && echo ran || echo never",
        )
        .await;
        assert_eq!(v["stdout"], "never\n", "{fault}: the bad transfer executed");
        let (st, v) = exec(&c, &s, &run, body.clone()).await;
        assert_eq!(
            (st, v["stdout"].as_str()),
            (200, Some("I am v1\n")),
            "{fault}: {v}"
        );
        if fault == "crash" {
            assert_eq!(
                backend.staging_left(dir.path(), &run),
                1,
                "the interrupted staging is left for the sweep, never used"
            );
        }
        finish(&c, &s, &run).await;
    }

    // An interrupted preparation is left for the sweep, never used; packages are read-only
    // to the sandbox user.
    let run = new_run(&c, &s, &["hello"]).await;
    std::fs::write(&failpoint, "crash").unwrap();
    let (st, v) = exec(&c, &s, &run, body.clone()).await;
    assert_eq!((st, error_code(&v)), (503, "box_unavailable"), "{v}");
    let v = sh(&c, &s, &run, Some("hello"), "echo x >> scripts/run.sh 2>/dev/null && echo wrote; rm -f data.bin 2>/dev/null && echo removed; ./scripts/run.sh").await;
    assert_eq!(v["stdout"], "I am v1\n", "{v}");
    assert_eq!(backend.staging_left(dir.path(), &run), 1);

    // Restart: the sandbox is kept, abandoned staging swept; then tamper with the prepared
    // copy: detected and prepared afresh, never executed as is.
    let handles = backend.sandbox_handles(&run);
    let s = backend.restart(&mut s, dir.path(), &["--box-copy-mode"]);
    assert_eq!(
        backend.staging_left(dir.path(), &run),
        0,
        "abandoned staging survived a restart"
    );
    assert_eq!(
        backend.sandbox_handles(&run),
        handles,
        "adopted, not replaced"
    );
    backend.tamper_with_prepared_script(dir.path(), &run);
    let v = sh(&c, &s, &run, Some("hello"), "./scripts/run.sh").await;
    assert_eq!(
        v["stdout"], "I am v1\n",
        "a tampered copy was executed: {v}"
    );

    // Revocation removes the prepared copy.
    assert_eq!(backend.prepared_copies(dir.path(), &run), 1);
    revoke(&c, &s, "hello", 1, "bad").await;
    assert!(
        holds_within(Duration::from_secs(10), || async {
            backend.prepared_copies(dir.path(), &run) == 0
        })
        .await,
        "the revoked revision's copy was not removed"
    );
    finish(&c, &s, &run).await;
    backend.assert_run_released(dir.path(), &run).await;
}
backend_test!(copy_mode_never_executes_a_bad_transfer);
