-- walpost outbox migration 0005: walpost_pauses, one row per slot whose stream an operator
-- paused through walpost run's admin API (POST /api/v1/pause, docs/control-plane.md).
--
-- Why a table: a pause must outlive the process that took it. A restart, or a hot standby
-- that takes the slot over, reads this row before it streams and stays paused until
-- POST /api/v1/resume deletes it; every running instance re-reads it every few seconds, so
-- a pause taken through one instance's API stops whichever instance streams. The row says
-- when and by which token (its NAME in [admin] tokens_file, never the token or its hash).
--
-- Plain SQL, idempotent. `walpost migrate --postgres URL` applies it and records it in
-- events.walpost_migrations; teams with their own migration tool run the same file:
--   psql "$DATABASE_URL" -v ON_ERROR_STOP=1 -f migrations/outbox/0005_pause.sql
-- walpost's role reads the row and, through the admin API, writes and deletes it:
--   GRANT SELECT, INSERT, UPDATE, DELETE ON events.walpost_pauses TO walpost;
-- Never edit this file once shipped: add a new numbered migration instead.

CREATE SCHEMA IF NOT EXISTS events;

CREATE TABLE IF NOT EXISTS events.walpost_pauses (
    slot       text        PRIMARY KEY,
    paused_at  timestamptz NOT NULL DEFAULT now(),
    paused_by  text        NOT NULL
);

COMMENT ON TABLE events.walpost_pauses IS
    'walpost run: slots whose stream is paused (admin API POST /api/v1/pause) until resumed; delete the row to resume.';
