//! TLS to the server: which certificates are trusted, the handshake, and the channel
//! binding data SCRAM-SHA-256-PLUS needs.
//!
//! The chain is checked with `sslmode=verify-ca`/`verify-full` against `sslrootcert`
//! (added to OpenSSL's default store) or the system's roots (`sslrootcert=system`); the
//! host name (or IP address) too with `verify-full`.

use std::pin::Pin;

use openssl::ssl::{SslConnector, SslMethod, SslVerifyMode};
use tokio::net::TcpStream;

use crate::config::{Config, RootCert, SslMode};
use crate::Error;

fn tls_error<E: std::error::Error + Send + Sync + 'static>(context: &str, e: E) -> Error {
    Error::Tls { message: format!("{context}{e}"), source: Some(Box::new(e)) }
}

fn connector(config: &Config) -> Result<SslConnector, Error> {
    let mut builder = SslConnector::builder(SslMethod::tls_client()).map_err(|e| tls_error("", e))?;
    if matches!(config.sslmode, SslMode::VerifyCa | SslMode::VerifyFull) {
        match &config.sslrootcert {
            Some(RootCert::File(path)) => builder
                .set_ca_file(path)
                .map_err(|e| tls_error(&format!("cannot load sslrootcert {}: ", path.display()), e))?,
            Some(RootCert::System) => {}
            None => {
                return Err(Error::tls(format!(
                    "sslmode={} needs sslrootcert to check the certificate",
                    config.sslmode.as_str()
                )))
            }
        }
        builder.set_verify(SslVerifyMode::PEER);
    } else {
        builder.set_verify(SslVerifyMode::NONE);
    }
    Ok(builder.build())
}

/// Runs the TLS handshake over `tcp`. `name`: the host name or IP address the
/// certificate must name under `verify-full` (also sent as SNI when it is a name).
pub(crate) async fn handshake(
    config: &Config,
    name: &str,
    tcp: TcpStream,
) -> Result<tokio_openssl::SslStream<TcpStream>, Error> {
    let connector = connector(config)?;
    let mut cfg = connector.configure().map_err(|e| tls_error("", e))?;
    cfg.set_verify_hostname(config.sslmode == SslMode::VerifyFull);
    // SNI only makes sense for names; an IP literal is still checked against the
    // certificate's IP SANs by set_verify_hostname.
    cfg.set_use_server_name_indication(name.parse::<std::net::IpAddr>().is_err());
    let ssl = cfg.into_ssl(name).map_err(|e| tls_error("", e))?;
    let mut stream = tokio_openssl::SslStream::new(ssl, tcp).map_err(|e| tls_error("", e))?;
    if let Err(e) = Pin::new(&mut stream).connect().await {
        let verify_detail = stream.ssl().verify_result();
        let message = if verify_detail == openssl::x509::X509VerifyResult::OK {
            e.to_string()
        } else {
            format!("{e} (certificate check: {verify_detail})")
        };
        return Err(Error::Tls { message, source: Some(Box::new(e)) });
    }
    Ok(stream)
}

/// RFC 5929 tls-server-end-point: the hash of the server certificate, with the hash of
/// its signature algorithm (SHA-256 when that is MD5 or SHA-1).
pub(crate) fn server_end_point(ssl: &openssl::ssl::SslRef) -> Option<Vec<u8>> {
    use openssl::hash::MessageDigest;
    use openssl::nid::Nid;
    let cert = ssl.peer_certificate()?;
    let algorithms = cert.signature_algorithm().object().nid().signature_algorithms()?;
    let digest = match algorithms.digest {
        Nid::MD5 | Nid::SHA1 => MessageDigest::sha256(),
        nid => MessageDigest::from_nid(nid)?,
    };
    cert.digest(digest).ok().map(|d| d.to_vec())
}
