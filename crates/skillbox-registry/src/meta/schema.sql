-- The metadata schema: the same text on SQLite and PostgreSQL (TEXT and BIGINT columns,
-- integer millisecond timestamps). Statements are separated by semicolons; each is idempotent.

CREATE TABLE IF NOT EXISTS workspaces (
    name TEXT PRIMARY KEY,
    event_seq BIGINT NOT NULL,
    created_at BIGINT NOT NULL);

CREATE TABLE IF NOT EXISTS skills (
    id TEXT PRIMARY KEY,
    workspace TEXT NOT NULL,
    name TEXT NOT NULL,
    state TEXT NOT NULL,
    current_revision BIGINT NOT NULL,
    last_revision BIGINT NOT NULL,
    created_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL,
    deleted_at BIGINT);

CREATE UNIQUE INDEX IF NOT EXISTS skills_active_name ON skills (workspace, name) WHERE state = 'active';

CREATE TABLE IF NOT EXISTS revisions (
    skill_id TEXT NOT NULL,
    revision BIGINT NOT NULL,
    digest TEXT NOT NULL,
    parent_revision BIGINT NOT NULL,
    state TEXT NOT NULL,
    publisher TEXT NOT NULL,
    published_at BIGINT NOT NULL,
    file_count BIGINT NOT NULL,
    size BIGINT NOT NULL,
    frontmatter TEXT NOT NULL,
    state_reason TEXT,
    state_changed_at BIGINT,
    PRIMARY KEY (skill_id, revision));

CREATE INDEX IF NOT EXISTS revisions_digest ON revisions (digest);

CREATE TABLE IF NOT EXISTS tokens (
    hash TEXT PRIMARY KEY,
    workspace TEXT NOT NULL,
    role TEXT NOT NULL,
    created_at BIGINT NOT NULL);

CREATE TABLE IF NOT EXISTS drafts (
    id TEXT PRIMARY KEY,
    workspace TEXT NOT NULL,
    skill TEXT NOT NULL,
    base_revision BIGINT NOT NULL,
    created_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL);

-- A run draft: its files live in the run's sandbox workspace, not in draft_files.
CREATE TABLE IF NOT EXISTS run_drafts (
    draft_id TEXT PRIMARY KEY,
    run_id TEXT NOT NULL);

CREATE TABLE IF NOT EXISTS draft_files (
    draft_id TEXT NOT NULL,
    path TEXT NOT NULL,
    sha256 TEXT NOT NULL,
    size BIGINT NOT NULL,
    executable BIGINT NOT NULL,
    PRIMARY KEY (draft_id, path));

CREATE TABLE IF NOT EXISTS events (
    workspace TEXT NOT NULL,
    seq BIGINT NOT NULL,
    kind TEXT NOT NULL,
    at BIGINT NOT NULL,
    data TEXT NOT NULL,
    PRIMARY KEY (workspace, seq));

CREATE TABLE IF NOT EXISTS runs (
    id TEXT PRIMARY KEY,
    workspace TEXT NOT NULL,
    state TEXT NOT NULL,
    ttl_ms BIGINT NOT NULL,
    expires_at BIGINT NOT NULL,
    require_immutable BIGINT NOT NULL,
    created_at BIGINT NOT NULL,
    ended_at BIGINT);

CREATE INDEX IF NOT EXISTS runs_live ON runs (state, expires_at);

-- The two tables every activation reads (`run_skills`) or writes (`pins`) are their primary
-- key's B-tree on SQLite (`WITHOUT ROWID`, which PostgreSQL's schema leaves out): one descent
-- per lookup and one leaf written per new pin, where a rowid table and its key's index took
-- two. Databases made before are rebuilt so when they are opened.
CREATE TABLE IF NOT EXISTS run_skills (
    run_id TEXT NOT NULL,
    skill_name TEXT NOT NULL,
    skill_id TEXT NOT NULL,
    PRIMARY KEY (run_id, skill_name)) WITHOUT ROWID;

CREATE TABLE IF NOT EXISTS pins (
    run_id TEXT NOT NULL,
    skill_id TEXT NOT NULL,
    skill_name TEXT NOT NULL,
    revision BIGINT NOT NULL,
    digest TEXT NOT NULL,
    activated_at BIGINT NOT NULL,
    PRIMARY KEY (run_id, skill_id)) WITHOUT ROWID;

-- No index by revision (collection finds pinned revisions through the live runs, see
-- `COLLECTABLE`): it cost every new pin a second random page. Databases made before drop it.
DROP INDEX IF EXISTS pins_revision;

-- Execution nodes (SPEC §7.3): one row per node identity, updated at every registration (a
-- restarted node gives its new address and gets a new secret) and heartbeat. A node belongs
-- to the node token it first registered with (`token_hash`).
CREATE TABLE IF NOT EXISTS nodes (
    id TEXT PRIMARY KEY,
    token_hash TEXT NOT NULL,
    address TEXT NOT NULL,
    version TEXT NOT NULL,
    secret TEXT NOT NULL,
    load BIGINT NOT NULL,
    registered_at BIGINT NOT NULL,
    last_heartbeat BIGINT NOT NULL);

-- Where a run's sandbox is (`serve --box remote`): one node per run, set at its first
-- execution, moved only by an explicit new sandbox.
CREATE TABLE IF NOT EXISTS run_placements (
    run_id TEXT PRIMARY KEY,
    node_id TEXT NOT NULL,
    placed_at BIGINT NOT NULL);
