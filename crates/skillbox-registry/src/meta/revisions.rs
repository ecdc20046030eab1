//! Revisions: lookups, the publication commit (one transaction: pointer CAS, revision row,
//! event), the replay check of a retried publish, revocation, and collection's queries.

use super::*;
use skillbox_package::Sha256;
use std::collections::HashSet;

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

impl MetaStore {
    pub async fn revision(&self, skill_id: &str, revision: i64) -> Result<Option<Revision>> {
        let q = format!("SELECT {REV_COLS} FROM revisions WHERE skill_id = $1 AND revision = $2");
        let row = sqlx::query(AssertSqlSafe(q))
            .bind(skill_id)
            .bind(revision)
            .fetch_optional(&self.pool)
            .await?;
        row.as_ref().map(revision_from).transpose()
    }

    /// The current revision of every active skill of the workspace, in one query (a listing
    /// of thousands of skills must not ask once per skill).
    pub async fn current_revisions(&self, workspace: &str) -> Result<Vec<Revision>> {
        let q = format!(
            "SELECT {REV_COLS} FROM revisions WHERE (skill_id, revision) IN
             (SELECT id, current_revision FROM skills WHERE workspace = $1 AND state = 'active')"
        );
        let rows = sqlx::query(AssertSqlSafe(q))
            .bind(workspace)
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(revision_from).collect()
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

    /// The revision a same-base, same-digest publish created, if any: a retried publish is
    /// answered with it instead of a conflict.
    pub async fn replay(
        &self,
        skill_id: &str,
        base: i64,
        digest: &str,
    ) -> Result<Option<Revision>> {
        Self::replay_of(&self.pool, skill_id, base, digest).await
    }

    /// [`MetaStore::replay`] on `db` (the pool, or the commit's transaction).
    async fn replay_of<'e>(
        db: impl sqlx::Executor<'e, Database = sqlx::Any>,
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
            .fetch_optional(db)
            .await?;
        row.as_ref().map(revision_from).transpose()
    }

    /// The commit of a publication: one transaction that creates the skill if needed, moves
    /// the pointer from `base_revision` by compare-and-swap, inserts the revision and appends
    /// the event. Content must be durable before this is called.
    pub async fn commit_revision(
        &self,
        n: &NewRevision<'_>,
        present: PresenceCheck<'_>,
    ) -> Result<CommitOutcome> {
        let Some(mut tx) = self.write_tx_with(present).await? else {
            return Ok(CommitOutcome::ContentMissing);
        };
        let now = now_ms();
        Self::ensure_workspace(&mut tx, n.workspace).await?;
        let mut skill = Self::active_skill_tx(&mut tx, n.workspace, n.skill).await?;
        if skill.is_none() {
            if n.base_revision != 0 {
                return Ok(CommitOutcome::Conflict {
                    current_revision: 0,
                });
            }
            let id = new_id();
            execute!(&mut *tx, "INSERT INTO skills (id, workspace, name, state, current_revision, last_revision, created_at, updated_at)
                 VALUES ($1, $2, $3, 'active', 0, 0, $4, $4)", &id, n.workspace, n.skill, now);
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
                Self::replay_of(&mut *tx, &skill.id, n.base_revision, n.digest).await?
            {
                tx.rollback().await?;
                return Ok(CommitOutcome::Replayed {
                    skill,
                    revision: rev,
                });
            }
            // The pointer as the winner left it: on PostgreSQL (read committed) the row read
            // above may predate a commit that this UPDATE waited for.
            let current_revision: i64 =
                sqlx::query("SELECT current_revision FROM skills WHERE id = $1")
                    .bind(&skill.id)
                    .fetch_one(&mut *tx)
                    .await?
                    .try_get(0)?;
            tx.rollback().await?;
            return Ok(CommitOutcome::Conflict { current_revision });
        };
        let revision: i64 = moved.try_get(0)?;
        execute!(&mut *tx, "INSERT INTO revisions (skill_id, revision, digest, parent_revision, state, publisher, published_at, file_count, size, frontmatter)
             VALUES ($1, $2, $3, $4, 'available', $5, $6, $7, $8, $9)", &skill.id, revision, n.digest, n.base_revision, n.publisher, now, n.file_count, n.size, n.frontmatter.to_string());
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
            state: RevisionState::Available,
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
}

/// Revisions no root holds: not current of an active skill, not pinned by a live run
/// (`$1` = now), published before the grace cutoff (`$2`).
///
/// The pinned revisions are found from the live runs (the `runs_live` index, then each run's
/// pins by their key), once per collection: pins have no index by revision, because keeping
/// one dirtied a second random page for every new pin (~40% of the pin writer's WAL in
/// `scripts/bench-runs`), and a collection is rare where activations are the hot path.
const COLLECTABLE: &str = "state = 'available' AND published_at <= $2
    AND NOT EXISTS (SELECT 1 FROM skills s WHERE s.id = revisions.skill_id AND s.state = 'active' AND s.current_revision = revisions.revision)
    AND (skill_id, revision) NOT IN (SELECT p.skill_id, p.revision FROM runs r JOIN pins p ON p.run_id = r.id
                                     WHERE r.state = 'active' AND r.expires_at > $1)";

/// A revision that collection took (or, dry, would take).
#[derive(Debug, Clone)]
pub struct Collectable {
    pub skill_id: String,
    pub revision: i64,
    pub digest: String,
}

/// The content-deletion phase of a collection: a write transaction that excludes publication
/// commits (and, on PostgreSQL, pins) until [`ContentSweep::finish`], with what is live in it.
pub struct ContentSweep {
    tx: Tx,
    /// Digests of available revisions.
    pub live: HashSet<String>,
    /// Blobs drafts reference.
    pub draft_blobs: HashSet<Sha256>,
}

impl ContentSweep {
    pub async fn finish(self) -> Result<()> {
        self.tx.commit().await?;
        Ok(())
    }
}

/// What a revocation did.
#[derive(Debug, Clone)]
pub enum Revocation {
    /// Revoked now: its digest, the skill's current revision afterwards, and whether another
    /// available revision shares its tree.
    Revoked {
        digest: String,
        current_revision: i64,
        tree_shared: bool,
    },
    /// It was revoked before: its digest and reason.
    AlreadyRevoked {
        digest: String,
        reason: String,
        current_revision: i64,
    },
}

async fn live_digests<'e>(
    db: impl sqlx::Executor<'e, Database = sqlx::Any>,
) -> Result<HashSet<String>> {
    let rows = sqlx::query("SELECT DISTINCT digest FROM revisions WHERE state = 'available'")
        .fetch_all(db)
        .await?;
    rows.iter()
        .map(|r| Ok(r.try_get::<String, _>(0)?))
        .collect()
}

fn collectable_from(r: &AnyRow) -> Result<Collectable> {
    Ok(from_row!(r => Collectable { skill_id, revision, digest }))
}

impl MetaStore {
    /// Blocks concurrent pin inserts and revision commits until `tx` ends (PostgreSQL; on
    /// SQLite the write transaction already excludes every other writer).
    async fn lock_for_gc(&self, tx: &mut Tx) -> Result<()> {
        if self.dialect() == Dialect::Postgres {
            execute!(
                &mut **tx,
                "LOCK TABLE revisions, pins, draft_files IN SHARE ROW EXCLUSIVE MODE"
            );
        }
        Ok(())
    }

    /// The revisions a collection at `now` with grace `cutoff` would take; changes nothing.
    pub async fn collectable(&self, now: i64, cutoff: i64) -> Result<Vec<Collectable>> {
        let q = format!("SELECT skill_id, revision, digest FROM revisions WHERE {COLLECTABLE}");
        let rows = sqlx::query(AssertSqlSafe(q))
            .bind(now)
            .bind(cutoff)
            .fetch_all(self.pool())
            .await?;
        rows.iter().map(collectable_from).collect()
    }

    /// Marks every collectable revision `collected` (one transaction that re-evaluates the
    /// roots, with a `revision.collected` event each).
    pub async fn collect(&self, now: i64, cutoff: i64) -> Result<Vec<Collectable>> {
        let mut tx = self.write_tx().await?;
        self.lock_for_gc(&mut tx).await?;
        let q = format!(
            "UPDATE revisions SET state = 'collected', state_changed_at = $1 WHERE {COLLECTABLE} RETURNING skill_id, revision, digest"
        );
        let rows = sqlx::query(AssertSqlSafe(q))
            .bind(now)
            .bind(cutoff)
            .fetch_all(&mut *tx)
            .await?;
        let collected: Vec<Collectable> =
            rows.iter().map(collectable_from).collect::<Result<_>>()?;
        for c in &collected {
            let s = sqlx::query("SELECT workspace, name FROM skills WHERE id = $1")
                .bind(&c.skill_id)
                .fetch_one(&mut *tx)
                .await?;
            let (ws, name): (String, String) = (s.try_get(0)?, s.try_get(1)?);
            MetaStore::append_event(
                &mut tx,
                &ws,
                "revision.collected",
                serde_json::json!({"skill": name, "skill_id": c.skill_id, "revision": c.revision, "digest": c.digest}),
            )
            .await?;
        }
        tx.commit().await?;
        Ok(collected)
    }

    /// Digests of available revisions now.
    pub async fn live_digests(&self) -> Result<HashSet<String>> {
        live_digests(&self.pool).await
    }

    /// Starts the content-deletion phase of a collection (see [`ContentSweep`]).
    pub async fn content_sweep(&self) -> Result<ContentSweep> {
        let mut tx = self.write_tx().await?;
        self.lock_for_gc(&mut tx).await?;
        let live = live_digests(&mut *tx).await?;
        let draft_blobs = sqlx::query("SELECT DISTINCT sha256 FROM draft_files")
            .fetch_all(&mut *tx)
            .await?
            .iter()
            .filter_map(|r| Sha256::from_hex(&r.try_get::<String, _>(0).ok()?))
            .collect();
        Ok(ContentSweep {
            tx,
            live,
            draft_blobs,
        })
    }

    /// Revokes a revision: its state and reason, the pointer falling back (by compare-and-swap)
    /// to the newest older available revision when it was current, and the events — in one
    /// transaction.
    pub async fn revoke(
        &self,
        workspace: &str,
        skill: &SkillRow,
        revision: i64,
        reason: &str,
        now: i64,
    ) -> Result<Revocation> {
        let name = &skill.name;
        let mut tx = self.write_tx().await?;
        let done = sqlx::query(
            "UPDATE revisions SET state = 'revoked', state_reason = $3, state_changed_at = $4
             WHERE skill_id = $1 AND revision = $2 AND state = 'available' RETURNING digest",
        )
        .bind(&skill.id)
        .bind(revision)
        .bind(reason)
        .bind(now)
        .fetch_optional(&mut *tx)
        .await?;
        let current: i64 = sqlx::query("SELECT current_revision FROM skills WHERE id = $1")
            .bind(&skill.id)
            .fetch_one(&mut *tx)
            .await?
            .try_get(0)?;
        let digest: String = match done {
            Some(r) => r.try_get(0)?,
            None => {
                let row = sqlx::query("SELECT state, digest, state_reason FROM revisions WHERE skill_id = $1 AND revision = $2")
                    .bind(&skill.id)
                    .bind(revision)
                    .fetch_optional(&mut *tx)
                    .await?;
                return match row {
                    Some(r) if r.try_get::<String, _>(0)? == "revoked" => {
                        Ok(Revocation::AlreadyRevoked {
                            digest: r.try_get(1)?,
                            reason: r.try_get::<Option<String>, _>(2)?.unwrap_or_default(),
                            current_revision: current,
                        })
                    }
                    Some(r) => Err(RegistryError::NotFound(format!(
                        "revision {revision} of {name:?} is {}",
                        r.try_get::<String, _>(0)?
                    ))),
                    None => Err(RegistryError::NotFound(format!(
                        "skill {name:?} has no revision {revision}"
                    ))),
                };
            }
        };
        let mut current_revision = current;
        if current == revision {
            let fallback: Option<i64> = sqlx::query("SELECT MAX(revision) FROM revisions WHERE skill_id = $1 AND revision < $2 AND state = 'available'")
                .bind(&skill.id)
                .bind(revision)
                .fetch_one(&mut *tx)
                .await?
                .try_get(0)?;
            let fallback = fallback.unwrap_or(0);
            execute!(
                &mut *tx,
                "UPDATE skills SET current_revision = $3, updated_at = $4 WHERE id = $1 AND current_revision = $2",
                &skill.id,
                revision,
                fallback,
                now
            );
            MetaStore::append_event(
                &mut tx,
                workspace,
                "skill.current_moved",
                serde_json::json!({"skill": name, "skill_id": skill.id, "revision": fallback, "base_revision": revision, "cause": "revocation"}),
            )
            .await?;
            current_revision = fallback;
        }
        MetaStore::append_event(
            &mut tx,
            workspace,
            "revision.revoked",
            serde_json::json!({"skill": name, "skill_id": skill.id, "revision": revision, "digest": digest, "reason": reason}),
        )
        .await?;
        let shared: i64 =
            sqlx::query("SELECT COUNT(*) FROM revisions WHERE digest = $1 AND state = 'available'")
                .bind(&digest)
                .fetch_one(&mut *tx)
                .await?
                .try_get(0)?;
        tx.commit().await?;
        Ok(Revocation::Revoked {
            digest,
            current_revision,
            tree_shared: shared > 0,
        })
    }
}
