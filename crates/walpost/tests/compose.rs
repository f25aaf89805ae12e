//! The container deployment, checked without a Docker engine.
//!
//! No Docker engine exists where walpost is developed and tested, so `docker compose up`
//! is never run here. Instead this test parses `docker-compose.yml`, the `Dockerfile`,
//! `deploy/walpost.env`, `scripts/demo.sh` and `docs/systemd/walpost.service` and checks
//! them against walpost itself: the `WALPOST_*` variables they set are ones walpost reads
//! (taken from the clap definitions, not from a list kept here), the settings resolve
//! with walpost's own configuration code and point at the compose services' names,
//! ports, database and credentials, the health checks exist and the walpost ones
//! actually pass against a running walpost binary (and fail when it is gone), start
//! order waits for healthy dependencies, the local demo and compose share one settings
//! file, and the Kafka image is the version the local demo runs.
//!
//! Every failure names the file and what drifted.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use clap::{CommandFactory, Parser};
use walpost::cli::{Cli, Command as WalpostCommand};
use walpost::settings::{FileConfig, Settings};
use yaml_rust2::{Yaml, YamlLoader};

const COMPOSE: &str = "docker-compose.yml";
const DOCKERFILE: &str = "Dockerfile";
const SHARED_ENV: &str = "deploy/walpost.env";
const DEMO: &str = "scripts/demo.sh";
const SYSTEMD_UNIT: &str = "docs/systemd/walpost.service";
const INITDB_DIR: &str = "/docker-entrypoint-initdb.d";

/// Variables walpost's environment may hold that are not `WALPOST_*` settings but are
/// read all the same (libpq's password variable, see README "Configuration").
const OTHER_READ_VARIABLES: &[&str] = &["PGPASSWORD"];

// ------------------------------------------------------------------------------------
// reading the files
// ------------------------------------------------------------------------------------

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn read(rel: &str) -> String {
    let path = root().join(rel);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read {rel} ({}): {e}", path.display()))
}

fn compose() -> Yaml {
    let text = read(COMPOSE);
    let mut docs = YamlLoader::load_from_str(&text).unwrap_or_else(|e| panic!("{COMPOSE} is not valid YAML: {e}"));
    assert_eq!(docs.len(), 1, "{COMPOSE} must hold exactly one YAML document");
    docs.remove(0)
}

fn service<'a>(doc: &'a Yaml, name: &str) -> &'a Yaml {
    let s = &doc["services"][name];
    assert!(!s.is_badvalue(), "{COMPOSE}: services.{name} is missing");
    s
}

/// A scalar as compose sees it (numbers and booleans become their text).
fn scalar(y: &Yaml) -> Option<String> {
    match y {
        Yaml::String(s) | Yaml::Real(s) => Some(s.clone()),
        Yaml::Integer(i) => Some(i.to_string()),
        Yaml::Boolean(b) => Some(b.to_string()),
        _ => None,
    }
}

fn strings(y: &Yaml) -> Vec<String> {
    match y {
        Yaml::Array(items) => items.iter().filter_map(scalar).collect(),
        other => scalar(other).into_iter().collect(),
    }
}

/// A service's `environment`, mapping or `KEY=VALUE` list form.
fn environment(svc: &Yaml, name: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    match &svc["environment"] {
        Yaml::Hash(h) => {
            for (k, v) in h {
                let k =
                    scalar(k).unwrap_or_else(|| panic!("{COMPOSE}: services.{name}.environment has a non-text key"));
                out.insert(k, scalar(v).unwrap_or_default());
            }
        }
        Yaml::Array(items) => {
            for item in items {
                let item = scalar(item).unwrap_or_default();
                let (k, v) = item.split_once('=').unwrap_or((&item, ""));
                out.insert(k.to_owned(), v.to_owned());
            }
        }
        Yaml::BadValue | Yaml::Null => {}
        other => panic!("{COMPOSE}: services.{name}.environment has an unexpected form: {other:?}"),
    }
    out
}

/// `env_file` paths: a string, a list of strings, or a list of `{path: ...}`.
fn env_files(svc: &Yaml) -> Vec<String> {
    match &svc["env_file"] {
        Yaml::Array(items) => {
            items.iter().filter_map(|i| if let Yaml::Hash(_) = i { scalar(&i["path"]) } else { scalar(i) }).collect()
        }
        other => scalar(other).into_iter().collect(),
    }
}

fn normalize(rel: &str) -> String {
    rel.trim_start_matches("./").trim_end_matches('/').to_owned()
}

/// `KEY=VALUE` lines of an env file (comments and blank lines skipped), in order.
fn parse_env_file(rel: &str) -> Vec<(String, String)> {
    read(rel)
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| {
            let (k, v) = l.split_once('=').unwrap_or_else(|| panic!("{rel}: line {l:?} is not KEY=VALUE"));
            (k.to_owned(), v.to_owned())
        })
        .collect()
}

/// The environment the walpost container gets: its env files, then `environment`.
fn walpost_container_env(doc: &Yaml) -> BTreeMap<String, String> {
    let svc = service(doc, "walpost");
    let mut env = BTreeMap::new();
    for file in env_files(svc) {
        env.extend(parse_env_file(&normalize(&file)));
    }
    env.extend(environment(svc, "walpost"));
    env
}

/// Every environment variable walpost reads: the `env = "..."` of every clap argument
/// (global and `run`), plus the `"WALPOST_*"` names main.rs reads itself (WALPOST_LOG).
fn variables_walpost_reads() -> BTreeMap<String, Option<String>> {
    let mut vars = BTreeMap::new();
    let cmd = Cli::command();
    let args = cmd.get_arguments().chain(cmd.get_subcommands().flat_map(|s| s.get_arguments()));
    for arg in args {
        if let Some(env) = arg.get_env() {
            vars.insert(env.to_string_lossy().into_owned(), arg.get_long().map(str::to_owned));
        }
    }
    let main = read("crates/walpost/src/main.rs");
    for piece in main.split("\"WALPOST_").skip(1) {
        if let Some(end) = piece.find('"') {
            vars.entry(format!("WALPOST_{}", &piece[..end])).or_insert(None);
        }
    }
    assert!(vars.contains_key("WALPOST_POSTGRES") && vars.contains_key("WALPOST_LOG"), "found no variables: {vars:?}");
    vars
}

/// walpost's own resolution of a `WALPOST_*` environment: each variable becomes the
/// flag clap reads it for, so the values are validated exactly as `walpost run` would.
fn resolve(env: &BTreeMap<String, String>) -> Settings {
    let known = variables_walpost_reads();
    let mut argv = vec!["walpost".to_owned(), "run".to_owned()];
    for (k, v) in env {
        if let Some(Some(long)) = known.get(k) {
            argv.push(format!("--{long}={v}"));
        }
    }
    let cli = Cli::try_parse_from(&argv).unwrap_or_else(|e| panic!("walpost rejects {argv:?}: {e}"));
    #[allow(irrefutable_let_patterns)] // `run` is the only subcommand today
    let WalpostCommand::Run(run) = cli.command
    else {
        panic!("not a run command: {argv:?}")
    };
    Settings::resolve(&run.overrides(), FileConfig::default())
        .unwrap_or_else(|e| panic!("walpost rejects {argv:?}: {e}"))
}

fn default_shutdown_timeout() -> Duration {
    let env = BTreeMap::from([
        ("WALPOST_POSTGRES".to_owned(), "postgres://walpost@localhost/walpost".to_owned()),
        ("WALPOST_KAFKA_BROKERS".to_owned(), "localhost:9092".to_owned()),
    ]);
    resolve(&env).stream.shutdown_timeout
}

/// `45s`, `1m30s`, `1min 30s`, `90` (seconds).
fn parse_duration(text: &str) -> Option<Duration> {
    let (mut total, mut num, mut unit) = (0f64, String::new(), String::new());
    let mut flush = |num: &mut String, unit: &mut String| -> Option<()> {
        if num.is_empty() {
            return unit.is_empty().then_some(());
        }
        let n: f64 = num.parse().ok()?;
        let factor = match unit.as_str() {
            "" | "s" | "sec" | "second" | "seconds" => 1.0,
            "ms" | "msec" => 0.001,
            "m" | "min" | "minute" | "minutes" => 60.0,
            "h" | "hr" | "hour" | "hours" => 3600.0,
            _ => return None,
        };
        total += n * factor;
        num.clear();
        unit.clear();
        Some(())
    };
    for c in text.trim().chars() {
        if c.is_ascii_digit() || c == '.' {
            if !unit.is_empty() {
                flush(&mut num, &mut unit)?;
            }
            num.push(c);
        } else if c.is_ascii_alphabetic() {
            unit.push(c);
        } else if c.is_whitespace() {
            continue;
        } else {
            return None;
        }
    }
    flush(&mut num, &mut unit)?;
    Some(Duration::from_secs_f64(total))
}

/// A PostgreSQL size setting in bytes: `1GB`, `512MB`, `1024` (MB, the unit of
/// max_slot_wal_keep_size); `-1` (unlimited) is None.
fn parse_pg_size_mb_unit(text: &str) -> Option<u64> {
    let t = text.trim().trim_matches(|c| c == '\'' || c == '"');
    let digits: String = t.chars().take_while(|c| c.is_ascii_digit() || *c == '-').collect();
    let n: i64 = digits.parse().ok()?;
    if n < 0 {
        return None;
    }
    let factor: u64 = match t[digits.len()..].trim() {
        "" | "MB" => 1 << 20,
        "kB" => 1 << 10,
        "GB" => 1 << 30,
        "TB" => 1 << 40,
        _ => return None,
    };
    Some(n as u64 * factor)
}

/// `-c key=value` settings of a postgres command line (list or string form).
fn postgres_settings(svc: &Yaml) -> BTreeMap<String, String> {
    let words: Vec<String> = match &svc["command"] {
        Yaml::Array(_) => strings(&svc["command"]),
        other => scalar(other).map(|s| s.split_whitespace().map(str::to_owned).collect()).unwrap_or_default(),
    };
    let mut out = BTreeMap::new();
    let mut it = words.iter().peekable();
    while let Some(w) = it.next() {
        let setting = if w == "-c" {
            it.next().cloned()
        } else if let Some(rest) = w.strip_prefix("--") {
            Some(rest.replace('-', "_"))
        } else {
            w.strip_prefix("-c").map(str::to_owned)
        };
        if let Some((k, v)) = setting.as_deref().and_then(|s| s.split_once('=')) {
            out.insert(k.trim().to_owned(), v.trim().to_owned());
        }
    }
    out
}

/// Container ports a service publishes: "H:C", "IP:H:C", "C", with optional /proto, or
/// the long form `{target: C, published: H}`.
fn published_container_ports(svc: &Yaml) -> Vec<u16> {
    let mut out = Vec::new();
    if let Yaml::Array(items) = &svc["ports"] {
        for item in items {
            let port = match item {
                Yaml::Hash(_) => scalar(&item["target"]),
                other => scalar(other).map(|s| {
                    let s = s.split('/').next().unwrap_or_default().to_owned();
                    s.rsplit(':').next().unwrap_or_default().to_owned()
                }),
            };
            if let Some(p) = port.and_then(|p| p.parse().ok()) {
                out.push(p);
            }
        }
    }
    out
}

/// `NAME://host:port` entries of a Kafka listener list.
fn listeners(text: &str) -> Vec<(String, String, u16)> {
    text.split(',')
        .filter(|s| !s.trim().is_empty())
        .map(|l| {
            let (name, addr) = l.trim().split_once("://").unwrap_or_else(|| panic!("listener {l:?} has no NAME://"));
            let (host, port) = addr.rsplit_once(':').unwrap_or_else(|| panic!("listener {l:?} has no port"));
            (name.to_owned(), host.to_owned(), port.parse().unwrap_or_else(|_| panic!("listener {l:?}: bad port")))
        })
        .collect()
}

fn host_port(hp: &str) -> (String, u16) {
    let (h, p) = hp.trim().rsplit_once(':').unwrap_or_else(|| panic!("{hp:?} is not host:port"));
    (h.to_owned(), p.parse().unwrap_or_else(|_| panic!("{hp:?}: bad port")))
}

fn healthcheck_test(svc: &Yaml) -> Vec<String> {
    let hc = &svc["healthcheck"];
    if hc.is_badvalue() || hc["disable"] == Yaml::Boolean(true) {
        return Vec::new();
    }
    strings(&hc["test"])
}

/// A compose health check as the argv the engine runs, `$$` turned into `$`.
fn compose_healthcheck_argv(svc: &Yaml) -> Vec<String> {
    let test: Vec<String> = healthcheck_test(svc).into_iter().map(|s| s.replace("$$", "$")).collect();
    match test.first().map(String::as_str) {
        Some("CMD") => test[1..].to_vec(),
        Some("CMD-SHELL") => vec!["/bin/sh".into(), "-c".into(), test[1..].join(" ")],
        _ if test.len() == 1 => vec!["/bin/sh".into(), "-c".into(), test[0].clone()],
        _ => panic!("{COMPOSE}: unsupported healthcheck test {test:?}"),
    }
}

// ---- Dockerfile -------------------------------------------------------------------

/// (INSTRUCTION, arguments) with continuation lines joined and comments dropped.
fn dockerfile() -> Vec<(String, String)> {
    let text = read(DOCKERFILE);
    let mut out = Vec::new();
    let mut current = String::new();
    for line in text.lines() {
        let trimmed = line.trim();
        if trimmed.starts_with('#') || (current.is_empty() && trimmed.is_empty()) {
            continue;
        }
        if let Some(head) = trimmed.strip_suffix('\\') {
            current.push_str(head);
            current.push(' ');
            continue;
        }
        current.push_str(trimmed);
        let (instr, args) = current.split_once(char::is_whitespace).unwrap_or((&current, ""));
        out.push((instr.to_ascii_uppercase(), args.trim().to_owned()));
        current.clear();
    }
    out
}

/// The instructions of the last stage (after the last FROM).
fn final_stage(instrs: &[(String, String)]) -> &[(String, String)] {
    let last_from = instrs.iter().rposition(|(i, _)| i == "FROM").unwrap_or_else(|| panic!("{DOCKERFILE}: no FROM"));
    &instrs[last_from..]
}

/// Exec form (`["a", "b"]`, JSON, which YAML's flow syntax reads) or shell form.
fn exec_or_shell(args: &str) -> Vec<String> {
    let args = args.trim();
    if args.starts_with('[') {
        let docs =
            YamlLoader::load_from_str(args).unwrap_or_else(|e| panic!("{DOCKERFILE}: bad exec form {args}: {e}"));
        strings(docs.first().unwrap_or(&Yaml::Null))
    } else {
        vec!["/bin/sh".into(), "-c".into(), args.to_owned()]
    }
}

fn dockerfile_healthcheck_argv() -> Vec<String> {
    let instrs = dockerfile();
    let hc = final_stage(&instrs)
        .iter()
        .find(|(i, _)| i == "HEALTHCHECK")
        .map(|(_, a)| a.clone())
        .unwrap_or_else(|| panic!("{DOCKERFILE}: the runtime stage has no HEALTHCHECK"));
    let cmd =
        hc.find("CMD ").map(|i| &hc[i + 4..]).unwrap_or_else(|| panic!("{DOCKERFILE}: HEALTHCHECK without CMD: {hc}"));
    exec_or_shell(cmd)
}

// ------------------------------------------------------------------------------------
// compose: services, PostgreSQL, migrations
// ------------------------------------------------------------------------------------

#[test]
fn compose_has_postgres_kafka_walpost_and_kafka_ui() {
    let doc = compose();
    for name in ["postgres", "kafka", "walpost", "kafka-ui"] {
        service(&doc, name);
    }
    let image = scalar(&service(&doc, "kafka-ui")["image"]).unwrap_or_default();
    assert!(image.contains("kafka-ui"), "{COMPOSE}: kafka-ui runs {image:?}");
}

#[test]
fn postgres_runs_logical_wal_with_bounded_slot_retention() {
    let doc = compose();
    let pg = service(&doc, "postgres");
    let image = scalar(&pg["image"]).unwrap_or_default();
    let major: u32 = image
        .strip_prefix("postgres:")
        .and_then(|t| t.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|m| m.parse().ok())
        .unwrap_or_else(|| panic!("{COMPOSE}: postgres image {image:?} is not postgres:<major>"));
    assert!(major >= 15, "{COMPOSE}: postgres:{major} is not a current major (>= 15)");

    let settings = postgres_settings(pg);
    assert_eq!(
        settings.get("wal_level").map(String::as_str),
        Some("logical"),
        "{COMPOSE}: postgres command must set -c wal_level=logical (has {settings:?})"
    );
    for key in ["max_wal_senders", "max_replication_slots"] {
        let n: i64 = settings
            .get(key)
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{COMPOSE}: postgres command must set -c {key}=N"));
        assert!(n >= 2, "{COMPOSE}: {key}={n} leaves no room for walpost and a standby");
    }
    let keep = settings
        .get("max_slot_wal_keep_size")
        .unwrap_or_else(|| panic!("{COMPOSE}: postgres command must set -c max_slot_wal_keep_size"));
    let bytes = parse_pg_size_mb_unit(keep)
        .unwrap_or_else(|| panic!("{COMPOSE}: max_slot_wal_keep_size={keep} is not a finite size (e.g. 1GB)"));
    assert!(bytes > 0, "{COMPOSE}: max_slot_wal_keep_size={keep} must be above 0");
}

/// `walpost migrate` (a one-shot service of the walpost image) applies the outbox's
/// migrations to the database walpost streams from, after PostgreSQL is up and before
/// walpost starts; nothing of migrations/ runs as an init script (its folders would not).
#[test]
fn walpost_migrate_runs_before_walpost_starts() {
    let doc = compose();
    let pg = service(&doc, "postgres");
    if let Yaml::Array(volumes) = &pg["volumes"] {
        for v in volumes {
            let text = scalar(v).or_else(|| scalar(&v["target"])).unwrap_or_default();
            assert!(
                !text.contains(INITDB_DIR),
                "{COMPOSE}: migrations are walpost migrate's, not {INITDB_DIR}'s: {text}"
            );
        }
    }
    let migrate = service(&doc, "migrate");
    assert_eq!(strings(&migrate["command"]), ["migrate"], "{COMPOSE}: services.migrate must run `walpost migrate`");
    assert_eq!(
        scalar(&migrate["image"]),
        scalar(&service(&doc, "walpost")["image"]),
        "{COMPOSE}: services.migrate runs the walpost image"
    );
    assert_eq!(
        scalar(&migrate["depends_on"]["postgres"]["condition"]).as_deref(),
        Some("service_healthy"),
        "{COMPOSE}: migrate must wait for postgres (condition: service_healthy)"
    );
    assert_eq!(
        scalar(&service(&doc, "walpost")["depends_on"]["migrate"]["condition"]).as_deref(),
        Some("service_completed_successfully"),
        "{COMPOSE}: walpost must start after migrate exited 0 (condition: service_completed_successfully)"
    );
    // The same database walpost reads, resolved by walpost's own configuration code.
    let url = |env: &BTreeMap<String, String>| {
        let text = env.get("WALPOST_POSTGRES").cloned().unwrap_or_default();
        let c = replication::Config::from_url(&text).unwrap_or_else(|e| panic!("{COMPOSE}: {text}: {e}"));
        (c.hosts.iter().map(|h| h.label()).collect::<Vec<_>>(), c.dbname, c.user)
    };
    assert_eq!(
        url(&environment(migrate, "migrate")),
        url(&walpost_container_env(&doc)),
        "{COMPOSE}: migrate and walpost must use one database"
    );
    let demo = read(DEMO);
    assert!(demo.contains("walpost migrate"), "{DEMO} must apply the migrations with walpost migrate");
}

// ------------------------------------------------------------------------------------
// compose: walpost's settings
// ------------------------------------------------------------------------------------

#[test]
fn every_variable_compose_gives_walpost_is_one_walpost_reads() {
    let doc = compose();
    let svc = service(&doc, "walpost");
    let known = variables_walpost_reads();

    let files: Vec<String> = env_files(svc).iter().map(|f| normalize(f)).collect();
    assert_eq!(files, [SHARED_ENV], "{COMPOSE}: walpost must take its settings from env_file: {SHARED_ENV}");

    let shared = parse_env_file(SHARED_ENV);
    let inline = environment(svc, "walpost");
    let mut seen = BTreeSet::new();
    for (k, v) in &shared {
        assert!(seen.insert(k.clone()), "{SHARED_ENV}: {k} is set twice");
        // The one exception: the shared file binds metrics to loopback (systemd, the
        // local demo), a container must bind every interface for its port mapping.
        assert!(
            !inline.contains_key(k) || k == "WALPOST_METRICS_ADDR",
            "{k} is set both in {SHARED_ENV} and in {COMPOSE}'s walpost environment: keep shared settings in {SHARED_ENV} only"
        );
        if k == "WALPOST_METRICS_ADDR" {
            assert!(v.starts_with("127.0.0.1:"), "{SHARED_ENV}: metrics must bind the loopback, not {v}");
        }
        // The file is read by bash (`source`), compose (env_file) and systemd
        // (EnvironmentFile), which disagree on quotes, `$`, backslashes and spaces.
        assert!(
            !v.contains(['$', '"', '\'', '\\', ' ', '\t', '`']),
            "{SHARED_ENV}: {k}={v}: bash, compose and systemd read quotes, $, \\ and spaces differently; use a plain value"
        );
    }
    for (k, v) in &inline {
        let unescaped = v.replace("$$", "");
        assert!(!unescaped.contains('$'), "{COMPOSE}: walpost environment {k}={v}: compose would interpolate the $");
    }
    for k in shared.iter().map(|(k, _)| k).chain(inline.keys()) {
        assert!(
            known.contains_key(k) || OTHER_READ_VARIABLES.contains(&k.as_str()),
            "{k} is set for walpost but walpost does not read it (walpost reads: {:?})",
            known.keys().collect::<Vec<_>>()
        );
    }

    // The image's own defaults too.
    for (instr, args) in dockerfile() {
        if instr == "ENV" {
            let key = args.split(['=', ' ']).next().unwrap_or_default();
            if key.starts_with("WALPOST_") && key != "WALPOST_GIT_COMMIT" {
                assert!(known.contains_key(key), "{DOCKERFILE}: ENV {key} is not a variable walpost reads");
            }
        }
    }
}

#[test]
fn walpost_settings_resolve_and_point_at_the_compose_services() {
    let doc = compose();
    let env = walpost_container_env(&doc);
    for required in ["WALPOST_POSTGRES", "WALPOST_KAFKA_BROKERS"] {
        assert!(env.contains_key(required), "{COMPOSE}: walpost has no {required}");
    }
    let settings = resolve(&env);

    // PostgreSQL: the service name, its port, database, user and password.
    let pg = service(&doc, "postgres");
    let pg_env = environment(pg, "postgres");
    let pg_port: u16 = postgres_settings(pg).get("port").map_or(5432, |p| p.parse().expect("numeric port"));
    let c = &settings.postgres.server;
    assert_eq!(c.hosts.len(), 1, "{COMPOSE}: WALPOST_POSTGRES names one host");
    assert_eq!(
        c.hosts[0].host,
        replication::Host::Tcp("postgres".into()),
        "{COMPOSE}: WALPOST_POSTGRES must name the postgres service"
    );
    assert_eq!(c.hosts[0].port, pg_port, "{COMPOSE}: WALPOST_POSTGRES port is not the port postgres listens on");
    assert_eq!(Some(&c.dbname), pg_env.get("POSTGRES_DB"), "{COMPOSE}: WALPOST_POSTGRES database is not POSTGRES_DB");
    assert_eq!(
        Some(c.user.as_str()),
        Some(pg_env.get("POSTGRES_USER").map_or("postgres", String::as_str)),
        "{COMPOSE}: WALPOST_POSTGRES user is not POSTGRES_USER"
    );
    let url = &env["WALPOST_POSTGRES"];
    let userinfo = url.split_once("://").and_then(|(_, rest)| rest.split_once('@')).map(|(u, _)| u).unwrap_or("");
    let password = userinfo.split_once(':').map(|(_, p)| p);
    assert_eq!(
        password,
        pg_env.get("POSTGRES_PASSWORD").map(String::as_str),
        "{COMPOSE}: WALPOST_POSTGRES password is not POSTGRES_PASSWORD"
    );

    // Kafka: every bootstrap server is a listener the broker advertises as `kafka`.
    let kafka_env = environment(service(&doc, "kafka"), "kafka");
    let advertised = listeners(kafka_env.get("KAFKA_ADVERTISED_LISTENERS").map_or("", String::as_str));
    let check_bootstrap = |who: &str, servers: &str| {
        for hp in servers.split(',') {
            let (host, port) = host_port(hp);
            assert_eq!(host, "kafka", "{COMPOSE}: {who} bootstrap server {hp} must name the kafka service");
            assert!(
                advertised.iter().any(|(_, h, p)| *h == host && *p == port),
                "{COMPOSE}: {who} uses {hp}, which kafka does not advertise ({advertised:?})"
            );
        }
    };
    check_bootstrap("walpost", &settings.kafka().unwrap().brokers);
    let ui_env = environment(service(&doc, "kafka-ui"), "kafka-ui");
    check_bootstrap("kafka-ui", ui_env.get("KAFKA_CLUSTERS_0_BOOTSTRAPSERVERS").map_or("", String::as_str));
}

#[test]
fn metrics_port_is_published_and_exposed() {
    let doc = compose();
    let settings = resolve(&walpost_container_env(&doc));
    let addr = settings.telemetry.metrics_addr.unwrap_or_else(|| {
        panic!("{SHARED_ENV}/{COMPOSE}: WALPOST_METRICS_ADDR must be set (the health check uses /healthz)")
    });
    assert!(
        addr.ip().is_unspecified(),
        "WALPOST_METRICS_ADDR={addr}: bind 0.0.0.0 in a container, or the published port reaches nothing"
    );
    let published = published_container_ports(service(&doc, "walpost"));
    // The published port is the host's loopback only (metrics are not for the network).
    if let Yaml::Array(items) = &service(&doc, "walpost")["ports"] {
        for item in items {
            let text = scalar(item).unwrap_or_default();
            assert!(text.starts_with("127.0.0.1:"), "{COMPOSE}: walpost publishes {text:?} beyond the host's loopback");
        }
    }
    assert!(
        published.contains(&addr.port()),
        "{COMPOSE}: walpost publishes {published:?} but WALPOST_METRICS_ADDR listens on {}",
        addr.port()
    );

    let instrs = dockerfile();
    let stage = final_stage(&instrs);
    let image_addr = stage
        .iter()
        .filter(|(i, _)| i == "ENV")
        .find_map(|(_, a)| a.strip_prefix("WALPOST_METRICS_ADDR="))
        .unwrap_or_else(|| {
            panic!("{DOCKERFILE}: the image must default WALPOST_METRICS_ADDR (its HEALTHCHECK needs it)")
        });
    let (_, image_port) = host_port(image_addr);
    let exposed: Vec<u16> = stage
        .iter()
        .filter(|(i, _)| i == "EXPOSE")
        .flat_map(|(_, a)| a.split_whitespace().filter_map(|p| p.split('/').next()?.parse().ok()).collect::<Vec<_>>())
        .collect();
    assert!(exposed.contains(&image_port), "{DOCKERFILE}: EXPOSE {exposed:?} lacks the metrics port {image_port}");
}

// ------------------------------------------------------------------------------------
// compose: health checks, start order, shutdown
// ------------------------------------------------------------------------------------

#[test]
fn health_checks_gate_walpost_start() {
    let doc = compose();
    for name in ["postgres", "kafka", "walpost"] {
        let test = healthcheck_test(service(&doc, name));
        assert!(test.len() >= 2 && test[0] != "NONE", "{COMPOSE}: services.{name} needs a healthcheck (has {test:?})");
    }
    let walpost = service(&doc, "walpost");
    for dep in ["postgres", "kafka"] {
        let condition = scalar(&walpost["depends_on"][dep]["condition"]);
        assert_eq!(
            condition.as_deref(),
            Some("service_healthy"),
            "{COMPOSE}: walpost must depend on {dep} with condition: service_healthy"
        );
    }
    let ui = &service(&doc, "kafka-ui")["depends_on"];
    let ui_deps = match ui {
        Yaml::Hash(h) => h.keys().filter_map(scalar).collect(),
        other => strings(other),
    };
    assert!(ui_deps.iter().any(|d| d == "kafka"), "{COMPOSE}: kafka-ui must depend on kafka");

    // The kafka health check asks a listener the broker really has.
    let kafka = service(&doc, "kafka");
    let kafka_env = environment(kafka, "kafka");
    let ports: Vec<u16> =
        listeners(kafka_env.get("KAFKA_LISTENERS").map_or("", String::as_str)).into_iter().map(|(_, _, p)| p).collect();
    let test = healthcheck_test(kafka).join(" ");
    let bootstrap = test
        .split_whitespace()
        .skip_while(|w| *w != "--bootstrap-server")
        .nth(1)
        .unwrap_or_else(|| panic!("{COMPOSE}: kafka healthcheck should query --bootstrap-server (has {test})"));
    assert!(
        ports.contains(&host_port(bootstrap).1),
        "{COMPOSE}: kafka healthcheck asks {bootstrap}, not one of its listeners {ports:?}"
    );

    // The postgres health check must not pass while the init scripts still run.
    let test = healthcheck_test(service(&doc, "postgres")).join(" ");
    assert!(
        test.contains("127.0.0.1") || test.contains("localhost"),
        "{COMPOSE}: check postgres over TCP (the init-time server only listens on its socket): {test}"
    );
}

#[test]
fn walpost_gets_longer_than_its_shutdown_timeout_to_stop() {
    let doc = compose();
    let grace = scalar(&service(&doc, "walpost")["stop_grace_period"])
        .unwrap_or_else(|| panic!("{COMPOSE}: walpost needs a stop_grace_period (compose's default is 10 s)"));
    let grace =
        parse_duration(&grace).unwrap_or_else(|| panic!("{COMPOSE}: stop_grace_period {grace:?} is not a duration"));
    let timeout = default_shutdown_timeout();
    assert!(
        grace > timeout,
        "{COMPOSE}: stop_grace_period {grace:?} must exceed walpost's shutdown timeout {timeout:?}, or compose SIGKILLs it mid-flush"
    );
}

#[test]
fn kafka_is_one_kraft_node_of_the_version_the_local_demo_runs() {
    let doc = compose();
    let kafka = service(&doc, "kafka");
    let image = scalar(&kafka["image"]).unwrap_or_default();
    let version = image
        .strip_prefix("apache/kafka:")
        .unwrap_or_else(|| panic!("{COMPOSE}: kafka must run the apache/kafka image (has {image:?})"));
    assert!(version.starts_with("4."), "{COMPOSE}: apache/kafka:{version} is not Kafka 4.x");
    let pom = read("tools/kafka/pom.xml");
    let local = pom
        .split("<kafka.version>")
        .nth(1)
        .and_then(|s| s.split("</kafka.version>").next())
        .expect("tools/kafka/pom.xml has <kafka.version>");
    assert_eq!(
        version, local,
        "{COMPOSE} runs Kafka {version} but the local demo and tests run {local} (tools/kafka/pom.xml)"
    );

    let env = environment(kafka, "kafka");
    let get = |k: &str| env.get(k).cloned().unwrap_or_else(|| panic!("{COMPOSE}: kafka needs {k}"));
    let roles: BTreeSet<String> = get("KAFKA_PROCESS_ROLES").split(',').map(|r| r.trim().to_owned()).collect();
    assert_eq!(
        roles,
        BTreeSet::from(["broker".to_owned(), "controller".to_owned()]),
        "{COMPOSE}: a single KRaft node is broker,controller"
    );
    assert!(!env.keys().any(|k| k.contains("ZOOKEEPER")), "{COMPOSE}: Kafka 4 has no ZooKeeper");

    let node_id = get("KAFKA_NODE_ID");
    let controller_name = get("KAFKA_CONTROLLER_LISTENER_NAMES");
    let own = listeners(&get("KAFKA_LISTENERS"));
    let controller_port = own
        .iter()
        .find(|(n, _, _)| *n == controller_name)
        .map(|(_, _, p)| *p)
        .unwrap_or_else(|| panic!("{COMPOSE}: KAFKA_LISTENERS has no {controller_name} listener"));
    assert_eq!(
        get("KAFKA_CONTROLLER_QUORUM_VOTERS"),
        format!("{node_id}@kafka:{controller_port}"),
        "{COMPOSE}: the only voter is this node on its controller listener"
    );
    let protocols = get("KAFKA_LISTENER_SECURITY_PROTOCOL_MAP");
    for (name, host, port) in listeners(&get("KAFKA_ADVERTISED_LISTENERS")) {
        assert!(
            protocols.split(',').any(|m| m.starts_with(&format!("{name}:"))),
            "{COMPOSE}: listener {name} has no security protocol"
        );
        assert!(
            own.iter().any(|(n, _, p)| *n == name && *p == port),
            "{COMPOSE}: advertised {name}://{host}:{port} is not in KAFKA_LISTENERS"
        );
    }
    // One broker cannot hold three replicas of the internal topics.
    for k in ["KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR", "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR"] {
        assert_eq!(get(k), "1", "{COMPOSE}: {k} must be 1 on a single broker");
    }
}

// ------------------------------------------------------------------------------------
// Dockerfile, demo, systemd
// ------------------------------------------------------------------------------------

#[test]
fn dockerfile_is_multi_stage_non_root_with_walpost_entrypoint_and_healthz_check() {
    let instrs = dockerfile();
    let froms = instrs.iter().filter(|(i, _)| i == "FROM").count();
    assert!(froms >= 2, "{DOCKERFILE}: needs a build stage and a runtime stage (has {froms} FROM)");
    assert!(
        instrs.iter().any(|(i, a)| i == "RUN" && a.contains("cargo build --release") && a.contains("--locked")),
        "{DOCKERFILE}: the build stage must run cargo build --release --locked"
    );
    assert!(
        instrs.iter().any(|(i, a)| i == "ARG" && a.starts_with("WALPOST_GIT_COMMIT")),
        "{DOCKERFILE}: needs ARG WALPOST_GIT_COMMIT (.git is not in the build context; build.rs reads it)"
    );

    let stage = final_stage(&instrs);
    let user = stage
        .iter()
        .rfind(|(i, _)| i == "USER")
        .map(|(_, a)| a.split(':').next().unwrap_or_default().to_owned())
        .unwrap_or_else(|| panic!("{DOCKERFILE}: the runtime stage needs a USER (it would run as root)"));
    assert!(user != "root" && user != "0", "{DOCKERFILE}: USER {user} is root");

    let entrypoint = stage
        .iter()
        .rfind(|(i, _)| i == "ENTRYPOINT")
        .map(|(_, a)| exec_or_shell(a))
        .unwrap_or_else(|| panic!("{DOCKERFILE}: the runtime stage needs an ENTRYPOINT"));
    assert!(
        entrypoint.first().is_some_and(|e| e == "walpost" || e.ends_with("/walpost")),
        "{DOCKERFILE}: ENTRYPOINT must be walpost in exec form (so walpost is PID 1 and gets SIGTERM), has {entrypoint:?}"
    );
    assert!(
        dockerfile_healthcheck_argv().join(" ").contains("/healthz"),
        "{DOCKERFILE}: HEALTHCHECK must GET /healthz"
    );
    assert!(
        stage.iter().all(|(i, a)| i != "STOPSIGNAL" || a == "SIGTERM"),
        "{DOCKERFILE}: walpost shuts down cleanly on SIGTERM"
    );

    let doc = compose();
    let build = &service(&doc, "walpost")["build"];
    let context = normalize(&scalar(&build["context"]).unwrap_or_else(|| scalar(build).unwrap_or_default()));
    assert!(
        context.is_empty() || context == ".",
        "{COMPOSE}: walpost must be built from the repository root (context {context:?})"
    );
    let dockerfile_name = scalar(&build["dockerfile"]).unwrap_or_else(|| DOCKERFILE.to_owned());
    assert_eq!(dockerfile_name, DOCKERFILE, "{COMPOSE}: walpost must be built from {DOCKERFILE}");
    assert!(!build["args"]["WALPOST_GIT_COMMIT"].is_badvalue(), "{COMPOSE}: pass build arg WALPOST_GIT_COMMIT");

    let ignore = read(".dockerignore");
    let ignored: Vec<&str> = ignore.lines().map(|l| l.trim().trim_start_matches('/').trim_end_matches('/')).collect();
    for must in ["target", ".git"] {
        assert!(ignored.contains(&must), ".dockerignore must exclude {must}/ from the build context");
    }
}

#[test]
fn local_demo_sources_the_settings_compose_uses() {
    let demo = read(DEMO);
    let lines: Vec<&str> = demo.lines().map(str::trim).collect();
    let source = lines
        .iter()
        .position(|l| *l == format!("source {SHARED_ENV}") || *l == format!(". {SHARED_ENV}"))
        .unwrap_or_else(|| panic!("{DEMO} must `source {SHARED_ENV}`, the settings compose uses"));
    let set_a = lines[..source].iter().rposition(|l| *l == "set -a");
    let set_plus_a = lines[source..].iter().position(|l| *l == "set +a");
    assert!(
        set_a.is_some() && set_plus_a.is_some(),
        "{DEMO}: wrap `source {SHARED_ENV}` in set -a / set +a so the settings are exported to walpost"
    );
    // Only the connection settings differ between the demo and compose.
    for piece in demo.split("WALPOST_").skip(1) {
        let name: String = piece.chars().take_while(|c| c.is_ascii_uppercase() || *c == '_').collect();
        if piece[name.len()..].starts_with('=') {
            assert!(
                ["POSTGRES", "KAFKA_BROKERS"].contains(&name.as_str()),
                "{DEMO} sets WALPOST_{name} itself: put shared settings in {SHARED_ENV}"
            );
        }
    }
    let shared: BTreeSet<String> = parse_env_file(SHARED_ENV).into_iter().map(|(k, _)| k).collect();
    for own in ["WALPOST_POSTGRES", "WALPOST_KAFKA_BROKERS"] {
        assert!(
            !shared.contains(own),
            "{SHARED_ENV} sets {own}, which differs per environment (compose and the demo set it)"
        );
    }
}

#[test]
fn systemd_unit_restarts_on_failure_and_stops_with_sigterm() {
    let text = read(SYSTEMD_UNIT);
    let mut section = String::new();
    let mut keys: BTreeMap<(String, String), String> = BTreeMap::new();
    for line in text.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if line.starts_with('[') {
            section = line.trim_matches(['[', ']']).to_owned();
        } else if let Some((k, v)) = line.split_once('=') {
            keys.insert((section.clone(), k.trim().to_owned()), v.trim().to_owned());
        }
    }
    let get = |s: &str, k: &str| keys.get(&(s.to_owned(), k.to_owned())).cloned();
    let restart = get("Service", "Restart").unwrap_or_else(|| panic!("{SYSTEMD_UNIT}: [Service] needs Restart="));
    assert_eq!(
        restart, "on-failure",
        "{SYSTEMD_UNIT}: Restart=on-failure (a clean exit after SIGTERM is not a failure)"
    );
    assert!(get("Service", "RestartSec").is_some(), "{SYSTEMD_UNIT}: set RestartSec=");
    assert!(
        get("Unit", "StartLimitIntervalSec").is_some() && get("Unit", "StartLimitBurst").is_some(),
        "{SYSTEMD_UNIT}: [Unit] needs StartLimitIntervalSec= and StartLimitBurst="
    );
    assert_eq!(get("Service", "KillSignal").as_deref(), Some("SIGTERM"), "{SYSTEMD_UNIT}: KillSignal=SIGTERM");
    let stop = get("Service", "TimeoutStopSec").unwrap_or_else(|| panic!("{SYSTEMD_UNIT}: set TimeoutStopSec="));
    let stop =
        parse_duration(&stop).unwrap_or_else(|| panic!("{SYSTEMD_UNIT}: TimeoutStopSec={stop} is not a duration"));
    let timeout = default_shutdown_timeout();
    assert!(
        stop > timeout,
        "{SYSTEMD_UNIT}: TimeoutStopSec {stop:?} must exceed walpost's shutdown timeout {timeout:?}"
    );
    let exec = get("Service", "ExecStart").unwrap_or_default();
    assert!(exec.contains("walpost run"), "{SYSTEMD_UNIT}: ExecStart must run `walpost run` (has {exec:?})");
    let user = get("Service", "User").unwrap_or_default();
    assert!(!user.is_empty() && user != "root", "{SYSTEMD_UNIT}: run as an unprivileged User=");

    // systemd's own parser, where there is one: it warns about unknown keys and values
    // it cannot parse (and then ignores them, which would silently change the unit).
    let Ok(out) = Command::new("systemd-analyze").arg("--version").output() else {
        eprintln!("systemd-analyze not found: {SYSTEMD_UNIT} checked by the rules above only");
        return;
    };
    if !out.status.success() {
        return;
    }
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("systemd-verify");
    std::fs::create_dir_all(&dir).expect("create temp dir");
    let unit = dir.join("walpost.service");
    // ExecStart must name an existing executable for verify: use the one just built.
    let local = text.replace(&exec, &format!("{} run", env!("CARGO_BIN_EXE_walpost")));
    std::fs::write(&unit, local).expect("write unit copy");
    let out = Command::new("systemd-analyze").arg("verify").arg(&unit).output().expect("run systemd-analyze verify");
    let complaints = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    let complaints: Vec<&str> = complaints.lines().filter(|l| l.contains("walpost.service")).collect();
    assert!(complaints.is_empty(), "{SYSTEMD_UNIT}: systemd-analyze verify complains:\n{}", complaints.join("\n"));
}

// ------------------------------------------------------------------------------------
// the health probes against a real walpost process
// ------------------------------------------------------------------------------------

struct Walpost {
    child: Child,
}

impl Drop for Walpost {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    l.local_addr().expect("local addr").port()
}

fn healthz_answers(port: u16) -> bool {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    if s.write_all(b"GET /healthz HTTP/1.0\r\n\r\n").is_err() {
        return false;
    }
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    // An HTTP/1.0 request gets an HTTP/1.0 answer (hyper), as the probes' grep expects.
    out.starts_with("HTTP/1.1 200") || out.starts_with("HTTP/1.0 200")
}

/// Runs a probe the way the container engine would, with the container's metrics
/// variable; true when it exits 0 within `limit`.
fn probe_passes(argv: &[String], metrics_addr: &str, limit: Duration) -> bool {
    let mut child = Command::new(&argv[0])
        .args(&argv[1..])
        .env("WALPOST_METRICS_ADDR", metrics_addr)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run probe {argv:?}: {e}"));
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().expect("wait for probe") {
            return status.success();
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn health_probes_pass_against_a_running_walpost_and_fail_without_it() {
    let version = Command::new(env!("CARGO_BIN_EXE_walpost")).arg("--version").output().expect("run walpost --version");
    let version = String::from_utf8_lossy(&version.stdout).trim().to_owned();
    let commit = version
        .strip_prefix(&format!("walpost {} (", env!("CARGO_PKG_VERSION")))
        .and_then(|r| r.strip_suffix(')'))
        .unwrap_or_else(|| panic!("walpost --version prints {version:?}, expected `walpost <version> (<commit>)`"));
    assert!(!commit.is_empty(), "walpost --version has an empty commit");

    let doc = compose();
    let probes = [
        ("Dockerfile HEALTHCHECK", dockerfile_healthcheck_argv()),
        ("docker-compose.yml walpost healthcheck", compose_healthcheck_argv(service(&doc, "walpost"))),
    ];
    for (what, argv) in &probes {
        assert!(argv.join(" ").contains("/healthz"), "{what} does not ask /healthz: {argv:?}");
    }

    // walpost with nothing to connect to (port 1 refuses at once) still serves /healthz:
    // it is alive and retrying, which is what the liveness probe should report.
    let port = free_port();
    let metrics_addr = format!("127.0.0.1:{port}");
    let log = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("compose-probe-walpost.log");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_walpost"));
    for var in variables_walpost_reads().keys() {
        cmd.env_remove(var);
    }
    cmd.arg("run")
        .env("WALPOST_POSTGRES", "postgres://walpost@127.0.0.1:1/walpost?connect_timeout=1")
        .env("WALPOST_KAFKA_BROKERS", "127.0.0.1:1")
        .env("WALPOST_METRICS_ADDR", &metrics_addr)
        .env("WALPOST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).expect("create log file"));
    let mut walpost = Walpost { child: cmd.spawn().expect("start walpost") };
    let deadline = Instant::now() + Duration::from_secs(20);
    while !healthz_answers(port) {
        if let Some(status) = walpost.child.try_wait().expect("wait") {
            panic!(
                "walpost exited ({status}) before serving /healthz; log: {}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
        }
        assert!(Instant::now() < deadline, "walpost did not serve /healthz on {metrics_addr} within 20 s");
        std::thread::sleep(Duration::from_millis(100));
    }

    for (what, argv) in &probes {
        assert!(
            probe_passes(argv, &metrics_addr, Duration::from_secs(10)),
            "{what} fails against a healthy walpost: {argv:?}"
        );
        let wrong: Vec<String> = argv.iter().map(|a| a.replace("/healthz", "/no-such-path")).collect();
        assert!(
            !probe_passes(&wrong, &metrics_addr, Duration::from_secs(10)),
            "{what} passes on a 404 too: it does not check the status"
        );
    }

    // SIGTERM (what docker stop, compose and systemd send): a clean exit 0.
    let pid = walpost.child.id().to_string();
    let killed = Command::new("kill").args(["-TERM", &pid]).status().expect("run kill");
    assert!(killed.success(), "kill -TERM {pid} failed");
    let deadline = Instant::now() + default_shutdown_timeout() + Duration::from_secs(10);
    let status = loop {
        if let Some(status) = walpost.child.try_wait().expect("wait") {
            break status;
        }
        assert!(Instant::now() < deadline, "walpost did not stop after SIGTERM");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(
        status.success(),
        "walpost exited {status} after SIGTERM; log: {}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );

    for (what, argv) in &probes {
        assert!(!probe_passes(argv, &metrics_addr, Duration::from_secs(10)), "{what} passes with walpost stopped");
    }
}

#[test]
fn duration_and_size_parsers() {
    assert_eq!(parse_duration("45s"), Some(Duration::from_secs(45)));
    assert_eq!(parse_duration("1m30s"), Some(Duration::from_secs(90)));
    assert_eq!(parse_duration("1min 30s"), Some(Duration::from_secs(90)));
    assert_eq!(parse_duration("90"), Some(Duration::from_secs(90)));
    assert_eq!(parse_duration("soon"), None);
    assert_eq!(parse_pg_size_mb_unit("1GB"), Some(1 << 30));
    assert_eq!(parse_pg_size_mb_unit("1024"), Some(1 << 30));
    assert_eq!(parse_pg_size_mb_unit("-1"), None);
    assert_eq!(parse_pg_size_mb_unit("lots"), None);
}
