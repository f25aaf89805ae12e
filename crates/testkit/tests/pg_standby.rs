//! Smoke tests of the PostgreSQL standby harness: a real physical standby streaming
//! from a real primary, promotion, and (PostgreSQL 17+) a failover slot that survives
//! the promotion.

use std::time::Instant;

use testkit::{PgOptions, Postgres, StandbyOptions, StopMode};

/// Rows are replicated, the standby is read-only, and after an immediate stop of the
/// primary and `promote()` it is a writable primary on a new timeline. Runs on the
/// default major (`WALPOST_PG_BINDIR`; 14..18).
#[test]
fn standby_streams_and_promotes() {
    let primary = Postgres::start(PgOptions::default()).expect("start primary");
    primary.psql("CREATE TABLE t (id int PRIMARY KEY, v text); INSERT INTO t VALUES (1, 'before');").expect("sql");

    let t0 = Instant::now();
    let sb = Postgres::start_standby(&primary, StandbyOptions::default()).expect("start standby");
    eprintln!("PostgreSQL {} standby created in {:?}", sb.major_version(), t0.elapsed());
    assert!(sb.is_in_recovery().expect("recovery"));
    assert!(!primary.is_in_recovery().expect("recovery"));
    assert_eq!(sb.psql("SELECT v FROM t").expect("select"), "before");
    assert_eq!(sb.psql("SHOW hot_standby_feedback").expect("show"), "on");
    assert_eq!(sb.psql("SHOW wal_level").expect("show"), "logical");
    let slot = sb.primary_slot_name().expect("slot").to_string();
    assert_eq!(sb.psql("SHOW primary_slot_name").expect("show"), slot);
    assert!(sb.psql("SHOW primary_conninfo").expect("show").contains("dbname=walpost"));
    assert_eq!(
        primary
            .psql(&format!("SELECT state FROM pg_stat_replication WHERE application_name = '{slot}'"))
            .expect("pg_stat_replication"),
        "streaming"
    );
    assert_eq!(
        primary
            .psql(&format!("SELECT slot_type, active FROM pg_replication_slots WHERE slot_name = '{slot}'"))
            .expect("slot"),
        "physical|t"
    );

    // A row written on the primary shows up on the standby.
    primary.psql("INSERT INTO t VALUES (2, 'streamed')").expect("insert");
    let lsn = sb.wait_caught_up(&primary).expect("caught up");
    assert_eq!(sb.psql("SELECT v FROM t WHERE id = 2").expect("select"), "streamed", "replayed to {lsn}");
    let e = sb.psql("INSERT INTO t VALUES (3, 'no')").expect_err("standby is read-only");
    assert!(e.to_string().contains("read-only transaction"), "{e}");

    // Failover: the primary dies, the standby takes over on a new timeline.
    primary.stop(StopMode::Immediate).expect("stop primary");
    let t1 = Instant::now();
    sb.promote().expect("promote");
    eprintln!("promoted in {:?}", t1.elapsed());
    assert!(!sb.is_in_recovery().expect("recovery"));
    sb.psql("INSERT INTO t VALUES (3, 'after promotion')").expect("writable after promotion");
    assert_eq!(sb.psql("SELECT count(*) FROM t").expect("count"), "3");
    let wal = sb.psql("SELECT pg_walfile_name(pg_current_wal_lsn())").expect("walfile");
    assert!(wal.starts_with("00000002"), "not on timeline 2: {wal}");
}

/// PostgreSQL 17+ (the default major if it is 17+, else 17 via
/// scripts/fetch-postgres.sh): a logical slot created with `failover => true` on the
/// primary is synchronized to the standby, and after the primary's immediate stop and
/// `promote()` the slot on the new primary decodes the changes after its confirmed
/// position — those written before and after the promotion.
#[test]
fn failover_slot_survives_promotion_pg17() {
    let default_major = testkit::pg_default_bin_dir().ok().and_then(|d| testkit::pg_bin_major(&d));
    let bin_dir = match default_major {
        Some(m) if m >= 17 => testkit::pg_default_bin_dir().expect("bin dir"),
        _ => testkit::pg_bin_dir_for_major(17).expect("PostgreSQL 17 (scripts/fetch-postgres.sh 17)"),
    };
    let primary = Postgres::start(PgOptions { bin_dir: Some(bin_dir), ..PgOptions::default() }).expect("primary");
    let major = primary.major_version();
    assert!(major >= 17, "{major}");
    primary.psql("CREATE TABLE t (id int GENERATED ALWAYS AS IDENTITY PRIMARY KEY, v text)").expect("sql");
    let t0 = Instant::now();
    let sb = Postgres::start_standby(&primary, StandbyOptions::default()).expect("standby");
    let standby_time = t0.elapsed();
    let phys = sb.primary_slot_name().expect("slot").to_string();
    assert_eq!(sb.psql("SHOW sync_replication_slots").expect("show"), "on");
    assert_eq!(primary.psql("SHOW synchronized_standby_slots").expect("show"), phys);
    // A second standby joins synchronized_standby_slots; once it is gone,
    // drop_standby_slot takes it out again and drops its physical slot.
    let sb2 = Postgres::start_standby(&primary, StandbyOptions::default()).expect("second standby");
    let phys2 = sb2.primary_slot_name().expect("slot").to_string();
    assert_eq!(primary.psql("SHOW synchronized_standby_slots").expect("show"), format!("{phys},{phys2}"));
    drop(sb2);
    primary.drop_standby_slot(&phys2).expect("drop_standby_slot");
    assert_eq!(primary.psql("SHOW synchronized_standby_slots").expect("show"), phys);
    assert_eq!(primary.psql("SELECT string_agg(slot_name, ',') FROM pg_replication_slots").expect("slots"), phys);

    // The slot is created after the standby: a slot whose restart_lsn precedes the
    // standby's base copy cannot be synced until it moves past the copy's start.
    primary
        .psql("SELECT pg_create_logical_replication_slot('fo_slot', 'test_decoding', failover => true)")
        .expect("failover slot");
    assert_eq!(
        primary.psql("SELECT failover, synced FROM pg_replication_slots WHERE slot_name = 'fo_slot'").expect("slot"),
        "t|f"
    );
    // Consume a change with a running-xacts record after it, so that the slot's
    // restart_lsn and catalog_xmin move: the standby's sync worker persists a slot only
    // when they are not behind what the standby itself reserved (else it logs "could
    // not synchronize replication slot ... Synchronization could lead to data loss" and
    // naps longer each time, up to 30 s).
    let consume = |value: &str| {
        primary.psql(&format!("INSERT INTO t VALUES (DEFAULT, '{value}')")).expect("insert");
        primary.log_standby_snapshot().expect("standby snapshot");
        let n = primary
            .psql("SELECT count(*) FROM pg_logical_slot_get_changes('fo_slot', NULL, NULL)")
            .expect("get changes on the primary");
        assert_eq!(n, "3", "BEGIN, INSERT, COMMIT");
    };
    consume("consumed before the first sync");

    let t1 = Instant::now();
    let first = sb.wait_slot_synced("fo_slot", &primary).expect("slot synced to the standby");
    let sync_time = t1.elapsed();

    // A later consume on the primary reaches the standby's copy too.
    consume("consumed after the first sync");
    let t2 = Instant::now();
    let second = sb.wait_slot_synced("fo_slot", &primary).expect("slot position synced");
    let update_time = t2.elapsed();
    let on_standby = sb
        .psql("SELECT failover, synced, temporary, confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = 'fo_slot'")
        .expect("slot on standby");
    eprintln!(
        "PostgreSQL {major}: standby {standby_time:?}; fo_slot synced in {sync_time:?} (to {first}), \
         a later consume in {update_time:?} (to {second}); on the standby: \
         failover|synced|temporary|confirmed = {on_standby}"
    );
    // A synced slot cannot be used on the standby.
    let e = sb.psql("SELECT count(*) FROM pg_logical_slot_peek_changes('fo_slot', NULL, NULL)").expect_err("unusable");
    eprintln!("peek on the standby before promotion: {e}");

    // Written after the last consume: must be decoded from the slot after failover.
    primary.psql("INSERT INTO t VALUES (DEFAULT, 'not consumed yet')").expect("insert");
    sb.wait_caught_up(&primary).expect("caught up");
    primary.stop(StopMode::Immediate).expect("stop primary");
    let t2 = Instant::now();
    sb.promote().expect("promote");
    let promote_time = t2.elapsed();

    let slot = sb
        .psql("SELECT slot_type, failover, synced, temporary, conflicting FROM pg_replication_slots WHERE slot_name = 'fo_slot'")
        .expect("slot after promotion");
    eprintln!("after promotion ({promote_time:?}): slot_type|failover|synced|temporary|conflicting = {slot}");
    assert!(slot.starts_with("logical|t|"), "{slot}");
    sb.psql("INSERT INTO t VALUES (DEFAULT, 'after promotion')").expect("insert on new primary");
    let peek =
        sb.psql("SELECT data FROM pg_logical_slot_peek_changes('fo_slot', NULL, NULL)").expect("peek on new primary");
    eprintln!("peek on the new primary:\n{peek}");
    assert!(!peek.contains("'consumed"), "already consumed change decoded again:\n{peek}");
    assert!(peek.contains("'not consumed yet'"), "{peek}");
    assert!(peek.contains("after promotion"), "{peek}");
    let got = sb.psql("SELECT count(*) FROM pg_logical_slot_get_changes('fo_slot', NULL, NULL)").expect("get");
    assert_eq!(got, "6", "two transactions of BEGIN, INSERT, COMMIT");
}
