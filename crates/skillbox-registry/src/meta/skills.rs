//! Skills: lookups, the current pointer's compare-and-swap, soft deletion.

use super::*;

impl MetaStore {
    pub(super) async fn ensure_workspace(tx: &mut Tx, workspace: &str) -> Result<()> {
        execute!(
            &mut **tx,
            "INSERT INTO workspaces (name, event_seq, created_at) VALUES ($1, 0, $2) ON CONFLICT (name) DO NOTHING",
            workspace,
            now_ms()
        );
        Ok(())
    }

    /// The active skill called `name`.
    pub async fn active_skill(&self, workspace: &str, name: &str) -> Result<Option<SkillRow>> {
        Self::skill_named(&self.pool, workspace, name, "state = 'active'").await
    }

    /// The most recently deleted skill called `name` (to answer `skill_deleted`).
    pub async fn deleted_skill(&self, workspace: &str, name: &str) -> Result<Option<SkillRow>> {
        Self::skill_named(
            &self.pool,
            workspace,
            name,
            "state = 'deleted' ORDER BY deleted_at DESC LIMIT 1",
        )
        .await
    }

    /// The skill called `name` whose row also matches `condition` (a constant SQL tail).
    async fn skill_named<'e>(
        db: impl sqlx::Executor<'e, Database = sqlx::Any>,
        workspace: &str,
        name: &str,
        condition: &'static str,
    ) -> Result<Option<SkillRow>> {
        let q = format!(
            "SELECT {SKILL_COLS} FROM skills WHERE workspace = $1 AND name = $2 AND {condition}"
        );
        let row = sqlx::query(AssertSqlSafe(q))
            .bind(workspace)
            .bind(name)
            .fetch_optional(db)
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

    pub(super) async fn active_skill_tx(
        tx: &mut Tx,
        workspace: &str,
        name: &str,
    ) -> Result<Option<SkillRow>> {
        Self::skill_named(&mut **tx, workspace, name, "state = 'active'").await
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
}
