//! What retention reads from the catalog: the partitioned table, its partitions with
//! their bounds and seals, and the server's clock.

use pgoutput::Lsn;
use replication::ReplicationClient;
use service::error::{ErrorKind, PipelineError};
use service::sql::ident;

use crate::report::Range;

/// Name of the constraint that seals a partition; its comment holds the seal's WAL position.
pub const SEAL_CONSTRAINT: &str = "walpost_retired";

/// Prefix of the seal constraint's comment, followed by the LSN.
const SEAL_PREFIX: &str = "walpost retention: sealed at WAL ";

/// The partitioned table.
#[derive(Debug)]
pub enum Root {
    Missing,
    NotPartitioned,
    /// Partitioned some other way (the text says how).
    Unsupported(String),
    Range {
        oid: String,
    },
}

/// A partition as the catalog describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Partition {
    /// `"schema"."name"` for SQL.
    pub quoted: String,
    /// `schema.name` for people.
    pub display: String,
    pub is_default: bool,
    /// For the default partition: whether it holds rows.
    pub has_rows: bool,
    pub range: Range,
    pub detach_pending: bool,
    /// The seal's WAL position, when sealed.
    pub seal: Option<Seal>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seal {
    /// The constraint exists; its comment gives W.
    At(Lsn),
    /// The constraint exists but its comment is missing or unreadable: seal again.
    Unknown,
}

/// The table `schema.name`, and how it is partitioned.
pub async fn root(sql: &mut ReplicationClient, schema: &str, name: &str) -> Result<Root, PipelineError> {
    let r = sql
        .query(
            "SELECT c.oid::text AS oid, c.relkind::text AS kind, pt.partstrat::text AS strat, \
                    pt.partnatts::text AS natts, pg_catalog.format_type(a.atttypid, a.atttypmod) AS keytype \
             FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
             LEFT JOIN pg_partitioned_table pt ON pt.partrelid = c.oid \
             LEFT JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum = pt.partattrs[0] \
             WHERE n.nspname = $1 AND c.relname = $2",
            &[Some(schema), Some(name)],
        )
        .await?;
    let Some(oid) = r.first("oid").map(str::to_owned) else { return Ok(Root::Missing) };
    if r.first("kind") != Some("p") {
        return Ok(Root::NotPartitioned);
    }
    let keytype = r.first("keytype").unwrap_or("an expression");
    if r.first("strat") != Some("r")
        || r.first("natts") != Some("1")
        || !matches!(keytype, "timestamp with time zone" | "timestamp without time zone")
    {
        return Ok(Root::Unsupported(format!("partition key type: {keytype}")));
    }
    Ok(Root::Range { oid })
}

/// The text-to-epoch conversion of one bound (`'...'`, MINVALUE or MAXVALUE), in SQL.
fn bound_micros_sql(expr: &str) -> String {
    format!(
        "CASE WHEN {expr} IS NULL OR {expr} IN ('MINVALUE', 'MAXVALUE') THEN NULL \
              WHEN NOT pg_catalog.isfinite(pg_catalog.btrim({expr}, '''')::timestamptz) THEN NULL \
              ELSE pg_catalog.floor(extract(epoch FROM pg_catalog.btrim({expr}, '''')::timestamptz) * 1000000)::bigint::text END"
    )
}

/// The partitions of the table whose oid is `root_oid`, with their bounds and seals.
pub async fn partitions(sql: &mut ReplicationClient, root_oid: &str) -> Result<Vec<Partition>, PipelineError> {
    let text = format!(
        "SELECT n.nspname AS schema, c.relname AS name, \
                (pg_catalog.pg_get_expr(c.relpartbound, c.oid) = 'DEFAULT')::text AS is_default, \
                {lo} AS lo, {hi} AS hi, \
                coalesce((pg_catalog.to_jsonb(i) ->> 'inhdetachpending')::boolean, false)::text AS pending, \
                (s.oid IS NOT NULL)::text AS sealed, pg_catalog.obj_description(s.oid, 'pg_constraint') AS seal \
         FROM pg_inherits i \
         JOIN pg_class c ON c.oid = i.inhrelid \
         JOIN pg_namespace n ON n.oid = c.relnamespace \
         LEFT JOIN LATERAL (SELECT pg_catalog.regexp_match(pg_catalog.pg_get_expr(c.relpartbound, c.oid), \
             '^FOR VALUES FROM \\((.+)\\) TO \\((.+)\\)$') AS m) b ON true \
         LEFT JOIN LATERAL (SELECT k.oid FROM pg_constraint k WHERE k.conrelid = c.oid \
             AND k.conname = $2 AND k.contype = 'c' AND pg_catalog.pg_get_constraintdef(k.oid) LIKE 'CHECK (false)%') s ON true \
         WHERE i.inhparent = $1::oid \
         ORDER BY n.nspname, c.relname",
        lo = bound_micros_sql("b.m[1]"),
        hi = bound_micros_sql("b.m[2]"),
    );
    let r = sql.query(&text, &[Some(root_oid), Some(SEAL_CONSTRAINT)]).await?;
    let mut out = Vec::with_capacity(r.rows.len());
    for row in 0..r.rows.len() {
        let get = |name: &str| -> Option<&str> {
            let idx = r.columns.iter().position(|c| c == name)?;
            r.text(row, idx)
        };
        let (schema, name) = (get("schema").unwrap_or_default(), get("name").unwrap_or_default());
        let micros = |name: &str| get(name).and_then(|v| v.parse::<i64>().ok());
        out.push(Partition {
            quoted: format!("{}.{}", ident(schema), ident(name)),
            display: format!("{schema}.{name}"),
            is_default: get("is_default") == Some("true"),
            has_rows: false,
            range: Range { lo: micros("lo"), hi: micros("hi") },
            detach_pending: get("pending") == Some("true"),
            seal: (get("sealed") == Some("true")).then(|| parse_seal(get("seal"))),
        });
    }
    for p in out.iter_mut().filter(|p| p.is_default) {
        let rows = sql.simple_query(&format!("SELECT EXISTS (SELECT 1 FROM {})::text AS rows", p.quoted)).await?;
        p.has_rows = rows.first("rows") == Some("true");
    }
    Ok(out)
}

pub fn parse_seal(comment: Option<&str>) -> Seal {
    comment
        .and_then(|c| c.strip_prefix(SEAL_PREFIX))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|lsn| lsn.trim_end_matches(';').parse().ok())
        .map(Seal::At)
        .unwrap_or(Seal::Unknown)
}

pub fn seal_comment(w: Lsn, slot: &str) -> String {
    format!(
        "{SEAL_PREFIX}{w}; walpost drops this partition once replication slot {slot} has confirmed {w} (every row in it was committed before); drop this constraint to unseal"
    )
}

/// The server's `now()`, in microseconds since the Unix epoch (what every pass plans by).
pub async fn server_now_micros(sql: &mut ReplicationClient) -> Result<i64, PipelineError> {
    let r = sql
        .simple_query("SELECT pg_catalog.floor(extract(epoch FROM pg_catalog.now()) * 1000000)::bigint::text AS now")
        .await?;
    r.first("now")
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| PipelineError::definite(ErrorKind::Postgres, "cannot read now() from PostgreSQL"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seal_comment_round_trips() {
        let w: Lsn = "16/B374D848".parse().unwrap();
        assert_eq!(parse_seal(Some(&seal_comment(w, "walpost"))), Seal::At(w));
        assert_eq!(parse_seal(None), Seal::Unknown);
        assert_eq!(parse_seal(Some("hand-written")), Seal::Unknown);
    }
}
