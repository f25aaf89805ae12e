//! `[admin]` as the file gives it: the admin API listener (docs/control-plane.md).

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// `[admin]`: where the admin API listens, who may use it, and over what.
#[derive(Debug, Default, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct AdminFile {
    /// host:port of the admin listener; unset: no listener.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub addr: Option<String>,
    /// `NAME ROLE SHA256` lines: the tokens that may use the API.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tokens_file: Option<PathBuf>,
    /// TLS certificate chain (PEM).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls_cert: Option<PathBuf>,
    /// TLS private key (PEM).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls_key: Option<PathBuf>,
    /// Serve without TLS on an address other than loopback [default: false].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allow_plaintext: Option<bool>,
    /// Operators may ask for payloads (`?payload=true`) [default: false].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub show_payloads: Option<bool>,
}

impl AdminFile {
    pub(crate) fn is_empty(&self) -> bool {
        self.addr.is_none()
            && self.tokens_file.is_none()
            && self.tls_cert.is_none()
            && self.tls_key.is_none()
            && self.allow_plaintext.is_none()
            && self.show_payloads.is_none()
    }
}
