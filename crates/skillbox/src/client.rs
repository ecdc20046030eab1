//! Client commands: talk to a skillbox server over HTTP (`--url`, `--token`, `--workspace`).

use anyhow::{Context, anyhow, bail};
use serde_json::{Value, json};
use skillbox_package::{Limits, Manifest, StagingDir, intake};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[derive(clap::Args, Clone)]
pub struct Conn {
    /// Server URL.
    #[arg(
        long,
        env = "SKILLBOX_URL",
        default_value = "http://127.0.0.1:7420",
        global = true
    )]
    pub url: String,
    /// Bearer token (a workspace token, or the admin token).
    #[arg(long, env = "SKILLBOX_TOKEN", global = true, hide_env_values = true)]
    pub token: Option<String>,
    /// Workspace (tenant).
    #[arg(
        long,
        short = 'w',
        env = "SKILLBOX_WORKSPACE",
        default_value = "default",
        global = true
    )]
    pub workspace: String,
    /// Machine-readable output.
    #[arg(long, global = true)]
    pub json: bool,
}

#[derive(clap::Subcommand)]
pub enum ClientCommand {
    /// Publish a package directory or archive as a new revision (compare-and-swap on --base).
    Publish {
        path: PathBuf,
        /// Skill name (default: the frontmatter name).
        #[arg(long)]
        skill: Option<String>,
        /// The revision this publish replaces (default: the current one; 0 creates the skill).
        #[arg(long)]
        base: Option<i64>,
    },
    /// List the workspace's skills.
    Skills,
    /// Show a skill and its current revision.
    Show { name: String },
    /// List a skill's revisions.
    Revisions { name: String },
    /// Print one file of a revision: NAME[@REV] PATH.
    Cat { spec: String, path: String },
    /// Download a revision into DIR and verify it against its digest: NAME[@REV] DIR.
    Pull { spec: String, dir: PathBuf },
    /// Compare two revisions: NAME@A NAME@B (per-file summary, text diffs).
    Diff { a: String, b: String },
    /// Move the current pointer back to REV (compare-and-swap against the current one).
    Rollback { name: String, revision: i64 },
    /// Soft-delete a skill (runs that pinned it keep working).
    Delete { name: String },
    /// Work with drafts.
    #[command(subcommand)]
    Draft(DraftCommand),
    /// Print the workspace's event log (SSE), from --after.
    Events {
        #[arg(long, default_value_t = 0)]
        after: i64,
        /// Keep streaming new events.
        #[arg(long)]
        follow: bool,
    },
    /// Runs: create, activate skills, read pinned files, finish.
    #[command(subcommand)]
    Run(RunCommand),
    /// Emergency revocation of one revision: NAME@REV --reason "...".
    Revoke {
        spec: String,
        #[arg(long)]
        reason: String,
    },
    /// Garbage collection (admin).
    Gc {
        /// Report what would be collected; change nothing.
        #[arg(long)]
        dry_run: bool,
        /// Grace period in seconds (default: the server's).
        #[arg(long)]
        grace: Option<u64>,
    },
    /// Tokens (admin).
    #[command(subcommand)]
    Token(TokenCommand),
    /// Re-verify stored content against digests (admin).
    Fsck,
}

#[derive(clap::Subcommand)]
pub enum DraftCommand {
    /// Create a draft of SKILL from --base (0 = empty).
    Create {
        skill: String,
        #[arg(long, default_value_t = 0)]
        base: i64,
    },
    /// Show a draft and its files.
    Show { id: String },
    /// Write a file into a draft from FILE (or stdin with -).
    Put {
        id: String,
        path: String,
        file: PathBuf,
        #[arg(long)]
        executable: bool,
    },
    /// Print a draft file.
    Get { id: String, path: String },
    /// Remove a file from a draft.
    Rm { id: String, path: String },
    /// Set the draft's base revision (after a conflict).
    Rebase { id: String, base: i64 },
    /// Publish the draft with its base revision.
    Publish { id: String },
    /// Delete the draft.
    Delete { id: String },
}

#[derive(clap::Subcommand)]
pub enum RunCommand {
    /// Create a run (prints its id).
    Create {
        /// Authorized skills (repeatable; default: every active skill).
        #[arg(long = "skill")]
        skills: Vec<String>,
        /// Lease in seconds, renewed by activity and heartbeats.
        #[arg(long)]
        ttl: Option<u64>,
        /// Refuse backends that cannot enforce read-only packages.
        #[arg(long)]
        require_immutable: bool,
    },
    /// Show a run and its pins.
    Show { run: String },
    /// Activate (pin) a skill in the run; prints its instructions.
    Activate {
        run: String,
        skill: String,
        #[arg(long)]
        revision: Option<i64>,
    },
    /// Print a file of the run's pinned revision of SKILL.
    Read {
        run: String,
        skill: String,
        path: String,
    },
    /// Print the run's <available_skills> prompt index.
    Prompt { run: String },
    /// Extend the run's lease.
    Heartbeat { run: String },
    /// Create a run draft of SKILL at /workspace/skill-drafts/<draft-id>/ in the run's sandbox
    /// (from the run's pin, else --base, else the current revision); edit it with `run exec`,
    /// publish it with `draft publish <draft-id>`.
    Draft {
        run: String,
        skill: String,
        #[arg(long)]
        base: Option<i64>,
    },
    /// Execute in the run's sandbox: skillbox run exec RUN [--skill S] -- argv...
    Exec {
        run: String,
        #[arg(long)]
        skill: Option<String>,
        /// Kill the command after this many milliseconds (exit status 124).
        #[arg(long)]
        timeout_ms: Option<u64>,
        #[arg(trailing_var_arg = true, required = true)]
        argv: Vec<String>,
    },
    /// Finish the run (releases its pins).
    Finish { run: String },
}

#[derive(clap::Subcommand)]
pub enum TokenCommand {
    /// Mint a workspace token (shown once).
    Create {
        /// reader, author, runner or admin.
        #[arg(long)]
        role: String,
    },
}

/// A refusal, shown with its code and details; exit status 1. Usually the server's; a package
/// found invalid before upload is refused here with the body the server would answer, so both
/// print and exit the same way.
#[derive(Debug)]
pub struct ServerError {
    pub status: u16,
    pub body: Value,
}

impl ServerError {
    pub fn invalid_package(r: &skillbox_package::Rejection) -> Self {
        ServerError {
            status: 422,
            body: json!({"error": {
                "code": "invalid_package",
                "message": format!("the package is invalid: {} problem(s)", r.problems.len()),
                "problems": r.problems,
                "warnings": r.warnings,
            }}),
        }
    }
}

impl std::fmt::Display for ServerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let e = &self.body["error"];
        write!(
            f,
            "{} ({}): {}",
            e["code"].as_str().unwrap_or("error"),
            self.status,
            e["message"].as_str().unwrap_or("")
        )?;
        if let Some(problems) = e["problems"].as_array() {
            for p in problems {
                let loc = [p["path"].as_str(), p["field"].as_str()]
                    .into_iter()
                    .flatten()
                    .collect::<Vec<_>>()
                    .join(": ");
                write!(
                    f,
                    "\n  {}{}{}",
                    loc,
                    if loc.is_empty() { "" } else { ": " },
                    p["message"].as_str().unwrap_or("")
                )?;
            }
        }
        Ok(())
    }
}

impl std::error::Error for ServerError {}

struct Client {
    http: reqwest::Client,
    conn: Conn,
}

impl Client {
    fn new(conn: Conn) -> anyhow::Result<Self> {
        Ok(Client {
            http: reqwest::Client::builder().build()?,
            conn,
        })
    }

    fn ws_url(&self, rest: &str) -> String {
        format!(
            "{}/v1/workspaces/{}/{rest}",
            self.conn.url.trim_end_matches('/'),
            self.conn.workspace
        )
    }

    fn url(&self, rest: &str) -> String {
        format!("{}{rest}", self.conn.url.trim_end_matches('/'))
    }

    fn req(&self, method: reqwest::Method, url: String) -> reqwest::RequestBuilder {
        let r = self.http.request(method, url);
        match &self.conn.token {
            Some(t) => r.bearer_auth(t),
            None => r,
        }
    }

    async fn send(&self, rb: reqwest::RequestBuilder) -> anyhow::Result<reqwest::Response> {
        let resp = rb.send().await.with_context(|| {
            format!(
                "cannot reach the server at {} (is `skillbox serve` running?)",
                self.conn.url
            )
        })?;
        if resp.status().is_success() {
            return Ok(resp);
        }
        let status = resp.status().as_u16();
        let body = resp
            .json::<Value>()
            .await
            .unwrap_or_else(|_| json!({"error": {"code": "http", "message": "no error body"}}));
        Err(ServerError { status, body }.into())
    }

    async fn get_json(&self, url: String) -> anyhow::Result<Value> {
        Ok(self
            .send(self.req(reqwest::Method::GET, url))
            .await?
            .json()
            .await?)
    }

    async fn revision(&self, name: &str, rev: &str) -> anyhow::Result<Value> {
        self.get_json(self.ws_url(&format!("skills/{name}/revisions/{rev}")))
            .await
    }

    async fn current_revision(&self, name: &str) -> anyhow::Result<i64> {
        match self.get_json(self.ws_url(&format!("skills/{name}"))).await {
            Ok(v) => Ok(v["current_revision"].as_i64().unwrap_or(0)),
            Err(e)
                if e.downcast_ref::<ServerError>()
                    .is_some_and(|s| s.status == 404) =>
            {
                Ok(0)
            }
            Err(e) => Err(e),
        }
    }
}

fn split_spec(spec: &str) -> (&str, &str) {
    spec.split_once('@').unwrap_or((spec, "current"))
}

/// The exit status `run exec` ends with, as a shell would report the command: its exit code,
/// 124 when it timed out (as `timeout(1)`), 128+N when signal N killed it.
fn command_status(v: &Value) -> u8 {
    if v["timed_out"].as_bool() == Some(true) {
        return 124;
    }
    if let Some(code) = v["exit_code"].as_i64() {
        return (code & 0xff) as u8;
    }
    match v["signal"].as_i64() {
        Some(sig) => (128 + sig).clamp(0, 255) as u8,
        // Killed by a revocation, or the sandbox failed: not the command's own status.
        None => 125,
    }
}

fn print(json_mode: bool, v: &Value, human: impl FnOnce() -> String) {
    if json_mode {
        println!("{v}");
    } else {
        println!("{}", human());
    }
}

pub fn run(conn: Conn, cmd: ClientCommand) -> anyhow::Result<ExitCode> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(run_async(conn, cmd))
}

async fn run_async(conn: Conn, cmd: ClientCommand) -> anyhow::Result<ExitCode> {
    let j = conn.json;
    let c = Client::new(conn)?;
    match cmd {
        ClientCommand::Publish { path, skill, base } => publish(&c, &path, skill, base).await?,
        ClientCommand::Skills => {
            let v = c.get_json(c.ws_url("skills")).await?;
            print(j, &v, || {
                let mut s = String::new();
                for k in v["skills"].as_array().into_iter().flatten() {
                    s.push_str(&format!(
                        "{:<32} r{:<5} {}\n",
                        k["name"].as_str().unwrap_or(""),
                        k["current_revision"],
                        k["description"].as_str().unwrap_or("")
                    ));
                }
                s.trim_end().to_string()
            });
        }
        ClientCommand::Show { name } => {
            let v = c.get_json(c.ws_url(&format!("skills/{name}"))).await?;
            print(j, &v, || {
                serde_json::to_string_pretty(&v).unwrap_or_default()
            });
        }
        ClientCommand::Revisions { name } => {
            let v = c
                .get_json(c.ws_url(&format!("skills/{name}/revisions")))
                .await?;
            print(j, &v, || {
                let mut s = String::new();
                for r in v["revisions"].as_array().into_iter().flatten() {
                    s.push_str(&format!(
                        "r{:<5} {:<10} parent r{:<4} {} {}\n",
                        r["revision"],
                        r["state"].as_str().unwrap_or(""),
                        r["parent_revision"],
                        r["digest"].as_str().unwrap_or(""),
                        r["publisher"].as_str().unwrap_or("")
                    ));
                }
                s.trim_end().to_string()
            });
        }
        ClientCommand::Cat { spec, path } => {
            let (name, rev) = split_spec(&spec);
            let bytes = c
                .send(c.req(
                    reqwest::Method::GET,
                    c.ws_url(&format!("skills/{name}/revisions/{rev}/files/{path}")),
                ))
                .await?
                .bytes()
                .await?;
            std::io::stdout().write_all(&bytes)?;
        }
        ClientCommand::Pull { spec, dir } => pull(&c, &spec, &dir, j).await?,
        ClientCommand::Diff { a, b } => diff(&c, &a, &b, j).await?,
        ClientCommand::Rollback { name, revision } => {
            let base = c.current_revision(&name).await?;
            let v = c
                .send(
                    c.req(
                        reqwest::Method::PUT,
                        c.ws_url(&format!("skills/{name}/current")),
                    )
                    .json(&json!({"revision": revision, "base_revision": base})),
                )
                .await?
                .json::<Value>()
                .await?;
            print(j, &v, || {
                format!("{name}: current revision r{base} → r{revision}")
            });
        }
        ClientCommand::Delete { name } => {
            let v = c
                .send(c.req(reqwest::Method::DELETE, c.ws_url(&format!("skills/{name}"))))
                .await?
                .json::<Value>()
                .await?;
            print(j, &v, || format!("{name}: deleted"));
        }
        ClientCommand::Draft(d) => draft(&c, d, j).await?,
        ClientCommand::Events { after, follow } => events(&c, after, follow, j).await?,
        ClientCommand::Run(r) => return run_cmd(&c, r, j).await,
        ClientCommand::Revoke { spec, reason } => {
            let (name, rev) = spec
                .split_once('@')
                .ok_or_else(|| anyhow!("use NAME@REV"))?;
            let v: Value = c
                .send(
                    c.req(
                        reqwest::Method::POST,
                        c.ws_url(&format!("skills/{name}/revisions/{rev}/revoke")),
                    )
                    .json(&json!({"reason": reason})),
                )
                .await?
                .json()
                .await?;
            print(j, &v, || {
                format!(
                    "revoked {name}@r{}; current revision is now r{}",
                    v["revision"], v["current_revision"]
                )
            });
        }
        ClientCommand::Gc { dry_run, grace } => {
            let mut body = json!({"dry_run": dry_run});
            if let Some(g) = grace {
                body["grace_seconds"] = json!(g);
            }
            let v: Value = c
                .send(
                    c.req(reqwest::Method::POST, c.url("/v1/admin/gc"))
                        .json(&body),
                )
                .await?
                .json()
                .await?;
            print(j, &v, || {
                let mut s = format!(
                    "{}{} revisions, {} trees, {} manifests, {} blobs, {} bytes freed",
                    if dry_run {
                        "would collect: "
                    } else {
                        "collected: "
                    },
                    v["revisions"].as_array().map(|a| a.len()).unwrap_or(0),
                    v["trees_removed"],
                    v["manifests_removed"],
                    v["blobs_removed"],
                    v["bytes_freed"]
                );
                for r in v["revisions"].as_array().into_iter().flatten() {
                    s.push_str(&format!(
                        "\n  {}/{}@r{} {}",
                        r["workspace"].as_str().unwrap_or(""),
                        r["skill"].as_str().unwrap_or(""),
                        r["revision"],
                        r["digest"].as_str().unwrap_or("")
                    ));
                }
                s
            });
        }
        ClientCommand::Token(TokenCommand::Create { role }) => {
            let body = json!({"workspace": c.conn.workspace, "role": role});
            let v = c
                .send(
                    c.req(reqwest::Method::POST, c.url("/v1/admin/tokens"))
                        .json(&body),
                )
                .await?
                .json::<Value>()
                .await?;
            print(j, &v, || v["token"].as_str().unwrap_or("").to_string());
        }
        ClientCommand::Fsck => {
            let v = c
                .send(c.req(reqwest::Method::POST, c.url("/v1/admin/fsck")))
                .await?
                .json::<Value>()
                .await?;
            let ok = v["ok"].as_bool().unwrap_or(false);
            print(j, &v, || {
                let mut s = format!(
                    "{}: {} blobs, {} revisions, {} trees checked",
                    if ok { "clean" } else { "PROBLEMS" },
                    v["blobs_checked"],
                    v["revisions_checked"],
                    v["trees_checked"]
                );
                for p in v["problems"].as_array().into_iter().flatten() {
                    s.push_str(&format!(
                        "\n  {}: {}",
                        p["object"].as_str().unwrap_or(""),
                        p["message"].as_str().unwrap_or("")
                    ));
                }
                s
            });
            if !ok {
                return Ok(ExitCode::from(1));
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Reads and validates the package locally (fast feedback, and the name) and returns the
/// bytes to upload with their content type.
fn prepare_upload(
    path: &Path,
    skill: Option<&str>,
) -> anyhow::Result<(String, Vec<u8>, &'static str)> {
    let limits = Limits::default();
    let opts = skillbox_package::CheckOptions {
        strict: false,
        expected_name: skill.map(str::to_string),
        limits,
    };
    if path.is_dir() {
        let pkg = skillbox_package::check(intake::scan_dir(path, &limits)?, &opts)
            .map_err(|r| ServerError::invalid_package(&r))?;
        let tar = skillbox_package::write::write_tar(
            Vec::new(),
            &pkg.manifest,
            &skillbox_package::write::DirSource(path),
        )?;
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(&tar)?;
        return Ok((pkg.skill.frontmatter.name, gz.finish()?, "application/gzip"));
    }
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let format = skillbox_package::ArchiveFormat::sniff(&bytes[..bytes.len().min(512)])
        .ok_or_else(|| anyhow!("{}: not a directory, zip, tar or tar.gz", path.display()))?;
    let staging = StagingDir::new_in(&std::env::temp_dir(), "skillbox-publish-")?;
    let intake = intake::extract_archive(
        std::io::Cursor::new(&bytes),
        format,
        staging.path(),
        &limits,
    )?;
    let pkg =
        skillbox_package::check(intake, &opts).map_err(|r| ServerError::invalid_package(&r))?;
    let ct = match format {
        skillbox_package::ArchiveFormat::Zip => "application/zip",
        skillbox_package::ArchiveFormat::Tar => "application/x-tar",
        skillbox_package::ArchiveFormat::TarGz => "application/gzip",
    };
    Ok((pkg.skill.frontmatter.name, bytes, ct))
}

async fn publish(
    c: &Client,
    path: &Path,
    skill: Option<String>,
    base: Option<i64>,
) -> anyhow::Result<()> {
    let (name, bytes, ct) = prepare_upload(path, skill.as_deref())?;
    let name = skill.unwrap_or(name);
    let base = match base {
        Some(b) => b,
        None => c.current_revision(&name).await?,
    };
    let total = bytes.len() as u64;
    let bar = indicatif::ProgressBar::new(total);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec}",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    bar.set_message(format!("publishing {name}"));
    let chunks: Vec<bytes::Bytes> = bytes::Bytes::from(bytes)
        .chunks(64 * 1024)
        .map(bytes::Bytes::copy_from_slice)
        .collect();
    let pb = bar.clone();
    let stream = futures_util::stream::iter(chunks.into_iter().map(move |chunk| {
        pb.inc(chunk.len() as u64);
        Ok::<_, std::io::Error>(chunk)
    }));
    let rb = c
        .req(
            reqwest::Method::POST,
            c.ws_url(&format!("skills/{name}/revisions?base_revision={base}")),
        )
        .header(reqwest::header::CONTENT_TYPE, ct)
        .header(reqwest::header::CONTENT_LENGTH, total)
        .body(reqwest::Body::wrap_stream(stream));
    let result = c.send(rb).await;
    bar.finish_and_clear();
    let v: Value = result?.json().await?;
    print(c.conn.json, &v, || {
        let mut s = format!(
            "published {}@r{} {} ({} files, {} bytes){}",
            v["name"].as_str().unwrap_or(""),
            v["revision"],
            v["digest"].as_str().unwrap_or(""),
            v["file_count"],
            v["size"],
            if v["replayed"].as_bool() == Some(true) {
                " (already published)"
            } else {
                ""
            }
        );
        for w in v["warnings"].as_array().into_iter().flatten() {
            s.push_str(&format!(
                "\n  warning: {}: {}",
                w["field"].as_str().or(w["path"].as_str()).unwrap_or(""),
                w["message"].as_str().unwrap_or("")
            ));
        }
        s
    });
    Ok(())
}

async fn pull(c: &Client, spec: &str, dir: &Path, j: bool) -> anyhow::Result<()> {
    let (name, rev) = split_spec(spec);
    let meta = c.revision(name, rev).await?;
    let digest = meta["digest"]
        .as_str()
        .ok_or_else(|| anyhow!("server sent no digest"))?
        .to_string();
    let tar = c
        .send(c.req(
            reqwest::Method::GET,
            c.ws_url(&format!(
                "skills/{name}/revisions/{}/archive",
                meta["revision"]
            )),
        ))
        .await?
        .bytes()
        .await?;
    if dir.exists() {
        bail!("{} exists; pull into a new directory", dir.display());
    }
    let parent = dir
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let staging = StagingDir::new_in(parent, ".skillbox-pull-")?;
    let intake = intake::extract_tar(
        std::io::Cursor::new(&tar),
        false,
        staging.path(),
        &Limits::unbounded(),
    )?;
    if !intake.problems.is_empty() {
        bail!("the downloaded archive is damaged: {:?}", intake.problems);
    }
    let got = Manifest::new(intake.files)?.digest().to_string();
    if got != digest {
        bail!(
            "verification failed: downloaded content has digest {got}, revision says {digest}; nothing written"
        );
    }
    let rel = intake
        .root
        .strip_prefix(staging.path())
        .ok()
        .filter(|r| !r.as_os_str().is_empty())
        .map(Path::to_path_buf);
    staging.commit(rel.as_deref(), dir)?;
    std::fs::set_permissions(dir, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
    let v = json!({"skill": name, "revision": meta["revision"], "digest": digest, "dir": dir, "verified": true});
    print(j, &v, || {
        format!(
            "pulled {name}@r{} into {} (verified {digest})",
            meta["revision"],
            dir.display()
        )
    });
    Ok(())
}

async fn diff(c: &Client, a: &str, b: &str, j: bool) -> anyhow::Result<()> {
    let (na, ra) = split_spec(a);
    let (nb, rb) = split_spec(b);
    let (ma, mb) = (c.revision(na, ra).await?, c.revision(nb, rb).await?);
    let index = |m: &Value| -> std::collections::BTreeMap<String, Value> {
        m["manifest"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|e| (e["path"].as_str().unwrap_or("").to_string(), e.clone()))
            .collect()
    };
    let (ia, ib) = (index(&ma), index(&mb));
    let added: Vec<&String> = ib.keys().filter(|p| !ia.contains_key(*p)).collect();
    let removed: Vec<&String> = ia.keys().filter(|p| !ib.contains_key(*p)).collect();
    let modified: Vec<&String> = ia
        .keys()
        .filter(|p| ib.get(*p).is_some_and(|e| e != &ia[*p]))
        .collect();
    if j {
        println!(
            "{}",
            json!({"a": {"skill": na, "revision": ma["revision"], "digest": ma["digest"]},
                               "b": {"skill": nb, "revision": mb["revision"], "digest": mb["digest"]},
                               "added": added, "removed": removed, "modified": modified})
        );
        return Ok(());
    }
    println!(
        "{na}@r{} → {nb}@r{}: {} added, {} removed, {} modified",
        ma["revision"],
        mb["revision"],
        added.len(),
        removed.len(),
        modified.len()
    );
    for p in &added {
        println!("  A {p}");
    }
    for p in &removed {
        println!("  D {p}");
    }
    for p in &modified {
        println!("  M {p}");
    }
    for p in modified {
        let get = |n: &str, r: &Value| {
            c.send(c.req(
                reqwest::Method::GET,
                c.ws_url(&format!("skills/{n}/revisions/{r}/files/{p}")),
            ))
        };
        let old = get(na, &ma["revision"]).await?.bytes().await?;
        let new = get(nb, &mb["revision"]).await?.bytes().await?;
        match (std::str::from_utf8(&old), std::str::from_utf8(&new)) {
            (Ok(o), Ok(n)) => {
                let d = similar::TextDiff::from_lines(o, n);
                print!(
                    "{}",
                    d.unified_diff()
                        .header(&format!("a/{p}"), &format!("b/{p}"))
                );
            }
            _ => println!("Binary files a/{p} and b/{p} differ"),
        }
    }
    Ok(())
}

async fn draft(c: &Client, d: DraftCommand, j: bool) -> anyhow::Result<()> {
    use reqwest::Method as M;
    let v: Value = match d {
        DraftCommand::Create { skill, base } => {
            c.send(
                c.req(M::POST, c.ws_url("drafts"))
                    .json(&json!({"skill": skill, "base_revision": base})),
            )
            .await?
            .json()
            .await?
        }
        DraftCommand::Show { id } => c.get_json(c.ws_url(&format!("drafts/{id}"))).await?,
        DraftCommand::Put {
            id,
            path,
            file,
            executable,
        } => {
            let bytes = if file.as_os_str() == "-" {
                let mut b = Vec::new();
                std::io::Read::read_to_end(&mut std::io::stdin(), &mut b)?;
                b
            } else {
                std::fs::read(&file).with_context(|| format!("reading {}", file.display()))?
            };
            c.send(
                c.req(
                    M::PUT,
                    c.ws_url(&format!("drafts/{id}/files/{path}?executable={executable}")),
                )
                .body(bytes),
            )
            .await?
            .json()
            .await?
        }
        DraftCommand::Get { id, path } => {
            let bytes = c
                .send(c.req(M::GET, c.ws_url(&format!("drafts/{id}/files/{path}"))))
                .await?
                .bytes()
                .await?;
            std::io::stdout().write_all(&bytes)?;
            return Ok(());
        }
        DraftCommand::Rm { id, path } => {
            c.send(c.req(M::DELETE, c.ws_url(&format!("drafts/{id}/files/{path}"))))
                .await?;
            json!({"draft_id": id, "removed": path})
        }
        DraftCommand::Rebase { id, base } => {
            c.send(
                c.req(M::PUT, c.ws_url(&format!("drafts/{id}")))
                    .json(&json!({"base_revision": base})),
            )
            .await?
            .json()
            .await?
        }
        DraftCommand::Publish { id } => {
            c.send(c.req(M::POST, c.ws_url(&format!("drafts/{id}/publish"))))
                .await?
                .json()
                .await?
        }
        DraftCommand::Delete { id } => {
            c.send(c.req(M::DELETE, c.ws_url(&format!("drafts/{id}"))))
                .await?;
            json!({"draft_id": id, "deleted": true})
        }
    };
    print(j, &v, || {
        serde_json::to_string_pretty(&v).unwrap_or_default()
    });
    Ok(())
}

async fn events(c: &Client, after: i64, follow: bool, j: bool) -> anyhow::Result<()> {
    use futures_util::StreamExt;
    let url = c.ws_url(&format!("events?after={after}&follow={follow}"));
    let resp = c.send(c.req(reqwest::Method::GET, url)).await?;
    let mut stream = resp.bytes_stream();
    let mut buf = String::new();
    while let Some(chunk) = stream.next().await {
        buf.push_str(&String::from_utf8_lossy(&chunk?));
        while let Some(end) = buf.find("\n\n") {
            let frame: String = buf.drain(..end + 2).collect();
            let Some(data) = frame
                .lines()
                .find_map(|l| l.strip_prefix("data:"))
                .map(str::trim)
            else {
                continue;
            };
            let v: Value = serde_json::from_str(data).unwrap_or(Value::Null);
            print(j, &v, || {
                format!(
                    "#{} {} {}",
                    v["seq"],
                    v["kind"].as_str().unwrap_or(""),
                    v["data"]
                )
            });
        }
    }
    Ok(())
}

async fn run_cmd(c: &Client, r: RunCommand, j: bool) -> anyhow::Result<ExitCode> {
    use reqwest::Method as M;
    match r {
        RunCommand::Create {
            skills,
            ttl,
            require_immutable,
        } => {
            let mut body = json!({"require_immutable": require_immutable});
            if !skills.is_empty() {
                body["skills"] = json!(skills);
            }
            if let Some(t) = ttl {
                body["ttl_seconds"] = json!(t);
            }
            let v: Value = c
                .send(c.req(M::POST, c.ws_url("runs")).json(&body))
                .await?
                .json()
                .await?;
            print(j, &v, || v["run_id"].as_str().unwrap_or("").to_string());
        }
        RunCommand::Show { run } => {
            let v = c.get_json(c.ws_url(&format!("runs/{run}"))).await?;
            print(j, &v, || {
                serde_json::to_string_pretty(&v).unwrap_or_default()
            });
        }
        RunCommand::Activate {
            run,
            skill,
            revision,
        } => {
            let v: Value = c
                .send(
                    c.req(M::POST, c.ws_url(&format!("runs/{run}/activations")))
                        .json(&json!({"skill": skill, "revision": revision})),
                )
                .await?
                .json()
                .await?;
            print(j, &v, || {
                format!(
                    "{}@r{} {} mounted at {}\n\n{}",
                    v["skill"].as_str().unwrap_or(""),
                    v["revision"],
                    v["digest"].as_str().unwrap_or(""),
                    v["mount_path"].as_str().unwrap_or(""),
                    v["instructions"].as_str().unwrap_or("")
                )
            });
        }
        RunCommand::Read { run, skill, path } => {
            let bytes = c
                .send(c.req(
                    M::GET,
                    c.ws_url(&format!("runs/{run}/skills/{skill}/files/{path}")),
                ))
                .await?
                .bytes()
                .await?;
            std::io::stdout().write_all(&bytes)?;
        }
        RunCommand::Prompt { run } => {
            let v = c.get_json(c.ws_url(&format!("runs/{run}/prompt"))).await?;
            print(j, &v, || {
                v["prompt"].as_str().unwrap_or("").trim_end().to_string()
            });
        }
        RunCommand::Heartbeat { run } => {
            let v: Value = c
                .send(c.req(M::POST, c.ws_url(&format!("runs/{run}/heartbeat"))))
                .await?
                .json()
                .await?;
            print(j, &v, || {
                format!(
                    "{} {} until {}",
                    v["run_id"].as_str().unwrap_or(""),
                    v["state"].as_str().unwrap_or(""),
                    v["expires_at"]
                )
            });
        }
        RunCommand::Draft { run, skill, base } => {
            let v: Value = c
                .send(
                    c.req(M::POST, c.ws_url(&format!("runs/{run}/drafts")))
                        .json(&json!({"skill": skill, "base_revision": base})),
                )
                .await?
                .json()
                .await?;
            print(j, &v, || {
                format!(
                    "{} {} (base revision {})",
                    v["draft_id"].as_str().unwrap_or(""),
                    v["path"].as_str().unwrap_or(""),
                    v["base_revision"]
                )
            });
        }
        RunCommand::Exec {
            run,
            skill,
            timeout_ms,
            argv,
        } => {
            let v: Value = c
                .send(
                    c.req(M::POST, c.ws_url(&format!("runs/{run}/exec")))
                        .json(&json!({"skill": skill, "argv": argv, "timeout_ms": timeout_ms})),
                )
                .await?
                .json()
                .await?;
            if j {
                println!("{v}");
            } else {
                // The command's own bytes, each stream to its own, nothing added.
                use std::io::Write;
                std::io::stdout().write_all(v["stdout"].as_str().unwrap_or("").as_bytes())?;
                std::io::stdout().flush()?;
                std::io::stderr().write_all(v["stderr"].as_str().unwrap_or("").as_bytes())?;
            }
            return Ok(ExitCode::from(command_status(&v)));
        }
        RunCommand::Finish { run } => {
            let v: Value = c
                .send(c.req(M::DELETE, c.ws_url(&format!("runs/{run}"))))
                .await?
                .json()
                .await?;
            print(j, &v, || {
                format!(
                    "{} {}",
                    v["run_id"].as_str().unwrap_or(""),
                    v["state"].as_str().unwrap_or("")
                )
            });
        }
    }
    Ok(ExitCode::SUCCESS)
}
