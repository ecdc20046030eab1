//! Execution nodes: identity, address, Core's secret for calling the node, load, heartbeats.

use super::*;

/// A node's row.
#[derive(Debug, Clone)]
pub struct NodeRow {
    pub id: String,
    pub address: String,
    pub version: String,
    pub secret: String,
    pub load: i64,
    pub registered_at: i64,
    pub last_heartbeat: i64,
}

const NODE_COLS: &str = "id, address, version, secret, load, registered_at, last_heartbeat";

impl MetaStore {
    /// Records a registration: a new node, or a known one (same id) at its new address with
    /// a new secret.
    pub async fn register_node(&self, node: &NodeRow) -> Result<()> {
        execute!(
            &self.writer,
            "INSERT INTO nodes (id, address, version, secret, load, registered_at, last_heartbeat) \
             VALUES ($1, $2, $3, $4, $5, $6, $7) \
             ON CONFLICT (id) DO UPDATE SET address = $2, version = $3, secret = $4, load = $5, \
             registered_at = $6, last_heartbeat = $7",
            node.id.as_str(),
            node.address.as_str(),
            node.version.as_str(),
            node.secret.as_str(),
            node.load,
            node.registered_at,
            node.last_heartbeat
        );
        Ok(())
    }

    /// Records a heartbeat; false if no node has this id.
    pub async fn node_heartbeat(&self, id: &str, load: i64, now: i64) -> Result<bool> {
        let done = execute!(
            &self.writer,
            "UPDATE nodes SET load = $2, last_heartbeat = $3 WHERE id = $1",
            id,
            load,
            now
        );
        Ok(done.rows_affected() == 1)
    }

    /// Every node, by id.
    pub async fn nodes(&self) -> Result<Vec<NodeRow>> {
        let rows = sqlx::query(AssertSqlSafe(format!(
            "SELECT {NODE_COLS} FROM nodes ORDER BY id"
        )))
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| {
                Ok(from_row!(r => NodeRow {
                    id, address, version, secret, load, registered_at, last_heartbeat
                }))
            })
            .collect()
    }
}
