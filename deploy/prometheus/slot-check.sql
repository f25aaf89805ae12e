-- walpost slot check on the PostgreSQL side: works when walpost and Prometheus are both
-- down. One row per logical replication slot, with status ok / warning / critical and the
-- reasons. Any role can run it (pg_replication_slots is readable by all), on a primary or
-- on a standby (PostgreSQL 17 failover slots), PostgreSQL 13 or later.
--
--   psql -X -f deploy/prometheus/slot-check.sql "$DATABASE_URL"
--   psql -X -v warning_bytes=268435456 -v inactive_status=ok -f deploy/prometheus/slot-check.sql ...
--
-- From cron or a monitoring agent, exit 1 when any slot is not ok:
--   psql -XAt -F '|' -f deploy/prometheus/slot-check.sql "$DATABASE_URL" \
--     | awk -F'|' '{ print } $2 != "ok" { bad = 1 } END { exit bad }'
--
-- Thresholds (psql variables, -v name=value; defaults below):
--   warning_bytes, critical_bytes   retained WAL (current position - restart_lsn);
--                                   walpost's [monitor] defaults, 1 GiB and 8 GiB
--   warning_safe_fraction,          safe_wal_size / (safe_wal_size + retained WAL): the share of
--   critical_safe_fraction          the slot's budget (max_slot_wal_keep_size) still free; 0.50 / 0.20,
--                                   as in deploy/prometheus/alerts.yml. NULL safe_wal_size
--                                   (max_slot_wal_keep_size = -1, unlimited) is not checked.
--   inactive_status                 status of a slot nothing streams from (no walpost running):
--                                   ok, warning (default) or critical
-- wal_status unreserved or lost is always critical. A bad value stops psql with exit code 3.
\set ON_ERROR_STOP on
\if :{?warning_bytes}
\else
\set warning_bytes 1073741824
\endif
\if :{?critical_bytes}
\else
\set critical_bytes 8589934592
\endif
\if :{?warning_safe_fraction}
\else
\set warning_safe_fraction 0.50
\endif
\if :{?critical_safe_fraction}
\else
\set critical_safe_fraction 0.20
\endif
\if :{?inactive_status}
\else
\set inactive_status warning
\endif

WITH params AS (
    SELECT :'warning_bytes'::numeric AS warning_bytes,
           :'critical_bytes'::numeric AS critical_bytes,
           :'warning_safe_fraction'::numeric AS warning_safe_fraction,
           :'critical_safe_fraction'::numeric AS critical_safe_fraction,
           CASE WHEN :'inactive_status' IN ('ok', 'warning', 'critical') THEN :'inactive_status'
                -- any other value stops the query with this text in the error
                ELSE ('inactive_status must be ok, warning or critical, not ' || :'inactive_status')::int::text
           END AS inactive_status,
           -- pg_current_wal_lsn() fails during recovery: on a standby, the replayed position.
           CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() ELSE pg_current_wal_lsn() END AS wal_lsn
),
slots AS (
    SELECT s.slot_name, s.database, s.active, s.active_pid, s.wal_status, s.safe_wal_size,
           pg_wal_lsn_diff(p.wal_lsn, s.restart_lsn)::bigint AS retained_bytes,
           pg_wal_lsn_diff(p.wal_lsn, s.confirmed_flush_lsn)::bigint AS unconfirmed_bytes,
           s.safe_wal_size::numeric / nullif(s.safe_wal_size + pg_wal_lsn_diff(p.wal_lsn, s.restart_lsn), 0)
               AS safe_fraction,
           p.*
    FROM pg_replication_slots s CROSS JOIN params p
    WHERE s.slot_type = 'logical'
),
checks AS (
    SELECT slots.*,
           array_remove(ARRAY[
               CASE WHEN wal_status = 'lost' THEN 'critical: wal_status is lost (runbooks/slot-lost.md)' END,
               CASE WHEN wal_status = 'unreserved'
                    THEN 'critical: wal_status is unreserved, the next checkpoint may invalidate the slot' END,
               CASE WHEN retained_bytes >= critical_bytes
                    THEN format('critical: retains %s of WAL (critical at %s)',
                                pg_size_pretty(retained_bytes), pg_size_pretty(critical_bytes))
                    WHEN retained_bytes >= warning_bytes
                    THEN format('warning: retains %s of WAL (warning at %s)',
                                pg_size_pretty(retained_bytes), pg_size_pretty(warning_bytes)) END,
               CASE WHEN safe_fraction < critical_safe_fraction
                    THEN format('critical: %s%% of the WAL budget left (critical under %s%%)',
                                round(100 * safe_fraction, 1), round(100 * critical_safe_fraction, 1))
                    WHEN safe_fraction < warning_safe_fraction
                    THEN format('warning: %s%% of the WAL budget left (warning under %s%%)',
                                round(100 * safe_fraction, 1), round(100 * warning_safe_fraction, 1)) END,
               CASE WHEN NOT active AND inactive_status <> 'ok'
                    THEN inactive_status || ': no process streams from the slot (is walpost running?)' END
           ], NULL) AS reasons
    FROM slots
)
SELECT slot_name,
       CASE WHEN EXISTS (SELECT 1 FROM unnest(reasons) r WHERE r LIKE 'critical:%') THEN 'critical'
            WHEN EXISTS (SELECT 1 FROM unnest(reasons) r WHERE r LIKE 'warning:%') THEN 'warning'
            ELSE 'ok' END AS status,
       database,
       active,
       active_pid,
       wal_status,
       retained_bytes,
       unconfirmed_bytes,
       safe_wal_size,
       array_to_string(reasons, '; ') AS reasons
FROM checks
ORDER BY slot_name;
