//! Administration and the event log: events, gc, fsck, tokens.

use super::{Client, print};
use reqwest::Method;
use skillbox_api::{CreateToken, FsckReport, GcReport, GcRequest, TokenCreated};
use std::process::ExitCode;

#[derive(clap::Subcommand)]
pub enum TokenCommand {
    /// Mint a token (shown once): of the workspace (-w) for reader, author, runner or admin;
    /// of no workspace for node (an execution node's, for `skillbox node --token`).
    Create {
        /// reader, author, runner, admin or node.
        #[arg(long)]
        role: String,
    },
}

pub(super) async fn events(c: &Client, after: i64, follow: bool, j: bool) -> anyhow::Result<()> {
    let mut feed = c.events(after, follow).await?;
    while let Some(v) = feed.next().await? {
        print(j, &v, || format!("#{} {} {}", v.seq, v.kind, v.data));
    }
    Ok(())
}

pub(super) async fn gc(
    c: &Client,
    dry_run: bool,
    grace: Option<u64>,
    j: bool,
) -> anyhow::Result<()> {
    let v: GcReport = c
        .send_json(
            Method::POST,
            c.url("/v1/admin/gc"),
            &GcRequest {
                dry_run,
                grace_seconds: grace,
            },
        )
        .await?;
    print(j, &v, || {
        let mut s = format!(
            "{}{} revisions, {} trees, {} manifests, {} blobs, {} bytes freed",
            if dry_run {
                "would collect: "
            } else {
                "collected: "
            },
            v.revisions.len(),
            v.trees_removed,
            v.manifests_removed,
            v.blobs_removed,
            v.bytes_freed
        );
        for r in &v.revisions {
            s.push_str(&format!(
                "\n  {}/{}@r{} {}",
                r.workspace, r.skill, r.revision, r.digest
            ));
        }
        s
    });
    Ok(())
}

pub(super) async fn create_token(c: &Client, role: String, j: bool) -> anyhow::Result<()> {
    let body = CreateToken {
        workspace: (role != "node").then(|| c.workspace.clone()),
        role,
    };
    let v: TokenCreated = c
        .send_json(Method::POST, c.url("/v1/admin/tokens"), &body)
        .await?;
    print(j, &v, || v.token.clone());
    Ok(())
}

/// Exit status 1 when fsck found problems.
pub(super) async fn fsck(c: &Client, j: bool) -> anyhow::Result<ExitCode> {
    let v: FsckReport = c.call(c.req(Method::POST, c.url("/v1/admin/fsck"))).await?;
    print(j, &v, || {
        let mut s = format!(
            "{}: {} blobs, {} revisions, {} trees checked",
            if v.ok { "clean" } else { "PROBLEMS" },
            v.blobs_checked,
            v.revisions_checked,
            v.trees_checked
        );
        for p in &v.problems {
            s.push_str(&format!("\n  {}: {}", p.object, p.message));
        }
        s
    });
    Ok(if v.ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}
