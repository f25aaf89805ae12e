-- walpost outbox migration 0006: walpost_redrives, one row per dead letter an operator
-- redrove through walpost run's admin API (POST /api/v1/dead-letters/redrive,
-- docs/control-plane.md), with what came of it.
--
-- Why a table: the dead-letter topic is append-only, so a dead letter that was redriven
-- still sits there; GET /api/v1/dead-letters reads the newest row per event id from here
-- to say whether (and with what result) it was redriven, whichever instance did it and
-- across restarts. A row says which event (the outbox table and the value of its id
-- column), when, by which token (its NAME in [admin] tokens_file, never the token or its
-- hash), the result (`redriven`, `still_refused`, `not_found`), where it went (topic,
-- partition, offset) or why not; never a payload.
--
-- Plain SQL, idempotent. `walpost migrate --postgres URL` applies it and records it in
-- events.walpost_migrations; teams with their own migration tool run the same file:
--   psql "$DATABASE_URL" -v ON_ERROR_STOP=1 -f migrations/outbox/0006_redrives.sql
-- walpost's role adds rows and reads them (the owner prunes old rows, if ever):
--   GRANT SELECT, INSERT ON events.walpost_redrives TO walpost;
-- Never edit this file once shipped: add a new numbered migration instead.

CREATE SCHEMA IF NOT EXISTS events;

CREATE TABLE IF NOT EXISTS events.walpost_redrives (
    event_id      text        NOT NULL,
    outbox_table  text,
    at            timestamptz NOT NULL DEFAULT now(),
    by_token      text        NOT NULL,
    result        text        NOT NULL,
    topic         text,
    "partition"   integer,
    "offset"      bigint,
    reason        text
);

CREATE INDEX IF NOT EXISTS walpost_redrives_event_idx ON events.walpost_redrives (event_id, at DESC);

COMMENT ON TABLE events.walpost_redrives IS
    'walpost run: dead letters redriven through the admin API (POST /api/v1/dead-letters/redrive), newest row per event id is its redrive state. No payloads.';
