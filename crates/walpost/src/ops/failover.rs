//! `walpost check`, failover part: is the slot going to survive a promotion?
//!
//! Every host of the connection string is visited (whatever `target_session_attrs`
//! says) and classified as primary or standby; then [`evaluate`] (pure) says what is
//! missing for PostgreSQL 17+ failover slots: the slot's `failover` flag, each standby's
//! `sync_replication_slots`, `hot_standby_feedback`, `primary_slot_name` and its
//! synchronized copy of the slot, and the primary's `synchronized_standby_slots` naming
//! each standby's physical slot (without it logical decoding may run ahead of a standby,
//! and after promoting it the slot would be behind what walpost already confirmed).
//! Findings are warnings: walpost runs without them, but a promotion then loses the slot
//! and walpost stops (runbooks/upgrade-and-failover.md).

use replication::{ReplicationClient, TargetSessionAttrs};

use super::check::Check;
use crate::postgres::sql::setting;
use crate::settings::PostgresSettings;

/// What one host told.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HostFacts {
    pub host: String,
    pub server: Result<Server, String>,
}

/// A reachable server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Server {
    /// `server_version_num`, e.g. 170002.
    pub version_num: u32,
    pub role: Role,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Role {
    Primary {
        /// The slot's `failover` flag (17+); `None`: no such slot, or before 17.
        slot_failover: Option<bool>,
        synchronized_standby_slots: Vec<String>,
    },
    Standby {
        sync_replication_slots: bool,
        hot_standby_feedback: bool,
        primary_slot_name: String,
        /// The standby's copy of the slot: `Some(synced)`, or `None` when absent.
        slot_synced: Option<bool>,
    },
}

/// Visits every host of the connection string.
pub(crate) async fn gather(postgres: &PostgresSettings, slot: &str) -> Vec<HostFacts> {
    let mut out = Vec::new();
    for host in &postgres.server.hosts {
        let mut config = postgres.server.pinned_to(host);
        config.target_session_attrs = TargetSessionAttrs::Any;
        let server = match ReplicationClient::connect_sql(&config).await {
            Err(e) => Err(crate::error::PipelineError::from(e).to_string()),
            Ok(mut sql) => {
                let facts = server_facts(&mut sql, slot).await;
                sql.close().await;
                facts
            }
        };
        out.push(HostFacts { host: host.to_string(), server });
    }
    out
}

async fn server_facts(sql: &mut ReplicationClient, slot: &str) -> Result<Server, String> {
    let r = sql
        .simple_query("SELECT pg_catalog.pg_is_in_recovery()::text AS standby, pg_catalog.current_setting('server_version_num') AS v")
        .await
        .map_err(|e| e.to_string())?;
    let version_num: u32 = r.first("v").and_then(|v| v.parse().ok()).unwrap_or(0);
    let standby = r.first("standby") == Some("true");
    let on = |v: Option<String>| v.as_deref() == Some("on");
    let slot_synced = "SELECT synced::text AS v FROM pg_replication_slots WHERE slot_name = $1";
    let slot_failover = "SELECT failover::text AS v FROM pg_replication_slots WHERE slot_name = $1";
    let role = if standby {
        let slot_synced = if version_num >= 170_000 {
            sql.query(slot_synced, &[Some(slot)]).await.ok().and_then(|r| r.first("v").map(|v| v == "true"))
        } else {
            None
        };
        Role::Standby {
            sync_replication_slots: on(setting(sql, "sync_replication_slots").await),
            hot_standby_feedback: on(setting(sql, "hot_standby_feedback").await),
            primary_slot_name: setting(sql, "primary_slot_name").await.unwrap_or_default(),
            slot_synced,
        }
    } else {
        let (slot_failover, synchronized_standby_slots) = if version_num >= 170_000 {
            let failover =
                sql.query(slot_failover, &[Some(slot)]).await.ok().and_then(|r| r.first("v").map(|v| v == "true"));
            let listed = setting(sql, "synchronized_standby_slots").await.unwrap_or_default();
            (
                failover,
                listed.split(',').map(|s| s.trim().trim_matches('"').to_owned()).filter(|s| !s.is_empty()).collect(),
            )
        } else {
            (None, Vec::new())
        };
        Role::Primary { slot_failover, synchronized_standby_slots }
    };
    Ok(Server { version_num, role })
}

/// The failover findings (see the module docs). `failover_flag`: `--slot-failover`.
pub(crate) fn evaluate(hosts: &[HostFacts], slot: &str, failover_flag: bool) -> Vec<Check> {
    let mut out = Vec::new();
    let standbys: Vec<(&str, &Server)> = hosts
        .iter()
        .filter_map(|h| match &h.server {
            Ok(s @ Server { role: Role::Standby { .. }, .. }) => Some((h.host.as_str(), s)),
            _ => None,
        })
        .collect();
    for h in hosts {
        if let Err(e) = &h.server {
            if hosts.len() > 1 {
                out.push(Check::Warn(texts::failover::host_unreachable(&h.host, e)));
            }
        }
    }
    if hosts.len() == 1 {
        out.push(if failover_flag {
            Check::Warn(texts::failover::one_host(hosts.first().map_or("", |h| h.host.as_str())))
        } else {
            Check::Ok("failover: one host in the connection string; no standby to check".into())
        });
    }
    let primary = hosts.iter().find_map(|h| match &h.server {
        Ok(s @ Server { role: Role::Primary { .. }, .. }) => Some((h.host.as_str(), s)),
        _ => None,
    });
    if let Some((host, Server { version_num, role: Role::Primary { slot_failover, synchronized_standby_slots } })) =
        primary
    {
        if *version_num < 170_000 {
            if !standbys.is_empty() || failover_flag {
                out.push(Check::Warn(texts::failover::primary_too_old(host, version_num / 10_000, slot)));
            }
        } else {
            match slot_failover {
                Some(true) => out.push(Check::Ok(format!("failover: slot \"{slot}\" is a failover slot"))),
                Some(false) => out.push(Check::Warn(texts::failover::not_a_failover_slot(slot))),
                None if !failover_flag && !standbys.is_empty() => {
                    out.push(Check::Warn(texts::failover::pass_slot_failover()))
                }
                None => {}
            }
            for (standby, s) in &standbys {
                let Role::Standby { primary_slot_name, .. } = &s.role else { continue };
                if primary_slot_name.is_empty() {
                    continue;
                }
                if synchronized_standby_slots.contains(primary_slot_name) {
                    out.push(Check::Ok(format!(
                        "failover: the primary waits for standby {standby} (synchronized_standby_slots lists {primary_slot_name})"
                    )));
                } else {
                    out.push(Check::Warn(texts::failover::standby_not_waited_for(standby, primary_slot_name)));
                }
            }
        }
    }
    for (standby, s) in &standbys {
        let Role::Standby { sync_replication_slots, hot_standby_feedback, primary_slot_name, slot_synced } = &s.role
        else {
            continue;
        };
        if s.version_num < 170_000 {
            out.push(Check::Warn(texts::failover::standby_too_old(standby, s.version_num / 10_000, slot)));
            continue;
        }
        let mut missing = Vec::new();
        if !sync_replication_slots {
            missing.push("sync_replication_slots = on");
        }
        if !hot_standby_feedback {
            missing.push("hot_standby_feedback = on");
        }
        if primary_slot_name.is_empty() {
            missing.push("primary_slot_name = '<its physical slot on the primary>'");
        }
        if !missing.is_empty() {
            out.push(Check::Warn(texts::failover::standby_not_synchronizing(standby, &missing.join(", "))));
        }
        match slot_synced {
            Some(true) => {
                out.push(Check::Ok(format!("failover: standby {standby} holds a synchronized copy of slot \"{slot}\"")))
            }
            Some(false) => out.push(Check::Warn(texts::failover::standby_slot_not_synchronized(standby, slot))),
            None if missing.is_empty() => out.push(Check::Warn(texts::failover::standby_has_no_copy(standby, slot))),
            None => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn primary(version_num: u32, slot_failover: Option<bool>, listed: &[&str]) -> HostFacts {
        HostFacts {
            host: "a:5432".into(),
            server: Ok(Server {
                version_num,
                role: Role::Primary {
                    slot_failover,
                    synchronized_standby_slots: listed.iter().map(|s| s.to_string()).collect(),
                },
            }),
        }
    }

    fn standby(version_num: u32, sync: bool, slot_synced: Option<bool>) -> HostFacts {
        HostFacts {
            host: "b:5432".into(),
            server: Ok(Server {
                version_num,
                role: Role::Standby {
                    sync_replication_slots: sync,
                    hot_standby_feedback: true,
                    primary_slot_name: "standby1".into(),
                    slot_synced,
                },
            }),
        }
    }

    fn warnings(checks: &[Check]) -> Vec<&str> {
        checks.iter().filter_map(|c| if let Check::Warn(m) = c { Some(m.as_str()) } else { None }).collect()
    }

    #[test]
    fn a_ready_pair_has_no_warning() {
        let checks = evaluate(
            &[primary(170_002, Some(true), &["standby1"]), standby(170_002, true, Some(true))],
            "walpost",
            true,
        );
        assert!(warnings(&checks).is_empty(), "{checks:?}");
        assert_eq!(checks.len(), 3, "{checks:?}");
    }

    #[test]
    fn each_missing_piece_is_named_with_its_fix() {
        let checks = evaluate(&[primary(170_002, Some(false), &[]), standby(170_002, false, None)], "walpost", false);
        let w = warnings(&checks);
        assert!(w.iter().any(|m| m.contains("ALTER_REPLICATION_SLOT walpost (FAILOVER true)")), "{w:?}");
        assert!(w.iter().any(|m| m.contains("synchronized_standby_slots = 'standby1'")), "{w:?}");
        assert!(w.iter().any(|m| m.contains("sync_replication_slots = on")), "{w:?}");
        assert_eq!(w.len(), 3, "no separate 'no copy yet' while the settings are wrong: {w:?}");
    }

    #[test]
    fn before_17_a_promotion_loses_the_slot() {
        let w = evaluate(&[primary(160_004, None, &[]), standby(160_004, false, None)], "walpost", false);
        let w = warnings(&w);
        assert!(w.iter().any(|m| m.contains("primary a:5432 runs PostgreSQL 16")), "{w:?}");
        assert!(w.iter().any(|m| m.contains("standby b:5432 runs PostgreSQL 16")), "{w:?}");
    }

    #[test]
    fn one_host_with_the_failover_flag_says_how_walpost_finds_the_new_primary() {
        let w = evaluate(&[primary(170_002, Some(true), &[])], "walpost", true);
        assert!(warnings(&w).iter().any(|m| m.contains("names one host")), "{w:?}");
        let quiet = evaluate(&[primary(170_002, None, &[])], "walpost", false);
        assert!(warnings(&quiet).is_empty(), "{quiet:?}");
    }

    #[test]
    fn an_unreachable_standby_is_a_warning() {
        let down = HostFacts { host: "b:5432".into(), server: Err("connection refused".into()) };
        let w = evaluate(&[primary(170_002, Some(true), &["standby1"]), down], "walpost", true);
        assert!(warnings(&w).iter().any(|m| m.contains("b:5432 is not reachable")), "{w:?}");
    }
}
