//! TLS to the server: which certificates are trusted, the handshake, and the channel
//! binding data SCRAM-SHA-256-PLUS needs.
//!
//! Invariants:
//! - An `sslrootcert` file alone decides trust: the connector's store holds exactly the
//!   certificates of that file, never the system's roots. `sslrootcert=system` uses the
//!   system's roots (OpenSSL's default paths, `SSL_CERT_FILE`/`SSL_CERT_DIR`).
//! - The chain is checked when [`Config::verifies_certificate`] says so; the host name
//!   (or IP address) too with `sslmode=verify-full`.

use std::path::Path;
use std::pin::Pin;

use openssl::ssl::{SslConnector, SslMethod, SslVerifyMode};
use openssl::x509::store::X509StoreBuilder;
use openssl::x509::X509;
use tokio::net::TcpStream;

use crate::config::{Config, RootCert, SslMode};
use crate::error::Error;

fn tls_error<E: std::error::Error + Send + Sync + 'static>(context: &str, e: E) -> Error {
    Error::Tls { message: format!("{context}{e}"), source: Some(Box::new(e)) }
}

/// A certificate store holding exactly the certificates of the PEM file at `path`.
fn store_from_file(path: &Path) -> Result<openssl::x509::store::X509Store, Error> {
    let context = format!("cannot load sslrootcert {}: ", path.display());
    let pem = std::fs::read(path).map_err(|e| tls_error(&context, e))?;
    let certs = X509::stack_from_pem(&pem).map_err(|e| tls_error(&context, e))?;
    if certs.is_empty() {
        return Err(Error::tls(format!("{context}the file holds no PEM certificate")));
    }
    let mut store = X509StoreBuilder::new().map_err(|e| tls_error(&context, e))?;
    for cert in certs {
        store.add_cert(cert).map_err(|e| tls_error(&context, e))?;
    }
    Ok(store.build())
}

fn connector(config: &Config) -> Result<SslConnector, Error> {
    // The builder loads the system's default verify paths; a root file replaces that store.
    let mut builder = SslConnector::builder(SslMethod::tls_client()).map_err(|e| tls_error("", e))?;
    if config.verifies_certificate() {
        match &config.sslrootcert {
            Some(RootCert::File(path)) => builder.set_cert_store(store_from_file(path)?),
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
