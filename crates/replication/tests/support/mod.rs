//! A scriptable fake PostgreSQL server (std listeners and threads) and the certificates
//! its TLS uses, generated here with the openssl crate.
//!
//! The server answers the SSLRequest with 'N' or with 'S' and a TLS handshake, asks for
//! the authentication of the script (none, cleartext, MD5, or SCRAM-SHA-256[-PLUS] that
//! it really verifies, channel binding included), reports ParameterStatus values, and
//! answers the queries of the script with one text value. Each connection ends with a
//! [`Seen`] report: what the client sent, the password message above all.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)]

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Arc;
use std::time::Duration;

use openssl::asn1::Asn1Time;
use openssl::bn::{BigNum, MsbOption};
use openssl::ec::{EcGroup, EcKey};
use openssl::hash::MessageDigest;
use openssl::nid::Nid;
use openssl::pkey::{PKey, Private};
use openssl::ssl::{SslAcceptor, SslMethod};
use openssl::x509::extension::{BasicConstraints, KeyUsage, SubjectAlternativeName};
use openssl::x509::{X509NameBuilder, X509};

// ------------------------------------------------------------------------------------
// certificates
// ------------------------------------------------------------------------------------

fn key() -> PKey<Private> {
    let group = EcGroup::from_curve_name(Nid::X9_62_PRIME256V1).unwrap();
    PKey::from_ec_key(EcKey::generate(&group).unwrap()).unwrap()
}

fn cert(cn: &str, key: &PKey<Private>, issuer: Option<(&X509, &PKey<Private>)>, ca: bool) -> X509 {
    let mut name = X509NameBuilder::new().unwrap();
    name.append_entry_by_text("CN", cn).unwrap();
    let name = name.build();
    let mut b = X509::builder().unwrap();
    b.set_version(2).unwrap();
    let mut serial = BigNum::new().unwrap();
    serial.rand(64, MsbOption::MAYBE_ZERO, false).unwrap();
    b.set_serial_number(&serial.to_asn1_integer().unwrap()).unwrap();
    b.set_subject_name(&name).unwrap();
    b.set_issuer_name(issuer.map_or(&*name, |(c, _)| c.subject_name())).unwrap();
    b.set_pubkey(key).unwrap();
    b.set_not_before(&Asn1Time::days_from_now(0).unwrap()).unwrap();
    b.set_not_after(&Asn1Time::days_from_now(2).unwrap()).unwrap();
    if ca {
        b.append_extension(BasicConstraints::new().critical().ca().build().unwrap()).unwrap();
        b.append_extension(KeyUsage::new().critical().key_cert_sign().crl_sign().build().unwrap()).unwrap();
    } else {
        let san = SubjectAlternativeName::new()
            .ip("127.0.0.1")
            .dns("localhost")
            .build(&b.x509v3_context(issuer.map(|(c, _)| &**c), None))
            .unwrap();
        b.append_extension(san).unwrap();
    }
    b.sign(issuer.map_or(key, |(_, k)| k), MessageDigest::sha256()).unwrap();
    b.build()
}

/// A test certificate authority.
pub(crate) struct Ca {
    pub cert: X509,
    key: PKey<Private>,
}

impl Ca {
    pub(crate) fn new(cn: &str) -> Ca {
        let key = key();
        Ca { cert: cert(cn, &key, None, true), key }
    }

    /// A server certificate for 127.0.0.1 and localhost signed by this CA.
    pub(crate) fn issue(&self, cn: &str) -> Identity {
        let key = key();
        Identity { cert: cert(cn, &key, Some((&self.cert, &self.key)), false), key }
    }

    /// Writes the CA certificate as PEM into `dir`.
    pub(crate) fn write_pem(&self, dir: &Path, name: &str) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, self.cert.to_pem().unwrap()).unwrap();
        path
    }
}

/// A server certificate and its key.
pub(crate) struct Identity {
    pub cert: X509,
    key: PKey<Private>,
}

impl Identity {
    /// A self-signed server certificate for 127.0.0.1 and localhost.
    pub(crate) fn self_signed(cn: &str) -> Identity {
        let key = key();
        Identity { cert: cert(cn, &key, None, false), key }
    }

    pub(crate) fn acceptor(&self) -> Arc<SslAcceptor> {
        let mut b = SslAcceptor::mozilla_intermediate_v5(SslMethod::tls_server()).unwrap();
        b.set_private_key(&self.key).unwrap();
        b.set_certificate(&self.cert).unwrap();
        Arc::new(b.build())
    }

    /// RFC 5929 tls-server-end-point of this certificate (ECDSA with SHA-256: SHA-256).
    pub(crate) fn end_point(&self) -> Vec<u8> {
        self.cert.digest(MessageDigest::sha256()).unwrap().to_vec()
    }
}

/// A fresh directory under the system temp dir.
pub(crate) fn temp_dir(name: &str) -> PathBuf {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    let dir = std::env::temp_dir().join(format!(
        "replication-test-{name}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

// ------------------------------------------------------------------------------------
// the server
// ------------------------------------------------------------------------------------

/// What the server asks the client for.
#[derive(Clone, Debug)]
pub(crate) enum Ask {
    Trust,
    Cleartext,
    Md5,
    /// SASL with these mechanisms; the exchange is verified against `password`.
    /// `skip_final`: send AuthenticationOk without the server's proof (SASLFinal).
    Scram {
        password: String,
        mechanisms: Vec<&'static str>,
        skip_final: bool,
    },
    /// Answer the startup packet with this FATAL error (SQLSTATE, message).
    Fail(&'static str, &'static str),
}

/// One fake server's behaviour, for every connection it accepts.
#[derive(Clone)]
pub(crate) struct Script {
    /// `None`: answer the SSLRequest with 'N'.
    pub tls: Option<Arc<SslAcceptor>>,
    /// tls-server-end-point of the TLS certificate, to check SCRAM-SHA-256-PLUS.
    pub end_point: Option<Vec<u8>>,
    pub ask: Ask,
    /// ParameterStatus values sent after authentication (server_version 15.8 always).
    pub params: Vec<(&'static str, &'static str)>,
    /// A query starting with the key is answered with one row of one text value.
    pub answers: Vec<(&'static str, &'static str)>,
}

impl Script {
    pub(crate) fn new(ask: Ask) -> Script {
        Script { tls: None, end_point: None, ask, params: Vec::new(), answers: Vec::new() }
    }

    pub(crate) fn with_tls(mut self, identity: &Identity) -> Script {
        self.tls = Some(identity.acceptor());
        self.end_point = Some(identity.end_point());
        self
    }

    pub(crate) fn param(mut self, name: &'static str, value: &'static str) -> Script {
        self.params.push((name, value));
        self
    }

    pub(crate) fn answer(mut self, query_prefix: &'static str, value: &'static str) -> Script {
        self.answers.push((query_prefix, value));
        self
    }
}

/// What the server saw on one connection.
#[derive(Debug, Default, Clone)]
pub(crate) struct Seen {
    pub ssl_requested: bool,
    pub tls: bool,
    pub startup: HashMap<String, String>,
    /// The body of a PasswordMessage answering a cleartext or MD5 request (NUL cut).
    pub password: Option<Vec<u8>>,
    /// The SASL mechanism the client chose, and its gs2 header (`n,,`, `y,,`, `p=...,,`).
    pub sasl: Option<(String, String)>,
    /// SCRAM: the proof matched the script's password and the channel binding data the
    /// certificate's.
    pub scram_verified: bool,
    pub authenticated: bool,
    pub queries: Vec<String>,
}

pub(crate) struct FakeServer {
    pub port: u16,
    seen: Receiver<Seen>,
}

trait Io: Read + Write + Send {}
impl<T: Read + Write + Send> Io for T {}

impl FakeServer {
    /// Serves TCP connections on 127.0.0.1 with `script` until the test process ends.
    pub(crate) fn start(script: Script) -> FakeServer {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let (tx, seen) = channel();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                stream.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
                let (script, tx) = (script.clone(), tx.clone());
                std::thread::spawn(move || serve_tcp(stream, &script, &tx));
            }
        });
        FakeServer { port, seen }
    }

    /// Serves the Unix socket `dir/.s.PGSQL.<port>` with `script`.
    pub(crate) fn start_unix(script: Script, dir: &Path, port: u16) -> FakeServer {
        let listener = UnixListener::bind(dir.join(format!(".s.PGSQL.{port}"))).unwrap();
        let (tx, seen) = channel();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                stream.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
                let (script, tx) = (script.clone(), tx.clone());
                std::thread::spawn(move || serve_unix(stream, &script, &tx));
            }
        });
        FakeServer { port, seen }
    }

    /// The report of the next connection that ended.
    pub(crate) fn seen(&self) -> Seen {
        self.seen.recv_timeout(Duration::from_secs(20)).expect("the fake server saw no connection end")
    }

    /// Whether any connection ended within `wait`.
    pub(crate) fn saw_any(&self, wait: Duration) -> bool {
        self.seen.recv_timeout(wait).is_ok()
    }
}

/// A TCP port nothing listens on.
pub(crate) fn closed_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

/// A listener that accepts TCP connections (the kernel does) and never answers.
pub(crate) fn silent_port() -> (u16, TcpListener) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    (listener.local_addr().unwrap().port(), listener)
}

fn frame(tag: u8, body: &[u8]) -> Vec<u8> {
    let mut v = vec![tag];
    v.extend_from_slice(&i32::try_from(body.len() + 4).unwrap().to_be_bytes());
    v.extend_from_slice(body);
    v
}

fn auth(code: i32, data: &[u8]) -> Vec<u8> {
    let mut body = code.to_be_bytes().to_vec();
    body.extend_from_slice(data);
    frame(b'R', &body)
}

fn error(code: &str, message: &str) -> Vec<u8> {
    let body = format!("SFATAL\0VFATAL\0C{code}\0M{message}\0\0");
    frame(b'E', body.as_bytes())
}

fn read_n(s: &mut dyn Io, n: usize) -> std::io::Result<Vec<u8>> {
    let mut v = vec![0; n];
    s.read_exact(&mut v)?;
    Ok(v)
}

/// A length-prefixed packet without tag (startup, SSLRequest).
fn read_untagged(s: &mut dyn Io) -> std::io::Result<Vec<u8>> {
    let len = i32::from_be_bytes(read_n(s, 4)?.try_into().unwrap());
    read_n(s, usize::try_from(len - 4).unwrap())
}

fn read_msg(s: &mut dyn Io) -> std::io::Result<(u8, Vec<u8>)> {
    let head = read_n(s, 5)?;
    let len = i32::from_be_bytes(head[1..5].try_into().unwrap());
    Ok((head[0], read_n(s, usize::try_from(len - 4).unwrap())?))
}

fn serve_tcp(mut tcp: TcpStream, script: &Script, tx: &Sender<Seen>) {
    let mut seen = Seen::default();
    let Ok(first) = read_untagged(&mut tcp) else { return drop(tx.send(seen)) };
    if first == [0x04, 0xd2, 0x16, 0x2f] {
        seen.ssl_requested = true;
        match &script.tls {
            Some(acceptor) => {
                tcp.write_all(b"S").unwrap();
                if let Ok(mut tls) = acceptor.accept(tcp) {
                    seen.tls = true;
                    if let Ok(startup) = read_untagged(&mut tls) {
                        conversation(&mut tls, startup, script, &mut seen);
                    }
                }
            }
            None => {
                tcp.write_all(b"N").unwrap();
                if let Ok(startup) = read_untagged(&mut tcp) {
                    conversation(&mut tcp, startup, script, &mut seen);
                }
            }
        }
    } else {
        conversation(&mut tcp, first, script, &mut seen);
    }
    let _ = tx.send(seen);
}

fn serve_unix(mut s: UnixStream, script: &Script, tx: &Sender<Seen>) {
    let mut seen = Seen::default();
    if let Ok(startup) = read_untagged(&mut s) {
        conversation(&mut s, startup, script, &mut seen);
    }
    let _ = tx.send(seen);
}

/// Startup, authentication, parameters, then queries until Terminate or EOF.
fn conversation(s: &mut dyn Io, startup: Vec<u8>, script: &Script, seen: &mut Seen) {
    let fields: Vec<String> =
        startup[4..].split(|&b| b == 0).map(|f| String::from_utf8_lossy(f).into_owned()).collect();
    for pair in fields.chunks(2) {
        if let [k, v] = pair {
            if !k.is_empty() {
                seen.startup.insert(k.clone(), v.clone());
            }
        }
    }
    if authenticate(s, script, seen).is_err() || !seen.authenticated {
        return;
    }
    let mut hello = Vec::new();
    hello.extend(frame(b'S', b"server_version\x0015.8\x00"));
    for (k, v) in &script.params {
        hello.extend(frame(b'S', format!("{k}\0{v}\0").as_bytes()));
    }
    hello.extend(frame(b'Z', b"I"));
    if s.write_all(&hello).is_err() {
        return;
    }
    while let Ok((tag, body)) = read_msg(s) {
        match tag {
            b'Q' => {
                let query = String::from_utf8_lossy(body.strip_suffix(b"\0").unwrap_or(&body)).into_owned();
                seen.queries.push(query.clone());
                let reply = match script.answers.iter().find(|(prefix, _)| query.starts_with(prefix)) {
                    Some((_, value)) => {
                        let mut desc = 1_i16.to_be_bytes().to_vec();
                        desc.extend_from_slice(b"value\0");
                        desc.extend_from_slice(&[0; 4]); // table oid
                        desc.extend_from_slice(&[0; 2]); // column number
                        desc.extend_from_slice(&25_u32.to_be_bytes()); // text
                        desc.extend_from_slice(&(-1_i16).to_be_bytes());
                        desc.extend_from_slice(&(-1_i32).to_be_bytes());
                        desc.extend_from_slice(&0_i16.to_be_bytes());
                        let mut row = 1_i16.to_be_bytes().to_vec();
                        row.extend_from_slice(&i32::try_from(value.len()).unwrap().to_be_bytes());
                        row.extend_from_slice(value.as_bytes());
                        [frame(b'T', &desc), frame(b'D', &row), frame(b'C', b"SELECT 1\0"), frame(b'Z', b"I")].concat()
                    }
                    None => [error("42601", "the fake server has no answer"), frame(b'Z', b"I")].concat(),
                };
                if s.write_all(&reply).is_err() {
                    return;
                }
            }
            b'X' => return,
            _ => {}
        }
    }
}

fn authenticate(s: &mut dyn Io, script: &Script, seen: &mut Seen) -> std::io::Result<()> {
    match &script.ask {
        Ask::Trust => {}
        Ask::Fail(code, message) => {
            s.write_all(&error(code, message))?;
            return Ok(());
        }
        Ask::Cleartext | Ask::Md5 => {
            let request = match script.ask {
                Ask::Md5 => auth(5, b"salt"),
                _ => auth(3, b""),
            };
            s.write_all(&request)?;
            let (tag, body) = read_msg(s)?;
            assert_eq!(tag, b'p', "a password message");
            seen.password = Some(body.strip_suffix(b"\0").unwrap_or(&body).to_vec());
        }
        Ask::Scram { password, mechanisms, skip_final } => {
            let mut list = Vec::new();
            for m in mechanisms {
                list.extend_from_slice(m.as_bytes());
                list.push(0);
            }
            list.push(0);
            s.write_all(&auth(10, &list))?;
            let (tag, body) = read_msg(s)?;
            assert_eq!(tag, b'p', "a SASLInitialResponse");
            let nul = body.iter().position(|&b| b == 0).unwrap();
            let mechanism = String::from_utf8(body[..nul].to_vec()).unwrap();
            let first = String::from_utf8(body[nul + 5..].to_vec()).unwrap();
            let mut parts = first.splitn(3, ',');
            let (flag, authzid, bare) = (parts.next().unwrap(), parts.next().unwrap(), parts.next().unwrap());
            let gs2 = format!("{flag},{authzid},");
            seen.sasl = Some((mechanism.clone(), gs2.clone()));
            let client_nonce = bare.split(',').find_map(|a| a.strip_prefix("r=")).unwrap().to_owned();
            let salt = b"fake-server-salt";
            let nonce = format!("{client_nonce}ServerNonce");
            let server_first = format!("r={nonce},s={},i=4096", openssl::base64::encode_block(salt));
            s.write_all(&auth(11, server_first.as_bytes()))?;
            let (tag, body) = read_msg(s)?;
            assert_eq!(tag, b'p', "a SASLResponse");
            let final_msg = String::from_utf8(body).unwrap();
            let (without_proof, proof) = final_msg.rsplit_once(",p=").unwrap();
            let cbind =
                openssl::base64::decode_block(without_proof.strip_prefix("c=").unwrap().split(',').next().unwrap())
                    .unwrap();
            let mut expected_cbind = gs2.as_bytes().to_vec();
            if mechanism == "SCRAM-SHA-256-PLUS" {
                expected_cbind.extend_from_slice(script.end_point.as_deref().unwrap_or_default());
            }
            let auth_message = format!("{bare},{server_first},{without_proof}");
            let mut salted = [0_u8; 32];
            openssl::pkcs5::pbkdf2_hmac(password.as_bytes(), salt, 4096, MessageDigest::sha256(), &mut salted).unwrap();
            let client_key = hmac(&salted, b"Client Key");
            let stored_key = openssl::sha::sha256(&client_key);
            let signature = hmac(&stored_key, auth_message.as_bytes());
            let expected_proof: Vec<u8> = client_key.iter().zip(&signature).map(|(a, b)| a ^ b).collect();
            let proof_ok = openssl::base64::decode_block(proof).unwrap() == expected_proof;
            seen.scram_verified = proof_ok && cbind == expected_cbind;
            if !seen.scram_verified {
                s.write_all(&error("28P01", "password authentication failed for user \"app\""))?;
                return Ok(());
            }
            if !skip_final {
                let server_signature = hmac(&hmac(&salted, b"Server Key"), auth_message.as_bytes());
                let v = format!("v={}", openssl::base64::encode_block(&server_signature));
                s.write_all(&auth(12, v.as_bytes()))?;
            }
        }
    }
    s.write_all(&auth(0, b""))?;
    seen.authenticated = true;
    Ok(())
}

fn hmac(key: &[u8], data: &[u8]) -> Vec<u8> {
    let key = PKey::hmac(key).unwrap();
    let mut signer = openssl::sign::Signer::new(MessageDigest::sha256(), &key).unwrap();
    signer.update(data).unwrap();
    signer.sign_to_vec().unwrap()
}
