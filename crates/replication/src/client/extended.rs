//! Statements with bind parameters over the extended query protocol: values travel in a
//! Bind message, never in the SQL text, so no value needs quoting and none can change
//! what the statement means.
//!
//! One round trip per statement: Parse (the unnamed statement, every parameter's type
//! left for the server to infer: write `$1::text`, `$2::pg_lsn` where the context does
//! not say), Bind (text-format values and results), Describe of the portal (its
//! RowDescription names the columns for [`QueryResult::first`]), Execute (all rows),
//! Sync. The server answers with ReadyForQuery after Sync whether or not a step failed,
//! so an error leaves the connection usable, as after a simple query.
//!
//! Invariants:
//! - At most [`MAX_PARAMS`] parameters and [`MAX_PARAMS_BYTES`] bytes of values: what
//!   the server would refuse (or close the connection over) is refused here, before
//!   anything is sent.
//! - One statement per call (a Parse message holds exactly one); only on an ordinary
//!   SQL connection (`connect_sql`): a walsender runs the simple query protocol only.

use bytes::BufMut;
use postgres_protocol::message::frontend;
use postgres_protocol::IsNull;

use super::{QueryResult, ReplicationClient};
use crate::error::Error;

/// The most parameters one statement takes: PostgreSQL's own limit (the Bind message
/// counts them in 16 bits).
pub const MAX_PARAMS: usize = u16::MAX as usize;

/// The most bytes of parameter values one statement sends: 64 MiB, far above any value
/// walpost binds (names, positions, keys, one message's payload) and far below the 1 GB
/// at which the server ends the connection instead of answering.
pub const MAX_PARAMS_BYTES: usize = 64 << 20;

impl ReplicationClient {
    /// Runs one statement with `params` bound to `$1`, `$2`, ... (text format; `None`
    /// is NULL) and returns its rows in text format. A server error comes back as
    /// [`Error::Server`] once the server is ready for the next statement.
    pub async fn query(&mut self, sql: &str, params: &[Option<&str>]) -> Result<QueryResult, Error> {
        check_params(params)?;
        if let Err(e) = self.encode_query(sql, params) {
            // Nothing was sent: the connection is as it was.
            self.out.clear();
            return Err(e);
        }
        self.flush_out().await?;
        self.read_result().await
    }

    /// Parse, Bind, Describe portal, Execute, Sync into the output buffer.
    fn encode_query(&mut self, sql: &str, params: &[Option<&str>]) -> Result<(), Error> {
        // The only failures left: a NUL byte in the text, a length over 2 GB.
        let unsendable = |e: std::io::Error| Error::Unsendable(e.to_string());
        frontend::parse("", sql, std::iter::empty(), &mut self.out).map_err(unsendable)?;
        frontend::bind(
            "",
            "",
            std::iter::empty(),
            params.iter().copied(),
            |value, out| match value {
                None => Ok(IsNull::Yes),
                Some(text) => {
                    out.put_slice(text.as_bytes());
                    Ok(IsNull::No)
                }
            },
            std::iter::empty(),
            &mut self.out,
        )
        .map_err(|e| match e {
            frontend::BindError::Conversion(e) => Error::Unsendable(e.to_string()),
            frontend::BindError::Serialization(e) => unsendable(e),
        })?;
        frontend::describe(b'P', "", &mut self.out).map_err(unsendable)?;
        frontend::execute("", 0, &mut self.out).map_err(unsendable)?;
        frontend::sync(&mut self.out);
        Ok(())
    }
}

impl ReplicationClient {
    /// `SET TRANSACTION SNAPSHOT` of a snapshot another session exported (its name as
    /// `pg_export_snapshot()` or CREATE_REPLICATION_SLOT gave it, e.g. `00000003-0000001B-1`),
    /// inside a REPEATABLE READ transaction the caller began.
    ///
    /// The one SQL statement whose value goes into the text: the command takes a literal,
    /// not a parameter, and no function does the same. The name is checked to be a
    /// snapshot name (hex digits and dashes) before it is, so it needs no quoting.
    pub async fn set_transaction_snapshot(&mut self, name: &str) -> Result<(), Error> {
        if !is_snapshot_name(name) {
            return Err(Error::Unsendable(format!(
                "{:?} is not a snapshot name (hex digits and dashes, as pg_export_snapshot() makes them)",
                name.chars().take(80).collect::<String>()
            )));
        }
        self.simple_query(&format!("SET TRANSACTION SNAPSHOT '{name}'")).await.map(|_| ())
    }
}

/// A name as PostgreSQL exports snapshots: `%08X-%08X-%d` (and `%08X-%08X` before 10).
fn is_snapshot_name(name: &str) -> bool {
    (1..=64).contains(&name.len()) && name.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-')
}

/// Refuses what the server could not take, before a byte is written.
fn check_params(params: &[Option<&str>]) -> Result<(), Error> {
    if params.len() > MAX_PARAMS {
        return Err(Error::Unsendable(format!(
            "{} parameters, and a statement takes at most {MAX_PARAMS}",
            params.len()
        )));
    }
    let bytes: usize = params.iter().flatten().map(|v| v.len()).sum();
    if bytes > MAX_PARAMS_BYTES {
        return Err(Error::Unsendable(format!(
            "{bytes} bytes of parameter values, and a statement takes at most {MAX_PARAMS_BYTES}"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_snapshot_names_reach_set_transaction_snapshot() {
        for good in ["00000003-0000001B-1", "00000A1F-00000002"] {
            assert!(is_snapshot_name(good), "{good}");
        }
        for bad in ["", "x' OR '1", "00000003-0000001B-1'; DROP", "0000 0003", &"0".repeat(65)] {
            assert!(!is_snapshot_name(bad), "{bad}");
        }
    }

    #[test]
    fn parameters_over_the_limits_are_refused_before_sending() {
        let many = vec![Some("x"); MAX_PARAMS + 1];
        let e = check_params(&many).unwrap_err().to_string();
        assert!(e.contains("65536 parameters") && e.contains("at most 65535"), "{e}");
        assert!(check_params(&many[..MAX_PARAMS]).is_ok());
        let big = "x".repeat(MAX_PARAMS_BYTES / 2 + 1);
        let e = check_params(&[Some(&big), None, Some(&big)]).unwrap_err().to_string();
        assert!(e.contains("bytes of parameter values"), "{e}");
        assert!(check_params(&[Some(&big), None]).is_ok());
    }
}
