//! The per-workspace event log: appended in the transaction of the change it records.

use super::*;

impl MetaStore {
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
        execute!(
            &mut **tx,
            "INSERT INTO events (workspace, seq, kind, at, data) VALUES ($1, $2, $3, $4, $5)",
            workspace,
            seq,
            kind,
            now_ms(),
            data.to_string()
        );
        Ok(seq)
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
}
