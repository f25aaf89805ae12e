//! Whether the brokers answer, as `walpost check` and `walpost check inbox` ask it: a
//! metadata request from a client made with the user's properties (TLS, SASL), off the
//! async runtime, and one text for brokers that do not answer.

use std::time::Duration;

use rdkafka::client::{Client, ClientContext};
use rdkafka::metadata::Metadata;
use rdkafka::ClientConfig;

/// How long a check waits for the brokers' metadata.
pub const METADATA_TIMEOUT: Duration = Duration::from_secs(10);

/// A check's client gives up on a broker that does not answer within seconds.
pub fn for_a_check(cfg: &mut ClientConfig) -> &mut ClientConfig {
    cfg.set("socket.timeout.ms", "5000")
}

/// The check's failure for brokers that did not answer (`error`: librdkafka's).
pub fn unreachable(brokers: &str, error: &impl std::fmt::Display) -> String {
    format!(
        "Kafka at {brokers} is not reachable: {error}; check --kafka-brokers, the network and [kafka.properties] (security.protocol, sasl.*, ssl.*)"
    )
}

/// Asks the brokers for their metadata with `client` (its librdkafka [`Client`] given by
/// `inner`), then `also` (more blocking calls of the same check), on a blocking thread.
/// `Err`: the check's failure line.
pub async fn metadata<K, C, T>(
    client: K,
    brokers: &str,
    inner: fn(&K) -> &Client<C>,
    also: impl FnOnce(&K) -> T + Send + 'static,
) -> Result<(K, Metadata, T), String>
where
    K: Send + 'static,
    C: ClientContext + 'static,
    T: Send + 'static,
{
    let fetched = tokio::task::spawn_blocking(move || {
        let metadata = inner(&client).fetch_metadata(None, METADATA_TIMEOUT);
        let more = also(&client);
        (client, metadata, more)
    })
    .await;
    match fetched {
        Err(e) => Err(format!("Kafka metadata request for {brokers} failed: {e}")),
        Ok((_, Err(e), _)) => Err(unreachable(brokers, &e)),
        Ok((client, Ok(md), more)) => Ok((client, md, more)),
    }
}
