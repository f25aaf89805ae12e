-- walpost inbox migration 0004: claims that cost the batch, not the backlog. Applied after
-- 0003_inbox_batches.sql, into the same schema (`walpost migrate --inbox` and `walpost inbox
-- --create-schema` apply the files in order, each in its own transaction).
--
-- Why: inbox.claim of an ordered handler walked the pending deliveries in arrival order and
-- asked of each "is an earlier message of this aggregate still open?" (NOT EXISTS). Every
-- message behind an open one was read and rejected, one index probe each, so a claim cost
-- the backlog ahead of the first heads: with the heads leased, in backoff or in review, a
-- claim read every pending delivery and returned nothing.
--
-- What it changes:
--   * Each aggregate's earliest open delivery of an ordered handler is its head
--     (deliveries.head = true; a message without an aggregate is a head by itself), and
--     only heads are in the index an ordered claim reads (deliveries_heads: (handler, seq)
--     of pending heads no worker holds). A claim reads the heads in arrival order and
--     returns the first it can lock: its cost is the rows it returns plus the heads
--     waiting for their backoff, never the messages queued behind them. The old check
--     stays, on the rows returned only (one probe each), so no message is ever leased
--     while an earlier one of its aggregate is open, whatever a head says.
--   * A plain handler's claim reads deliveries_ready: its pending deliveries no worker
--     holds. deliveries_due holds the leased ones too, and each claim read past every
--     message the other workers held, so sixteen workers completed fewer messages a
--     second than four.
--   * inbox.heads holds, per (ordered handler, aggregate with an open delivery), the seq
--     of its head. Its row is where the two writers of an aggregate meet: the ingest
--     (deliver_new_messages) upserts it for the aggregates of a batch, and complete,
--     complete_many and dismiss (advance_heads), closing a head, lock it, then look for
--     the next open delivery with a snapshot taken after the lock. Both take the rows in
--     (handler, aggregate) order, so they never deadlock; a message stored while its
--     aggregate's last open delivery completes is seen by one of the two and becomes the
--     head. The ingest's upsert always writes the row (not only when the seq moves), so a
--     worker's REPEATABLE READ transaction that could not see the new message fails with
--     a serialization error (and is retried) instead of leaving the aggregate headless.
--   * inbox.repair_heads(handler) rebuilds a handler's heads from its open deliveries:
--     run by this file, by register_handler when the handler's ordering or deliveries
--     change, and by walpost inbox's retention after it dropped a day with open
--     deliveries; run it by hand after deleting deliveries by hand.
--   * deliver_new_messages runs as the inbox's owner (SECURITY DEFINER), so an ingest
--     role apart from the owner needs no grant on the tables it now writes (inbox.heads);
--     a trigger function cannot be called by itself.
--
-- Unchanged: what a handler is offered (an ordered handler: the oldest open message of
-- each aggregate, in arrival order; a message in review_required holds its aggregate
-- back), leases that ran out taken back and charged as 0002 does, message_missing, lost
-- leases counted, and every function's security (SECURITY DEFINER with a fixed
-- search_path, authorised per handler, EXECUTE revoked from PUBLIC; CREATE OR REPLACE
-- keeps the grants made on them).
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
--        -f migrations/inbox/0002_inbox_hardening.sql \
--        -f migrations/inbox/0003_inbox_batches.sql \
--        -f migrations/inbox/0004_inbox_heads.sql               for teams with their own tool
-- Never edit this file once shipped: add a new numbered migration instead.

-- Nothing is created until search_path names the schema (see the header): a file run
-- with the default search_path would create the table and functions in public.
DO $walpost_schema$
BEGIN
    IF pg_catalog.current_schema() IS NULL OR pg_catalog.current_schema() LIKE 'pg\_%'
       OR pg_catalog.current_setting('search_path') !~ '^\s*("([^"]|"")+"|[^",\s]+)\s*,\s*pg_temp\s*$' THEN
        RAISE EXCEPTION 'the inbox migrations run with search_path = <inbox schema>, pg_temp, the schema created first (search_path is %)',
            pg_catalog.current_setting('search_path')
            USING HINT = 'walpost migrate --inbox sets it; with psql, run CREATE SCHEMA IF NOT EXISTS inbox; SET search_path = inbox, pg_temp; before the file (docs/inbox.md)';
    END IF;
END $walpost_schema$;

-- The column and the index only when absent: ALTER TABLE and CREATE INDEX lock their
-- table even when there is nothing to do, and a writing instance holds it.
DO $$
BEGIN
    IF NOT EXISTS (
        SELECT FROM pg_catalog.pg_attribute a
        WHERE a.attrelid = pg_catalog.to_regclass('deliveries') AND a.attname = 'head' AND NOT a.attisdropped) THEN
        ALTER TABLE deliveries ADD COLUMN head boolean NOT NULL DEFAULT false;
    END IF;
    -- What a claim reads, in arrival order: a plain handler's pending deliveries that no
    -- worker holds (deliveries_due also holds the leased ones, and every claim read past
    -- all the messages other workers held: more workers, slower claims); an ordered
    -- handler's pending heads that no worker holds (one row per aggregate at most,
    -- whatever its backlog).
    IF pg_catalog.to_regclass('deliveries_ready') IS NULL THEN
        CREATE INDEX deliveries_ready ON deliveries (handler, seq) WHERE state = 'pending' AND lease_until IS NULL;
    END IF;
    IF pg_catalog.to_regclass('deliveries_heads') IS NULL THEN
        CREATE INDEX deliveries_heads ON deliveries (handler, seq)
            WHERE state = 'pending' AND head AND lease_until IS NULL;
    END IF;
END $$;

-- One row per (ordered handler, aggregate with an open delivery): the seq of its earliest
-- open delivery. Not partitioned: it holds one row per aggregate, not per message, and
-- retention's dropped days are repaired (repair_heads), not dropped with it.
CREATE TABLE IF NOT EXISTS heads (
    handler      text NOT NULL REFERENCES handlers (name) ON DELETE CASCADE,
    aggregate_id text NOT NULL,         -- aggregate_key() of the messages' aggregate id
    seq          bigint NOT NULL,
    PRIMARY KEY (handler, aggregate_id)
);

-- After deliveries of p_handler of the aggregates p_aggregates closed (done or
-- dismissed), each of those aggregates' earliest open delivery becomes its head, or the
-- aggregate's heads row goes when none is open. For the SQL API's functions only, which
-- hold the closed rows' locks.
CREATE OR REPLACE FUNCTION advance_heads(p_handler text, p_aggregates text[]) RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
-- One plan for every call: the same index lookups whatever the handler and aggregates
-- (planning each call cost more than running it: 0.77 ms a complete of an ordered
-- handler's message against 0.45 ms).
SET plan_cache_mode = force_generic_plan AS $$
BEGIN
    -- The rows first, in the order the ingest takes them (no deadlock): a batch being
    -- stored for one of these aggregates commits before the next statement's snapshot,
    -- or waits until this transaction is over and then sees the head it left.
    PERFORM FROM heads x
    WHERE x.handler = p_handler AND x.aggregate_id = ANY (p_aggregates)
    ORDER BY x.aggregate_id
    FOR UPDATE;
    WITH successor AS (
        SELECT a.aggregate_id,
               (SELECT d.seq FROM deliveries d
                WHERE d.handler = p_handler AND d.aggregate_id = a.aggregate_id
                  AND d.state NOT IN ('done', 'dismissed')
                ORDER BY d.seq LIMIT 1) AS seq
        FROM (SELECT DISTINCT u.aggregate_id FROM pg_catalog.unnest(p_aggregates) AS u (aggregate_id)
              WHERE u.aggregate_id IS NOT NULL) a
    ), gone AS (
        DELETE FROM heads x USING successor n
        WHERE x.handler = p_handler AND x.aggregate_id = n.aggregate_id AND n.seq IS NULL
    ), moved AS (
        INSERT INTO heads AS x (handler, aggregate_id, seq)
        SELECT p_handler, n.aggregate_id, n.seq FROM successor n WHERE n.seq IS NOT NULL ORDER BY n.aggregate_id
        ON CONFLICT (handler, aggregate_id) DO UPDATE SET seq = excluded.seq
    )
    UPDATE deliveries d SET head = true
    FROM successor n
    WHERE d.handler = p_handler AND d.aggregate_id = n.aggregate_id AND d.seq = n.seq
      AND d.state NOT IN ('done', 'dismissed') AND NOT d.head;
END $$;

-- Rebuilds the heads of handler p_handler from its open deliveries (the inbox's owner
-- only): every aggregate's earliest open delivery is its head, nothing else is; an
-- unordered handler has none. Reads all of the handler's open deliveries: for this file,
-- register_handler, retention after a forced drop, and deliveries deleted by hand.
CREATE OR REPLACE FUNCTION repair_heads(p_handler text) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER
SET search_path FROM CURRENT AS $$
DECLARE
    is_ordered boolean;
BEGIN
    PERFORM authorize_owner('inbox.repair_heads');
    SELECT h.ordered INTO is_ordered FROM handlers h WHERE h.name = p_handler;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'inbox handler "%" is not registered: call inbox.register_handler first', p_handler
            USING ERRCODE = 'no_data_found';
    END IF;
    -- The handler's rows, in the order the ingest and advance_heads take them.
    PERFORM FROM heads x WHERE x.handler = p_handler ORDER BY x.aggregate_id FOR UPDATE;
    IF NOT is_ordered THEN
        DELETE FROM heads x WHERE x.handler = p_handler;
        UPDATE deliveries d SET head = false
        WHERE d.handler = p_handler AND d.head AND d.state NOT IN ('done', 'dismissed');
        RETURN;
    END IF;
    WITH firsts AS (
        SELECT d.aggregate_id, pg_catalog.min(d.seq) AS seq
        FROM deliveries d
        WHERE d.handler = p_handler AND d.aggregate_id IS NOT NULL AND d.state NOT IN ('done', 'dismissed')
        GROUP BY d.aggregate_id
    ), gone AS (
        DELETE FROM heads x
        WHERE x.handler = p_handler AND NOT EXISTS (SELECT FROM firsts f WHERE f.aggregate_id = x.aggregate_id)
    )
    INSERT INTO heads AS x (handler, aggregate_id, seq)
    SELECT p_handler, f.aggregate_id, f.seq FROM firsts f ORDER BY f.aggregate_id
    ON CONFLICT (handler, aggregate_id) DO UPDATE SET seq = excluded.seq WHERE x.seq <> excluded.seq;
    -- The flags, where they differ (a new statement: it sees the rows just written).
    UPDATE deliveries d SET head = NOT d.head
    WHERE d.handler = p_handler AND d.state NOT IN ('done', 'dismissed')
      AND d.head <> (d.aggregate_id IS NULL OR coalesce(
            d.seq = (SELECT x.seq FROM heads x WHERE x.handler = p_handler AND x.aggregate_id = d.aggregate_id),
            false));
END $$;

-- New messages become deliveries of every handler they match (one statement per batch),
-- as 0002 makes them; an ordered handler's delivery is also the head of its aggregate
-- when the aggregate has no open delivery yet (the batch's first of it).
CREATE OR REPLACE FUNCTION deliver_new_messages() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path FROM CURRENT
-- As in 0002: a batch's messages times the handlers, each looked up on the deliveries'
-- primary key, planned for each batch; no merge or hash join (the transition table has
-- no statistics), no JIT.
SET enable_mergejoin = off
SET enable_hashjoin = off
SET jit = off AS $$
DECLARE
    ordered_handlers text[] := ARRAY(SELECT h.name FROM handlers h WHERE h.ordered ORDER BY h.name);
    head_handlers text[];
    head_aggregates text[];
    head_seqs bigint[];
BEGIN
    EXECUTE '
    UPDATE deliveries d
    SET received_at = m.received_at, state = ''pending'', last_error_code = NULL, next_attempt_at = pg_catalog.now()
    FROM new_messages m
    WHERE d.last_error_code = ''message_missing'' AND d.state = ''review_required''
      AND d.event_id = m.event_id AND d.topic = m.topic';
    IF pg_catalog.cardinality(ordered_handlers) = 0 THEN
        EXECUTE '
        INSERT INTO deliveries (handler, event_id, topic, received_at, seq, aggregate_id)
        SELECT h.name, m.event_id, m.topic, m.received_at, m.seq, aggregate_key(m.aggregate_id)
        FROM new_messages m
        JOIN handlers h
          ON (pg_catalog.cardinality(h.topics) = 0 OR m.topic = ANY (h.topics))
         AND (pg_catalog.cardinality(h.event_types) = 0 OR m.event_type = ANY (h.event_types))
        WHERE (SELECT 1 FROM deliveries d
               WHERE d.handler = h.name AND d.event_id = m.event_id AND d.topic = m.topic LIMIT 1) IS NULL
        ON CONFLICT DO NOTHING';
        RETURN NULL;
    END IF;
    -- The deliveries, then the heads rows of the ordered handlers' aggregates among them,
    -- in (handler, aggregate) order (advance_heads takes them in the same order). A row
    -- that exists keeps the smaller seq: the aggregate's head is an older open delivery,
    -- or one of this batch when the aggregate had none (or an older one just closed: the
    -- upsert waits for that transaction, then inserts).
    EXECUTE '
    WITH made AS (
        INSERT INTO deliveries (handler, event_id, topic, received_at, seq, aggregate_id, head)
        SELECT h.name, m.event_id, m.topic, m.received_at, m.seq, aggregate_key(m.aggregate_id),
               h.ordered AND m.aggregate_id IS NULL
        FROM new_messages m
        JOIN handlers h
          ON (pg_catalog.cardinality(h.topics) = 0 OR m.topic = ANY (h.topics))
         AND (pg_catalog.cardinality(h.event_types) = 0 OR m.event_type = ANY (h.event_types))
        WHERE (SELECT 1 FROM deliveries d
               WHERE d.handler = h.name AND d.event_id = m.event_id AND d.topic = m.topic LIMIT 1) IS NULL
        ON CONFLICT DO NOTHING
        RETURNING handler, aggregate_id, seq
    ), firsts AS (
        INSERT INTO heads AS x (handler, aggregate_id, seq)
        SELECT f.handler, f.aggregate_id, pg_catalog.min(f.seq)
        FROM made f
        WHERE f.aggregate_id IS NOT NULL AND f.handler = ANY ($1)
        GROUP BY f.handler, f.aggregate_id
        ORDER BY f.handler, f.aggregate_id
        ON CONFLICT (handler, aggregate_id) DO UPDATE SET seq = LEAST(x.seq, excluded.seq)
        RETURNING x.handler, x.aggregate_id, x.seq
    )
    SELECT pg_catalog.array_agg(f.handler), pg_catalog.array_agg(f.aggregate_id), pg_catalog.array_agg(f.seq)
    FROM firsts f
    WHERE f.seq >= (SELECT pg_catalog.min(m.seq) FROM new_messages m)'
    INTO head_handlers, head_aggregates, head_seqs
    USING ordered_handlers;
    -- The new heads (a head older than the batch is flagged already).
    IF head_handlers IS NOT NULL THEN
        EXECUTE '
        UPDATE deliveries d SET head = true
        FROM ROWS FROM (pg_catalog.unnest($1), pg_catalog.unnest($2), pg_catalog.unnest($3)) AS f (handler, aggregate_id, seq)
        WHERE d.handler = f.handler AND d.aggregate_id = f.aggregate_id AND d.seq = f.seq
          AND d.state NOT IN (''done'', ''dismissed'') AND NOT d.head'
        USING head_handlers, head_aggregates, head_seqs;
    END IF;
    RETURN NULL;
END $$;

-- Registers a handler or changes its settings (the inbox's owner only), as 0002 does; when
-- its ordering changed or messages stored before became its deliveries, its heads are
-- rebuilt.
CREATE OR REPLACE FUNCTION register_handler(
    p_name text, p_topics text[], p_event_types text[], p_max_attempts integer,
    p_backoff_base interval, p_backoff_max interval, p_ordered boolean
) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER
SET search_path FROM CURRENT AS $$
DECLARE
    was_ordered boolean;
    made bigint;
BEGIN
    PERFORM authorize_owner('inbox.register_handler');
    IF p_max_attempts IS NULL OR p_max_attempts < 1 OR p_max_attempts > 1000 THEN
        RAISE EXCEPTION 'inbox.register_handler: max_attempts must be between 1 and 1000'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT h.ordered INTO was_ordered FROM handlers h WHERE h.name = p_name;
    INSERT INTO handlers AS h (name, topics, event_types, max_attempts, backoff_base, backoff_max, ordered)
    VALUES (p_name, coalesce(p_topics, '{}'), coalesce(p_event_types, '{}'), p_max_attempts,
            p_backoff_base, p_backoff_max, p_ordered)
    ON CONFLICT (name) DO UPDATE SET
        topics = EXCLUDED.topics, event_types = EXCLUDED.event_types, max_attempts = EXCLUDED.max_attempts,
        backoff_base = EXCLUDED.backoff_base, backoff_max = EXCLUDED.backoff_max, ordered = EXCLUDED.ordered;
    INSERT INTO deliveries (handler, event_id, topic, received_at, seq, aggregate_id)
    SELECT h.name, m.event_id, m.topic, m.received_at, m.seq, aggregate_key(m.aggregate_id)
    FROM handlers h
    JOIN messages m
      ON (pg_catalog.cardinality(h.topics) = 0 OR m.topic = ANY (h.topics))
     AND (pg_catalog.cardinality(h.event_types) = 0 OR m.event_type = ANY (h.event_types))
    WHERE h.name = p_name
      AND NOT EXISTS (SELECT FROM deliveries d
                      WHERE d.handler = p_name AND d.event_id = m.event_id AND d.topic = m.topic)
    ON CONFLICT DO NOTHING;
    GET DIAGNOSTICS made = ROW_COUNT;
    IF made > 0 OR was_ordered IS DISTINCT FROM coalesce(p_ordered, false) THEN
        PERFORM repair_heads(p_name);
    END IF;
END $$;

-- Leases up to p_max_rows due messages to the caller, oldest first; workers share the
-- work (SKIP LOCKED). First takes back the leases that ran out, as 0002 does. An ordered
-- handler's candidates are its aggregates' heads no worker holds (deliveries_heads), each
-- checked once more for an earlier open delivery; a plain handler's, its pending
-- deliveries no worker holds (deliveries_ready). Either way a claim reads the rows it
-- returns and the ones that wait for their backoff, not the backlog behind them.
CREATE OR REPLACE FUNCTION claim(p_handler text, p_max_rows integer, p_lease interval)
RETURNS TABLE (event_id text, lease_token uuid, topic text, key bytea, headers jsonb, payload bytea, attempts integer)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path FROM CURRENT AS $$
#variable_conflict use_column
DECLARE
    h handlers;
    lost bigint;
BEGIN
    PERFORM authorize(p_handler, 'inbox.claim');
    SELECT * INTO h FROM handlers WHERE name = p_handler;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'inbox handler "%" is not registered: call inbox.register_handler first', p_handler
            USING ERRCODE = 'no_data_found';
    END IF;
    IF p_max_rows IS NULL OR p_max_rows < 1 OR p_lease IS NULL OR p_lease <= interval '0' THEN
        RAISE EXCEPTION 'inbox.claim needs max_rows >= 1 and a positive lease'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- Leases that ran out without complete or fail: their worker died or stalled.
    WITH ran_out AS (
        SELECT d.event_id, d.topic, d.received_at
        FROM deliveries d
        WHERE d.handler = p_handler AND d.state = 'pending' AND d.lease_until < pg_catalog.now()
        FOR UPDATE OF d SKIP LOCKED
    ), taken_back AS (
        UPDATE deliveries d
        SET lease_token = NULL, lease_until = NULL, isolated = true, lease_rows = NULL,
            attempts = d.attempts + CASE WHEN d.lease_rows = 1 THEN 1 ELSE 0 END,
            last_error_code = CASE WHEN d.lease_rows = 1 THEN 'lease_expired' ELSE d.last_error_code END,
            state = CASE WHEN d.lease_rows = 1 AND d.attempts + 1 >= h.max_attempts
                         THEN 'review_required' ELSE 'pending' END
        FROM ran_out r
        WHERE d.handler = p_handler AND d.event_id = r.event_id AND d.topic = r.topic
          AND d.received_at = r.received_at
        RETURNING 1
    )
    SELECT count(*) INTO lost FROM taken_back;
    IF lost > 0 THEN
        UPDATE handlers SET leases_lost = leases_lost + lost WHERE name = p_handler;
    END IF;
    RETURN QUERY
    WITH plain AS (
        -- A plain handler's: its pending deliveries in arrival order (deliveries_ready).
        SELECT d.handler, d.event_id, d.topic, d.received_at, d.seq, d.isolated
        FROM deliveries d
        WHERE NOT h.ordered
          AND d.handler = p_handler
          AND d.state = 'pending'
          AND d.next_attempt_at <= pg_catalog.now()
          AND d.lease_until IS NULL
        ORDER BY d.seq
        LIMIT p_max_rows
        FOR UPDATE OF d SKIP LOCKED
    ), firsts AS (
        -- An ordered handler's: its aggregates' heads in arrival order (deliveries_heads),
        -- none with an earlier open delivery of its aggregate (one probe per row).
        SELECT d.handler, d.event_id, d.topic, d.received_at, d.seq, d.isolated
        FROM deliveries d
        WHERE h.ordered
          AND d.handler = p_handler
          AND d.state = 'pending'
          AND d.head
          AND d.next_attempt_at <= pg_catalog.now()
          AND d.lease_until IS NULL
          AND (d.aggregate_id IS NULL OR NOT EXISTS (
                SELECT FROM deliveries e
                WHERE e.handler = d.handler AND e.aggregate_id = d.aggregate_id
                  AND e.seq < d.seq AND e.state NOT IN ('done', 'dismissed')))
        ORDER BY d.seq
        LIMIT p_max_rows
        FOR UPDATE OF d SKIP LOCKED
    ), candidates AS (
        SELECT c.*,
               -- Where its message is: the same row, or the one stored again after it was
               -- deleted (NULL: gone).
               (SELECT pg_catalog.max(m.received_at) FROM messages m
                WHERE m.event_id = c.event_id AND m.topic = c.topic) AS message_at
        FROM (SELECT * FROM plain UNION ALL SELECT * FROM firsts) c
    ), checked AS (
        SELECT c.*, c.message_at IS NOT NULL AS stored FROM candidates c
    ), picked AS (
        -- A message whose earlier lease ran out in a larger claim goes alone.
        SELECT c.* FROM checked c
        WHERE NOT EXISTS (SELECT FROM checked i WHERE i.isolated AND i.stored)
           OR c.seq = (SELECT pg_catalog.min(i.seq) FROM checked i WHERE i.isolated AND i.stored)
           OR NOT c.stored
    ), leased AS (
        UPDATE deliveries d
        SET received_at = coalesce(p.message_at, d.received_at),
            lease_token = CASE WHEN p.stored THEN pg_catalog.gen_random_uuid() END,
            lease_until = CASE WHEN p.stored THEN pg_catalog.now() + p_lease END,
            lease_rows = CASE WHEN p.stored THEN (SELECT count(*) FROM picked q WHERE q.stored)::integer END,
            state = CASE WHEN p.stored THEN d.state ELSE 'review_required' END,
            last_error_code = CASE WHEN p.stored THEN d.last_error_code ELSE 'message_missing' END
        FROM picked p
        WHERE d.handler = p.handler AND d.event_id = p.event_id AND d.topic = p.topic
          AND d.received_at = p.received_at
        RETURNING d.event_id, d.topic, d.received_at, d.lease_token, d.attempts, d.seq, p.stored
    )
    SELECT l.event_id, l.lease_token, m.topic, m.key, m.headers, m.payload, l.attempts
    FROM leased l
    JOIN messages m ON m.event_id = l.event_id AND m.topic = l.topic AND m.received_at = l.received_at
    WHERE l.stored
    ORDER BY l.seq;
END $$;

-- The handler acted on the message: writes its receipt and returns true, or returns false
-- and writes nothing when p_lease_token is no longer the message's, as 0002 does; a head
-- that completes hands its aggregate on to the next open delivery.
CREATE OR REPLACE FUNCTION complete(p_handler text, p_event_id text, p_lease_token uuid)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER
SET search_path FROM CURRENT AS $$
DECLARE
    day timestamptz;
    source text;
    was_head boolean;
    agg_key text;
BEGIN
    PERFORM authorize(p_handler, 'inbox.complete');
    UPDATE deliveries
    SET state = 'done', lease_token = NULL, lease_until = NULL, lease_rows = NULL
    WHERE handler = p_handler AND event_id = p_event_id AND lease_token = p_lease_token AND state = 'pending'
    RETURNING received_at, topic, head, aggregate_id INTO day, source, was_head, agg_key;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    INSERT INTO receipts (handler, event_id, topic, received_at) VALUES (p_handler, p_event_id, source, day);
    IF was_head AND agg_key IS NOT NULL THEN
        PERFORM advance_heads(p_handler, ARRAY[agg_key]);
    END IF;
    RETURN true;
END $$;

-- A batch's receipts, as 0003 writes them; the heads among them hand their aggregates on
-- (one advance_heads call for the batch).
CREATE OR REPLACE FUNCTION complete_many(p_handler text, p_event_ids text[], p_lease_tokens uuid[])
RETURNS text[]
LANGUAGE plpgsql SECURITY DEFINER
SET search_path FROM CURRENT AS $$
DECLARE
    written text[];
    closed text[];
BEGIN
    PERFORM authorize(p_handler, 'inbox.complete_many');
    p_event_ids := coalesce(p_event_ids, '{}');
    p_lease_tokens := coalesce(p_lease_tokens, '{}');
    PERFORM check_batch('inbox.complete_many', p_event_ids, p_lease_tokens, NULL);
    WITH batch AS (
        -- The first of each (event id, lease token): a second inbox.complete with the
        -- same token finds the delivery done.
        SELECT DISTINCT ON (b.event_id, b.lease_token) b.event_id, b.lease_token, b.ord
        FROM ROWS FROM (pg_catalog.unnest(p_event_ids), pg_catalog.unnest(p_lease_tokens))
             WITH ORDINALITY AS b (event_id, lease_token, ord)
        ORDER BY b.event_id, b.lease_token, b.ord
    ), done AS (
        UPDATE deliveries d
        SET state = 'done', lease_token = NULL, lease_until = NULL, lease_rows = NULL
        FROM batch b
        WHERE d.handler = p_handler AND d.event_id = b.event_id AND d.lease_token = b.lease_token
          AND d.state = 'pending'
        RETURNING b.ord, d.event_id, d.topic, d.received_at, d.head, d.aggregate_id
    ), receipted AS (
        INSERT INTO receipts (handler, event_id, topic, received_at)
        SELECT p_handler, done.event_id, done.topic, done.received_at FROM done
        RETURNING 1
    )
    SELECT pg_catalog.array_agg(done.event_id ORDER BY done.ord),
           pg_catalog.array_agg(done.aggregate_id) FILTER (WHERE done.head AND done.aggregate_id IS NOT NULL)
    INTO written, closed
    FROM done;
    IF closed IS NOT NULL THEN
        PERFORM advance_heads(p_handler, closed);
    END IF;
    RETURN coalesce(written, '{}');
END $$;

-- Closes a message in review_required or pending without a receipt, as 0002 does; a head
-- dismissed hands its aggregate on.
CREATE OR REPLACE FUNCTION dismiss(p_handler text, p_event_id text)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER
SET search_path FROM CURRENT AS $$
DECLARE
    closed bigint;
    aggregates text[];
BEGIN
    PERFORM authorize(p_handler, 'inbox.dismiss');
    -- Every topic's message of that id, as 0002 closes them.
    WITH dismissed AS (
        UPDATE deliveries
        SET state = 'dismissed', lease_token = NULL, lease_until = NULL, lease_rows = NULL
        WHERE handler = p_handler AND event_id = p_event_id AND state IN ('review_required', 'pending')
        RETURNING head, aggregate_id
    )
    SELECT pg_catalog.count(*), pg_catalog.array_agg(aggregate_id) FILTER (WHERE head AND aggregate_id IS NOT NULL)
    INTO closed, aggregates
    FROM dismissed;
    IF aggregates IS NOT NULL THEN
        PERFORM advance_heads(p_handler, aggregates);
    END IF;
    RETURN closed > 0;
END $$;

-- The heads of the ordered handlers registered before this file.
DO $$
DECLARE
    handler_name text;
BEGIN
    FOR handler_name IN SELECT h.name FROM handlers h WHERE h.ordered ORDER BY h.name LOOP
        PERFORM repair_heads(handler_name);
    END LOOP;
END $$;

-- advance_heads is for the SQL API's functions only; repair_heads is the owner's (it
-- checks). The functions replaced keep their grants.
REVOKE ALL ON FUNCTION advance_heads(text, text[]), repair_heads(text) FROM PUBLIC;
