//! What stops the runner. Every text names the schema, and the file where one is at fault.

/// An error of [`crate::migrate`], [`crate::status`] or [`crate::create_walpost_slots`].
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The schema name cannot be used.
    #[error("--schema: {0}")]
    Schema(#[from] replication::InvalidName),
    /// Reading the record or the catalog, taking the lock, making the record's table.
    #[error("cannot {doing} in schema {schema}: {source}")]
    Sql {
        doing: &'static str,
        schema: String,
        #[source]
        source: Box<replication::Error>,
    },
    /// An applied migration's file is not the file that was applied.
    #[error("{}", changed_text(schema, files))]
    Changed {
        schema: String,
        /// (path, recorded name and checksum, the file's checksum)
        files: Vec<(String, String, String)>,
    },
    /// A migration failed: its transaction was rolled back; the ones before it stay
    /// applied and recorded.
    #[error("{file} failed in schema {schema} and changed nothing (the migrations before it are applied and recorded): {source}")]
    Failed {
        file: String,
        schema: String,
        #[source]
        source: Box<replication::Error>,
    },
}

impl Error {
    /// A failure that may pass by itself (a lost connection, a deadlock, a lock timeout):
    /// what [`replication::Error::is_transient`] says of the PostgreSQL error under it.
    pub fn is_transient(&self) -> bool {
        match self {
            Error::Sql { source, .. } | Error::Failed { source, .. } => source.is_transient(),
            Error::Schema(_) | Error::Changed { .. } => false,
        }
    }
}

fn changed_text(schema: &str, files: &[(String, String, String)]) -> String {
    let each: Vec<String> = files
        .iter()
        .map(|(path, recorded, now)| format!("{path} (recorded as {recorded}; the file's sha256 is {now})"))
        .collect();
    format!(
        "applied migrations changed since they were applied to schema {schema}: {}. An applied migration is never \
         edited: restore the file as it was (git history) and put the change in a new numbered migration; nothing was applied",
        each.join(", ")
    )
}
