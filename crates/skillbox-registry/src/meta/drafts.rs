//! Drafts and their files; run drafts (whose files live in a run's sandbox).

use super::*;

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

impl MetaStore {
    pub async fn insert_draft(
        &self,
        id: &str,
        workspace: &str,
        skill: &str,
        base: i64,
        files: &[DraftFile],
        present: PresenceCheck<'_>,
    ) -> Result<bool> {
        let Some(mut tx) = self.write_tx_with(present).await? else {
            return Ok(false);
        };
        let now = now_ms();
        Self::insert_draft_row(&mut tx, id, workspace, skill, base, now).await?;
        for f in files {
            Self::put_draft_file_tx(&mut tx, id, f).await?;
        }
        tx.commit().await?;
        Ok(true)
    }

    async fn insert_draft_row(
        tx: &mut Tx,
        id: &str,
        workspace: &str,
        skill: &str,
        base: i64,
        now: i64,
    ) -> Result<()> {
        execute!(
            &mut **tx,
            "INSERT INTO drafts (id, workspace, skill, base_revision, created_at, updated_at) VALUES ($1, $2, $3, $4, $5, $5)",
            id,
            workspace,
            skill,
            base,
            now
        );
        Ok(())
    }

    pub(super) async fn put_draft_file_tx(tx: &mut Tx, id: &str, f: &DraftFile) -> Result<()> {
        execute!(&mut **tx, "INSERT INTO draft_files (draft_id, path, sha256, size, executable) VALUES ($1, $2, $3, $4, $5)
             ON CONFLICT (draft_id, path) DO UPDATE SET sha256 = excluded.sha256, size = excluded.size, executable = excluded.executable", id, &f.path, &f.sha256, f.size, f.executable as i64);
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
        Self::insert_draft_row(&mut tx, id, workspace, skill, base, now).await?;
        execute!(
            &mut *tx,
            "INSERT INTO run_drafts (draft_id, run_id) VALUES ($1, $2)",
            id,
            run_id
        );
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
            Ok(from_row!(&r => DraftRow {
                id, skill, base_revision, created_at, updated_at, run_id
            }))
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
        let Some(mut tx) = self.write_tx_with(present).await? else {
            return Ok(false);
        };
        Self::put_draft_file_tx(&mut tx, id, f).await?;
        execute!(
            &mut *tx,
            "UPDATE drafts SET updated_at = $2 WHERE id = $1",
            id,
            now_ms()
        );
        tx.commit().await?;
        Ok(true)
    }

    pub async fn delete_draft_file(&self, id: &str, path: &str) -> Result<bool> {
        let r = execute!(
            &self.writer,
            "DELETE FROM draft_files WHERE draft_id = $1 AND path = $2",
            id,
            path
        );
        Ok(r.rows_affected() > 0)
    }

    pub async fn set_draft_base(&self, id: &str, base: i64) -> Result<()> {
        execute!(
            &self.writer,
            "UPDATE drafts SET base_revision = $2, updated_at = $3 WHERE id = $1",
            id,
            base,
            now_ms()
        );
        Ok(())
    }

    pub async fn delete_draft(&self, id: &str) -> Result<()> {
        let mut tx = self.write_tx().await?;
        execute!(&mut *tx, "DELETE FROM draft_files WHERE draft_id = $1", id);
        execute!(&mut *tx, "DELETE FROM run_drafts WHERE draft_id = $1", id);
        execute!(&mut *tx, "DELETE FROM drafts WHERE id = $1", id);
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
