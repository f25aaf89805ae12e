//! Audit rows in a PostgreSQL table with the columns of
//! migrations/outbox/0004_admin_audit.sql (`at`, `token_name`, `role`, `action`,
//! `target`, `result`): `events.walpost_admin_audit` for `walpost run`, the inbox's
//! `admin_audit` for `walpost inbox`.
//!
//! The connection is made at the first action, not at start (a listener nobody acts on
//! never connects), and made again after an error. Values travel as bind parameters; the
//! role needs `INSERT` on the table and nothing else.

use replication::{quote_ident, Config, ReplicationClient};
use tokio::sync::Mutex;

use crate::audit::{Audit, AuditRecord};

/// Writes each record as one row of `schema.table`.
#[derive(Debug)]
pub struct TableAudit {
    config: Config,
    insert: String,
    client: Mutex<Option<ReplicationClient>>,
}

impl TableAudit {
    pub fn new(config: Config, schema: &str, table: &str) -> TableAudit {
        TableAudit { config, insert: insert_statement(schema, table), client: Mutex::new(None) }
    }
}

fn insert_statement(schema: &str, table: &str) -> String {
    format!(
        "INSERT INTO {}.{} (token_name, role, action, target, result) VALUES ($1, $2, $3, $4, $5)",
        quote_ident(schema),
        quote_ident(table)
    )
}

impl Audit for TableAudit {
    async fn record(&self, r: &AuditRecord) -> Result<(), String> {
        let mut client = self.client.lock().await;
        if client.is_none() {
            *client = Some(ReplicationClient::connect_sql(&self.config).await.map_err(|e| e.to_string())?);
        }
        let Some(c) = client.as_mut() else { return Err("no connection".into()) };
        let params =
            [Some(r.token_name.as_str()), Some(r.role.as_str()), Some(&r.action), Some(&r.target), Some(&r.result)];
        match c.query(&self.insert, &params).await {
            Ok(_) => Ok(()),
            Err(e) => {
                // A server error leaves the connection usable, a broken one does not:
                // connect again next time either way.
                *client = None;
                Err(e.to_string())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_quoted() {
        assert_eq!(
            insert_statement("events", "walpost_admin_audit"),
            "INSERT INTO \"events\".\"walpost_admin_audit\" (token_name, role, action, target, result) VALUES ($1, $2, $3, $4, $5)"
        );
        assert!(insert_statement("Billing Inbox", "admin_audit")
            .starts_with("INSERT INTO \"Billing Inbox\".\"admin_audit\""));
    }
}
