//! The byte stream a session runs over (Unix socket, TCP or TLS), as `connect.rs` opens
//! it and the client uses it.

use tokio::io::{AsyncRead, AsyncWrite};

use crate::auth::Channel;

/// Any stream a session can run over.
pub(crate) trait Transport: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Transport for T {}

/// An open transport before startup.
pub(crate) struct Opened {
    pub io: Box<dyn Transport>,
    pub channel: Channel,
    /// tls-server-end-point data for SCRAM-SHA-256-PLUS, when TLS.
    pub tls_end_point: Option<Vec<u8>>,
}
