//! The error kind and [`PipelineError`] are the `service` crate's (the relay and the
//! inbox share them); here are the relay's own helpers for routing errors.

pub(crate) use service::error::{ErrorKind, PipelineError};

/// For a contract breach, the record the row would have been without the contract
/// (`unchecked` routes it so): its dead letter then carries the original topic, key,
/// headers (`id`, the event type, ...) and value like a dead letter of a record Kafka
/// refused. `None` for other errors, which routing without the contract would repeat.
pub(crate) fn breached_record(
    error: &router::RouteError,
    unchecked: impl FnOnce() -> Result<router::Record, router::RouteError>,
) -> Option<router::Record> {
    if !matches!(error, router::RouteError::ContractBroken { .. }) {
        return None;
    }
    unchecked().ok()
}

/// A contract that could not be read (a schema registry down) is no permanent error of
/// the event: the session starts again from the confirmed position, with backoff, and the
/// event is checked then. Nothing of it is published meanwhile.
pub(crate) fn contract_unavailable(error: &router::RouteError) -> Result<(), PipelineError> {
    match error {
        router::RouteError::ContractUnavailable { .. } => {
            Err(PipelineError::transient(ErrorKind::Registry, format!("{error}; the stream waits for it")))
        }
        _ => Ok(()),
    }
}
