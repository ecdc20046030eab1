//! `draft …`: create, show, edit, rebase, publish and delete drafts.

use super::{Client, print};
use anyhow::Context;
use reqwest::Method;
use serde::Serialize;
use skillbox_api::{CreateDraft, DraftCreated, DraftDetail, DraftFile, Published, Rebase};
use std::io::Write;
use std::path::PathBuf;

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

/// What a draft command answers (`--json` prints it as is).
#[derive(Serialize)]
#[serde(untagged)]
enum DraftAnswer {
    Created(DraftCreated),
    Detail(DraftDetail),
    File(DraftFile),
    Published(Published),
    Removed { draft_id: String, removed: String },
    Deleted { draft_id: String, deleted: bool },
}

pub(super) async fn run(c: &Client, d: DraftCommand, j: bool) -> anyhow::Result<()> {
    let v = match d {
        DraftCommand::Create { skill, base } => DraftAnswer::Created(
            c.send_json(
                Method::POST,
                c.ws_url("drafts"),
                &CreateDraft {
                    skill,
                    base_revision: base,
                },
            )
            .await?,
        ),
        DraftCommand::Show { id } => {
            DraftAnswer::Detail(c.get(c.ws_url(&format!("drafts/{id}"))).await?)
        }
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
            DraftAnswer::File(
                c.call(
                    c.req(
                        Method::PUT,
                        c.ws_url(&format!("drafts/{id}/files/{path}?executable={executable}")),
                    )
                    .body(bytes),
                )
                .await?,
            )
        }
        DraftCommand::Get { id, path } => {
            let bytes = c
                .bytes(c.ws_url(&format!("drafts/{id}/files/{path}")))
                .await?;
            std::io::stdout().write_all(&bytes)?;
            return Ok(());
        }
        DraftCommand::Rm { id, path } => {
            c.send(c.req(
                Method::DELETE,
                c.ws_url(&format!("drafts/{id}/files/{path}")),
            ))
            .await?;
            DraftAnswer::Removed {
                draft_id: id,
                removed: path,
            }
        }
        DraftCommand::Rebase { id, base } => DraftAnswer::Created(
            c.send_json(
                Method::PUT,
                c.ws_url(&format!("drafts/{id}")),
                &Rebase {
                    base_revision: base,
                },
            )
            .await?,
        ),
        DraftCommand::Publish { id } => DraftAnswer::Published(
            c.call(c.req(Method::POST, c.ws_url(&format!("drafts/{id}/publish"))))
                .await?,
        ),
        DraftCommand::Delete { id } => {
            c.send(c.req(Method::DELETE, c.ws_url(&format!("drafts/{id}"))))
                .await?;
            DraftAnswer::Deleted {
                draft_id: id,
                deleted: true,
            }
        }
    };
    print(j, &v, || {
        serde_json::to_string_pretty(&v).unwrap_or_default()
    });
    Ok(())
}
