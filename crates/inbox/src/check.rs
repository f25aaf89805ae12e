//! `walpost check inbox`: the preflight of `walpost inbox`, one line per check as
//! `walpost check` prints them: the database, the inbox schema (tables, columns,
//! functions) and the rights the ingest needs, the brokers with the consumer's own
//! properties, the topics and the group.

use kafka_common::reach;
use rdkafka::consumer::{BaseConsumer, Consumer};
use replication::ReplicationClient;
use service::check::Check;
use service::error::PipelineError;
use service::sql::{array, ident};

use crate::consumer::client_config;
use crate::messages::{inbox_partition_missing, inbox_schema_incomplete};
use crate::settings::{InboxSettings, Subscription};

/// The functions of the SQL API handlers call (complete_many and fail_many: from
/// migrations/inbox/0003_inbox_batches.sql on).
const FUNCTIONS: &[&str] = &[
    "register_handler",
    "claim",
    "complete",
    "fail",
    "complete_many",
    "fail_many",
    "retry",
    "dismiss",
    "deliver_new_messages",
];
/// The tables of the migration.
const TABLES: &[&str] = &["messages", "offsets", "rejected", "handlers", "deliveries", "receipts"];

/// Runs every check; prints as it goes; returns all results.
pub async fn check(s: &InboxSettings) -> Vec<Check> {
    let mut out = Vec::new();
    let mut emit = |c: Check| {
        println!("{}", c.line());
        out.push(c);
    };
    match ReplicationClient::connect_sql(&s.postgres).await {
        Err(e) => emit(Check::Fail(format!("connect to {}: {}", s.postgres.redacted(), PipelineError::from(e)))),
        Ok(mut sql) => {
            let version = sql.parameter("server_version").unwrap_or("?").to_owned();
            emit(Check::Ok(format!("connect to {} (PostgreSQL {version})", s.postgres.redacted())));
            for c in schema_checks(&mut sql, s).await {
                emit(c);
            }
            sql.close().await;
        }
    }
    for c in kafka_checks(s).await {
        emit(c);
    }
    out
}

async fn schema_checks(sql: &mut ReplicationClient, s: &InboxSettings) -> Vec<Check> {
    let (tables, functions) = (array(TABLES), array(FUNCTIONS));
    let present = sql
        .query(
            "SELECT 'table', c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
             WHERE n.nspname = $1 AND c.relname = ANY ($2::text[])
             UNION ALL
             SELECT DISTINCT 'function', p.proname FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
             WHERE n.nspname = $1 AND p.proname = ANY ($3::text[])",
            &[Some(&s.schema), Some(&tables), Some(&functions)],
        )
        .await;
    let r = match present {
        Ok(r) => r,
        Err(e) => return vec![Check::Fail(format!("cannot read the catalog: {}", PipelineError::from(e)))],
    };
    let have: Vec<(String, String)> =
        (0..r.rows.len()).filter_map(|i| Some((r.text(i, 0)?.to_owned(), r.text(i, 1)?.to_owned()))).collect();
    let mut missing: Vec<String> = Vec::new();
    for (kind, names) in [("table", TABLES), ("function", FUNCTIONS)] {
        for n in names.iter().filter(|n| !have.iter().any(|(k, h)| k == kind && h == *n)) {
            missing.push(format!("{kind} {}.{n}", s.schema));
        }
    }
    if !missing.is_empty() {
        let what = format!("missing: {}", missing.join(", "));
        let fix = if s.create_schema { " (create_schema is on: walpost inbox creates them at start-up)" } else { "" };
        let line = format!("{}{fix}", inbox_schema_incomplete(&s.schema, &what));
        return vec![if s.create_schema { Check::Warn(line) } else { Check::Fail(line) }];
    }
    let mut out = vec![Check::Ok(format!("inbox schema {}: its tables and functions are present", s.schema))];
    // What the ingest itself does: look event ids up in messages and write them, write
    // rejected rows and offsets, read offsets; and what retention does: make and drop the
    // partitions of the tables it owns. Then whether a partition covers now.
    let q = |t: &str| format!("{}.{t}", ident(&s.schema));
    let tables = [q("messages"), q("rejected"), q("receipts"), q("offsets"), q("deliveries")];
    let [messages, rejected, receipts, offsets, deliveries] = tables.each_ref().map(|t| Some(t.as_str()));
    let schema = ident(&s.schema);
    let rights = sql
        .query(
            &format!(
                "SELECT pg_catalog.has_table_privilege($1::regclass, 'INSERT, SELECT'),
                        pg_catalog.has_table_privilege($2::regclass, 'INSERT'),
                        pg_catalog.has_table_privilege($4::regclass, 'INSERT, UPDATE, SELECT'),
                        (SELECT pg_catalog.bool_and(pg_catalog.pg_has_role(c.relowner, 'USAGE')) FROM pg_class c
                         WHERE c.oid IN ($1::regclass, $5::regclass, $3::regclass)),
                        pg_catalog.has_table_privilege($5::regclass, 'INSERT'),
                        (SELECT pg_catalog.count(*) FROM {schema}.offsets WHERE group_id = $6),
                        (SELECT pg_catalog.count(*) FROM {schema}.handlers),
                        (SELECT pg_catalog.count(*) FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
                         WHERE i.inhparent = $1::regclass),
                        EXISTS (SELECT FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
                                WHERE i.inhparent = $1::regclass
                                  AND (pg_catalog.pg_get_expr(c.relpartbound, c.oid) = 'DEFAULT'
                                       OR pg_catalog.now() BETWEEN (pg_catalog.regexp_match(pg_catalog.pg_get_expr(c.relpartbound, c.oid), '^FOR VALUES FROM \\(''(.+)''\\) TO')) [1]::timestamptz
                                                AND (pg_catalog.regexp_match(pg_catalog.pg_get_expr(c.relpartbound, c.oid), ' TO \\(''(.+)''\\)$')) [1]::timestamptz))"
            ),
            &[messages, rejected, receipts, offsets, deliveries, Some(&s.group)],
        )
        .await;
    match rights {
        Err(e) => out.push(Check::Fail(format!("cannot check the rights on the inbox: {}", PipelineError::from(e)))),
        Ok(r) => {
            let yes = |c: usize| r.text(0, c) == Some("t");
            let mut lacking = Vec::new();
            for (c, what) in [
                (0, "INSERT, SELECT on messages"),
                (1, "INSERT on rejected"),
                (2, "INSERT, UPDATE, SELECT on offsets"),
                (3, "ownership of messages, deliveries and receipts (retention makes and drops their partitions; or set [inbox] retention = false)"),
                (4, "INSERT on deliveries (the trigger that makes them runs as the ingest's role)"),
            ] {
                if c == 3 && s.retention.is_none() {
                    continue;
                }
                if !yes(c) {
                    lacking.push(what);
                }
            }
            if lacking.is_empty() {
                out.push(Check::Ok(
                    "the role may write the inbox (messages, rejected, offsets, deliveries) and manage its partitions"
                        .into(),
                ));
            } else {
                out.push(Check::Fail(format!(
                    "the role lacks {}: GRANT them to the role walpost inbox connects as (schema {})",
                    lacking.join(", "),
                    s.schema
                )));
            }
            let offsets = r.text(0, 5).unwrap_or("0");
            let handlers = r.text(0, 6).unwrap_or("0");
            out.push(Check::Ok(format!(
                "group {}: {offsets} partition offset(s) stored; {handlers} handler(s) registered",
                s.group
            )));
            let partitions = r.text(0, 7).unwrap_or("0");
            if yes(8) {
                out.push(Check::Ok(format!(
                    "{} daily partition(s) of {}.messages; one covers now",
                    partitions, s.schema
                )));
            } else {
                out.push(Check::Fail(inbox_partition_missing(&s.schema)));
            }
            if handlers == "0" {
                out.push(Check::Warn(
                    "no handler is registered: messages are stored but no handler has deliveries until inbox.register_handler is called (it takes the stored ones too)".into(),
                ));
            }
        }
    }
    out
}

async fn kafka_checks(s: &InboxSettings) -> Vec<Check> {
    let brokers = s.brokers.clone();
    let consumer: BaseConsumer =
        match client_config(s).and_then(|mut c| reach::for_a_check(&mut c).create().map_err(|e| e.to_string())) {
            Ok(c) => c,
            Err(e) => return vec![Check::Fail(format!("Kafka consumer for {brokers}: {e}"))],
        };
    let group = s.group.clone();
    let groups = move |consumer: &BaseConsumer| {
        let groups = consumer.fetch_group_list(Some(&group), reach::METADATA_TIMEOUT);
        groups.map(|g| g.groups().iter().map(|g| (g.state().to_owned(), g.members().len())).collect::<Vec<_>>())
    };
    let (_, md, groups) = match reach::metadata(consumer, &brokers, BaseConsumer::client, groups).await {
        Ok(answered) => answered,
        Err(line) => return vec![Check::Fail(line)],
    };
    let mut out = vec![Check::Ok(format!("Kafka at {brokers}: {} broker(s)", md.brokers().len()))];
    let names: Vec<&str> = md.topics().iter().map(|t| t.name()).collect();
    match &s.subscription {
        Subscription::Topics(topics) => {
            for t in topics {
                match md.topics().iter().find(|m| m.name() == t) {
                    Some(m) => out.push(Check::Ok(format!("topic {t}: {} partition(s)", m.partitions().len()))),
                    None => out.push(Check::Warn(format!(
                        "topic {t} does not exist yet: walpost inbox consumes it once it is created"
                    ))),
                }
            }
        }
        Subscription::Regex(r) => {
            let matched = match matching(r, &names) {
                Ok(n) => n,
                Err(e) => {
                    out.push(Check::Warn(format!(
                        "topic_regex {r}: not checked here, librdkafka's dialect may differ ({e})"
                    )));
                    return out;
                }
            };
            out.push(if matched == 0 {
                Check::Warn(format!("topic_regex {r} matches no topic yet"))
            } else {
                Check::Ok(format!("topic_regex {r} matches {matched} topic(s)"))
            });
        }
    }
    match groups {
        Ok(g) => match g.first() {
            Some((state, members)) => out.push(Check::Ok(format!("group {}: {state}, {members} member(s)", s.group))),
            None => out.push(Check::Ok(format!("group {}: not known to the brokers yet", s.group))),
        },
        Err(e) => out.push(Check::Fail(format!(
            "group {}: cannot describe it ({e}): the principal needs DESCRIBE and READ on the group",
            s.group
        ))),
    }
    out
}

/// How many of `names` a subscription regex matches (librdkafka anchors nothing: the
/// regex finds a match anywhere in the name, `^` and `$` anchor as written), or why it is
/// no regex here.
fn matching(regex: &str, names: &[&str]) -> Result<usize, regex::Error> {
    let r = regex::Regex::new(regex)?;
    Ok(names.iter().filter(|n| r.is_match(n)).count())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_subscription_regex_is_counted_over_the_topic_names() {
        let names = ["orders.created", "orders.paid", "payments"];
        assert_eq!(matching("^orders\\..*", &names).unwrap(), 2);
        assert_eq!(matching("^pay", &names).unwrap(), 1);
        assert_eq!(
            matching("^(orders\\.paid|payments)$", &names).unwrap(),
            2,
            "alternatives, which the prefix reading could not count"
        );
        assert_eq!(matching("created", &names).unwrap(), 1, "unanchored: anywhere in the name");
        assert!(matching("^orders(", &names).is_err());
    }
}
