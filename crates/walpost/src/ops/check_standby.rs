//! `walpost check`, decoding on a standby: what the topology needs, each
//! missing piece with its fix.
//!
//! [`gather`] asks the decoding server and the primary; [`evaluate`] (pure) judges:
//! - PostgreSQL 16+ on the standby (logical decoding during recovery);
//! - `hot_standby_feedback = on` and a physical slot (`primary_slot_name`) that exists on
//!   the primary: without both, VACUUM on the primary removes catalog rows the standby's
//!   logical slot needs, and a recovery conflict invalidates the slot;
//! - `max_standby_streaming_delay`: decoding sees only replayed WAL, so a standby query
//!   that holds replay back holds walpost's events back as long;
//! - the primary: reachable for walpost's writes, `wal_level = logical` (else the
//!   standby's slots are invalidated), and `pg_log_standby_snapshot()` executable (slot
//!   creation then takes a second instead of up to minutes on a quiet primary).

use replication::ReplicationClient;

use super::check::Check;
use crate::postgres::catalog;
use crate::postgres::topology;
use crate::settings::PostgresSettings;

/// What the decoding server said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct StandbyFacts {
    /// `server_version_num`.
    pub version_num: u32,
    pub in_recovery: bool,
    pub hot_standby_feedback: bool,
    pub primary_slot_name: String,
    /// As SHOW prints it (`30s`, `-1`).
    pub max_standby_streaming_delay: String,
    /// The primary, or why it could not be asked.
    pub primary: Result<PrimaryFacts, String>,
}

/// What the primary said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PrimaryFacts {
    pub host: String,
    pub wal_level: String,
    /// The standby's physical slot (`primary_slot_name`) exists there.
    pub physical_slot: bool,
    pub may_log_standby_snapshot: bool,
}

/// Asks the decoding server (`sql`) and the primary.
pub(crate) async fn gather(sql: &mut ReplicationClient, postgres: &PostgresSettings) -> Result<StandbyFacts, String> {
    let own = catalog::recovery_settings(sql).await.map_err(|e| e.to_string())?;
    let primary = match topology::connect_writer(postgres).await {
        Err(e) => Err(e.to_string()),
        Ok(mut primary) => {
            let host = primary.connected_host().label();
            let asked = catalog::primary_for_standby(&mut primary, &own.primary_slot_name).await;
            primary.close().await;
            asked.map_err(|e| e.to_string()).map(|p| PrimaryFacts {
                host,
                wal_level: p.wal_level,
                physical_slot: p.physical_slot,
                may_log_standby_snapshot: p.may_log_standby_snapshot,
            })
        }
    };
    Ok(StandbyFacts {
        version_num: own.version_num,
        in_recovery: own.in_recovery,
        hot_standby_feedback: own.hot_standby_feedback,
        primary_slot_name: own.primary_slot_name,
        max_standby_streaming_delay: own.max_standby_streaming_delay,
        primary,
    })
}

/// See the module docs.
pub(crate) fn evaluate(f: &StandbyFacts) -> Vec<Check> {
    let mut out = Vec::new();
    if !f.in_recovery {
        out.push(Check::Warn(texts::standby::CHECK_ON_A_PRIMARY.into()));
        return out;
    }
    if f.version_num < 160_000 {
        out.push(Check::Fail(texts::standby::check_too_old(f.version_num / 10_000)));
        return out;
    }
    out.push(Check::Ok(format!(
        "standby decoding: the slot is read on a standby (PostgreSQL {})",
        f.version_num / 10_000
    )));
    if f.hot_standby_feedback {
        out.push(Check::Ok("standby decoding: hot_standby_feedback = on".into()));
    } else {
        out.push(Check::Fail(texts::standby::check_feedback_off()));
    }
    if f.primary_slot_name.is_empty() {
        out.push(Check::Fail(texts::standby::check_no_physical_slot()));
    }
    match f.max_standby_streaming_delay.as_str() {
        "-1" => out.push(Check::Warn(texts::standby::CHECK_UNBOUNDED_DELAY.into())),
        d => out.push(Check::Ok(format!(
            "standby decoding: max_standby_streaming_delay = {d} (a standby query may hold replay, and walpost's events, back this long)"
        ))),
    }
    match &f.primary {
        Err(e) => out.push(Check::Warn(texts::standby::check_primary_unreachable(e))),
        Ok(p) => {
            out.push(Check::Ok(format!("standby decoding: walpost writes on the primary {}", p.host)));
            if p.wal_level != "logical" {
                out.push(Check::Fail(texts::standby::check_primary_wal_level(&p.host, &p.wal_level)));
            }
            if !f.primary_slot_name.is_empty() && !p.physical_slot {
                out.push(Check::Fail(texts::standby::check_primary_lacks_physical_slot(&f.primary_slot_name, &p.host)));
            }
            if !p.may_log_standby_snapshot {
                out.push(Check::Warn(texts::standby::CHECK_MAY_NOT_LOG_STANDBY_SNAPSHOT.into()));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn good() -> StandbyFacts {
        StandbyFacts {
            version_num: 170_002,
            in_recovery: true,
            hot_standby_feedback: true,
            primary_slot_name: "standby1".into(),
            max_standby_streaming_delay: "30s".into(),
            primary: Ok(PrimaryFacts {
                host: "p:5432".into(),
                wal_level: "logical".into(),
                physical_slot: true,
                may_log_standby_snapshot: true,
            }),
        }
    }

    fn failed(checks: &[Check]) -> Vec<String> {
        checks.iter().filter(|c| !matches!(c, Check::Ok(_))).map(Check::line).collect()
    }

    #[test]
    fn a_complete_topology_passes() {
        assert_eq!(failed(&evaluate(&good())), Vec::<String>::new());
    }

    #[test]
    fn each_missing_piece_is_named_with_its_fix() {
        let cases: Vec<(StandbyFacts, &str)> = vec![
            (StandbyFacts { version_num: 150_004, ..good() }, "FAIL  standby decoding: the standby runs PostgreSQL 15"),
            (StandbyFacts { hot_standby_feedback: false, ..good() }, "ALTER SYSTEM SET hot_standby_feedback = on"),
            (StandbyFacts { primary_slot_name: String::new(), ..good() }, "primary_slot_name is empty"),
            (
                StandbyFacts { max_standby_streaming_delay: "-1".into(), ..good() },
                "warn  standby decoding: max_standby_streaming_delay = -1",
            ),
            (StandbyFacts { primary: Err("down".into()), ..good() }, "the primary cannot be reached (down)"),
            (StandbyFacts { in_recovery: false, ..good() }, "settled on a primary"),
        ];
        for (facts, expected) in cases {
            let lines = failed(&evaluate(&facts));
            assert!(lines.iter().any(|l| l.contains(expected)), "{expected} in {lines:?}");
        }
        let primary = |p: PrimaryFacts| StandbyFacts { primary: Ok(p), ..good() };
        let base = match good().primary {
            Ok(p) => p,
            Err(_) => unreachable!("good() has a primary"),
        };
        for (facts, expected) in [
            (primary(PrimaryFacts { wal_level: "replica".into(), ..base.clone() }), "has wal_level = replica"),
            (primary(PrimaryFacts { physical_slot: false, ..base.clone() }), "has no such physical slot"),
            (
                primary(PrimaryFacts { may_log_standby_snapshot: false, ..base }),
                "GRANT EXECUTE ON FUNCTION pg_log_standby_snapshot()",
            ),
        ] {
            let lines = failed(&evaluate(&facts));
            assert!(lines.iter().any(|l| l.contains(expected)), "{expected} in {lines:?}");
        }
    }
}
