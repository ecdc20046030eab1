//! Runs: their authorized skills, pins and leases. A pin is written once, in the transaction
//! that locks its revision row, so collection and revocation serialize with it.

use super::*;
use skillbox_api::Pin;
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

    /// The pin of `skill` in a live run.
    pub async fn live_pin(
        &self,
        workspace: &str,
        run_id: &str,
        skill: &str,
        now: i64,
    ) -> Result<Option<LivePin>> {
        let row = sqlx::query(
            "SELECT p.skill_id, p.revision, p.digest, r.ttl_ms, r.expires_at FROM runs r
             JOIN pins p ON p.run_id = r.id AND p.skill_name = $3
             WHERE r.id = $1 AND r.workspace = $2 AND r.state = 'active' AND r.expires_at > $4",
        )
        .bind(run_id)
        .bind(workspace)
        .bind(skill)
        .bind(now)
        .fetch_optional(self.pool())
        .await?;
        row.map(|r| {
            Ok(from_row!(&r => LivePin {
                skill_id, revision, digest, ttl_ms, expires_at
            }))
        })
        .transpose()
    }

    /// Pins `skill` in the run, once: its existing pin, else the requested (or current)
    /// revision, whose row is locked while the pin is written; renews the run's lease. On
    /// SQLite the pin goes through the group commit ([`PinWriter`]): answered once the batch
    /// holding it is durable.
    pub async fn pin(
        &self,
        workspace: &str,
        run_id: &str,
        skill: &str,
        requested: Option<i64>,
        now: i64,
    ) -> Result<LivePin> {
        let request = PinRequest {
            workspace: workspace.to_string(),
            run_id: run_id.to_string(),
            skill: skill.to_string(),
            requested,
            now,
        };
        if let Some(queue) = &self.pins.queue {
            let (reply, answer) = tokio::sync::oneshot::channel();
            if queue.send((request.clone(), reply)).is_ok() {
                // `Err` only when the writer task is gone (its runtime shut down): pin alone.
                if let Ok(answer) = answer.await {
                    return answer;
                }
            }
        }
        let mut tx = self.write_tx().await?;
        let (pin, wrote) = pin_in(&mut tx, self.dialect, &request).await?;
        tx.commit().await?;
        self.pins.stats.committed(u64::from(wrote));
        Ok(pin)
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
#[derive(Debug, Clone)]
struct PinRequest {
    workspace: String,
    run_id: String,
    skill: String,
    requested: Option<i64>,
    now: i64,
}

type PinReply = tokio::sync::oneshot::Sender<Result<LivePin>>;

#[derive(Default)]
struct PinStats {
    commits: AtomicU64,
    written: AtomicU64,
}

impl PinStats {
    /// One durable commit that wrote `written` pins.
    fn committed(&self, written: u64) {
        self.commits.fetch_add(1, Ordering::Relaxed);
        self.written.fetch_add(written, Ordering::Relaxed);
    }
}

/// Group commit of new pins on SQLite, whose one writer makes every commit wait for its own
/// WAL fsync: pins that arrive while a batch commits are written together in the next
/// transaction — one commit, one fsync — and each caller is answered only after the commit of
/// the batch holding its pin returned. PostgreSQL needs none of this (its sessions commit
/// concurrently and the server shares WAL flushes among them): there pins commit alone.
#[derive(Clone, Default)]
pub(crate) struct PinWriter {
    queue: Option<tokio::sync::mpsc::UnboundedSender<(PinRequest, PinReply)>>,
    stats: Arc<PinStats>,
}

impl PinWriter {
    /// The most pins one transaction writes: bounds how long the writer lock is held.
    const MAX_BATCH: usize = 512;

    /// Starts the writer task on `writer` (SQLite's one-connection pool). The task ends
    /// when the last store holding the queue is dropped.
    pub(crate) fn start(writer: AnyPool) -> Self {
        let (queue, requests) = tokio::sync::mpsc::unbounded_channel();
        let stats = Arc::<PinStats>::default();
        tokio::spawn(Self::write_batches(writer, requests, stats.clone()));
        PinWriter {
            queue: Some(queue),
            stats,
        }
    }

    async fn write_batches(
        writer: AnyPool,
        mut requests: tokio::sync::mpsc::UnboundedReceiver<(PinRequest, PinReply)>,
        stats: Arc<PinStats>,
    ) {
        let mut batch = Vec::new();
        while requests.recv_many(&mut batch, Self::MAX_BATCH).await > 0 {
            let answers = match Self::write_together(&writer, &batch, &stats).await {
                Ok(answers) => answers,
                // A database error anywhere rolled the whole batch back: each pin again in a
                // transaction of its own, so each gets its own answer.
                Err(_) => {
                    let mut answers = Vec::with_capacity(batch.len());
                    for (request, _) in &batch {
                        answers.push(Self::write_alone(&writer, request, &stats).await);
                    }
                    answers
                }
            };
            for ((_, reply), answer) in batch.drain(..).zip(answers) {
                // The caller may have gone (its request was cancelled): the pin stays.
                let _ = reply.send(answer);
            }
        }
    }

    async fn write_together(
        writer: &AnyPool,
        batch: &[(PinRequest, PinReply)],
        stats: &PinStats,
    ) -> Result<Vec<Result<LivePin>>> {
        let mut tx = writer.begin_with("BEGIN IMMEDIATE").await?;
        let mut answers = Vec::with_capacity(batch.len());
        let mut written = 0;
        for (request, _) in batch {
            // An answer that is an error wrote nothing (every check precedes the writes), so
            // the batch goes on; a database error ends it (dropping `tx` rolls back).
            match pin_in(&mut tx, Dialect::Sqlite, request).await {
                Ok((pin, wrote)) => {
                    written += u64::from(wrote);
                    answers.push(Ok(pin));
                }
                Err(e @ RegistryError::Metadata(_)) => return Err(e),
                Err(e) => answers.push(Err(e)),
            }
        }
        tx.commit().await?;
        stats.committed(written);
        Ok(answers)
    }

    async fn write_alone(
        writer: &AnyPool,
        request: &PinRequest,
        stats: &PinStats,
    ) -> Result<LivePin> {
        let mut tx = writer.begin_with("BEGIN IMMEDIATE").await?;
        let (pin, wrote) = pin_in(&mut tx, Dialect::Sqlite, request).await?;
        tx.commit().await?;
        stats.committed(u64::from(wrote));
        Ok(pin)
    }
}

/// [`MetaStore::pin`] inside `tx`: the pin and whether it was written now. Every error is
/// found before anything is written.
async fn pin_in(tx: &mut Tx, dialect: Dialect, request: &PinRequest) -> Result<(LivePin, bool)> {
    let PinRequest {
        workspace,
        run_id,
        skill,
        requested,
        now,
    } = request;
    let (requested, now) = (*requested, *now);
    if dialect == Dialect::Sqlite {
        // The common case in two statements: a live run, an authorized, active skill, an
        // available revision, no pin yet. SQLite's write lock (held since BEGIN IMMEDIATE)
        // orders this with collection and revocation; anything else takes the long way
        // below, which says why.
        let written = sqlx::query(
            "INSERT INTO pins (run_id, skill_id, skill_name, revision, digest, activated_at)
             SELECT r.id, rs.skill_id, rs.skill_name, v.revision, v.digest, $5
             FROM runs r
             JOIN run_skills rs ON rs.run_id = r.id AND rs.skill_name = $3
             JOIN skills s ON s.id = rs.skill_id AND s.state = 'active'
             JOIN revisions v ON v.skill_id = s.id AND v.state = 'available'
                 AND v.revision = COALESCE($4, s.current_revision)
             WHERE r.id = $1 AND r.workspace = $2 AND r.state = 'active' AND r.expires_at > $5
                 AND NOT EXISTS (SELECT 1 FROM pins p WHERE p.run_id = r.id AND p.skill_id = rs.skill_id)
             RETURNING skill_id, revision, digest",
        )
        .bind(run_id.as_str())
        .bind(workspace.as_str())
        .bind(skill.as_str())
        .bind(requested)
        .bind(now)
        .fetch_optional(&mut **tx)
        .await?;
        if let Some(row) = written {
            let (skill_id, revision, digest): (String, i64, String) =
                (row.try_get(0)?, row.try_get(1)?, row.try_get(2)?);
            let lease = sqlx::query(
                "UPDATE runs SET expires_at = $2 + ttl_ms WHERE id = $1 RETURNING ttl_ms, expires_at",
            )
            .bind(run_id.as_str())
            .bind(now)
            .fetch_one(&mut **tx)
            .await?;
            let pin = LivePin {
                skill_id,
                revision,
                digest,
                ttl_ms: lease.try_get(0)?,
                expires_at: lease.try_get(1)?,
            };
            return Ok((pin, true));
        }
    }
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
        if let Some(req) = requested.filter(|r| *r != revision) {
            return Err(RegistryError::ActivationConflict {
                skill: skill.to_string(),
                pinned_revision: revision,
                requested_revision: req,
            });
        }
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
