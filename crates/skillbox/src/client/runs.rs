//! `run …`: create a run, activate (pin) skills, read pinned files, execute, finish.

use super::{Client, print};
use reqwest::Method;
use skillbox_api::{
    Activate, Activation, CreateRun, CreateRunDraft, ExecAnswer, ExecRequest, Prompt,
    RunDraftCreated, RunView,
};
use std::io::Write;
use std::process::ExitCode;

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

/// The exit status `run exec` ends with, as a shell would report the command: its exit code,
/// 124 when it timed out (as `timeout(1)`), 128+N when signal N killed it.
fn command_status(v: &ExecAnswer) -> u8 {
    if v.timed_out {
        return 124;
    }
    if let Some(code) = v.exit_code {
        return (code & 0xff) as u8;
    }
    match v.signal {
        Some(sig) => (128 + sig).clamp(0, 255) as u8,
        // Killed by a revocation, or the sandbox failed: not the command's own status.
        None => 125,
    }
}

pub(super) async fn run(c: &Client, r: RunCommand, j: bool) -> anyhow::Result<ExitCode> {
    match r {
        RunCommand::Create {
            skills,
            ttl,
            require_immutable,
        } => {
            let body = CreateRun {
                skills: (!skills.is_empty()).then_some(skills),
                ttl_seconds: ttl,
                require_immutable,
            };
            let v: RunView = c.send_json(Method::POST, c.ws_url("runs"), &body).await?;
            print(j, &v, || v.run_id.clone());
        }
        RunCommand::Show { run } => {
            let v: RunView = c.get(c.ws_url(&format!("runs/{run}"))).await?;
            print(j, &v, || {
                serde_json::to_string_pretty(&v).unwrap_or_default()
            });
        }
        RunCommand::Activate {
            run,
            skill,
            revision,
        } => {
            let v: Activation = c
                .send_json(
                    Method::POST,
                    c.ws_url(&format!("runs/{run}/activations")),
                    &Activate { skill, revision },
                )
                .await?;
            print(j, &v, || {
                format!(
                    "{}@r{} {} mounted at {}\n\n{}",
                    v.skill, v.revision, v.digest, v.mount_path, v.instructions
                )
            });
        }
        RunCommand::Read { run, skill, path } => {
            let bytes = c
                .bytes(c.ws_url(&format!("runs/{run}/skills/{skill}/files/{path}")))
                .await?;
            std::io::stdout().write_all(&bytes)?;
        }
        RunCommand::Prompt { run } => {
            let v: Prompt = c.get(c.ws_url(&format!("runs/{run}/prompt"))).await?;
            print(j, &v, || v.prompt.trim_end().to_string());
        }
        RunCommand::Heartbeat { run } => {
            let v: RunView = c
                .call(c.req(Method::POST, c.ws_url(&format!("runs/{run}/heartbeat"))))
                .await?;
            print(j, &v, || {
                format!("{} {} until {}", v.run_id, v.state, v.expires_at)
            });
        }
        RunCommand::Draft { run, skill, base } => {
            let v: RunDraftCreated = c
                .send_json(
                    Method::POST,
                    c.ws_url(&format!("runs/{run}/drafts")),
                    &CreateRunDraft {
                        skill,
                        base_revision: base,
                    },
                )
                .await?;
            print(j, &v, || {
                format!(
                    "{} {} (base revision {})",
                    v.draft_id, v.path, v.base_revision
                )
            });
        }
        RunCommand::Exec {
            run,
            skill,
            timeout_ms,
            argv,
        } => {
            let v: ExecAnswer = c
                .send_json(
                    Method::POST,
                    c.ws_url(&format!("runs/{run}/exec")),
                    &ExecRequest {
                        skill,
                        argv: Some(argv),
                        timeout_ms,
                        ..Default::default()
                    },
                )
                .await?;
            if j {
                outln!("{}", serde_json::to_string(&v)?);
            } else {
                // The command's own bytes, each stream to its own, nothing added.
                std::io::stdout().write_all(v.stdout.as_deref().unwrap_or("").as_bytes())?;
                std::io::stdout().flush()?;
                std::io::stderr().write_all(v.stderr.as_deref().unwrap_or("").as_bytes())?;
            }
            return Ok(ExitCode::from(command_status(&v)));
        }
        RunCommand::Finish { run } => {
            let v: RunView = c
                .call(c.req(Method::DELETE, c.ws_url(&format!("runs/{run}"))))
                .await?;
            print(j, &v, || format!("{} {}", v.run_id, v.state));
        }
    }
    Ok(ExitCode::SUCCESS)
}
