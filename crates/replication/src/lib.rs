//! A PostgreSQL logical replication connection on tokio and `postgres-protocol`.
//!
//! Connects with `replication=database` (or as an ordinary SQL session) over TCP or a
//! Unix socket, to the first usable host of a libpq connection string ([`Config`]: URL or
//! key/value form, several hosts, `target_session_attrs`, `PG*` variables, the password
//! file). Negotiates TLS per libpq's `sslmode`, authenticates (trust, cleartext, md5,
//! SCRAM-SHA-256[-PLUS]) under an explicit policy, runs the replication commands walpost
//! needs (IDENTIFY_SYSTEM, CREATE_REPLICATION_SLOT, DROP_REPLICATION_SLOT, plain SQL such
//! as SHOW, COPY FROM STDIN for bulk writes) and then turns into a [`ReplicationStream`] of XLogData and keepalive messages.
//! On an ordinary SQL connection, [`ReplicationClient::query`] runs a statement with bind
//! parameters (the extended query protocol): values never become SQL text.
//!
//! Authentication policy (details in `auth.rs`): with `require_auth` given, libpq's rules
//! apply as written. Without it, walpost never sends a cleartext password or an MD5
//! response except over a Unix-domain socket or TLS with a verified certificate
//! (`sslmode=verify-ca`/`verify-full`, or an `sslrootcert` file); such a request is
//! refused with [`Error::AuthRefused`], which says how to allow it (`require_auth=password`
//! or `require_auth=md5`, or verify-full TLS). SCRAM is always allowed. `channel_binding=require`
//! accepts only SCRAM-SHA-256-PLUS over TLS. An `sslrootcert` file alone decides which
//! certificates are trusted (no system roots); `sslrootcert=system` means the system's.
//!
//! Invariants:
//! - Nothing secret is sent before the policy allows the server's request: the password
//!   (or an MD5 hash of it) never reaches an unverified server by default.
//! - Values reach SQL as bind parameters ([`ReplicationClient::query`]). The only values
//!   written into command text are those no parameter can carry, each quoted or checked
//!   in one named place here: the options of START_REPLICATION (`replication_literal`)
//!   and the snapshot of SET TRANSACTION SNAPSHOT
//!   ([`ReplicationClient::set_transaction_snapshot`]).
//! - Every session starts with `standard_conforming_strings=on`, so quoted literals
//!   ([`quote_literal`]) cannot be reinterpreted by a server setting.
//! - Every session starts with `search_path` = [`SEARCH_PATH`] (`pg_catalog, pg_temp`),
//!   appended to the user's `options`, so no function or operator planted in a schema
//!   another role can write to (`public` on PostgreSQL 14) is ever resolved by walpost's
//!   SQL, nor by functions that run with the session's search_path.
//! - The stream never confirms anything by itself: standby status updates carry only
//!   the positions the caller passes to [`ReplicationStream::send_status`].
//! - [`ReplicationStream::next`] is cancel-safe: bytes read but not yet framed stay in
//!   the buffer, so it can sit in a `select!` beside timers and ack channels.
//! - CopyData bodies are `Bytes` slices of the socket buffer (no copy).
//! - Hostile bytes from the server are errors, never panics (see [`frame`]).
//! - No error text holds the password (see [`Config`] and [`Error`]).

// Hostile input must never panic the crate's own code (tests may fail loudly).
#![cfg_attr(not(test), deny(clippy::indexing_slicing, clippy::panic, clippy::unwrap_used, clippy::expect_used))]

mod auth;
mod client;
mod config;
mod connect;
mod error;
pub mod frame;
mod percent;
mod sql;
pub mod sqlstate;
mod tls;
mod transport;

pub use client::{
    CreatedSlot, QueryResult, ReplicationClient, ReplicationStream, SlotSnapshot, SystemInfo, COPY_CHUNK, MAX_PARAMS,
    MAX_PARAMS_BYTES,
};
pub use config::{
    AuthMethod, ChannelBinding, Config, ConfigError, Host, HostSpec, Keepalives, RequireAuth, RootCert, SslMode,
    TargetSessionAttrs, DEFAULT_CONNECT_TIMEOUT, DEFAULT_SOCKET_DIRS, SEARCH_PATH,
};
pub use error::{Error, HostFailure, Oversized};
pub use frame::ServerMessage;
pub use percent::{percent_decode, PercentError};
pub use sql::{quote_ident, quote_literal, validate_identifier, validate_slot_name, InvalidName, MAX_IDENTIFIER_BYTES};
