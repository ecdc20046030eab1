//! Runs (SPEC §4.3–4.4, §4.9): an authorized skill set, a lease, and pins made by activation.
//!
//! A pin (run, skill id, revision, digest) is written once, in the same transaction that
//! checks the run, the authorization, the skill and the revision; it never changes. Every
//! instruction, read (and, with the box, execution) of the run goes through it: a run is never
//! re-resolved by name. The revision row is locked while the pin is written
//! (`UPDATE … SET state = state … RETURNING`) so a concurrent collection or revocation is
//! ordered before or after the activation, never interleaved with it.

use crate::Registry;
use crate::error::{RegistryError, Result};
use crate::meta::{new_id, now_ms};
use crate::reads::FileContent;
use skillbox_api::{Activation, Pin, RunView};
use skillbox_package::{Digest, FileEntry};
use sqlx::Row;
use std::sync::Arc;

pub const DEFAULT_TTL_SECONDS: u64 = 3600;
pub const MAX_TTL_SECONDS: u64 = 7 * 24 * 3600;

/// The sandbox path of a pinned revision.
pub fn mount_path(skill_id: &str, revision: i64) -> String {
    format!("/skills/{skill_id}/{revision}")
}

struct RunRow {
    state: String,
    ttl_ms: i64,
    expires_at: i64,
    require_immutable: bool,
    created_at: i64,
}

async fn run_row(tx: &mut crate::meta::Tx, workspace: &str, id: &str) -> Result<Option<RunRow>> {
    let row = sqlx::query("SELECT state, ttl_ms, expires_at, require_immutable, created_at FROM runs WHERE id = $1 AND workspace = $2")
        .bind(id)
        .bind(workspace)
        .fetch_optional(&mut **tx)
        .await?;
    row.map(|r| {
        let ri: i64 = r.try_get(3)?;
        Ok(RunRow {
            state: r.try_get(0)?,
            ttl_ms: r.try_get(1)?,
            expires_at: r.try_get(2)?,
            require_immutable: ri != 0,
            created_at: r.try_get(4)?,
        })
    })
    .transpose()
}

fn run_state_error(id: &str, state: &str) -> RegistryError {
    RegistryError::NotFound(format!("run {id} is {state}; create a new run"))
}

/// The run's state as of `now` (a lapsed lease reads as `expired` before the sweep marks it).
fn effective_state(r: &RunRow, now: i64) -> &str {
    if r.state == "active" && r.expires_at <= now {
        "expired"
    } else {
        &r.state
    }
}

impl Registry {
    /// Creates a run authorized for `skills` (default: every active skill of the workspace).
    pub async fn create_run(
        &self,
        workspace: &str,
        skills: Option<Vec<String>>,
        ttl_seconds: Option<u64>,
        require_immutable: bool,
    ) -> Result<RunView> {
        if !skillbox_package::is_valid_name(workspace) {
            return Err(RegistryError::BadRequest(format!(
                "invalid workspace name {workspace:?}"
            )));
        }
        let ttl = ttl_seconds.unwrap_or(DEFAULT_TTL_SECONDS);
        if ttl == 0 || ttl > MAX_TTL_SECONDS {
            return Err(RegistryError::BadRequest(format!(
                "ttl_seconds must be between 1 and {MAX_TTL_SECONDS}"
            )));
        }
        let mut authorized = Vec::new();
        match skills {
            None => {
                for s in self.meta.list_skills(workspace).await? {
                    authorized.push((s.name, s.id));
                }
            }
            Some(names) => {
                for name in names {
                    match self.meta.active_skill(workspace, &name).await? {
                        Some(s) => authorized.push((s.name, s.id)),
                        None if self.meta.deleted_skill(workspace, &name).await?.is_some() => {
                            return Err(RegistryError::SkillDeleted(format!(
                                "skill {name:?} is deleted; new runs cannot use it"
                            )));
                        }
                        None => {
                            return Err(RegistryError::NotFound(format!(
                                "no skill {name:?} in workspace {workspace:?}"
                            )));
                        }
                    }
                }
            }
        }
        authorized.sort();
        authorized.dedup();
        let id = format!("run_{}", new_id());
        let now = now_ms();
        let ttl_ms = (ttl * 1000) as i64;
        let mut tx = self.meta.write_tx().await?;
        sqlx::query("INSERT INTO runs (id, workspace, state, ttl_ms, expires_at, require_immutable, created_at) VALUES ($1, $2, 'active', $3, $4, $5, $6)")
            .bind(&id)
            .bind(workspace)
            .bind(ttl_ms)
            .bind(now + ttl_ms)
            .bind(require_immutable as i64)
            .bind(now)
            .execute(&mut *tx)
            .await?;
        for (name, skill_id) in &authorized {
            sqlx::query(
                "INSERT INTO run_skills (run_id, skill_name, skill_id) VALUES ($1, $2, $3)",
            )
            .bind(&id)
            .bind(name)
            .bind(skill_id)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        self.run(workspace, &id).await
    }

    /// A run with its activations.
    pub async fn run(&self, workspace: &str, id: &str) -> Result<RunView> {
        let mut tx = self.meta.pool().begin().await?;
        let r = run_row(&mut tx, workspace, id).await?.ok_or_else(|| {
            RegistryError::NotFound(format!("no run {id:?} in workspace {workspace:?}"))
        })?;
        let names =
            sqlx::query("SELECT skill_name FROM run_skills WHERE run_id = $1 ORDER BY skill_name")
                .bind(id)
                .fetch_all(&mut *tx)
                .await?;
        let pins = sqlx::query("SELECT skill_name, skill_id, revision, digest, activated_at FROM pins WHERE run_id = $1 ORDER BY activated_at, skill_name")
            .bind(id)
            .fetch_all(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(RunView {
            run_id: id.to_string(),
            state: effective_state(&r, now_ms()).to_string(),
            authorized_skills: names
                .iter()
                .map(|n| n.try_get(0))
                .collect::<Result<_, _>>()?,
            expires_at: r.expires_at,
            ttl_seconds: r.ttl_ms / 1000,
            require_immutable: r.require_immutable,
            created_at: r.created_at,
            activations: pins
                .iter()
                .map(|p| {
                    Ok(Pin {
                        skill: p.try_get(0)?,
                        skill_id: p.try_get(1)?,
                        revision: p.try_get(2)?,
                        digest: p.try_get(3)?,
                        activated_at: p.try_get(4)?,
                    })
                })
                .collect::<Result<_>>()?,
        })
    }

    /// Renews the lease when less than half of it is left (so hot paths write rarely).
    async fn touch_lease(&self, id: &str, ttl_ms: i64, expires_at: i64) -> Result<()> {
        let now = now_ms();
        if expires_at - now < ttl_ms / 2 {
            sqlx::query("UPDATE runs SET expires_at = $2 WHERE id = $1 AND state = 'active' AND expires_at > $3")
                .bind(id)
                .bind(now + ttl_ms)
                .bind(now)
                .execute(self.meta.writer())
                .await?;
        }
        Ok(())
    }

    /// Activation: pins the skill's current (or the requested) revision to the run, once.
    pub async fn activate(
        &self,
        workspace: &str,
        run_id: &str,
        skill: &str,
        requested: Option<i64>,
    ) -> Result<Activation> {
        let now = now_ms();
        // Re-activation is the common case and needs no write: answer it from a read.
        if let Some((skill_id, revision, digest, ttl_ms, expires_at)) =
            self.existing_pin(workspace, run_id, skill, now).await?
        {
            if let Some(req) = requested.filter(|r| *r != revision) {
                return Err(RegistryError::ActivationConflict {
                    skill: skill.to_string(),
                    pinned_revision: revision,
                    requested_revision: req,
                });
            }
            return self
                .activation(
                    skill, skill_id, revision, digest, run_id, ttl_ms, expires_at,
                )
                .await;
        }
        let mut tx = self.meta.write_tx().await?;
        let run = run_row(&mut tx, workspace, run_id).await?.ok_or_else(|| {
            RegistryError::NotFound(format!("no run {run_id:?} in workspace {workspace:?}"))
        })?;
        let state = effective_state(&run, now);
        if state != "active" {
            return Err(run_state_error(run_id, state));
        }
        let skill_id: String =
            sqlx::query("SELECT skill_id FROM run_skills WHERE run_id = $1 AND skill_name = $2")
                .bind(run_id)
                .bind(skill)
                .fetch_optional(&mut *tx)
                .await?
                .map(|r| r.try_get(0))
                .transpose()?
                .ok_or_else(|| {
                    RegistryError::SkillNotAuthorized(format!(
                        "skill {skill:?} is not in this run's authorized set"
                    ))
                })?;
        let existing =
            sqlx::query("SELECT revision, digest FROM pins WHERE run_id = $1 AND skill_id = $2")
                .bind(run_id)
                .bind(&skill_id)
                .fetch_optional(&mut *tx)
                .await?;
        let (revision, digest) = if let Some(pin) = existing {
            let (revision, digest): (i64, String) = (pin.try_get(0)?, pin.try_get(1)?);
            if let Some(req) = requested.filter(|r| *r != revision) {
                return Err(RegistryError::ActivationConflict {
                    skill: skill.to_string(),
                    pinned_revision: revision,
                    requested_revision: req,
                });
            }
            tx.commit().await?;
            (revision, digest)
        } else {
            let srow = sqlx::query("SELECT state, current_revision FROM skills WHERE id = $1")
                .bind(&skill_id)
                .fetch_one(&mut *tx)
                .await?;
            let (sstate, current): (String, i64) = (srow.try_get(0)?, srow.try_get(1)?);
            if sstate != "active" {
                return Err(RegistryError::SkillDeleted(format!(
                    "skill {skill:?} was deleted; it cannot be activated in new work"
                )));
            }
            let target = match requested {
                Some(r) => r,
                None if current == 0 => {
                    return Err(RegistryError::NotFound(format!(
                        "skill {skill:?} has no current revision"
                    )));
                }
                None => current,
            };
            // Locks the revision row: collection and revocation serialize with this pin.
            let locked = sqlx::query("UPDATE revisions SET state = state WHERE skill_id = $1 AND revision = $2 AND state = 'available' RETURNING digest")
                .bind(&skill_id)
                .bind(target)
                .fetch_optional(&mut *tx)
                .await?;
            let Some(locked) = locked else {
                let st: Option<String> = sqlx::query(
                    "SELECT state FROM revisions WHERE skill_id = $1 AND revision = $2",
                )
                .bind(&skill_id)
                .bind(target)
                .fetch_optional(&mut *tx)
                .await?
                .map(|r| r.try_get(0))
                .transpose()?;
                return Err(match st.as_deref() {
                    Some("revoked") => RegistryError::RevisionRevoked(format!(
                        "revision {target} of {skill:?} is revoked"
                    )),
                    Some(other) => RegistryError::NotFound(format!(
                        "revision {target} of {skill:?} is {other}"
                    )),
                    None => {
                        RegistryError::NotFound(format!("skill {skill:?} has no revision {target}"))
                    }
                });
            };
            let digest: String = locked.try_get(0)?;
            sqlx::query("INSERT INTO pins (run_id, skill_id, skill_name, revision, digest, activated_at) VALUES ($1, $2, $3, $4, $5, $6)")
                .bind(run_id)
                .bind(&skill_id)
                .bind(skill)
                .bind(target)
                .bind(&digest)
                .bind(now)
                .execute(&mut *tx)
                .await?;
            sqlx::query("UPDATE runs SET expires_at = $2 WHERE id = $1")
                .bind(run_id)
                .bind(now + run.ttl_ms)
                .execute(&mut *tx)
                .await?;
            tx.commit().await?;
            (target, digest)
        };
        self.activation(
            skill,
            skill_id,
            revision,
            digest,
            run_id,
            run.ttl_ms,
            run.expires_at,
        )
        .await
    }

    /// The pin of `skill` in a live run, read without a write transaction.
    async fn existing_pin(
        &self,
        workspace: &str,
        run_id: &str,
        skill: &str,
        now: i64,
    ) -> Result<Option<(String, i64, String, i64, i64)>> {
        let row = sqlx::query(
            "SELECT p.skill_id, p.revision, p.digest, r.ttl_ms, r.expires_at FROM runs r
             JOIN pins p ON p.run_id = r.id AND p.skill_name = $3
             WHERE r.id = $1 AND r.workspace = $2 AND r.state = 'active' AND r.expires_at > $4",
        )
        .bind(run_id)
        .bind(workspace)
        .bind(skill)
        .bind(now)
        .fetch_optional(self.meta.pool())
        .await?;
        row.map(|r| {
            Ok((
                r.try_get(0)?,
                r.try_get(1)?,
                r.try_get(2)?,
                r.try_get(3)?,
                r.try_get(4)?,
            ))
        })
        .transpose()
    }

    /// The answer to an activation of a pin.
    #[allow(clippy::too_many_arguments)]
    async fn activation(
        &self,
        skill: &str,
        skill_id: String,
        revision: i64,
        digest: String,
        run_id: &str,
        ttl_ms: i64,
        expires_at: i64,
    ) -> Result<Activation> {
        let (rev_row, manifest, instructions) = self
            .pinned_content(skill, &skill_id, revision, &digest)
            .await?;
        self.touch_lease(run_id, ttl_ms, expires_at).await?;
        Ok(Activation {
            skill: skill.to_string(),
            skill_id: skill_id.clone(),
            revision,
            digest,
            instructions: instructions.to_string(),
            frontmatter: rev_row.frontmatter,
            files: manifest.entries().to_vec(),
            mount_path: mount_path(&skill_id, revision),
        })
    }

    /// The pinned revision's row, manifest and instructions, or why they are unavailable.
    async fn pinned_content(
        &self,
        skill: &str,
        skill_id: &str,
        revision: i64,
        digest: &str,
    ) -> Result<(
        crate::meta::Revision,
        Arc<skillbox_package::Manifest>,
        Arc<String>,
    )> {
        let unavailable = |reason: String| RegistryError::PinnedRevisionUnavailable {
            skill: skill.to_string(),
            skill_id: skill_id.to_string(),
            revision,
            reason,
        };
        let row = self
            .meta
            .revision(skill_id, revision)
            .await?
            .ok_or_else(|| unavailable("the revision no longer exists".into()))?;
        match row.state.as_str() {
            "available" => {}
            "revoked" => {
                return Err(RegistryError::RevisionRevoked(format!(
                    "revision {revision} of {skill:?} is revoked: {}",
                    row.state_reason.as_deref().unwrap_or("no reason given")
                )));
            }
            other => return Err(unavailable(format!("it was {other}"))),
        }
        let d: Digest = digest.parse().map_err(RegistryError::internal)?;
        let manifest = self
            .manifest(&d)
            .await
            .map_err(|e| unavailable(format!("its manifest cannot be loaded ({e})")))?;
        let instructions = self
            .instructions(&d, &manifest)
            .await
            .map_err(|e| unavailable(format!("its SKILL.md cannot be read ({e})")))?;
        Ok((row, manifest, instructions))
    }

    /// A file of the run's pinned revision of `skill`: no re-resolution, no rescanning.
    pub async fn pinned_file(
        &self,
        workspace: &str,
        run_id: &str,
        skill: &str,
        path: &str,
    ) -> Result<(FileEntry, FileContent)> {
        let now = now_ms();
        let key = (workspace.to_string(), run_id.to_string(), skill.to_string());
        let pin = match self.pin_cache.get(&key).filter(|p| p.expires_at > now) {
            Some(p) => p,
            None => self.resolve_pin(key.clone(), now).await?,
        };
        let entry = pin.manifest.get(path).cloned().ok_or_else(|| {
            RegistryError::NotFound(format!(
                "revision {} of {skill:?} has no file {path:?}",
                pin.revision
            ))
        })?;
        if pin.expires_at - now < pin.ttl_ms / 2 {
            self.touch_lease(run_id, pin.ttl_ms, pin.expires_at).await?;
            self.pin_cache.forget(&key);
        }
        match self.file_content(&pin.digest, &entry).await? {
            Some(content) => Ok((entry, content)),
            None => Err(RegistryError::PinnedRevisionUnavailable {
                skill: skill.to_string(),
                skill_id: pin.skill_id.clone(),
                revision: pin.revision,
                reason: "its content is missing from the store".into(),
            }),
        }
    }

    /// Resolves a pin from the database, checking the run and the revision, and caches it.
    async fn resolve_pin(&self, key: PinKey, now: i64) -> Result<Arc<CachedPin>> {
        let (workspace, run_id, skill) = (&key.0, &key.1, &key.2);
        let generation = self.pin_cache.generation();
        let row = sqlx::query(
            "SELECT r.state, r.expires_at, r.ttl_ms, p.skill_id, p.revision, p.digest, v.state, v.state_reason
             FROM runs r
             LEFT JOIN pins p ON p.run_id = r.id AND p.skill_name = $3
             LEFT JOIN revisions v ON v.skill_id = p.skill_id AND v.revision = p.revision
             WHERE r.id = $1 AND r.workspace = $2",
        )
        .bind(run_id)
        .bind(workspace)
        .bind(skill)
        .fetch_optional(self.meta.pool())
        .await?
        .ok_or_else(|| RegistryError::NotFound(format!("no run {run_id:?} in workspace {workspace:?}")))?;
        let rstate: String = row.try_get(0)?;
        let expires_at: i64 = row.try_get(1)?;
        let ttl_ms: i64 = row.try_get(2)?;
        if rstate != "active" || expires_at <= now {
            return Err(run_state_error(
                run_id,
                if rstate == "active" {
                    "expired"
                } else {
                    &rstate
                },
            ));
        }
        let skill_id: Option<String> = row.try_get(3)?;
        let Some(skill_id) = skill_id else {
            return Err(RegistryError::NotActivated(format!(
                "skill {skill:?} is not activated in run {run_id}; activate it first"
            )));
        };
        let revision: i64 = row.try_get(4)?;
        let digest: String = row.try_get(5)?;
        let vstate: Option<String> = row.try_get(6)?;
        let unavailable = |reason: &str| RegistryError::PinnedRevisionUnavailable {
            skill: skill.to_string(),
            skill_id: skill_id.clone(),
            revision,
            reason: reason.to_string(),
        };
        match vstate.as_deref() {
            Some("available") => {}
            Some("revoked") => {
                let reason: Option<String> = row.try_get(7)?;
                return Err(RegistryError::RevisionRevoked(format!(
                    "revision {revision} of {skill:?} is revoked: {}",
                    reason.as_deref().unwrap_or("no reason given")
                )));
            }
            Some(other) => return Err(unavailable(&format!("it was {other}"))),
            None => return Err(unavailable("the revision no longer exists")),
        }
        let d: Digest = digest.parse().map_err(RegistryError::internal)?;
        let manifest = self
            .manifest(&d)
            .await
            .map_err(|_| unavailable("its manifest is missing from the content store"))?;
        let pin = Arc::new(CachedPin {
            skill_id,
            revision,
            digest: d,
            expires_at,
            ttl_ms,
            manifest,
        });
        self.pin_cache.put(key, generation, pin.clone());
        Ok(pin)
    }

    /// The authorized skills' index for a system prompt, ordered by name. A pinned skill shows
    /// its pinned revision's description; others their current one; deleted unpinned skills
    /// are left out (they cannot be activated).
    pub async fn prompt(
        &self,
        workspace: &str,
        run_id: &str,
    ) -> Result<(String, Vec<(String, String)>)> {
        let view = self.run(workspace, run_id).await?;
        if view.state != "active" {
            return Err(run_state_error(run_id, &view.state));
        }
        let mut entries = Vec::new();
        let mut locations = Vec::new();
        let ids = sqlx::query(
            "SELECT skill_name, skill_id FROM run_skills WHERE run_id = $1 ORDER BY skill_name",
        )
        .bind(run_id)
        .fetch_all(self.meta.pool())
        .await?;
        for r in ids {
            let (name, id): (String, String) = (r.try_get(0)?, r.try_get(1)?);
            let pinned = view.activations.iter().find(|p| p.skill_id == id);
            let revision = match pinned {
                Some(p) => Some(p.revision),
                None => match self.meta.skill_by_id(&id).await? {
                    Some(s) if s.state == "active" && s.current_revision > 0 => {
                        Some(s.current_revision)
                    }
                    _ => None,
                },
            };
            let Some(revision) = revision else { continue };
            if let Some(row) = self.meta.revision(&id, revision).await? {
                let desc = row
                    .frontmatter
                    .get("description")
                    .and_then(|d| d.as_str())
                    .unwrap_or("")
                    .trim()
                    .to_string();
                // A pinned skill's instructions are at a fixed path in the run's sandbox.
                let location =
                    pinned.map(|p| format!("{}/SKILL.md", mount_path(&p.skill_id, p.revision)));
                locations.push(location);
                entries.push((name, desc));
            }
        }
        // No skill, no block: an empty index would only tell the model there is nothing.
        if entries.is_empty() {
            return Ok((String::new(), entries));
        }
        let mut text = String::from("<available_skills>\n");
        for ((name, desc), location) in entries.iter().zip(&locations) {
            text.push_str(&format!(
                "<skill>\n<name>{}</name>\n<description>{}</description>\n",
                xml_escape(name),
                xml_escape(desc)
            ));
            if let Some(location) = location {
                text.push_str(&format!("<location>{}</location>\n", xml_escape(location)));
            }
            text.push_str("</skill>\n");
        }
        text.push_str("</available_skills>\n");
        Ok((text, entries))
    }

    pub async fn heartbeat(&self, workspace: &str, run_id: &str) -> Result<RunView> {
        let now = now_ms();
        let done = sqlx::query("UPDATE runs SET expires_at = $3 + ttl_ms WHERE id = $1 AND workspace = $2 AND state = 'active' AND expires_at > $3 RETURNING id")
            .bind(run_id)
            .bind(workspace)
            .bind(now)
            .fetch_optional(self.meta.writer())
            .await?;
        if done.is_none() {
            let view = self.run(workspace, run_id).await?;
            return Err(run_state_error(run_id, &view.state));
        }
        self.run(workspace, run_id).await
    }

    /// Finishes a run: its pins stop being GC roots.
    pub async fn finish_run(&self, workspace: &str, run_id: &str) -> Result<RunView> {
        let view = self.finish_run_row(workspace, run_id).await;
        self.pin_cache.bump();
        view
    }

    async fn finish_run_row(&self, workspace: &str, run_id: &str) -> Result<RunView> {
        let now = now_ms();
        sqlx::query("UPDATE runs SET state = 'finished', ended_at = $3 WHERE id = $1 AND workspace = $2 AND state = 'active'")
            .bind(run_id)
            .bind(workspace)
            .bind(now)
            .execute(self.meta.writer())
            .await?;
        self.run(workspace, run_id).await
    }

    /// Whether run `id` (of any workspace) is active now: the box keeps its sandbox while it is.
    pub async fn run_is_live(&self, id: &str) -> Result<bool> {
        let row = sqlx::query(
            "SELECT 1 FROM runs WHERE id = $1 AND state = 'active' AND expires_at > $2",
        )
        .bind(id)
        .bind(now_ms())
        .fetch_optional(self.meta.pool())
        .await?;
        Ok(row.is_some())
    }

    /// Marks runs whose lease lapsed as `expired`; returns how many.
    pub async fn expire_runs(&self) -> Result<u64> {
        let now = now_ms();
        let r = sqlx::query("UPDATE runs SET state = 'expired', ended_at = expires_at WHERE state = 'active' AND expires_at <= $1")
            .bind(now)
            .execute(self.meta.writer())
            .await?;
        if r.rows_affected() > 0 {
            self.pin_cache.bump();
        }
        Ok(r.rows_affected())
    }
}

pub fn xml_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            c => out.push(c),
        }
    }
    out
}

/// (workspace, run id, skill name)
pub(crate) type PinKey = (String, String, String);

/// A resolved pin of a live run on an available revision, as of a cache generation.
pub(crate) struct CachedPin {
    skill_id: String,
    revision: i64,
    digest: Digest,
    expires_at: i64,
    ttl_ms: i64,
    manifest: Arc<skillbox_package::Manifest>,
}

/// Resolved pins, valid while the *generation* is unchanged. The generation is the length of
/// a file in the data directory that every change able to end a pinned read (finish, expiry,
/// revocation, collection) appends a byte to after committing — shared by every process on
/// the data directory, read with one `stat` per request. Entries are tagged with the
/// generation read *before* their database query, so a change racing a fill invalidates it.
/// With PostgreSQL (servers on several machines) the cache is off: every read asks the
/// database.
pub(crate) struct PinCache {
    path: std::path::PathBuf,
    enabled: bool,
    entries: std::sync::Mutex<std::collections::HashMap<PinKey, (u64, Arc<CachedPin>)>>,
}

impl PinCache {
    pub(crate) fn new(path: std::path::PathBuf, enabled: bool) -> Self {
        PinCache {
            path,
            enabled,
            entries: Default::default(),
        }
    }

    pub(crate) fn generation(&self) -> u64 {
        std::fs::metadata(&self.path).map(|m| m.len()).unwrap_or(0)
    }

    fn get(&self, key: &PinKey) -> Option<Arc<CachedPin>> {
        if !self.enabled {
            return None;
        }
        let g = self.generation();
        let entries = self.entries.lock().ok()?;
        entries
            .get(key)
            .filter(|(eg, _)| *eg == g)
            .map(|(_, p)| p.clone())
    }

    fn put(&self, key: PinKey, generation: u64, pin: Arc<CachedPin>) {
        if !self.enabled || self.generation() != generation {
            return;
        }
        if let Ok(mut e) = self.entries.lock() {
            if e.len() >= 100_000 {
                e.clear();
            }
            e.insert(key, (generation, pin));
        }
    }

    fn forget(&self, key: &PinKey) {
        if let Ok(mut e) = self.entries.lock() {
            e.remove(key);
        }
    }

    /// Invalidates every cached pin in every process sharing the data directory.
    pub(crate) fn bump(&self) {
        use std::io::Write;
        let appended = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.path)
            .and_then(|mut f| f.write_all(b"."));
        if let Err(e) = appended {
            // Without the bump other processes could serve stale pins: turn caching off here
            // and say so loudly.
            tracing::error!(error = %e, path = %self.path.display(), "cannot bump the pin-cache generation");
            if let Ok(mut e) = self.entries.lock() {
                e.clear();
            }
        }
    }
}

/// What an execution of a run mounts.
#[derive(Debug, Clone)]
pub struct ExecContext {
    pub run: RunView,
    /// Every pin of the run, with its tree.
    pub pinned: Vec<PinnedTree>,
}

/// A pinned revision ready to mount: its tree in the revision cache and its manifest.
#[derive(Debug, Clone)]
pub struct PinnedTree {
    pub pin: Pin,
    pub tree: std::path::PathBuf,
    pub manifest: Arc<skillbox_package::Manifest>,
}

impl PinnedTree {
    /// Where the revision is mounted in the run's sandbox.
    pub fn mount_path(&self) -> String {
        mount_path(&self.pin.skill_id, self.pin.revision)
    }
}

impl Registry {
    /// What an execution of the run mounts: every pin with its revision-cache tree (rebuilt
    /// from the content store if it went missing). Revoked pins refuse the execution with
    /// `revision_revoked`; pins whose content is gone with `pinned_revision_unavailable`.
    pub async fn exec_context(&self, workspace: &str, run_id: &str) -> Result<ExecContext> {
        let view = self.run(workspace, run_id).await?;
        if view.state != "active" {
            return Err(run_state_error(run_id, &view.state));
        }
        let mut out = Vec::new();
        for pin in &view.activations {
            let (_, manifest, _) = self
                .pinned_content(&pin.skill, &pin.skill_id, pin.revision, &pin.digest)
                .await?;
            let d: Digest = pin.digest.parse().map_err(RegistryError::internal)?;
            let tree = self.cache.tree_path(&d);
            if !tree.is_dir() {
                let (cache, content) = (self.cache.clone(), self.content.clone());
                let rt = tokio::runtime::Handle::current();
                let m = manifest.clone();
                tokio::task::spawn_blocking(move || cache.ensure(&d, &m, None, &content, &rt))
                    .await
                    .map_err(RegistryError::internal)?
                    .map_err(|e| RegistryError::PinnedRevisionUnavailable {
                        skill: pin.skill.clone(),
                        skill_id: pin.skill_id.clone(),
                        revision: pin.revision,
                        reason: format!("its tree cannot be rebuilt ({e})"),
                    })?;
            }
            out.push(PinnedTree {
                pin: pin.clone(),
                tree,
                manifest,
            });
        }
        self.touch_lease(run_id, view.ttl_seconds * 1000, view.expires_at)
            .await?;
        Ok(ExecContext {
            run: view,
            pinned: out,
        })
    }
}
