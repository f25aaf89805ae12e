//! Malformed protocol bytes from a server: a tiny fake PostgreSQL (std `TcpListener`)
//! completes startup (AuthenticationOk, ParameterStatus server_version,
//! ReadyForQuery), answers START_REPLICATION with CopyBothResponse and then sends
//! bytes derived from the fuzz seed corpus (`crates/pgoutput/fuzz/corpus`) and from
//! the fuzzers' regression inputs. The client must return an error for every
//! malformed input — never panic, never hang, never hand bad bytes on as a message.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)] // tests fail loudly

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::thread::JoinHandle;
use std::time::Duration;

use bytes::Bytes;
use pgoutput::wire::{self, ReplicationMessage};
use pgoutput::Lsn;
use replication::{Config, Error, ReplicationClient};

fn corpus_dir(target: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../pgoutput/fuzz/corpus").join(target)
}

/// The committed seeds of one fuzz target, sorted by name.
fn seeds(target: &str) -> Vec<(String, Vec<u8>)> {
    let dir = corpus_dir(target);
    let mut out: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
        .flatten()
        .map(|e| (e.file_name().to_string_lossy().into_owned(), std::fs::read(e.path()).unwrap()))
        .collect();
    out.sort();
    assert!(!out.is_empty(), "no seeds in {}", dir.display());
    out
}

fn frame(tag: u8, body: &[u8]) -> Vec<u8> {
    let mut v = vec![tag];
    v.extend_from_slice(&i32::try_from(body.len() + 4).unwrap().to_be_bytes());
    v.extend_from_slice(body);
    v
}

fn read_exact_vec(s: &mut TcpStream, n: usize) -> std::io::Result<Vec<u8>> {
    let mut v = vec![0; n];
    s.read_exact(&mut v)?;
    Ok(v)
}

/// Serves one connection: startup, then CopyBothResponse and `after_copy_both` in
/// answer to the first query; then holds the connection open until the client goes.
fn fake_server(after_copy_both: Vec<u8>) -> (u16, JoinHandle<String>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let handle = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        // StartupMessage: Int32 length (itself included), Int32 protocol, params.
        let len = i32::from_be_bytes(read_exact_vec(&mut s, 4).unwrap().try_into().unwrap());
        let _params = read_exact_vec(&mut s, usize::try_from(len - 4).unwrap()).unwrap();
        let mut hello = frame(b'R', &0_i32.to_be_bytes());
        hello.extend(frame(b'S', b"server_version\x0015.8\x00"));
        hello.extend(frame(b'Z', b"I"));
        s.write_all(&hello).unwrap();
        // The query (START_REPLICATION ...).
        let header = read_exact_vec(&mut s, 5).unwrap();
        assert_eq!(header[0], b'Q');
        let len = i32::from_be_bytes(header[1..5].try_into().unwrap());
        let query = String::from_utf8(read_exact_vec(&mut s, usize::try_from(len - 4).unwrap()).unwrap()).unwrap();
        let mut answer = frame(b'W', &[0, 0, 0]);
        answer.extend(after_copy_both);
        s.write_all(&answer).unwrap();
        // Until the client closes: it may send status updates, CopyDone, Terminate.
        let mut sink = [0; 1024];
        while matches!(s.read(&mut sink), Ok(n) if n > 0) {}
        query
    });
    (port, handle)
}

/// Connects to a fake server sending `after_copy_both` and reads the stream until
/// an error, its end, or `max` messages. Returns the messages and how it ended.
async fn run(after_copy_both: Vec<u8>, max: usize) -> (Vec<ReplicationMessage>, Result<(), Error>) {
    let (port, server) = fake_server(after_copy_both);
    let config = Config::from_url(&format!("postgres://walpost@127.0.0.1:{port}/shop?sslmode=disable")).unwrap();
    let client = ReplicationClient::connect(&config).await.expect("startup with the fake server");
    assert_eq!(client.server_major_version(), 15);
    let mut stream = client
        .start_logical_replication("walpost", Lsn(0x16A_3428), &[("proto_version", "1")])
        .await
        .expect("CopyBothResponse");
    let mut got = Vec::new();
    let end = loop {
        if got.len() == max {
            break Ok(());
        }
        match tokio::time::timeout(Duration::from_secs(10), stream.next()).await {
            Err(_) => panic!("the client hung on the fake server's bytes"),
            Ok(Ok(Some(m))) => got.push(m),
            Ok(Ok(None)) => break Ok(()),
            Ok(Err(e)) => break Err(e),
        }
    };
    stream.close().await;
    let query = server.join().expect("fake server");
    assert!(query.starts_with("START_REPLICATION SLOT \"walpost\" LOGICAL 0/16A3428"), "{query}");
    (got, end)
}

fn expect_protocol_error(name: &str, end: Result<(), Error>) -> String {
    match end {
        Err(e @ Error::Protocol(_)) => {
            assert!(!e.is_transient(), "{name}: malformed bytes must not be retried as transient");
            let text = e.to_string();
            assert!(text.starts_with("PostgreSQL protocol violation: "), "{name}: {text}");
            text
        }
        other => panic!("{name}: expected a protocol error, got {other:?}"),
    }
}

/// Every committed CopyData seed is delivered as itself; cut short inside its
/// header, or behind an unknown tag, it is a protocol error.
#[tokio::test]
async fn copy_data_seeds_stream_and_their_malformed_forms_are_errors() {
    for (name, seed) in seeds("copy_data") {
        let (got, end) = run(frame(b'd', &seed), 1).await;
        assert!(end.is_ok(), "{name}: {end:?}");
        assert_eq!(got, vec![wire::parse_copy_data(Bytes::from(seed.clone())).unwrap()], "{name}");

        // Cut inside the fixed header (25 bytes for XLogData, 18 for a keepalive).
        let cut = seed.len().min(25) - 1;
        let (got, end) = run(frame(b'd', &seed[..cut]), 1).await;
        assert!(got.is_empty(), "{name}: a cut-short payload was handed on");
        let text = expect_protocol_error(&name, end);
        assert!(text.contains("truncated") || text.contains("needs"), "{name}: {text}");

        let mut bad_tag = seed.clone();
        bad_tag[0] = b'x';
        let (got, end) = run(frame(b'd', &bad_tag), 1).await;
        assert!(got.is_empty(), "{name}");
        expect_protocol_error(&name, end);
    }
}

/// A keepalive with trailing bytes or a reply flag other than 0/1 is refused.
#[tokio::test]
async fn keepalive_with_trailing_bytes_or_bad_flag_is_an_error() {
    let keepalive = std::fs::read(corpus_dir("copy_data").join("seed-keepalive")).unwrap();
    let mut trailing = keepalive.clone();
    trailing.push(0);
    let mut bad_flag = keepalive;
    *bad_flag.last_mut().unwrap() = 2;
    for (name, payload) in [("trailing", trailing), ("bad flag", bad_flag)] {
        let (got, end) = run(frame(b'd', &payload), 1).await;
        assert!(got.is_empty());
        expect_protocol_error(name, end);
    }
}

/// The backend-frame seeds are whole server conversations: replayed after
/// CopyBothResponse, their startup and query frames are out of place, and with a
/// corrupted length word any of them is refused before a byte of the body is used.
#[tokio::test]
async fn backend_frame_seeds_in_the_copy_both_phase_are_errors() {
    for (name, seed) in seeds("backend_frames") {
        let mut stream = seed[2..].to_vec(); // drop the fuzz target's chunking seed
        if name.starts_with("seed-copy-both-only") {
            // It opens with its own CopyBothResponse; the fake server sent one already.
            assert_eq!(stream[..8], frame(b'W', &[0, 0, 0])[..]);
            stream.drain(..8);
        }
        let (got, end) = run(stream.clone(), usize::MAX).await;
        // The CopyBoth seeds hold a whole replication session: it streams and ends.
        if name.starts_with("seed-copy-both-only") {
            assert!(end.is_ok(), "{name}: {end:?}");
            assert!(got.len() >= 6, "{name}: {got:?}");
        } else if name.starts_with("seed-copy-both-slot-in-use")
            || name.starts_with("seed-startup-error")
            || name.starts_with("seed-query-error")
        {
            // An ErrorResponse is the server's error, with its SQLSTATE.
            let e = end.expect_err(&name);
            assert!(matches!(e, Error::Server(_)), "{name}: {e}");
        } else {
            let text = expect_protocol_error(&name, end);
            assert!(text.contains("unexpected message"), "{name}: {text}");
        }

        for bad_len in [-1_i32, 0, 3, i32::MAX] {
            let mut corrupt = stream.clone();
            corrupt[1..5].copy_from_slice(&bad_len.to_be_bytes());
            let (got, end) = run(corrupt, usize::MAX).await;
            assert!(got.is_empty(), "{name}/{bad_len}");
            let text = expect_protocol_error(&name, end);
            assert!(text.contains("invalid length"), "{name}/{bad_len}: {text}");
        }
    }
}

/// Malformed pgoutput inside a well-formed XLogData is the decoder's business: the
/// connection hands it on unchanged and the decoder refuses it.
#[tokio::test]
async fn malformed_pgoutput_inside_xlog_data_reaches_the_decoder_and_is_refused() {
    let seed = std::fs::read(corpus_dir("copy_data").join("seed-xlog-top-level-insert")).unwrap();
    let mut corrupt = seed.clone();
    corrupt[25 + 5] = b'X'; // the Insert's new-tuple marker
    let cut = seed[..seed.len() - 1].to_vec();
    for (name, payload) in [("bad marker", corrupt), ("cut short", cut)] {
        let (got, end) = run(frame(b'd', &payload), 1).await;
        assert!(end.is_ok(), "{name}: {end:?}");
        let [ReplicationMessage::XLogData(x)] = &got[..] else { panic!("{name}: {got:?}") };
        let err = pgoutput::Decoder::new().decode(x.data.clone()).expect_err(name);
        assert!(!err.to_string().is_empty());
    }
}

/// Inputs that crashed (or nearly crashed) a fuzz target, kept as files: each must
/// reach the client as an error or as data, never as a panic.
#[tokio::test]
async fn fuzz_regression_inputs_never_panic_the_client() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../pgoutput/fuzz/regressions");
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return;
    };
    for e in entries.flatten() {
        let bytes = std::fs::read(e.path()).unwrap();
        let _ = run(frame(b'd', &bytes), 4).await;
    }
}
