-- walpost outbox migration 0002: events.outbox becomes a table partitioned by day on occurred_at,
-- so that old events are removed by dropping a partition (a catalog operation) instead of
-- DELETE (WAL for every row, bloat, vacuum). walpost's retention keeps partitions created
-- ahead and drops expired ones (docs/retention.md).
--
--   events.outbox            PARTITION BY RANGE (occurred_at), PRIMARY KEY (id, occurred_at),
--                            outbox_aggregate_idx (aggregate_type, aggregate_id, id), the same
--                            columns, defaults, checks, owner and grants as the 0001 table; ids
--                            keep coming from events.outbox_id_seq
--   events.outbox_pYYYYMMDD  one partition per UTC day, [day 00:00 UTC, next day 00:00 UTC),
--                            from today to 3 days ahead
--   events.outbox_legacy     the 0001 table with its rows, ATTACHED as the partition
--                            FROM (MINVALUE) TO (<UTC midnight after its newest occurred_at>)
--                            (dropped instead when it is empty, e.g. on a fresh database)
--   publication              every publication that contained the 0001 table now contains the
--                            new table, with publish_via_partition_root = true, so an insert
--                            into any partition is published as events.outbox; if no
--                            publication covers the table, walpost_outbox is created
--                            (publish = 'insert', publish_via_partition_root = true)
--
-- Why attach rather than copy: attaching rewrites no row, so it writes no WAL per row,
-- takes no extra disk and, above all, publishes nothing: a copy would be decoded from the
-- WAL as INSERTs into events.outbox and every old event would reach Kafka a second time.
--
-- Running walpost across the change: the conversion is one transaction holding an
-- ACCESS EXCLUSIVE lock on the 0001 table. Writers wait for it and then insert into the new
-- table (PostgreSQL resolves the name again after the wait); transactions committed before
-- it are decoded against the old table, those after it against the new one. Both are
-- published as events.outbox, each once.
--
-- Time under the lock: one scan for max(occurred_at), one to validate the partition bound
-- and one index build for the new primary key. For a large table do these beforehand
-- without blocking writers, and 0002 then takes milliseconds:
--   CREATE UNIQUE INDEX CONCURRENTLY outbox_id_occurred_at_key ON events.outbox (id, occurred_at);
--   ALTER TABLE events.outbox ADD CONSTRAINT outbox_legacy_bound
--       CHECK (occurred_at < '2026-12-10 00:00:00+00') NOT VALID;   -- a UTC midnight after every row
--   ALTER TABLE events.outbox VALIDATE CONSTRAINT outbox_legacy_bound;  -- writers keep writing
-- The bound then becomes the legacy partition's upper bound (rows at or after it are refused
-- from then on, so choose it a day or more ahead). Unless lock_timeout is set, the
-- conversion waits at most 10 s for its lock and fails (changing nothing) if it cannot get it.
--
-- Not carried over to the new table: other indexes, triggers, row-level security policies
-- and column-level grants of the 0001 table (they stay on events.outbox_legacy).
--
-- Plain SQL, idempotent (a second run changes nothing), one statement per step and no
-- transaction control, so it runs with psql (psql -f, with or without -1) and with
-- migration tools that wrap a file in a transaction (Flyway, golang-migrate, dbmate, sqitch).
-- Tools that split files on ';' must not split this one (Liquibase: splitStatements:false).
-- Never edit this file once shipped: add a new numbered migration instead. (One change
-- since: each block below runs with search_path = pg_catalog, pg_temp and calls built-ins
-- by their schema, so a role with CREATE on a schema in the applying role's search_path,
-- e.g. public on PostgreSQL 14, cannot have its own format() or quote_ident() run with the
-- migration's rights; the caller's search_path is set back when a block ends. It creates
-- no function, so a database that applied the file before has nothing to apply again.)

CREATE SCHEMA IF NOT EXISTS events;

DO $walpost_0002$
DECLARE
    caller_path text := pg_catalog.current_setting('search_path');
    old_oid     oid;
    today       timestamptz;
    bound       timestamptz;
    bound_lit   text;
    has_rows    boolean;
    first_day   timestamptz;
    d           timestamptz;
    pubs        text[];
    pub         text;
    owner_oid   oid;
    seq         text;
    id_att      int2;
    ts_att      int2;
    pk_name     text;
    pk_cols     int2[];
    pk_index    text;
    part        text;
    grant_row   record;
BEGIN
    -- Only the system catalog is searched from here on (set back at the end).
    PERFORM pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true);
    old_oid := pg_catalog.to_regclass('events.outbox');
    today := pg_catalog.date_trunc('day', pg_catalog.now(), 'UTC');
    IF old_oid IS NULL THEN
        RAISE EXCEPTION 'events.outbox does not exist: apply migrations/outbox/0001_events_outbox.sql first';
    END IF;
    IF (SELECT relkind FROM pg_class WHERE oid = old_oid) = 'p' THEN
        RAISE NOTICE 'events.outbox is already partitioned: nothing to convert';
        PERFORM pg_catalog.set_config('search_path', caller_path, true);
        RETURN;
    END IF;

    IF pg_catalog.current_setting('lock_timeout') IN ('0', '0ms') THEN
        PERFORM pg_catalog.set_config('lock_timeout', '10s', true);
    END IF;
    LOCK TABLE events.outbox IN ACCESS EXCLUSIVE MODE;

    SELECT coalesce(pg_catalog.array_agg(p.pubname::text ORDER BY p.pubname), '{}') INTO pubs
    FROM pg_publication_rel r JOIN pg_publication p ON p.oid = r.prpubid
    WHERE r.prrelid = old_oid;
    SELECT relowner INTO owner_oid FROM pg_class WHERE oid = old_oid;
    SELECT attnum INTO id_att FROM pg_attribute WHERE attrelid = old_oid AND attname = 'id' AND NOT attisdropped;
    SELECT attnum INTO ts_att FROM pg_attribute WHERE attrelid = old_oid AND attname = 'occurred_at' AND NOT attisdropped;
    IF id_att IS NULL OR ts_att IS NULL THEN
        RAISE EXCEPTION 'events.outbox needs the columns id and occurred_at of migration 0001';
    END IF;

    -- The legacy partition's upper bound: a validated outbox_legacy_bound prepared beforehand,
    -- or the UTC midnight after the newest row (at least today's), or none when empty.
    SELECT substring(pg_catalog.pg_get_constraintdef(c.oid) FROM '''([^'']+)''')::timestamptz INTO bound
    FROM pg_constraint c
    WHERE c.conrelid = old_oid AND c.conname = 'outbox_legacy_bound' AND c.convalidated;
    IF bound IS NOT NULL THEN
        IF bound <> pg_catalog.date_trunc('day', bound, 'UTC') THEN
            RAISE EXCEPTION 'outbox_legacy_bound must compare occurred_at with a UTC midnight, not %', bound;
        END IF;
        has_rows := true;
    ELSE
        SELECT pg_catalog.max(occurred_at) INTO bound FROM events.outbox;
        has_rows := bound IS NOT NULL;
        IF has_rows THEN
            bound := greatest(pg_catalog.date_trunc('day', bound, 'UTC') + interval '24 hours', today);
        END IF;
    END IF;
    bound_lit := pg_catalog.to_char(bound AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS') || '+00';

    -- The 0001 table steps aside; its constraint and index names go to the new table.
    ALTER TABLE events.outbox RENAME TO outbox_legacy;
    IF EXISTS (SELECT 1 FROM pg_constraint WHERE conrelid = old_oid AND conname = 'outbox_pkey') THEN
        ALTER TABLE events.outbox_legacy RENAME CONSTRAINT outbox_pkey TO outbox_legacy_pkey;
    END IF;
    IF EXISTS (SELECT 1 FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
               WHERE i.indrelid = old_oid AND c.relname = 'outbox_aggregate_idx') THEN
        ALTER INDEX events.outbox_aggregate_idx RENAME TO outbox_legacy_aggregate_idx;
    END IF;
    IF EXISTS (SELECT 1 FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
               WHERE i.indrelid = old_oid AND c.relname = 'outbox_unpublished_idx') THEN
        ALTER INDEX events.outbox_unpublished_idx RENAME TO outbox_legacy_unpublished_idx;
    END IF;

    CREATE TABLE events.outbox (
        LIKE events.outbox_legacy INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING STORAGE INCLUDING COMMENTS
    ) PARTITION BY RANGE (occurred_at);
    IF EXISTS (SELECT 1 FROM pg_constraint WHERE conrelid = 'events.outbox'::regclass AND conname = 'outbox_legacy_bound') THEN
        ALTER TABLE events.outbox DROP CONSTRAINT outbox_legacy_bound;  -- copied by LIKE
    END IF;
    ALTER TABLE events.outbox ADD CONSTRAINT outbox_pkey PRIMARY KEY (id, occurred_at);
    CREATE INDEX outbox_aggregate_idx ON events.outbox (aggregate_type, aggregate_id, id);
    CREATE INDEX outbox_unpublished_idx ON events.outbox (id) WHERE published_at IS NULL;
    COMMENT ON TABLE events.outbox IS
        'Transactional outbox, partitioned by day on occurred_at (UTC): write one row per event in the business transaction; walpost publishes INSERTs from the WAL to Kafka and drops expired partitions.';
    IF owner_oid <> (SELECT oid FROM pg_roles WHERE rolname = current_user) THEN
        EXECUTE pg_catalog.format('ALTER TABLE events.outbox OWNER TO %I', (SELECT rolname FROM pg_roles WHERE oid = owner_oid));
    END IF;
    FOR grant_row IN
        SELECT a.privilege_type, a.is_grantable,
               CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE pg_catalog.quote_ident(r.rolname) END AS grantee
        FROM pg_class c CROSS JOIN LATERAL pg_catalog.aclexplode(c.relacl) a LEFT JOIN pg_roles r ON r.oid = a.grantee
        WHERE c.oid = old_oid AND a.grantee <> c.relowner
    LOOP
        EXECUTE pg_catalog.format('GRANT %s ON events.outbox TO %s%s', grant_row.privilege_type, grant_row.grantee,
                       CASE WHEN grant_row.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END);
    END LOOP;

    -- Ids keep coming from the 0001 sequence, now owned by the new table (so that dropping
    -- the legacy partition never drops it).
    seq := pg_catalog.pg_get_serial_sequence('events.outbox_legacy', 'id');
    IF seq IS NOT NULL THEN
        EXECUTE pg_catalog.format('ALTER SEQUENCE %s OWNED BY events.outbox.id', seq);
    END IF;

    IF has_rows THEN
        -- A valid CHECK implying the partition bound spares ATTACH its own validation scan.
        IF NOT EXISTS (SELECT 1 FROM pg_constraint WHERE conrelid = old_oid AND conname = 'outbox_legacy_bound') THEN
            EXECUTE pg_catalog.format('ALTER TABLE events.outbox_legacy ADD CONSTRAINT outbox_legacy_bound CHECK (occurred_at < %L)', bound_lit);
        END IF;
        -- The partition's primary key must match the table's: (id) becomes (id, occurred_at).
        SELECT conname, conkey INTO pk_name, pk_cols FROM pg_constraint WHERE conrelid = old_oid AND contype = 'p';
        IF pk_cols IS DISTINCT FROM ARRAY[id_att, ts_att] THEN
            SELECT c.relname INTO pk_index
            FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
            WHERE i.indrelid = old_oid AND i.indisunique AND i.indisvalid AND NOT i.indisprimary
              AND i.indpred IS NULL AND i.indexprs IS NULL AND i.indkey::text = pg_catalog.format('%s %s', id_att, ts_att)
            ORDER BY c.relname LIMIT 1;
            IF pk_name IS NOT NULL THEN
                EXECUTE pg_catalog.format('ALTER TABLE events.outbox_legacy DROP CONSTRAINT %I', pk_name);
            END IF;
            IF pk_index IS NOT NULL THEN
                EXECUTE pg_catalog.format('ALTER TABLE events.outbox_legacy ADD CONSTRAINT outbox_legacy_pkey PRIMARY KEY USING INDEX %I', pk_index);
            ELSE
                ALTER TABLE events.outbox_legacy ADD CONSTRAINT outbox_legacy_pkey PRIMARY KEY (id, occurred_at);
            END IF;
        END IF;
        EXECUTE pg_catalog.format('ALTER TABLE events.outbox ATTACH PARTITION events.outbox_legacy FOR VALUES FROM (MINVALUE) TO (%L)', bound_lit);
        first_day := bound;
    ELSE
        DROP TABLE events.outbox_legacy;
        first_day := today;
    END IF;

    -- Daily partitions up to 3 days ahead; walpost's retention keeps them ahead from here on.
    d := first_day;
    WHILE d < today + interval '96 hours' LOOP
        part := 'outbox_p' || pg_catalog.to_char(d AT TIME ZONE 'UTC', 'YYYYMMDD');
        EXECUTE pg_catalog.format('CREATE TABLE events.%I PARTITION OF events.outbox FOR VALUES FROM (%L) TO (%L)', part,
                       pg_catalog.to_char(d AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS') || '+00',
                       pg_catalog.to_char((d + interval '24 hours') AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS') || '+00');
        IF owner_oid <> (SELECT oid FROM pg_roles WHERE rolname = current_user) THEN
            EXECUTE pg_catalog.format('ALTER TABLE events.%I OWNER TO %I', part, (SELECT rolname FROM pg_roles WHERE oid = owner_oid));
        END IF;
        d := d + interval '24 hours';
    END LOOP;

    -- Publications that streamed the 0001 table now stream the new one, as one relation.
    FOREACH pub IN ARRAY pubs LOOP
        EXECUTE pg_catalog.format('ALTER PUBLICATION %I ADD TABLE events.outbox', pub);
        IF has_rows THEN
            EXECUTE pg_catalog.format('ALTER PUBLICATION %I DROP TABLE events.outbox_legacy', pub);
        END IF;
        IF NOT (SELECT pubviaroot FROM pg_publication WHERE pubname = pub) THEN
            EXECUTE pg_catalog.format('ALTER PUBLICATION %I SET (publish_via_partition_root = true)', pub);
            RAISE NOTICE 'publication % now has publish_via_partition_root = true, so partitions are published as events.outbox', pub;
        END IF;
    END LOOP;
    RAISE NOTICE 'events.outbox is partitioned by day on occurred_at (legacy rows: %)',
        CASE WHEN has_rows THEN 'attached as events.outbox_legacy, up to ' || bound_lit ELSE 'none' END;
    PERFORM pg_catalog.set_config('search_path', caller_path, true);
END
$walpost_0002$;

DO $walpost_0002_publication$
DECLARE
    caller_path text := pg_catalog.current_setting('search_path');
    pub text;
BEGIN
    PERFORM pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true);
    FOR pub IN SELECT pubname FROM pg_publication WHERE puballtables AND NOT pubviaroot LOOP
        RAISE WARNING 'publication % is FOR ALL TABLES with publish_via_partition_root = false: it publishes the partitions of events.outbox under their own names, which walpost does not read as events.outbox; run ALTER PUBLICATION % SET (publish_via_partition_root = true)', pub, pub;
    END LOOP;
    IF NOT EXISTS (SELECT 1 FROM pg_publication_tables WHERE schemaname = 'events' AND tablename = 'outbox')
       AND NOT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = 'walpost_outbox') THEN
        BEGIN
            CREATE PUBLICATION walpost_outbox FOR TABLE events.outbox
                WITH (publish = 'insert', publish_via_partition_root = true);
        EXCEPTION WHEN insufficient_privilege THEN
            RAISE NOTICE 'not allowed to create publication walpost_outbox here; walpost creates it on first start (or run: CREATE PUBLICATION walpost_outbox FOR TABLE events.outbox WITH (publish = ''insert'', publish_via_partition_root = true))';
        END;
    END IF;
    PERFORM pg_catalog.set_config('search_path', caller_path, true);
END
$walpost_0002_publication$;
