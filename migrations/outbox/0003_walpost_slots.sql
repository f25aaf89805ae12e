-- walpost outbox migration 0003: walpost_slots, walpost's record of the slots it streams
-- from, in the outbox table's schema (events). Optional: walpost creates it itself, from
-- this file, when its role has CREATE on that schema.
--
-- Why: a logical slot does not survive a failover to a server that did not have it
-- (PostgreSQL before 17, or a standby without slot synchronization). This table is an
-- ordinary table, so physical replication carries it to the standby; after a promotion
-- walpost finds the row, sees the slot is missing, and stops with the error quoted in
-- runbooks/slot-lost.md instead of creating a new slot that would silently skip every
-- event committed since the old slot's confirmed position.
--
-- progress_key: with --delivery exactly-once, the key walpost signs its progress records
-- with (made by walpost on first use), so a Kafka client that may write the progress topic
-- but cannot read this table cannot make walpost skip events (runbooks/exactly-once.md).
-- Keep it readable by walpost's role only.
--
-- The schema: this file names none, as walpost keeps the table beside an outbox of any
-- schema (--table app.outbox: app.walpost_slots). It goes into the schema search_path
-- names; run it with search_path set to exactly "<schema>, pg_temp" (the first statement
-- refuses anything else):
--   walpost migrate --postgres URL                           sets it (schema events)
--   psql -v ON_ERROR_STOP=1 -1 -c 'SET search_path = events, pg_temp' \
--        -f migrations/outbox/0003_walpost_slots.sql         for teams with their own tool
-- Apply it when walpost's role may not create tables, then grant it the row rights:
--   GRANT SELECT, INSERT, UPDATE, DELETE ON events.walpost_slots TO walpost;
-- Deleting a row tells walpost that a missing slot may be created again (the gap accepted);
-- `walpost slot drop` does that itself.
-- Never edit this file once shipped: add a new numbered migration instead.

DO $walpost_schema$
BEGIN
    IF pg_catalog.current_schema() IS NULL OR pg_catalog.current_schema() LIKE 'pg\_%'
       OR pg_catalog.current_setting('search_path') !~ '^\s*("([^"]|"")+"|[^",\s]+)\s*,\s*pg_temp\s*$' THEN
        RAISE EXCEPTION 'walpost_slots goes into the schema of the outbox table: run this file with search_path = <that schema>, pg_temp (search_path is %)',
            pg_catalog.current_setting('search_path')
            USING HINT = 'walpost migrate sets it; with psql, run SET search_path = events, pg_temp; before the file';
    END IF;
END $walpost_schema$;

CREATE TABLE IF NOT EXISTS walpost_slots (
    slot              text PRIMARY KEY,
    system_identifier text NOT NULL,      -- pg_control_system().system_identifier where it was created
    timeline          integer NOT NULL,   -- the server's timeline then
    created_at        timestamptz NOT NULL,
    progress_key      text                -- exactly-once: see above
);
-- Tables made by an earlier version of this migration, or by walpost before it used this
-- file.
ALTER TABLE walpost_slots ADD COLUMN IF NOT EXISTS progress_key text;
