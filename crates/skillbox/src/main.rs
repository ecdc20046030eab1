//! `skillbox`: the one binary. Offline package commands, the server, and the HTTP client.
//!
//! Exit codes: 0 success, 1 the thing checked is invalid or the server refused, 2 usage or
//! environment errors.

#[macro_use]
mod output;
mod client;
mod doctor;
mod node;
mod offline;
mod serve;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

/// jemalloc for every allocation of the process: Rust's through this, C's (SQLite's page
/// buffers, statements, rows) because the dependency's `unprefixed_malloc…` feature makes it
/// the `malloc` the binary links. glibc's allocator consolidated its free lists on nearly every
/// allocation of a page or more; with jemalloc new-pin activations rose 16–29% and pinned reads
/// 7–20% in `scripts/bench-runs` (docs/BENCHMARKS.md).
#[cfg(all(target_os = "linux", not(target_env = "musl")))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[derive(Parser)]
#[command(
    name = "skillbox",
    version,
    about = "A versioned registry for Agent Skills and a sandbox runtime that runs them.",
    long_about = "A versioned registry for Agent Skills (SKILL.md packages) and a sandbox runtime \
that runs them. `skillbox serve` starts the server; `validate` and `digest` work offline on a \
package directory or a zip / tar / tar.gz archive."
)]
struct Cli {
    #[command(flatten)]
    conn: client::Conn,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Check a package (directory or archive) against the format rules; exit 1 when invalid.
    Validate(offline::ValidateArgs),
    /// Print a package's skillbox-tree-v1 digest (or, with --manifest, its canonical manifest).
    Digest(offline::DigestArgs),
    /// Probe every sandbox backend and say what works here and why not.
    Doctor(doctor::DoctorArgs),
    /// Run the skillbox server.
    Serve(Box<serve::ServeArgs>),
    /// Run an execution node: it registers with Core (SPEC §7.3) and runs the executions that
    /// a Core started with `serve --box remote` places on it.
    Node(Box<node::NodeArgs>),
    #[command(flatten)]
    Client(client::ClientCommand),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let json_out = cli.conn.json
        || match &cli.command {
            Command::Validate(a) => a.json,
            Command::Digest(a) => a.json,
            _ => false,
        };
    let result = match cli.command {
        Command::Validate(a) => offline::validate(a),
        Command::Digest(a) => offline::digest(a),
        Command::Serve(a) => serve::run(*a),
        Command::Node(a) => node::run(*a),
        Command::Doctor(a) => doctor::run(a, cli.conn.json),
        Command::Client(c) => client::run(cli.conn, c),
    };
    match result {
        Ok(code) => code,
        // The reader of our output went away (`| head`): nothing more to say.
        Err(e) if output::is_closed_pipe(&e) => ExitCode::SUCCESS,
        Err(e) => {
            let (status, body, text) = describe_error(&e);
            if json_out {
                outln!("{body}");
            } else {
                eprintln!("error: {text}");
            }
            ExitCode::from(status)
        }
    }
}

/// Exit status, `{"error": {...}}` object and text of a failed command. Refusals — by the
/// server, or a package found invalid here — are 1; usage, local and connection errors are 2,
/// with a local code (`connection_failed`, or `bad_request` for what was asked).
fn describe_error(e: &anyhow::Error) -> (u8, serde_json::Value, String) {
    if let Some(s) = e.downcast_ref::<client::ServerError>() {
        return (
            1,
            serde_json::to_value(&s.body).unwrap_or_default(),
            s.to_string(),
        );
    }
    let text = format!("{e:#}");
    let unreachable = e.chain().any(|c| {
        c.downcast_ref::<reqwest::Error>()
            .is_some_and(|r| r.is_connect() || r.is_timeout())
    });
    let code = if unreachable {
        "connection_failed"
    } else {
        "bad_request"
    };
    (
        2,
        serde_json::json!({"error": {"code": code, "message": text}}),
        text,
    )
}
