//! Skills and revisions: publish, list, show, revisions, cat, pull, diff, rollback, delete,
//! revoke.

use super::{Client, ServerError, print, split_spec};
use anyhow::{Context, anyhow, bail};
use reqwest::Method;
use serde::Serialize;
use skillbox_api::{
    CurrentMoved, MoveCurrent, Published, RevisionDetail, RevisionList, RevokeRequest, Revoked,
    SkillDeleted, SkillDetail, SkillList,
};
use skillbox_package::{FileEntry, Limits, Manifest, StagingDir, intake};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;

impl Client {
    async fn revision(&self, name: &str, rev: &str) -> anyhow::Result<RevisionDetail> {
        self.get(self.ws_url(&format!("skills/{name}/revisions/{rev}")))
            .await
    }

    /// The skill's current revision; 0 when there is no such skill (a publish creates it).
    async fn current_revision(&self, name: &str) -> anyhow::Result<i64> {
        match self
            .get::<SkillDetail>(self.ws_url(&format!("skills/{name}")))
            .await
        {
            Ok(v) => Ok(v.summary.current_revision),
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

pub(super) async fn list(c: &Client, j: bool) -> anyhow::Result<()> {
    let v: SkillList = c.get(c.ws_url("skills")).await?;
    print(j, &v, || {
        let mut s = String::new();
        for k in &v.skills {
            s.push_str(&format!(
                "{:<32} r{:<5} {}\n",
                k.name,
                k.current_revision,
                k.description.as_deref().unwrap_or("")
            ));
        }
        s.trim_end().to_string()
    });
    Ok(())
}

pub(super) async fn show(c: &Client, name: &str, j: bool) -> anyhow::Result<()> {
    let v: SkillDetail = c.get(c.ws_url(&format!("skills/{name}"))).await?;
    print(j, &v, || {
        serde_json::to_string_pretty(&v).unwrap_or_default()
    });
    Ok(())
}

pub(super) async fn revisions(c: &Client, name: &str, j: bool) -> anyhow::Result<()> {
    let v: RevisionList = c.get(c.ws_url(&format!("skills/{name}/revisions"))).await?;
    print(j, &v, || {
        let mut s = String::new();
        for r in &v.revisions {
            s.push_str(&format!(
                "r{:<5} {:<10} parent r{:<4} {} {}\n",
                r.revision, r.state, r.parent_revision, r.digest, r.publisher
            ));
        }
        s.trim_end().to_string()
    });
    Ok(())
}

pub(super) async fn cat(c: &Client, spec: &str, path: &str) -> anyhow::Result<()> {
    let (name, rev) = split_spec(spec);
    let bytes = c
        .bytes(c.ws_url(&format!("skills/{name}/revisions/{rev}/files/{path}")))
        .await?;
    std::io::stdout().write_all(&bytes)?;
    Ok(())
}

pub(super) async fn rollback(c: &Client, name: &str, revision: i64, j: bool) -> anyhow::Result<()> {
    let base = c.current_revision(name).await?;
    let v: CurrentMoved = c
        .send_json(
            Method::PUT,
            c.ws_url(&format!("skills/{name}/current")),
            &MoveCurrent {
                revision,
                base_revision: base,
            },
        )
        .await?;
    print(j, &v, || {
        format!("{name}: current revision r{base} → r{revision}")
    });
    Ok(())
}

pub(super) async fn delete(c: &Client, name: &str, j: bool) -> anyhow::Result<()> {
    let v: SkillDeleted = c
        .call(c.req(Method::DELETE, c.ws_url(&format!("skills/{name}"))))
        .await?;
    print(j, &v, || format!("{name}: deleted"));
    Ok(())
}

pub(super) async fn revoke(c: &Client, spec: &str, reason: String, j: bool) -> anyhow::Result<()> {
    let (name, rev) = spec
        .split_once('@')
        .ok_or_else(|| anyhow!("use NAME@REV"))?;
    let v: Revoked = c
        .send_json(
            Method::POST,
            c.ws_url(&format!("skills/{name}/revisions/{rev}/revoke")),
            &RevokeRequest { reason },
        )
        .await?;
    print(j, &v, || {
        format!(
            "revoked {name}@r{}; current revision is now r{}",
            v.revision, v.current_revision
        )
    });
    Ok(())
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

pub(super) async fn publish(
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
            Method::POST,
            c.ws_url(&format!("skills/{name}/revisions?base_revision={base}")),
        )
        .header(reqwest::header::CONTENT_TYPE, ct)
        .header(reqwest::header::CONTENT_LENGTH, total)
        .body(reqwest::Body::wrap_stream(stream));
    let result = c.call::<Published>(rb).await;
    bar.finish_and_clear();
    let v = result?;
    print(c.conn.json, &v, || {
        let mut s = format!(
            "published {}@r{} {} ({} files, {} bytes){}",
            v.name,
            v.revision,
            v.digest,
            v.file_count,
            v.size,
            if v.replayed {
                " (already published)"
            } else {
                ""
            }
        );
        for w in &v.warnings {
            s.push_str(&format!(
                "\n  warning: {}: {}",
                w.field.as_deref().or(w.path.as_deref()).unwrap_or(""),
                w.message
            ));
        }
        s
    });
    Ok(())
}

/// What `pull` reports.
#[derive(Serialize)]
struct Pulled<'a> {
    skill: &'a str,
    revision: i64,
    digest: &'a str,
    dir: &'a Path,
    verified: bool,
}

pub(super) async fn pull(c: &Client, spec: &str, dir: &Path, j: bool) -> anyhow::Result<()> {
    let (name, rev) = split_spec(spec);
    let meta = c.revision(name, rev).await?;
    let tar = c
        .bytes(c.ws_url(&format!(
            "skills/{name}/revisions/{}/archive",
            meta.revision.revision
        )))
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
    if got != meta.revision.digest {
        bail!(
            "verification failed: downloaded content has digest {got}, revision says {}; nothing written",
            meta.revision.digest
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
    let v = Pulled {
        skill: name,
        revision: meta.revision.revision,
        digest: &meta.revision.digest,
        dir,
        verified: true,
    };
    print(j, &v, || {
        format!(
            "pulled {name}@r{} into {} (verified {})",
            meta.revision.revision,
            dir.display(),
            meta.revision.digest
        )
    });
    Ok(())
}

/// One side of a diff.
#[derive(Serialize)]
struct DiffSide<'a> {
    skill: &'a str,
    revision: i64,
    digest: &'a str,
}

/// What `diff --json` reports.
#[derive(Serialize)]
struct Diff<'a> {
    a: DiffSide<'a>,
    b: DiffSide<'a>,
    added: Vec<&'a String>,
    removed: Vec<&'a String>,
    modified: Vec<&'a String>,
}

pub(super) async fn diff(c: &Client, a: &str, b: &str, j: bool) -> anyhow::Result<()> {
    let (na, ra) = split_spec(a);
    let (nb, rb) = split_spec(b);
    let (ma, mb) = (c.revision(na, ra).await?, c.revision(nb, rb).await?);
    let index = |m: &RevisionDetail| -> BTreeMap<String, FileEntry> {
        m.manifest
            .iter()
            .map(|e| (e.path.clone(), e.clone()))
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
        let d = Diff {
            a: DiffSide {
                skill: na,
                revision: ma.revision.revision,
                digest: &ma.revision.digest,
            },
            b: DiffSide {
                skill: nb,
                revision: mb.revision.revision,
                digest: &mb.revision.digest,
            },
            added,
            removed,
            modified,
        };
        outln!("{}", serde_json::to_string(&d)?);
        return Ok(());
    }
    outln!(
        "{na}@r{} → {nb}@r{}: {} added, {} removed, {} modified",
        ma.revision.revision,
        mb.revision.revision,
        added.len(),
        removed.len(),
        modified.len()
    );
    for p in &added {
        outln!("  A {p}");
    }
    for p in &removed {
        outln!("  D {p}");
    }
    for p in &modified {
        outln!("  M {p}");
    }
    for p in modified {
        let file =
            |n: &str, r: i64| c.bytes(c.ws_url(&format!("skills/{n}/revisions/{r}/files/{p}")));
        let old = file(na, ma.revision.revision).await?;
        let new = file(nb, mb.revision.revision).await?;
        match (std::str::from_utf8(&old), std::str::from_utf8(&new)) {
            (Ok(o), Ok(n)) => {
                let d = similar::TextDiff::from_lines(o, n);
                out!(
                    "{}",
                    d.unified_diff()
                        .header(&format!("a/{p}"), &format!("b/{p}"))
                );
            }
            _ => outln!("Binary files a/{p} and b/{p} differ"),
        }
    }
    Ok(())
}
