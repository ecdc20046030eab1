//! `skillbox doctor`: probes every sandbox backend and says what works and why not.

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
    if json_out {
        let v: Vec<_> = probes
            .iter()
            .map(|p| json!({"backend": p.backend, "built": p.built, "works_here": p.works_here, "usable": p.built && p.works_here, "detail": p.detail}))
            .chain(std::iter::once(json!({"backend": "none", "built": true, "works_here": true, "usable": true,
                "detail": "no sandbox: activation and reads work, exec answers box_unavailable"})))
            .collect();
        println!("{}", json!({"backends": v}));
    } else {
        for p in &probes {
            let state = match (p.built, p.works_here) {
                (true, true) => "usable",
                (false, true) => "not built in this version (the environment is ready)",
                (false, false) => "not built in this version, and the environment is not ready",
                (true, false) => "NOT usable",
            };
            println!("{:<7} {state}\n        {}", p.backend, p.detail);
        }
        println!(
            "none    usable\n        no sandbox: activation and reads work, exec answers box_unavailable"
        );
    }
    Ok(ExitCode::SUCCESS)
}
