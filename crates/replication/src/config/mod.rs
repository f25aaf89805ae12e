//! Connection settings from a libpq connection string and libpq's environment variables.
//!
//! Both forms libpq takes are accepted (see [`conninfo`] for the syntax):
//! - `postgres://user:password@host1:5432,host2:5433/dbname?sslmode=verify-full&sslrootcert=ca.pem`
//! - `host=host1,host2 port=5432,5433 dbname=shop user=app sslmode=verify-full sslrootcert=ca.pem`
//!
//! Keywords: `host` (comma list; a name starting with `/` is a Unix-socket directory),
//! `hostaddr` (comma list of numeric addresses, optional, one per host), `port` (one for
//! all hosts or one per host), `user`, `password`, `passfile`, `dbname`, `sslmode`
//! (`disable`, `allow` = `prefer`, `prefer`, `require`, `verify-ca`, `verify-full`),
//! `sslrootcert` (a PEM file, or `system`), `application_name`, `connect_timeout` (seconds
//! per host attempt; 0 or less: no limit; 1 counts as 2, as in libpq), `target_session_attrs`
//! (`any`, `read-write`, `read-only`, `primary`, `standby`, `prefer-standby`), `require_auth`,
//! `channel_binding` (`disable`, `prefer`, `require`), `keepalives` (0/1), `keepalives_idle`,
//! `keepalives_interval`, `keepalives_count`, `options` (server settings for the session,
//! e.g. `-c statement_timeout=5s`). Any other keyword is an error naming it.
//!
//! A keyword not in the text takes its libpq environment variable: `PGHOST`, `PGHOSTADDR`,
//! `PGPORT`, `PGUSER`, `PGPASSWORD`, `PGPASSFILE`, `PGDATABASE`, `PGSSLMODE`, `PGSSLROOTCERT`,
//! `PGAPPNAME`, `PGCONNECT_TIMEOUT`, `PGTARGETSESSIONATTRS`, `PGREQUIREAUTH`,
//! `PGCHANNELBINDING`, `PGOPTIONS`. An empty value counts as not set. Without a password in the text or
//! `PGPASSWORD`, each host's password comes from the password file (`passfile`, else
//! `PGPASSFILE`, else `$HOME/.pgpass`; see [`passfile`]).
//!
//! Defaults where walpost differs from libpq: no host means `localhost` over TCP (libpq
//! uses its compiled-in socket directory); `connect_timeout` is 10 s when not given (libpq
//! waits forever); `application_name` is `walpost`; `sslmode=allow` behaves as `prefer`.
//! `sslrootcert=system` makes `verify-full` the default sslmode and refuses weaker ones
//! (libpq 16). `verify-ca`/`verify-full` need `sslrootcert` (no `~/.postgresql/root.crt`).
//!
//! Invariants:
//! - The password never leaves this module in text form except through
//!   [`Config::password`] and [`HostSpec::password`]; [`Config::redacted`] and every
//!   `Debug` hide it.
//! - No [`ConfigError`] quotes a password or text that may be part of one (see [`conninfo`]).
//! - A parsed `Config` has at least one host.
//! - Every session runs with `search_path` = [`SEARCH_PATH`]: [`Config::startup_options`]
//!   puts it after the user's `options`, and the server applies the last `-c` for a
//!   setting, so no connection string, role or database default can widen it.
//!
//! Why one file over 600 lines: libpq's keywords, their environment variables and their
//! precedence (string over environment over default, per host) are one table of rules;
//! the syntax of the two string forms is [`conninfo`]'s.

mod conninfo;
mod passfile;

use std::fmt;
use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

pub use passfile::DEFAULT_SOCKET_DIRS;

/// How TLS is used, with libpq's meanings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SslMode {
    /// Never TLS.
    Disable,
    /// TLS if the server offers it, plaintext otherwise. The certificate is checked only
    /// when `sslrootcert` names a file.
    Prefer,
    /// TLS required. The certificate is checked only when `sslrootcert` names a file (then
    /// this is `VerifyCa`, as in libpq).
    Require,
    /// TLS required, certificate chain checked against `sslrootcert`.
    VerifyCa,
    /// As `VerifyCa`, and the certificate must name the host.
    VerifyFull,
}

impl SslMode {
    fn parse(s: &str, from: &str) -> Result<Self, ConfigError> {
        Ok(match s {
            "disable" => SslMode::Disable,
            "allow" | "prefer" => SslMode::Prefer,
            "require" => SslMode::Require,
            "verify-ca" => SslMode::VerifyCa,
            "verify-full" => SslMode::VerifyFull,
            other => {
                return Err(ConfigError(format!(
                    "sslmode={other}{from} is not one of disable, allow, prefer, require, verify-ca, verify-full"
                )))
            }
        })
    }

    /// Whether a plaintext connection is refused when the server refuses TLS.
    pub fn tls_required(self) -> bool {
        matches!(self, SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull)
    }

    /// The keyword value, e.g. `verify-full`.
    pub fn as_str(self) -> &'static str {
        match self {
            SslMode::Disable => "disable",
            SslMode::Prefer => "prefer",
            SslMode::Require => "require",
            SslMode::VerifyCa => "verify-ca",
            SslMode::VerifyFull => "verify-full",
        }
    }
}

/// The certificates that decide whether a server certificate is trusted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RootCert {
    /// Only the certificates in this PEM file (the system store is not consulted).
    File(PathBuf),
    /// The system's trusted roots (`sslrootcert=system`).
    System,
}

/// libpq's `target_session_attrs`: which server a connection may settle on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TargetSessionAttrs {
    Any,
    /// `transaction_read_only` is off (and the server is not in hot standby).
    ReadWrite,
    ReadOnly,
    /// Not in recovery.
    Primary,
    /// In recovery (hot standby).
    Standby,
    /// A standby if one of the hosts is; any host otherwise.
    PreferStandby,
}

impl TargetSessionAttrs {
    fn parse(s: &str, from: &str) -> Result<Self, ConfigError> {
        Ok(match s {
            "any" => Self::Any,
            "read-write" => Self::ReadWrite,
            "read-only" => Self::ReadOnly,
            "primary" => Self::Primary,
            "standby" => Self::Standby,
            "prefer-standby" => Self::PreferStandby,
            other => {
                return Err(ConfigError(format!(
                    "target_session_attrs={other}{from} is not one of any, read-write, read-only, primary, standby, prefer-standby"
                )))
            }
        })
    }

    /// The keyword value, e.g. `read-write`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Any => "any",
            Self::ReadWrite => "read-write",
            Self::ReadOnly => "read-only",
            Self::Primary => "primary",
            Self::Standby => "standby",
            Self::PreferStandby => "prefer-standby",
        }
    }
}

/// libpq's `channel_binding`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChannelBinding {
    /// Never SCRAM-SHA-256-PLUS.
    Disable,
    /// SCRAM-SHA-256-PLUS when the connection is TLS and the server offers it.
    Prefer,
    /// Only SCRAM-SHA-256-PLUS over TLS is acceptable; every other authentication (and
    /// none at all) is refused.
    Require,
}

impl ChannelBinding {
    fn parse(s: &str, from: &str) -> Result<Self, ConfigError> {
        Ok(match s {
            "disable" => Self::Disable,
            "prefer" => Self::Prefer,
            "require" => Self::Require,
            other => {
                return Err(ConfigError(format!(
                    "channel_binding={other}{from} is not one of disable, prefer, require"
                )))
            }
        })
    }
}

/// An authentication method as `require_auth` names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AuthMethod {
    /// AuthenticationCleartextPassword.
    Password,
    /// AuthenticationMD5Password.
    Md5,
    Gss,
    Sspi,
    /// SASL with SCRAM-SHA-256 or SCRAM-SHA-256-PLUS.
    ScramSha256,
    /// No authentication exchange at all (trust, peer done by the kernel, ...).
    None,
}

impl AuthMethod {
    fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "password" => Self::Password,
            "md5" => Self::Md5,
            "gss" => Self::Gss,
            "sspi" => Self::Sspi,
            "scram-sha-256" => Self::ScramSha256,
            "none" => Self::None,
            _ => return None,
        })
    }

    /// The `require_auth` keyword, e.g. `scram-sha-256`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Password => "password",
            Self::Md5 => "md5",
            Self::Gss => "gss",
            Self::Sspi => "sspi",
            Self::ScramSha256 => "scram-sha-256",
            Self::None => "none",
        }
    }
}

/// libpq's `require_auth`: the methods the server must use (`password,scram-sha-256`), or
/// with `!` the methods it must not use (`!password,!md5`). Positive and negated methods
/// cannot be mixed; `none` governs connections without any authentication exchange.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequireAuth {
    negated: bool,
    methods: Vec<AuthMethod>,
}

impl RequireAuth {
    fn parse(text: &str, from: &str) -> Result<Self, ConfigError> {
        let mut negated = None;
        let mut methods = Vec::new();
        for item in text.split(',') {
            let (neg, name) = match item.strip_prefix('!') {
                Some(name) => (true, name),
                None => (false, item),
            };
            let method = AuthMethod::parse(name).ok_or_else(|| {
                ConfigError(format!(
                    "require_auth{from}: '{item}' is not one of password, md5, gss, sspi, scram-sha-256, none (each may be negated with '!')"
                ))
            })?;
            if *negated.get_or_insert(neg) != neg {
                return Err(ConfigError(format!(
                    "require_auth{from}: negated and non-negated methods cannot be mixed ('{item}')"
                )));
            }
            if methods.contains(&method) {
                return Err(ConfigError(format!("require_auth{from}: '{name}' is given more than once")));
            }
            methods.push(method);
        }
        Ok(RequireAuth { negated: negated.unwrap_or(false), methods })
    }

    /// Whether the server may use `method` (`AuthMethod::None`: skip authentication).
    pub fn allows(&self, method: AuthMethod) -> bool {
        self.methods.contains(&method) != self.negated
    }
}

impl fmt::Display for RequireAuth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let bang = if self.negated { "!" } else { "" };
        let list: Vec<String> = self.methods.iter().map(|m| format!("{bang}{}", m.as_str())).collect();
        write!(f, "require_auth={}", list.join(","))
    }
}

/// TCP keepalive settings (libpq's `keepalives*`); `None` keeps the system default.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Keepalives {
    pub enabled: bool,
    pub idle: Option<Duration>,
    pub interval: Option<Duration>,
    pub count: Option<u32>,
}

/// Where a server listens.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Host {
    Tcp(String),
    /// Directory holding `.s.PGSQL.<port>`.
    Unix(PathBuf),
}

/// One entry of the host list: the host, its optional numeric address and its port.
#[derive(Clone, PartialEq, Eq)]
pub struct HostSpec {
    /// The name used for TLS checks and the password file (and to connect, without `hostaddr`).
    pub host: Host,
    /// Connect to this address instead of resolving `host` (libpq's `hostaddr`).
    pub hostaddr: Option<IpAddr>,
    pub port: u16,
    /// This host's line of the password file, when the connection string has no password.
    passfile_password: Option<String>,
}

impl HostSpec {
    /// The host's password from the password file, if any (the connection string's
    /// password, when given, is used instead: see [`Config::password_for`]).
    pub fn password(&self) -> Option<&str> {
        self.passfile_password.as_deref()
    }

    /// `host:port`, `[v6]:port` or the socket path: how errors and logs name this host.
    pub fn label(&self) -> String {
        let mut text = match &self.host {
            Host::Tcp(name) if name.contains(':') => format!("[{name}]:{}", self.port),
            Host::Tcp(name) => format!("{name}:{}", self.port),
            Host::Unix(dir) => dir.join(format!(".s.PGSQL.{}", self.port)).display().to_string(),
        };
        if let Some(addr) = self.hostaddr.filter(|a| !matches!(&self.host, Host::Tcp(n) if *n == a.to_string())) {
            text.push_str(&format!(" (hostaddr {addr})"));
        }
        text
    }

    /// Whether the connection goes over a Unix-domain socket.
    pub fn is_unix_socket(&self) -> bool {
        matches!(self.host, Host::Unix(_)) && self.hostaddr.is_none()
    }

    fn url_authority(&self) -> String {
        match &self.host {
            Host::Tcp(name) if name.contains(':') => format!("[{name}]:{}", self.port),
            Host::Tcp(name) => format!("{name}:{}", self.port),
            Host::Unix(dir) => format!("{}:{}", dir.display(), self.port),
        }
    }

    /// The host field the password file is matched against.
    fn passfile_host(&self) -> String {
        match &self.host {
            Host::Tcp(name) => name.clone(),
            Host::Unix(dir) if DEFAULT_SOCKET_DIRS.iter().any(|d| dir == std::path::Path::new(d)) => "localhost".into(),
            Host::Unix(dir) => dir.display().to_string(),
        }
    }
}

impl fmt::Display for HostSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.label())
    }
}

impl fmt::Debug for HostSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HostSpec")
            .field("host", &self.host)
            .field("hostaddr", &self.hostaddr)
            .field("port", &self.port)
            .field("passfile_password", &self.passfile_password.as_ref().map(|_| "****"))
            .finish()
    }
}

/// A connection string that cannot be used, with what is wrong in it. Never holds the
/// password or text that may be part of it.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
#[error("invalid PostgreSQL connection string: {0} (forms: postgres://user@host:port[,host2:port]/dbname?keyword=value or host=... port=... dbname=... user=...)")]
pub struct ConfigError(String);

impl ConfigError {
    fn new(text: impl Into<String>) -> Self {
        ConfigError(text.into())
    }
}

/// Parsed connection settings.
#[derive(Clone, PartialEq, Eq)]
pub struct Config {
    /// Tried in order; never empty.
    pub hosts: Vec<HostSpec>,
    pub user: String,
    password: Option<String>,
    /// The password file consulted, when the connection string and PGPASSWORD gave none.
    pub passfile: Option<PathBuf>,
    /// Why the password file was ignored (permissions, not a plain file), for the error
    /// a server asking for a password gets.
    passfile_note: Option<String>,
    pub dbname: String,
    pub sslmode: SslMode,
    pub sslrootcert: Option<RootCert>,
    pub application_name: String,
    /// Per host attempt (TCP, TLS, authentication and the session check); `None`: no limit.
    pub connect_timeout: Option<Duration>,
    pub target_session_attrs: TargetSessionAttrs,
    /// `None`: walpost's default policy (see the crate documentation).
    pub require_auth: Option<RequireAuth>,
    pub channel_binding: ChannelBinding,
    pub keepalives: Keepalives,
    /// The connection string's `options` (or PGOPTIONS), as given: command-line switches
    /// for the server session. Sent with walpost's own (see [`Config::startup_options`]).
    pub options: Option<String>,
}

/// The `search_path` of every walpost session: only the system catalog, then the
/// session's own temporary schema (searched last, never for functions or operators).
/// A schema a role other than walpost's can create objects in (`public`, on PostgreSQL
/// 14 and clusters upgraded from it) is never searched, so a function or operator planted
/// there cannot be chosen instead of a built-in by any SQL walpost runs, or by a function
/// that runs with the caller's search_path.
pub const SEARCH_PATH: &str = "pg_catalog, pg_temp";

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.redacted())
    }
}

/// Where a setting's value came from, for error texts.
struct Setting {
    value: String,
    /// `""` for the connection string, ` (from PGSSLMODE)` for a variable.
    from: String,
}

const ENV_VARS: &[(&str, &str)] = &[
    ("host", "PGHOST"),
    ("hostaddr", "PGHOSTADDR"),
    ("port", "PGPORT"),
    ("user", "PGUSER"),
    ("password", "PGPASSWORD"),
    ("passfile", "PGPASSFILE"),
    ("dbname", "PGDATABASE"),
    ("sslmode", "PGSSLMODE"),
    ("sslrootcert", "PGSSLROOTCERT"),
    ("application_name", "PGAPPNAME"),
    ("connect_timeout", "PGCONNECT_TIMEOUT"),
    ("target_session_attrs", "PGTARGETSESSIONATTRS"),
    ("require_auth", "PGREQUIREAUTH"),
    ("channel_binding", "PGCHANNELBINDING"),
    ("options", "PGOPTIONS"),
];

/// walpost's `connect_timeout` when neither the text nor PGCONNECT_TIMEOUT gives one.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

impl Config {
    /// Parses a connection string (URL or key/value), with defaults from the process
    /// environment (`PG*`, `HOME` for `~/.pgpass`, `USER` for the user name).
    pub fn parse(text: &str) -> Result<Config, ConfigError> {
        Self::parse_with_env(text, &|name| std::env::var(name).ok())
    }

    /// The same as [`Config::parse`]: kept for callers that pass URLs; key/value
    /// strings are accepted too.
    pub fn from_url(text: &str) -> Result<Config, ConfigError> {
        Self::parse(text)
    }

    /// [`Config::parse`] with the environment read through `env` (tests pass a map, so
    /// they do not race on the process environment). The password file is read here.
    pub fn parse_with_env(text: &str, env: &dyn Fn(&str) -> Option<String>) -> Result<Config, ConfigError> {
        let params = conninfo::parse(text)?;
        let setting = |key: &'static str| -> Option<Setting> {
            if let Some(value) = params.get(key) {
                return Some(Setting { value: value.clone(), from: String::new() }).filter(|s| !s.value.is_empty());
            }
            let var = ENV_VARS.iter().find(|(k, _)| *k == key).map(|(_, v)| *v)?;
            env(var).filter(|v| !v.is_empty()).map(|value| Setting { value, from: format!(" (from {var})") })
        };

        let user = match setting("user") {
            Some(s) => s.value,
            None => env("USER")
                .or_else(|| env("LOGNAME"))
                .filter(|u| !u.is_empty())
                .ok_or_else(|| ConfigError::new("no user name given (user= in the connection string, or PGUSER)"))?,
        };
        let dbname = setting("dbname").map_or_else(|| user.clone(), |s| s.value);
        let mut hosts = host_list(setting("host"), setting("hostaddr"), setting("port"))?;
        let password = setting("password").map(|s| s.value);

        let mut passfile_path = None;
        let mut passfile_note = None;
        if password.is_none() {
            let path = setting("passfile")
                .map(|s| PathBuf::from(s.value))
                .or_else(|| env("HOME").filter(|h| !h.is_empty()).map(|home| PathBuf::from(home).join(".pgpass")));
            if let Some(path) = path {
                let file = passfile::PassFile::load(&path);
                for host in &mut hosts {
                    host.passfile_password = file.lookup(&host.passfile_host(), host.port, &dbname, &user);
                }
                if let Some(note) = &file.note {
                    tracing::warn!("{note}");
                }
                passfile_note = file.note;
                passfile_path = Some(file.path);
            }
        }

        let sslrootcert = setting("sslrootcert").map(|s| match s.value.as_str() {
            "system" => RootCert::System,
            _ => RootCert::File(PathBuf::from(s.value)),
        });
        let sslmode = match setting("sslmode") {
            Some(s) => {
                let mode = SslMode::parse(&s.value, &s.from)?;
                if sslrootcert == Some(RootCert::System) && mode != SslMode::VerifyFull {
                    return Err(ConfigError(format!(
                        "sslmode={}{} cannot be used with sslrootcert=system: the system's roots trust anyone's certificate for a name they control, so only sslmode=verify-full is allowed",
                        s.value, s.from
                    )));
                }
                mode
            }
            None if sslrootcert == Some(RootCert::System) => SslMode::VerifyFull,
            None => SslMode::Prefer,
        };
        if matches!(sslmode, SslMode::VerifyCa | SslMode::VerifyFull) && sslrootcert.is_none() {
            return Err(ConfigError(format!(
                "sslmode={} needs sslrootcert=<path to the CA certificate> (or sslrootcert=system)",
                sslmode.as_str()
            )));
        }

        let connect_timeout = match setting("connect_timeout") {
            None => Some(DEFAULT_CONNECT_TIMEOUT),
            Some(s) => {
                let secs: i64 = s.value.trim().parse().map_err(|_| {
                    ConfigError(format!("connect_timeout={}{} is not a whole number of seconds", s.value, s.from))
                })?;
                u64::try_from(secs).ok().filter(|s| *s > 0).map(|s| Duration::from_secs(s.max(2)))
            }
        };
        let target_session_attrs = match setting("target_session_attrs") {
            Some(s) => TargetSessionAttrs::parse(&s.value, &s.from)?,
            None => TargetSessionAttrs::Any,
        };
        let require_auth = setting("require_auth").map(|s| RequireAuth::parse(&s.value, &s.from)).transpose()?;
        let channel_binding = match setting("channel_binding") {
            Some(s) => ChannelBinding::parse(&s.value, &s.from)?,
            None => ChannelBinding::Prefer,
        };
        let keepalives = Keepalives {
            enabled: setting("keepalives")
                .map(|s| int_setting::<i64>(&s, "keepalives"))
                .transpose()?
                .is_none_or(|v| v != 0),
            idle: seconds_setting(setting("keepalives_idle"), "keepalives_idle")?,
            interval: seconds_setting(setting("keepalives_interval"), "keepalives_interval")?,
            count: setting("keepalives_count")
                .map(|s| int_setting::<u32>(&s, "keepalives_count"))
                .transpose()?
                .filter(|c| *c > 0),
        };

        Ok(Config {
            hosts,
            user,
            password,
            passfile: passfile_path,
            passfile_note,
            dbname,
            sslmode,
            sslrootcert,
            application_name: setting("application_name").map_or_else(|| "walpost".into(), |s| s.value),
            connect_timeout,
            target_session_attrs,
            require_auth,
            channel_binding,
            keepalives,
            options: setting("options").map(checked_options).transpose()?,
        })
    }

    /// The startup packet's `options`: the user's `options`, then
    /// `-c search_path=pg_catalog,pg_temp`. The server applies the switches in order, so
    /// walpost's search_path wins over one the user's options set, and over role and
    /// database defaults (`ALTER ROLE ... SET search_path`), which a startup setting
    /// always overrides.
    pub fn startup_options(&self) -> String {
        let fixed = format!("-c search_path={}", SEARCH_PATH.replace(' ', ""));
        match self.options.as_deref().map(str::trim).filter(|o| !o.is_empty()) {
            Some(user) => format!("{user} {fixed}"),
            None => fixed,
        }
    }

    /// The password of the connection string or PGPASSWORD, if one was given.
    pub fn password(&self) -> Option<&str> {
        self.password.as_deref()
    }

    /// The password to use with `host`: the connection string's or PGPASSWORD, else the
    /// host's line of the password file.
    pub fn password_for<'a>(&'a self, host: &'a HostSpec) -> Option<&'a str> {
        self.password().or(host.password())
    }

    /// Sets the password when the connection string (and PGPASSWORD) gave none: for a
    /// password read from a file the caller names. Returns whether it was set.
    pub fn set_password_if_missing(&mut self, password: String) -> bool {
        if self.password.is_some() {
            return false;
        }
        self.password = Some(password);
        true
    }

    /// Why the password file was not used, if it exists but was ignored.
    pub fn passfile_note(&self) -> Option<&str> {
        self.passfile_note.as_deref()
    }

    /// This configuration with `host` as its only host: for SQL connections that must
    /// reach the server a replication connection chose (see
    /// `ReplicationClient::connected_host`).
    pub fn pinned_to(&self, host: &HostSpec) -> Config {
        Config { hosts: vec![host.clone()], ..self.clone() }
    }

    /// Whether the server certificate's chain is checked: `verify-ca` and `verify-full`,
    /// and `prefer`/`require` with an `sslrootcert` file (libpq checks the chain whenever
    /// a root file is given).
    pub fn verifies_certificate(&self) -> bool {
        match self.sslmode {
            SslMode::VerifyCa | SslMode::VerifyFull => true,
            SslMode::Prefer | SslMode::Require => matches!(self.sslrootcert, Some(RootCert::File(_))),
            SslMode::Disable => false,
        }
    }

    /// The settings as a URL with the password replaced by `****`: safe for logs and errors.
    /// Every host is shown; `hostaddr` values follow as a query parameter.
    pub fn redacted(&self) -> String {
        let pw = if self.password.is_some() { ":****" } else { "" };
        let hosts: Vec<String> = self.hosts.iter().map(HostSpec::url_authority).collect();
        let mut text = format!("postgres://{}{}@{}/{}", self.user, pw, hosts.join(","), self.dbname);
        if self.hosts.iter().any(|h| h.hostaddr.is_some()) {
            let addrs: Vec<String> =
                self.hosts.iter().map(|h| h.hostaddr.map(|a| a.to_string()).unwrap_or_default()).collect();
            text.push_str(&format!("?hostaddr={}", addrs.join(",")));
        }
        text
    }
}

/// The user's `options` text, checked so that walpost's switch appended after it stays a
/// switch of its own: a trailing unescaped backslash would escape the space before it.
/// A search_path set there is accepted but said to be overridden.
fn checked_options(s: Setting) -> Result<String, ConfigError> {
    let trailing = s.value.chars().rev().take_while(|c| *c == '\\').count();
    if trailing % 2 == 1 {
        return Err(ConfigError(format!(
            "options{} ends with a lone backslash (which escapes the next character): remove it or write \\\\",
            s.from
        )));
    }
    let lower = s.value.to_ascii_lowercase();
    if lower.contains("search_path") || lower.contains("search-path") {
        tracing::warn!(
            "options{} sets search_path; walpost overrides it with search_path={SEARCH_PATH} on every connection (it qualifies every name it uses)",
            s.from
        );
    }
    Ok(s.value)
}

fn int_setting<T: std::str::FromStr>(s: &Setting, key: &str) -> Result<T, ConfigError> {
    s.value
        .trim()
        .parse()
        .map_err(|_| ConfigError(format!("{key}={}{} is not a whole number in range", s.value, s.from)))
}

fn seconds_setting(s: Option<Setting>, key: &str) -> Result<Option<Duration>, ConfigError> {
    Ok(s.map(|s| int_setting::<u64>(&s, key)).transpose()?.filter(|v| *v > 0).map(Duration::from_secs))
}

/// libpq's host list rules: `host` and `hostaddr` lists of equal length when both are
/// given; one `port` for every host or one per host; empty entries take the defaults.
fn host_list(
    host: Option<Setting>,
    hostaddr: Option<Setting>,
    port: Option<Setting>,
) -> Result<Vec<HostSpec>, ConfigError> {
    let names: Vec<&str> = host.as_ref().map(|s| s.value.split(',').collect()).unwrap_or_default();
    let addrs: Vec<&str> = hostaddr.as_ref().map(|s| s.value.split(',').collect()).unwrap_or_default();
    let count = match (names.len(), addrs.len()) {
        (0, 0) => 1,
        (n, 0) => n,
        (0, a) => a,
        (n, a) if n == a => n,
        (n, a) => return Err(ConfigError(format!("could not match {n} host names to {a} hostaddr values"))),
    };
    let ports: Vec<&str> = port.as_ref().map(|s| s.value.split(',').collect()).unwrap_or_default();
    let port_from = port.as_ref().map(|s| s.from.as_str()).unwrap_or_default();
    if ports.len() > 1 && ports.len() != count {
        return Err(ConfigError(format!("could not match {} port numbers to {count} hosts{port_from}", ports.len())));
    }
    (0..count)
        .map(|i| {
            let name = names.get(i).copied().unwrap_or_default();
            let addr = addrs.get(i).copied().unwrap_or_default();
            let hostaddr = match addr {
                "" => None,
                a => Some(a.parse::<IpAddr>().map_err(|_| {
                    let from = hostaddr.as_ref().map(|s| s.from.as_str()).unwrap_or_default();
                    ConfigError(format!("hostaddr '{a}'{from} is not a numeric IP address"))
                })?),
            };
            let host = match (name, hostaddr) {
                ("", Some(addr)) => Host::Tcp(addr.to_string()),
                ("", None) => Host::Tcp("localhost".into()),
                (n, _) if n.starts_with('/') => Host::Unix(PathBuf::from(n)),
                (n, _) => Host::Tcp(n.to_owned()),
            };
            let port_text = if ports.len() == 1 { ports.first() } else { ports.get(i) }.copied().unwrap_or_default();
            let port =
                match port_text {
                    "" => 5432,
                    p => p.trim().parse::<u16>().ok().filter(|p| *p != 0).ok_or_else(|| {
                        ConfigError(format!("port '{p}'{port_from} is not a number between 1 and 65535"))
                    })?,
                };
            Ok(HostSpec { host, hostaddr, port, passfile_password: None })
        })
        .collect()
}

#[cfg(test)]
mod tests;
