//! Opening a connection: the host list in order, the transport (Unix socket, TCP, TLS)
//! of each, startup and authentication, then the `target_session_attrs` check.
//!
//! Invariants:
//! - Hosts are tried in the order given, each within its own `connect_timeout` (TCP,
//!   TLS, authentication and the session check together).
//! - A host that cannot be reached, fails TLS, answers with a non-authentication error
//!   or does not satisfy `target_session_attrs` is skipped; an authentication failure
//!   ends the search (libpq's rule: see [`Error::ends_host_search`]).
//! - With one host, its error is returned as it is; with several, one
//!   [`Error::NoUsableHost`] names every host tried and why.
//! - `prefer-standby`: the first primary reached is kept while later hosts are searched
//!   for a standby, and used if there is none (libpq's second pass, without reconnecting).
//! - The session check uses `in_hot_standby` and `default_transaction_read_only` when the
//!   server reports them at startup (PostgreSQL 14+), else `SHOW transaction_read_only` /
//!   `SELECT pg_catalog.pg_is_in_recovery()`, which also work on a `replication=database`
//!   connection.

use std::net::SocketAddr;

use bytes::BytesMut;
use postgres_protocol::message::frontend;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream, UnixStream};

use crate::auth::Channel;
use crate::client::ReplicationClient;
use crate::config::{Config, Host, HostSpec, Keepalives, SslMode, TargetSessionAttrs};
use crate::error::{Error, HostFailure};
use crate::tls;
use crate::transport::Opened;

impl ReplicationClient {
    /// Opens a replication connection (`replication=database`) to the first usable host
    /// and authenticates. Such a connection runs replication commands and plain SQL.
    pub async fn connect(config: &Config) -> Result<ReplicationClient, Error> {
        first_usable_host(config, true).await
    }

    /// Opens an ordinary SQL connection (text results; statements with bind parameters
    /// through [`ReplicationClient::query`], the extended query protocol): for
    /// slot status, snapshots and retention, where a replication connection is not
    /// wanted (it would count against max_wal_senders). To reach the same server as a
    /// replication connection, pass `config.pinned_to(client.connected_host())`.
    pub async fn connect_sql(config: &Config) -> Result<ReplicationClient, Error> {
        first_usable_host(config, false).await
    }
}

/// Connects to the first usable host of `config`.
async fn first_usable_host(config: &Config, replication: bool) -> Result<ReplicationClient, Error> {
    let mut failures = Vec::new();
    let mut reserve: Option<ReplicationClient> = None;
    for (i, host) in config.hosts.iter().enumerate() {
        match attempt(config, host, replication).await {
            Ok((client, None)) => {
                if let Some(spare) = reserve {
                    spare.close().await;
                }
                return Ok(client);
            }
            Ok((client, Some(not_a_standby))) => {
                failures.push(HostFailure { host: host.label(), error: not_a_standby });
                match reserve {
                    None => reserve = Some(client),
                    Some(_) => client.close().await,
                }
            }
            Err(error) => {
                let ends = error.ends_host_search();
                failures.push(HostFailure { host: host.label(), error });
                if ends {
                    let not_tried = config.hosts.iter().skip(i + 1).map(HostSpec::label).collect();
                    if let Some(spare) = reserve {
                        spare.close().await;
                    }
                    return Err(no_usable_host(failures, not_tried));
                }
            }
        }
    }
    match reserve {
        Some(primary) => Ok(primary),
        None => Err(no_usable_host(failures, Vec::new())),
    }
}

fn no_usable_host(mut failures: Vec<HostFailure>, not_tried: Vec<String>) -> Error {
    if failures.len() == 1 && not_tried.is_empty() {
        if let Some(only) = failures.pop() {
            return only.error;
        }
    }
    Error::NoUsableHost { failures, not_tried }
}

/// One host, within its connect_timeout. `Ok((client, Some(e)))`: a primary under
/// `prefer-standby`, usable if no standby turns up (`e` says why it was passed over).
async fn attempt(
    config: &Config,
    host: &HostSpec,
    replication: bool,
) -> Result<(ReplicationClient, Option<Error>), Error> {
    let target = config.pinned_to(host).redacted();
    let work = async {
        let opened = open_transport(config, host, &target).await?;
        let mut client = ReplicationClient::new(opened, host.clone());
        client.startup(config, replication).await?;
        match session_verdict(&mut client, config.target_session_attrs, host).await {
            Ok(verdict) => Ok((client, verdict)),
            Err(e) => {
                client.close().await;
                Err(e)
            }
        }
    };
    match config.connect_timeout {
        Some(limit) => tokio::time::timeout(limit, work)
            .await
            .unwrap_or_else(|_| Err(Error::ConnectTimeout { target, secs: limit.as_secs() })),
        None => work.await,
    }
}

async fn open_transport(config: &Config, host: &HostSpec, target: &str) -> Result<Opened, Error> {
    let connect_error = |source| Error::Connect { target: target.to_owned(), source };
    if let (Host::Unix(dir), None) = (&host.host, host.hostaddr) {
        let path = dir.join(format!(".s.PGSQL.{}", host.port));
        let s = UnixStream::connect(&path).await.map_err(connect_error)?;
        return Ok(Opened { io: Box::new(s), channel: Channel::Local, tls_end_point: None });
    }
    let mut tcp = connect_tcp(host, &config.keepalives).await.map_err(connect_error)?;
    if config.sslmode == SslMode::Disable {
        return Ok(Opened { io: Box::new(tcp), channel: Channel::PlainByConfig, tls_end_point: None });
    }
    let mut req = BytesMut::new();
    frontend::ssl_request(&mut req);
    tcp.write_all(&req).await?;
    match tcp.read_u8().await? {
        b'S' => {
            let name = match (&host.host, host.hostaddr) {
                (Host::Tcp(name), _) => name.clone(),
                (Host::Unix(_), Some(addr)) => addr.to_string(),
                (Host::Unix(dir), None) => dir.display().to_string(),
            };
            let stream = tls::handshake(config, &name, tcp).await?;
            let tls_end_point = tls::server_end_point(stream.ssl());
            let channel = if config.verifies_certificate() { Channel::TlsVerified } else { Channel::TlsUnverified };
            Ok(Opened { io: Box::new(stream), channel, tls_end_point })
        }
        b'N' if config.sslmode.tls_required() => Err(Error::TlsRefused(config.sslmode.as_str())),
        b'N' => Ok(Opened { io: Box::new(tcp), channel: Channel::PlainServerDeclinedTls, tls_end_point: None }),
        other => Err(Error::Protocol(format!("server answered the TLS request with byte {other:#04x}"))),
    }
}

/// TCP to `hostaddr`, or to each address the host name resolves to in turn.
async fn connect_tcp(host: &HostSpec, keepalives: &Keepalives) -> std::io::Result<TcpStream> {
    let addrs: Vec<SocketAddr> = match (host.hostaddr, &host.host) {
        (Some(ip), _) => vec![SocketAddr::new(ip, host.port)],
        (None, Host::Tcp(name)) => tokio::net::lookup_host((name.as_str(), host.port)).await?.collect(),
        (None, Host::Unix(_)) => Vec::new(),
    };
    let mut last = None;
    for addr in addrs {
        let socket = if addr.is_ipv4() { TcpSocket::new_v4()? } else { TcpSocket::new_v6()? };
        socket.set_keepalive(keepalives.enabled)?;
        match socket.connect(addr).await {
            Ok(stream) => {
                let _ = stream.set_nodelay(true);
                if keepalives.enabled {
                    let mut params = socket2::TcpKeepalive::new();
                    if let Some(idle) = keepalives.idle {
                        params = params.with_time(idle);
                    }
                    if let Some(interval) = keepalives.interval {
                        params = params.with_interval(interval);
                    }
                    if let Some(count) = keepalives.count {
                        params = params.with_retries(count);
                    }
                    socket2::SockRef::from(&stream).set_tcp_keepalive(&params)?;
                }
                return Ok(stream);
            }
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| std::io::Error::new(std::io::ErrorKind::NotFound, "the host name has no address")))
}

/// `Ok(None)`: the session is what `wanted` asks. `Ok(Some(e))`: a primary while
/// `prefer-standby` looks for a standby. `Err`: the host does not qualify.
async fn session_verdict(
    client: &mut ReplicationClient,
    wanted: TargetSessionAttrs,
    host: &HostSpec,
) -> Result<Option<Error>, Error> {
    let mismatch = |found, needs| Error::SessionAttrs { host: host.label(), wanted: wanted.as_str(), found, needs };
    match wanted {
        TargetSessionAttrs::Any => Ok(None),
        TargetSessionAttrs::ReadWrite | TargetSessionAttrs::ReadOnly => {
            let read_only =
                match (client.parameter("default_transaction_read_only"), client.parameter("in_hot_standby")) {
                    (Some(default_ro), Some(standby)) => default_ro == "on" || standby == "on",
                    _ => query_flag(client, "SHOW transaction_read_only", "on", "off").await?,
                };
            match (wanted, read_only) {
                (TargetSessionAttrs::ReadWrite, true) => Err(mismatch("read-only", "a server that accepts writes")),
                (TargetSessionAttrs::ReadOnly, false) => Err(mismatch("read-write", "a read-only server")),
                _ => Ok(None),
            }
        }
        TargetSessionAttrs::Primary | TargetSessionAttrs::Standby | TargetSessionAttrs::PreferStandby => {
            let in_recovery = match client.parameter("in_hot_standby") {
                Some(standby) => standby == "on",
                None => query_flag(client, "SELECT pg_catalog.pg_is_in_recovery()", "t", "f").await?,
            };
            const STANDBY: &str = "a standby (in recovery)";
            const PRIMARY: &str = "a primary (not in recovery)";
            match (wanted, in_recovery) {
                (TargetSessionAttrs::Primary, true) => Err(mismatch(STANDBY, "a primary")),
                (TargetSessionAttrs::Standby, false) => Err(mismatch(PRIMARY, "a standby")),
                (TargetSessionAttrs::PreferStandby, false) => Ok(Some(mismatch(PRIMARY, "a standby first"))),
                _ => Ok(None),
            }
        }
    }
}

/// Runs `sql`, whose one value must be `yes` or `no`.
async fn query_flag(client: &mut ReplicationClient, sql: &str, yes: &str, no: &str) -> Result<bool, Error> {
    let result = client.simple_query(sql).await?;
    match result.text(0, 0) {
        Some(v) if v == yes => Ok(true),
        Some(v) if v == no => Ok(false),
        other => Err(Error::Protocol(format!("'{sql}' answered {other:?}, not '{yes}' or '{no}'"))),
    }
}
