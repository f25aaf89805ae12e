//! Replays the committed fuzz seed corpus (`fuzz/corpus/{decode,copy_data}`) and
//! every fuzz regression input (`fuzz/regressions/<target>/*`) through the same
//! checks as the fuzz targets, on stable Rust, in every `cargo test`. A crash the
//! fuzzers find is minimised into `fuzz/regressions/<target>/` and also gets a named
//! `regression_*` test below; see docs/fuzzing.md.
//!
//! It also checks the seeds are what `examples/fuzz_seeds.rs` writes: valid sessions
//! that decode completely.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::path::{Path, PathBuf};

use bytes::{Bytes, BytesMut};
use pgoutput::encode::encode;
use pgoutput::wire::{self, ReplicationMessage};
use pgoutput::{decode, Decoder, LogicalMessage, TupleData};

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz")
}

fn files(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out: Vec<_> = entries
        .flatten()
        .filter(|e| e.path().is_file())
        .map(|e| (e.file_name().to_string_lossy().into_owned(), std::fs::read(e.path()).unwrap()))
        .collect();
    out.sort();
    out
}

/// The `decode` target's input format: u16 big-endian length prefixes.
fn split(data: &[u8]) -> Vec<Bytes> {
    let mut out = Vec::new();
    let mut rest = data;
    while !rest.is_empty() {
        let (len, after) = match rest {
            [a, b, after @ ..] => (usize::from(u16::from_be_bytes([*a, *b])), after),
            _ => (rest.len(), &[][..]),
        };
        let (msg, tail) = after.split_at(len.min(after.len()));
        out.push(Bytes::copy_from_slice(msg));
        rest = tail;
    }
    out
}

fn walk_tuple(t: &TupleData) {
    assert_eq!(t.iter().count(), t.len());
    // The walk gives back the values the tuple encodes: encoding them again gives the
    // same tuple.
    let values: Vec<_> = t.iter().collect();
    assert_eq!(&TupleData::from_values(&values), t, "the column walk lost or changed a value");
}

fn walk(msg: &LogicalMessage) {
    match msg {
        LogicalMessage::Insert(m) => walk_tuple(&m.tuple),
        LogicalMessage::Update(m) => {
            if let Some((_, old)) = &m.old {
                walk_tuple(old);
            }
            walk_tuple(&m.new);
        }
        LogicalMessage::Delete(m) => walk_tuple(&m.old),
        _ => {}
    }
}

fn round_trip(input: &Bytes, msg: &LogicalMessage, in_stream: bool) {
    let mut out = BytesMut::new();
    encode(msg, in_stream, &mut out);
    let out = out.freeze();
    assert_eq!(&out, input, "non-canonical encoding accepted: {msg:?}");
    assert_eq!(&decode(out, in_stream).unwrap(), msg);
}

/// The `decode` fuzz target's checks; returns how many messages the Decoder accepted.
fn check_decode_input(data: &[u8]) -> usize {
    let mut decoder = Decoder::new();
    let mut ok = 0;
    for msg in split(data) {
        for in_stream in [false, true] {
            if let Ok(m) = decode(msg.clone(), in_stream) {
                walk(&m);
                round_trip(&msg, &m, in_stream);
            }
        }
        let before = decoder.in_stream();
        match decoder.decode(msg.clone()) {
            Ok(m) => {
                walk(&m);
                round_trip(&msg, &m, before);
                ok += 1;
            }
            Err(_) => assert_eq!(decoder.in_stream(), before),
        }
    }
    ok
}

/// The `copy_data` fuzz target's checks; returns whether the payload parsed.
fn check_copy_data_input(data: &[u8]) -> bool {
    let input = Bytes::copy_from_slice(data);
    let _ = wire::parse_standby_status_update(input.clone());
    let Ok(msg) = wire::parse_copy_data(input.clone()) else {
        return false;
    };
    let mut out = BytesMut::new();
    match &msg {
        ReplicationMessage::XLogData(x) => {
            for in_stream in [false, true] {
                let _ = decode(x.data.clone(), in_stream);
            }
            wire::encode_xlog_data(x, &mut out);
        }
        ReplicationMessage::PrimaryKeepalive(k) => wire::encode_keepalive(k, &mut out),
    }
    assert_eq!(out.freeze(), input);
    true
}

#[test]
fn decode_seeds_are_valid_sessions_and_pass_the_target_checks() {
    let seeds = files(&fuzz_dir().join("corpus/decode"));
    assert!(seeds.len() >= 40, "seed corpus missing: run the fuzz_seeds example");
    for (name, data) in seeds {
        let messages = split(&data).len();
        assert_eq!(check_decode_input(&data), messages, "{name}: every seed message must decode");
    }
}

#[test]
fn copy_data_seeds_parse_and_pass_the_target_checks() {
    let seeds = files(&fuzz_dir().join("corpus/copy_data"));
    assert!(seeds.len() >= 40, "seed corpus missing: run the fuzz_seeds example");
    for (name, data) in seeds {
        assert!(check_copy_data_input(&data), "{name} must parse");
    }
}

#[test]
fn every_cut_and_flipped_seed_passes_the_target_checks() {
    // A cheap, deterministic slice of what the fuzzers do: every prefix and every
    // single-byte flip of each seed, through the same checks.
    for (target, check) in [
        (
            "decode",
            (|d: &[u8]| {
                check_decode_input(d);
            }) as fn(&[u8]),
        ),
        ("copy_data", |d: &[u8]| {
            check_copy_data_input(d);
        }),
    ] {
        for (_, data) in files(&fuzz_dir().join("corpus").join(target)).into_iter().take(30) {
            for cut in 0..data.len().min(64) {
                check(&data[..cut]);
            }
            for i in 0..data.len().min(64) {
                let mut flipped = data.clone();
                flipped[i] ^= 0xff;
                check(&flipped);
            }
        }
    }
}

#[test]
fn fuzz_regression_inputs_pass_the_target_checks() {
    for (_, data) in files(&fuzz_dir().join("regressions/decode")) {
        check_decode_input(&data);
    }
    for (_, data) in files(&fuzz_dir().join("regressions/copy_data")) {
        check_copy_data_input(&data);
    }
}
