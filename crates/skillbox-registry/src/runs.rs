//! Runs (SPEC §4.3–4.4, §4.9): an authorized skill set, a lease, and pins made by activation.
//!
//! A pin (run, skill id, revision, digest) is written once, in the same transaction that
//! checks the run, the authorization, the skill and the revision; it never changes. Every
//! instruction, read (and, with the box, execution) of the run goes through it: a run is never
//! re-resolved by name. A concurrent collection or revocation is ordered before or after the
//! activation, never interleaved with it: on SQLite by the write lock; on PostgreSQL by
//! collection's lock on the pins table, and for a revocation by the pin cache's generation,
//! which makes every later use of a pin written during the revocation ask the database (see
//! `meta::runs::pin_insert`). A request outside the common case (`pin_the_long_way`) locks
//! the revision row itself (`UPDATE … SET state = state … RETURNING`).

use crate::Registry;
use crate::error::{RegistryError, Result};
use crate::meta::{PinRef, RevisionState, RunState, check_requested, run_state_error};
use crate::meta::{new_id, now_ms};
use crate::reads::FileContent;
use skillbox_api::{Activation, Pin, RunView};
use skillbox_package::{Digest, FileEntry};
use std::sync::Arc;

pub const DEFAULT_TTL_SECONDS: u64 = 3600;
pub const MAX_TTL_SECONDS: u64 = 7 * 24 * 3600;

/// `pinned_revision_unavailable`: `skill`'s pinned revision cannot be served, and why.
fn unavailable(
    skill: &str,
    skill_id: &str,
    revision: i64,
    reason: impl Into<String>,
) -> RegistryError {
    RegistryError::PinnedRevisionUnavailable {
        skill: skill.to_string(),
        skill_id: skill_id.to_string(),
        revision,
        reason: reason.into(),
    }
}

/// The sandbox path of a pinned revision.
pub fn mount_path(skill_id: &str, revision: i64) -> String {
    format!("/skills/{skill_id}/{revision}")
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
        self.meta
            .insert_run(&id, workspace, ttl_ms, require_immutable, &authorized, now)
            .await?;
        self.run(workspace, &id).await
    }

    /// A run with its activations.
    pub async fn run(&self, workspace: &str, id: &str) -> Result<RunView> {
        let record = self.meta.run(workspace, id).await?.ok_or_else(|| {
            RegistryError::NotFound(format!("no run {id:?} in workspace {workspace:?}"))
        })?;
        Ok(RunView {
            run_id: id.to_string(),
            state: record.row.state_at(now_ms()),
            authorized_skills: record
                .authorized
                .into_iter()
                .map(|(name, _)| name)
                .collect(),
            expires_at: record.row.expires_at,
            ttl_seconds: record.row.ttl_ms / 1000,
            require_immutable: record.row.require_immutable,
            created_at: record.row.created_at,
            activations: record.pins,
        })
    }

    /// The workspace's live runs with their activations, newest first (at most 500: a
    /// console's page, not an export).
    pub async fn live_runs(&self, workspace: &str) -> Result<Vec<RunView>> {
        let ids = self.meta.live_run_ids(workspace, now_ms(), 500).await?;
        let mut runs = Vec::with_capacity(ids.len());
        for id in ids {
            match self.run(workspace, &id).await {
                Ok(run) => runs.push(run),
                // Finished between the two reads.
                Err(RegistryError::NotFound(_)) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(runs)
    }

    /// The names of the workspaces that have skills or tokens.
    pub async fn workspaces(&self) -> Result<Vec<String>> {
        self.meta.workspace_names().await
    }

    /// Renews the lease when less than half of it is left (so hot paths write rarely).
    async fn touch_lease(&self, id: &str, ttl_ms: i64, expires_at: i64) -> Result<()> {
        let now = now_ms();
        if expires_at - now < ttl_ms / 2 {
            self.meta.renew_lease(id, now + ttl_ms, now).await?;
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
        self.activate_as(workspace, run_id, skill, requested).await
    }

    /// [`Self::activate`], answered as the JSON of its [`Activation`], as the HTTP route sends
    /// it: made once per revision (its skill, revision and digest determine it) and kept, so
    /// that an activation builds and serializes no answer of its own.
    pub async fn activate_json(
        &self,
        workspace: &str,
        run_id: &str,
        skill: &str,
        requested: Option<i64>,
    ) -> Result<bytes::Bytes> {
        let ActivationJson(body) = self
            .activate_as(workspace, run_id, skill, requested)
            .await?;
        Ok(body)
    }

    async fn activate_as<A: ActivationAnswer>(
        &self,
        workspace: &str,
        run_id: &str,
        skill: &str,
        requested: Option<i64>,
    ) -> Result<A> {
        let now = now_ms();
        let key = (workspace.to_string(), run_id.to_string(), skill.to_string());
        // Read once, before the cache is asked and the pin decided: an entry stored below
        // with it is dropped if anything moved the generation meanwhile.
        let generation = self.pin_cache.generation();
        // Re-activation is the common case: a cached pin (live run, available revision as of
        // the cache's generation) answers it without the database.
        let cached = self.pin_cache.get_at(&key, generation);
        if let Some(cached) = cached.filter(|p| p.expires_at > now) {
            check_requested(skill, cached.revision, requested)?;
            let answer = A::answer(self, skill, &cached).await?;
            if cached.expires_at - now < cached.ttl_ms / 2 {
                self.touch_lease(run_id, cached.ttl_ms, cached.expires_at)
                    .await?;
                self.pin_cache.forget(&key);
            }
            return Ok(answer);
        }
        // The existing pin, or a new one written (and durable) now.
        let (pin, written) = self
            .meta
            .pin(workspace, run_id, skill, requested, now)
            .await?;
        let d: Digest = pin.digest.parse().map_err(RegistryError::internal)?;
        let manifest = if written {
            // Its revision was available as the pin was decided (a revocation since then
            // bumped the pin cache's generation: the entry below is not kept).
            self.manifest(&d).await.map_err(|e| {
                let reason = format!("its manifest cannot be loaded ({e})");
                unavailable(skill, &pin.skill_id, pin.revision, reason)
            })?
        } else {
            // An existing pin's revision may have been revoked or collected since: its state
            // first, then its content.
            let (row, manifest, _) = self
                .pinned_content(skill, &pin.skill_id, pin.revision, &pin.digest)
                .await?;
            self.frontmatters.insert(d, row.frontmatter);
            manifest
        };
        let cached = Arc::new(CachedPin {
            skill_id: pin.skill_id,
            revision: pin.revision,
            digest: d,
            expires_at: pin.expires_at,
            ttl_ms: pin.ttl_ms,
            manifest,
        });
        let answer = A::answer(self, skill, &cached).await?;
        self.touch_lease(run_id, pin.ttl_ms, pin.expires_at).await?;
        self.pin_cache.put(key, generation, cached);
        Ok(answer)
    }

    /// The answer to an activation of `pin`, whose revision's state was just checked (a pin
    /// written now, one whose state was read, or one cached as available). Its instructions,
    /// manifest and frontmatter are what its digest determines: from memory when known.
    async fn answer_activation(&self, skill: &str, pin: &CachedPin) -> Result<Activation> {
        let digest = pin.digest.to_string();
        let (frontmatter, instructions) = match self.frontmatters.get(&pin.digest) {
            Some(frontmatter) => {
                let instructions = self.instructions(&pin.digest, &pin.manifest).await;
                let instructions = instructions.map_err(|e| {
                    let reason = format!("its SKILL.md cannot be read ({e})");
                    unavailable(skill, &pin.skill_id, pin.revision, reason)
                })?;
                (frontmatter, instructions)
            }
            None => {
                let (row, _, instructions) = self
                    .pinned_content(skill, &pin.skill_id, pin.revision, &digest)
                    .await?;
                (
                    self.frontmatters.insert(pin.digest, row.frontmatter),
                    instructions,
                )
            }
        };
        Ok(Activation {
            skill: skill.to_string(),
            mount_path: mount_path(&pin.skill_id, pin.revision),
            skill_id: pin.skill_id.clone(),
            revision: pin.revision,
            digest,
            instructions: instructions.to_string(),
            frontmatter: (*frontmatter).clone(),
            files: pin.manifest.entries().to_vec(),
        })
    }

    /// [`Self::answer_activation`]'s JSON, from the memo of answers when it holds this
    /// revision's under this skill name.
    async fn activation_json(&self, skill: &str, pin: &CachedPin) -> Result<bytes::Bytes> {
        let known = self.activation_answers.get(&pin.digest);
        let is_this = |a: &&AnswerJson| {
            a.skill == skill && a.skill_id == pin.skill_id && a.revision == pin.revision
        };
        if let Some(answer) = known
            .as_ref()
            .and_then(|answers| answers.iter().find(is_this))
        {
            return Ok(answer.body.clone());
        }
        let activation = self.answer_activation(skill, pin).await?;
        let body =
            bytes::Bytes::from(serde_json::to_vec(&activation).map_err(RegistryError::internal)?);
        // Kept beside the latest answers of the digest's other publications (the same content
        // in other workspaces or under other names) that fit the bound; a concurrent fill of
        // the same digest may replace this one, which is made again when next asked.
        let mut answers = vec![AnswerJson {
            skill: activation.skill,
            skill_id: activation.skill_id,
            revision: activation.revision,
            body: body.clone(),
        }];
        let mut bytes = 0;
        for other in known.iter().flat_map(|others| others.iter()) {
            bytes += other.body.len();
            if answers.len() == AnswerJson::PER_DIGEST || bytes > AnswerJson::BYTES_PER_DIGEST {
                break;
            }
            answers.push(other.clone());
        }
        self.activation_answers.insert(pin.digest, answers);
        Ok(body)
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
        let unavailable = |reason: String| unavailable(skill, skill_id, revision, reason);
        let row = self
            .meta
            .revision(skill_id, revision)
            .await?
            .ok_or_else(|| unavailable("the revision no longer exists".into()))?;
        match row.state {
            RevisionState::Available => {}
            RevisionState::Revoked => {
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
        match self
            .file_content(&pin.digest, &pin.manifest, &entry)
            .await?
        {
            Some(content) => Ok((entry, content)),
            None => Err(unavailable(
                skill,
                &pin.skill_id,
                pin.revision,
                "its content is missing from the store or fails verification",
            )),
        }
    }

    /// Resolves a pin from the database, checking the run and the revision, and caches it.
    async fn resolve_pin(&self, key: PinKey, now: i64) -> Result<Arc<CachedPin>> {
        let (workspace, run_id, skill) = (&key.0, &key.1, &key.2);
        let generation = self.pin_cache.generation();
        let found = self
            .meta
            .pinned_revision(workspace, run_id, skill)
            .await?
            .ok_or_else(|| {
                RegistryError::NotFound(format!("no run {run_id:?} in workspace {workspace:?}"))
            })?;
        let (expires_at, ttl_ms) = (found.expires_at, found.ttl_ms);
        if found.run_state != RunState::Active || expires_at <= now {
            let state = match found.run_state {
                RunState::Active => RunState::Expired,
                other => other,
            };
            return Err(run_state_error(run_id, state));
        }
        let Some(PinRef {
            skill_id,
            revision,
            digest,
            revision_state,
            state_reason,
        }) = found.pin
        else {
            return Err(RegistryError::NotActivated(format!(
                "skill {skill:?} is not activated in run {run_id}; activate it first"
            )));
        };
        let unavailable = |reason: &str| unavailable(skill, &skill_id, revision, reason);
        match revision_state {
            Some(RevisionState::Available) => {}
            Some(RevisionState::Revoked) => {
                return Err(RegistryError::RevisionRevoked(format!(
                    "revision {revision} of {skill:?} is revoked: {}",
                    state_reason.as_deref().unwrap_or("no reason given")
                )));
            }
            Some(other) => return Err(unavailable(&format!("it was {other}"))),
            None => return Err(unavailable("the revision no longer exists")),
        }
        let d: Digest = digest.parse().map_err(RegistryError::internal)?;
        let manifest = match self.manifest(&d).await {
            Ok(m) => m,
            Err(e) if e.is_outage() => return Err(e),
            Err(_) => {
                return Err(unavailable(
                    "its manifest is missing from the content store or fails verification",
                ));
            }
        };
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
        let record = self.meta.run(workspace, run_id).await?.ok_or_else(|| {
            RegistryError::NotFound(format!("no run {run_id:?} in workspace {workspace:?}"))
        })?;
        let state = record.row.state_at(now_ms());
        if state != RunState::Active {
            return Err(run_state_error(run_id, state));
        }
        let mut entries = Vec::new();
        let mut locations = Vec::new();
        for (name, id) in record.authorized {
            let pinned = record.pins.iter().find(|p| p.skill_id == id);
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
        if !self.meta.heartbeat(workspace, run_id, now_ms()).await? {
            let view = self.run(workspace, run_id).await?;
            return Err(run_state_error(run_id, view.state));
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
        self.meta.finish_run(workspace, run_id, now_ms()).await?;
        self.run(workspace, run_id).await
    }

    /// Whether run `id` (of any workspace) is active now: the box keeps its sandbox while it is.
    pub async fn run_is_live(&self, id: &str) -> Result<bool> {
        self.meta.run_is_live(id, now_ms()).await
    }

    /// Marks runs whose lease lapsed as `expired`; returns how many.
    pub async fn expire_runs(&self) -> Result<u64> {
        let expired = self.meta.expire_runs(now_ms()).await?;
        if expired > 0 {
            self.pin_cache.bump();
        }
        Ok(expired)
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

/// What an activation answers with, once its pin is decided: the [`Activation`], or its JSON.
trait ActivationAnswer: Sized {
    async fn answer(registry: &Registry, skill: &str, pin: &CachedPin) -> Result<Self>;
}

impl ActivationAnswer for Activation {
    async fn answer(registry: &Registry, skill: &str, pin: &CachedPin) -> Result<Self> {
        registry.answer_activation(skill, pin).await
    }
}

/// An [`Activation`] as JSON ([`Registry::activate_json`]).
struct ActivationJson(bytes::Bytes);

impl ActivationAnswer for ActivationJson {
    async fn answer(registry: &Registry, skill: &str, pin: &CachedPin) -> Result<Self> {
        registry
            .activation_json(skill, pin)
            .await
            .map(ActivationJson)
    }
}

/// A revision's activation answer as JSON, kept by digest in [`Registry`]'s memo with what
/// else it holds: a digest's content may be published under other skills and revisions (the
/// same skill installed in many workspaces), whose answers differ in these, so the memo keeps
/// a few per digest.
#[derive(Clone)]
pub(crate) struct AnswerJson {
    skill: String,
    skill_id: String,
    revision: i64,
    body: bytes::Bytes,
}

impl AnswerJson {
    /// Answers kept per digest (its publications asked for lately, newest first) and the bytes
    /// they may take together beyond the newest: the memo's bound counts digests, not answers.
    const PER_DIGEST: usize = 64;
    const BYTES_PER_DIGEST: usize = 128 * 1024;
}

/// A resolved pin of a live run on an available revision, as of a cache generation.
pub(crate) struct CachedPin {
    skill_id: String,
    revision: i64,
    digest: Digest,
    expires_at: i64,
    ttl_ms: i64,
    manifest: Arc<skillbox_package::Manifest>,
}

/// Resolved pins, valid while the *generation* is unchanged. Every change able to end a pinned
/// read (finish, expiry, revocation, collection) moves the generation after committing, for
/// every process and server that could have cached the pin:
///
/// - SQLite: the generation is the length of a file in the data directory, which the change
///   appends a byte to — shared by every process on it, read with one `lseek` to the end of
///   the file held open per request (a `stat` of its path resolves the path each time).
/// - PostgreSQL: a counter that every server bumps when the database notifies it of such a
///   change (see `notify.rs`); while a server is not listening, its cache is off.
///
/// Entries are tagged with the generation read *before* their database query, so a change
/// racing a fill invalidates it.
pub(crate) struct PinCache {
    generation: Generation,
    entries: std::sync::Mutex<CacheEntries>,
}

/// A pin cache's entries, bounded in two halves: new entries go to `recent`; when it is full it
/// becomes `older` (the one before it is dropped), and an entry found in `older` moves back to
/// `recent`. Pins used since the last turn stay, where emptying the whole cache at its bound
/// sent every activation and read of a live run to the database at once (the "existing pin"
/// row of `scripts/bench-runs` at 8 connections, which comes after the cache filled: on
/// PostgreSQL 13.9k/s, each first re-activation a database read).
#[derive(Default)]
struct CacheEntries {
    recent: std::collections::HashMap<PinKey, (u64, Arc<CachedPin>)>,
    older: std::collections::HashMap<PinKey, (u64, Arc<CachedPin>)>,
}

impl CacheEntries {
    /// Entries per half: the cache holds at most twice this.
    const HALF: usize = 100_000;

    fn get(&mut self, key: &PinKey) -> Option<(u64, Arc<CachedPin>)> {
        if let Some((generation, pin)) = self.recent.get(key) {
            return Some((*generation, pin.clone()));
        }
        let (key, entry) = self.older.remove_entry(key)?;
        self.insert(key, entry.clone());
        Some(entry)
    }

    fn insert(&mut self, key: PinKey, entry: (u64, Arc<CachedPin>)) {
        if self.recent.len() >= Self::HALF && !self.recent.contains_key(&key) {
            self.older = std::mem::take(&mut self.recent);
        }
        self.older.remove(&key);
        self.recent.insert(key, entry);
    }

    fn remove(&mut self, key: &PinKey) {
        self.recent.remove(key);
        self.older.remove(key);
    }

    fn clear(&mut self) {
        self.recent.clear();
        self.older.clear();
    }
}

pub(crate) enum Generation {
    File(GenerationFile),
    Notified(Arc<crate::notify::NotifiedGeneration>),
}

/// The SQLite generation's file, held open for appending.
pub(crate) struct GenerationFile {
    path: std::path::PathBuf,
    file: std::fs::File,
    /// When the held file was last seen still linked, in ms since `opened` (a monotonic clock:
    /// a wall clock set back would stop the checks); [`Self::REMOVED`] once it was seen removed.
    linked_at: std::sync::atomic::AtomicU64,
    opened: std::time::Instant,
}

impl GenerationFile {
    /// How long a read trusts that the held file is still the path's file: an `fstat` on
    /// every pinned read was 4.7% of the server's CPU in `scripts/bench-runs` (a 4 KiB read).
    const LINK_CHECK_EVERY_MS: u64 = 100;

    const REMOVED: u64 = u64::MAX;

    /// Added to the lengths of the path's file, read once the held one was removed: the two
    /// files' lengths are unrelated, and an entry tagged with one must not match the other.
    const PATH_GENERATIONS: u64 = 1 << 62;

    pub(crate) fn open(path: std::path::PathBuf) -> std::io::Result<Self> {
        let file = Self::open_path(&path)?;
        Ok(GenerationFile {
            path,
            file,
            linked_at: 0.into(),
            opened: std::time::Instant::now(),
        })
    }

    fn open_path(path: &std::path::Path) -> std::io::Result<std::fs::File> {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
    }

    /// The held file's metadata while it is still the path's file. Should the file have been
    /// removed since it was opened (an operator's cleanup), the held one no longer sees other
    /// processes' bumps: the path's file is used then.
    fn held(&self) -> Option<std::fs::Metadata> {
        use std::os::unix::fs::MetadataExt;
        self.file.metadata().ok().filter(|m| m.nlink() > 0)
    }

    /// The generation: the held file's length, one `lseek` to its end (the file is opened for
    /// appending, so the offset the seek moves is never used). Whether the file is still
    /// linked is checked at most every [`Self::LINK_CHECK_EVERY_MS`]: a removal is noticed
    /// that late. From then on it is the path's file's length (a `stat` each time). `None`
    /// (the cache off) when neither can be read.
    fn len(&self) -> Option<u64> {
        use std::io::Seek;
        use std::sync::atomic::Ordering::Relaxed;
        let linked_at = self.linked_at.load(Relaxed);
        if linked_at != Self::REMOVED {
            let now = self.opened.elapsed().as_millis() as u64;
            let due = now.saturating_sub(linked_at) >= Self::LINK_CHECK_EVERY_MS;
            if !due || self.held().is_some() {
                if due {
                    self.linked_at.store(now, Relaxed);
                }
                return (&self.file).seek(std::io::SeekFrom::End(0)).ok();
            }
            self.linked_at.store(Self::REMOVED, Relaxed);
        }
        std::fs::metadata(&self.path)
            .ok()
            .map(|m| m.len() + Self::PATH_GENERATIONS)
    }

    fn bump(&self) -> std::io::Result<()> {
        use std::io::Write;
        match self.held() {
            Some(_) => (&self.file).write_all(b"."),
            None => Self::open_path(&self.path)?.write_all(b"."),
        }
    }
}

impl PinCache {
    pub(crate) fn new(generation: Generation) -> Self {
        PinCache {
            generation,
            entries: Default::default(),
        }
    }

    /// The generation now, `None` while the cache must not be used.
    pub(crate) fn generation(&self) -> Option<u64> {
        match &self.generation {
            Generation::File(file) => file.len(),
            Generation::Notified(n) => n.current(),
        }
    }

    /// Whether changes of other servers are pushed to this one now (see `notify.rs`).
    pub(crate) fn hears_other_servers(&self) -> bool {
        match &self.generation {
            Generation::File(_) => false,
            Generation::Notified(n) => n.current().is_some(),
        }
    }

    fn get(&self, key: &PinKey) -> Option<Arc<CachedPin>> {
        self.get_at(key, self.generation())
    }

    /// The entry of `key` if it was stored at `generation`, a generation just read (one read
    /// serves the lookup and, for an activation, the entry it stores).
    fn get_at(&self, key: &PinKey, generation: Option<u64>) -> Option<Arc<CachedPin>> {
        let g = generation?;
        let mut entries = self.entries.lock().ok()?;
        entries.get(key).filter(|(eg, _)| *eg == g).map(|(_, p)| p)
    }

    fn put(&self, key: PinKey, generation: Option<u64>, pin: Arc<CachedPin>) {
        if generation.is_none() || self.generation() != generation {
            return;
        }
        if let (Ok(mut e), Some(g)) = (self.entries.lock(), generation) {
            e.insert(key, (g, pin));
        }
    }

    fn forget(&self, key: &PinKey) {
        if let Ok(mut e) = self.entries.lock() {
            e.remove(key);
        }
    }

    /// Invalidates every cached pin here at once; other processes (SQLite: the shared file) or
    /// servers (PostgreSQL: the commit's notification) follow.
    pub(crate) fn bump(&self) {
        let file = match &self.generation {
            Generation::Notified(n) => return n.bump(),
            Generation::File(file) => file,
        };
        if let Err(e) = file.bump() {
            // Without the bump other processes could serve stale pins: drop everything here
            // and say so loudly.
            tracing::error!(error = %e, path = %file.path.display(), "cannot bump the pin-cache generation");
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
        if view.state != RunState::Active {
            return Err(run_state_error(run_id, view.state));
        }
        let mut out = Vec::new();
        for pin in &view.activations {
            let (_, manifest, _) = self
                .pinned_content(&pin.skill, &pin.skill_id, pin.revision, &pin.digest)
                .await?;
            let d: Digest = pin.digest.parse().map_err(RegistryError::internal)?;
            let tree = self.tree(&d, &manifest).await.map_err(|e| {
                let reason = format!("its tree cannot be rebuilt ({e})");
                unavailable(&pin.skill, &pin.skill_id, pin.revision, reason)
            })?;
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

#[cfg(test)]
mod tests {
    use super::{CacheEntries, CachedPin, GenerationFile, PinKey};
    use crate::meta::publish_in;
    use crate::{Registry, RegistryConfig};
    use std::sync::Arc;

    /// One content published in three workspaces: the memo of answers keeps each one's, so
    /// that activations in all of them are answered from it (one kept per digest made every
    /// activation in another workspace than the last serialize its answer again).
    #[tokio::test]
    async fn the_answer_memo_keeps_every_publication_of_a_content() {
        let dir = tempfile::tempdir().unwrap();
        let r = Registry::open(RegistryConfig::new(dir.path()))
            .await
            .unwrap();
        let workspaces = ["ws", "other", "third"];
        for ws in workspaces {
            publish_in(&r, ws, "a", 0).await;
        }
        let mut digests = std::collections::HashSet::new();
        for ws in workspaces.iter().chain(&workspaces) {
            let run = r.create_run(ws, None, None, false).await.unwrap().run_id;
            let body = r.activate_json(ws, &run, "a", None).await.unwrap();
            let answer: skillbox_api::Activation = serde_json::from_slice(&body).unwrap();
            digests.insert(answer.digest);
        }
        assert_eq!(digests.len(), 1, "one content in every workspace");
        let digest = digests.into_iter().next().unwrap().parse().unwrap();
        let answers = r.activation_answers.get(&digest).expect("answers kept");
        let mut skill_ids: Vec<&str> = answers.iter().map(|a| a.skill_id.as_str()).collect();
        skill_ids.sort();
        skill_ids.dedup();
        assert_eq!(
            (answers.len(), skill_ids.len()),
            (3, 3),
            "one per workspace"
        );
    }

    fn key(i: usize) -> PinKey {
        ("ws".to_string(), format!("run-{i}"), "skill".to_string())
    }

    fn entry(i: usize) -> (u64, Arc<CachedPin>) {
        let manifest = skillbox_package::Manifest::new(Vec::new()).unwrap();
        let pin = CachedPin {
            skill_id: "id".into(),
            revision: i as i64,
            digest: skillbox_package::Digest(skillbox_package::digest::Sha256::of(b"tree")),
            expires_at: 0,
            ttl_ms: 0,
            manifest: Arc::new(manifest),
        };
        (7, Arc::new(pin))
    }

    /// At its bound the cache drops what was not used since the last turn, not everything:
    /// an entry used after its half turned stays; one unused through two turns is gone.
    #[test]
    fn a_full_cache_keeps_the_pins_in_use() {
        let mut entries = CacheEntries::default();
        for i in 0..CacheEntries::HALF {
            entries.insert(key(i), entry(i));
        }
        // The half turns: everything so far is older, and still found.
        entries.insert(key(CacheEntries::HALF), entry(CacheEntries::HALF));
        assert_eq!(entries.older.len(), CacheEntries::HALF);
        let used = key(1);
        assert_eq!(entries.get(&used).map(|(_, p)| p.revision), Some(1));
        assert!(entries.recent.contains_key(&used) && !entries.older.contains_key(&used));
        entries.remove(&key(2));
        assert!(entries.get(&key(2)).is_none(), "forgotten in either half");
        // Another turn: the used entry stays; an older one never used since is dropped.
        for i in CacheEntries::HALF + 1..2 * CacheEntries::HALF {
            entries.insert(key(i), entry(i));
        }
        assert!(entries.recent.len() + entries.older.len() <= 2 * CacheEntries::HALF);
        assert_eq!(entries.get(&used).map(|(_, p)| p.revision), Some(1));
        assert!(entries.get(&key(3)).is_none());
        entries.clear();
        assert!(entries.get(&used).is_none());
    }

    /// Two processes on one data directory, as two handles on the generation file: a bump
    /// through either is seen by the other at once; after an operator removed the file, a bump
    /// through the path's new file reaches a process holding the old one once it checks the
    /// link ([`GenerationFile::LINK_CHECK_EVERY_MS`]), and its generations never repeat one read
    /// before.
    #[test]
    fn every_holder_sees_every_bump_even_after_the_file_was_removed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pin-cache-generation");
        let a = GenerationFile::open(path.clone()).unwrap();
        let b = GenerationFile::open(path.clone()).unwrap();
        let mut seen = vec![a.len().unwrap()];
        for bumper in [&a, &b] {
            bumper.bump().unwrap();
            let (ga, gb) = (a.len().unwrap(), b.len().unwrap());
            assert_eq!(ga, gb, "both read the same file");
            assert!(!seen.contains(&ga), "a bump is seen at once");
            seen.push(ga);
        }

        std::fs::remove_file(&path).unwrap();
        let c = GenerationFile::open(path.clone()).unwrap();
        c.bump().unwrap();
        std::thread::sleep(std::time::Duration::from_millis(
            GenerationFile::LINK_CHECK_EVERY_MS + 50,
        ));
        let after_c = a.len().unwrap();
        assert!(
            !seen.contains(&after_c),
            "a holder of the removed file sees the new one"
        );
        assert_eq!(after_c, c.len().unwrap() + GenerationFile::PATH_GENERATIONS);
        seen.push(after_c);
        // And bumps through the old holders reach the new one.
        a.bump().unwrap();
        assert!(!seen.contains(&a.len().unwrap()));
        assert_eq!(
            a.len().unwrap(),
            c.len().unwrap() + GenerationFile::PATH_GENERATIONS
        );
    }
}
