-- walpost inbox migration 0001: the inbox, the consumer half of the outbox design.
--
-- "At-least-once + inbox = effectively once": records arrive in inbox.messages once per
-- event id (a duplicate delivery or a replay is not stored again), and each handler of a
-- consuming service records that it acted on an event with a receipt, written in the
-- same transaction as the handler's own writes. A side effect and its receipt commit
-- together or not at all, so each event's effect happens once per handler, whatever
-- crashed or was delivered twice.
--
-- A service drives its handlers with plain SQL from any language (docs/inbox.md):
--   inbox.register_handler(name, topics, event_types, max_attempts, backoff_base, backoff_max, ordered)
--   inbox.claim(handler, max_rows, lease)            -> the due messages, each with a lease token
--   inbox.complete(handler, event_id, lease_token)   -> true: receipt written (call it inside
--                                                        the transaction of the handler's writes)
--   inbox.fail(handler, event_id, lease_token, error_code) -> 'pending' (retried later, with
--                                                        backoff) or 'review_required'
--   inbox.retry(handler, event_id)                   -> a reviewed message goes back to pending
--   inbox.dismiss(handler, event_id)                 -> or is closed without a receipt (the
--                                                        review decision not to handle it)
-- and reads inbox.handler_stats for backlog, oldest pending age and review_required.
--
-- Invariants:
--   * one row per event id in inbox.messages while its day is kept (the ingest looks the
--     ids up in every partition, its writers taking turns; see "Dedup window" below);
--   * at most one receipt per (handler, event id): complete() writes one only for a
--     pending delivery (one per handler and message), and
--     complete() writes one only for the holder of the current lease token: a worker whose
--     lease expired and was taken over gets false and must roll back its writes;
--   * a handler sees a message only when it has no receipt, is due and is not leased; with
--     ordered = true only the oldest open message of each aggregate is offered, so that
--     handler acts on one aggregate's events in arrival order (a message in review_required
--     holds its aggregate's later ones back until it is retried or dismissed);
--   * error codes are short codes, never payload text (personal data stays out of the
--     inbox's own columns).
--
-- Retention: messages, deliveries and receipts are partitioned by the UTC day a message
-- arrived (received_at); a day's three partitions are dropped together, never emptied with
-- DELETE. `walpost inbox` creates the days ahead and drops a day once it is older than
-- [inbox.retention] keep_days and no delivery in it is open (pending or review_required),
-- or once it is older than max_days (reported with what was still open). This file creates
-- today's and the next two days' partitions, so an inbox applied by hand works at once.
--
-- Dedup window: an event id is stored once while the day it arrived is kept (keep_days at
-- least). A copy arriving after that day was dropped is stored again. The ingest checks
-- every partition for the ids of a batch, with writers of one inbox taking turns (an
-- advisory lock): a primary key on a partitioned table must hold the partition key, so
-- it cannot make event_id unique by itself.
--
-- Idempotent: every statement may run again. Needs PostgreSQL 14 or later.
--
-- The schema: this file names none. What it creates goes into the schema search_path
-- names, and every function keeps that search_path (SET search_path FROM CURRENT), so it
-- finds the inbox's tables wherever the inbox lives. Run it with search_path set to
-- exactly "<inbox schema>, pg_temp" (the first statement refuses anything else):
-- pg_catalog, not named, is then searched first, the inbox's schema next and pg_temp
-- last, so nothing this file creates, and no function of it, binds to an object a role
-- with CREATE on another schema (public, on PostgreSQL 14) planted there.
--   walpost migrate --inbox [--schema NAME] --postgres URL    sets it, records the file
--   psql -v ON_ERROR_STOP=1 -1 -c 'CREATE SCHEMA IF NOT EXISTS inbox' \
--        -c 'SET search_path = inbox, pg_temp' -f migrations/inbox/0001_inbox.sql \
--        -f migrations/inbox/0002_inbox_hardening.sql      for teams with their own tool
-- Never edit this file once shipped: add a new numbered migration instead.

-- Nothing is created until search_path names the schema (see the header): a file run
-- with the default search_path would create the inbox in public.
DO $walpost_schema$
BEGIN
    IF pg_catalog.current_schema() IS NULL OR pg_catalog.current_schema() LIKE 'pg\_%'
       OR pg_catalog.current_setting('search_path') !~ '^\s*("([^"]|"")+"|[^",\s]+)\s*,\s*pg_temp\s*$' THEN
        RAISE EXCEPTION 'the inbox migrations run with search_path = <inbox schema>, pg_temp, the schema created first (search_path is %)',
            pg_catalog.current_setting('search_path')
            USING HINT = 'walpost migrate --inbox sets it; with psql, run CREATE SCHEMA IF NOT EXISTS inbox; SET search_path = inbox, pg_temp; before the file (docs/inbox.md)';
    END IF;
END $walpost_schema$;

-- One row per event id, in arrival order (seq).
CREATE SEQUENCE IF NOT EXISTS messages_seq;
CREATE TABLE IF NOT EXISTS messages (
    event_id     text NOT NULL,
    seq          bigint NOT NULL DEFAULT nextval('messages_seq'),
    topic        text NOT NULL,
    "partition"  integer NOT NULL,
    "offset"     bigint NOT NULL,
    key          bytea,
    headers      jsonb NOT NULL DEFAULT '{}',
    payload      bytea,                 -- the record's value, byte for byte
    payload_json jsonb,                 -- the same, when it is JSON
    event_type   text,
    aggregate_id text,
    occurred_at  timestamptz,
    received_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (event_id, received_at)
) PARTITION BY RANGE (received_at);

-- The consumer's position per group and partition, written in the same transaction as the
-- messages it covers (Kafka's own offset commits are for lag dashboards only).
CREATE TABLE IF NOT EXISTS offsets (
    group_id    text NOT NULL,
    topic       text NOT NULL,
    "partition" integer NOT NULL,
    next_offset bigint NOT NULL CHECK (next_offset >= 0),
    PRIMARY KEY (group_id, topic, "partition")
);

-- Records that cannot be stored as messages (no event id, over the size limit), with why.
CREATE TABLE IF NOT EXISTS rejected (
    topic       text NOT NULL,
    "partition" integer NOT NULL,
    "offset"    bigint NOT NULL,
    reason      text NOT NULL,
    received_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (topic, "partition", "offset")
);

CREATE TABLE IF NOT EXISTS handlers (
    name          text PRIMARY KEY CHECK (name ~ '^[A-Za-z0-9_.:-]{1,64}$'),
    topics        text[] NOT NULL,      -- empty: every topic
    event_types   text[] NOT NULL,      -- empty: every event type
    max_attempts  integer NOT NULL CHECK (max_attempts > 0),
    backoff_base  interval NOT NULL CHECK (backoff_base > interval '0'),
    backoff_max   interval NOT NULL,
    ordered       boolean NOT NULL,
    registered_at timestamptz NOT NULL DEFAULT now(),
    CHECK (backoff_max >= backoff_base)
);

-- What each handler still has to do: one row per (handler, message) it matches, made when
-- the message arrives or the handler is registered.
CREATE TABLE IF NOT EXISTS deliveries (
    handler         text NOT NULL REFERENCES handlers (name) ON DELETE CASCADE,
    event_id        text NOT NULL,
    received_at     timestamptz NOT NULL, -- the message's, so both live in the same day
    seq             bigint NOT NULL,    -- the message's arrival order
    aggregate_id    text,
    state           text NOT NULL DEFAULT 'pending'
                    CHECK (state IN ('pending', 'done', 'review_required', 'dismissed')),
    attempts        integer NOT NULL DEFAULT 0,
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    lease_token     uuid,
    lease_until     timestamptz,
    last_error_code text,
    PRIMARY KEY (handler, event_id, received_at)
) PARTITION BY RANGE (received_at);
-- The indexes and the trigger below are made only when absent: CREATE INDEX IF NOT EXISTS
-- and DROP/CREATE TRIGGER lock their table even when there is nothing to do, and a second
-- `walpost inbox --create-schema` beside one that is writing then deadlocked with it.
-- Run again on a complete schema, this file takes no lock a writer holds.
DO $$
BEGIN
    IF to_regclass('deliveries_due') IS NULL THEN
        CREATE INDEX deliveries_due ON deliveries (handler, seq) WHERE state = 'pending';
    END IF;
    IF to_regclass('deliveries_open_by_aggregate') IS NULL THEN
        CREATE INDEX deliveries_open_by_aggregate
            ON deliveries (handler, aggregate_id, seq) WHERE state NOT IN ('done', 'dismissed');
    END IF;
END $$;

CREATE TABLE IF NOT EXISTS receipts (
    handler      text NOT NULL,
    event_id     text NOT NULL,
    received_at  timestamptz NOT NULL,  -- the message's
    completed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (handler, event_id, received_at)
) PARTITION BY RANGE (received_at);

-- Today's and the next two days' partitions of the three tables (walpost inbox keeps
-- [inbox.retention] days_ahead of them); ATTACH, unlike CREATE TABLE ... PARTITION OF,
-- does not make writers of the table wait.
DO $$
DECLARE
    -- The schema's name, from a qualified name (so a renamed schema works alike).
    ns text := (SELECT c.relnamespace::regnamespace::text FROM pg_class c WHERE c.oid = 'messages'::regclass);
    day date;
    t text;
    part text;
BEGIN
    FOR day IN SELECT generate_series((now() AT TIME ZONE 'UTC')::date, (now() AT TIME ZONE 'UTC')::date + 2, '1 day')::date LOOP
        FOREACH t IN ARRAY ARRAY['messages', 'deliveries', 'receipts'] LOOP
            part := t || '_p' || to_char(day, 'YYYYMMDD');
            CONTINUE WHEN to_regclass(format('%s.%I', ns, part)) IS NOT NULL;
            EXECUTE format('CREATE TABLE %s.%I (LIKE %s.%I INCLUDING DEFAULTS INCLUDING CONSTRAINTS)',
                           ns, part, ns, t);
            EXECUTE format('ALTER TABLE %s.%I ATTACH PARTITION %s.%I FOR VALUES FROM (%L) TO (%L)',
                           ns, t, ns, part, day::text || ' 00:00:00+00', (day + 1)::text || ' 00:00:00+00');
        END LOOP;
    END LOOP;
END $$;

-- New messages become deliveries of every handler they match (one statement per batch),
-- except for a handler that has a delivery of that event id already (a message stored
-- again after it was deleted by hand: its receipt or review decision stands).
CREATE OR REPLACE FUNCTION deliver_new_messages() RETURNS trigger
LANGUAGE plpgsql
SET search_path FROM CURRENT AS $$
BEGIN
    INSERT INTO deliveries (handler, event_id, received_at, seq, aggregate_id)
    SELECT h.name, m.event_id, m.received_at, m.seq, m.aggregate_id
    FROM new_messages m
    JOIN handlers h
      ON (cardinality(h.topics) = 0 OR m.topic = ANY (h.topics))
     AND (cardinality(h.event_types) = 0 OR m.event_type = ANY (h.event_types))
    WHERE NOT EXISTS (SELECT 1 FROM deliveries d WHERE d.handler = h.name AND d.event_id = m.event_id)
    ON CONFLICT DO NOTHING;
    RETURN NULL;
END $$;

DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_trigger
                   WHERE tgname = 'deliver_new_messages' AND tgrelid = to_regclass('messages')) THEN
        CREATE TRIGGER deliver_new_messages AFTER INSERT ON messages
            REFERENCING NEW TABLE AS new_messages
            FOR EACH STATEMENT EXECUTE FUNCTION deliver_new_messages();
    END IF;
END $$;

-- Registers a handler or changes its settings; the messages already stored that it
-- matches and has no delivery of (done, dismissed or open) become its deliveries.
-- Idempotent.
CREATE OR REPLACE FUNCTION register_handler(
    p_name text, p_topics text[], p_event_types text[], p_max_attempts integer,
    p_backoff_base interval, p_backoff_max interval, p_ordered boolean
) RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT AS $$
BEGIN
    INSERT INTO handlers AS h (name, topics, event_types, max_attempts, backoff_base, backoff_max, ordered)
    VALUES (p_name, coalesce(p_topics, '{}'), coalesce(p_event_types, '{}'), p_max_attempts,
            p_backoff_base, p_backoff_max, p_ordered)
    ON CONFLICT (name) DO UPDATE SET
        topics = EXCLUDED.topics, event_types = EXCLUDED.event_types, max_attempts = EXCLUDED.max_attempts,
        backoff_base = EXCLUDED.backoff_base, backoff_max = EXCLUDED.backoff_max, ordered = EXCLUDED.ordered;
    INSERT INTO deliveries (handler, event_id, received_at, seq, aggregate_id)
    SELECT h.name, m.event_id, m.received_at, m.seq, m.aggregate_id
    FROM handlers h
    JOIN messages m
      ON (cardinality(h.topics) = 0 OR m.topic = ANY (h.topics))
     AND (cardinality(h.event_types) = 0 OR m.event_type = ANY (h.event_types))
    WHERE h.name = p_name
      AND NOT EXISTS (SELECT 1 FROM deliveries d WHERE d.handler = p_name AND d.event_id = m.event_id)
    ON CONFLICT DO NOTHING;
END $$;

-- Leases up to p_max_rows due messages to the caller, oldest first; workers share the work
-- (SKIP LOCKED). A lease that ran out is taken again by the next claim.
CREATE OR REPLACE FUNCTION claim(p_handler text, p_max_rows integer, p_lease interval)
RETURNS TABLE (event_id text, lease_token uuid, topic text, key bytea, headers jsonb, payload bytea, attempts integer)
LANGUAGE plpgsql
SET search_path FROM CURRENT AS $$
#variable_conflict use_column
DECLARE
    h handlers;
BEGIN
    SELECT * INTO h FROM handlers WHERE name = p_handler;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'inbox handler "%" is not registered: call inbox.register_handler first', p_handler
            USING ERRCODE = 'no_data_found';
    END IF;
    IF p_max_rows IS NULL OR p_max_rows < 1 OR p_lease IS NULL OR p_lease <= interval '0' THEN
        RAISE EXCEPTION 'inbox.claim needs max_rows >= 1 and a positive lease'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN QUERY
    WITH picked AS (
        SELECT d.handler, d.event_id, d.received_at
        FROM deliveries d
        WHERE d.handler = p_handler
          AND d.state = 'pending'
          AND d.next_attempt_at <= now()
          AND (d.lease_until IS NULL OR d.lease_until < now())
          AND (NOT h.ordered OR d.aggregate_id IS NULL OR NOT EXISTS (
                SELECT 1 FROM deliveries e
                WHERE e.handler = d.handler AND e.aggregate_id = d.aggregate_id
                  AND e.seq < d.seq AND e.state NOT IN ('done', 'dismissed')))
        ORDER BY d.seq
        LIMIT p_max_rows
        FOR UPDATE OF d SKIP LOCKED
    ), leased AS (
        UPDATE deliveries d
        SET lease_token = gen_random_uuid(), lease_until = now() + p_lease
        FROM picked
        WHERE d.handler = picked.handler AND d.event_id = picked.event_id AND d.received_at = picked.received_at
        RETURNING d.event_id, d.received_at, d.lease_token, d.attempts, d.seq
    )
    SELECT l.event_id, l.lease_token, m.topic, m.key, m.headers, m.payload, l.attempts
    FROM leased l JOIN messages m ON m.event_id = l.event_id AND m.received_at = l.received_at
    ORDER BY l.seq;
END $$;

-- The handler acted on the message: writes its receipt and returns true, or returns false
-- and writes nothing when p_lease_token is no longer the message's (the lease ran out and
-- another worker took it, or it was already completed): the caller then rolls back.
CREATE OR REPLACE FUNCTION complete(p_handler text, p_event_id text, p_lease_token uuid)
RETURNS boolean
LANGUAGE plpgsql
SET search_path FROM CURRENT AS $$
DECLARE
    day timestamptz;
BEGIN
    UPDATE deliveries
    SET state = 'done', lease_token = NULL, lease_until = NULL
    WHERE handler = p_handler AND event_id = p_event_id AND lease_token = p_lease_token AND state = 'pending'
    RETURNING received_at INTO day;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    INSERT INTO receipts (handler, event_id, received_at) VALUES (p_handler, p_event_id, day);
    RETURN true;
END $$;

-- The handler failed on the message: counts the attempt and schedules the next one after
-- backoff_base * 2^(attempts - 1), at most backoff_max, times a jitter of 0.5 to 1, or
-- moves the message to review_required after max_attempts. Returns the new state, or
-- 'lease_lost' (nothing written) when the lease token is no longer the message's.
CREATE OR REPLACE FUNCTION fail(p_handler text, p_event_id text, p_lease_token uuid, p_error_code text)
RETURNS text
LANGUAGE plpgsql
SET search_path FROM CURRENT AS $$
DECLARE
    new_state text;
BEGIN
    IF p_error_code IS NULL OR p_error_code !~ '^[A-Za-z0-9_.:-]{1,64}$' THEN
        RAISE EXCEPTION 'inbox.fail: an error code is a short code (letters, digits, _ . : -, at most 64 characters), never message text'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    UPDATE deliveries d
    SET attempts = d.attempts + 1,
        last_error_code = p_error_code,
        lease_token = NULL,
        lease_until = NULL,
        state = CASE WHEN d.attempts + 1 >= h.max_attempts THEN 'review_required' ELSE 'pending' END,
        next_attempt_at = now()
            + least(h.backoff_max, h.backoff_base * power(2, d.attempts)) * (0.5 + random() / 2)
    FROM handlers h
    WHERE h.name = d.handler AND d.handler = p_handler AND d.event_id = p_event_id
      AND d.lease_token = p_lease_token AND d.state = 'pending'
    RETURNING d.state INTO new_state;
    RETURN coalesce(new_state, 'lease_lost');
END $$;

-- A message in review_required goes back to pending, due now, with its attempts reset.
-- Returns false when it was not in review_required.
CREATE OR REPLACE FUNCTION retry(p_handler text, p_event_id text)
RETURNS boolean
LANGUAGE plpgsql
SET search_path FROM CURRENT AS $$
BEGIN
    UPDATE deliveries
    SET state = 'pending', attempts = 0, next_attempt_at = now(), last_error_code = NULL
    WHERE handler = p_handler AND event_id = p_event_id AND state = 'review_required';
    RETURN FOUND;
END $$;

-- The review decision not to handle a message in review_required: it is closed without a
-- receipt (it no longer holds back its aggregate, nor its day's partitions from being
-- dropped). Returns false when it was not in review_required.
CREATE OR REPLACE FUNCTION dismiss(p_handler text, p_event_id text)
RETURNS boolean
LANGUAGE plpgsql
SET search_path FROM CURRENT AS $$
BEGIN
    UPDATE deliveries
    SET state = 'dismissed', lease_token = NULL, lease_until = NULL
    WHERE handler = p_handler AND event_id = p_event_id AND state = 'review_required';
    RETURN FOUND;
END $$;

-- Per handler: messages without a receipt, the age of the oldest pending one, the attempts
-- so far and how many wait for review (what walpost's inbox metrics will export).
CREATE OR REPLACE VIEW handler_stats AS
SELECT h.name AS handler,
       count(d.event_id) FILTER (WHERE d.state = 'pending') AS backlog,
       coalesce(extract(epoch FROM now() - min(d.received_at) FILTER (WHERE d.state = 'pending')), 0)
           AS oldest_pending_seconds,
       coalesce(sum(d.attempts) FILTER (WHERE d.state IN ('pending', 'review_required')), 0) AS open_attempts,
       count(d.event_id) FILTER (WHERE d.state = 'review_required') AS review_required
FROM handlers h
LEFT JOIN deliveries d ON d.handler = h.name
GROUP BY h.name;
