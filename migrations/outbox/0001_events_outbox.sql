-- walpost outbox migration 0001: the events schema and the outbox table.
--
-- The table is the seed's polling-era outbox (BIGSERIAL id, aggregate_type,
-- aggregate_id UUID, event_type, payload JSONB, occurred_at, plus published_at,
-- retry_count, last_error, next_retry_at), so a service that writes it today keeps
-- working unchanged. walpost only reads INSERTs of it from the WAL; the polling
-- columns stay for users migrating from a polling relay (see --snapshot-filter).
--
-- Plain SQL, idempotent. `walpost migrate --postgres URL` applies it and records it in
-- events.walpost_migrations; teams with their own migration tool run the same file:
--   psql "$DATABASE_URL" -v ON_ERROR_STOP=1 -f migrations/outbox/0001_events_outbox.sql
-- Never edit this file once shipped: add a new numbered migration instead.

CREATE SCHEMA IF NOT EXISTS events;

CREATE TABLE IF NOT EXISTS events.outbox (
    id              BIGSERIAL PRIMARY KEY,
    aggregate_type  TEXT        NOT NULL,
    aggregate_id    UUID        NOT NULL,
    event_type      TEXT        NOT NULL,
    payload         JSONB       NOT NULL,
    occurred_at     TIMESTAMPTZ NOT NULL DEFAULT now(),
    published_at    TIMESTAMPTZ,
    retry_count     INTEGER     NOT NULL DEFAULT 0,
    last_error      TEXT,
    next_retry_at   TIMESTAMPTZ,
    CONSTRAINT outbox_retry_nonneg CHECK (retry_count >= 0)
);

CREATE INDEX IF NOT EXISTS outbox_aggregate_idx
    ON events.outbox (aggregate_type, aggregate_id, id);

CREATE INDEX IF NOT EXISTS outbox_unpublished_idx
    ON events.outbox (id) WHERE published_at IS NULL;

COMMENT ON TABLE events.outbox IS
    'Transactional outbox: write one row per event in the business transaction; walpost publishes INSERTs from the WAL to Kafka.';
