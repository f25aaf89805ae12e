//! `[admin]` resolved: the admin API listener's address, tokens file and TLS, with the
//! refusals that keep it from being served open (docs/control-plane.md).
//!
//! Refused at start, before anything listens: an address without a tokens file (the
//! API has no anonymous access), an address off loopback without TLS unless
//! `allow_plaintext` (tokens would cross the network in clear), and half a TLS pair.
//! The files themselves are read when the listener starts (`app`), so a mistake in one
//! is an error naming its line.

use std::net::SocketAddr;
use std::path::PathBuf;

use super::{AdminFile, ConfigError};

/// The admin listener, when `[admin] addr` is set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdminSettings {
    pub addr: SocketAddr,
    pub tokens_file: PathBuf,
    /// (certificate chain, private key), PEM.
    pub tls: Option<(PathBuf, PathBuf)>,
    pub show_payloads: bool,
}

/// `[admin]` (with `--admin-addr` and `--admin-tokens-file` layered on); `None` without
/// an address.
pub(super) fn resolve(f: &AdminFile) -> Result<Option<AdminSettings>, ConfigError> {
    let tls = match (&f.tls_cert, &f.tls_key) {
        (Some(cert), Some(key)) => Some((cert.clone(), key.clone())),
        (None, None) => None,
        (Some(_), None) => return Err(ConfigError::Option(texts::admin::tls_half("tls_cert", "tls_key"))),
        (None, Some(_)) => return Err(ConfigError::Option(texts::admin::tls_half("tls_key", "tls_cert"))),
    };
    let Some(text) = f.addr.as_deref().map(str::trim).filter(|a| !a.is_empty()) else {
        return Ok(None);
    };
    let addr: SocketAddr = text.parse().map_err(|_| ConfigError::Invalid {
        key: "admin.addr",
        value: text.to_owned(),
        expected: "host:port with an IP address, e.g. 127.0.0.1:9188",
    })?;
    let Some(tokens_file) = f.tokens_file.clone() else {
        return Err(ConfigError::Option(texts::admin::addr_without_tokens(text)));
    };
    if tls.is_none() && !addr.ip().is_loopback() && !f.allow_plaintext.unwrap_or(false) {
        return Err(ConfigError::Option(texts::admin::plaintext_off_loopback(text)));
    }
    Ok(Some(AdminSettings { addr, tokens_file, tls, show_payloads: f.show_payloads.unwrap_or(false) }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::settings::FileConfig;

    fn admin(text: &str) -> Result<Option<AdminSettings>, String> {
        let file = FileConfig::parse(text)?;
        resolve(&file.admin).map_err(|e| e.to_string())
    }

    #[test]
    fn no_addr_no_listener() {
        assert_eq!(admin("").unwrap(), None);
        assert_eq!(admin("[admin]\ntokens_file = \"/etc/walpost/tokens\"").unwrap(), None);
    }

    #[test]
    fn loopback_with_tokens_is_served_in_clear() {
        let a = admin("[admin]\naddr = \"127.0.0.1:9188\"\ntokens_file = \"/t\"").unwrap().unwrap();
        assert_eq!(a.addr.to_string(), "127.0.0.1:9188");
        assert_eq!(a.tokens_file, PathBuf::from("/t"));
        assert!(a.tls.is_none() && !a.show_payloads);
        assert!(admin("[admin]\naddr = \"[::1]:9188\"\ntokens_file = \"/t\"").unwrap().is_some());
    }

    #[test]
    fn refusals_say_what_to_do() {
        let e = admin("[admin]\naddr = \"127.0.0.1:9188\"").unwrap_err();
        assert!(e.contains("needs [admin] tokens_file") && e.contains("--admin-tokens-file"), "{e}");
        let e = admin("[admin]\naddr = \"0.0.0.0:9188\"\ntokens_file = \"/t\"").unwrap_err();
        assert!(e.contains("not a loopback address") && e.contains("allow_plaintext"), "{e}");
        let e = admin("[admin]\naddr = \"127.0.0.1:9188\"\ntokens_file = \"/t\"\ntls_cert = \"/c\"").unwrap_err();
        assert!(e.contains("tls_cert is set without [admin] tls_key"), "{e}");
        let e = admin("[admin]\naddr = \"localhost:9188\"\ntokens_file = \"/t\"").unwrap_err();
        assert!(e.contains("admin.addr"), "{e}");
        let e = admin("[admin]\naddress = \"127.0.0.1:1\"").unwrap_err();
        assert!(e.contains("unknown field"), "{e}");
    }

    #[test]
    fn off_loopback_with_tls_or_allowed_plaintext() {
        let tls = admin("[admin]\naddr = \"0.0.0.0:9188\"\ntokens_file = \"/t\"\ntls_cert = \"/c\"\ntls_key = \"/k\"")
            .unwrap()
            .unwrap();
        assert_eq!(tls.tls, Some((PathBuf::from("/c"), PathBuf::from("/k"))));
        let clear = admin(
            "[admin]\naddr = \"0.0.0.0:9188\"\ntokens_file = \"/t\"\nallow_plaintext = true\nshow_payloads = true",
        )
        .unwrap()
        .unwrap();
        assert!(clear.tls.is_none() && clear.show_payloads);
    }
}
