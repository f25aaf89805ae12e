-- walpost inbox migration 0003: batches in the SQL API. Applied after 0002_inbox_hardening.sql,
-- into the same schema (`walpost migrate --inbox` and `walpost inbox --create-schema` apply
-- the files in order, each in its own transaction).
--
-- inbox.claim returns up to max_rows messages; a worker whose side effects can share one
-- transaction (rows in the same database) commits them and the batch's receipts together,
-- with one call instead of one per message:
--   inbox.complete_many(handler, event_ids text[], lease_tokens uuid[]) -> text[]
--       the ids whose receipt was written, in the order given; an id whose lease token is
--       no longer its message's (the lease ran out and a claim took it back, it was
--       dismissed or completed already) is left out and nothing is written for it;
--   inbox.fail_many(handler, event_ids text[], lease_tokens uuid[], error_codes text[]) -> text[]
--       one result per element, in the order given: what inbox.fail returns for it
--       ('pending', 'review_required' or 'lease_lost').
--
-- Invariants:
--   * a batch call leaves the inbox exactly as calling inbox.complete (inbox.fail) once per
--     element, in array order, in the same transaction, would: same receipts, states,
--     attempts, backoff and error codes (crates/walpost/tests/e2e/inbox_batches.rs holds
--     the two to the same outcome over random interleavings of claims and lease expiry).
--     An element repeated (same event id and lease token) acts once, as the first of two
--     single calls would; the later copies find the lease gone. Set-based all the same:
--     one UPDATE over the arrays, since each element touches only its own delivery and
--     neither function looks at the others (an ordered handler's order is claim's
--     business);
--   * the same security as the single functions: SECURITY DEFINER with a fixed
--     search_path, the caller's login role authorised for the handler (inbox.authorize)
--     before anything is read, EXECUTE revoked from PUBLIC. The roles that may execute
--     inbox.complete (inbox.fail) when this file runs get EXECUTE on complete_many
--     (fail_many), so workers granted before it can switch without a new grant;
--   * the arrays are checked before anything is written: one-dimensional, equally long,
--     at most 10,000 elements, no NULL element; each error code is a short code, as
--     inbox.fail's (never payload text). A refused call writes nothing and names the
--     element by its position (from 1), never by its value. A NULL array is an empty one
--     (array_agg over no rows gives NULL: a worker's empty batch is no error).
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
--        -f migrations/inbox/0003_inbox_batches.sql            for teams with their own tool
-- Never edit this file once shipped: add a new numbered migration instead.

-- Nothing is created until search_path names the schema (see the header): a file run
-- with the default search_path would create the functions in public.
DO $walpost_schema$
BEGIN
    IF pg_catalog.current_schema() IS NULL OR pg_catalog.current_schema() LIKE 'pg\_%'
       OR pg_catalog.current_setting('search_path') !~ '^\s*("([^"]|"")+"|[^",\s]+)\s*,\s*pg_temp\s*$' THEN
        RAISE EXCEPTION 'the inbox migrations run with search_path = <inbox schema>, pg_temp, the schema created first (search_path is %)',
            pg_catalog.current_setting('search_path')
            USING HINT = 'walpost migrate --inbox sets it; with psql, run CREATE SCHEMA IF NOT EXISTS inbox; SET search_path = inbox, pg_temp; before the file (docs/inbox.md)';
    END IF;
END $walpost_schema$;

-- Raises unless the arrays of a batch call (NULL ones made empty by the caller) are
-- usable: one-dimensional, equally long, at most 10,000 elements (a batch is one
-- transaction's worth of a worker's messages: a bound keeps one call from holding row
-- locks on a whole backlog), no NULL element, and (p_error_codes not NULL: fail_many)
-- short error codes. Positions are counted from 1; values are never quoted (an error
-- code refused may be message text).
CREATE OR REPLACE FUNCTION check_batch(p_action text, p_event_ids text[], p_lease_tokens uuid[], p_error_codes text[])
RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT AS $$
DECLARE
    n integer;
    arrays text := CASE WHEN p_error_codes IS NULL THEN 'event_ids and lease_tokens'
                        ELSE 'event_ids, lease_tokens and error_codes' END;
    bad bigint;
BEGIN
    IF pg_catalog.array_ndims(p_event_ids) > 1 OR pg_catalog.array_ndims(p_lease_tokens) > 1
       OR pg_catalog.array_ndims(p_error_codes) > 1 THEN
        RAISE EXCEPTION '%: % are one-dimensional arrays', p_action, arrays USING ERRCODE = 'invalid_parameter_value';
    END IF;
    n := pg_catalog.cardinality(p_event_ids);
    IF pg_catalog.cardinality(p_lease_tokens) <> n
       OR (p_error_codes IS NOT NULL AND pg_catalog.cardinality(p_error_codes) <> n) THEN
        RAISE EXCEPTION '%: % must be equally long (event_ids has %, lease_tokens %)',
            p_action, arrays, n, pg_catalog.cardinality(p_lease_tokens)
            || CASE WHEN p_error_codes IS NULL THEN ''
                    ELSE ', error_codes ' || pg_catalog.cardinality(p_error_codes) END
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'element i of each array is about the same message: its event id, the lease token claim returned with it'
                         || CASE WHEN p_error_codes IS NULL THEN '' ELSE ', its error code' END;
    END IF;
    IF n > 10000 THEN
        RAISE EXCEPTION '%: at most 10000 messages a call (event_ids has %)', p_action, n
            USING ERRCODE = 'program_limit_exceeded', HINT = 'split the batch: claim fewer rows, or call it once per 10000';
    END IF;
    SELECT u.ord INTO bad FROM pg_catalog.unnest(p_event_ids) WITH ORDINALITY AS u (v, ord)
    WHERE u.v IS NULL ORDER BY u.ord LIMIT 1;
    IF bad IS NOT NULL THEN
        RAISE EXCEPTION '%: event_ids[%] is NULL', p_action, bad USING ERRCODE = 'null_value_not_allowed';
    END IF;
    SELECT u.ord INTO bad FROM pg_catalog.unnest(p_lease_tokens) WITH ORDINALITY AS u (v, ord)
    WHERE u.v IS NULL ORDER BY u.ord LIMIT 1;
    IF bad IS NOT NULL THEN
        RAISE EXCEPTION '%: lease_tokens[%] is NULL', p_action, bad USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF p_error_codes IS NOT NULL THEN
        SELECT u.ord INTO bad FROM pg_catalog.unnest(p_error_codes) WITH ORDINALITY AS u (v, ord)
        WHERE u.v IS NULL OR u.v !~ '^[A-Za-z0-9_.:-]{1,64}$' ORDER BY u.ord LIMIT 1;
        IF bad IS NOT NULL THEN
            RAISE EXCEPTION '%: error_codes[%] is not an error code: a short code (letters, digits, _ . : -, at most 64 characters), never message text',
                p_action, bad USING ERRCODE = 'invalid_parameter_value';
        END IF;
    END IF;
END $$;

-- The handler acted on a batch of messages: writes the receipt of each whose lease token
-- is still its message's and returns their ids, in the order given. Call it in the
-- transaction of the batch's writes: an id left out lost its lease (another worker has
-- it), so no write for it may commit: write the effects of the returned ids only (as
-- docs/inbox.md does), or roll back.
CREATE OR REPLACE FUNCTION complete_many(p_handler text, p_event_ids text[], p_lease_tokens uuid[])
RETURNS text[]
LANGUAGE plpgsql SECURITY DEFINER
SET search_path FROM CURRENT AS $$
DECLARE
    written text[];
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
        RETURNING b.ord, d.event_id, d.topic, d.received_at
    ), receipted AS (
        INSERT INTO receipts (handler, event_id, topic, received_at)
        SELECT p_handler, done.event_id, done.topic, done.received_at FROM done
        RETURNING 1
    )
    SELECT pg_catalog.array_agg(done.event_id ORDER BY done.ord) INTO written FROM done;
    RETURN coalesce(written, '{}');
END $$;

-- The handler failed on a batch of messages: for each, what inbox.fail does (counts the
-- attempt with its error code, schedules the next after backoff, or review_required after
-- max_attempts). Returns one result per element, in the order given: the new state, or
-- 'lease_lost' (nothing written for it).
CREATE OR REPLACE FUNCTION fail_many(p_handler text, p_event_ids text[], p_lease_tokens uuid[], p_error_codes text[])
RETURNS text[]
LANGUAGE plpgsql SECURITY DEFINER
SET search_path FROM CURRENT AS $$
DECLARE
    states text[];
BEGIN
    PERFORM authorize(p_handler, 'inbox.fail_many');
    p_event_ids := coalesce(p_event_ids, '{}');
    p_lease_tokens := coalesce(p_lease_tokens, '{}');
    p_error_codes := coalesce(p_error_codes, '{}');
    PERFORM check_batch('inbox.fail_many', p_event_ids, p_lease_tokens, p_error_codes);
    WITH input AS (
        SELECT b.event_id, b.lease_token, b.error_code, b.ord
        FROM ROWS FROM (pg_catalog.unnest(p_event_ids), pg_catalog.unnest(p_lease_tokens),
                        pg_catalog.unnest(p_error_codes))
             WITH ORDINALITY AS b (event_id, lease_token, error_code, ord)
    ), batch AS (
        -- The first of each (event id, lease token), with its error code: a second
        -- inbox.fail with the same token gets 'lease_lost'.
        SELECT DISTINCT ON (i.event_id, i.lease_token) i.event_id, i.lease_token, i.error_code, i.ord
        FROM input i
        ORDER BY i.event_id, i.lease_token, i.ord
    ), failed AS (
        -- inbox.fail's UPDATE, per element.
        UPDATE deliveries d
        SET attempts = d.attempts + 1,
            last_error_code = b.error_code,
            lease_token = NULL,
            lease_until = NULL,
            lease_rows = NULL,
            state = CASE WHEN d.attempts + 1 >= h.max_attempts THEN 'review_required' ELSE 'pending' END,
            next_attempt_at = pg_catalog.now() + pg_catalog.make_interval(secs =>
                LEAST(pg_catalog.date_part('epoch', h.backoff_max),
                      pg_catalog.date_part('epoch', h.backoff_base) * pg_catalog.power(2::double precision, LEAST(d.attempts, 60)))
                * (0.5 + pg_catalog.random() / 2))
        FROM handlers h, batch b
        WHERE h.name = d.handler AND d.handler = p_handler AND d.event_id = b.event_id
          AND d.lease_token = b.lease_token AND d.state = 'pending'
        RETURNING b.ord, d.state
    )
    SELECT pg_catalog.array_agg(coalesce(f.state, 'lease_lost') ORDER BY i.ord) INTO states
    FROM input i LEFT JOIN failed f ON f.ord = i.ord;
    RETURN coalesce(states, '{}');
END $$;

-- The functions run as their owner: nobody calls them unless granted (docs/inbox.md,
-- "Roles and grants"). check_batch is for the other two only.
REVOKE ALL ON FUNCTION check_batch(text, text[], uuid[], text[]),
    complete_many(text, text[], uuid[]), fail_many(text, text[], uuid[], text[])
FROM PUBLIC;

-- Who may call a single function may call its batch (each call is still authorised per
-- handler, and a batch does nothing the single calls could not): the roles that hold
-- EXECUTE on complete (fail) now get it on complete_many (fail_many). Grants made after
-- this file name the batch functions themselves (docs/inbox.md).
DO $$
DECLARE
    g record;
BEGIN
    FOR g IN
        SELECT DISTINCT f.batch, a.grantee
        FROM (VALUES ('complete(text, text, uuid)', 'complete_many(text, text[], uuid[])'),
                     ('fail(text, text, uuid, text)', 'fail_many(text, text[], uuid[], text[])')) AS f (single, batch)
        JOIN pg_catalog.pg_proc p ON p.oid = pg_catalog.to_regprocedure(f.single)
        CROSS JOIN LATERAL pg_catalog.aclexplode(p.proacl) AS a
        WHERE a.privilege_type = 'EXECUTE' AND a.grantee <> 0 AND a.grantee <> p.proowner
        ORDER BY 1, 2
    LOOP
        EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION %s TO %s',
                                  pg_catalog.to_regprocedure(g.batch), g.grantee::pg_catalog.regrole);
    END LOOP;
END $$;
