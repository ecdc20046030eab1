//! `skillbox`: the one binary. Offline package commands, the server, and the HTTP client.
//!
//! Exit codes: 0 success, 1 the thing checked is invalid or the server refused, 2 usage or
//! environment errors.

mod client;
mod doctor;
mod offline;
mod serve;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

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
    Doctor,
    /// Run the skillbox server.
    Serve(serve::ServeArgs),
    #[command(flatten)]
    Client(client::ClientCommand),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Validate(a) => offline::validate(a),
        Command::Digest(a) => offline::digest(a),
        Command::Serve(a) => serve::run(a),
        Command::Doctor => doctor::run(cli.conn.json),
        Command::Client(c) => client::run(cli.conn, c),
    };
    match result {
        Ok(code) => code,
        Err(e) if e.downcast_ref::<client::ServerError>().is_some() => {
            eprintln!("error: {e}");
            ExitCode::from(1)
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}
