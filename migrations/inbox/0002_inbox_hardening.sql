-- walpost inbox migration 0002: the inbox, hardened. Applied after 0001_inbox.sql, into
-- the same schema (`walpost migrate --inbox` and `walpost inbox --create-schema` apply
-- both, in order, each in its own transaction).
--
-- What it changes, and why:
--   * Dedup per topic. An event id is unique per producing source, not across sources:
--     two services' outboxes both have an event 42. A message is now keyed by
--     (event_id, topic); deliveries and receipts carry the topic, so two events with one
--     id from two topics are two messages with their own deliveries. `walpost inbox`
--     decides what a duplicate is ([inbox] dedup = "topic", the default, or "global" for
--     ids that are unique everywhere, such as UUIDs).
--   * Handlers have owners. Every function of the SQL API runs as the inbox's owner
--     (SECURITY DEFINER) with a fixed search_path, and acts for a handler only when the
--     caller's login role (session_user) was granted that handler with
--     inbox.grant_handler(handler, role), or is a member of the role that owns the inbox.
--     Workers then need no grant on the tables: only EXECUTE on the functions they call.
--     Registering, granting and revoking is the owner's alone.
--   * A fixed search_path on every function (a role with CREATE on a schema in the
--     caller's search_path cannot plant a function the inbox's SQL would call), and
--     built-ins called with their schema.
--   * A worker that dies holding leases is seen: the next claim takes back every lease
--     that ran out without complete or fail. A message leased alone is charged an
--     attempt (last_error_code 'lease_expired'), so one that crashes its worker reaches
--     review_required after max_attempts; the messages of a larger claim are released
--     without charge, and each is offered alone from then on, until it completes or fails,
--     so the one that crashes is found and the others go on. Lost leases are counted per
--     handler (inbox.handlers.leases_lost).
--   * An open delivery is never leased blind: claim finds its message by (event id,
--     topic), so one stored again (after its row was deleted by hand, then replayed) is
--     followed there, the delivery keeping its place (seq) in arrival order; one whose
--     message is gone is set aside in review_required with last_error_code
--     'message_missing', and goes back to pending by itself once the message is stored
--     again.
--   * inbox.extend(handler, event_id, lease_token, lease) lengthens a held lease;
--     inbox.dismiss also closes a pending message; inbox.fail's backoff never overflows,
--     and max_attempts is at most 1000.
--   * A long aggregate id is indexed by its sha256 (a btree row holds at most 2704 bytes).
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

-- Dedup per topic: the keys gain the topic (once; rows already stored take their
-- message's topic).
-- ALTER TABLE locks its table even when the column exists, and a writing instance holds
-- that table: each column is added only when absent (as 0004 does with its indexes), so
-- applying this file again to a complete schema takes no lock a writer holds.
DO $$
DECLARE
    col record;
BEGIN
    FOR col IN SELECT * FROM (VALUES
        ('deliveries', 'topic', 'text NOT NULL DEFAULT '''''),
        ('receipts', 'topic', 'text NOT NULL DEFAULT '''''),
        ('deliveries', 'isolated', 'boolean NOT NULL DEFAULT false'),
        ('deliveries', 'lease_rows', 'integer'),
        ('handlers', 'leases_lost', 'bigint NOT NULL DEFAULT 0')) AS c (tab, name, def)
    LOOP
        CONTINUE WHEN EXISTS (
            SELECT FROM pg_catalog.pg_attribute a
            WHERE a.attrelid = pg_catalog.to_regclass(col.tab) AND a.attname = col.name AND NOT a.attisdropped);
        EXECUTE pg_catalog.format('ALTER TABLE %s ADD COLUMN %I %s',
                                  pg_catalog.to_regclass(col.tab), col.name, col.def);
    END LOOP;
END $$;

-- Rows without a topic (stored before this migration, or while 0004's functions were
-- applied again without this file) take their message's. The partial index keeps this
-- cheap when there are none.
-- The leases claim takes back (a range of the few leased rows, not a scan of the
-- backlog), and the deliveries set aside for a missing message (what a message stored
-- again looks for).
DO $$
BEGIN
    IF to_regclass('deliveries_leased') IS NULL THEN
        CREATE INDEX deliveries_leased ON deliveries (handler, lease_until)
            WHERE state = 'pending' AND lease_until IS NOT NULL;
    END IF;
    IF to_regclass('deliveries_message_missing') IS NULL THEN
        CREATE INDEX deliveries_message_missing ON deliveries (event_id, topic)
            WHERE last_error_code = 'message_missing';
    END IF;
    IF to_regclass('deliveries_without_topic') IS NULL THEN
        CREATE INDEX deliveries_without_topic ON deliveries (event_id) WHERE topic = '';
    END IF;
    IF to_regclass('receipts_without_topic') IS NULL THEN
        CREATE INDEX receipts_without_topic ON receipts (event_id) WHERE topic = '';
    END IF;
END $$;
UPDATE deliveries d SET topic = m.topic
FROM messages m
WHERE d.topic = '' AND m.event_id = d.event_id AND m.received_at = d.received_at;
UPDATE receipts r SET topic = m.topic
FROM messages m
WHERE r.topic = '' AND m.event_id = r.event_id AND m.received_at = r.received_at;

DO $$
BEGIN
    IF NOT EXISTS (
        SELECT FROM pg_catalog.pg_constraint c
        JOIN pg_catalog.pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = ANY (c.conkey)
        WHERE c.conrelid = 'messages'::regclass AND c.contype = 'p' AND a.attname = 'topic'
    ) THEN
        ALTER TABLE messages DROP CONSTRAINT messages_pkey,
            ADD PRIMARY KEY (event_id, topic, received_at);
        ALTER TABLE deliveries DROP CONSTRAINT deliveries_pkey,
            ADD PRIMARY KEY (handler, event_id, topic, received_at);
        ALTER TABLE receipts DROP CONSTRAINT receipts_pkey,
            ADD PRIMARY KEY (handler, event_id, topic, received_at);
    END IF;
END $$;

-- Who may act for which handler (besides the members of the inbox's owner role).
CREATE TABLE IF NOT EXISTS handler_grants (
    handler    text NOT NULL REFERENCES handlers (name) ON DELETE CASCADE,
    grantee    name NOT NULL,
    granted_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (handler, grantee)
);

-- The key of an aggregate in the deliveries' index: the id itself, or its sha256 when it
-- is too long for a btree row (ordering needs only equality).
CREATE OR REPLACE FUNCTION aggregate_key(p_aggregate_id text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
SET search_path FROM CURRENT AS $$
    SELECT CASE WHEN pg_catalog.octet_length(p_aggregate_id) > 512
                THEN 'sha256:' || pg_catalog.encode(pg_catalog.sha256(pg_catalog.convert_to(p_aggregate_id, 'UTF8')), 'hex')
                ELSE p_aggregate_id END
$$;

-- Raises unless the session's login role may act for handler p_handler: a member of a
-- role it was granted to, or of the role that owns the inbox's tables.
CREATE OR REPLACE FUNCTION authorize(p_handler text, p_action text) RETURNS void
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path FROM CURRENT AS $$
BEGIN
    IF pg_catalog.pg_has_role(session_user,
                              (SELECT c.relowner FROM pg_catalog.pg_class c WHERE c.oid = 'handlers'::pg_catalog.regclass),
                              'MEMBER') THEN
        RETURN;
    END IF;
    IF EXISTS (SELECT FROM handler_grants g JOIN pg_catalog.pg_roles r ON r.rolname = g.grantee
               WHERE g.handler = p_handler AND pg_catalog.pg_has_role(session_user, r.oid, 'MEMBER')) THEN
        RETURN;
    END IF;
    RAISE EXCEPTION 'role "%" may not call % for inbox handler "%"', session_user, p_action, p_handler
        USING ERRCODE = 'insufficient_privilege',
              HINT = pg_catalog.format('the inbox''s owner grants it with SELECT inbox.grant_handler(%L, %L)', p_handler, session_user);
END $$;

-- Raises unless the session's login role is a member of the inbox's owner role.
CREATE OR REPLACE FUNCTION authorize_owner(p_action text) RETURNS void
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path FROM CURRENT AS $$
BEGIN
    IF NOT pg_catalog.pg_has_role(session_user,
                                  (SELECT c.relowner FROM pg_catalog.pg_class c WHERE c.oid = 'handlers'::pg_catalog.regclass),
                                  'MEMBER') THEN
        RAISE EXCEPTION 'role "%" may not call %: only the inbox''s owner may', session_user, p_action
            USING ERRCODE = 'insufficient_privilege';
    END IF;
END $$;

-- New messages become deliveries of every handler they match (one statement per batch).
-- A delivery set aside because its message was gone takes the message stored again, back
-- to pending at its old place (seq); a handler that has a delivery of it already gets no
-- second one (its receipt or review decision stands). Runs as the role that stores
-- messages (walpost inbox's). Only the set-aside deliveries are looked up by event id
-- (a partial index holds just those): the ingest pays nothing for this otherwise.
CREATE OR REPLACE FUNCTION deliver_new_messages() RETURNS trigger
LANGUAGE plpgsql
SET search_path FROM CURRENT
-- A batch's messages times the handlers, each looked up on the deliveries' primary key.
-- Planned for each batch (EXECUTE): a plan cached in a long-lived session was made for
-- the empty tables of its first batch, looked deliveries up by handler alone, and made
-- every batch scan all of a handler's deliveries (100 batches of 2,000: 70 s instead of 7);
-- merge and hash joins off, as the transition table has no statistics.
SET enable_mergejoin = off
SET enable_hashjoin = off
-- Its estimate of per-row lookups is high enough to JIT-compile every batch's statement:
-- 130 ms a batch of compiling for 50 ms of work.
SET jit = off AS $$
BEGIN
    EXECUTE '
    UPDATE deliveries d
    SET received_at = m.received_at, state = ''pending'', last_error_code = NULL, next_attempt_at = pg_catalog.now()
    FROM new_messages m
    WHERE d.last_error_code = ''message_missing'' AND d.state = ''review_required''
      AND d.event_id = m.event_id AND d.topic = m.topic';
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
END $$;

-- Registers a handler or changes its settings (the inbox's owner only); the messages
-- already stored that it matches and has no delivery of become its deliveries.
CREATE OR REPLACE FUNCTION register_handler(
    p_name text, p_topics text[], p_event_types text[], p_max_attempts integer,
    p_backoff_base interval, p_backoff_max interval, p_ordered boolean
) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER
SET search_path FROM CURRENT AS $$
BEGIN
    PERFORM authorize_owner('inbox.register_handler');
    IF p_max_attempts IS NULL OR p_max_attempts < 1 OR p_max_attempts > 1000 THEN
        RAISE EXCEPTION 'inbox.register_handler: max_attempts must be between 1 and 1000'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
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
END $$;

-- Lets the members of p_role act for handler p_handler (claim, complete, fail, extend,
-- retry, dismiss). The inbox's owner only. Returns false when it was granted already.
CREATE OR REPLACE FUNCTION grant_handler(p_handler text, p_role name) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER
SET search_path FROM CURRENT AS $$
BEGIN
    PERFORM authorize_owner('inbox.grant_handler');
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = p_role) THEN
        RAISE EXCEPTION 'inbox.grant_handler: role "%" does not exist', p_role USING ERRCODE = 'undefined_object';
    END IF;
    IF NOT EXISTS (SELECT FROM handlers WHERE name = p_handler) THEN
        RAISE EXCEPTION 'inbox handler "%" is not registered: call inbox.register_handler first', p_handler
            USING ERRCODE = 'no_data_found';
    END IF;
    INSERT INTO handler_grants (handler, grantee) VALUES (p_handler, p_role) ON CONFLICT DO NOTHING;
    RETURN FOUND;
END $$;

-- Takes back what grant_handler gave. Returns false when there was no such grant.
CREATE OR REPLACE FUNCTION revoke_handler(p_handler text, p_role name) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER
SET search_path FROM CURRENT AS $$
BEGIN
    PERFORM authorize_owner('inbox.revoke_handler');
    DELETE FROM handler_grants WHERE handler = p_handler AND grantee = p_role;
    RETURN FOUND;
END $$;

-- Leases up to p_max_rows due messages to the caller, oldest first; workers share the
-- work (SKIP LOCKED). First takes back the leases that ran out (see the header).
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
    WITH candidates AS (
        SELECT d.handler, d.event_id, d.topic, d.received_at, d.seq, d.isolated,
               -- Where its message is: the same row, or the one stored again after it was
               -- deleted (NULL: gone).
               (SELECT pg_catalog.max(m.received_at) FROM messages m
                WHERE m.event_id = d.event_id AND m.topic = d.topic) AS message_at
        FROM deliveries d
        WHERE d.handler = p_handler
          AND d.state = 'pending'
          AND d.next_attempt_at <= pg_catalog.now()
          AND d.lease_until IS NULL
          AND (NOT h.ordered OR d.aggregate_id IS NULL OR NOT EXISTS (
                SELECT FROM deliveries e
                WHERE e.handler = d.handler AND e.aggregate_id = d.aggregate_id
                  AND e.seq < d.seq AND e.state NOT IN ('done', 'dismissed')))
        ORDER BY d.seq
        LIMIT p_max_rows
        FOR UPDATE OF d SKIP LOCKED
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

-- Lengthens a lease the caller holds to p_lease from now (a long message, or a batch
-- handled one by one). Returns false when p_lease_token is no longer the message's.
CREATE OR REPLACE FUNCTION extend(p_handler text, p_event_id text, p_lease_token uuid, p_lease interval)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER
SET search_path FROM CURRENT AS $$
BEGIN
    PERFORM authorize(p_handler, 'inbox.extend');
    IF p_lease IS NULL OR p_lease <= interval '0' THEN
        RAISE EXCEPTION 'inbox.extend needs a positive lease' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    UPDATE deliveries
    SET lease_until = pg_catalog.now() + p_lease
    WHERE handler = p_handler AND event_id = p_event_id AND lease_token = p_lease_token AND state = 'pending';
    RETURN FOUND;
END $$;

-- The handler acted on the message: writes its receipt and returns true, or returns false
-- and writes nothing when p_lease_token is no longer the message's (the lease ran out and
-- another claim took it back, or it was already completed): the caller then rolls back.
CREATE OR REPLACE FUNCTION complete(p_handler text, p_event_id text, p_lease_token uuid)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER
SET search_path FROM CURRENT AS $$
DECLARE
    day timestamptz;
    source text;
BEGIN
    PERFORM authorize(p_handler, 'inbox.complete');
    UPDATE deliveries
    SET state = 'done', lease_token = NULL, lease_until = NULL, lease_rows = NULL
    WHERE handler = p_handler AND event_id = p_event_id AND lease_token = p_lease_token AND state = 'pending'
    RETURNING received_at, topic INTO day, source;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    INSERT INTO receipts (handler, event_id, topic, received_at) VALUES (p_handler, p_event_id, source, day);
    RETURN true;
END $$;

-- The handler failed on the message: counts the attempt and schedules the next one after
-- backoff_base * 2^(attempts - 1), at most backoff_max, times a jitter of 0.5 to 1
-- (computed in seconds, so no attempt count overflows an interval), or moves the message
-- to review_required after max_attempts. Returns the new state, or 'lease_lost' (nothing
-- written) when the lease token is no longer the message's.
CREATE OR REPLACE FUNCTION fail(p_handler text, p_event_id text, p_lease_token uuid, p_error_code text)
RETURNS text
LANGUAGE plpgsql SECURITY DEFINER
SET search_path FROM CURRENT AS $$
DECLARE
    new_state text;
BEGIN
    PERFORM authorize(p_handler, 'inbox.fail');
    IF p_error_code IS NULL OR p_error_code !~ '^[A-Za-z0-9_.:-]{1,64}$' THEN
        RAISE EXCEPTION 'inbox.fail: an error code is a short code (letters, digits, _ . : -, at most 64 characters), never message text'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    UPDATE deliveries d
    SET attempts = d.attempts + 1,
        last_error_code = p_error_code,
        lease_token = NULL,
        lease_until = NULL,
        lease_rows = NULL,
        state = CASE WHEN d.attempts + 1 >= h.max_attempts THEN 'review_required' ELSE 'pending' END,
        next_attempt_at = pg_catalog.now() + pg_catalog.make_interval(secs =>
            LEAST(pg_catalog.date_part('epoch', h.backoff_max),
                  pg_catalog.date_part('epoch', h.backoff_base) * pg_catalog.power(2::double precision, LEAST(d.attempts, 60)))
            * (0.5 + pg_catalog.random() / 2))
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
LANGUAGE plpgsql SECURITY DEFINER
SET search_path FROM CURRENT AS $$
BEGIN
    PERFORM authorize(p_handler, 'inbox.retry');
    UPDATE deliveries
    SET state = 'pending', attempts = 0, next_attempt_at = pg_catalog.now(), last_error_code = NULL
    WHERE handler = p_handler AND event_id = p_event_id AND state = 'review_required';
    RETURN FOUND;
END $$;

-- The decision not to handle a message that is in review_required or pending (one that
-- crashes its worker, say): it is closed without a receipt (it no longer holds back its
-- aggregate, nor its day's partitions from being dropped). A worker holding its lease
-- gets false from complete and fail. Returns false when it was in neither state.
CREATE OR REPLACE FUNCTION dismiss(p_handler text, p_event_id text)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER
SET search_path FROM CURRENT AS $$
BEGIN
    PERFORM authorize(p_handler, 'inbox.dismiss');
    UPDATE deliveries
    SET state = 'dismissed', lease_token = NULL, lease_until = NULL, lease_rows = NULL
    WHERE handler = p_handler AND event_id = p_event_id AND state IN ('review_required', 'pending');
    RETURN FOUND;
END $$;

-- The functions run as their owner: nobody calls them unless granted (docs/inbox.md,
-- "Roles and grants", has the exact grants). The two helpers are for the others only.
REVOKE ALL ON FUNCTION authorize(text, text), authorize_owner(text),
    register_handler(text, text[], text[], integer, interval, interval, boolean),
    grant_handler(text, name), revoke_handler(text, name),
    claim(text, integer, interval), extend(text, text, uuid, interval),
    complete(text, text, uuid), fail(text, text, uuid, text),
    retry(text, text), dismiss(text, text)
FROM PUBLIC;
