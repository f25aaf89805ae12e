//! Connection settings parsed from a libpq-style URL.
//!
//! `postgres://user:password@host:port/dbname?sslmode=verify-full&sslrootcert=ca.pem`.
//! A host that starts with `/` (percent-encoded in the authority, or given as the
//! `host` query parameter) is a Unix-socket directory, as with libpq.
//!
//! Invariant: the password never leaves this module in text form except through
//! [`Config::password`]; [`Config::redacted`] and `Debug` replace it with `****`.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

/// How TLS is used, with libpq's meanings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SslMode {
    /// Never TLS.
    Disable,
    /// TLS if the server offers it, without certificate checks; plaintext otherwise.
    Prefer,
    /// TLS required, certificate not checked.
    Require,
    /// TLS required, certificate chain checked against `sslrootcert`.
    VerifyCa,
    /// As `VerifyCa`, and the certificate must name the host.
    VerifyFull,
}

impl SslMode {
    fn parse(s: &str) -> Result<Self, ConfigError> {
        Ok(match s {
            "disable" => SslMode::Disable,
            "allow" | "prefer" => SslMode::Prefer,
            "require" => SslMode::Require,
            "verify-ca" => SslMode::VerifyCa,
            "verify-full" => SslMode::VerifyFull,
            other => {
                return Err(ConfigError(format!(
                    "sslmode={other} is not one of disable, prefer, require, verify-ca, verify-full"
                )))
            }
        })
    }

    /// Whether a plaintext connection is acceptable when the server refuses TLS.
    pub fn tls_required(self) -> bool {
        matches!(self, SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull)
    }
}

/// Where the server listens.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Host {
    Tcp(String),
    /// Directory holding `.s.PGSQL.<port>`.
    Unix(PathBuf),
}

/// A connection string that cannot be used, with what is wrong in it.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
#[error("invalid PostgreSQL connection URL: {0} (expected postgres://user:password@host:port/dbname?sslmode=...)")]
pub struct ConfigError(String);

/// Parsed connection settings.
#[derive(Clone, PartialEq, Eq)]
pub struct Config {
    pub host: Host,
    pub port: u16,
    pub user: String,
    password: Option<String>,
    pub dbname: String,
    pub sslmode: SslMode,
    pub sslrootcert: Option<PathBuf>,
    pub application_name: String,
    pub connect_timeout: Duration,
}

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.redacted())
    }
}

impl Config {
    /// Parses a `postgres://` or `postgresql://` URL.
    pub fn from_url(url: &str) -> Result<Config, ConfigError> {
        let rest = url
            .strip_prefix("postgres://")
            .or_else(|| url.strip_prefix("postgresql://"))
            .ok_or_else(|| ConfigError("it must start with postgres:// or postgresql://".into()))?;
        let (before_query, query) = match rest.split_once('?') {
            Some((a, q)) => (a, Some(q)),
            None => (rest, None),
        };
        let (authority, path) = match before_query.split_once('/') {
            Some((a, p)) => (a, p),
            None => (before_query, ""),
        };
        let (userinfo, hostport) = match authority.rsplit_once('@') {
            Some((u, h)) => (Some(u), h),
            None => (None, authority),
        };
        let (user, password) = match userinfo {
            Some(u) => match u.split_once(':') {
                Some((user, pw)) => (percent_decode(user)?, Some(percent_decode(pw)?)),
                None => (percent_decode(u)?, None),
            },
            None => (String::new(), None),
        };
        let (host_text, port_text) = split_host_port(hostport)?;
        let mut config = Config {
            host: host_from_text(&percent_decode(host_text)?),
            port: match port_text {
                Some(p) => parse_port(p)?,
                None => 5432,
            },
            user,
            password,
            dbname: percent_decode(path)?,
            sslmode: SslMode::Prefer,
            sslrootcert: None,
            application_name: "walpost".into(),
            connect_timeout: Duration::from_secs(10),
        };
        for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
            let (key, value) =
                pair.split_once('=').ok_or_else(|| ConfigError(format!("query parameter '{pair}' has no '='")))?;
            let value = percent_decode(value)?;
            match key {
                "sslmode" => config.sslmode = SslMode::parse(&value)?,
                "sslrootcert" => config.sslrootcert = Some(PathBuf::from(value)),
                "host" => config.host = host_from_text(&value),
                "port" => config.port = parse_port(&value)?,
                "user" => config.user = value,
                "password" => config.password = Some(value),
                "dbname" => config.dbname = value,
                "application_name" => config.application_name = value,
                "connect_timeout" => {
                    let secs: u64 = value.parse().map_err(|_| {
                        ConfigError(format!("connect_timeout={value} is not a number of seconds"))
                    })?;
                    config.connect_timeout = Duration::from_secs(secs.max(1));
                }
                other => {
                    return Err(ConfigError(format!(
                        "query parameter '{other}' is not supported (known: sslmode, sslrootcert, host, port, user, password, dbname, application_name, connect_timeout)"
                    )))
                }
            }
        }
        if config.user.is_empty() {
            config.user = std::env::var("PGUSER")
                .or_else(|_| std::env::var("USER"))
                .map_err(|_| ConfigError("no user name given".into()))?;
        }
        if config.password.is_none() {
            config.password = std::env::var("PGPASSWORD").ok();
        }
        if config.dbname.is_empty() {
            config.dbname = config.user.clone();
        }
        if matches!(config.host, Host::Tcp(ref h) if h.is_empty()) {
            config.host = Host::Tcp("localhost".into());
        }
        if matches!(config.sslmode, SslMode::VerifyCa | SslMode::VerifyFull) && config.sslrootcert.is_none() {
            return Err(ConfigError(format!(
                "sslmode={} needs sslrootcert=<path to the CA certificate>",
                if config.sslmode == SslMode::VerifyCa { "verify-ca" } else { "verify-full" }
            )));
        }
        Ok(config)
    }

    /// The password, if one was given (in the URL or PGPASSWORD).
    pub fn password(&self) -> Option<&str> {
        self.password.as_deref()
    }

    /// The URL with the password replaced by `****`: safe for logs and errors.
    pub fn redacted(&self) -> String {
        let host = match &self.host {
            Host::Tcp(h) => h.clone(),
            Host::Unix(p) => p.display().to_string(),
        };
        let pw = if self.password.is_some() { ":****" } else { "" };
        format!("postgres://{}{}@{}:{}/{}", self.user, pw, host, self.port, self.dbname)
    }
}

fn host_from_text(text: &str) -> Host {
    if text.starts_with('/') {
        Host::Unix(PathBuf::from(text))
    } else {
        Host::Tcp(text.to_owned())
    }
}

fn parse_port(text: &str) -> Result<u16, ConfigError> {
    text.parse().map_err(|_| ConfigError(format!("port '{text}' is not a number between 1 and 65535")))
}

fn split_host_port(hostport: &str) -> Result<(&str, Option<&str>), ConfigError> {
    if let Some(inner) = hostport.strip_prefix('[') {
        // IPv6 literal: [::1]:5432
        let (host, after) = inner.split_once(']').ok_or_else(|| ConfigError("IPv6 host has no closing ']'".into()))?;
        let port = match after.strip_prefix(':') {
            Some(p) => Some(p),
            None if after.is_empty() => None,
            None => return Err(ConfigError(format!("unexpected '{after}' after IPv6 host"))),
        };
        return Ok((host, port));
    }
    Ok(match hostport.rsplit_once(':') {
        Some((h, p)) => (h, Some(p)),
        None => (hostport, None),
    })
}

fn percent_decode(text: &str) -> Result<String, ConfigError> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut iter = bytes.iter();
    while let Some(&b) = iter.next() {
        if b == b'%' {
            let hi = iter.next().and_then(|c| (*c as char).to_digit(16));
            let lo = iter.next().and_then(|c| (*c as char).to_digit(16));
            match (hi, lo) {
                (Some(h), Some(l)) => out.push(u8::try_from(h * 16 + l).unwrap_or(b'?')),
                _ => return Err(ConfigError("a '%' escape is not followed by two hex digits".into())),
            }
        } else {
            out.push(b);
        }
    }
    String::from_utf8(out).map_err(|_| ConfigError("a percent-escape decodes to invalid UTF-8".into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_full_url() {
        let c =
            Config::from_url("postgres://app:s%40cret@db.example:6543/shop?sslmode=verify-full&sslrootcert=/ca.pem")
                .unwrap();
        assert_eq!(c.host, Host::Tcp("db.example".into()));
        assert_eq!(c.port, 6543);
        assert_eq!(c.user, "app");
        assert_eq!(c.password(), Some("s@cret"));
        assert_eq!(c.dbname, "shop");
        assert_eq!(c.sslmode, SslMode::VerifyFull);
        assert_eq!(c.sslrootcert, Some(PathBuf::from("/ca.pem")));
    }

    #[test]
    fn unix_socket_host_in_authority_or_query() {
        let a = Config::from_url("postgres://u@%2Fvar%2Frun%2Fpostgresql:5433/db").unwrap();
        assert_eq!(a.host, Host::Unix("/var/run/postgresql".into()));
        assert_eq!(a.port, 5433);
        let b = Config::from_url("postgresql://u@/db?host=/tmp").unwrap();
        assert_eq!(b.host, Host::Unix("/tmp".into()));
    }

    #[test]
    fn ipv6_host() {
        let c = Config::from_url("postgres://u@[::1]:5999/db").unwrap();
        assert_eq!(c.host, Host::Tcp("::1".into()));
        assert_eq!(c.port, 5999);
    }

    #[test]
    fn redaction_hides_password() {
        let c = Config::from_url("postgres://u:hunter2@h/db").unwrap();
        assert!(!c.redacted().contains("hunter2"));
        assert!(!format!("{c:?}").contains("hunter2"));
        assert!(c.redacted().contains("****"));
    }

    #[test]
    fn errors_name_the_problem() {
        let e = Config::from_url("mysql://x").unwrap_err().to_string();
        assert!(e.contains("postgres://"), "{e}");
        let e = Config::from_url("postgres://u@h/db?sslmode=bogus").unwrap_err().to_string();
        assert!(e.contains("sslmode=bogus"), "{e}");
        let e = Config::from_url("postgres://u@h:99999/db").unwrap_err().to_string();
        assert!(e.contains("99999"), "{e}");
        let e = Config::from_url("postgres://u@h/db?sslmode=verify-ca").unwrap_err().to_string();
        assert!(e.contains("sslrootcert"), "{e}");
        let e = Config::from_url("postgres://u@h/db?frobnicate=1").unwrap_err().to_string();
        assert!(e.contains("frobnicate"), "{e}");
    }
}
