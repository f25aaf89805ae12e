//! `walpost check`: every preflight check against the live server and brokers, one
//! line each (`ok`, `warn` or `FAIL`, then what was found and, on failure, the fix).
//! Every check runs even when an earlier one fails. Connection strings are printed
//! redacted.

use kafka_common::reach;
use rdkafka::admin::{AdminClient, AdminOptions, ConfigResource, OwnedResourceSpecifier, ResourceSpecifier};
use rdkafka::client::DefaultClientContext;
use rdkafka::metadata::Metadata;
use replication::ReplicationClient;

use crate::error::PipelineError;
use crate::kafka::config::client_config;
use crate::postgres::catalog::Capacity;
use crate::postgres::sql::{ident, setting};
use crate::postgres::{catalog, preflight};
use crate::settings::{KafkaSettings, OnPermanentError, Settings, SourceSettings};
use slot_alarm::unreachable_thresholds;

/// One line of `walpost check` (and of `walpost check inbox`).
pub use service::check::{any_failed, Check};

fn from_result(ok: String, r: Result<(), PipelineError>) -> Check {
    match r {
        Ok(()) => Check::Ok(ok),
        Err(e) => Check::Fail(e.to_string()),
    }
}

/// Runs every check; prints as it goes; returns all results.
pub async fn check(s: &Settings) -> Vec<Check> {
    let mut out = Vec::new();
    let mut emit = |c: Check| {
        println!("{}", c.line());
        out.push(c);
    };
    match ReplicationClient::connect_sql(&s.postgres.server).await {
        Err(e) => emit(Check::Fail(format!("connect to {}: {}", s.postgres.server.redacted(), PipelineError::from(e)))),
        Ok(mut sql) => {
            let version = sql.parameter("server_version").unwrap_or("?").to_owned();
            emit(Check::Ok(format!("connect to {} (PostgreSQL {version})", s.postgres.server.redacted())));
            for c in postgres_checks(&mut sql, s).await {
                emit(c);
            }
            if let Ok((catalog, wal_level)) = super::check_managed::gather(&mut sql).await {
                super::check_managed::evaluate(&catalog, &wal_level).into_iter().for_each(&mut emit);
            }
            if s.postgres.standby_decoding() {
                match super::check_standby::gather(&mut sql, &s.postgres).await {
                    Ok(facts) => super::check_standby::evaluate(&facts).into_iter().for_each(&mut emit),
                    Err(e) => emit(Check::Fail(format!("standby decoding: cannot read the standby's settings: {e}"))),
                }
            }
            sql.close().await;
        }
    }
    // Failover slots are a primary's: a standby's own slot is not synchronized anywhere.
    if !s.postgres.standby_decoding() {
        for c in super::failover::evaluate(
            &super::failover::gather(&s.postgres, &s.source.slot).await,
            &s.source.slot,
            s.source.slot_failover,
        ) {
            emit(c);
        }
    }
    match ReplicationClient::connect(&s.postgres.server).await {
        Ok(repl) => {
            emit(Check::Ok("replication connection (replication=database) accepted".into()));
            repl.close().await;
        }
        Err(e) => {
            let hba = if e.sqlstate() == Some(replication::sqlstate::INVALID_AUTHORIZATION_SPECIFICATION) {
                "; pg_hba.conf needs a line for this database, this role and this client address (a logical replication connection matches the database name, not the 'replication' keyword: see docs/least-privilege.md)"
            } else {
                ""
            };
            emit(Check::Fail(format!("replication connection refused: {}{hba}", PipelineError::from(e))))
        }
    }
    for c in router_checks(&s.source) {
        emit(c);
    }
    let kafka = match s.kafka() {
        Ok(kafka) => kafka_checks(kafka, &s.source).await,
        Err(e) => vec![Check::Fail(e.to_string())],
    };
    for c in kafka {
        emit(c);
    }
    if let Some(r) = &s.registry {
        emit(registry_check(r).await);
    }
    out
}

/// `[registry]`: does the schema registry answer walpost as configured?
async fn registry_check(r: &crate::settings::RegistrySettings) -> Check {
    match registry::ask(r).await {
        registry::Asked::Answers(n) => Check::Ok(format!("schema registry at {} answers ({n} subjects)", r.url)),
        registry::Asked::Refuses(e) => Check::Fail(e.to_string()),
        registry::Asked::Unreachable(e) => Check::Fail(format!(
            "{e}: walpost run would start, but every event whose subject it has not cached waits until the registry answers"
        )),
    }
}

/// Whether any check failed.
async fn postgres_checks(sql: &mut ReplicationClient, s: &Settings) -> Vec<Check> {
    let mut out = Vec::new();
    out.push(from_result("wal_level = logical".into(), preflight::check_wal_level(sql).await));
    for capacity in [Capacity::Slots, Capacity::Senders] {
        let name = capacity.setting();
        let max: i64 = setting(sql, name).await.and_then(|v| v.parse().ok()).unwrap_or(0);
        let used: i64 = catalog::in_use(sql, capacity).await.unwrap_or(0);
        out.push(if used < max {
            Check::Ok(format!("{name} = {max} ({used} in use)"))
        } else {
            Check::Fail(format!(
                "{name} = {max} and {used} are in use: raise {name} in postgresql.conf and restart PostgreSQL"
            ))
        });
    }
    out.push(from_result("role has REPLICATION".into(), preflight::check_role(sql).await));
    let table = s.source.table();
    match catalog::may_select(sql, table).await {
        Ok(Some(true)) => out.push(Check::Ok(format!("SELECT on {table}"))),
        Ok(Some(false)) => out.push(Check::Fail(format!(
            "the role cannot SELECT from {table}: GRANT USAGE ON SCHEMA {} TO <role>; GRANT SELECT ON {} TO <role>",
            ident(&table.schema),
            table.quoted()
        ))),
        // The table is missing (the next check says so) or the query failed.
        _ => {}
    }
    out.push(from_result(
        format!("table {table} has the mapped columns"),
        preflight::check_tables(sql, &s.postgres, &s.source).await,
    ));
    if s.source.messages.is_some() {
        out.push(from_result(
            "[messages]: only allowed roles can execute pg_logical_emit_message".into(),
            preflight::check_emit_message_rights(sql, &s.source).await,
        ));
    }
    if let Some(signal) = &s.source.signal_table {
        out.push(from_result(
            format!("signal table {signal}: only allowed roles can insert signals"),
            preflight::check_signal_rights(sql, &s.source).await,
        ));
    }
    let publication = &s.source.publication;
    out.push(match catalog::publication_state(sql, &s.source).await {
        Ok(catalog::Publication::Missing) => Check::Warn(format!(
            "publication \"{publication}\" does not exist: walpost run creates it (needs ownership of {table})"
        )),
        Ok(catalog::Publication::Ready) => Check::Ok(format!("publication \"{publication}\" publishes inserts of {table}")),
        Ok(catalog::Publication::ReadyForAllTables) => Check::Warn(format!(
            "publication \"{publication}\" is FOR ALL TABLES: every table's changes are decoded and sent, and only {table} is published"
        )),
        Err(e) => Check::Fail(e.to_string()),
    });
    let slot = &s.source.slot;
    out.push(match catalog::slot_row(sql, slot).await {
        Ok(None) => Check::Warn(format!("replication slot \"{slot}\" does not exist: walpost run creates it")),
        Ok(Some(row)) => match preflight::check_slot(&row, &s.postgres, &s.source) {
            Ok(()) => Check::Ok(format!(
                "replication slot \"{slot}\": logical pgoutput, wal_status {}",
                row.wal_status.as_deref().unwrap_or("?")
            )),
            // Streamed from right now: the running walpost (this check does not wait).
            Err(e) if e.is_transient() => match row.active_pid {
                Some(pid) => Check::Ok(format!(
                    "replication slot \"{slot}\": logical pgoutput, wal_status {}, streamed by server process {pid} (a running walpost)",
                    row.wal_status.as_deref().unwrap_or("?")
                )),
                None => Check::Warn(e.to_string()),
            },
            Err(e) => Check::Fail(e.to_string()),
        },
        Err(e) => Check::Fail(e.to_string()),
    });
    let keep = setting(sql, "max_slot_wal_keep_size").await;
    match keep.as_deref() {
        Some("-1") => out.push(Check::Warn(texts::check::UNLIMITED_WAL_KEEP.into())),
        Some(v) => out.push(Check::Ok(format!("max_slot_wal_keep_size = {v}"))),
        None => out.push(Check::Warn("max_slot_wal_keep_size could not be read (PostgreSQL 13+)".into())),
    }
    let keep_bytes = match keep.as_deref() {
        Some("-1") | None => None,
        Some(v) => catalog::size_bytes(sql, v).await,
    };
    for why in unreachable_thresholds(&s.monitor.thresholds, keep_bytes) {
        out.push(Check::Fail(why));
    }
    match setting(sql, "idle_in_transaction_session_timeout").await.as_deref() {
        Some("0") => out.push(Check::Warn(texts::check::NO_IDLE_TRANSACTION_TIMEOUT.into())),
        Some(v) => out.push(Check::Ok(format!("idle_in_transaction_session_timeout = {v}"))),
        None => {}
    }
    // pg_stat_activity shows xact_start of other roles' sessions only to these.
    let sees_all = catalog::sees_every_session(sql).await;
    if let Some(crate::settings::Delivery::ExactlyOnce(e)) = s.kafka.as_ref().map(|k| &k.delivery) {
        out.push(progress_check(sql, &s.source, &e.progress_topic).await);
    }
    match sees_all {
        Some(true) => out.push(Check::Ok("the role sees every session's transactions (long-transaction alarm)".into())),
        Some(false) => out.push(Check::Warn(texts::check::SESSIONS_HIDDEN.into())),
        None => {}
    }
    out
}

/// Exactly-once: whether progress records can be signed (the key lives in the lineage
/// table), and how to keep other clients from writing the progress topic.
async fn progress_check(sql: &mut ReplicationClient, source: &SourceSettings, topic: &str) -> Check {
    let table = crate::postgres::lineage::table_name(source);
    let acl = texts::exactly_once::check_progress_acl(topic);
    match catalog::may_select_and_update(sql, &table).await {
        Some(true) => Check::Ok(texts::exactly_once::check_progress_signed(topic, &table, &acl)),
        _ => Check::Warn(texts::exactly_once::check_progress_unsignable(topic, &table, &acl)),
    }
}

fn router_checks(source: &SourceSettings) -> Vec<Check> {
    let mut out = Vec::new();
    for outbox in &source.outboxes {
        match router::TopicGuard::from_config(&outbox.router) {
            Ok(guard) if guard.allows_any() => out.push(Check::Warn(format!(
                "topics.allow for {} is \"*\": a row can route its event to any topic but Kafka's internal ones; list the allowed prefixes instead",
                outbox.table
            ))),
            Ok(_) => {}
            Err(e) => out.push(Check::Fail(e.to_string())),
        }
    }
    out
}

async fn kafka_checks(kafka: &KafkaSettings, source: &SourceSettings) -> Vec<Check> {
    let mut out = Vec::new();
    let brokers = &kafka.brokers;
    // The producer's own security settings (TLS, SASL), not a bare client.
    let admin: AdminClient<DefaultClientContext> = match client_config(brokers, &kafka.properties)
        .map_err(|e| e.to_string())
        .and_then(|mut c| reach::for_a_check(&mut c).create().map_err(|e| e.to_string()))
    {
        Ok(a) => a,
        Err(e) => {
            out.push(Check::Fail(format!("Kafka client for {brokers}: {e}")));
            return out;
        }
    };
    let (admin, md, ()) = match reach::metadata(admin, brokers, AdminClient::inner, |_| ()).await {
        Ok(fetched) => fetched,
        Err(e) => {
            out.push(Check::Fail(e));
            return out;
        }
    };
    out.push(Check::Ok(format!("Kafka at {brokers}: {} broker(s)", md.brokers().len())));
    let prefix = routed_prefix(source.router());
    let present = md.topics().iter().filter(|t| !prefix.is_empty() && t.name().starts_with(&prefix)).count();
    // One broker's configuration (None: the brokers refuse DescribeConfigs): whether
    // topics are created on first use, and the defaults such topics get.
    let broker_config = match md.brokers().first() {
        Some(b) => admin
            .describe_configs(&[ResourceSpecifier::Broker(b.id())], &AdminOptions::new())
            .await
            .ok()
            .and_then(|r| r.into_iter().next())
            .and_then(|r| r.ok()),
        None => None,
    };
    let auto_create = broker_config.as_ref().and_then(|c| c.get("auto.create.topics.enable")?.value.clone());
    out.push(topics_check(auto_create.as_deref(), present, &prefix));
    out.extend(durability_checks(kafka, source, &admin, &md, broker_config.as_ref()).await);
    out
}

/// The most topics `walpost check` describes one by one; more are summarised.
const MAX_DESCRIBED_TOPICS: usize = 200;

/// The durability warnings: every existing topic walpost writes to (routed topics and the
/// dead-letter topic), and the brokers' defaults for those not created yet.
async fn durability_checks(
    kafka: &KafkaSettings,
    source: &SourceSettings,
    admin: &AdminClient<DefaultClientContext>,
    md: &Metadata,
    broker_config: Option<&ConfigResource>,
) -> Vec<Check> {
    let mut prefixes: Vec<String> = source.outboxes.iter().map(|o| routed_prefix(&o.router)).collect();
    if let Some(m) = &source.messages {
        prefixes.push(routed_prefix(&m.router));
    }
    let dead_letter = (kafka.on_permanent_error == OnPermanentError::DeadLetter).then_some(&kafka.dead_letter_topic);
    let mut topics: Vec<(String, Option<i64>)> = md
        .topics()
        .iter()
        .filter(|t| {
            prefixes.iter().any(|p| !p.is_empty() && t.name().starts_with(p.as_str()))
                || dead_letter.is_some_and(|d| d == t.name())
        })
        .map(|t| {
            // The smallest replica count over the partitions: the weakest one decides.
            let rf = t.partitions().iter().map(|p| p.replicas().len() as i64).min();
            (t.name().to_owned(), rf)
        })
        .collect();
    topics.sort();
    topics.truncate(MAX_DESCRIBED_TOPICS);
    let specifiers: Vec<ResourceSpecifier<'_>> = topics.iter().map(|(n, _)| ResourceSpecifier::Topic(n)).collect();
    let described = if specifiers.is_empty() {
        Vec::new()
    } else {
        admin.describe_configs(&specifiers, &AdminOptions::new()).await.unwrap_or_default()
    };
    let mut found = Vec::new();
    for (name, rf) in &topics {
        let min_isr = described
            .iter()
            .filter_map(|r| r.as_ref().ok())
            .find(|c| matches!(&c.specifier, OwnedResourceSpecifier::Topic(t) if t == name))
            .and_then(|c| c.get("min.insync.replicas").and_then(|e| e.value.as_deref()?.parse().ok()));
        found.push((name.clone(), Durability { replication_factor: *rf, min_insync_replicas: min_isr }));
    }
    // Topics created on first use (a new route value, the dead-letter topic before its
    // first record) get the brokers' defaults.
    let dead_letter_missing = dead_letter.is_some_and(|d| !topics.iter().any(|(n, _)| n == d));
    let defaults = broker_config.map(|c| {
        let get = |k: &str| c.get(k).and_then(|e| e.value.as_deref()?.parse().ok());
        Durability {
            replication_factor: get("default.replication.factor"),
            min_insync_replicas: get("min.insync.replicas"),
        }
    });
    durability_decision(&found, defaults.as_ref(), found.is_empty() || dead_letter_missing)
}

/// The literal start of every topic a router can produce (`""` when it starts with the
/// route value: then no prefix narrows it down).
fn routed_prefix(router: &router::RouterConfig) -> String {
    router.topic_pattern.split(router::ROUTED_BY_VALUE).next().unwrap_or("").to_owned()
}

/// Replication settings of a topic, or of the brokers for topics created on first use;
/// `None` where the brokers did not say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Durability {
    pub replication_factor: Option<i64>,
    pub min_insync_replicas: Option<i64>,
}

/// The durability lines of `walpost check`: a warning for each topic whose replication
/// factor or `min.insync.replicas` is 1 (walpost produces with acks=all, which waits for
/// `min.insync.replicas` copies only: at 1, an acknowledged event can live on one disk),
/// one line for the healthy ones, and, when `defaults_matter` (topics still to be created),
/// the same judgement of the brokers' defaults, or that it cannot be told.
pub fn durability_decision(
    topics: &[(String, Durability)],
    defaults: Option<&Durability>,
    defaults_matter: bool,
) -> Vec<Check> {
    let mut out = Vec::new();
    let mut sound = 0;
    for (name, d) in topics {
        match weakness(d) {
            Some(weak) => out.push(Check::Warn(texts::kafka::durability_warning(name, &weak))),
            None if d.min_insync_replicas.is_none() => out.push(Check::Warn(format!(
                "durability: topic {name} has replication factor {}, and its min.insync.replicas could not be read (DescribeConfigs refused): with acks=all, make sure it is at least 2",
                d.replication_factor.map_or("?".to_owned(), |rf| rf.to_string())
            ))),
            None => sound += 1,
        }
    }
    if sound > 0 {
        out.push(Check::Ok(format!(
            "durability: {sound} topic(s) with replication factor >= 2 and min.insync.replicas >= 2 (acks=all)"
        )));
    }
    if defaults_matter {
        match defaults {
            Some(d) => match weakness(d) {
                Some(weak) => out.push(Check::Warn(texts::kafka::defaults_warning(&weak))),
                None if d.replication_factor.is_some() && d.min_insync_replicas.is_some() => out.push(Check::Ok(
                    "durability: topics created on first use get default.replication.factor >= 2 and min.insync.replicas >= 2".into(),
                )),
                None => out.push(Check::Warn(DEFAULTS_UNKNOWN.into())),
            },
            None => out.push(Check::Warn(DEFAULTS_UNKNOWN.into())),
        }
    }
    out
}

const DEFAULTS_UNKNOWN: &str = "durability: cannot tell what replication factor and min.insync.replicas topics created on first use get (the brokers did not answer DescribeConfigs): create the outbox topics beforehand with replication factor 3 and min.insync.replicas 2";

/// What is too weak about `d` ("replication factor 1", "min.insync.replicas 1", both).
fn weakness(d: &Durability) -> Option<String> {
    let rf = d.replication_factor.filter(|&n| n < 2).map(|n| format!("replication factor {n}"));
    let isr = d.min_insync_replicas.filter(|&n| n < 2).map(|n| format!("min.insync.replicas {n}"));
    match (rf, isr) {
        (Some(a), Some(b)) => Some(format!("{a} and {b}")),
        (a, b) => a.or(b),
    }
}

/// Whether routed topics can be written: `auto_create` is the brokers'
/// `auto.create.topics.enable` (`None`: they did not say), `present` how many topics
/// match `prefix`.
fn topics_check(auto_create: Option<&str>, present: usize, prefix: &str) -> Check {
    match auto_create {
        Some("true") => {
            Check::Ok(format!("topics: the brokers create them on first use ({present} already match {prefix}*)"))
        }
        Some(_) if present == 0 => Check::Fail(format!(
            "topics: no topic matches {prefix}* and the brokers do not create topics on first use (auto.create.topics.enable = false): create the topics or enable it"
        )),
        Some(_) => Check::Warn(format!(
            "topics: auto.create.topics.enable is off; {present} topic(s) match {prefix}*: create any other routed topic before its first event"
        )),
        // Brokers that refuse DescribeConfigs (no DESCRIBE_CONFIGS on the cluster).
        None => Check::Warn(format!(
            "topics: whether the brokers create topics on first use is unknown (they did not answer DescribeConfigs for auto.create.topics.enable); {present} topic(s) match {prefix}*: make sure every routed topic exists or is created on first use"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(rf: Option<i64>, isr: Option<i64>) -> Durability {
        Durability { replication_factor: rf, min_insync_replicas: isr }
    }

    /// RF 1 or min.insync.replicas 1 with acks=all is a warning (never a
    /// failure) that names the topic, what is weak and the fix.
    #[test]
    fn weak_replication_is_a_durability_warning_with_the_fix() {
        let topics = vec![
            ("outbox.event.order".to_owned(), d(Some(3), Some(2))),
            ("outbox.event.payment".to_owned(), d(Some(1), Some(1))),
            ("outbox.event.invoice".to_owned(), d(Some(3), Some(1))),
            ("outbox.event.refund".to_owned(), d(Some(1), Some(2))),
        ];
        let checks = durability_decision(&topics, Some(&d(Some(3), Some(2))), false);
        assert!(!any_failed(&checks));
        let warns: Vec<&String> =
            checks.iter().filter_map(|c| if let Check::Warn(m) = c { Some(m) } else { None }).collect();
        assert_eq!(warns.len(), 3, "{checks:?}");
        assert!(warns[0].contains("topic outbox.event.payment has replication factor 1 and min.insync.replicas 1"));
        assert!(warns[1].contains("topic outbox.event.invoice has min.insync.replicas 1"));
        assert!(warns[2].contains("topic outbox.event.refund has replication factor 1:"));
        for w in warns {
            assert!(
                w.contains("acks=all")
                    && w.contains("min.insync.replicas=2")
                    && w.contains("runbooks/kafka-maintenance.md"),
                "{w}"
            );
        }
        assert_eq!(
            checks.last(),
            Some(&Check::Ok(
                "durability: 1 topic(s) with replication factor >= 2 and min.insync.replicas >= 2 (acks=all)".into()
            ))
        );
    }

    /// Topics not created yet: the brokers' defaults decide, or "cannot tell".
    #[test]
    fn missing_topics_are_judged_by_the_broker_defaults_or_unknown() {
        let weak = durability_decision(&[], Some(&d(Some(1), Some(1))), true);
        assert!(
            matches!(&weak[..], [Check::Warn(m)] if m.contains("topics created on first use get the brokers' defaults, replication factor 1 and min.insync.replicas 1")),
            "{weak:?}"
        );
        let sound = durability_decision(&[], Some(&d(Some(3), Some(2))), true);
        assert!(matches!(&sound[..], [Check::Ok(_)]), "{sound:?}");
        for unknown in [durability_decision(&[], None, true), durability_decision(&[], Some(&d(None, Some(2))), true)] {
            assert!(matches!(&unknown[..], [Check::Warn(m)] if m.contains("cannot tell")), "{unknown:?}");
        }
        // Defaults do not matter when every topic exists already.
        assert!(durability_decision(&[], Some(&d(Some(1), Some(1))), false).is_empty());
        // A topic whose min.insync.replicas the brokers did not describe.
        let unread = durability_decision(&[("t".into(), d(Some(3), None))], None, false);
        assert!(matches!(&unread[..], [Check::Warn(m)] if m.contains("could not be read")), "{unread:?}");
    }

    /// Regression: a broker that refuses DescribeConfigs made `walpost check` FAIL
    /// with "the brokers do not create topics on first use", which it did not know.
    #[test]
    fn regression_unknown_auto_create_is_a_warning_that_says_unknown() {
        match topics_check(None, 0, "outbox.event.") {
            Check::Warn(m) => assert!(m.contains("unknown"), "{m}"),
            other => panic!("{other:?}"),
        }
        assert!(matches!(topics_check(Some("false"), 0, "outbox.event."), Check::Fail(_)));
        assert!(matches!(topics_check(Some("false"), 2, "outbox.event."), Check::Warn(_)));
        assert!(matches!(topics_check(Some("true"), 0, "outbox.event."), Check::Ok(_)));
    }
}
