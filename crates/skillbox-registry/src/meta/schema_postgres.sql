-- PostgreSQL only, after schema.sql: what several servers on one database need to hear from
-- each other. Each trigger notifies at commit (never for a rolled-back change), so a server
-- that LISTENs learns of every committed change that can end a pinned read, and of every
-- event, without polling (see notify.rs).

CREATE OR REPLACE FUNCTION skillbox_announce() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_notify(TG_ARGV[0], '');
  RETURN NULL;
END
$$;

-- Which revision changed state, as "<skill id> <revision> <state>": a revocation also kills
-- the executions that mount the revision on every server.
CREATE OR REPLACE FUNCTION skillbox_announce_revision() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF NEW.state IS DISTINCT FROM OLD.state THEN
    PERFORM pg_notify('skillbox_pins', NEW.skill_id || ' ' || NEW.revision || ' ' || NEW.state);
  END IF;
  RETURN NULL;
END
$$;

-- A run finished or expired; a revision revoked or collected: cached pins are stale.
CREATE OR REPLACE TRIGGER skillbox_runs_state AFTER UPDATE OF state ON runs
  FOR EACH STATEMENT EXECUTE FUNCTION skillbox_announce('skillbox_pins');
CREATE OR REPLACE TRIGGER skillbox_revisions_state AFTER UPDATE OF state ON revisions
  FOR EACH ROW EXECUTE FUNCTION skillbox_announce_revision();

-- A new event: wake `/events` followers.
CREATE OR REPLACE TRIGGER skillbox_events_appended AFTER INSERT ON events
  FOR EACH STATEMENT EXECUTE FUNCTION skillbox_announce('skillbox_events');
