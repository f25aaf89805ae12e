-- walpost inbox migration 0005: what an operator does to a handler, in SQL. Applied after
-- 0004_inbox_heads.sql, into the same schema (`walpost migrate --inbox` and `walpost inbox
-- --create-schema` apply the files in order, each in its own transaction).
--
-- Why: beyond the happy path a handler's operator typed one call per message
-- (inbox.retry, inbox.dismiss) and stopped every worker to stop a handler. These are the
-- calls the admin API (and anyone with psql) makes instead, so an endpoint is one
-- statement:
--   inbox.pause_handler(handler) / inbox.resume_handler(handler) -> boolean
--       a paused handler's claim returns no rows and changes nothing (stored in
--       inbox.handlers, so every worker sees it at its next claim; leases held when it
--       was paused still complete or fail). false: no such handler;
--   inbox.retry_many(handler, event_ids text[]), inbox.retry_by_error(handler, error_code)
--   inbox.dismiss_many(handler, event_ids text[]), inbox.dismiss_by_error(handler, error_code)
--       -> bigint, the deliveries changed: what inbox.retry / inbox.dismiss do, for the
--       messages in review_required among the ids given, or with that last error code;
--   inbox.review_groups(handler) -> one row per error code of the review queue: count,
--       first and last arrival, a sample of at most 10 event ids;
--   inbox.review_messages(handler, error_code DEFAULT NULL, max_rows DEFAULT 100) -> the
--       messages in review_required (event id, topic, partition, offset, event type,
--       attempts, last error code, arrival), never the payload;
--   inbox.handler_overview (a view): per handler, backlog, oldest pending age, leased,
--       review_required, attempts, paused and lost leases, read from its open deliveries
--       only (inbox.handler_stats stays as it is);
--   inbox.admin_audit: one row per action of the admin API (who, what, on what, result).
--
-- Invariants:
--   * the bulk calls act on the review queue only (state review_required): unlike
--     inbox.dismiss, dismiss_many never closes a pending message, so a call by error code
--     cannot close what a worker is handling. Each element does what the single call does
--     to it: retry back to pending, due now, attempts reset, error code cleared (an
--     ordered handler's head stays its aggregate's head: it is still open); dismiss closed
--     without a receipt, and a head dismissed hands its aggregate on (advance_heads, as
--     inbox.dismiss does), so a later message of the aggregate is claimable exactly when
--     nothing earlier is open. Rows are locked in arrival order (two bulk calls never
--     deadlock on each other);
--   * bounded input: at most 10,000 event ids a call (one transaction's worth of an
--     operator's selection), no NULL element; review_messages returns at most 10,000
--     rows. A refused call writes nothing;
--   * error codes are matched as given and checked to be short codes (inbox.fail's rule:
--     a sentence is refused, never quoted back);
--   * the same security as the other calls: SECURITY DEFINER with a fixed search_path,
--     the caller's login role authorised for the handler (inbox.authorize) before
--     anything is read, EXECUTE revoked from PUBLIC; the reads never return a payload.
--     Nothing is granted by this file: docs/inbox.md ("Roles and grants") has the grants;
--   * register_handler leaves paused as it is: registering again never resumes.
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
--        -f migrations/inbox/0004_inbox_heads.sql \
--        -f migrations/inbox/0005_inbox_control.sql             for teams with their own tool
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
        WHERE a.attrelid = pg_catalog.to_regclass('handlers') AND a.attname = 'paused' AND NOT a.attisdropped) THEN
        ALTER TABLE handlers ADD COLUMN paused boolean NOT NULL DEFAULT false;
    END IF;
    -- The review queue by handler and error code, in arrival order: what the groups,
    -- the listing and the calls by error code read (the queue is small; the handler's
    -- finished deliveries are not).
    IF pg_catalog.to_regclass('deliveries_review') IS NULL THEN
        CREATE INDEX deliveries_review ON deliveries (handler, last_error_code, seq)
            WHERE state = 'review_required';
    END IF;
END $$;

-- What the admin API did: one row per action (a read is not an action), written by the
-- API beside its log line. Never a token, a payload or a message's content: the token's
-- NAME from the tokens file, its role (viewer, operator), the action (pause, retry, ...),
-- its target (a handler, a selection) and the result (a count, refused and why).
CREATE TABLE IF NOT EXISTS admin_audit (
    at         timestamptz NOT NULL DEFAULT pg_catalog.now(),
    token_name text NOT NULL,
    role       text NOT NULL,
    action     text NOT NULL,
    target     text,
    result     text NOT NULL
);
DO $$
BEGIN
    IF pg_catalog.to_regclass('admin_audit_at') IS NULL THEN
        CREATE INDEX admin_audit_at ON admin_audit (at);
    END IF;
END $$;

-- Pauses handler p_handler: its claims return nothing until resume_handler. Returns false
-- when there is no such handler.
CREATE OR REPLACE FUNCTION pause_handler(p_handler text) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER
SET search_path FROM CURRENT AS $$
BEGIN
    PERFORM authorize(p_handler, 'inbox.pause_handler');
    UPDATE handlers SET paused = true WHERE name = p_handler;
    RETURN FOUND;
END $$;

-- Resumes handler p_handler: its next claim offers its due messages again. Returns false
-- when there is no such handler.
CREATE OR REPLACE FUNCTION resume_handler(p_handler text) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER
SET search_path FROM CURRENT AS $$
BEGIN
    PERFORM authorize(p_handler, 'inbox.resume_handler');
    UPDATE handlers SET paused = false WHERE name = p_handler;
    RETURN FOUND;
END $$;

-- Leases up to p_max_rows due messages to the caller, as 0004 does; a paused handler's
-- claim returns no rows and changes nothing (not even the leases that ran out: they are
-- taken back by the first claim after resume_handler).
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
    IF h.paused THEN
        RETURN;
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

-- Raises unless p_event_ids (a NULL array made empty by the caller) is usable: one
-- dimension, at most 10,000 elements (an operator's selection is one transaction: a bound
-- keeps one call from locking a whole inbox), no NULL element. Positions are counted from
-- 1; values are never quoted.
CREATE OR REPLACE FUNCTION check_event_ids(p_action text, p_event_ids text[]) RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT AS $$
DECLARE
    n integer := pg_catalog.cardinality(p_event_ids);
    bad bigint;
BEGIN
    IF pg_catalog.array_ndims(p_event_ids) > 1 THEN
        RAISE EXCEPTION '%: event_ids is a one-dimensional array', p_action USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF n > 10000 THEN
        RAISE EXCEPTION '%: at most 10000 event ids a call (event_ids has %)', p_action, n
            USING ERRCODE = 'program_limit_exceeded', HINT = 'split the selection, or select by error code';
    END IF;
    SELECT u.ord INTO bad FROM pg_catalog.unnest(p_event_ids) WITH ORDINALITY AS u (v, ord)
    WHERE u.v IS NULL ORDER BY u.ord LIMIT 1;
    IF bad IS NOT NULL THEN
        RAISE EXCEPTION '%: event_ids[%] is NULL', p_action, bad USING ERRCODE = 'null_value_not_allowed';
    END IF;
END $$;

-- Raises unless p_error_code is a short code, as inbox.fail writes them (never quoted:
-- a refused one may be message text).
CREATE OR REPLACE FUNCTION check_error_code(p_action text, p_error_code text) RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path FROM CURRENT AS $$
BEGIN
    IF p_error_code IS NULL OR p_error_code !~ '^[A-Za-z0-9_.:-]{1,64}$' THEN
        RAISE EXCEPTION '%: an error code is a short code (letters, digits, _ . : -, at most 64 characters)', p_action
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
END $$;

-- The deliveries of handler p_handler in review_required that a bulk call selected:
-- those of p_event_ids when p_error_code is NULL, else those whose last error code is
-- p_error_code; locked, in arrival order (two calls over the same rows queue up instead
-- of deadlocking). One statement per kind of selection, so each is planned on its own
-- index: the deliveries' key for ids (the review queue is not read), deliveries_review
-- for an error code. For retry_selected and dismiss_selected only.
CREATE OR REPLACE FUNCTION review_selection(p_handler text, p_event_ids text[], p_error_code text)
RETURNS TABLE (event_id text, topic text, received_at timestamptz)
LANGUAGE plpgsql
SET search_path FROM CURRENT AS $$
#variable_conflict use_column
BEGIN
    IF p_error_code IS NULL THEN
        RETURN QUERY
        SELECT d.event_id, d.topic, d.received_at
        FROM deliveries d
        WHERE d.handler = p_handler AND d.event_id = ANY (p_event_ids) AND d.state = 'review_required'
        ORDER BY d.seq
        FOR UPDATE OF d;
    ELSE
        RETURN QUERY
        SELECT d.event_id, d.topic, d.received_at
        FROM deliveries d
        WHERE d.handler = p_handler AND d.last_error_code = p_error_code AND d.state = 'review_required'
        ORDER BY d.seq
        FOR UPDATE OF d;
    END IF;
END $$;

-- The selected messages (review_selection) go back to pending as inbox.retry sends them.
-- Returns the deliveries changed. For the four calls below (which authorise and check
-- first).
CREATE OR REPLACE FUNCTION retry_selected(p_handler text, p_event_ids text[], p_error_code text)
RETURNS bigint
LANGUAGE plpgsql
SET search_path FROM CURRENT
-- Each selected row updated through the deliveries' key: a hash join (the function's
-- rows are not known to the planner) read the handler's whole review queue to retry 3.
SET enable_hashjoin = off
SET enable_mergejoin = off AS $$
DECLARE
    changed bigint;
BEGIN
    WITH selected AS (
        SELECT * FROM review_selection(p_handler, p_event_ids, p_error_code)
    ), retried AS (
        UPDATE deliveries d
        SET state = 'pending', attempts = 0, next_attempt_at = pg_catalog.now(), last_error_code = NULL
        FROM selected s
        WHERE d.handler = p_handler AND d.event_id = s.event_id AND d.topic = s.topic
          AND d.received_at = s.received_at AND d.state = 'review_required'
        RETURNING 1
    )
    SELECT pg_catalog.count(*) INTO changed FROM retried;
    RETURN changed;
END $$;

-- As retry_selected, closing the messages without a receipt as inbox.dismiss does; the
-- heads among them hand their aggregates on (one advance_heads call).
CREATE OR REPLACE FUNCTION dismiss_selected(p_handler text, p_event_ids text[], p_error_code text)
RETURNS bigint
LANGUAGE plpgsql
SET search_path FROM CURRENT
-- As in retry_selected: through the deliveries' key, not a join over the review queue.
SET enable_hashjoin = off
SET enable_mergejoin = off AS $$
DECLARE
    closed bigint;
    aggregates text[];
BEGIN
    WITH selected AS (
        SELECT * FROM review_selection(p_handler, p_event_ids, p_error_code)
    ), dismissed AS (
        UPDATE deliveries d
        SET state = 'dismissed', lease_token = NULL, lease_until = NULL, lease_rows = NULL
        FROM selected s
        WHERE d.handler = p_handler AND d.event_id = s.event_id AND d.topic = s.topic
          AND d.received_at = s.received_at AND d.state = 'review_required'
        RETURNING d.head, d.aggregate_id
    )
    SELECT pg_catalog.count(*),
           pg_catalog.array_agg(DISTINCT x.aggregate_id) FILTER (WHERE x.head AND x.aggregate_id IS NOT NULL)
    INTO closed, aggregates
    FROM dismissed x;
    IF aggregates IS NOT NULL THEN
        PERFORM advance_heads(p_handler, aggregates);
    END IF;
    RETURN closed;
END $$;

-- inbox.retry for each of p_event_ids (every topic's delivery of each) that is in
-- review_required. Returns the deliveries changed.
CREATE OR REPLACE FUNCTION retry_many(p_handler text, p_event_ids text[]) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER
SET search_path FROM CURRENT AS $$
BEGIN
    PERFORM authorize(p_handler, 'inbox.retry_many');
    p_event_ids := coalesce(p_event_ids, '{}');
    PERFORM check_event_ids('inbox.retry_many', p_event_ids);
    RETURN retry_selected(p_handler, p_event_ids, NULL);
END $$;

-- inbox.retry for every message in review_required whose last error code is
-- p_error_code. Returns the deliveries changed.
CREATE OR REPLACE FUNCTION retry_by_error(p_handler text, p_error_code text) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER
SET search_path FROM CURRENT AS $$
BEGIN
    PERFORM authorize(p_handler, 'inbox.retry_by_error');
    PERFORM check_error_code('inbox.retry_by_error', p_error_code);
    RETURN retry_selected(p_handler, NULL, p_error_code);
END $$;

-- inbox.dismiss for each of p_event_ids that is in review_required (a pending one is
-- left as it is). Returns the deliveries changed.
CREATE OR REPLACE FUNCTION dismiss_many(p_handler text, p_event_ids text[]) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER
SET search_path FROM CURRENT AS $$
BEGIN
    PERFORM authorize(p_handler, 'inbox.dismiss_many');
    p_event_ids := coalesce(p_event_ids, '{}');
    PERFORM check_event_ids('inbox.dismiss_many', p_event_ids);
    RETURN dismiss_selected(p_handler, p_event_ids, NULL);
END $$;

-- inbox.dismiss for every message in review_required whose last error code is
-- p_error_code. Returns the deliveries changed.
CREATE OR REPLACE FUNCTION dismiss_by_error(p_handler text, p_error_code text) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER
SET search_path FROM CURRENT AS $$
BEGIN
    PERFORM authorize(p_handler, 'inbox.dismiss_by_error');
    PERFORM check_error_code('inbox.dismiss_by_error', p_error_code);
    RETURN dismiss_selected(p_handler, NULL, p_error_code);
END $$;

-- The review queue of handler p_handler, one row per last error code, largest first:
-- how many deliveries, the arrival of the oldest and the newest message, and the event
-- ids of the (at most) 10 oldest (read in order from deliveries_review; a message in
-- review always has an error code: fail needs one, and claim names why it set one aside).
CREATE OR REPLACE FUNCTION review_groups(p_handler text)
RETURNS TABLE (error_code text, count bigint, first_at timestamptz, last_at timestamptz, sample_event_ids text[])
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path FROM CURRENT AS $$
#variable_conflict use_column
BEGIN
    PERFORM authorize(p_handler, 'inbox.review_groups');
    RETURN QUERY
    SELECT g.code, g.n, g.first_at, g.last_at,
           ARRAY(SELECT s.event_id FROM deliveries s
                 WHERE s.handler = p_handler AND s.state = 'review_required'
                   AND s.last_error_code = g.code
                 ORDER BY s.seq LIMIT 10)
    FROM (SELECT d.last_error_code AS code, pg_catalog.count(*) AS n,
                 pg_catalog.min(d.received_at) AS first_at, pg_catalog.max(d.received_at) AS last_at
          FROM deliveries d
          WHERE d.handler = p_handler AND d.state = 'review_required'
          GROUP BY d.last_error_code) g
    ORDER BY g.n DESC, g.code;
END $$;

-- The messages of handler p_handler in review_required (with last error code
-- p_error_code, when given), oldest first, at most p_max_rows (1 to 10,000), without
-- their payload. A message that is gone (message_missing) has no partition, offset or
-- event type.
CREATE OR REPLACE FUNCTION review_messages(p_handler text, p_error_code text DEFAULT NULL, p_max_rows integer DEFAULT 100)
RETURNS TABLE (event_id text, topic text, "partition" integer, "offset" bigint, event_type text,
               attempts integer, last_error_code text, received_at timestamptz)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path FROM CURRENT AS $$
#variable_conflict use_column
BEGIN
    PERFORM authorize(p_handler, 'inbox.review_messages');
    IF p_max_rows IS NULL OR p_max_rows < 1 OR p_max_rows > 10000 THEN
        RAISE EXCEPTION 'inbox.review_messages: max_rows is between 1 and 10000'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_error_code IS NOT NULL THEN
        PERFORM check_error_code('inbox.review_messages', p_error_code);
    END IF;
    RETURN QUERY
    SELECT d.event_id, d.topic, m."partition", m."offset", m.event_type,
           d.attempts, d.last_error_code, d.received_at
    FROM deliveries d
    LEFT JOIN messages m ON m.event_id = d.event_id AND m.topic = d.topic AND m.received_at = d.received_at
    WHERE d.handler = p_handler AND d.state = 'review_required'
      AND (p_error_code IS NULL OR d.last_error_code = p_error_code)
    ORDER BY d.seq
    LIMIT p_max_rows;
END $$;

-- Per handler, what the admin API's handler list shows: backlog (pending, leased ones
-- included), oldest_pending_seconds (by arrival; 0 when none), leased (pending messages a
-- worker holds, counting leases that ran out until a claim takes them back),
-- review_required, attempts (of the open messages), paused and leases_lost. Beside
-- handler_stats, not in its place: 0001, run again on this schema (the files are
-- idempotent), replaces handler_stats with its own columns and could not drop added
-- ones. Reads each handler's open deliveries (the partial index
-- deliveries_open_by_aggregate), not the finished ones its retention keeps.
CREATE OR REPLACE VIEW handler_overview AS
SELECT h.name AS handler,
       o.backlog, o.oldest_pending_seconds, o.leased, o.review_required, o.attempts,
       h.paused, h.leases_lost
FROM handlers h
CROSS JOIN LATERAL (
    SELECT pg_catalog.count(*) FILTER (WHERE d.state = 'pending') AS backlog,
           coalesce(EXTRACT(epoch FROM pg_catalog.now() - pg_catalog.min(d.received_at) FILTER (WHERE d.state = 'pending')), 0)
               AS oldest_pending_seconds,
           pg_catalog.count(*) FILTER (WHERE d.state = 'pending' AND d.lease_until IS NOT NULL) AS leased,
           pg_catalog.count(*) FILTER (WHERE d.state = 'review_required') AS review_required,
           coalesce(pg_catalog.sum(d.attempts), 0) AS attempts
    FROM deliveries d
    WHERE d.handler = h.name AND d.state NOT IN ('done', 'dismissed')
) o;

-- The functions run as their owner: nobody calls them unless granted (docs/inbox.md,
-- "Roles and grants"). The helpers are for the others only. The view and the audit
-- table are the owner's until granted.
REVOKE ALL ON FUNCTION pause_handler(text), resume_handler(text),
    check_event_ids(text, text[]), check_error_code(text, text),
    review_selection(text, text[], text),
    retry_selected(text, text[], text), dismiss_selected(text, text[], text),
    retry_many(text, text[]), retry_by_error(text, text),
    dismiss_many(text, text[]), dismiss_by_error(text, text),
    review_groups(text), review_messages(text, text, integer)
FROM PUBLIC;
