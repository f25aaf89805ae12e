//! Connection strings as text: libpq's two forms turned into (keyword, value) pairs.
//!
//! - URL: `postgres[ql]://[user[:password]@][host[:port][,host[:port]...]][/dbname][?keyword=value&...]`.
//!   The user information ends at the LAST `@` of the text, so a password may hold `@`, `/`,
//!   `?`, `#` and `:` without percent-encoding; `@` in the database name or a query value must
//!   then be written `%40`. Hosts and ports become the comma lists `host` and `port`, as libpq
//!   does; query parameters override what the authority gave.
//! - Key/value: `keyword=value` pairs separated by whitespace; a value is single-quoted to hold
//!   spaces, and a backslash escapes the next character (inside quotes or not).
//!
//! Invariant: no error text quotes a password or anything that may be part of one. Errors
//! quote only keywords walpost knows, names shaped like keywords that do not directly follow
//! a password, and URL ports that come after the `@` (text after the last `@` can never be
//! part of the password). Percent-decoding errors name the component, never its text.

use crate::percent::PercentError;
use std::collections::BTreeMap;

use super::ConfigError;

/// Every keyword a connection string may use.
pub(crate) const KEYWORDS: &[&str] = &[
    "host",
    "hostaddr",
    "port",
    "user",
    "password",
    "passfile",
    "dbname",
    "sslmode",
    "sslrootcert",
    "application_name",
    "connect_timeout",
    "target_session_attrs",
    "require_auth",
    "channel_binding",
    "keepalives",
    "keepalives_idle",
    "keepalives_interval",
    "keepalives_count",
    "options",
];

/// Keyword -> value; a later occurrence replaces an earlier one.
pub(crate) type Params = BTreeMap<&'static str, String>;

/// Parses either form. Text starting with `postgres://` or `postgresql://` is a URL;
/// anything else is key/value pairs (the empty string included: all defaults).
pub(crate) fn parse(text: &str) -> Result<Params, ConfigError> {
    if let Some(rest) = text.strip_prefix("postgresql://").or_else(|| text.strip_prefix("postgres://")) {
        return parse_url(rest);
    }
    if looks_like_other_url(text) {
        return Err(ConfigError::new(
            "it must start with postgres:// or postgresql://, or be keyword=value pairs (host=... dbname=...)",
        ));
    }
    parse_key_values(text)
}

fn keyword(key: &str) -> Option<&'static str> {
    KEYWORDS.iter().copied().find(|k| *k == key)
}

/// ASCII letters, digits, `_` and `-`, starting with a letter, at most 64: the only
/// unknown names an error may quote. A password fragment can reach a keyword position
/// only right after `password=` (a value cut at a space or `&`), and that one is never
/// quoted (see [`unknown_keyword`]); this shape rule keeps anything else odd unquoted too.
fn keyword_shaped(text: &str) -> bool {
    let mut chars = text.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic())
        && text.len() <= 64
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

fn looks_like_other_url(text: &str) -> bool {
    let trimmed = text.trim_start();
    let Some(scheme) = trimmed.find("://").and_then(|i| trimmed.get(..i)) else {
        return false;
    };
    let mut chars = scheme.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
}

/// The error for a keyword walpost does not know.
fn unknown_keyword(key: &str, after_password: bool, form: Form) -> ConfigError {
    if after_password {
        return ConfigError::new(format!(
            "the parameter after the password is not one walpost knows (its name is not shown: it may be part of the password; {})",
            form.password_hint()
        ));
    }
    if keyword_shaped(key) {
        ConfigError::new(format!("unknown parameter '{key}' (known: {})", KEYWORDS.join(", ")))
    } else {
        ConfigError::new(format!(
            "a parameter name is not a known keyword (not shown, as it does not look like one; known: {})",
            KEYWORDS.join(", ")
        ))
    }
}

#[derive(Clone, Copy)]
enum Form {
    Url,
    KeyValue,
}

impl Form {
    fn password_hint(self) -> &'static str {
        match self {
            Form::Url => "a password containing '&' must be percent-encoded as %26",
            Form::KeyValue => "a password containing spaces must be quoted: password='...'",
        }
    }
}

fn parse_key_values(text: &str) -> Result<Params, ConfigError> {
    let mut params = Params::new();
    let mut chars = text.chars().peekable();
    let mut after_password = false;
    loop {
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        if chars.peek().is_none() {
            return Ok(params);
        }
        let mut key = String::new();
        while let Some(c) = chars.next_if(|c| *c != '=' && !c.is_whitespace()) {
            key.push(c);
        }
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        if chars.next_if_eq(&'=').is_none() {
            return Err(match keyword(&key) {
                Some(k) if !after_password => ConfigError::new(format!("missing '=' after '{k}'")),
                _ if after_password => ConfigError::new(format!(
                    "text after the password is not a keyword=value pair (not shown: it may be part of the password; {})",
                    Form::KeyValue.password_hint()
                )),
                _ => ConfigError::new(
                    "a word without '=' where a keyword=value pair was expected (not shown: it may hold a secret)",
                ),
            });
        }
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        let mut value = String::new();
        if chars.next_if_eq(&'\'').is_some() {
            loop {
                match chars.next() {
                    None => {
                        let whose = keyword(&key).filter(|_| !after_password).unwrap_or("a parameter");
                        return Err(ConfigError::new(format!("the quoted value of {whose} has no closing quote")));
                    }
                    Some('\\') => value.extend(chars.next()),
                    Some('\'') => break,
                    Some(c) => value.push(c),
                }
            }
        } else {
            while let Some(c) = chars.next_if(|c| !c.is_whitespace()) {
                if c == '\\' {
                    value.extend(chars.next());
                } else {
                    value.push(c);
                }
            }
        }
        let Some(k) = keyword(&key) else {
            return Err(unknown_keyword(&key, after_password, Form::KeyValue));
        };
        after_password = k == "password";
        params.insert(k, value);
    }
}

fn parse_url(rest: &str) -> Result<Params, ConfigError> {
    let mut params = Params::new();
    let (userinfo, after_userinfo) = match rest.rfind('@') {
        Some(at) => (rest.get(..at), rest.get(at + 1..).unwrap_or_default()),
        None => (None, rest),
    };
    if let Some(userinfo) = userinfo {
        let (user, password) = match userinfo.split_once(':') {
            Some((u, p)) => (u, Some(p)),
            None => (userinfo, None),
        };
        let user = percent_decode(user, "the user name")?;
        if !user.is_empty() {
            params.insert("user", user);
        }
        if let Some(password) = password {
            params.insert("password", percent_decode(password, "the password")?);
        }
    }
    let host_end = after_userinfo.find(['/', '?']).unwrap_or(after_userinfo.len());
    let (hostlist, tail) = after_userinfo.split_at_checked(host_end).unwrap_or((after_userinfo, ""));
    parse_url_hosts(hostlist, userinfo.is_some(), &mut params)?;
    let (path, query) = match tail.strip_prefix('/') {
        Some(path_and_query) => match path_and_query.split_once('?') {
            Some((p, q)) => (p, Some(q)),
            None => (path_and_query, None),
        },
        None => ("", tail.strip_prefix('?')),
    };
    let dbname = percent_decode(path, "the database name")?;
    if !dbname.is_empty() {
        params.insert("dbname", dbname);
    }
    let mut after_password = false;
    for item in query.unwrap_or_default().split('&').filter(|i| !i.is_empty()) {
        let Some((raw_key, raw_value)) = item.split_once('=') else {
            let known = keyword(item).filter(|_| !after_password);
            return Err(match known {
                Some(k) => ConfigError::new(format!("query parameter '{k}' has no '='")),
                None if after_password => ConfigError::new(format!(
                    "text after the password is not a keyword=value pair (not shown: it may be part of the password; {})",
                    Form::Url.password_hint()
                )),
                None => ConfigError::new("a query item has no '=' (not shown: it may hold a secret)"),
            });
        };
        let key = percent_decode(raw_key, "a query parameter name")?;
        let Some(k) = keyword(&key) else {
            return Err(unknown_keyword(&key, after_password, Form::Url));
        };
        let value = percent_decode(raw_value, if k == "password" { "the password" } else { k })?;
        after_password = k == "password";
        params.insert(k, value);
    }
    Ok(params)
}

/// `host[:port],[v6]:port,...` into the `host` and `port` lists. `has_userinfo`: whether
/// the URL had an `@`; without one, `user:password` written without it would read as
/// `host:port`, so a bad port is then described, not quoted.
fn parse_url_hosts(hostlist: &str, has_userinfo: bool, params: &mut Params) -> Result<(), ConfigError> {
    if hostlist.is_empty() {
        return Ok(());
    }
    let mut hosts = Vec::new();
    let mut ports = Vec::new();
    for (i, item) in hostlist.split(',').enumerate() {
        let n = i + 1;
        let (host, port) = if let Some(inner) = item.strip_prefix('[') {
            let (host, after) = inner
                .split_once(']')
                .ok_or_else(|| ConfigError::new(format!("host {n} in the URL: an IPv6 address has no closing ']'")))?;
            let port = match after {
                "" => None,
                _ => Some(after.strip_prefix(':').ok_or_else(|| {
                    ConfigError::new(format!("host {n} in the URL: unexpected text after the IPv6 address"))
                })?),
            };
            (host, port)
        } else {
            match item.split_once(':') {
                Some((h, p)) => (h, Some(p)),
                None => (item, None),
            }
        };
        let port = port.unwrap_or_default();
        if !port.is_empty() && port.parse::<u16>().map_or(true, |p| p == 0) {
            return Err(if has_userinfo {
                ConfigError::new(format!("port '{port}' of host {n} is not a number between 1 and 65535"))
            } else {
                ConfigError::new(format!(
                    "the port of host {n} in the URL is not a number between 1 and 65535 (not shown; if this is user:password, the '@' before the host is missing)"
                ))
            });
        }
        hosts.push(percent_decode(host, "a host name")?);
        ports.push(port);
    }
    if hosts.iter().any(|h| !h.is_empty()) {
        params.insert("host", hosts.join(","));
    }
    if ports.iter().any(|p| !p.is_empty()) {
        params.insert("port", ports.join(","));
    }
    Ok(())
}

/// Decodes `%xx` escapes. `what` names the component in errors; its text is never quoted.
fn percent_decode(text: &str, what: &str) -> Result<String, ConfigError> {
    crate::percent::percent_decode(text).map_err(|e| match e {
        PercentError::BadEscape => {
            ConfigError::new(format!("a '%' in {what} is not followed by two hex digits (write '%' itself as %25)"))
        }
        PercentError::NotUtf8 => ConfigError::new(format!("{what} is not UTF-8 once percent-decoded")),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kv(text: &str) -> Vec<(&'static str, String)> {
        parse(text).unwrap().into_iter().collect()
    }

    #[test]
    fn key_values_with_libpq_quoting() {
        let p = parse(r"host=a,b port = 5432,5433 dbname='my db' password='it\'s \\ x' user=app\ one").unwrap();
        assert_eq!(p["host"], "a,b");
        assert_eq!(p["port"], "5432,5433");
        assert_eq!(p["dbname"], "my db");
        assert_eq!(p["password"], r"it's \ x");
        assert_eq!(p["user"], "app one");
        assert_eq!(kv("  "), vec![]);
        assert_eq!(kv("sslmode=require sslmode=verify-full"), vec![("sslmode", "verify-full".to_owned())]);
        assert_eq!(kv("password=a=b"), vec![("password", "a=b".to_owned())]);
        assert_eq!(kv("dbname=''"), vec![("dbname", String::new())]);
    }

    #[test]
    fn key_value_errors() {
        let e = parse("host").unwrap_err().to_string();
        assert!(e.contains("missing '=' after 'host'"), "{e}");
        let e = parse("host=a frobnicate=1").unwrap_err().to_string();
        assert!(e.contains("unknown parameter 'frobnicate'"), "{e}");
        for typo in ["sslMode", "target-session-attrs", "SSLMODE"] {
            let e = parse(&format!("host=a {typo}=x")).unwrap_err().to_string();
            assert!(e.contains(&format!("unknown parameter '{typo}'")), "{e}");
        }
        let e = parse("host=a po:rt=1").unwrap_err().to_string();
        assert!(!e.contains("po:rt") && e.contains("not shown"), "{e}");
        let e = parse("dbname='open").unwrap_err().to_string();
        assert!(e.contains("quoted value of dbname has no closing quote"), "{e}");
        let e = parse("password=two words=x").unwrap_err().to_string();
        assert!(!e.contains("words"), "{e}");
        assert!(e.contains("password='...'"), "{e}");
        let e = parse("password=two words").unwrap_err().to_string();
        assert!(!e.contains("words"), "{e}");
    }

    #[test]
    fn url_hosts_ports_and_query() {
        let p = parse("postgresql://u:pw@a:5432,b,[::1]:5434/shop?sslmode=require&application_name=x%20y").unwrap();
        assert_eq!(p["user"], "u");
        assert_eq!(p["password"], "pw");
        assert_eq!(p["host"], "a,b,::1");
        assert_eq!(p["port"], "5432,,5434");
        assert_eq!(p["dbname"], "shop");
        assert_eq!(p["sslmode"], "require");
        assert_eq!(p["application_name"], "x y");
        let p = parse("postgres://%2Fvar%2Frun%2Fpostgresql/db?host=b").unwrap();
        assert_eq!(p["host"], "b", "a query parameter overrides the authority");
        assert_eq!(kv("postgres://"), vec![]);
        assert_eq!(kv("postgres://h?port=7"), vec![("host", "h".to_owned()), ("port", "7".to_owned())]);
    }

    #[test]
    fn regression_url_password_with_reserved_characters_parses_whole() {
        let p = parse("postgres://app:p@ss/w?rd#1:x@db.example:6543/shop?sslmode=require").unwrap();
        assert_eq!(p["user"], "app");
        assert_eq!(p["password"], "p@ss/w?rd#1:x");
        assert_eq!(p["host"], "db.example");
        assert_eq!(p["port"], "6543");
        assert_eq!(p["dbname"], "shop");
    }

    #[test]
    fn url_errors() {
        let e = parse("postgres://u@h:99999/db").unwrap_err().to_string();
        assert!(e.contains("99999"), "{e}");
        let e = parse("postgres://app:s3cretpw/db").unwrap_err().to_string();
        assert!(!e.contains("s3cretpw") && e.contains("'@' before the host is missing"), "{e}");
        let e = parse("postgres://u@[::1/db").unwrap_err().to_string();
        assert!(e.contains("closing ']'"), "{e}");
        let e = parse("postgres://u@h/db?frobnicate=1").unwrap_err().to_string();
        assert!(e.contains("frobnicate"), "{e}");
        let e = parse("postgres://u@h/db?password=a&bcdef").unwrap_err().to_string();
        assert!(!e.contains("bcdef") && e.contains("%26"), "{e}");
        let e = parse("postgres://u@h/db?password=a&Bc=1").unwrap_err().to_string();
        assert!(!e.contains("Bc"), "{e}");
        let e = parse("postgres://u:%zz@h/db").unwrap_err().to_string();
        assert!(e.contains("the password") && e.contains("%25"), "{e}");
        let e = parse("mysql://x").unwrap_err().to_string();
        assert!(e.contains("postgres://"), "{e}");
    }
}
