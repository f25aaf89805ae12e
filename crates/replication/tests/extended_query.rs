//! Statements with bind parameters ([`ReplicationClient::query`]): the frames the client
//! sends, checked byte by byte against a fake server, and against a real PostgreSQL
//! (testkit) values that would break quoting arriving intact, server errors leaving the
//! connection usable, and what a Parse message refuses.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)] // tests fail loudly

use std::io::{Read, Write};
use std::net::TcpListener;
use std::thread::JoinHandle;
use std::time::Duration;

use replication::{Config, Error, ReplicationClient};
use testkit::{PgOptions, Postgres};

fn frame(tag: u8, body: &[u8]) -> Vec<u8> {
    let mut v = vec![tag];
    v.extend_from_slice(&i32::try_from(body.len() + 4).unwrap().to_be_bytes());
    v.extend_from_slice(body);
    v
}

fn read_frame(s: &mut impl Read) -> Message {
    let mut header = [0; 5];
    s.read_exact(&mut header).unwrap();
    let len = usize::try_from(i32::from_be_bytes(header[1..5].try_into().unwrap())).unwrap();
    let mut body = vec![0; len - 4];
    s.read_exact(&mut body).unwrap();
    (header[0], body)
}

/// A RowDescription of text columns.
fn row_description(names: &[&str]) -> Vec<u8> {
    let mut body = i16::try_from(names.len()).unwrap().to_be_bytes().to_vec();
    for name in names {
        body.extend_from_slice(name.as_bytes());
        body.push(0);
        body.extend_from_slice(&0_u32.to_be_bytes()); // table oid
        body.extend_from_slice(&0_i16.to_be_bytes()); // column
        body.extend_from_slice(&25_u32.to_be_bytes()); // text
        body.extend_from_slice(&(-1_i16).to_be_bytes()); // size
        body.extend_from_slice(&(-1_i32).to_be_bytes()); // modifier
        body.extend_from_slice(&0_i16.to_be_bytes()); // text format
    }
    frame(b'T', &body)
}

fn data_row(values: &[Option<&str>]) -> Vec<u8> {
    let mut body = i16::try_from(values.len()).unwrap().to_be_bytes().to_vec();
    for v in values {
        match v {
            None => body.extend_from_slice(&(-1_i32).to_be_bytes()),
            Some(v) => {
                body.extend_from_slice(&i32::try_from(v.len()).unwrap().to_be_bytes());
                body.extend_from_slice(v.as_bytes());
            }
        }
    }
    frame(b'D', &body)
}

/// A frontend message: its tag and body.
type Message = (u8, Vec<u8>);

/// One connection: startup, then for each answer the messages up to Sync are read (and
/// returned, one list per answer) and the answer is sent.
fn fake_server(answers: Vec<Vec<u8>>) -> (u16, JoinHandle<Vec<Vec<Message>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let handle = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let mut len = [0; 4];
        s.read_exact(&mut len).unwrap();
        let mut startup = vec![0; usize::try_from(i32::from_be_bytes(len)).unwrap() - 4];
        s.read_exact(&mut startup).unwrap();
        let mut hello = frame(b'R', &0_i32.to_be_bytes());
        hello.extend(frame(b'S', b"server_version\x0016.4\x00"));
        hello.extend(frame(b'Z', b"I"));
        s.write_all(&hello).unwrap();
        let mut seen = Vec::new();
        for answer in answers {
            let mut frames = Vec::new();
            loop {
                let f = read_frame(&mut s);
                let sync = f.0 == b'S';
                frames.push(f);
                if sync {
                    break;
                }
            }
            seen.push(frames);
            s.write_all(&answer).unwrap();
        }
        seen
    });
    (port, handle)
}

fn cstr(s: &str) -> Vec<u8> {
    let mut v = s.as_bytes().to_vec();
    v.push(0);
    v
}

#[tokio::test]
async fn parse_bind_describe_execute_sync_with_text_parameters() {
    let ok = [
        frame(b'1', b""),
        frame(b'2', b""),
        row_description(&["a", "b"]),
        data_row(&[Some("it's"), None]),
        frame(b'C', b"SELECT 1\0"),
        frame(b'Z', b"I"),
    ]
    .concat();
    let (port, server) = fake_server(vec![ok]);
    let config = Config::parse(&format!("host=127.0.0.1 port={port} user=app sslmode=disable")).unwrap();
    let mut client = ReplicationClient::connect_sql(&config).await.unwrap();
    let sql = "SELECT $1::text AS a, $2::text AS b, $3";
    let r = client.query(sql, &[Some("it's"), None, Some(r"a\b")]).await.unwrap();
    assert_eq!(r.columns, ["a", "b"]);
    assert_eq!((r.first("a"), r.first("b")), (Some("it's"), None));
    client.close().await;
    let seen = server.join().unwrap();
    let tags: Vec<u8> = seen[0].iter().map(|(t, _)| *t).collect();
    assert_eq!(tags, b"PBDES", "Parse, Bind, Describe, Execute, Sync");
    // Parse: the unnamed statement, the text, no parameter types (the server infers them).
    assert_eq!(seen[0][0].1, [cstr(""), cstr(sql), vec![0, 0]].concat());
    // Bind: unnamed portal and statement, no format codes (all text), three values
    // (the second NULL), no result format codes (all text).
    let mut bind = [cstr(""), cstr(""), vec![0, 0], vec![0, 3]].concat();
    bind.extend_from_slice(&4_i32.to_be_bytes());
    bind.extend_from_slice(b"it's");
    bind.extend_from_slice(&(-1_i32).to_be_bytes());
    bind.extend_from_slice(&3_i32.to_be_bytes());
    bind.extend_from_slice(br"a\b");
    bind.extend_from_slice(&[0, 0]);
    assert_eq!(seen[0][1].1, bind);
    assert_eq!(seen[0][2].1, [vec![b'P'], cstr("")].concat(), "Describe the portal");
    assert_eq!(seen[0][3].1, [cstr(""), 0_i32.to_be_bytes().to_vec()].concat(), "Execute every row");
    assert!(seen[0][4].1.is_empty());
}

#[tokio::test]
async fn a_server_error_is_read_to_ready_for_query_and_the_connection_goes_on() {
    let error =
        [frame(b'1', b""), frame(b'E', b"SERROR\0VERROR\0C22012\0Mdivision by zero\0\0"), frame(b'Z', b"I")].concat();
    let ok = [frame(b'1', b""), frame(b'2', b""), frame(b'n', b""), frame(b'C', b"SET\0"), frame(b'Z', b"I")].concat();
    let (port, server) = fake_server(vec![error, ok]);
    let config = Config::parse(&format!("host=127.0.0.1 port={port} user=app sslmode=disable")).unwrap();
    let mut client = ReplicationClient::connect_sql(&config).await.unwrap();
    let e = client.query("SELECT 1 / $1::int", &[Some("0")]).await.unwrap_err();
    assert_eq!(e.sqlstate(), Some("22012"), "{e}");
    let r = client.query("SELECT pg_catalog.set_config('x.y', $1, false)", &[Some("z")]).await.unwrap();
    assert!(r.columns.is_empty() && r.rows.is_empty(), "NoData, no rows: {r:?}");
    client.close().await;
    assert_eq!(server.join().unwrap().len(), 2);
}

/// Against PostgreSQL itself: what would break a quoted literal arrives as it was sent.
#[tokio::test]
async fn values_reach_postgresql_as_values_and_errors_leave_the_connection_usable() {
    let pg = Postgres::start(PgOptions::default()).unwrap();
    let config = Config::parse(&pg.url()).unwrap();
    let mut sql = ReplicationClient::connect_sql(&config).await.unwrap();
    sql.simple_query("CREATE TABLE public.t (k text PRIMARY KEY, v text)").await.unwrap();
    let hostile = ["it's", r"back\slash", r"\'; DROP TABLE public.t; --", "$1", "zwölf 🦀", "E'\\x41'", ""];
    for (i, v) in hostile.iter().enumerate() {
        let key = i.to_string();
        sql.query("INSERT INTO public.t (k, v) VALUES ($1, $2)", &[Some(&key), Some(v)]).await.unwrap();
        let r = sql
            .query("SELECT v, pg_catalog.length(v)::text AS n FROM public.t WHERE k = $1", &[Some(&key)])
            .await
            .unwrap();
        assert_eq!(r.first("v"), Some(*v));
        assert_eq!(r.first("n"), Some(v.chars().count().to_string().as_str()));
    }
    sql.query("INSERT INTO public.t (k, v) VALUES ($1, $2)", &[Some("null"), None]).await.unwrap();
    let r = sql.query("SELECT (v IS NULL)::text AS null FROM public.t WHERE k = $1", &[Some("null")]).await.unwrap();
    assert_eq!(r.first("null"), Some("true"));
    let r =
        sql.query("SELECT ($1::pg_lsn + 16)::text AS lsn, $2::int + 1 AS n", &[Some("16/B374D848"), Some("41")]).await;
    let r = r.unwrap();
    assert_eq!((r.first("lsn"), r.first("n")), (Some("16/B374D858"), Some("42")));

    // A failing statement, a value its type refuses, two statements, a NUL in the text:
    // each an error, and the connection serves the next statement.
    let e = sql.query("SELECT 1 / $1::int", &[Some("0")]).await.unwrap_err();
    assert_eq!(e.sqlstate(), Some("22012"), "{e}");
    let e = sql.query("SELECT $1::int", &[Some("x")]).await.unwrap_err();
    assert_eq!(e.sqlstate(), Some("22P02"), "{e}");
    let e = sql.query("SELECT 1; SELECT 2", &[]).await.unwrap_err();
    assert_eq!(e.sqlstate(), Some("42601"), "a Parse message holds one statement: {e}");
    let e = sql.query("SELECT 1\0", &[]).await.unwrap_err();
    assert!(matches!(e, Error::Unsendable(_)) && !e.is_transient(), "{e}");
    let e = sql.query("SELECT $1::text", &[Some("a\0b")]).await.unwrap_err();
    assert!(e.sqlstate().is_some(), "PostgreSQL refuses a NUL in text: {e}");
    let r = sql.query("SELECT pg_catalog.count(*)::text AS n FROM public.t", &[]).await.unwrap();
    assert_eq!(r.first("n"), Some((hostile.len() + 1).to_string().as_str()), "the table is still there");

    // Inside a transaction, an error aborts it, as with the simple protocol.
    sql.simple_query("BEGIN").await.unwrap();
    assert!(sql.query("SELECT 1 / $1::int", &[Some("0")]).await.is_err());
    let e = sql.query("SELECT $1::text", &[Some("x")]).await.unwrap_err();
    assert_eq!(e.sqlstate(), Some("25P02"), "{e}");
    sql.simple_query("ROLLBACK").await.unwrap();

    // SET TRANSACTION SNAPSHOT: a snapshot exported by another session, and no other text.
    let mut exporter = ReplicationClient::connect_sql(&config).await.unwrap();
    exporter.simple_query("BEGIN ISOLATION LEVEL REPEATABLE READ").await.unwrap();
    let exported = exporter.query("SELECT pg_catalog.pg_export_snapshot() AS s", &[]).await.unwrap();
    let name = exported.first("s").unwrap().to_owned();
    sql.simple_query("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY").await.unwrap();
    sql.set_transaction_snapshot(&name).await.unwrap();
    sql.simple_query("COMMIT").await.unwrap();
    let e = sql.set_transaction_snapshot("x' OR '1").await.unwrap_err();
    assert!(matches!(e, Error::Unsendable(_)), "{e}");
    exporter.simple_query("COMMIT").await.unwrap();
    exporter.close().await;
    sql.close().await;
}
