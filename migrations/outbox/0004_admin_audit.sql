-- walpost outbox migration 0004: walpost_admin_audit, one row per action taken through
-- walpost run's admin API ([admin] addr, docs/control-plane.md).
--
-- Why a table as well as the log line: the database the action changed keeps the record
-- of who changed it, for as long as the database's own backups keep it, whatever happens
-- to the logs. A row says which token (its NAME in [admin] tokens_file, never the token
-- or its hash), its role, the action (`METHOD /route`), its target and the result; never
-- a payload.
--
-- Plain SQL, idempotent. `walpost migrate --postgres URL` applies it and records it in
-- events.walpost_migrations; teams with their own migration tool run the same file:
--   psql "$DATABASE_URL" -v ON_ERROR_STOP=1 -f migrations/outbox/0004_admin_audit.sql
-- The audit is append-only for walpost's role: it may add rows, never change or remove
-- them (the owner prunes old rows, if ever):
--   GRANT INSERT ON events.walpost_admin_audit TO walpost;
--   GRANT SELECT ON events.walpost_admin_audit TO auditor;     -- whoever reads the audit
-- Never edit this file once shipped: add a new numbered migration instead.

CREATE SCHEMA IF NOT EXISTS events;

CREATE TABLE IF NOT EXISTS events.walpost_admin_audit (
    at          timestamptz NOT NULL DEFAULT now(),
    token_name  text        NOT NULL,
    role        text        NOT NULL,
    action      text        NOT NULL,
    target      text        NOT NULL,
    result      text        NOT NULL
);

CREATE INDEX IF NOT EXISTS walpost_admin_audit_at_idx ON events.walpost_admin_audit (at);

COMMENT ON TABLE events.walpost_admin_audit IS
    'walpost admin API actions: who (token name and role), what, on what, with what result. Append-only for walpost''s role.';
