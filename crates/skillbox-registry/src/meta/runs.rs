//! Runs: their authorized skills, pins and leases. A pin is written once, in the transaction
//! that locks its revision row, so collection and revocation serialize with it.

use super::pin_thread::PinThread;
use super::wal_checkpoints::{self, WalRestart};
use super::*;
use skillbox_api::Pin;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// A run's row.
#[derive(Debug, Clone)]
pub struct RunRow {
    /// As stored: `active` until finished or marked expired by the sweep.
    pub state: RunState,
    pub ttl_ms: i64,
    pub expires_at: i64,
    pub require_immutable: bool,
    pub created_at: i64,
}

impl RunRow {
    /// The state as of `now`: a lapsed lease reads as `expired` before the sweep marks it.
    pub fn state_at(&self, now: i64) -> RunState {
        if self.state == RunState::Active && self.expires_at <= now {
            RunState::Expired
        } else {
            self.state
        }
    }
}

/// A run with its authorized skills and its pins.
#[derive(Debug, Clone)]
pub struct RunRecord {
    pub row: RunRow,
    /// (name, skill id), by name.
    pub authorized: Vec<(String, String)>,
    /// By activation time.
    pub pins: Vec<Pin>,
}

/// A pin of a live run with the run's lease, read without a write transaction.
#[derive(Debug, Clone)]
pub struct LivePin {
    pub skill_id: String,
    pub revision: i64,
    pub digest: String,
    pub ttl_ms: i64,
    pub expires_at: i64,
}

/// What a pinned read checks: the run's state and lease, and its pin of a skill (if any) with
/// the pinned revision's state.
#[derive(Debug, Clone)]
pub struct PinnedRevision {
    pub run_state: RunState,
    pub expires_at: i64,
    pub ttl_ms: i64,
    pub pin: Option<PinRef>,
}

#[derive(Debug, Clone)]
pub struct PinRef {
    pub skill_id: String,
    pub revision: i64,
    pub digest: String,
    /// `None` when the revision row is gone.
    pub revision_state: Option<RevisionState>,
    pub state_reason: Option<String>,
}

fn run_state(s: &str) -> Result<RunState> {
    RunState::parse(s).ok_or_else(|| RegistryError::broken(format!("unknown run state {s:?}")))
}

async fn run_row(tx: &mut Tx, workspace: &str, id: &str) -> Result<Option<RunRow>> {
    let row = sqlx::query("SELECT state, ttl_ms, expires_at, require_immutable, created_at FROM runs WHERE id = $1 AND workspace = $2")
        .bind(id)
        .bind(workspace)
        .fetch_optional(&mut **tx)
        .await?;
    row.map(|r| {
        let require_immutable: i64 = r.try_get(3)?;
        Ok(RunRow {
            state: run_state(&r.try_get::<String, _>(0)?)?,
            ttl_ms: r.try_get(1)?,
            expires_at: r.try_get(2)?,
            require_immutable: require_immutable != 0,
            created_at: r.try_get(4)?,
        })
    })
    .transpose()
}

/// `activation_conflict` when `requested` names a revision other than the one `skill` is
/// pinned to in the run.
pub(crate) fn check_requested(skill: &str, pinned: i64, requested: Option<i64>) -> Result<()> {
    match requested.filter(|r| *r != pinned) {
        Some(req) => Err(RegistryError::ActivationConflict {
            skill: skill.to_string(),
            pinned_revision: pinned,
            requested_revision: req,
        }),
        None => Ok(()),
    }
}

/// A run that is not active: `not_found` saying so.
pub(crate) fn run_state_error(id: &str, state: RunState) -> RegistryError {
    RegistryError::NotFound(format!("run {id} is {state}; create a new run"))
}

impl MetaStore {
    /// Records a new active run authorized for `authorized` (name, skill id).
    pub async fn insert_run(
        &self,
        id: &str,
        workspace: &str,
        ttl_ms: i64,
        require_immutable: bool,
        authorized: &[(String, String)],
        now: i64,
    ) -> Result<()> {
        let mut tx = self.write_tx().await?;
        execute!(
            &mut *tx,
            "INSERT INTO runs (id, workspace, state, ttl_ms, expires_at, require_immutable, created_at) VALUES ($1, $2, 'active', $3, $4, $5, $6)",
            id,
            workspace,
            ttl_ms,
            now + ttl_ms,
            require_immutable as i64,
            now
        );
        for (name, skill_id) in authorized {
            execute!(
                &mut *tx,
                "INSERT INTO run_skills (run_id, skill_name, skill_id) VALUES ($1, $2, $3)",
                id,
                name,
                skill_id
            );
        }
        tx.commit().await?;
        Ok(())
    }

    /// A run with its authorized skills and pins, read in one transaction.
    pub async fn run(&self, workspace: &str, id: &str) -> Result<Option<RunRecord>> {
        let mut tx = self.pool().begin().await?;
        let Some(row) = run_row(&mut tx, workspace, id).await? else {
            return Ok(None);
        };
        let authorized = sqlx::query(
            "SELECT skill_name, skill_id FROM run_skills WHERE run_id = $1 ORDER BY skill_name",
        )
        .bind(id)
        .fetch_all(&mut *tx)
        .await?
        .iter()
        .map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
        .collect::<Result<_>>()?;
        let pins = sqlx::query("SELECT skill_name, skill_id, revision, digest, activated_at FROM pins WHERE run_id = $1 ORDER BY activated_at, skill_name")
            .bind(id)
            .fetch_all(&mut *tx)
            .await?
            .iter()
            .map(|p| {
                Ok(from_row!(p => Pin {
                    skill, skill_id, revision, digest, activated_at
                }))
            })
            .collect::<Result<_>>()?;
        tx.commit().await?;
        // Its pins and lease may be a pin batch's, committed but not flushed yet.
        self.pins.reads_are_durable().await?;
        Ok(Some(RunRecord {
            row,
            authorized,
            pins,
        }))
    }

    /// Moves an active, unexpired run's lease to `expires_at`.
    pub async fn renew_lease(&self, id: &str, expires_at: i64, now: i64) -> Result<()> {
        execute!(
            self.writer(),
            "UPDATE runs SET expires_at = $2 WHERE id = $1 AND state = 'active' AND expires_at > $3",
            id,
            expires_at,
            now
        );
        Ok(())
    }

    /// Pins `skill` in the run, once: its existing pin, else the requested (or current)
    /// revision, ordered with collection and revocation (see `pin_insert`); renews the run's
    /// lease. Says whether the pin was written now (then the revision was available as the
    /// pin was decided: a revocation committed meanwhile is ordered after it). The
    /// pin goes through the group commit ([`PinWriter`]): answered once the batch holding it
    /// is durable; an existing pin is found there too, by the write's own check.
    pub async fn pin(
        &self,
        workspace: &str,
        run_id: &str,
        skill: &str,
        requested: Option<i64>,
        now: i64,
    ) -> Result<(LivePin, bool)> {
        let request = PinRequest {
            workspace: workspace.to_string(),
            run_id: run_id.to_string(),
            skill: skill.to_string(),
            requested,
            now,
        };
        if let Some(thread) = &self.pins.thread {
            match thread.pin(request.clone()).await {
                Some(Ok(Some(pinned))) => return Ok(pinned),
                Some(Err(e)) => return Err(e),
                // Not the common case, or the thread is gone: the long way.
                Some(Ok(None)) | None => {}
            }
        }
        if let Some(queue) = &self.pins.queue {
            let (reply, answer) = tokio::sync::oneshot::channel();
            if queue.send((request.clone(), reply)).is_ok() {
                // `Err` only when the writer task is gone (its runtime shut down): pin alone.
                if let Ok(answer) = answer.await {
                    return answer;
                }
            }
        }
        PinWriter::write_alone(self.writer(), self.dialect, &request, &self.pins.stats).await
    }

    /// Durable commits that wrote pins, and pins written, since the store was opened.
    pub fn pin_commits(&self) -> (u64, u64) {
        (
            self.pins.stats.commits.load(Ordering::Relaxed),
            self.pins.stats.written.load(Ordering::Relaxed),
        )
    }

    /// The run's state and lease and its pin of `skill` with the revision's state; `None`
    /// when there is no such run.
    pub async fn pinned_revision(
        &self,
        workspace: &str,
        run_id: &str,
        skill: &str,
    ) -> Result<Option<PinnedRevision>> {
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
        .fetch_optional(self.pool())
        .await?;
        let Some(row) = row else { return Ok(None) };
        // The pin and lease may be a pin batch's, committed but not flushed yet.
        self.pins.reads_are_durable().await?;
        let skill_id: Option<String> = row.try_get(3)?;
        let pin = match skill_id {
            None => None,
            Some(skill_id) => Some(PinRef {
                skill_id,
                revision: row.try_get(4)?,
                digest: row.try_get(5)?,
                revision_state: row
                    .try_get::<Option<String>, _>(6)?
                    .map(|s| revision_state(&s))
                    .transpose()?,
                state_reason: row.try_get(7)?,
            }),
        };
        Ok(Some(PinnedRevision {
            run_state: run_state(&row.try_get::<String, _>(0)?)?,
            expires_at: row.try_get(1)?,
            ttl_ms: row.try_get(2)?,
            pin,
        }))
    }

    /// Extends an active run's lease by its ttl from `now`; false when the run is not active.
    pub async fn heartbeat(&self, workspace: &str, run_id: &str, now: i64) -> Result<bool> {
        let done = sqlx::query("UPDATE runs SET expires_at = $3 + ttl_ms WHERE id = $1 AND workspace = $2 AND state = 'active' AND expires_at > $3 RETURNING id")
            .bind(run_id)
            .bind(workspace)
            .bind(now)
            .fetch_optional(self.writer())
            .await?;
        Ok(done.is_some())
    }

    /// Marks an active run finished.
    pub async fn finish_run(&self, workspace: &str, run_id: &str, now: i64) -> Result<()> {
        execute!(
            self.writer(),
            "UPDATE runs SET state = 'finished', ended_at = $3 WHERE id = $1 AND workspace = $2 AND state = 'active'",
            run_id,
            workspace,
            now
        );
        Ok(())
    }

    /// Whether run `id` (of any workspace) is active at `now`.
    pub async fn run_is_live(&self, id: &str, now: i64) -> Result<bool> {
        let row = sqlx::query(
            "SELECT 1 FROM runs WHERE id = $1 AND state = 'active' AND expires_at > $2",
        )
        .bind(id)
        .bind(now)
        .fetch_optional(self.pool())
        .await?;
        Ok(row.is_some())
    }

    /// Marks runs whose lease lapsed by `now` as `expired`; returns how many.
    pub async fn expire_runs(&self, now: i64) -> Result<u64> {
        // On PostgreSQL every `UPDATE … state` statement tells all servers to drop their
        // cached pins, even one that changed no row: the sweep, every few seconds, would
        // empty every pin cache. A read first, so only a sweep with work writes.
        let due =
            sqlx::query("SELECT 1 FROM runs WHERE state = 'active' AND expires_at <= $1 LIMIT 1")
                .bind(now)
                .fetch_optional(self.pool())
                .await?;
        if due.is_none() {
            return Ok(0);
        }
        let r = execute!(
            self.writer(),
            "UPDATE runs SET state = 'expired', ended_at = expires_at WHERE state = 'active' AND expires_at <= $1",
            now
        );
        Ok(r.rows_affected())
    }

    /// The ids of the workspace's live runs (active, lease not lapsed at `now`), newest first,
    /// at most `limit`.
    pub async fn live_run_ids(&self, workspace: &str, now: i64, limit: i64) -> Result<Vec<String>> {
        let rows = sqlx::query(
            "SELECT id FROM runs WHERE workspace = $1 AND state = 'active' AND expires_at > $2 \
             ORDER BY created_at DESC, id LIMIT $3",
        )
        .bind(workspace)
        .bind(now)
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(|r| Ok(r.try_get(0)?)).collect()
    }

    /// The names of the workspaces that have skills or workspace tokens.
    pub async fn workspace_names(&self) -> Result<Vec<String>> {
        let rows = sqlx::query(
            "SELECT name FROM workspaces UNION SELECT workspace FROM tokens WHERE role <> 'node' \
             AND workspace <> '' ORDER BY 1",
        )
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(|r| Ok(r.try_get(0)?)).collect()
    }
}

/// One activation's pin to write.
#[derive(Debug, Clone, Serialize)]
pub(super) struct PinRequest {
    pub(super) workspace: String,
    pub(super) run_id: String,
    pub(super) skill: String,
    pub(super) requested: Option<i64>,
    pub(super) now: i64,
}

type PinReply = tokio::sync::oneshot::Sender<Result<(LivePin, bool)>>;

#[derive(Default)]
pub(super) struct PinStats {
    commits: AtomicU64,
    written: AtomicU64,
}

impl PinStats {
    /// One durable commit that wrote `written` pins.
    fn committed(&self, written: u64) {
        self.flushed();
        self.wrote(written);
    }

    /// Pins committed, to be made durable by a later flush.
    pub(super) fn wrote(&self, written: u64) {
        self.written.fetch_add(written, Ordering::Relaxed);
    }

    /// One flush that made pins durable.
    fn flushed(&self) {
        self.commits.fetch_add(1, Ordering::Relaxed);
    }
}

/// Group commit of pins: pins that arrive while a batch commits are written together in the
/// next transaction — one commit, one WAL flush — and each caller is answered only after the
/// commit of the batch holding its pin returned.
///
/// Batches commit one after another. SQLite has one writer, and every commit waits for its own
/// fsync. With the database in a file, the common case of each batch is written by a thread
/// of its own ([`PinThread`]) and flushed by another ([`pin_sync`]); only the requests it
/// leaves come to the writer task. PostgreSQL could commit several batches concurrently, but
/// each batch pays a statement's start, a transaction and a commit whatever it holds, and
/// those, not the flush, are what its pins cost on a busy machine: one batch in flight per
/// server makes the batches larger (`scripts/bench-scale-out`: two servers 7.4–8.8k new
/// pins/s with four in flight, 9.4–11.1k/s with one; one server no slower; see
/// docs/BENCHMARKS.md).
#[derive(Clone, Default)]
pub(crate) struct PinWriter {
    /// SQLite in WAL mode: the common case of every pin, on a thread of its own.
    thread: Option<PinThread>,
    /// The rest, and everything where there is no such thread.
    queue: Option<tokio::sync::mpsc::UnboundedSender<(PinRequest, PinReply)>>,
    stats: Arc<PinStats>,
    /// SQLite with its WAL flushed beside the writer ([`pin_sync`]): which batches are durable.
    durability: Option<Arc<pin_sync::Durability>>,
}

/// The WAL flusher's end of [`PinWriter`], on SQLite: batches are numbered, committed without
/// their own fsync, and handed over to be flushed and answered.
struct DeferredFlush {
    durability: Arc<pin_sync::Durability>,
    flushes: pin_sync::Flushes<(LivePin, bool)>,
}

impl PinWriter {
    /// The most pins one transaction writes: bounds how long the writer lock is held.
    pub(super) const MAX_BATCH: usize = 512;

    /// Starts the writer task on `writer` (SQLite's one-connection pool, or PostgreSQL's
    /// pool); on SQLite, given the database's file, also the pin writer's thread
    /// ([`PinThread`]), the WAL's flusher ([`pin_sync`]) and its checkpoints
    /// ([`wal_checkpoints`]). They end when the last store holding the queue is dropped.
    /// Without a file (a database in memory) each batch's commit flushes by itself.
    ///
    /// With the thread, the writer task's batches (the requests the thread leaves) flush in
    /// their own commits: one producer of numbered batches, so the flusher sees them in order.
    /// Without it (it could not be started), the writer task's batches are flushed by the
    /// flusher.
    pub(crate) fn start(
        writer: AnyPool,
        dialect: Dialect,
        database: Option<std::path::PathBuf>,
    ) -> Self {
        let (queue, requests) = tokio::sync::mpsc::unbounded_channel();
        let stats = Arc::<PinStats>::default();
        let restart = Arc::<WalRestart>::default();
        let (thread, durability, deferred) = match database.as_deref() {
            Some(database) => match start_pin_thread(database, &stats, &restart) {
                Some((thread, durability)) => (Some(thread), Some(durability), None),
                None => {
                    let deferred = start_flusher(database, &stats).map(|(durability, flushes)| {
                        DeferredFlush {
                            durability,
                            flushes,
                        }
                    });
                    (
                        None,
                        deferred.as_ref().map(|d| d.durability.clone()),
                        deferred,
                    )
                }
            },
            None => (None, None, None),
        };
        let checkpoints = database
            .as_deref()
            .and_then(|database| start_checkpoints(database, restart));
        let write = Self::write_batches(writer, dialect, requests, stats.clone(), deferred);
        tokio::spawn(async move {
            write.await;
            drop(checkpoints);
        });
        PinWriter {
            thread,
            queue: Some(queue),
            stats,
            durability,
        }
    }

    /// See [`pin_sync::Durability::reads_are_durable`]; at once where commits flush by
    /// themselves.
    async fn reads_are_durable(&self) -> Result<()> {
        match &self.durability {
            Some(durability) => durability.reads_are_durable().await,
            None => Ok(()),
        }
    }

    async fn write_batches(
        writer: AnyPool,
        dialect: Dialect,
        mut requests: tokio::sync::mpsc::UnboundedReceiver<(PinRequest, PinReply)>,
        stats: Arc<PinStats>,
        deferred: Option<DeferredFlush>,
    ) {
        loop {
            // Requests arriving while a batch is written gather into the next one.
            let mut batch = Vec::new();
            if requests.recv_many(&mut batch, Self::MAX_BATCH).await == 0 {
                return;
            }
            Self::write_and_answer(&writer, dialect, batch, &stats, deferred.as_ref()).await;
        }
    }

    /// Writes a batch and answers each of its callers: at once when its commit flushed by
    /// itself, else once the flusher made it durable.
    async fn write_and_answer(
        writer: &AnyPool,
        dialect: Dialect,
        batch: Vec<(PinRequest, PinReply)>,
        stats: &PinStats,
        deferred: Option<&DeferredFlush>,
    ) {
        let (number, commit) = match deferred {
            Some(d) => (d.durability.start_batch(), Transaction::OwnUnflushed),
            None => (0, Transaction::Own),
        };
        let answers = match Self::write_together(writer, dialect, &batch, stats, commit).await {
            Ok(answers) => answers,
            // A database error anywhere (on PostgreSQL also a deadlock with another server's batch)
            // rolled the whole batch back: each pin again in a transaction of its own, so each
            // gets its own answer.
            Err(_) => {
                let mut answers = Vec::with_capacity(batch.len());
                for (request, _) in &batch {
                    answers.push(Self::write_alone(writer, dialect, request, stats).await);
                }
                answers
            }
        };
        let answers: Vec<_> = batch
            .into_iter()
            .map(|(_, reply)| reply)
            .zip(answers)
            .collect();
        let answers = match deferred {
            Some(d) => {
                let written = answers.iter().filter(|(_, a)| matches!(a, Ok((_, true))));
                let written = written.count() as u64;
                let batch = pin_sync::CommittedBatch {
                    number,
                    written,
                    answers,
                };
                match d.flushes.send(batch) {
                    Ok(()) => return,
                    // The flusher is gone (it could not have ended otherwise): no answer may
                    // leave before a flush.
                    Err(mpsc_error) => mpsc_error
                        .0
                        .answers
                        .into_iter()
                        .map(|(reply, _)| {
                            let e = RegistryError::broken("the pin batches' WAL flusher stopped");
                            (reply, Err(e))
                        })
                        .collect(),
                }
            }
            None => answers,
        };
        for (reply, answer) in answers {
            // The caller may have gone (its request was cancelled): the pin stays.
            let _ = reply.send(answer);
        }
    }

    async fn begin(writer: &AnyPool, dialect: Dialect) -> Result<Tx> {
        Ok(match dialect {
            Dialect::Sqlite => writer.begin_with("BEGIN IMMEDIATE").await?,
            Dialect::Postgres => writer.begin().await?,
        })
    }

    async fn write_together(
        writer: &AnyPool,
        dialect: Dialect,
        batch: &[(PinRequest, PinReply)],
        stats: &PinStats,
        commit: Transaction,
    ) -> Result<Vec<Result<(LivePin, bool)>>> {
        let requests: Vec<&PinRequest> = batch.iter().map(|(r, _)| r).collect();
        // The common case commits by itself (SQLite: one query from BEGIN IMMEDIATE to
        // COMMIT; PostgreSQL: one statement); the rest (if any) get a transaction of their own.
        let mut fresh =
            pin_common(&mut *writer.acquire().await?, dialect, commit, &requests).await?;
        let wrote = fresh.values().filter(|(_, wrote)| *wrote).count() as u64;
        match commit {
            Transaction::OwnUnflushed => stats.wrote(wrote),
            _ => stats.committed(wrote),
        }
        let mut tx: Option<Tx> = None;
        // Pins written in `tx`, whose commit is still to come.
        let mut written = 0;
        let mut answers = Vec::with_capacity(batch.len());
        for request in requests {
            if let Some(pinned) = fresh.remove(&(request.run_id.clone(), request.skill.clone())) {
                answers.push(Ok(pinned));
                continue;
            }
            // The rest one by one. An answer that is an error wrote nothing (every check
            // precedes the writes), so the batch goes on; a database error ends it (dropping
            // `tx` rolls back).
            let tx = match &mut tx {
                Some(tx) => tx,
                None => tx.insert(Self::begin(writer, dialect).await?),
            };
            match pin_the_long_way(tx, request).await {
                Ok((pin, wrote)) => {
                    written += u64::from(wrote);
                    answers.push(Ok((pin, wrote)));
                }
                Err(e @ RegistryError::Metadata(_)) => return Err(e),
                Err(e) => answers.push(Err(e)),
            }
        }
        if let Some(tx) = tx {
            tx.commit().await?;
            stats.committed(written);
        }
        Ok(answers)
    }

    async fn write_alone(
        writer: &AnyPool,
        dialect: Dialect,
        request: &PinRequest,
        stats: &PinStats,
    ) -> Result<(LivePin, bool)> {
        let mut tx = Self::begin(writer, dialect).await?;
        let (pin, wrote) = pin_in(&mut tx, dialect, request).await?;
        tx.commit().await?;
        stats.committed(u64::from(wrote));
        Ok((pin, wrote))
    }
}

/// The pin writer's thread on `database` with its WAL's flusher; `None` when either cannot be
/// started.
fn start_pin_thread(
    database: &std::path::Path,
    stats: &Arc<PinStats>,
    restart: &Arc<WalRestart>,
) -> Option<(PinThread, Arc<pin_sync::Durability>)> {
    let (durability, flushes) = start_flusher(database, stats)?;
    let started = PinThread::start(
        database,
        durability.clone(),
        flushes,
        stats.clone(),
        restart.clone(),
    );
    match started {
        Ok(thread) => Some((thread, durability)),
        Err(e) => {
            tracing::warn!(error = %e, "no pin writer thread: pins are written by the writer task");
            None
        }
    }
}

/// The flusher ([`pin_sync`]) of `database`'s WAL, counting its flushes in `stats`; `None`
/// (each batch then flushes in its commit) when its thread cannot be started.
pub(super) fn start_flusher<A: Send + 'static>(
    database: &std::path::Path,
    stats: &Arc<PinStats>,
) -> Option<(Arc<pin_sync::Durability>, pin_sync::Flushes<A>)> {
    let mut wal = database.as_os_str().to_owned();
    wal.push("-wal");
    let flushed = stats.clone();
    pin_sync::start(wal.into(), move || flushed.flushed())
        .inspect_err(|e| {
            tracing::warn!(error = %e, "no WAL flusher thread: each pin batch flushes in its commit");
        })
        .ok()
}

/// The WAL's checkpoint thread ([`wal_checkpoints`]) of `database`, asking `restart` for
/// restarts; `None` (SQLite's automatic checkpoint then keeps the WAL short) when it cannot
/// be started.
fn start_checkpoints(
    database: &std::path::Path,
    restart: Arc<WalRestart>,
) -> Option<wal_checkpoints::WalCheckpoints> {
    wal_checkpoints::start(database, restart)
        .inspect_err(|e| {
            tracing::warn!(error = %e, "no WAL checkpoint thread: the automatic checkpoint keeps the WAL short");
        })
        .ok()
}

/// The common case of pinning, however many requests: every request for a live run, an
/// authorized active skill and an available revision, not pinned yet, is pinned by one
/// `INSERT … SELECT` over the requests; the leases of the runs that got pins are renewed where
/// less than half is left (as any activity renews a lease: a renewal dirties the run's row,
/// and most activations come early in their run's lease), and read. The existing pins of
/// the other requests' live runs are then read where no other revision is requested. Returns
/// those pins by (run, skill name), each with whether it was written now; the other requests
/// (and repeats of a pair) are left for [`pin_the_long_way`], which says why they differ.
///
/// SQLite: three statements (insert, renewal, lease read) sent as one query, inside the
/// caller's transaction ([`Transaction::Open`]) or between their own `BEGIN IMMEDIATE` and
/// `COMMIT` ([`Transaction::Own`]); the write lock, held from `BEGIN IMMEDIATE`, orders them
/// with collection and revocation. The renewal looks only at the requests' runs with less
/// than half their lease left, and finds which of them got pins by the pins' key (through
/// `run_skills`) and activation time (a pin of the same pair from an earlier batch in the
/// same millisecond would renew once more, from that same time: harmless). Finding them by
/// skill name walked every pin of the run, a row read each: 20% of new pins' throughput in
/// `scripts/bench-runs`. PostgreSQL: one statement
/// (the writes as data-modifying CTEs), atomic and durable by itself, so the group commit
/// runs it outside a transaction: one round trip and one commit per batch. There no row lock
/// orders the pins with collection and revocation (see [`pin_insert`] for what does). A pin
/// committed meanwhile by another transaction is no conflict: nothing is written, and the
/// long way finds that pin. The insert skips an existing pin by the conflict (a `NOT EXISTS`
/// probe instead was planned by PostgreSQL as a scan of every pin of the skill per request),
/// and the read after it finds that pin.
///
/// On PostgreSQL the requests travel as one JSON parameter, so the statement has one text
/// whatever the batch's size: it is parsed once per connection and stays in its statement
/// cache (PostgreSQL may then keep a generic plan for it), where a `VALUES` list of each
/// batch's length was a new statement to parse and plan for nearly every batch. SQLite keeps
/// the `VALUES` list (see the SQLite arm for why not JSON there).
async fn pin_common(
    conn: &mut sqlx::AnyConnection,
    dialect: Dialect,
    transaction: Transaction,
    requests: &[&PinRequest],
) -> Result<HashMap<(String, String), (LivePin, bool)>> {
    let requests = first_of_each_pair(requests);
    let mut pins = HashMap::new();
    if requests.is_empty() {
        return Ok(pins);
    }
    match dialect {
        Dialect::Postgres => {
            let rows = sqlx::query(AssertSqlSafe(PIN_COMMON_POSTGRES.as_str()))
                .bind(requests_json(&requests)?)
                .fetch_all(&mut *conn)
                .await?;
            for row in rows {
                let lease = (row.try_get(5)?, row.try_get(6)?);
                let (key, pin) = inserted_pin(&row, lease)?;
                pins.insert(key, (pin, true));
            }
        }
        Dialect::Sqlite => {
            // A `VALUES` list here, not JSON: with `json_each` a batch took ~80 ms in
            // `scripts/bench-runs` (new pins fell from 10k/s to 380/s; the planner's join
            // order around a table-valued function is the suspect); with `VALUES` ~3 ms, its
            // fsync included.
            // Every statement in one query, so one round trip to the connection's worker
            // thread (each took ~0.1–0.7 ms under load, more than the statement's own work).
            let statements = sqlite_pin_statements(requests.len()).join(";\n");
            // `synchronous` is the connection's: FULL again right after the commit, for the
            // writer's other transactions.
            let text = match transaction {
                Transaction::Open => statements,
                Transaction::Own => format!("BEGIN IMMEDIATE; {statements}; COMMIT"),
                Transaction::OwnUnflushed => format!(
                    "PRAGMA synchronous = NORMAL; BEGIN IMMEDIATE; {statements}; COMMIT; \
                     PRAGMA synchronous = FULL"
                ),
            };
            // Anonymous parameters are taken in order through the query: one set of the
            // requests for each statement that lists them.
            let query = (0..SQLITE_PIN_STATEMENTS)
                .fold(sqlx::query(AssertSqlSafe(text)), |query, _list| {
                    bind_sqlite_requests(query, &requests)
                });
            let rows = match query.fetch_all(&mut *conn).await {
                Ok(rows) => rows,
                Err(e) => {
                    if transaction != Transaction::Open {
                        // Whatever statement failed, nothing of the batch stays: the
                        // connection goes back to its pool with no transaction open, and
                        // flushing in its commits.
                        let _ = sqlx::query("ROLLBACK").execute(&mut *conn).await;
                        if let Err(e) = sqlx::query("PRAGMA synchronous = FULL")
                            .execute(&mut *conn)
                            .await
                        {
                            // Only inside a transaction that would not roll back: the
                            // connection is broken, and its next statement says so.
                            tracing::error!(error = %e, "the pin writer's connection could not be set back to flush at commit");
                        }
                    }
                    return Err(e.into());
                }
            };
            // The insert's rows (six columns), then the leases of the requests' runs (three).
            let (inserted, leases): (Vec<_>, Vec<_>) =
                rows.into_iter().partition(|row| row.columns().len() == 6);
            let mut lease_of = HashMap::new();
            for row in leases {
                let (id, ttl_ms, expires_at): (String, i64, i64) =
                    (row.try_get(0)?, row.try_get(1)?, row.try_get(2)?);
                lease_of.insert(id, (ttl_ms, expires_at));
            }
            for row in inserted {
                let run_id: String = row.try_get(0)?;
                let Some(&lease) = lease_of.get(&run_id) else {
                    return Err(RegistryError::broken(format!(
                        "run {run_id} got a pin but its lease cannot be read"
                    )));
                };
                let (key, pin) = inserted_pin(&row, lease)?;
                pins.insert(key, (pin, true));
            }
        }
    }
    // The rest may be pins that exist (activated before, not in this server's pin cache: after
    // a restart, or on another server): found here, as the long way would find them, with one
    // more statement only for a batch that has such requests. (Requests are one per pair: when
    // every one was inserted there is no rest to look for.)
    if pins.len() < requests.len() {
        let rest: Vec<&PinRequest> = requests
            .into_iter()
            .filter(|r| !pins.contains_key(&(r.run_id.clone(), r.skill.clone())))
            .collect();
        let query = match dialect {
            Dialect::Postgres => sqlx::query(EXISTING_PINS_POSTGRES).bind(requests_json(&rest)?),
            Dialect::Sqlite => bind_sqlite_requests(
                sqlx::query(AssertSqlSafe(sqlite_existing_pins(rest.len()))),
                &rest,
            ),
        };
        for row in query.fetch_all(&mut *conn).await? {
            let lease = (row.try_get(5)?, row.try_get(6)?);
            let (key, pin) = inserted_pin(&row, lease)?;
            pins.insert(key, (pin, false));
        }
    }
    Ok(pins)
}

/// Binds one list of `requests` ([`sqlite_requests`]: five anonymous parameters each, in
/// order) to `query`.
fn bind_sqlite_requests<'q>(
    query: sqlx::query::Query<'q, sqlx::Any, sqlx::any::AnyArguments>,
    requests: &[&PinRequest],
) -> sqlx::query::Query<'q, sqlx::Any, sqlx::any::AnyArguments> {
    requests.iter().fold(query, |query, r| {
        query
            .bind(r.run_id.clone())
            .bind(r.workspace.clone())
            .bind(r.skill.clone())
            .bind(r.requested)
            .bind(r.now)
    })
}

/// Requests as the JSON array PostgreSQL's pin statements take as `$1`.
fn requests_json(requests: &[&PinRequest]) -> Result<String> {
    serde_json::to_string(requests).map_err(RegistryError::internal)
}

/// The first request for each (run, skill) pair, in order: the common case writes those, and
/// leaves a repeat to the long way, which finds the pin its first wrote.
pub(super) fn first_of_each_pair<'a>(requests: &[&'a PinRequest]) -> Vec<&'a PinRequest> {
    let mut firsts = std::collections::HashSet::new();
    requests
        .iter()
        .copied()
        .filter(|r| firsts.insert((r.run_id.as_str(), r.skill.as_str())))
        .collect()
}

/// Whether [`pin_common`] runs inside a transaction the caller opened, or commits by itself:
/// on SQLite either with the commit's own WAL fsync, or without it, when the caller has the
/// batch flushed before it answers ([`pin_sync`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Transaction {
    Open,
    Own,
    OwnUnflushed,
}

/// [`pin_common`]'s insert of a pin for every request of `req` that is the common case,
/// returning the pins written (`run_id, skill_name, skill_id, revision, digest,
/// activated_at`).
///
/// An existing pin is skipped: on PostgreSQL by `ON CONFLICT DO NOTHING`, on SQLite by
/// `INSERT OR IGNORE`. Both skip only rows whose key exists (every other column comes from a
/// `NOT NULL` one), but SQLite's upsert clause leaves the statement able to abort on another
/// constraint, and a statement of many rows that can abort copies every page it changes into
/// a statement journal first (7% of the pin writer's time in `scripts/bench-runs`); `OR
/// IGNORE` cannot abort.
///
/// On PostgreSQL each lookup is a `LATERAL` subquery that `OFFSET 0` keeps from being merged
/// into a join: PostgreSQL plans the statement without knowing how many requests the JSON
/// holds (it assumes 100), and its generic plan joined them to every live run by a hash of
/// the whole `runs` table, which grew with the number of runs (`scripts/bench-scale-out`:
/// 1.9 instead of 6.8 ms for a batch of 30 among 2,450 runs). This way every lookup is one
/// probe of a primary key, whatever the table holds.
///
/// On PostgreSQL the revision row is read without a row lock, yet neither collection nor
/// revocation can be interleaved with the pin:
/// - Collection locks `pins` against inserts (`lock_for_gc`) before it reads which revisions
///   are pinned, and the statement takes that table's lock before its snapshot: a pin
///   statement under way holds collection back until it commits (collection then sees the
///   pin), and one that starts during a collection waits, then sees what was collected.
/// - A revocation that commits while a pin statement runs is concurrent with that
///   activation, which takes effect first (its snapshot read the revision as available).
///   Every later use of the pin asks the database or a pin cache the revocation emptied
///   (the entry the activation stores carries the generation from before its pin, which
///   the revocation bumped), and is refused with `revision_revoked`.
///
/// A share lock (`FOR SHARE`) did the same at a cost: PostgreSQL records each row lock in
/// the row (a WAL record and a dirtied page per pinned revision per batch) and shares one
/// row among concurrent batches through a multixact, which every further locker rewrites.
/// With two servers that was more than half of PostgreSQL's CPU per pin
/// (`scripts/bench-scale-out`: 6.7k new pins/s with it, 13.6k/s without).
fn pin_insert(dialect: Dialect) -> String {
    const INTO: &str = "INTO pins (run_id, skill_id, skill_name, revision, digest, activated_at)
         SELECT r.id, rs.skill_id, rs.skill_name, v.revision, v.digest, req.now
         FROM req";
    const RETURNING: &str =
        "RETURNING run_id, skill_name, skill_id, revision, digest, activated_at";
    match dialect {
        Dialect::Sqlite => format!(
            "INSERT OR IGNORE {INTO}
             JOIN runs r ON r.id = req.run_id AND r.workspace = req.workspace
                 AND r.state = 'active' AND r.expires_at > req.now
             JOIN run_skills rs ON rs.run_id = r.id AND rs.skill_name = req.skill
             JOIN skills s ON s.id = rs.skill_id AND s.state = 'active'
             JOIN revisions v ON v.skill_id = s.id AND v.state = 'available'
                 AND v.revision = COALESCE(req.requested, s.current_revision)
             {RETURNING}"
        ),
        Dialect::Postgres => format!(
            "INSERT {INTO}
             CROSS JOIN LATERAL (SELECT id FROM runs WHERE id = req.run_id
                 AND workspace = req.workspace AND state || '' = 'active'
                 AND expires_at + 0 > req.now OFFSET 0) r
             CROSS JOIN LATERAL (SELECT skill_id, skill_name FROM run_skills
                 WHERE run_id = r.id AND skill_name = req.skill OFFSET 0) rs
             CROSS JOIN LATERAL (SELECT current_revision FROM skills
                 WHERE id = rs.skill_id AND state = 'active' OFFSET 0) s
             CROSS JOIN LATERAL (SELECT revision, digest FROM revisions
                 WHERE skill_id = rs.skill_id AND state = 'available'
                     AND revision = COALESCE(req.requested, s.current_revision)
                 OFFSET 0) v
             ON CONFLICT (run_id, skill_id) DO NOTHING
             {RETURNING}"
        ),
    }
}

/// [`pin_common`]'s lease renewal of the runs in `at (run_id, at)`: from the latest pin of
/// each, and only while the run is live. The state and expiry terms are kept from matching
/// the `runs_live` index on those columns, so the planner stays on the primary key: with
/// that index it walked every live run (SQLite: ~0.3 ms a batch of 4 in
/// `scripts/bench-runs`; PostgreSQL: a bitmap scan of every active run with each one's id
/// compared to every id of the batch, whenever its statistics said few runs were active,
/// which halved two servers' new pins in some runs of `scripts/bench-scale-out` and not in
/// others). SQLite's idiom is a `+` before the column; PostgreSQL's an expression
/// (`state || ''`, `expires_at + 0`), and the `ANY` of the runs' ids gives its index scan a
/// key (see [`pin_insert`] for why its planner needs telling). [`pin_insert`]'s run lookup
/// on PostgreSQL is written the same way.
fn renew(dialect: Dialect) -> &'static str {
    match dialect {
        Dialect::Sqlite => {
            "UPDATE runs SET expires_at = at.at + ttl_ms FROM at
             WHERE id = at.run_id AND +state = 'active' AND +expires_at > at.at
                 AND expires_at - at.at < ttl_ms / 2"
        }
        Dialect::Postgres => {
            "UPDATE runs SET expires_at = at.at + ttl_ms FROM at
             WHERE id = ANY (ARRAY(SELECT run_id FROM at)) AND id = at.run_id
                 AND state || '' = 'active' AND expires_at + 0 > at.at
                 AND expires_at - at.at < ttl_ms / 2"
        }
    }
}

/// How many statements [`sqlite_pin_statements`] makes.
const SQLITE_PIN_STATEMENTS: usize = 3;

/// `n` pin requests as SQLite's common table `req (run_id, workspace, skill, requested, now)`:
/// `n` rows of five anonymous parameters, bound in that order.
pub(super) fn sqlite_requests(n: usize) -> String {
    format!(
        "WITH req (run_id, workspace, skill, requested, now) AS (VALUES {})",
        sqlite_values(n, 5)
    )
}

/// [`pin_common`] on SQLite for `n` requests: the insert (its rows: `run_id, skill_name,
/// skill_id, revision, digest, activated_at`), the lease renewal, and the read of the
/// requests' runs' leases (`id, ttl_ms, expires_at`). Each lists the requests once
/// ([`sqlite_requests`]).
pub(super) fn sqlite_pin_statements(n: usize) -> [String; SQLITE_PIN_STATEMENTS] {
    let req = sqlite_requests(n);
    [
        format!("{req} {}", pin_insert(Dialect::Sqlite)),
        format!(
            "{req}, at AS (SELECT req.run_id, max(p.activated_at) AS at FROM req
                 CROSS JOIN runs r ON r.id = req.run_id
                     AND r.expires_at - req.now < r.ttl_ms / 2
                 CROSS JOIN run_skills rs ON rs.run_id = req.run_id
                     AND rs.skill_name = req.skill
                 CROSS JOIN pins p ON p.run_id = req.run_id AND p.skill_id = rs.skill_id
                     AND p.activated_at = req.now
                 GROUP BY req.run_id)
             {}",
            renew(Dialect::Sqlite)
        ),
        format!(
            "{req} SELECT id, ttl_ms, expires_at FROM runs WHERE id IN (SELECT run_id FROM req)"
        ),
    ]
}

/// `rows` rows of `columns` anonymous placeholders each, for a `VALUES` list: `(?, ?), (?, ?)`.
/// Anonymous, not `$n`: to bind a numbered parameter, sqlx asks SQLite for each parameter's
/// name, which SQLite finds by a walk of the statement's name list, so binding a batch's
/// hundreds of parameters took time quadratic in them (6% of the pin writer's time in
/// `scripts/bench-runs`). Anonymous parameters are bound by position.
fn sqlite_values(rows: usize, columns: usize) -> String {
    let row = format!("({})", vec!["?"; columns].join(", "));
    vec![row; rows].join(", ")
}

/// [`pin_common`] on PostgreSQL, one statement for any number of requests: `$1` is the
/// requests as a JSON array of [`PinRequest`]s.
static PIN_COMMON_POSTGRES: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "WITH req AS (SELECT * FROM json_to_recordset($1::json)
             AS r (run_id text, workspace text, skill text, requested bigint, now bigint)),
         ins AS ({}),
         at AS (SELECT run_id, max(activated_at) AS at FROM ins GROUP BY run_id),
         renewed AS ({renew} RETURNING id, expires_at)
         SELECT ins.run_id, ins.skill_name, ins.skill_id, ins.revision, ins.digest,
             r.ttl_ms, COALESCE(renewed.expires_at, r.expires_at)
         FROM ins CROSS JOIN LATERAL (SELECT ttl_ms, expires_at FROM runs
             WHERE id = ins.run_id OFFSET 0) r
         LEFT JOIN renewed ON renewed.id = ins.run_id",
        pin_insert(Dialect::Postgres),
        renew = renew(Dialect::Postgres),
    )
});

/// [`pin_common`]'s read of existing pins on PostgreSQL, as [`sqlite_existing_pins`] on SQLite:
/// `$1` is the requests as a JSON array of [`PinRequest`]s. Each lookup is a key probe
/// written as in [`pin_insert`].
const EXISTING_PINS_POSTGRES: &str =
    "SELECT req.run_id, req.skill, rs.skill_id, p.revision, p.digest, r.ttl_ms, r.expires_at
     FROM json_to_recordset($1::json)
         AS req (run_id text, workspace text, skill text, requested bigint, now bigint)
     CROSS JOIN LATERAL (SELECT ttl_ms, expires_at FROM runs WHERE id = req.run_id
         AND workspace = req.workspace AND state || '' = 'active'
         AND expires_at + 0 > req.now OFFSET 0) r
     CROSS JOIN LATERAL (SELECT skill_id FROM run_skills
         WHERE run_id = req.run_id AND skill_name = req.skill OFFSET 0) rs
     CROSS JOIN LATERAL (SELECT revision, digest FROM pins
         WHERE run_id = req.run_id AND skill_id = rs.skill_id OFFSET 0) p
     WHERE req.requested IS NULL OR req.requested = p.revision";

/// The existing pins of `n` requests (listed as in [`sqlite_pin_statements`]) whose run is
/// live and authorizes the skill, where no other revision is requested (the long way says
/// why not): `run_id, skill_name, skill_id, revision, digest, ttl_ms, expires_at`. As the long
/// way reads them, and with its answer (an existing pin is not written, and its lease is
/// renewed by the activation like any activity's).
pub(super) fn sqlite_existing_pins(n: usize) -> String {
    format!(
        "{} SELECT req.run_id, req.skill, p.skill_id, p.revision, p.digest, r.ttl_ms, r.expires_at
         FROM req
         JOIN runs r ON r.id = req.run_id AND r.workspace = req.workspace
             AND r.state = 'active' AND r.expires_at > req.now
         JOIN run_skills rs ON rs.run_id = r.id AND rs.skill_name = req.skill
         JOIN pins p ON p.run_id = r.id AND p.skill_id = rs.skill_id
         WHERE req.requested IS NULL OR req.requested = p.revision",
        sqlite_requests(n)
    )
}

/// A pin as [`pin_common`]'s insert returned it (`run_id, skill_name, skill_id, revision,
/// digest`, …), with its run's lease (ttl, expiry): ((run, skill name), pin).
fn inserted_pin(
    row: &sqlx::any::AnyRow,
    (ttl_ms, expires_at): (i64, i64),
) -> Result<((String, String), LivePin)> {
    Ok((
        (row.try_get(0)?, row.try_get(1)?),
        LivePin {
            skill_id: row.try_get(2)?,
            revision: row.try_get(3)?,
            digest: row.try_get(4)?,
            ttl_ms,
            expires_at,
        },
    ))
}

/// [`MetaStore::pin`] inside `tx`: the pin and whether it was written now. Every error is
/// found before anything is written.
async fn pin_in(tx: &mut Tx, dialect: Dialect, request: &PinRequest) -> Result<(LivePin, bool)> {
    let found = pin_common(tx, dialect, Transaction::Open, &[request]).await?;
    match found.into_values().next() {
        Some(pinned) => Ok(pinned),
        None => pin_the_long_way(tx, request).await,
    }
}

/// A request that is not the common case of [`pin_common`], inside `tx`: its existing pin, or
/// why it cannot be pinned, or (a case the common one does not cover) a pin written now.
/// Every error is found before anything is written.
async fn pin_the_long_way(tx: &mut Tx, request: &PinRequest) -> Result<(LivePin, bool)> {
    let PinRequest {
        workspace,
        run_id,
        skill,
        requested,
        now,
    } = request;
    let (requested, now) = (*requested, *now);
    let run = run_row(tx, workspace, run_id).await?.ok_or_else(|| {
        RegistryError::NotFound(format!("no run {run_id:?} in workspace {workspace:?}"))
    })?;
    let state = run.state_at(now);
    if state != RunState::Active {
        return Err(run_state_error(run_id, state));
    }
    let skill_id: String =
        sqlx::query("SELECT skill_id FROM run_skills WHERE run_id = $1 AND skill_name = $2")
            .bind(run_id.as_str())
            .bind(skill.as_str())
            .fetch_optional(&mut **tx)
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
            .bind(run_id.as_str())
            .bind(&skill_id)
            .fetch_optional(&mut **tx)
            .await?;
    if let Some(pin) = existing {
        let (revision, digest): (i64, String) = (pin.try_get(0)?, pin.try_get(1)?);
        check_requested(skill, revision, requested)?;
        let pin = LivePin {
            skill_id,
            revision,
            digest,
            ttl_ms: run.ttl_ms,
            expires_at: run.expires_at,
        };
        return Ok((pin, false));
    }
    let srow = sqlx::query("SELECT state, current_revision FROM skills WHERE id = $1")
        .bind(&skill_id)
        .fetch_one(&mut **tx)
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
        .fetch_optional(&mut **tx)
        .await?;
    let Some(locked) = locked else {
        let st: Option<String> =
            sqlx::query("SELECT state FROM revisions WHERE skill_id = $1 AND revision = $2")
                .bind(&skill_id)
                .bind(target)
                .fetch_optional(&mut **tx)
                .await?
                .map(|r| r.try_get(0))
                .transpose()?;
        return Err(match st.as_deref() {
            Some("revoked") => {
                RegistryError::RevisionRevoked(format!("revision {target} of {skill:?} is revoked"))
            }
            Some(other) => {
                RegistryError::NotFound(format!("revision {target} of {skill:?} is {other}"))
            }
            None => RegistryError::NotFound(format!("skill {skill:?} has no revision {target}")),
        });
    };
    let digest: String = locked.try_get(0)?;
    execute!(
        &mut **tx,
        "INSERT INTO pins (run_id, skill_id, skill_name, revision, digest, activated_at) VALUES ($1, $2, $3, $4, $5, $6)",
        run_id.as_str(),
        &skill_id,
        skill.as_str(),
        target,
        &digest,
        now
    );
    execute!(
        &mut **tx,
        "UPDATE runs SET expires_at = $2 WHERE id = $1",
        run_id.as_str(),
        now + run.ttl_ms
    );
    let pin = LivePin {
        skill_id,
        revision: target,
        digest,
        ttl_ms: run.ttl_ms,
        expires_at: now + run.ttl_ms,
    };
    Ok((pin, true))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::{Registry, RegistryConfig};

    fn package(name: &str, version: &str) -> Vec<u8> {
        let md = format!("---\nname: {name}\ndescription: {version}\n---\n# {version}\n");
        let mut tar = tar::Builder::new(Vec::new());
        let mut header = tar::Header::new_ustar();
        header.set_size(md.len() as u64);
        header.set_mode(0o644);
        header.set_cksum();
        tar.append_data(&mut header, "SKILL.md", md.as_bytes())
            .unwrap();
        tar.into_inner().unwrap()
    }

    pub(in crate::meta) async fn publish(r: &Registry, name: &str, base: i64) {
        publish_in(r, "ws", name, base).await
    }

    /// Publishes `name`'s content `v{base}` in `workspace`: the same content, and digest,
    /// whatever the workspace.
    pub(crate) async fn publish_in(r: &Registry, workspace: &str, name: &str, base: i64) {
        let staging = r.new_staging("test-").unwrap();
        std::fs::write(
            staging.path().join("upload"),
            package(name, &format!("v{base}")),
        )
        .unwrap();
        r.publish_archive(workspace, name, base, staging, None, "test")
            .await
            .unwrap();
    }

    pub(in crate::meta) fn request(
        run: &str,
        skill: &str,
        requested: Option<i64>,
    ) -> (PinRequest, PinReply) {
        let request = PinRequest {
            workspace: "ws".into(),
            run_id: run.into(),
            skill: skill.into(),
            requested,
            now: now_ms(),
        };
        (request, tokio::sync::oneshot::channel().0)
    }

    /// SQLite's WAL is copied back by the checkpoint thread, with no commit running one
    /// (the automatic checkpoint waits for 32,768 pages; the schema wrote far fewer).
    #[tokio::test]
    async fn the_wal_is_checkpointed_beside_the_writer() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("meta.db");
        let _store = MetaStore::connect(&format!("sqlite://{}?mode=rwc", db.display()))
            .await
            .unwrap();
        // The WAL index header (native byte order): the last valid frame at byte 16, the
        // frames checkpointed at byte 96.
        let frames = || {
            let shm = std::fs::read(dir.path().join("meta.db-shm")).unwrap();
            let word = |at: usize| u32::from_ne_bytes(shm[at..at + 4].try_into().unwrap());
            (word(16), word(96))
        };
        let (written, _) = frames();
        assert!(written > 0, "the schema's commits are in the WAL");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while frames().1 < written {
            assert!(
                std::time::Instant::now() < deadline,
                "no checkpoint in 10 s: {:?} (last frame, checkpointed)",
                frames()
            );
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    }

    /// A batch whose one query fails partway (here the insert, refused by a trigger) leaves
    /// nothing written and no transaction open on the writer's connection.
    #[tokio::test]
    async fn a_failed_batch_rolls_back_and_leaves_no_transaction_open() {
        /// The writer connection's `synchronous` (2: FULL, a WAL fsync in every commit).
        async fn synchronous(writer: &AnyPool) -> i64 {
            let level = sqlx::query_scalar("PRAGMA synchronous").fetch_one(writer);
            level.await.unwrap()
        }
        let dir = tempfile::tempdir().unwrap();
        let r = Registry::open(RegistryConfig::new(dir.path()))
            .await
            .unwrap();
        publish(&r, "a", 0).await;
        let run = r.create_run("ws", None, None, false).await.unwrap().run_id;
        let writer = r.meta.writer();
        sqlx::query(
            "CREATE TRIGGER refuse BEFORE INSERT ON pins BEGIN SELECT RAISE(ABORT, 'refused'); END",
        )
        .execute(writer)
        .await
        .unwrap();
        let (request, _) = request(&run, "a", None);
        let failed = pin_common(
            &mut writer.acquire().await.unwrap(),
            Dialect::Sqlite,
            Transaction::OwnUnflushed,
            &[&request],
        )
        .await;
        assert!(failed.is_err(), "the trigger refuses the insert");
        // The batch's commit was to leave its flush to the flusher; the writer's other
        // transactions flush in their commits again.
        assert_eq!(synchronous(writer).await, 2);
        // Inside a transaction left open, BEGIN would fail ("cannot start a transaction
        // within a transaction").
        let mut tx = writer.begin_with("BEGIN IMMEDIATE").await.unwrap();
        sqlx::query("DROP TRIGGER refuse")
            .execute(&mut *tx)
            .await
            .unwrap();
        tx.commit().await.unwrap();
        let pins: i64 = sqlx::query_scalar("SELECT count(*) FROM pins")
            .fetch_one(r.meta.pool())
            .await
            .unwrap();
        assert_eq!(pins, 0);
        // And the next batch goes through.
        let (pin, written) = r.meta.pin("ws", &run, "a", None, now_ms()).await.unwrap();
        assert!(written);
        assert_eq!(pin.revision, 1);
        assert_eq!(synchronous(writer).await, 2);
    }

    /// One batch mixing the common case (written by the batch's one `INSERT … SELECT`) with
    /// everything else (a repeat, an existing pin, a conflict, an unauthorized skill, a
    /// finished run, a revoked revision): each request gets its own answer, and the batch
    /// wrote exactly the new pins: the common case in one commit, the rest in a second.
    #[tokio::test]
    async fn a_batch_writes_its_common_pins_together_and_answers_each_request_sqlite() {
        let dir = tempfile::tempdir().unwrap();
        a_batch_answers_each_request(RegistryConfig::new(dir.path())).await;
    }

    #[tokio::test]
    async fn a_batch_writes_its_common_pins_together_and_answers_each_request_postgres() {
        use sqlx::Connection;
        let server = std::env::var("SKILLBOX_TEST_POSTGRES").expect(
            "SKILLBOX_TEST_POSTGRES must name a PostgreSQL server; scripts/test starts one",
        );
        sqlx::any::install_default_drivers();
        let mut admin = sqlx::AnyConnection::connect(&server).await.unwrap();
        let name = format!("skillbox_unit_batch_{}_{}", std::process::id(), now_ms());
        sqlx::query(AssertSqlSafe(format!("CREATE DATABASE {name}")))
            .execute(&mut admin)
            .await
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = RegistryConfig::new(dir.path());
        let base = server.rsplit_once('/').map_or(server.as_str(), |(b, _)| b);
        cfg.database_url = Some(format!("{base}/{name}"));
        a_batch_answers_each_request(cfg).await;
    }

    async fn a_batch_answers_each_request(cfg: RegistryConfig) {
        let r = Registry::open(cfg).await.unwrap();
        publish(&r, "a", 0).await;
        publish(&r, "a", 1).await;
        publish(&r, "b", 0).await;
        publish(&r, "c", 0).await;
        r.revoke("ws", "c", 1, "test").await.unwrap();
        let both = r.create_run("ws", Some(vec!["a".into(), "b".into()]), None, false);
        let both = both.await.unwrap().run_id;
        let only_a = r.create_run("ws", Some(vec!["a".into()]), None, false);
        let only_a = only_a.await.unwrap().run_id;
        let with_c = r.create_run("ws", Some(vec!["a".into(), "c".into()]), None, false);
        let with_c = with_c.await.unwrap().run_id;
        let done = r.create_run("ws", None, None, false).await.unwrap().run_id;
        let lapsed = r
            .create_run("ws", None, Some(1), false)
            .await
            .unwrap()
            .run_id;
        r.finish_run("ws", &done).await.unwrap();
        // An existing pin before the batch.
        r.activate("ws", &with_c, "a", None).await.unwrap();
        // A run with less than half its lease left when the batch pins for it.
        let renewing = r.create_run("ws", None, Some(3), false).await.unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(1600)).await;

        let batch = vec![
            request(&both, "a", None),            // new: current revision 2
            request(&both, "b", None),            // new
            request(&both, "a", None),            // a repeat within the batch: the same pin
            request(&only_a, "a", Some(1)),       // new, the requested revision
            request(&only_a, "b", None),          // not authorized
            request(&with_c, "a", Some(1)),       // conflicts with the existing pin of r2
            request(&with_c, "c", Some(1)),       // revoked
            request(&done, "a", None),            // finished run
            request(&with_c, "a", None),          // the existing pin
            request(&lapsed, "a", None),          // a run whose lease lapsed (not yet swept)
            request(&renewing.run_id, "b", None), // new, and renews the run's lease
        ];
        let stats = PinStats::default();
        let answers = PinWriter::write_together(
            r.meta.writer(),
            r.meta.dialect(),
            &batch,
            &stats,
            Transaction::Own,
        )
        .await
        .unwrap();
        let pinned = |i: usize| pinned_of(&answers, i);
        assert_eq!(pinned(0), (2, true));
        assert_eq!(pinned(1), (1, true));
        assert_eq!(pinned(2), (2, false));
        assert_eq!(pinned(3), (1, true));
        assert!(
            matches!(answers[4], Err(RegistryError::SkillNotAuthorized(_))),
            "{:?}",
            answers[4]
        );
        assert!(
            matches!(
                answers[5],
                Err(RegistryError::ActivationConflict {
                    pinned_revision: 2,
                    requested_revision: 1,
                    ..
                })
            ),
            "{:?}",
            answers[5]
        );
        assert!(
            matches!(answers[6], Err(RegistryError::RevisionRevoked(_))),
            "{:?}",
            answers[6]
        );
        assert!(answers[7].is_err(), "a finished run pins nothing");
        assert_eq!(pinned(8), (2, false));
        assert!(answers[9].is_err(), "a lapsed run pins nothing");
        // … and the batch's lease renewals did not bring it back.
        assert_ne!(r.run("ws", &lapsed).await.unwrap().state, RunState::Active);
        // The common case commits by itself, the rest in one transaction.
        assert_eq!(stats.commits.load(Ordering::Relaxed), 2);
        let flags: Vec<_> = answers
            .iter()
            .map(|a| a.as_ref().map(|p| p.1).map_err(|e| e.to_string()))
            .collect();
        assert_eq!(stats.written.load(Ordering::Relaxed), 4, "{flags:?}");
        let renewed = r.run("ws", &renewing.run_id).await.unwrap();
        assert!(
            renewed.expires_at > renewing.expires_at,
            "the pin renews a lease with less than half left: {} → {}",
            renewing.expires_at,
            renewed.expires_at
        );
        assert_eq!(pinned(10), (1, true));
        assert_eq!(
            answers[10].as_ref().unwrap().0.expires_at,
            renewed.expires_at
        );
        // What the batch answered is what is stored, and each pin renewed its run's lease.
        let run = r.run("ws", &both).await.unwrap();
        let stored: Vec<(String, i64)> = run
            .activations
            .iter()
            .map(|p| (p.skill.clone(), p.revision))
            .collect();
        assert_eq!(stored, vec![("a".to_string(), 2), ("b".to_string(), 1)]);
        let (pin, _) = answers[0].as_ref().unwrap();
        assert_eq!(pin.expires_at, run.expires_at);
        assert!(r.run("ws", &only_a).await.unwrap().activations.len() == 1);

        // Existing pins alone (as after a restart, or on another server) are found by the
        // common case: its statement and read, and no transaction of the long way.
        let again = vec![request(&with_c, "a", None), request(&both, "b", None)];
        let stats = PinStats::default();
        let answers = PinWriter::write_together(
            r.meta.writer(),
            r.meta.dialect(),
            &again,
            &stats,
            Transaction::Own,
        )
        .await
        .unwrap();
        assert_eq!(pinned_of(&answers, 0), (2, false));
        assert_eq!(pinned_of(&answers, 1), (1, false));
        assert_eq!(stats.commits.load(Ordering::Relaxed), 1);
        assert_eq!(stats.written.load(Ordering::Relaxed), 0);
    }

    fn pinned_of(answers: &[Result<(LivePin, bool)>], i: usize) -> (i64, bool) {
        match &answers[i] {
            Ok((pin, wrote)) => (pin.revision, *wrote),
            Err(e) => panic!("request {i}: {e:?}"),
        }
    }
}
