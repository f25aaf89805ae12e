//! What protects a connection's bytes, as far as authentication is concerned.

/// What protects the bytes of a connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Channel {
    /// A Unix-domain socket.
    Local,
    /// Plain TCP because of `sslmode=disable`.
    PlainByConfig,
    /// Plain TCP because the server declined TLS (`sslmode=prefer`).
    PlainServerDeclinedTls,
    /// TLS without a certificate check.
    TlsUnverified,
    /// TLS with the certificate chain checked.
    TlsVerified,
}

impl Channel {
    pub fn is_tls(self) -> bool {
        matches!(self, Channel::TlsUnverified | Channel::TlsVerified)
    }
}
