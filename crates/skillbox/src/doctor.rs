//! `skillbox doctor`: probes every sandbox backend and the configured storage (database and
//! content store) and says what works and why not. Exits 1 when the storage does not answer.

use serde_json::json;
use std::process::ExitCode;

struct Probe {
    backend: &'static str,
    works_here: bool,
    built: bool,
    detail: String,
}

#[derive(clap::Args)]
pub struct DoctorArgs {
    /// The data directory `serve` would use: the bwrap probe binds from it and makes a
    /// workspace in it, so a layout the sandbox cannot use is found here first.
    #[arg(long, env = "SKILLBOX_DATA_DIR", default_value = "./skillbox-data")]
    pub data_dir: std::path::PathBuf,
    #[command(flatten)]
    pub sandbox: crate::serve::SandboxArgs,
    /// The metadata database `serve` would use (sqlite://… or postgres://…); default:
    /// <data-dir>/skillbox.db.
    #[arg(long, env = "SKILLBOX_DATABASE_URL")]
    pub database_url: Option<String>,
    /// The content store `serve` would use: file:///ABS/PATH or s3://BUCKET[/PREFIX] (S3
    /// settings from the AWS_* variables); default: <data-dir>/store.
    #[arg(long, env = "SKILLBOX_STORE")]
    pub store: Option<String>,
}

/// One storage check: what was checked, whether it answers, what it said.
struct StorageCheck {
    what: &'static str,
    target: String,
    ok: bool,
    detail: String,
}

/// The database and the content store `serve` would use, each asked once (at most 10 s).
fn check_storage(a: &DoctorArgs) -> anyhow::Result<Vec<StorageCheck>> {
    use skillbox_registry::content::{ContentStore, StoreUrl};
    let layout = skillbox_registry::DataDir::new(&a.data_dir);
    let database = a
        .database_url
        .clone()
        .unwrap_or_else(|| layout.sqlite_url());
    let store = a.store.clone().unwrap_or_else(|| {
        let store = layout.store();
        format!(
            "file://{}",
            std::path::absolute(&store).unwrap_or(store).display()
        )
    });
    let embedded_db = a.database_url.is_none() && !layout.root().join("skillbox.db").exists();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let within = std::time::Duration::from_secs(10);
    let db_answer: Result<String, String> = if embedded_db {
        Ok("embedded SQLite, created by the first `serve`".into())
    } else {
        rt.block_on(async {
            match tokio::time::timeout(within, skillbox_registry::MetaStore::probe(&database)).await
            {
                Ok(Ok(version)) => Ok(version),
                Ok(Err(e)) => Err(e.one_line()),
                Err(_) => Err(format!("no answer within {}s", within.as_secs())),
            }
        })
    };
    let store_answer: Result<String, String> = match StoreUrl::parse(&store) {
        Err(e) => Err(e.to_string()),
        Ok(StoreUrl::Local(path)) if !path.exists() => Ok(format!(
            "{} does not exist yet: the first `serve` creates it",
            path.display()
        )),
        Ok(url) => rt.block_on(async {
            let store = ContentStore::open(&url).map_err(|e| e.to_string())?;
            match tokio::time::timeout(within, store.ping()).await {
                Ok(Ok(())) => Ok("answers".to_string()),
                Ok(Err(e)) => Err(format!(
                    "{} (is it running, does the bucket exist, are the AWS_* credentials right?)",
                    e.one_line()
                )),
                Err(_) => Err(format!("no answer within {}s", within.as_secs())),
            }
        }),
    };
    let redacted_db = skillbox_registry::meta::redacted_url(&database);
    Ok(vec![
        StorageCheck {
            what: "database",
            target: redacted_db,
            ok: db_answer.is_ok(),
            detail: db_answer.unwrap_or_else(|e| e),
        },
        StorageCheck {
            what: "store",
            target: store,
            ok: store_answer.is_ok(),
            detail: store_answer.unwrap_or_else(|e| e),
        },
    ])
}

/// bubblewrap: the same probe `serve` runs before it uses the backend, on the same data
/// directory.
fn probe_bwrap(a: &DoctorArgs) -> Probe {
    let probed =
        crate::serve::bwrap_backend(&skillbox_registry::DataDir::new(&a.data_dir), &a.sandbox)
            .map_err(|e| format!("{e:#}"))
            .and_then(|b| b.probe().map_err(|e| e.to_string()));
    let (works_here, detail) = match probed {
        Ok(ok) => (true, ok),
        Err(e) => (false, e),
    };
    Probe {
        backend: "bwrap",
        works_here,
        built: true,
        detail,
    }
}

/// Docker: the engine's unix socket answers `GET /_ping`.
fn probe_docker() -> Probe {
    use std::io::{Read, Write};
    let path = std::env::var("DOCKER_HOST")
        .ok()
        .and_then(|h| h.strip_prefix("unix://").map(str::to_string))
        .unwrap_or_else(|| "/var/run/docker.sock".into());
    let answer = std::os::unix::net::UnixStream::connect(&path).and_then(|mut s| {
        s.set_read_timeout(Some(std::time::Duration::from_secs(3)))?;
        s.write_all(b"GET /_ping HTTP/1.0\r\nHost: docker\r\n\r\n")?;
        let mut buf = String::new();
        s.read_to_string(&mut buf)?;
        Ok(buf)
    });
    let (works_here, detail) = match answer {
        Ok(resp) if resp.starts_with("HTTP/1.0 200") || resp.starts_with("HTTP/1.1 200") => {
            let version = resp
                .lines()
                .find_map(|l| l.strip_prefix("Api-Version: "))
                .unwrap_or("unknown");
            let (major, minor) = {
                let mut it = version.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
                (it.next().unwrap_or(0), it.next().unwrap_or(0))
            };
            let recursive = if (major, minor) >= (1, 44) {
                "recursive read-only bind mounts: supported".to_string()
            } else {
                format!(
                    "recursive read-only bind mounts: not supported (API {version} < 1.44; package \
trees have no submounts, so plain read-only binds hold)"
                )
            };
            (
                true,
                format!(
                    "the Docker engine answers on {path} (API {version}); {recursive}; use --box docker --docker-image IMAGE"
                ),
            )
        }
        Ok(resp) => (
            false,
            format!("{path} answered: {}", resp.lines().next().unwrap_or("")),
        ),
        Err(e) => (
            false,
            format!("cannot reach the Docker engine at {path}: {e}"),
        ),
    };
    Probe {
        backend: "docker",
        works_here,
        built: true,
        detail,
    }
}

pub fn run(a: DoctorArgs, json_out: bool) -> anyhow::Result<ExitCode> {
    let probes = [probe_bwrap(&a), probe_docker()];
    let storage = check_storage(&a)?;
    let storage_ok = storage.iter().all(|c| c.ok);
    if json_out {
        let v: Vec<_> = probes
            .iter()
            .map(|p| json!({"backend": p.backend, "built": p.built, "works_here": p.works_here, "usable": p.built && p.works_here, "detail": p.detail}))
            .chain(std::iter::once(json!({"backend": "none", "built": true, "works_here": true, "usable": true,
                "detail": "no sandbox: activation and reads work, exec answers box_unavailable"})))
            .collect();
        let storage: Vec<_> = storage
            .iter()
            .map(|c| json!({"check": c.what, "target": c.target, "ok": c.ok, "detail": c.detail}))
            .collect();
        outln!(
            "{}",
            json!({"backends": v, "storage": storage, "ok": storage_ok})
        );
    } else {
        for p in &probes {
            let state = match (p.built, p.works_here) {
                (true, true) => "usable",
                (false, true) => "not built in this version (the environment is ready)",
                (false, false) => "not built in this version, and the environment is not ready",
                (true, false) => "NOT usable",
            };
            outln!("{:<7} {state}\n        {}", p.backend, p.detail);
        }
        outln!(
            "none    usable\n        no sandbox: activation and reads work, exec answers box_unavailable"
        );
        for c in &storage {
            let state = if c.ok { "ok" } else { "NOT reachable" };
            outln!("{:<8} {state}: {}\n        {}", c.what, c.target, c.detail);
        }
    }
    Ok(if storage_ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
