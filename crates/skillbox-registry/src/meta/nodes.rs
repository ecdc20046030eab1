//! Execution nodes: identity, address, Core's secret for calling the node, load, heartbeats.

use super::*;

/// A node's row.
#[derive(Debug, Clone)]
pub struct NodeRow {
    pub id: String,
    /// The node token it registered with: only that token speaks for it.
    pub token_hash: String,
    pub address: String,
    pub version: String,
    pub secret: String,
    pub load: i64,
    pub registered_at: i64,
    pub last_heartbeat: i64,
}

impl NodeRow {
    /// Whether the node is live now: its last heartbeat is younger than `timeout`.
    pub fn is_live(&self, timeout: std::time::Duration) -> bool {
        now_ms() - self.last_heartbeat <= timeout.as_millis() as i64
    }
}

const NODE_COLS: &str =
    "id, token_hash, address, version, secret, load, registered_at, last_heartbeat";

impl MetaStore {
    /// Records a registration: a new node, or a known one (same id, same token) at its new
    /// address with a new secret. False when the id belongs to another node token.
    pub async fn register_node(&self, node: &NodeRow) -> Result<bool> {
        let done = execute!(
            &self.writer,
            "INSERT INTO nodes (id, token_hash, address, version, secret, load, registered_at, last_heartbeat) \
             VALUES ($1, $8, $2, $3, $4, $5, $6, $7) \
             ON CONFLICT (id) DO UPDATE SET address = $2, version = $3, secret = $4, load = $5, \
             registered_at = $6, last_heartbeat = $7 WHERE nodes.token_hash = $8",
            node.id.as_str(),
            node.address.as_str(),
            node.version.as_str(),
            node.secret.as_str(),
            node.load,
            node.registered_at,
            node.last_heartbeat,
            node.token_hash.as_str()
        );
        Ok(done.rows_affected() == 1)
    }

    /// Records a heartbeat; false if no node of this token has this id.
    pub async fn node_heartbeat(
        &self,
        id: &str,
        token_hash: &str,
        load: i64,
        now: i64,
    ) -> Result<bool> {
        let done = execute!(
            &self.writer,
            "UPDATE nodes SET load = $2, last_heartbeat = $3 WHERE id = $1 AND token_hash = $4",
            id,
            load,
            now,
            token_hash
        );
        Ok(done.rows_affected() == 1)
    }

    /// Whether node `id` belongs to the node token `token_hash`.
    pub async fn node_of_token(&self, token_hash: &str, id: &str) -> Result<bool> {
        let row = sqlx::query("SELECT 1 FROM nodes WHERE id = $1 AND token_hash = $2")
            .bind(id)
            .bind(token_hash)
            .fetch_optional(&self.pool)
            .await?;
        Ok(row.is_some())
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
                    id, token_hash, address, version, secret, load, registered_at, last_heartbeat
                }))
            })
            .collect()
    }
}

impl MetaStore {
    /// The node run `run_id`'s sandbox is on, placing it on `candidate` if it has none yet
    /// (of concurrent first placements one wins, and all answer the winner).
    pub async fn place_run(&self, run_id: &str, candidate: &str) -> Result<String> {
        execute!(
            &self.writer,
            "INSERT INTO run_placements (run_id, node_id, placed_at) VALUES ($1, $2, $3) \
             ON CONFLICT (run_id) DO NOTHING",
            run_id,
            candidate,
            now_ms()
        );
        self.placement(run_id)
            .await?
            .ok_or_else(|| RegistryError::broken("a placement vanished after it was made"))
    }

    /// The node run `run_id`'s sandbox is on, if it was placed.
    pub async fn placement(&self, run_id: &str) -> Result<Option<String>> {
        let row = sqlx::query("SELECT node_id FROM run_placements WHERE run_id = $1")
            .bind(run_id)
            .fetch_optional(&self.pool)
            .await?;
        row.map(|r| Ok(r.try_get(0)?)).transpose()
    }

    /// Moves run `run_id`'s sandbox to `node` (a new sandbox after the old one was lost).
    pub async fn replace_placement(&self, run_id: &str, node: &str) -> Result<()> {
        execute!(
            &self.writer,
            "INSERT INTO run_placements (run_id, node_id, placed_at) VALUES ($1, $2, $3) \
             ON CONFLICT (run_id) DO UPDATE SET node_id = $2, placed_at = $3",
            run_id,
            node,
            now_ms()
        );
        Ok(())
    }

    /// Placed runs that ended (finished, expired, or lease lapsed): (run id, node id), whose
    /// sandboxes their nodes may release.
    pub async fn ended_placements(&self, now: i64) -> Result<Vec<(String, String)>> {
        let rows = sqlx::query(
            "SELECT rp.run_id, rp.node_id FROM run_placements rp JOIN runs r ON r.id = rp.run_id \
             WHERE r.state <> 'active' OR r.expires_at <= $1",
        )
        .bind(now)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
            .collect()
    }

    /// Forgets a placement whose sandbox its node released.
    pub async fn forget_placement(&self, run_id: &str, node_id: &str) -> Result<()> {
        execute!(
            &self.writer,
            "DELETE FROM run_placements WHERE run_id = $1 AND node_id = $2",
            run_id,
            node_id
        );
        Ok(())
    }

    /// Whether a node of this node token may fetch `digest`: an available revision that a run
    /// placed on one of its nodes pins, or the current revision of a skill such a live run has
    /// pinned (what a node prefetches).
    pub async fn digest_fetchable_by_nodes_of(
        &self,
        token_hash: &str,
        digest: &str,
        now: i64,
    ) -> Result<bool> {
        let row = sqlx::query(
            "SELECT 1 FROM pins p JOIN run_placements rp ON rp.run_id = p.run_id \
             JOIN nodes n ON n.id = rp.node_id \
             JOIN revisions r ON r.skill_id = p.skill_id AND r.revision = p.revision \
             WHERE p.digest = $1 AND n.token_hash = $2 AND r.state = 'available' LIMIT 1",
        )
        .bind(digest)
        .bind(token_hash)
        .fetch_optional(&self.pool)
        .await?;
        if row.is_some() {
            return Ok(true);
        }
        let row = sqlx::query(AssertSqlSafe(format!(
            "{PREFETCH_SELECT} AND n.token_hash = $2 AND r.digest = $3 LIMIT 1"
        )))
        .bind(now)
        .bind(token_hash)
        .bind(digest)
        .fetch_optional(&self.pool)
        .await?;
        Ok(row.is_some())
    }

    /// What node `node_id` may prefetch: the current available revision of every skill that a
    /// live run placed on it has pinned, (skill id, revision, digest), ordered.
    pub async fn prefetch_set(
        &self,
        node_id: &str,
        now: i64,
    ) -> Result<Vec<(String, i64, String)>> {
        let rows = sqlx::query(AssertSqlSafe(format!(
            "{PREFETCH_SELECT} AND n.id = $2 ORDER BY r.skill_id"
        )))
        .bind(now)
        .bind(node_id)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| Ok((r.try_get(0)?, r.try_get(1)?, r.try_get(2)?)))
            .collect()
    }
}

/// Current available revisions of skills pinned by live placed runs (`$1` is now); the caller
/// adds which node(s) from `$2` on.
const PREFETCH_SELECT: &str = "SELECT DISTINCT r.skill_id, r.revision, r.digest FROM run_placements rp \
     JOIN nodes n ON n.id = rp.node_id \
     JOIN runs ru ON ru.id = rp.run_id \
     JOIN pins p ON p.run_id = rp.run_id \
     JOIN skills s ON s.id = p.skill_id \
     JOIN revisions r ON r.skill_id = s.id AND r.revision = s.current_revision \
     WHERE ru.state = 'active' AND ru.expires_at > $1 AND s.state = 'active' \
     AND r.state = 'available'";
