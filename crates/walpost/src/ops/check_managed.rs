//! `walpost check` on a managed PostgreSQL service: which one it looks like, and the
//! service's own setting for logical decoding (a managed server refuses `ALTER SYSTEM SET
//! wal_level`, so the generic fix does not apply there).
//!
//! [`recognise`] is pure: it reads the names of the server's settings (those in
//! `pg_settings`, and a few known names `current_setting(name, true)` answers, which also
//! finds one set per database or role) and roles that only one service has: `rds.*` and
//! `rds_superuser`, `aurora_version()` (Aurora has `rds.*` too, so it is asked first),
//! `cloudsql.*` and `cloudsqlsuperuser`, `alloydb.*` and `alloydbsuperuser`, `azure.*` and
//! `azure_pg_admin`, `neon.*` and `neon_superuser`, `supautils.*` and `supabase_admin`.
//! The settings each service needs are in docs/standby.md ("Managed PostgreSQL").

use replication::ReplicationClient;

use super::check::Check;
// What the server's catalog says (names only), read by `postgres::catalog`.
use crate::postgres::catalog::{self, ServiceMarkers as Catalog};

/// A managed PostgreSQL service walpost recognises.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Provider {
    AmazonRds,
    AmazonAurora,
    CloudSql,
    AlloyDb,
    AzureFlexible,
    Neon,
    Supabase,
}

impl Provider {
    fn name(self) -> &'static str {
        match self {
            Provider::AmazonRds => "Amazon RDS for PostgreSQL",
            Provider::AmazonAurora => "Amazon Aurora PostgreSQL",
            Provider::CloudSql => "Google Cloud SQL for PostgreSQL",
            Provider::AlloyDb => "Google AlloyDB",
            Provider::AzureFlexible => "Azure Database for PostgreSQL",
            Provider::Neon => "Neon",
            Provider::Supabase => "Supabase",
        }
    }

    /// How the service turns logical decoding on.
    fn enable(self) -> &'static str {
        match self {
            Provider::AmazonRds => "set the static parameter rds.logical_replication = 1 in the instance's custom DB parameter group (and its read replica's, to decode there), then reboot",
            Provider::AmazonAurora => "set rds.logical_replication = 1 in the cluster's custom DB cluster parameter group, then reboot the writer (decode on the writer: Aurora Replicas are not PostgreSQL standbys)",
            Provider::CloudSql => "set the database flag cloudsql.logical_decoding = on (the instance restarts)",
            Provider::AlloyDb => "set the database flag alloydb.logical_decoding = on (the instance restarts)",
            Provider::AzureFlexible => "set the server parameter wal_level = logical, save, and restart the server",
            Provider::Neon => "enable logical replication in the project's settings (it sets wal_level = logical, restarts the computes and cannot be turned off again)",
            Provider::Supabase => "Supabase runs with wal_level = logical: ask its support what changed",
        }
    }
}

/// See the module docs.
pub(crate) fn recognise(c: &Catalog) -> Option<Provider> {
    let setting = |prefix: &str| c.settings.iter().any(|s| s.starts_with(prefix));
    let role = |name: &str| c.roles.iter().any(|r| r == name);
    if c.aurora_version {
        Some(Provider::AmazonAurora)
    } else if setting("rds.") || role("rds_superuser") {
        Some(Provider::AmazonRds)
    } else if setting("cloudsql.") || role("cloudsqlsuperuser") {
        Some(Provider::CloudSql)
    } else if setting("alloydb.") || role("alloydbsuperuser") {
        Some(Provider::AlloyDb)
    } else if setting("azure.") || role("azure_pg_admin") {
        Some(Provider::AzureFlexible)
    } else if setting("neon.") || role("neon_superuser") {
        Some(Provider::Neon)
    } else if setting("supautils.") || role("supabase_admin") {
        Some(Provider::Supabase)
    } else {
        None
    }
}

/// The check's lines: which service it looks like, and, with `wal_level` not logical,
/// the service's way to change it.
pub(crate) fn evaluate(c: &Catalog, wal_level: &str) -> Vec<Check> {
    let Some(p) = recognise(c) else { return Vec::new() };
    let mut out = vec![Check::Ok(format!("managed PostgreSQL: this looks like {}", p.name()))];
    if wal_level != "logical" {
        out.push(Check::Fail(format!(
            "managed PostgreSQL: logical decoding is off on {} (wal_level = {wal_level}): {}; see docs/standby.md (Managed PostgreSQL)",
            p.name(),
            p.enable()
        )));
    }
    out
}

/// Reads what [`recognise`] needs, and `wal_level`.
pub(crate) async fn gather(sql: &mut ReplicationClient) -> Result<(Catalog, String), String> {
    catalog::service_markers(sql).await.map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(settings: &[&str], roles: &[&str], aurora: bool) -> Catalog {
        Catalog {
            settings: settings.iter().map(|s| (*s).to_owned()).collect(),
            roles: roles.iter().map(|s| (*s).to_owned()).collect(),
            aurora_version: aurora,
        }
    }

    #[test]
    fn services_are_told_apart_by_their_own_settings_and_roles() {
        assert_eq!(recognise(&with(&["rds.extensions"], &["rds_superuser"], false)), Some(Provider::AmazonRds));
        assert_eq!(recognise(&with(&["rds.extensions"], &["rds_superuser"], true)), Some(Provider::AmazonAurora));
        assert_eq!(recognise(&with(&["cloudsql.logical_decoding"], &[], false)), Some(Provider::CloudSql));
        assert_eq!(recognise(&with(&[], &["azure_pg_admin"], false)), Some(Provider::AzureFlexible));
        assert_eq!(recognise(&with(&["neon.timeline_id"], &[], false)), Some(Provider::Neon));
        assert_eq!(recognise(&with(&["alloydb.logical_decoding"], &[], false)), Some(Provider::AlloyDb));
        assert_eq!(recognise(&with(&[], &["supabase_admin"], false)), Some(Provider::Supabase));
        assert_eq!(recognise(&with(&["pg_stat_statements.max"], &[], false)), None, "a self-run server");
    }

    #[test]
    fn logical_decoding_off_names_the_services_own_setting() {
        let lines: Vec<String> =
            evaluate(&with(&["rds.extensions"], &[], false), "replica").iter().map(Check::line).collect();
        assert_eq!(lines[0], "ok    managed PostgreSQL: this looks like Amazon RDS for PostgreSQL");
        assert!(lines[1].starts_with("FAIL  managed PostgreSQL: logical decoding is off on Amazon RDS for PostgreSQL (wal_level = replica): set the static parameter rds.logical_replication = 1"), "{}", lines[1]);
        let cloud: Vec<String> =
            evaluate(&with(&["cloudsql.iam_authentication"], &[], false), "replica").iter().map(Check::line).collect();
        assert!(cloud[1].contains("cloudsql.logical_decoding = on"), "{cloud:?}");
        assert_eq!(evaluate(&with(&["rds.extensions"], &[], false), "logical").len(), 1, "on: only which service");
        assert!(evaluate(&with(&[], &[], false), "replica").is_empty(), "a self-run server: the generic check says it");
    }
}
