//! Administration and the event log: events, gc, fsck, tokens.

use super::{Client, print};
use reqwest::Method;
use skillbox_api::{CreateToken, Event, FsckReport, GcReport, GcRequest, TokenCreated};
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
    use futures_util::StreamExt;
    let url = c.ws_url(&format!("events?after={after}&follow={follow}"));
    let resp = c.send(c.req(Method::GET, url)).await?;
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
            let v: Event = serde_json::from_str(data)?;
            print(j, &v, || format!("#{} {} {}", v.seq, v.kind, v.data));
        }
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
        workspace: (role != "node").then(|| c.conn.workspace.clone()),
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
