//! Workspace tokens, stored as their SHA-256.

use super::*;

impl MetaStore {
    pub async fn insert_token(&self, hash: &str, workspace: &str, role: &str) -> Result<()> {
        execute!(
            &self.writer,
            "INSERT INTO tokens (hash, workspace, role, created_at) VALUES ($1, $2, $3, $4)",
            hash,
            workspace,
            role,
            now_ms()
        );
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
}
