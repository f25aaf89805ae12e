//! The client side of a session: startup and authentication over an open transport,
//! simple queries (statements with bind parameters: `client/extended.rs`), the
//! replication commands, and the CopyBoth stream ([`ReplicationStream`]) that
//! START_REPLICATION turns the connection into. Opening the transport and choosing the
//! host are `connect.rs`'s.
//!
//! Why one file over 600 lines: startup (authentication itself is `auth.rs`'s), simple
//! queries, the replication commands and the CopyBoth stream share one connection's
//! framing and buffers (`read_frame`, `split_frame`), and follow the protocol's order.

use std::collections::HashMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::{Buf, BufMut, Bytes, BytesMut};
use pgoutput::wire::{self, ReplicationMessage};
use pgoutput::Lsn;
use postgres_protocol::authentication::sasl::ScramSha256;
use postgres_protocol::message::frontend;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::auth::{self, Channel, Completed, Request};
use crate::config::{Config, HostSpec};
use crate::error::Error;
use crate::frame;
use crate::sql::{self, quote_ident, InvalidName};
use crate::transport::{Opened, Transport};

mod extended;
pub use extended::{MAX_PARAMS, MAX_PARAMS_BYTES};

/// What IDENTIFY_SYSTEM reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SystemInfo {
    pub system_id: String,
    pub timeline: u32,
    pub xlog_pos: Lsn,
    pub dbname: Option<String>,
}

/// What to do with the snapshot a new logical slot exports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlotSnapshot {
    /// Export it: valid until the next command on this connection. For an initial snapshot.
    Export,
    /// Do not export one.
    Nothing,
}

/// The answer to CREATE_REPLICATION_SLOT.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreatedSlot {
    pub slot_name: String,
    pub consistent_point: Lsn,
    pub snapshot_name: Option<String>,
    pub output_plugin: String,
}

/// Rows of a statement (simple or extended protocol): text-format values as `Bytes`
/// slices of the wire frames.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QueryResult {
    pub columns: Vec<String>,
    /// Type oid of each column.
    pub column_types: Vec<u32>,
    /// Type modifier of each column (`atttypmod`: the precision of `timestamp(3)`; -1: none).
    pub column_type_modifiers: Vec<i32>,
    pub rows: Vec<Vec<Option<Bytes>>>,
}

impl QueryResult {
    /// The value of `column` in the first row, if present and UTF-8.
    pub fn first(&self, column: &str) -> Option<&str> {
        let idx = self.columns.iter().position(|c| c == column)?;
        self.text(0, idx)
    }

    /// The value at (`row`, `col`) as text, if present and UTF-8.
    pub fn text(&self, row: usize, col: usize) -> Option<&str> {
        let value = self.rows.get(row)?.get(col)?.as_ref()?;
        std::str::from_utf8(value).ok()
    }
}

/// A replication-mode (or SQL) connection before START_REPLICATION.
pub struct ReplicationClient {
    io: Box<dyn Transport>,
    /// RFC 5929 tls-server-end-point data when the connection is TLS (SCRAM-SHA-256-PLUS).
    tls_end_point: Option<Vec<u8>>,
    channel: Channel,
    /// The host of the connection string this connection reached.
    host: HostSpec,
    buf: BytesMut,
    out: BytesMut,
    params: HashMap<String, String>,
    /// CopyData messages longer than this are dropped as they arrive (streaming only).
    max_message_len: Option<usize>,
    dropping: Option<Dropping>,
}

impl std::fmt::Debug for ReplicationClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReplicationClient")
            .field("host", &self.host.label())
            .field("server_version", &self.params.get("server_version"))
            .finish()
    }
}

const READ_CHUNK: usize = 128 * 1024;

/// The largest CopyData message [`ReplicationClient::copy_in`] sends.
pub const COPY_CHUNK: usize = 1 << 20;

/// How much of a message over the limit is kept (its header and first columns: enough to
/// name the event in most outboxes).
pub(crate) const OVERSIZED_PREFIX: usize = 64 * 1024;

/// A CopyData message over the limit, being read and dropped.
#[derive(Debug)]
struct Dropping {
    len: usize,
    left: usize,
    prefix: BytesMut,
}

impl ReplicationClient {
    /// A client over a transport `connect.rs` opened to `host`, before startup.
    pub(crate) fn new(opened: Opened, host: HostSpec) -> ReplicationClient {
        ReplicationClient {
            io: opened.io,
            channel: opened.channel,
            tls_end_point: opened.tls_end_point,
            host,
            buf: BytesMut::with_capacity(READ_CHUNK),
            max_message_len: None,
            dropping: None,
            out: BytesMut::with_capacity(1024),
            params: HashMap::new(),
        }
    }

    /// The host of the connection string this connection reached.
    pub fn connected_host(&self) -> &HostSpec {
        &self.host
    }

    /// Whether the connection is TLS.
    pub fn is_tls(&self) -> bool {
        self.channel.is_tls()
    }

    /// Sends the startup message and authenticates, up to ReadyForQuery.
    pub(crate) async fn startup(&mut self, config: &Config, replication: bool) -> Result<(), Error> {
        // The user's options, then search_path = pg_catalog, pg_temp: no schema another
        // role can create objects in is ever searched (see `config::SEARCH_PATH`).
        let options = config.startup_options();
        let mut params = vec![
            ("user", config.user.as_str()),
            ("database", config.dbname.as_str()),
            ("application_name", config.application_name.as_str()),
            ("client_encoding", "UTF8"),
            // Text forms of timestamps (pgoutput and SQL alike) in one known format.
            ("DateStyle", "ISO"),
            ("TimeZone", "UTC"),
            // A backslash in '...' is a backslash, whatever the server's default.
            ("standard_conforming_strings", "on"),
            ("options", options.as_str()),
        ];
        if replication {
            params.push(("replication", "database"));
        }
        frontend::startup_message(params, &mut self.out).map_err(Error::Io)?;
        self.flush_out().await?;
        let host = self.host.label();
        let mut scram: Option<ScramSha256> = None;
        let mut completed = Completed::Nothing;
        loop {
            let frame = self.read_frame().await?;
            match frame.tag {
                b'R' => {
                    let (code, data) = frame::parse_auth_request(&frame.body)?;
                    match code {
                        0 => auth::check_ok(config, &host, completed)?,
                        3 => {
                            auth::check_request(config, &host, self.channel, Request::Cleartext)?;
                            let pw = require_password(config, &self.host)?;
                            frontend::password_message(pw.as_bytes(), &mut self.out).map_err(Error::Io)?;
                            self.flush_out().await?;
                            completed = Completed::Password;
                        }
                        5 => {
                            auth::check_request(config, &host, self.channel, Request::Md5)?;
                            let pw = require_password(config, &self.host)?;
                            let salt: [u8; 4] = data
                                .get(..4)
                                .and_then(|s| s.try_into().ok())
                                .ok_or_else(|| Error::Protocol("md5 request without salt".into()))?;
                            let hash = postgres_protocol::authentication::md5_hash(
                                config.user.as_bytes(),
                                pw.as_bytes(),
                                salt,
                            );
                            frontend::password_message(hash.as_bytes(), &mut self.out).map_err(Error::Io)?;
                            self.flush_out().await?;
                            completed = Completed::Md5;
                        }
                        10 => {
                            auth::check_request(config, &host, self.channel, Request::Sasl)?;
                            let offers = |name: &[u8]| data.split(|&b| b == 0).any(|m| m == name);
                            let (mechanism, binding) = auth::choose_scram(
                                config,
                                &host,
                                self.channel,
                                self.tls_end_point.as_deref(),
                                offers(b"SCRAM-SHA-256-PLUS"),
                                offers(b"SCRAM-SHA-256"),
                            )?;
                            let pw = require_password(config, &self.host)?;
                            let s = ScramSha256::new(pw.as_bytes(), binding);
                            frontend::sasl_initial_response(mechanism, s.message(), &mut self.out)
                                .map_err(Error::Io)?;
                            self.flush_out().await?;
                            scram = Some(s);
                            completed = Completed::ScramUnfinished { plus: mechanism.ends_with("-PLUS") };
                        }
                        11 => {
                            let s = scram
                                .as_mut()
                                .ok_or_else(|| Error::Protocol("SASL continue before SASL start".into()))?;
                            s.update(&data)
                                .map_err(|e| Error::Auth { message: format!("SCRAM: {e}"), source: Some(e) })?;
                            frontend::sasl_response(s.message(), &mut self.out).map_err(Error::Io)?;
                            self.flush_out().await?;
                        }
                        12 => {
                            let mut s =
                                scram.take().ok_or_else(|| Error::Protocol("SASL final before SASL start".into()))?;
                            s.finish(&data).map_err(|e| Error::Auth {
                                message: format!("SCRAM server signature: {e}"),
                                source: Some(e),
                            })?;
                            if let Completed::ScramUnfinished { plus } = completed {
                                completed = Completed::Scram { plus };
                            }
                        }
                        7..=9 => {
                            let request = if code == 9 { Request::Sspi } else { Request::Gss };
                            auth::check_request(config, &host, self.channel, request)?;
                            return Err(unsupported_method(code));
                        }
                        other => return Err(unsupported_method(other)),
                    }
                }
                b'S' => {
                    let (k, v) = frame::parse_parameter_status(&frame.body)?;
                    self.params.insert(k, v);
                }
                b'K' | b'N' => {}
                b'Z' => return Ok(()),
                b'E' => return Err(Error::Server(frame::parse_server_message(b'E', &frame.body)?)),
                other => {
                    return Err(Error::Protocol(format!("unexpected message '{}' during startup", char::from(other))))
                }
            }
        }
    }

    /// A server parameter reported at startup, e.g. `server_version`.
    pub fn parameter(&self, name: &str) -> Option<&str> {
        self.params.get(name).map(String::as_str)
    }

    /// The server's major version (e.g. 15), from `server_version`.
    pub fn server_major_version(&self) -> u32 {
        self.parameter("server_version")
            .and_then(|v| v.split(|c: char| !c.is_ascii_digit()).next())
            .and_then(|m| m.parse().ok())
            .unwrap_or(0)
    }

    /// Runs one statement with the simple query protocol; text results.
    pub async fn simple_query(&mut self, sql: &str) -> Result<QueryResult, Error> {
        frontend::query(sql, &mut self.out).map_err(Error::Io)?;
        self.flush_out().await?;
        self.read_result().await
    }

    /// The rows of a statement, up to ReadyForQuery (read past an error, so the
    /// connection is ready for the next statement); simple and extended protocol alike.
    async fn read_result(&mut self) -> Result<QueryResult, Error> {
        let mut result = QueryResult::default();
        let mut error = None;
        loop {
            let frame = self.read_frame().await?;
            match frame.tag {
                b'T' => {
                    for field in frame::parse_row_description(&frame.body)? {
                        result.columns.push(field.name);
                        result.column_types.push(field.type_oid);
                        result.column_type_modifiers.push(field.type_modifier);
                    }
                }
                b'D' => result.rows.push(frame::parse_data_row(&frame.body)?),
                // CommandComplete, EmptyQueryResponse, notices, parameter status; and of
                // the extended protocol ParseComplete, BindComplete, NoData.
                b'C' | b'I' | b'N' | b'S' | b'1' | b'2' | b'n' => {}
                b'E' => error = Some(frame::parse_server_message(b'E', &frame.body)?),
                b'Z' => {
                    return match error {
                        Some(e) => Err(Error::Server(e)),
                        None => Ok(result),
                    }
                }
                other => {
                    return Err(Error::Protocol(format!(
                        "unexpected message '{}' in a query result",
                        char::from(other)
                    )))
                }
            }
        }
    }

    /// Runs `COPY ... FROM STDIN` (`sql`) with `data` as its whole input (text, CSV or
    /// binary, as `sql` says), sent as CopyData messages of at most [`COPY_CHUNK`] bytes.
    /// Returns the number of rows the server reports. A server error (a bad value, a
    /// missing table) comes back as [`Error::Server`] after the server is ready again:
    /// PostgreSQL reads and ignores the rest of the data once a COPY failed, so sending
    /// it all before reading cannot deadlock.
    pub async fn copy_in(&mut self, sql: &str, data: &[u8]) -> Result<u64, Error> {
        frontend::query(sql, &mut self.out).map_err(Error::Io)?;
        self.flush_out().await?;
        // The server answers CopyInResponse ('G'), or an error and ReadyForQuery.
        let mut error = None;
        loop {
            let frame = self.read_frame().await?;
            match frame.tag {
                b'G' => break,
                b'N' | b'S' => {}
                b'E' => error = Some(frame::parse_server_message(b'E', &frame.body)?),
                b'Z' => {
                    return Err(match error {
                        Some(e) => Error::Server(e),
                        None => Error::Protocol("COPY FROM STDIN ended before it started".into()),
                    })
                }
                other => {
                    return Err(Error::Protocol(format!(
                        "unexpected message '{}' before CopyInResponse",
                        char::from(other)
                    )))
                }
            }
        }
        for chunk in data.chunks(COPY_CHUNK) {
            self.out.put_u8(b'd');
            // A chunk is at most COPY_CHUNK (1 MiB) bytes: its length fits an i32.
            self.out.put_i32(i32::try_from(chunk.len() + 4).unwrap_or(i32::MAX));
            self.out.put_slice(chunk);
            if self.out.len() >= COPY_CHUNK {
                self.flush_out().await?;
            }
        }
        frontend::copy_done(&mut self.out);
        self.flush_out().await?;
        let mut rows = 0;
        loop {
            let frame = self.read_frame().await?;
            match frame.tag {
                b'C' => {
                    let tag = frame.body.split(|&b| b == 0).next().unwrap_or_default();
                    rows = std::str::from_utf8(tag)
                        .ok()
                        .and_then(|t| t.strip_prefix("COPY "))
                        .and_then(|n| n.parse().ok())
                        .unwrap_or(0);
                }
                b'N' | b'S' => {}
                b'E' => error = Some(frame::parse_server_message(b'E', &frame.body)?),
                b'Z' => {
                    return match error {
                        Some(e) => Err(Error::Server(e)),
                        None => Ok(rows),
                    }
                }
                other => {
                    return Err(Error::Protocol(format!("unexpected message '{}' after CopyDone", char::from(other))))
                }
            }
        }
    }

    /// Has the server parse `sql` as one prepared statement (extended protocol: Parse,
    /// Sync) without running it: an error when it is not valid SQL, names something
    /// that does not exist, or holds more than one statement (a Parse message takes
    /// exactly one). Not available on a replication connection.
    pub async fn parse_only(&mut self, sql: &str) -> Result<(), Error> {
        frontend::parse("", sql, std::iter::empty(), &mut self.out).map_err(Error::Io)?;
        frontend::sync(&mut self.out);
        self.flush_out().await?;
        let mut error = None;
        loop {
            let frame = self.read_frame().await?;
            match frame.tag {
                b'1' | b'N' | b'S' => {}
                b'E' => error = Some(frame::parse_server_message(b'E', &frame.body)?),
                b'Z' => {
                    return match error {
                        Some(e) => Err(Error::Server(e)),
                        None => Ok(()),
                    }
                }
                other => {
                    return Err(Error::Protocol(format!("unexpected message '{}' after Parse", char::from(other))))
                }
            }
        }
    }

    /// IDENTIFY_SYSTEM.
    pub async fn identify_system(&mut self) -> Result<SystemInfo, Error> {
        let r = self.simple_query("IDENTIFY_SYSTEM").await?;
        let field =
            |name: &str| r.first(name).ok_or_else(|| Error::Protocol(format!("IDENTIFY_SYSTEM without {name}")));
        Ok(SystemInfo {
            system_id: field("systemid")?.to_owned(),
            timeline: field("timeline")?
                .parse()
                .map_err(|_| Error::Protocol("IDENTIFY_SYSTEM timeline is not a number".into()))?,
            xlog_pos: parse_lsn(field("xlogpos")?)?,
            dbname: r.first("dbname").map(str::to_owned),
        })
    }

    /// CREATE_REPLICATION_SLOT name LOGICAL plugin, in the syntax of the server's version.
    pub async fn create_logical_slot(
        &mut self,
        name: &str,
        plugin: &str,
        snapshot: SlotSnapshot,
        failover: bool,
    ) -> Result<CreatedSlot, Error> {
        sql::validate_slot_name(name)?;
        sql::validate_identifier("output plugin", plugin)?;
        let ident = quote_ident(name);
        let quoted_plugin = quote_ident(plugin);
        let sql = if self.server_major_version() >= 15 {
            let mut opts = vec![match snapshot {
                SlotSnapshot::Export => "SNAPSHOT 'export'",
                SlotSnapshot::Nothing => "SNAPSHOT 'nothing'",
            }];
            if failover {
                opts.push("FAILOVER true");
            }
            format!("CREATE_REPLICATION_SLOT {ident} LOGICAL {quoted_plugin} ({})", opts.join(", "))
        } else {
            if failover {
                return Err(Error::Protocol("failover slots need PostgreSQL 17 or later".into()));
            }
            let snap = match snapshot {
                SlotSnapshot::Export => "EXPORT_SNAPSHOT",
                SlotSnapshot::Nothing => "NOEXPORT_SNAPSHOT",
            };
            format!("CREATE_REPLICATION_SLOT {ident} LOGICAL {quoted_plugin} {snap}")
        };
        let r = self.simple_query(&sql).await?;
        Ok(CreatedSlot {
            slot_name: r.first("slot_name").unwrap_or(name).to_owned(),
            consistent_point: parse_lsn(
                r.first("consistent_point")
                    .ok_or_else(|| Error::Protocol("CREATE_REPLICATION_SLOT without consistent_point".into()))?,
            )?,
            snapshot_name: r.first("snapshot_name").map(str::to_owned),
            output_plugin: r.first("output_plugin").unwrap_or(plugin).to_owned(),
        })
    }

    /// DROP_REPLICATION_SLOT name (WAIT: waits while another process holds it).
    pub async fn drop_slot(&mut self, name: &str, wait: bool) -> Result<(), Error> {
        sql::validate_slot_name(name)?;
        let sql = format!("DROP_REPLICATION_SLOT {}{}", quote_ident(name), if wait { " WAIT" } else { "" });
        self.simple_query(&sql).await.map(|_| ())
    }

    /// START_REPLICATION SLOT slot LOGICAL start (options...), then stream.
    ///
    /// `options` are pgoutput options such as `("proto_version", "1")`,
    /// `("publication_names", "\"walpost_outbox\"")`; values are quoted here, names
    /// checked ([`validate_slot_name`](crate::validate_slot_name),
    /// [`validate_identifier`](crate::validate_identifier)).
    pub async fn start_logical_replication(
        mut self,
        slot: &str,
        start: Lsn,
        options: &[(&str, &str)],
    ) -> Result<ReplicationStream, Error> {
        sql::validate_slot_name(slot)?;
        let opts = options
            .iter()
            .map(|(k, v)| {
                sql::validate_identifier("replication option", k)?;
                Ok(format!("{} {}", quote_ident(k), sql::replication_literal("replication option value", v)?))
            })
            .collect::<Result<Vec<_>, InvalidName>>()?
            .join(", ");
        let sql = format!("START_REPLICATION SLOT {} LOGICAL {} ({})", quote_ident(slot), start, opts);
        frontend::query(&sql, &mut self.out).map_err(Error::Io)?;
        self.flush_out().await?;
        loop {
            let frame = self.read_frame().await?;
            match frame.tag {
                b'W' => return Ok(ReplicationStream { client: self }),
                b'N' | b'S' => {}
                b'E' => {
                    let e = frame::parse_server_message(b'E', &frame.body)?;
                    // Drain to ReadyForQuery so the error is the server's whole answer.
                    return Err(Error::Server(e));
                }
                other => {
                    return Err(Error::Protocol(format!(
                        "unexpected message '{}' after START_REPLICATION",
                        char::from(other)
                    )))
                }
            }
        }
    }

    /// Sends Terminate and closes the connection.
    pub async fn close(mut self) {
        frontend::terminate(&mut self.out);
        let _ = self.flush_out().await;
        let _ = self.io.shutdown().await;
    }

    async fn flush_out(&mut self) -> Result<(), Error> {
        let out = self.out.split();
        self.io.write_all(&out).await?;
        self.io.flush().await?;
        Ok(())
    }

    /// Reads one complete frame. Cancel-safe: partial bytes stay in `self.buf`, and a
    /// message being dropped keeps its state in `self.dropping`.
    async fn read_frame(&mut self) -> Result<frame::Frame, Error> {
        loop {
            if let Some(f) = self.split_frame()? {
                return Ok(f);
            }
            if self.buf.capacity() - self.buf.len() < READ_CHUNK / 4 {
                self.buf.reserve(READ_CHUNK);
            }
            let n = self.io.read_buf(&mut self.buf).await?;
            if n == 0 {
                return Err(Error::Io(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "server closed the connection",
                )));
            }
        }
    }
}

impl ReplicationClient {
    /// The next complete frame in the buffer, if any; a CopyData frame over
    /// `max_message_len` is consumed as its bytes arrive and ends as
    /// [`Error::MessageTooLarge`], never buffered whole.
    fn split_frame(&mut self) -> Result<Option<frame::Frame>, Error> {
        if self.dropping.is_none() {
            if let (Some(limit), Some(header)) = (self.max_message_len, self.buf.get(..5)) {
                let len = <[u8; 4]>::try_from(header.get(1..5).unwrap_or_default())
                    .map(i32::from_be_bytes)
                    .ok()
                    .and_then(|l| usize::try_from(l).ok())
                    .filter(|l| (4..=frame::MAX_FRAME_LEN).contains(l))
                    .map(|l| l - 4);
                if let (Some(&b'd'), Some(len)) = (header.first(), len) {
                    if len > limit {
                        self.buf.advance(5);
                        self.dropping = Some(Dropping {
                            len,
                            left: len,
                            prefix: BytesMut::with_capacity(OVERSIZED_PREFIX.min(len)),
                        });
                    }
                }
            }
        }
        if let Some(d) = self.dropping.as_mut() {
            let take = d.left.min(self.buf.len());
            let keep = take.min(OVERSIZED_PREFIX.saturating_sub(d.prefix.len()));
            d.prefix.extend_from_slice(self.buf.get(..keep).unwrap_or_default());
            self.buf.advance(take);
            d.left -= take;
            if d.left > 0 {
                return Ok(None);
            }
            let Some(d) = self.dropping.take() else { return Ok(None) };
            let limit = self.max_message_len.unwrap_or(frame::MAX_FRAME_LEN);
            return Err(Error::MessageTooLarge(Box::new(crate::Oversized {
                len: d.len,
                limit,
                prefix: d.prefix.freeze(),
            })));
        }
        Ok(frame::split_frame(&mut self.buf)?)
    }
}

/// The CopyBoth phase of a replication connection.
#[derive(Debug)]
pub struct ReplicationStream {
    client: ReplicationClient,
}

impl ReplicationStream {
    /// The next XLogData or keepalive; `Ok(None)` when the server ended the stream
    /// (CopyDone). Cancel-safe.
    pub async fn next(&mut self) -> Result<Option<ReplicationMessage>, Error> {
        loop {
            let frame = self.client.read_frame().await?;
            if let Some(next) = Self::on_frame(frame)? {
                return Ok(next);
            }
        }
    }

    /// [`ReplicationStream::next`] without waiting: the next message if the read buffer
    /// already holds all of it, else `Ok(None)` (no I/O is done). Lets a caller handle a
    /// burst of messages in one turn of its event loop instead of one turn each.
    pub fn try_next(&mut self) -> Result<Option<Option<ReplicationMessage>>, Error> {
        while let Some(frame) = self.client.split_frame()? {
            if let Some(next) = Self::on_frame(frame)? {
                return Ok(Some(next));
            }
        }
        Ok(None)
    }

    /// Messages (CopyData bodies) longer than `len` bytes are read and dropped as they
    /// arrive, never buffered whole, and reported by [`ReplicationStream::next`] as
    /// [`Error::MessageTooLarge`] with their first bytes; the stream goes on after one.
    pub fn set_max_message_len(&mut self, len: usize) {
        self.client.max_message_len = Some(len);
    }

    /// `Some(Some(message))`, `Some(None)` when the stream ended, `None` for frames
    /// that are skipped (notices, parameter status).
    fn on_frame(frame: frame::Frame) -> Result<Option<Option<ReplicationMessage>>, Error> {
        match frame.tag {
            b'd' => Ok(Some(Some(wire::parse_copy_data(frame.body)?))),
            // CopyDone, or (seen on fast shutdown) CommandComplete / ReadyForQuery
            // straight away: the server ended the stream.
            b'c' | b'C' | b'Z' => Ok(Some(None)),
            b'E' => Err(Error::Server(frame::parse_server_message(b'E', &frame.body)?)),
            b'N' => {
                let notice = frame::parse_server_message(b'N', &frame.body)?;
                tracing::info!(code = %notice.code, "PostgreSQL notice: {}", notice.message);
                Ok(None)
            }
            b'S' => Ok(None),
            other => {
                Err(Error::Protocol(format!("unexpected message '{}' in the replication stream", char::from(other))))
            }
        }
    }

    /// Sends a standby status update. `flush` is what the slot may discard up to.
    pub async fn send_status(
        &mut self,
        write: Lsn,
        flush: Lsn,
        apply: Lsn,
        reply_requested: bool,
    ) -> Result<(), Error> {
        let mut payload = BytesMut::with_capacity(34);
        wire::encode_standby_status_update(write, flush, apply, now_pg_micros(), reply_requested, &mut payload);
        let out = &mut self.client.out;
        out.put_u8(b'd');
        out.put_i32(i32::try_from(payload.len() + 4).unwrap_or(i32::MAX));
        out.extend_from_slice(&payload);
        self.client.flush_out().await
    }

    /// Ends the stream politely: CopyDone then Terminate, bounded in time.
    pub async fn close(mut self) {
        frontend::copy_done(&mut self.client.out);
        let _ = tokio::time::timeout(Duration::from_secs(2), self.client.flush_out()).await;
        self.client.close().await;
    }
}

/// Microseconds since 2000-01-01, the clock standby status updates carry.
fn now_pg_micros() -> i64 {
    let unix = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX))
        .unwrap_or(0);
    pgoutput::unix_micros_to_pg_epoch_micros(unix)
}

fn require_password<'a>(config: &'a Config, host: &'a HostSpec) -> Result<&'a str, Error> {
    config.password_for(host).ok_or_else(|| {
        let file = match &config.passfile {
            Some(path) => format!("the password file {}", path.display()),
            None => "the password file (~/.pgpass or PGPASSFILE)".into(),
        };
        let note = config.passfile_note().map(|n| format!("; {n}")).unwrap_or_default();
        Error::auth(format!(
            "the server at {} asks {} for a password and none was given (put it in the connection string, PGPASSWORD or {file}){note}",
            host.label(),
            config.user
        ))
    })
}

fn unsupported_method(code: i32) -> Error {
    Error::auth(format!(
        "server asks for authentication method {code}, which walpost does not support (use scram-sha-256, md5, password or trust)"
    ))
}

fn parse_lsn(text: &str) -> Result<Lsn, Error> {
    text.parse().map_err(|_| Error::Protocol(format!("'{text}' is not an LSN")))
}
