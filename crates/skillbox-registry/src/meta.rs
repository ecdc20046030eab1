//! The metadata store: workspaces, skills, revisions, drafts, tokens and the event log, in SQL
//! that runs unchanged on SQLite and PostgreSQL (sqlx's `Any` driver, `$N` placeholders,
//! integer timestamps, TEXT and BIGINT columns only).
//!
//! Concurrency control is the database's: the current-revision pointer moves only by
//! `UPDATE … WHERE current_revision = $base`, so exactly one of several concurrent writers
//! (threads, processes or servers) wins. On SQLite, write transactions start with
//! `BEGIN IMMEDIATE` (no lock upgrades, no deadlocks) and wait on a busy timeout; all hashing
//! and file I/O happens before a transaction begins, so they stay tiny.

use crate::error::{RegistryError, Result};
use serde::Serialize;
pub use skillbox_api::{DraftFile, Event, Revision};
use sqlx::any::{AnyPoolOptions, AnyRow};
// Dynamic SQL below only concatenates the constant column lists (SKILL_COLS, REV_COLS).
use sqlx::{AnyPool, AssertSqlSafe, Row};
use std::time::Duration;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    Sqlite,
    Postgres,
}

pub type Tx = sqlx::Transaction<'static, sqlx::Any>;

#[derive(Clone)]
pub struct MetaStore {
    pool: AnyPool,
    /// Where writes go. SQLite admits one writer at a time: a one-connection pool queues
    /// writers fairly in the process instead of having them sleep in SQLite's busy handler
    /// (which makes tail latencies of hundreds of milliseconds). PostgreSQL: the same pool.
    writer: AnyPool,
    dialect: Dialect,
}

const SCHEMA: &[&str] = &[
    "CREATE TABLE IF NOT EXISTS workspaces (
        name TEXT PRIMARY KEY,
        event_seq BIGINT NOT NULL,
        created_at BIGINT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS skills (
        id TEXT PRIMARY KEY,
        workspace TEXT NOT NULL,
        name TEXT NOT NULL,
        state TEXT NOT NULL,
        current_revision BIGINT NOT NULL,
        last_revision BIGINT NOT NULL,
        created_at BIGINT NOT NULL,
        updated_at BIGINT NOT NULL,
        deleted_at BIGINT)",
    "CREATE UNIQUE INDEX IF NOT EXISTS skills_active_name ON skills (workspace, name) WHERE state = 'active'",
    "CREATE TABLE IF NOT EXISTS revisions (
        skill_id TEXT NOT NULL,
        revision BIGINT NOT NULL,
        digest TEXT NOT NULL,
        parent_revision BIGINT NOT NULL,
        state TEXT NOT NULL,
        publisher TEXT NOT NULL,
        published_at BIGINT NOT NULL,
        file_count BIGINT NOT NULL,
        size BIGINT NOT NULL,
        frontmatter TEXT NOT NULL,
        state_reason TEXT,
        state_changed_at BIGINT,
        PRIMARY KEY (skill_id, revision))",
    "CREATE INDEX IF NOT EXISTS revisions_digest ON revisions (digest)",
    "CREATE TABLE IF NOT EXISTS tokens (
        hash TEXT PRIMARY KEY,
        workspace TEXT NOT NULL,
        role TEXT NOT NULL,
        created_at BIGINT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS drafts (
        id TEXT PRIMARY KEY,
        workspace TEXT NOT NULL,
        skill TEXT NOT NULL,
        base_revision BIGINT NOT NULL,
        created_at BIGINT NOT NULL,
        updated_at BIGINT NOT NULL)",
    // A run draft: its files live in the run's sandbox workspace, not in draft_files.
    "CREATE TABLE IF NOT EXISTS run_drafts (
        draft_id TEXT PRIMARY KEY,
        run_id TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS draft_files (
        draft_id TEXT NOT NULL,
        path TEXT NOT NULL,
        sha256 TEXT NOT NULL,
        size BIGINT NOT NULL,
        executable BIGINT NOT NULL,
        PRIMARY KEY (draft_id, path))",
    "CREATE TABLE IF NOT EXISTS events (
        workspace TEXT NOT NULL,
        seq BIGINT NOT NULL,
        kind TEXT NOT NULL,
        at BIGINT NOT NULL,
        data TEXT NOT NULL,
        PRIMARY KEY (workspace, seq))",
    "CREATE TABLE IF NOT EXISTS runs (
        id TEXT PRIMARY KEY,
        workspace TEXT NOT NULL,
        state TEXT NOT NULL,
        ttl_ms BIGINT NOT NULL,
        expires_at BIGINT NOT NULL,
        require_immutable BIGINT NOT NULL,
        created_at BIGINT NOT NULL,
        ended_at BIGINT)",
    "CREATE INDEX IF NOT EXISTS runs_live ON runs (state, expires_at)",
    "CREATE TABLE IF NOT EXISTS run_skills (
        run_id TEXT NOT NULL,
        skill_name TEXT NOT NULL,
        skill_id TEXT NOT NULL,
        PRIMARY KEY (run_id, skill_name))",
    "CREATE TABLE IF NOT EXISTS pins (
        run_id TEXT NOT NULL,
        skill_id TEXT NOT NULL,
        skill_name TEXT NOT NULL,
        revision BIGINT NOT NULL,
        digest TEXT NOT NULL,
        activated_at BIGINT NOT NULL,
        PRIMARY KEY (run_id, skill_id))",
    "CREATE INDEX IF NOT EXISTS pins_revision ON pins (skill_id, revision)",
];

pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// A skill row.
#[derive(Debug, Clone, Serialize)]
pub struct SkillRow {
    pub id: String,
    pub workspace: String,
    pub name: String,
    pub state: String,
    pub current_revision: i64,
    pub last_revision: i64,
    pub created_at: i64,
    pub updated_at: i64,
}

const SKILL_COLS: &str =
    "id, workspace, name, state, current_revision, last_revision, created_at, updated_at";
const REV_COLS: &str = "skill_id, revision, digest, parent_revision, state, publisher, published_at, file_count, size, frontmatter, state_reason";

fn skill_from(r: &AnyRow) -> Result<SkillRow> {
    Ok(SkillRow {
        id: r.try_get(0)?,
        workspace: r.try_get(1)?,
        name: r.try_get(2)?,
        state: r.try_get(3)?,
        current_revision: r.try_get(4)?,
        last_revision: r.try_get(5)?,
        created_at: r.try_get(6)?,
        updated_at: r.try_get(7)?,
    })
}

fn revision_from(r: &AnyRow) -> Result<Revision> {
    let fm: String = r.try_get(9)?;
    Ok(Revision {
        skill_id: r.try_get(0)?,
        revision: r.try_get(1)?,
        digest: r.try_get(2)?,
        parent_revision: r.try_get(3)?,
        state: r.try_get(4)?,
        publisher: r.try_get(5)?,
        published_at: r.try_get(6)?,
        file_count: r.try_get(7)?,
        size: r.try_get(8)?,
        frontmatter: serde_json::from_str(&fm).map_err(RegistryError::internal)?,
        state_reason: r.try_get(10)?,
    })
}

/// Random 128-bit identifier, hex.
pub fn new_id() -> String {
    let mut b = [0u8; 16];
    getrandom::fill(&mut b).expect("the OS random source is available");
    skillbox_package::digest::to_hex(&b)
}

/// Inputs of a publication's commit.
pub struct NewRevision<'a> {
    pub workspace: &'a str,
    pub skill: &'a str,
    pub base_revision: i64,
    pub digest: &'a str,
    pub publisher: &'a str,
    pub file_count: i64,
    pub size: i64,
    pub frontmatter: &'a serde_json::Value,
}

/// What a commit did.
pub enum CommitOutcome {
    Created {
        skill: SkillRow,
        revision: Revision,
    },
    /// The same publish (same base, same digest) was committed before: its revision.
    Replayed {
        skill: SkillRow,
        revision: Revision,
    },
    Conflict {
        current_revision: i64,
    },
    /// Content the revision needs vanished before the commit (a concurrent collection):
    /// restore it and commit again.
    ContentMissing,
}

/// Checks, inside a write transaction, that content written before it is still present.
pub type PresenceCheck<'a> = &'a (dyn Fn() -> bool + Send + Sync);

impl MetaStore {
    /// Connects (`sqlite://…` or `postgres://…`) and applies the schema.
    pub async fn connect(url: &str) -> Result<Self> {
        sqlx::any::install_default_drivers();
        let dialect = if url.starts_with("postgres") {
            Dialect::Postgres
        } else {
            Dialect::Sqlite
        };
        let opts = AnyPoolOptions::new()
            .max_connections(if dialect == Dialect::Sqlite { 8 } else { 16 })
            .acquire_timeout(Duration::from_secs(30))
            .after_connect(move |conn, _| {
                Box::pin(async move {
                    if dialect == Dialect::Sqlite {
                        use sqlx::Executor;
                        conn.execute("PRAGMA journal_mode = WAL").await?;
                        conn.execute("PRAGMA synchronous = FULL").await?;
                        conn.execute("PRAGMA busy_timeout = 30000").await?;
                    }
                    Ok(())
                })
            });
        let pool = opts.clone().connect(url).await?;
        let writer = match dialect {
            Dialect::Sqlite => opts.max_connections(1).connect(url).await?,
            Dialect::Postgres => pool.clone(),
        };
        let store = MetaStore {
            pool,
            writer,
            dialect,
        };
        store.migrate().await?;
        Ok(store)
    }

    pub fn dialect(&self) -> Dialect {
        self.dialect
    }

    pub fn pool(&self) -> &AnyPool {
        &self.pool
    }

    /// The pool for statements that write outside [`MetaStore::write_tx`].
    pub fn writer(&self) -> &AnyPool {
        &self.writer
    }

    async fn migrate(&self) -> Result<()> {
        let mut tx = self.write_tx().await?;
        for stmt in SCHEMA {
            sqlx::query(*stmt).execute(&mut *tx).await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// A write transaction (`BEGIN IMMEDIATE` on SQLite).
    pub async fn write_tx(&self) -> Result<Tx> {
        Ok(match self.dialect {
            Dialect::Sqlite => self.writer.begin_with("BEGIN IMMEDIATE").await?,
            Dialect::Postgres => self.writer.begin().await?,
        })
    }

    /// Appends an event to a workspace's log inside `tx`; returns its sequence number.
    pub async fn append_event(
        tx: &mut Tx,
        workspace: &str,
        kind: &str,
        data: serde_json::Value,
    ) -> Result<i64> {
        Self::ensure_workspace(tx, workspace).await?;
        let row = sqlx::query(
            "UPDATE workspaces SET event_seq = event_seq + 1 WHERE name = $1 RETURNING event_seq",
        )
        .bind(workspace)
        .fetch_one(&mut **tx)
        .await?;
        let seq: i64 = row.try_get(0)?;
        sqlx::query(
            "INSERT INTO events (workspace, seq, kind, at, data) VALUES ($1, $2, $3, $4, $5)",
        )
        .bind(workspace)
        .bind(seq)
        .bind(kind)
        .bind(now_ms())
        .bind(data.to_string())
        .execute(&mut **tx)
        .await?;
        Ok(seq)
    }

    async fn ensure_workspace(tx: &mut Tx, workspace: &str) -> Result<()> {
        sqlx::query("INSERT INTO workspaces (name, event_seq, created_at) VALUES ($1, 0, $2) ON CONFLICT (name) DO NOTHING")
            .bind(workspace)
            .bind(now_ms())
            .execute(&mut **tx)
            .await?;
        Ok(())
    }

    /// The active skill called `name`.
    pub async fn active_skill(&self, workspace: &str, name: &str) -> Result<Option<SkillRow>> {
        let q = format!(
            "SELECT {SKILL_COLS} FROM skills WHERE workspace = $1 AND name = $2 AND state = 'active'"
        );
        let row = sqlx::query(AssertSqlSafe(q))
            .bind(workspace)
            .bind(name)
            .fetch_optional(&self.pool)
            .await?;
        row.as_ref().map(skill_from).transpose()
    }

    /// The most recently deleted skill called `name` (to answer `skill_deleted`).
    pub async fn deleted_skill(&self, workspace: &str, name: &str) -> Result<Option<SkillRow>> {
        let q = format!(
            "SELECT {SKILL_COLS} FROM skills WHERE workspace = $1 AND name = $2 AND state = 'deleted' ORDER BY deleted_at DESC LIMIT 1"
        );
        let row = sqlx::query(AssertSqlSafe(q))
            .bind(workspace)
            .bind(name)
            .fetch_optional(&self.pool)
            .await?;
        row.as_ref().map(skill_from).transpose()
    }

    pub async fn skill_by_id(&self, id: &str) -> Result<Option<SkillRow>> {
        let q = format!("SELECT {SKILL_COLS} FROM skills WHERE id = $1");
        let row = sqlx::query(AssertSqlSafe(q))
            .bind(id)
            .fetch_optional(&self.pool)
            .await?;
        row.as_ref().map(skill_from).transpose()
    }

    pub async fn list_skills(&self, workspace: &str) -> Result<Vec<SkillRow>> {
        let q = format!(
            "SELECT {SKILL_COLS} FROM skills WHERE workspace = $1 AND state = 'active' ORDER BY name"
        );
        let rows = sqlx::query(AssertSqlSafe(q))
            .bind(workspace)
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(skill_from).collect()
    }

    pub async fn revision(&self, skill_id: &str, revision: i64) -> Result<Option<Revision>> {
        let q = format!("SELECT {REV_COLS} FROM revisions WHERE skill_id = $1 AND revision = $2");
        let row = sqlx::query(AssertSqlSafe(q))
            .bind(skill_id)
            .bind(revision)
            .fetch_optional(&self.pool)
            .await?;
        row.as_ref().map(revision_from).transpose()
    }

    pub async fn revisions(&self, skill_id: &str) -> Result<Vec<Revision>> {
        let q =
            format!("SELECT {REV_COLS} FROM revisions WHERE skill_id = $1 ORDER BY revision DESC");
        let rows = sqlx::query(AssertSqlSafe(q))
            .bind(skill_id)
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(revision_from).collect()
    }

    /// Every revision in state `available` (for fsck).
    pub async fn available_revisions(&self) -> Result<Vec<Revision>> {
        let q = format!(
            "SELECT {REV_COLS} FROM revisions WHERE state = 'available' ORDER BY skill_id, revision"
        );
        let rows = sqlx::query(AssertSqlSafe(q)).fetch_all(&self.pool).await?;
        rows.iter().map(revision_from).collect()
    }

    /// The revision a same-base, same-digest publish created, if any.
    async fn replay_of(
        tx: &mut Tx,
        skill_id: &str,
        base: i64,
        digest: &str,
    ) -> Result<Option<Revision>> {
        let q = format!(
            "SELECT {REV_COLS} FROM revisions WHERE skill_id = $1 AND parent_revision = $2 AND digest = $3 ORDER BY revision LIMIT 1"
        );
        let row = sqlx::query(AssertSqlSafe(q))
            .bind(skill_id)
            .bind(base)
            .bind(digest)
            .fetch_optional(&mut **tx)
            .await?;
        row.as_ref().map(revision_from).transpose()
    }

    async fn active_skill_tx(tx: &mut Tx, workspace: &str, name: &str) -> Result<Option<SkillRow>> {
        let q = format!(
            "SELECT {SKILL_COLS} FROM skills WHERE workspace = $1 AND name = $2 AND state = 'active'"
        );
        let row = sqlx::query(AssertSqlSafe(q))
            .bind(workspace)
            .bind(name)
            .fetch_optional(&mut **tx)
            .await?;
        row.as_ref().map(skill_from).transpose()
    }

    /// The commit of a publication: one transaction that creates the skill if needed, moves
    /// the pointer from `base_revision` by compare-and-swap, inserts the revision and appends
    /// the event. Content must be durable before this is called.
    pub async fn commit_revision(
        &self,
        n: &NewRevision<'_>,
        present: PresenceCheck<'_>,
    ) -> Result<CommitOutcome> {
        let mut tx = self.write_tx().await?;
        let now = now_ms();
        // Content deletions happen under the same write lock (see gc.rs): checked here, the
        // answer holds until this transaction ends.
        if !present() {
            tx.rollback().await?;
            return Ok(CommitOutcome::ContentMissing);
        }
        Self::ensure_workspace(&mut tx, n.workspace).await?;
        let mut skill = Self::active_skill_tx(&mut tx, n.workspace, n.skill).await?;
        if skill.is_none() {
            if n.base_revision != 0 {
                return Ok(CommitOutcome::Conflict {
                    current_revision: 0,
                });
            }
            let id = new_id();
            sqlx::query(
                "INSERT INTO skills (id, workspace, name, state, current_revision, last_revision, created_at, updated_at)
                 VALUES ($1, $2, $3, 'active', 0, 0, $4, $4)",
            )
            .bind(&id)
            .bind(n.workspace)
            .bind(n.skill)
            .bind(now)
            .execute(&mut *tx)
            .await?;
            skill = Self::active_skill_tx(&mut tx, n.workspace, n.skill).await?;
        }
        let skill = skill.ok_or_else(|| RegistryError::broken("skill row vanished"))?;
        let moved = sqlx::query(
            "UPDATE skills SET last_revision = last_revision + 1, current_revision = last_revision + 1, updated_at = $3
             WHERE id = $1 AND current_revision = $2 AND state = 'active' RETURNING current_revision",
        )
        .bind(&skill.id)
        .bind(n.base_revision)
        .bind(now)
        .fetch_optional(&mut *tx)
        .await?;
        let Some(moved) = moved else {
            if let Some(rev) =
                Self::replay_of(&mut tx, &skill.id, n.base_revision, n.digest).await?
            {
                tx.rollback().await?;
                return Ok(CommitOutcome::Replayed {
                    skill,
                    revision: rev,
                });
            }
            tx.rollback().await?;
            return Ok(CommitOutcome::Conflict {
                current_revision: skill.current_revision,
            });
        };
        let revision: i64 = moved.try_get(0)?;
        sqlx::query(
            "INSERT INTO revisions (skill_id, revision, digest, parent_revision, state, publisher, published_at, file_count, size, frontmatter)
             VALUES ($1, $2, $3, $4, 'available', $5, $6, $7, $8, $9)",
        )
        .bind(&skill.id)
        .bind(revision)
        .bind(n.digest)
        .bind(n.base_revision)
        .bind(n.publisher)
        .bind(now)
        .bind(n.file_count)
        .bind(n.size)
        .bind(n.frontmatter.to_string())
        .execute(&mut *tx)
        .await?;
        Self::append_event(
            &mut tx,
            n.workspace,
            "skill.published",
            serde_json::json!({"skill": n.skill, "skill_id": skill.id, "revision": revision, "digest": n.digest, "base_revision": n.base_revision}),
        )
        .await?;
        tx.commit().await?;
        let skill = SkillRow {
            current_revision: revision,
            last_revision: revision,
            updated_at: now,
            ..skill
        };
        let rev = Revision {
            skill_id: skill.id.clone(),
            revision,
            digest: n.digest.to_string(),
            parent_revision: n.base_revision,
            state: "available".into(),
            publisher: n.publisher.to_string(),
            published_at: now,
            file_count: n.file_count,
            size: n.size,
            frontmatter: n.frontmatter.clone(),
            state_reason: None,
        };
        Ok(CommitOutcome::Created {
            skill,
            revision: rev,
        })
    }

    /// Moves the current pointer to `revision` if it is `base` now (rollback).
    pub async fn move_current(
        &self,
        workspace: &str,
        skill: &SkillRow,
        revision: i64,
        base: i64,
    ) -> Result<Option<i64>> {
        let mut tx = self.write_tx().await?;
        let target = "SELECT state FROM revisions WHERE skill_id = $1 AND revision = $2";
        let state: Option<String> = sqlx::query(AssertSqlSafe(target))
            .bind(&skill.id)
            .bind(revision)
            .fetch_optional(&mut *tx)
            .await?
            .map(|r| r.try_get(0))
            .transpose()?;
        match state.as_deref() {
            None => {
                return Err(RegistryError::NotFound(format!(
                    "skill {} has no revision {revision}",
                    skill.name
                )));
            }
            Some("revoked") => {
                return Err(RegistryError::RevisionRevoked(format!(
                    "revision {revision} of {} is revoked",
                    skill.name
                )));
            }
            Some("available") => {}
            Some(other) => {
                return Err(RegistryError::NotFound(format!(
                    "revision {revision} of {} is {other}",
                    skill.name
                )));
            }
        }
        let moved = sqlx::query(
            "UPDATE skills SET current_revision = $3, updated_at = $4 WHERE id = $1 AND current_revision = $2 AND state = 'active' RETURNING id",
        )
        .bind(&skill.id)
        .bind(base)
        .bind(revision)
        .bind(now_ms())
        .fetch_optional(&mut *tx)
        .await?;
        if moved.is_none() {
            let cur: i64 = sqlx::query("SELECT current_revision FROM skills WHERE id = $1")
                .bind(&skill.id)
                .fetch_one(&mut *tx)
                .await?
                .try_get(0)?;
            tx.rollback().await?;
            return Ok(Some(cur));
        }
        Self::append_event(
            &mut tx,
            workspace,
            "skill.current_moved",
            serde_json::json!({"skill": skill.name, "skill_id": skill.id, "revision": revision, "base_revision": base}),
        )
        .await?;
        tx.commit().await?;
        Ok(None)
    }

    /// Soft-deletes the active skill; false if there is none.
    pub async fn delete_skill(&self, workspace: &str, skill: &SkillRow) -> Result<bool> {
        let mut tx = self.write_tx().await?;
        let now = now_ms();
        let done = sqlx::query(
            "UPDATE skills SET state = 'deleted', deleted_at = $2, updated_at = $2 WHERE id = $1 AND state = 'active' RETURNING id",
        )
        .bind(&skill.id)
        .bind(now)
        .fetch_optional(&mut *tx)
        .await?;
        if done.is_none() {
            tx.rollback().await?;
            return Ok(false);
        }
        Self::append_event(
            &mut tx,
            workspace,
            "skill.deleted",
            serde_json::json!({"skill": skill.name, "skill_id": skill.id}),
        )
        .await?;
        tx.commit().await?;
        Ok(true)
    }

    /// Events with `seq > after`, oldest first, at most `limit`.
    pub async fn events_after(
        &self,
        workspace: &str,
        after: i64,
        limit: i64,
    ) -> Result<Vec<Event>> {
        let rows = sqlx::query("SELECT seq, kind, at, data FROM events WHERE workspace = $1 AND seq > $2 ORDER BY seq LIMIT $3")
            .bind(workspace)
            .bind(after)
            .bind(limit)
            .fetch_all(&self.pool)
            .await?;
        rows.iter()
            .map(|r| {
                let data: String = r.try_get(3)?;
                Ok(Event {
                    seq: r.try_get(0)?,
                    kind: r.try_get(1)?,
                    at: r.try_get(2)?,
                    data: serde_json::from_str(&data).map_err(RegistryError::internal)?,
                })
            })
            .collect()
    }

    // --- tokens ---

    pub async fn insert_token(&self, hash: &str, workspace: &str, role: &str) -> Result<()> {
        sqlx::query(
            "INSERT INTO tokens (hash, workspace, role, created_at) VALUES ($1, $2, $3, $4)",
        )
        .bind(hash)
        .bind(workspace)
        .bind(role)
        .bind(now_ms())
        .execute(&self.writer)
        .await?;
        Ok(())
    }

    /// (workspace, role) of the token with this hash.
    pub async fn token(&self, hash: &str) -> Result<Option<(String, String)>> {
        let row = sqlx::query("SELECT workspace, role FROM tokens WHERE hash = $1")
            .bind(hash)
            .fetch_optional(&self.pool)
            .await?;
        row.map(|r| Ok((r.try_get(0)?, r.try_get(1)?))).transpose()
    }

    // --- drafts ---

    pub async fn insert_draft(
        &self,
        id: &str,
        workspace: &str,
        skill: &str,
        base: i64,
        files: &[DraftFile],
        present: PresenceCheck<'_>,
    ) -> Result<bool> {
        let mut tx = self.write_tx().await?;
        if !present() {
            tx.rollback().await?;
            return Ok(false);
        }
        let now = now_ms();
        sqlx::query("INSERT INTO drafts (id, workspace, skill, base_revision, created_at, updated_at) VALUES ($1, $2, $3, $4, $5, $5)")
            .bind(id)
            .bind(workspace)
            .bind(skill)
            .bind(base)
            .bind(now)
            .execute(&mut *tx)
            .await?;
        for f in files {
            Self::put_draft_file_tx(&mut tx, id, f).await?;
        }
        tx.commit().await?;
        Ok(true)
    }

    async fn put_draft_file_tx(tx: &mut Tx, id: &str, f: &DraftFile) -> Result<()> {
        sqlx::query(
            "INSERT INTO draft_files (draft_id, path, sha256, size, executable) VALUES ($1, $2, $3, $4, $5)
             ON CONFLICT (draft_id, path) DO UPDATE SET sha256 = excluded.sha256, size = excluded.size, executable = excluded.executable",
        )
        .bind(id)
        .bind(&f.path)
        .bind(&f.sha256)
        .bind(f.size)
        .bind(f.executable as i64)
        .execute(&mut **tx)
        .await?;
        Ok(())
    }

    /// Inserts a run draft (no file rows: its files are in the run's workspace).
    pub async fn insert_run_draft(
        &self,
        id: &str,
        workspace: &str,
        skill: &str,
        base: i64,
        run_id: &str,
    ) -> Result<()> {
        let mut tx = self.write_tx().await?;
        let now = now_ms();
        sqlx::query("INSERT INTO drafts (id, workspace, skill, base_revision, created_at, updated_at) VALUES ($1, $2, $3, $4, $5, $5)")
            .bind(id)
            .bind(workspace)
            .bind(skill)
            .bind(base)
            .bind(now)
            .execute(&mut *tx)
            .await?;
        sqlx::query("INSERT INTO run_drafts (draft_id, run_id) VALUES ($1, $2)")
            .bind(id)
            .bind(run_id)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(())
    }

    pub async fn draft(&self, workspace: &str, id: &str) -> Result<Option<DraftRow>> {
        let row = sqlx::query("SELECT d.id, d.skill, d.base_revision, d.created_at, d.updated_at, r.run_id FROM drafts d LEFT JOIN run_drafts r ON r.draft_id = d.id WHERE d.id = $1 AND d.workspace = $2")
            .bind(id)
            .bind(workspace)
            .fetch_optional(&self.pool)
            .await?;
        row.map(|r| {
            Ok(DraftRow {
                id: r.try_get(0)?,
                skill: r.try_get(1)?,
                base_revision: r.try_get(2)?,
                created_at: r.try_get(3)?,
                updated_at: r.try_get(4)?,
                run_id: r.try_get(5)?,
            })
        })
        .transpose()
    }

    pub async fn draft_files(&self, id: &str) -> Result<Vec<DraftFile>> {
        let rows = sqlx::query("SELECT path, sha256, size, executable FROM draft_files WHERE draft_id = $1 ORDER BY path")
            .bind(id)
            .fetch_all(&self.pool)
            .await?;
        rows.iter()
            .map(|r| {
                let x: i64 = r.try_get(3)?;
                Ok(DraftFile {
                    path: r.try_get(0)?,
                    sha256: r.try_get(1)?,
                    size: r.try_get(2)?,
                    executable: x != 0,
                })
            })
            .collect()
    }

    /// Records a draft file; false (nothing written) when `present` says its blob vanished.
    pub async fn put_draft_file(
        &self,
        id: &str,
        f: &DraftFile,
        present: PresenceCheck<'_>,
    ) -> Result<bool> {
        let mut tx = self.write_tx().await?;
        if !present() {
            tx.rollback().await?;
            return Ok(false);
        }
        Self::put_draft_file_tx(&mut tx, id, f).await?;
        sqlx::query("UPDATE drafts SET updated_at = $2 WHERE id = $1")
            .bind(id)
            .bind(now_ms())
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(true)
    }

    pub async fn delete_draft_file(&self, id: &str, path: &str) -> Result<bool> {
        let r = sqlx::query("DELETE FROM draft_files WHERE draft_id = $1 AND path = $2")
            .bind(id)
            .bind(path)
            .execute(&self.writer)
            .await?;
        Ok(r.rows_affected() > 0)
    }

    pub async fn set_draft_base(&self, id: &str, base: i64) -> Result<()> {
        sqlx::query("UPDATE drafts SET base_revision = $2, updated_at = $3 WHERE id = $1")
            .bind(id)
            .bind(base)
            .bind(now_ms())
            .execute(&self.writer)
            .await?;
        Ok(())
    }

    pub async fn delete_draft(&self, id: &str) -> Result<()> {
        let mut tx = self.write_tx().await?;
        sqlx::query("DELETE FROM draft_files WHERE draft_id = $1")
            .bind(id)
            .execute(&mut *tx)
            .await?;
        sqlx::query("DELETE FROM run_drafts WHERE draft_id = $1")
            .bind(id)
            .execute(&mut *tx)
            .await?;
        sqlx::query("DELETE FROM drafts WHERE id = $1")
            .bind(id)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(())
    }

    /// Every blob hash referenced by a draft (fsck and, later, GC roots).
    pub async fn draft_blob_refs(&self) -> Result<Vec<String>> {
        let rows = sqlx::query("SELECT DISTINCT sha256 FROM draft_files")
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(|r| Ok(r.try_get(0)?)).collect()
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct DraftRow {
    pub id: String,
    pub skill: String,
    pub base_revision: i64,
    pub created_at: i64,
    pub updated_at: i64,
    /// Set for a run draft: the run whose workspace holds its files.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub run_id: Option<String>,
}
