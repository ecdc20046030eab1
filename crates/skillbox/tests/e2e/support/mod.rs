//! Test support: real `skillbox serve` processes on temporary data directories, and package
//! builders.
#![allow(dead_code)]

mod node;
pub use node::{Node, node_token_by_cli};

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub const ADMIN: &str = "test-admin-token-0123456789";

pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_skillbox")
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A running `skillbox serve`.
pub struct Server {
    pub child: Child,
    pub url: String,
    pub data_dir: PathBuf,
    pub port: u16,
}

impl Server {
    pub fn start(data_dir: &Path, extra: &[&str]) -> Server {
        let port = free_port();
        Self::start_on(data_dir, port, extra)
    }

    pub fn start_on(data_dir: &Path, port: u16, extra: &[&str]) -> Server {
        Self::start_with_env(data_dir, port, extra, &[])
    }

    /// Like [`Server::start_on`], with these environment variables set for the server.
    pub fn start_with_env(
        data_dir: &Path,
        port: u16,
        extra: &[&str],
        envs: &[(&str, &str)],
    ) -> Server {
        let default_box: &[&str] = if extra.contains(&"--box") {
            &[]
        } else {
            &["--box", "none"]
        };
        let child = Command::new(bin())
            .args([
                "serve",
                "--listen",
                &format!("127.0.0.1:{port}"),
                "--data-dir",
            ])
            .arg(data_dir)
            .args(extra)
            .args(default_box)
            .env("SKILLBOX_ADMIN_TOKEN", ADMIN)
            .env("SKILLBOX_LOG", "warn")
            .envs(envs.iter().copied())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn skillbox serve");
        let mut s = Server {
            child,
            url: format!("http://127.0.0.1:{port}"),
            data_dir: data_dir.to_path_buf(),
            port,
        };
        s.wait_ready();
        s
    }

    fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("skillbox serve exited before it was ready: {status}");
            }
            if healthy(self.port) {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("server on port {} did not become ready", self.port);
    }

    pub fn kill9(&mut self) {
        let _ = self.child.kill(); // SIGKILL
        let _ = self.child.wait();
    }

    /// Sends SIGTERM; the exit status, or `None` when the server has not exited within a
    /// minute.
    pub async fn terminate(&mut self) -> Option<std::process::ExitStatus> {
        let term = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(term.success());
        for _ in 0..600 {
            if let Some(status) = self.child.try_wait().unwrap() {
                return Some(status);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        None
    }

    pub fn ws(&self, ws: &str, rest: &str) -> String {
        format!("{}/v1/workspaces/{ws}/{rest}", self.url)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill9();
        release_workspace_mounts(&self.data_dir);
    }
}

/// Whether `GET /healthz` on the loopback `port` answers 200 (without an async runtime).
pub fn healthy(port: u16) -> bool {
    use std::io::{Read, Write};
    let Ok(mut stream) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
    let _ = stream.write_all(b"GET /healthz HTTP/1.0\r\n\r\n");
    let mut buf = String::new();
    let _ = stream.read_to_string(&mut buf);
    buf.starts_with("HTTP/1.0 200") || buf.starts_with("HTTP/1.1 200")
}

/// Unmounts the quota'd workspaces a killed server left under `data_dir` and detaches their
/// loop devices, so the test's temporary directory can be removed (a server that ends runs
/// does this itself; a `kill -9` leaves them).
pub fn release_workspace_mounts(data_dir: &Path) {
    let Ok(root) = std::fs::canonicalize(data_dir) else {
        return;
    };
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    for line in mountinfo.lines() {
        if let Some(point) = line.split(' ').nth(4)
            && Path::new(point).starts_with(&root)
        {
            let _ = Command::new("umount").args(["--lazy", point]).status();
        }
    }
    let images = std::fs::read_dir(root.join("box/workspaces"))
        .map(|rd| rd.flatten().map(|e| e.path()).collect::<Vec<_>>())
        .unwrap_or_default();
    for image in images
        .iter()
        .filter(|p| p.extension().is_some_and(|e| e == "ext4"))
    {
        let out = Command::new("losetup")
            .arg("--associated")
            .arg(image)
            .output();
        for dev in out
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.split(':').next())
        {
            let _ = Command::new("losetup").args(["--detach", dev]).status();
        }
    }
}

pub fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap()
}

/// A tar of these files (mode 0755 for paths ending in .sh); paths up to 100 bytes.
pub fn tar_of(files: &[(&str, &[u8])]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for (path, content) in files {
        let mut h = tar::Header::new_gnu();
        h.set_size(content.len() as u64);
        h.set_mode(if path.ends_with(".sh") { 0o755 } else { 0o644 });
        h.set_entry_type(tar::EntryType::Regular);
        // Raw name bytes: the tar crate refuses to write hostile paths like `../x` itself.
        h.as_old_mut().name[..path.len()].copy_from_slice(path.as_bytes());
        h.set_cksum();
        b.append(&h, *content).unwrap();
    }
    b.into_inner().unwrap()
}

pub fn skill_md(name: &str, desc: &str) -> String {
    format!("---\nname: {name}\ndescription: {desc}\n---\n# {name}\nInstructions.\n")
}

/// A small valid package of `name` whose content depends on `variant`.
pub fn package(name: &str, variant: &str) -> Vec<u8> {
    let md = skill_md(name, &format!("variant {variant}"));
    tar_of(&[
        ("SKILL.md", md.as_bytes()),
        ("scripts/run.sh", format!("echo {variant}\n").as_bytes()),
    ])
}

pub async fn publish(
    c: &reqwest::Client,
    s: &Server,
    token: &str,
    ws: &str,
    name: &str,
    base: i64,
    body: Vec<u8>,
) -> (u16, Value) {
    let r = c
        .post(s.ws(ws, &format!("skills/{name}/revisions?base_revision={base}")))
        .bearer_auth(token)
        .header("content-type", "application/x-tar")
        .body(body)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

pub async fn get(c: &reqwest::Client, url: &str, token: &str) -> (u16, Value) {
    let r = c.get(url).bearer_auth(token).send().await.unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

pub async fn token(c: &reqwest::Client, s: &Server, ws: &str, role: &str) -> String {
    let r = c
        .post(format!("{}/v1/admin/tokens", s.url))
        .bearer_auth(ADMIN)
        .json(&serde_json::json!({"workspace": ws, "role": role}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 201);
    r.json::<Value>().await.unwrap()["token"]
        .as_str()
        .unwrap()
        .to_string()
}

/// A node token (of no workspace), minted by the admin.
pub async fn node_token(c: &reqwest::Client, s: &Server) -> String {
    let r = c
        .post(format!("{}/v1/admin/tokens", s.url))
        .bearer_auth(ADMIN)
        .json(&serde_json::json!({"role": "node"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 201);
    let v: Value = r.json().await.unwrap();
    assert!(v["workspace"].is_null(), "{v}");
    v["token"].as_str().unwrap().to_string()
}

pub fn error_code(v: &Value) -> &str {
    v["error"]["code"].as_str().unwrap_or("")
}

/// Downloads a revision's archive and returns the digest of what it contains.
pub async fn archive_digest(
    c: &reqwest::Client,
    s: &Server,
    ws: &str,
    skill: &str,
    rev: i64,
) -> (u16, String) {
    let r = c
        .get(s.ws(ws, &format!("skills/{skill}/revisions/{rev}/archive")))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    if status != 200 {
        return (status, String::new());
    }
    let tar = r.bytes().await.unwrap();
    let t = tempfile::tempdir().unwrap();
    let intake =
        skillbox_package::intake::extract_tar(&tar[..], false, t.path(), &Default::default())
            .unwrap();
    (
        status,
        skillbox_package::Manifest::new(intake.files)
            .unwrap()
            .digest()
            .to_string(),
    )
}

/// A run of workspace `acme` authorized for `skills`, each activated at its current revision.
pub async fn new_run(c: &reqwest::Client, s: &Server, skills: &[&str]) -> String {
    new_run_in(c, s, "acme", skills).await
}

/// [`new_run`] in workspace `ws`.
pub async fn new_run_in(c: &reqwest::Client, s: &Server, ws: &str, skills: &[&str]) -> String {
    let r = c
        .post(s.ws(ws, "runs"))
        .bearer_auth(ADMIN)
        .json(&serde_json::json!({"skills": skills}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    let run = r.json::<Value>().await.unwrap()["run_id"]
        .as_str()
        .unwrap()
        .to_string();
    for skill in skills {
        let r = c
            .post(s.ws(ws, &format!("runs/{run}/activations")))
            .bearer_auth(ADMIN)
            .json(&serde_json::json!({"skill": skill}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    }
    run
}

/// `POST …/runs/{run}/exec` in workspace `acme`: (status, body).
pub async fn exec(c: &reqwest::Client, s: &Server, run: &str, body: Value) -> (u16, Value) {
    exec_in(c, s, "acme", run, body).await
}

/// [`exec`] in workspace `ws`.
pub async fn exec_in(
    c: &reqwest::Client,
    s: &Server,
    ws: &str,
    run: &str,
    body: Value,
) -> (u16, Value) {
    post_exec(c.clone(), s.ws(ws, &format!("runs/{run}/exec")), body).await
}

/// [`exec`] in a task of its own (an execution that runs while the test does other things).
pub fn spawn_exec(
    c: &reqwest::Client,
    s: &Server,
    run: &str,
    body: Value,
) -> tokio::task::JoinHandle<(u16, Value)> {
    let url = s.ws("acme", &format!("runs/{run}/exec"));
    tokio::spawn(post_exec(c.clone(), url, body))
}

async fn post_exec(c: reqwest::Client, url: String, body: Value) -> (u16, Value) {
    let r = c
        .post(url)
        .bearer_auth(ADMIN)
        .json(&body)
        .send()
        .await
        .unwrap();
    let st = r.status().as_u16();
    (st, r.json().await.unwrap())
}

/// Revokes revision `rev` of `skill` in workspace `acme` (through `s`); asserts 200.
pub async fn revoke(c: &reqwest::Client, s: &Server, skill: &str, rev: i64, reason: &str) {
    let r = c
        .post(s.ws("acme", &format!("skills/{skill}/revisions/{rev}/revoke")))
        .bearer_auth(ADMIN)
        .json(&serde_json::json!({ "reason": reason }))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
}

/// Writes pure-Python wheels `skbdemo-<v>` (module `skbdemo` with `VERSION = "<v>"`) into a
/// fresh directory.
pub fn wheel_dir(root: &Path, versions: &[&str]) -> PathBuf {
    let dir = root.join("wheels");
    std::fs::create_dir_all(&dir).unwrap();
    let script = r#"
import base64, hashlib, sys, zipfile
out, v = sys.argv[1], sys.argv[2]
files = {
    "skbdemo/__init__.py": f'VERSION = "{v}"\n',
    f"skbdemo-{v}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: skbdemo\nVersion: {v}\n",
    f"skbdemo-{v}.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: skillbox-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
}
record = []
for name, text in files.items():
    data = text.encode()
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    record.append(f"{name},sha256={digest},{len(data)}")
record.append(f"skbdemo-{v}.dist-info/RECORD,,")
files[f"skbdemo-{v}.dist-info/RECORD"] = "\n".join(record) + "\n"
with zipfile.ZipFile(f"{out}/skbdemo-{v}-py3-none-any.whl", "w") as z:
    for name, text in files.items():
        z.writestr(name, text)
"#;
    for v in versions {
        let st = std::process::Command::new("python3")
            .args(["-c", script])
            .arg(&dir)
            .arg(v)
            .status()
            .unwrap();
        assert!(st.success());
    }
    dir
}

/// A package of skill `name` whose `scripts/run.sh` prints "I am <v>", plus `extra` files.
pub fn versioned(name: &str, v: &str, extra: &[(&str, &[u8])]) -> Vec<u8> {
    let md = skill_md(name, &format!("{name} {v}"));
    let script = format!("#!/bin/sh\necho \"I am {v}\"\n");
    let mut files: Vec<(&str, &[u8])> = vec![
        ("SKILL.md", md.as_bytes()),
        ("scripts/run.sh", script.as_bytes()),
    ];
    files.extend_from_slice(extra);
    tar_of(&files)
}

/// Runs a shell command in the run's sandbox (as `skill`'s execution if given); asserts 200.
pub async fn sh(
    c: &reqwest::Client,
    s: &Server,
    run: &str,
    skill: Option<&str>,
    cmd: &str,
) -> Value {
    let (st, v) = exec(
        c,
        s,
        run,
        serde_json::json!({"skill": skill, "command": cmd}),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    v
}

/// `?stream=true` on a run of `hello` (published): NDJSON stdout/stderr lines as the output
/// arrives (the first line before the command ends), then the exit line.
pub async fn assert_streamed_exec(c: &reqwest::Client, s: &Server) {
    let run = new_run(c, s, &["hello"]).await;
    let mut r = c
        .post(s.ws("acme", &format!("runs/{run}/exec?stream=true")))
        .bearer_auth(ADMIN)
        .json(&serde_json::json!({"command": "echo one; sleep 1; echo two >&2; exit 3"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["content-type"], "application/x-ndjson");
    let mut text = String::new();
    let mut exit_with_first_line = None;
    while let Some(chunk) = r.chunk().await.unwrap() {
        text.push_str(&String::from_utf8_lossy(&chunk));
        if exit_with_first_line.is_none() && text.contains('\n') {
            exit_with_first_line = Some(text.contains("\"exit\""));
        }
    }
    let lines: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(
        lines[0],
        serde_json::json!({"type": "stdout", "data": "one\n"})
    );
    assert_eq!(
        lines[1],
        serde_json::json!({"type": "stderr", "data": "two\n"})
    );
    let exit = lines.last().unwrap();
    assert_eq!(
        (exit["type"].as_str(), exit["exit_code"].as_i64()),
        (Some("exit"), Some(3))
    );
    assert_eq!(exit["packages"][0]["revision"], 1);
    // the first line arrived on its own, before the command (which sleeps 1 s) ended
    assert_eq!(
        exit_with_first_line,
        Some(false),
        "output was not streamed: {text}"
    );
    assert!(exit["duration_ms"].as_u64().unwrap() >= 1000);
}

/// A server started with `args` on `dir`, `hello` v1 published in `acme`, and a run that
/// activated it.
pub async fn hello_run(dir: &Path, args: &[&str]) -> (Server, reqwest::Client, String) {
    hello_run_on(Server::start(dir, args)).await
}

/// On a started server: `hello` v1 published in `acme`, and a run that activated it.
pub async fn hello_run_on(s: Server) -> (Server, reqwest::Client, String) {
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
    let run = new_run(&c, &s, &["hello"]).await;
    (s, c, run)
}

/// Waits (at most two minutes) for the failpoint under `envs` to be reached.
pub async fn wait_for_failpoint(envs: &Path) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while !envs.join("FAILPOINT.reached").exists() {
        assert!(
            Instant::now() < deadline,
            "the build never reached the failpoint"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Writing 16 MiB to `/tmp` and 64 MiB to `/workspace` fails with ENOSPC in the run's sandbox
/// (a server started with `--tmp-size 8388608 --workspace-quota 33554432`); afterwards the
/// space is freed and writes work again.
pub async fn assert_tmp_and_workspace_capped(c: &reqwest::Client, s: &Server, run: &str) {
    for (target, mib) in [("/tmp/big", 16), ("/workspace/big", 64)] {
        let v = sh(
            c,
            s,
            run,
            None,
            &format!("dd if=/dev/zero of={target} bs=1M count={mib} 2>&1; echo status=$?"),
        )
        .await;
        let out = v["stdout"].as_str().unwrap();
        assert!(
            out.contains("No space left on device"),
            "{target} is not capped: {v}"
        );
        assert!(!out.contains("status=0"), "{v}");
    }
    let v = sh(
        c,
        s,
        run,
        None,
        "rm -f /workspace/big /tmp/big; echo x > /workspace/y && cat /workspace/y",
    )
    .await;
    assert_eq!(v["stdout"], "x\n", "{v}");
}

/// The sizes [`assert_tmp_and_workspace_capped`] expects.
pub const SMALL_SANDBOX: [&str; 4] = ["--tmp-size", "8388608", "--workspace-quota", "33554432"];

/// A fresh database on the test PostgreSQL server (`SKILLBOX_TEST_POSTGRES`, which
/// `scripts/test` sets): its URL.
pub fn fresh_postgres_database() -> String {
    let server = std::env::var("SKILLBOX_TEST_POSTGRES").expect(
        "SKILLBOX_TEST_POSTGRES must name a PostgreSQL server for the tests; scripts/test starts one",
    );
    let name = format!(
        "skillbox_e2e_{}_{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    );
    let out = Command::new("psql")
        .args([&server, "-qc", &format!("CREATE DATABASE {name}")])
        .output()
        .expect("psql");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let base = server.rsplit_once('/').map_or(server.as_str(), |(b, _)| b);
    format!("{base}/{name}")
}

/// A fresh place in the test bucket (`SKILLBOX_TEST_S3_BUCKET` on the S3 server the `AWS_*`
/// variables name, which `scripts/test` starts): its `s3://` URL.
pub fn fresh_s3_store() -> String {
    let bucket = std::env::var("SKILLBOX_TEST_S3_BUCKET").expect(
        "SKILLBOX_TEST_S3_BUCKET must name a bucket on the S3 server AWS_ENDPOINT_URL points at; \
         scripts/test starts one",
    );
    format!(
        "s3://{bucket}/e2e-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    )
}

/// The shared storage of a scale-out deployment: one PostgreSQL database, one S3 store.
pub struct ScaleOut {
    pub database: String,
    pub store: String,
}

impl ScaleOut {
    pub fn fresh() -> ScaleOut {
        ScaleOut {
            database: fresh_postgres_database(),
            store: fresh_s3_store(),
        }
    }

    /// The `serve` arguments of a server on this storage.
    pub fn args(&self) -> [&str; 4] {
        ["--database-url", &self.database, "--store", &self.store]
    }

    /// A server on this storage with its own data directory `dir`.
    pub fn server(&self, dir: &Path) -> Server {
        self.server_with(dir, &[])
    }

    /// [`ScaleOut::server`] with `extra` arguments.
    pub fn server_with(&self, dir: &Path, extra: &[&str]) -> Server {
        let mut args = self.args().to_vec();
        args.extend_from_slice(extra);
        Server::start(dir, &args)
    }
}

/// Two servers as a scale-out deployment runs them: one PostgreSQL database and one S3 store
/// shared, each server with its own data directory (under `dir`).
pub fn scale_out_pair(dir: &Path) -> (Server, Server) {
    let storage = ScaleOut::fresh();
    (
        storage.server(&dir.join("a")),
        storage.server(&dir.join("b")),
    )
}

/// A TCP forwarder to `target` that a test can cut (every connection dropped, new ones closed
/// at once) and restore: an outage of the service behind it, as its clients see one — or cut
/// in the middle of an answer ([`TcpProxy::cut_after`]).
pub struct TcpProxy {
    pub port: u16,
    up: std::sync::Arc<tokio::sync::watch::Sender<bool>>,
    /// Bytes the service may still send its clients before the proxy cuts.
    budget: std::sync::Arc<std::sync::atomic::AtomicI64>,
}

impl TcpProxy {
    pub async fn start(target: std::net::SocketAddr) -> TcpProxy {
        use std::sync::atomic::Ordering::SeqCst;
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let up = std::sync::Arc::new(tokio::sync::watch::channel(true).0);
        let budget = std::sync::Arc::new(std::sync::atomic::AtomicI64::new(i64::MAX));
        let (state, left) = (up.clone(), budget.clone());
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                if !*state.borrow() {
                    continue; // dropped: closed at once
                }
                let mut cut = state.subscribe();
                let (state, left) = (state.clone(), left.clone());
                tokio::spawn(async move {
                    let Ok(server) = tokio::net::TcpStream::connect(target).await else {
                        return;
                    };
                    let (mut client_read, mut client_write) = client.into_split();
                    let (mut server_read, mut server_write) = server.into_split();
                    let upstream = tokio::io::copy(&mut client_read, &mut server_write);
                    let downstream = async {
                        let mut buf = vec![0u8; 16 << 10];
                        loop {
                            let n = server_read.read(&mut buf).await?;
                            if n == 0 {
                                return Ok::<_, std::io::Error>(());
                            }
                            let before = left.fetch_sub(n as i64, SeqCst);
                            let allowed = before.clamp(0, n as i64) as usize;
                            client_write.write_all(&buf[..allowed]).await?;
                            if allowed < n {
                                client_write.flush().await?;
                                state.send_replace(false);
                                return Ok(());
                            }
                        }
                    };
                    tokio::select! {
                        _ = upstream => {}
                        _ = downstream => {}
                        _ = cut.wait_for(|up| !*up) => {}
                    }
                });
            }
        });
        TcpProxy { port, up, budget }
    }

    /// Drops every connection and refuses new ones until [`TcpProxy::restore`].
    pub fn cut(&self) {
        self.up.send_replace(false);
    }

    /// Cuts as [`TcpProxy::cut`] does once the service sent `bytes` more bytes to its clients:
    /// in the middle of an answer.
    pub fn cut_after(&self, bytes: i64) {
        self.budget
            .store(bytes, std::sync::atomic::Ordering::SeqCst);
    }

    pub fn restore(&self) {
        self.budget
            .store(i64::MAX, std::sync::atomic::Ordering::SeqCst);
        self.up.send_replace(true);
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

/// The `/metrics` page of the server or node at `base_url`.
pub async fn metrics_text(c: &reqwest::Client, base_url: &str) -> String {
    let r = c.get(format!("{base_url}/metrics")).send().await.unwrap();
    r.text().await.unwrap()
}

/// A counter or gauge from the `/metrics` of the server or node at `base_url`.
pub async fn metric(c: &reqwest::Client, base_url: &str, name: &str) -> u64 {
    let text = metrics_text(c, base_url).await;
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {name} in {text}"))
}

/// `host:port` of a URL such as `postgres://user@127.0.0.1:5432/db` or `http://127.0.0.1:8333`.
pub fn socket_addr_of(url: &str) -> std::net::SocketAddr {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let rest = rest.rsplit_once('@').map_or(rest, |(_, r)| r);
    let host_port = rest.split('/').next().unwrap();
    host_port.parse().unwrap()
}

/// `POST /v1/admin/fsck` through `s`: the report.
pub async fn fsck(c: &reqwest::Client, s: &Server) -> Value {
    c.post(format!("{}/v1/admin/fsck", s.url))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// Where a scenario's servers keep their data: the embedded default, or the scale-out one
/// (PostgreSQL + S3, each server with its own data directory). `storage_test!` runs a
/// scenario under both.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Deployment {
    Embedded,
    ScaleOut,
}

impl Deployment {
    /// A server on fresh storage, its data under `dir`.
    pub fn server(self, dir: &Path) -> Server {
        match self {
            Deployment::Embedded => Server::start(dir, &[]),
            Deployment::ScaleOut => ScaleOut::fresh().server(&dir.join("a")),
        }
    }

    /// Two servers on the same fresh storage: on the embedded default two processes on one
    /// data directory, scaled out two servers with their own.
    pub fn pair(self, dir: &Path) -> (Server, Server) {
        match self {
            Deployment::Embedded => (Server::start(dir, &[]), Server::start(dir, &[])),
            Deployment::ScaleOut => scale_out_pair(dir),
        }
    }

    /// How long a change through one server may take to stop reads through another: at once
    /// on one data directory (a shared file), within a second across servers (SPEC §7.2).
    pub fn propagation(self) -> Duration {
        match self {
            Deployment::Embedded => Duration::ZERO,
            Deployment::ScaleOut => Duration::from_secs(1),
        }
    }
}

/// Polls `check` until it holds, at least once and for at most `within`; whether it did.
pub async fn holds_within<F, Fut>(within: Duration, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + within;
    loop {
        if check().await {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
