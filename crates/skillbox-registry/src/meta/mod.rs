//! The metadata store: workspaces, skills, revisions, drafts, tokens and the event log, in SQL
//! that runs unchanged on SQLite and PostgreSQL (sqlx's `Any` driver, `$N` placeholders,
//! integer timestamps, TEXT and BIGINT columns only).
//!
//! Concurrency control is the database's: the current-revision pointer moves only by
//! `UPDATE … WHERE current_revision = $base`, so exactly one of several concurrent writers
//! (threads, processes or servers) wins. On SQLite, write transactions start with
//! `BEGIN IMMEDIATE` (no lock upgrades, no deadlocks) and wait on a busy timeout; all hashing
//! and file I/O happens before a transaction begins, so they stay tiny.

/// Runs one statement with its `$N` parameters in order: `execute!(db, "…", a, b)` is
/// `sqlx::query("…").bind(a).bind(b).execute(db).await?`.
macro_rules! execute {
    ($db:expr, $sql:expr $(, $arg:expr)* $(,)?) => {
        sqlx::query($sql)$(.bind($arg))*.execute($db).await?
    };
}

/// A struct read from a row whose columns are its fields, in order: `from_row!(row => T {
/// a, b, c })` is `T { a: row.try_get(0)?, b: row.try_get(1)?, c: row.try_get(2)? }`.
macro_rules! from_row {
    ($row:expr => $ty:ident { $($field:ident),* $(,)? }) => {{
        let row: &sqlx::any::AnyRow = $row;
        let mut column = 0usize;
        let mut next = || {
            column += 1;
            column - 1
        };
        $ty { $($field: row.try_get(next())?),* }
    }};
}

mod drafts;
mod events;
mod nodes;
mod page_cache;
mod pin_sync;
mod pin_thread;
mod revisions;
mod runs;
mod skills;
mod tokens;
mod wal_checkpoints;

pub use drafts::DraftRow;
pub use nodes::NodeRow;
pub use revisions::{Collectable, CommitOutcome, ContentSweep, NewRevision, Revocation};
#[cfg(test)]
pub(crate) use runs::tests::publish_in;
pub use runs::{LivePin, PinRef, PinnedRevision, RunRecord, RunRow};
pub(crate) use runs::{check_requested, run_state_error};

use crate::error::{RegistryError, Result};
use serde::Serialize;
pub use skillbox_api::{DraftFile, Event, Revision, RevisionState, RunState};
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
    /// What the store was connected with (a PostgreSQL listener opens its own connection).
    url: std::sync::Arc<str>,
    /// One collection at a time in this process (see [`MetaStore::gc_lock`]).
    gc_running: std::sync::Arc<tokio::sync::Mutex<()>>,
    /// New pins' group commit (SQLite).
    pins: runs::PinWriter,
}

/// Held while a collection runs: no other collection, in this process or (PostgreSQL) on any
/// server, runs meanwhile.
pub struct GcLock {
    _in_process: tokio::sync::OwnedMutexGuard<()>,
    /// The transaction holding the advisory lock; ending it (commit, drop, or the connection
    /// dying with its process) releases the lock.
    _across_servers: Option<Tx>,
}

/// The advisory-lock key of schema migration ("skbx-mig").
const MIGRATION_ADVISORY_LOCK: i64 = 0x736b_6278_2d6d_6967;

/// The advisory-lock key of garbage collection (any constant shared by all servers; "skbx-gc").
const GC_ADVISORY_LOCK: i64 = 0x0073_6b62_782d_6763;

/// The schema, statement by statement (see `schema.sql`), without its comments; on
/// PostgreSQL without SQLite's `WITHOUT ROWID` (its tables are heaps beside their indexes).
fn schema(dialect: Dialect) -> Vec<String> {
    let text: Vec<&str> = include_str!("schema.sql")
        .lines()
        .filter(|l| !l.trim_start().starts_with("--"))
        .collect();
    text.join("\n")
        .split(';')
        .map(str::trim)
        .filter(|stmt| !stmt.is_empty())
        .map(|stmt| match dialect {
            Dialect::Sqlite => stmt.to_string(),
            Dialect::Postgres => stmt.replace(WITHOUT_ROWID, ""),
        })
        .collect()
}

const WITHOUT_ROWID: &str = " WITHOUT ROWID";

/// The tables `schema.sql` makes `WITHOUT ROWID`.
fn without_rowid_tables() -> Vec<String> {
    schema(Dialect::Sqlite)
        .iter()
        .filter(|stmt| stmt.ends_with(WITHOUT_ROWID))
        .filter_map(|stmt| stmt.strip_prefix("CREATE TABLE IF NOT EXISTS "))
        .filter_map(|rest| rest.split_whitespace().next())
        .map(str::to_string)
        .collect()
}

/// On SQLite, renames each table the schema makes `WITHOUT ROWID` that an older version
/// created as a rowid table to `<table>_rowid`, for the schema to create it anew and
/// [`refill_rebuilt`] to copy its rows back; returns those tables. Inside the migration's
/// transaction, so a failure leaves the database as it was.
async fn set_aside_rowid_tables(tx: &mut Tx) -> Result<Vec<String>> {
    let mut set_aside = Vec::new();
    for table in without_rowid_tables() {
        let sql: Option<String> =
            sqlx::query_scalar("SELECT sql FROM sqlite_schema WHERE type = 'table' AND name = $1")
                .bind(&table)
                .fetch_optional(&mut **tx)
                .await?;
        if sql.is_some_and(|sql| !sql.ends_with(WITHOUT_ROWID)) {
            // Table names come from this crate's schema, not from input.
            sqlx::query(AssertSqlSafe(format!(
                "ALTER TABLE {table} RENAME TO {table}_rowid"
            )))
            .execute(&mut **tx)
            .await?;
            set_aside.push(table);
        }
    }
    Ok(set_aside)
}

/// Copies the rows of each table [`set_aside_rowid_tables`] renamed into the table the schema
/// made, and drops the old one. The columns are the same, in the same order: only the layout
/// changed.
async fn refill_rebuilt(tx: &mut Tx, tables: &[String]) -> Result<()> {
    for table in tables {
        sqlx::raw_sql(AssertSqlSafe(format!(
            "INSERT INTO {table} SELECT * FROM {table}_rowid; DROP TABLE {table}_rowid"
        )))
        .execute(&mut **tx)
        .await?;
    }
    Ok(())
}

/// A database URL with its password, if any, replaced by `***`.
pub fn redacted_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    match rest.split_once('@') {
        Some((user_info, host)) if user_info.contains(':') => {
            let user = user_info.split(':').next().unwrap_or("");
            format!("{scheme}://{user}:***@{host}")
        }
        _ => url.to_string(),
    }
}

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
    Ok(from_row!(r => SkillRow {
        id, workspace, name, state, current_revision, last_revision, created_at, updated_at
    }))
}

fn revision_from(r: &AnyRow) -> Result<Revision> {
    let fm: String = r.try_get(9)?;
    Ok(Revision {
        skill_id: r.try_get(0)?,
        revision: r.try_get(1)?,
        digest: r.try_get(2)?,
        parent_revision: r.try_get(3)?,
        state: revision_state(&r.try_get::<String, _>(4)?)?,
        publisher: r.try_get(5)?,
        published_at: r.try_get(6)?,
        file_count: r.try_get(7)?,
        size: r.try_get(8)?,
        frontmatter: serde_json::from_str(&fm).map_err(RegistryError::internal)?,
        state_reason: r.try_get(10)?,
    })
}

/// A revision state as stored.
pub(crate) fn revision_state(s: &str) -> Result<RevisionState> {
    RevisionState::parse(s)
        .ok_or_else(|| RegistryError::broken(format!("unknown revision state {s:?}")))
}

/// Random 128-bit identifier, hex.
pub fn new_id() -> String {
    let mut b = [0u8; 16];
    getrandom::fill(&mut b).expect("the OS random source is available");
    skillbox_package::digest::to_hex(&b)
}

/// The file of the SQLite database `writer` is connected to; `None` for a database in memory
/// (it has no file to flush).
async fn sqlite_file(writer: &AnyPool) -> Result<Option<std::path::PathBuf>> {
    let file: String =
        sqlx::query_scalar("SELECT file FROM pragma_database_list WHERE name = 'main'")
            .fetch_one(writer)
            .await?;
    Ok((!file.is_empty()).then(|| file.into()))
}

/// Checks, inside a write transaction, that content written before it is still present.
pub type PresenceCheck<'a> =
    &'a (dyn Fn() -> futures_util::future::BoxFuture<'static, Result<bool>> + Send + Sync);

impl MetaStore {
    /// Connects (`sqlite://…` or `postgres://…`) and applies the schema.
    pub async fn connect(url: &str) -> Result<Self> {
        page_cache::install();
        sqlx::any::install_default_drivers();
        let dialect = if url.starts_with("postgres") {
            Dialect::Postgres
        } else {
            Dialect::Sqlite
        };
        let opts = AnyPoolOptions::new()
            .max_connections(if dialect == Dialect::Sqlite { 8 } else { 16 })
            .acquire_timeout(Duration::from_secs(10))
            .after_connect(move |conn, _| {
                Box::pin(async move {
                    if dialect == Dialect::Sqlite {
                        use sqlx::Executor;
                        conn.execute("PRAGMA journal_mode = WAL").await?;
                        conn.execute("PRAGMA synchronous = FULL").await?;
                        conn.execute("PRAGMA busy_timeout = 30000").await?;
                        // Room for the hot pages of the run and pin tables and their indexes
                        // (the default 2 MiB makes a busy writer re-read them).
                        conn.execute("PRAGMA cache_size = -16384").await?;
                        // Checkpoints run in the background (see the pin writer); a commit
                        // runs one itself only if they fall this far (128 MiB) behind.
                        conn.execute("PRAGMA wal_autocheckpoint = 32768").await?;
                        // Statement journals (a multi-row statement inside a transaction keeps
                        // one to undo itself alone) in memory, not in a temporary file written
                        // page by page.
                        conn.execute("PRAGMA temp_store = MEMORY").await?;
                    }
                    Ok(())
                })
            });
        // One plain connection first: a pool retries a refused connection until its acquire
        // timeout and then reports only that it timed out, where this says why at once.
        {
            use sqlx::Connection;
            sqlx::AnyConnection::connect(url).await?.close().await?;
        }
        let pool = opts.clone().connect(url).await?;
        let (writer, pin_writer) = match dialect {
            // No ping before each acquire: the connection is to a local file, and a ping is
            // one more round trip to its worker thread ahead of every pin batch.
            Dialect::Sqlite => {
                let writer = opts
                    .max_connections(1)
                    .test_before_acquire(false)
                    .connect(url)
                    .await?;
                (writer.clone(), writer)
            }
            // The pin batches get a connection of their own (one batch is written at a
            // time), whose planner never scans a whole table nor hashes one for a join. It
            // plans a batch's statement once per connection for any number of requests, so it
            // cannot know how few a batch holds (it assumes 100), and on a table of a few
            // thousand runs it chose to read them all rather than look up a handful by key
            // (with two servers `perf` caught such plans in some sessions even after the
            // statement was written as key probes; see docs/BENCHMARKS.md). So each statement
            // of the pin writer finds its rows by primary key whatever the statistics say.
            Dialect::Postgres => {
                let pins = opts
                    .max_connections(1)
                    .after_connect(|conn, _| {
                        Box::pin(async move {
                            use sqlx::Executor;
                            conn.execute(
                                "SET enable_seqscan = off; SET enable_hashjoin = off; \
                                 SET enable_mergejoin = off",
                            )
                            .await?;
                            Ok(())
                        })
                    })
                    .connect(url)
                    .await?;
                (pool.clone(), pins)
            }
        };
        let database = match dialect {
            Dialect::Sqlite => sqlite_file(&writer).await?,
            Dialect::Postgres => None,
        };
        let pins = runs::PinWriter::start(pin_writer, dialect, database);
        let store = MetaStore {
            pool,
            writer,
            dialect,
            url: url.into(),
            gc_running: Default::default(),
            pins,
        };
        store.migrate().await?;
        Ok(store)
    }

    pub fn dialect(&self) -> Dialect {
        self.dialect
    }

    /// The URL the store was connected with.
    pub(crate) fn url(&self) -> &str {
        &self.url
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
        if self.dialect == Dialect::Postgres {
            // Servers starting together would race each other's CREATE … IF NOT EXISTS.
            sqlx::query("SELECT pg_advisory_xact_lock($1)")
                .bind(MIGRATION_ADVISORY_LOCK)
                .execute(&mut *tx)
                .await?;
        }
        let rebuilt = match self.dialect {
            Dialect::Sqlite => set_aside_rowid_tables(&mut tx).await?,
            Dialect::Postgres => Vec::new(),
        };
        for stmt in schema(self.dialect) {
            // The schema is a constant of this crate, not input.
            sqlx::query(AssertSqlSafe(stmt)).execute(&mut *tx).await?;
        }
        refill_rebuilt(&mut tx, &rebuilt).await?;
        if self.dialect == Dialect::Postgres {
            // Function bodies hold semicolons: the file goes as one multi-statement query.
            sqlx::raw_sql(AssertSqlSafe(include_str!("schema_postgres.sql")))
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// Waits until no other collection runs, here or on another server, and holds that until
    /// the lock is dropped.
    pub async fn gc_lock(&self) -> Result<GcLock> {
        let in_process = self.gc_running.clone().lock_owned().await;
        let across_servers = match self.dialect {
            Dialect::Sqlite => None,
            Dialect::Postgres => {
                let mut tx = self.pool.begin().await?;
                sqlx::query("SELECT pg_advisory_xact_lock($1)")
                    .bind(GC_ADVISORY_LOCK)
                    .execute(&mut *tx)
                    .await?;
                Some(tx)
            }
        };
        Ok(GcLock {
            _in_process: in_process,
            _across_servers: across_servers,
        })
    }

    /// Connects to `url` once, without migrating, and asks for the server's version: what
    /// `doctor` reports.
    pub async fn probe(url: &str) -> Result<String> {
        use sqlx::Connection;
        page_cache::install();
        sqlx::any::install_default_drivers();
        let mut conn = sqlx::AnyConnection::connect(url).await?;
        let version_query = if url.starts_with("postgres") {
            "SELECT version()"
        } else {
            "SELECT 'SQLite ' || sqlite_version()"
        };
        let row = sqlx::query(version_query).fetch_one(&mut conn).await?;
        let version: String = row.try_get(0)?;
        conn.close().await?;
        Ok(version)
    }

    /// A round trip to the database.
    pub async fn ping(&self) -> Result<()> {
        sqlx::query("SELECT 1").fetch_one(&self.pool).await?;
        Ok(())
    }

    /// A write transaction in which `present()` holds — content the caller references was
    /// checked under the write lock, which content deletion also takes (see `gc.rs`), so the
    /// answer holds until the transaction ends; `None` (rolled back) when it does not.
    pub(crate) async fn write_tx_with(&self, present: PresenceCheck<'_>) -> Result<Option<Tx>> {
        let mut tx = self.write_tx().await?;
        if self.dialect == Dialect::Postgres {
            // A collection's content sweep holds SHARE ROW EXCLUSIVE on these tables (see
            // `lock_for_gc`), which this mode conflicts with: the check below and the sweep
            // are ordered, as SQLite's BEGIN IMMEDIATE orders them. Publishers do not
            // exclude each other (ROW EXCLUSIVE is compatible with itself).
            execute!(
                &mut *tx,
                "LOCK TABLE revisions, draft_files IN ROW EXCLUSIVE MODE"
            );
        }
        match present().await {
            Ok(true) => Ok(Some(tx)),
            Ok(false) => {
                tx.rollback().await?;
                Ok(None)
            }
            Err(e) => {
                tx.rollback().await?;
                Err(e)
            }
        }
    }

    /// A write transaction (`BEGIN IMMEDIATE` on SQLite).
    pub async fn write_tx(&self) -> Result<Tx> {
        Ok(match self.dialect {
            Dialect::Sqlite => self.writer.begin_with("BEGIN IMMEDIATE").await?,
            Dialect::Postgres => self.writer.begin().await?,
        })
    }

    // --- tokens ---

    // --- drafts ---
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A database whose `pins` and `run_skills` an older version made as rowid tables (with
    /// `pins_revision`) opens with both rebuilt `WITHOUT ROWID`, every row kept; a second
    /// open finds the same layout and rows.
    #[tokio::test]
    async fn an_older_database_gets_its_tables_rebuilt_and_keeps_its_rows() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}?mode=rwc", dir.path().join("meta.db").display());
        {
            use sqlx::Connection;
            sqlx::any::install_default_drivers();
            let mut old = sqlx::AnyConnection::connect(&url).await.unwrap();
            for stmt in schema(Dialect::Sqlite) {
                let stmt = stmt.replace(WITHOUT_ROWID, "");
                sqlx::query(AssertSqlSafe(stmt))
                    .execute(&mut old)
                    .await
                    .unwrap();
            }
            sqlx::raw_sql(
                "CREATE INDEX pins_revision ON pins (skill_id, revision);
                 INSERT INTO run_skills VALUES ('run_1', 'a', 'skill_a'), ('run_1', 'b', 'skill_b');
                 INSERT INTO pins VALUES ('run_1', 'skill_a', 'a', 3, 'sha256:aa', 17)",
            )
            .execute(&mut old)
            .await
            .unwrap();
            old.close().await.unwrap();
        }
        let layout = |store: &MetaStore| {
            let pool = store.pool().clone();
            async move {
                let rows: Vec<(String, String)> = sqlx::query_as(
                    "SELECT name, coalesce(sql, '') FROM sqlite_schema WHERE type IN ('table', 'index') ORDER BY name",
                )
                .fetch_all(&pool)
                .await
                .unwrap();
                rows
            }
        };
        for _open in 0..2 {
            let store = MetaStore::connect(&url).await.unwrap();
            let tables = layout(&store).await;
            for table in ["pins", "run_skills"] {
                let (_, sql) = tables.iter().find(|(name, _)| name == table).unwrap();
                assert!(sql.ends_with(WITHOUT_ROWID), "{table}: {sql}");
            }
            assert!(
                !tables
                    .iter()
                    .any(|(name, _)| name.ends_with("_rowid") || name == "pins_revision"),
                "{tables:?}"
            );
            let pins: Vec<(String, String, String, i64, String, i64)> = sqlx::query_as(
                "SELECT run_id, skill_id, skill_name, revision, digest, activated_at FROM pins",
            )
            .fetch_all(store.pool())
            .await
            .unwrap();
            assert_eq!(
                pins,
                [(
                    "run_1".into(),
                    "skill_a".into(),
                    "a".into(),
                    3,
                    "sha256:aa".into(),
                    17
                )]
            );
            let skills: Vec<(String, String, String)> = sqlx::query_as(
                "SELECT run_id, skill_name, skill_id FROM run_skills ORDER BY skill_name",
            )
            .fetch_all(store.pool())
            .await
            .unwrap();
            assert_eq!(
                skills,
                [
                    ("run_1".into(), "a".into(), "skill_a".into()),
                    ("run_1".into(), "b".into(), "skill_b".into())
                ]
            );
        }
    }
}
