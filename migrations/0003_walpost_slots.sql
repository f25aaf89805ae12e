-- walpost migration 0003: events.walpost_slots, walpost's record of the slots it streams
-- from (optional: walpost creates it itself when its role has CREATE on schema events).
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
-- Apply it when walpost's role may not create tables, then grant it the row rights:
--   GRANT SELECT, INSERT, UPDATE, DELETE ON events.walpost_slots TO walpost;
-- Deleting a row tells walpost that a missing slot may be created again (the gap accepted);
-- `walpost slot drop` does that itself.

CREATE TABLE IF NOT EXISTS events.walpost_slots (
    slot              text PRIMARY KEY,
    system_identifier text NOT NULL,      -- pg_control_system().system_identifier where it was created
    timeline          integer NOT NULL,   -- the server's timeline then
    created_at        timestamptz NOT NULL,
    progress_key      text                -- exactly-once: see above
);
-- Tables made by an earlier version of this migration.
ALTER TABLE events.walpost_slots ADD COLUMN IF NOT EXISTS progress_key text;
