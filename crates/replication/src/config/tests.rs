use std::collections::HashMap;
use std::path::{Path, PathBuf};

use super::*;

/// A password with every character that used to cut a URL short (and the key/value
/// delimiters), searched for in error texts whole and by fragment. Its fragments are
/// mixed-case so that no error text holds one by chance.
const CANARY: &str = "Can4ry/Pa55@Wq?Zx#Kj:Mm&Vb Tt'Hh\\Uu";

fn no_env(_: &str) -> Option<String> {
    None
}

/// Parses with only `vars` in the environment (plus USER so a user name always exists).
fn parse_env(text: &str, vars: &[(&str, &str)]) -> Result<Config, ConfigError> {
    let map: HashMap<String, String> = vars
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .chain([("USER".into(), "osuser".into())])
        .collect();
    Config::parse_with_env(text, &|k| map.get(k).cloned())
}

fn p(text: &str) -> Config {
    parse_env(text, &[]).unwrap_or_else(|e| panic!("{text}: {e}"))
}

fn tcp(name: &str, port: u16) -> (Host, u16) {
    (Host::Tcp(name.into()), port)
}

fn hosts(c: &Config) -> Vec<(Host, u16)> {
    c.hosts.iter().map(|h| (h.host.clone(), h.port)).collect()
}

/// A fresh directory under the system temp dir.
fn temp_dir(name: &str) -> PathBuf {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    let dir = std::env::temp_dir().join(format!(
        "replication-config-{name}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn write_mode(path: &Path, text: &str, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

#[test]
fn parses_full_url() {
    let c = p("postgres://app:s%40cret@db.example:6543/shop?sslmode=verify-full&sslrootcert=/ca.pem");
    assert_eq!(hosts(&c), vec![tcp("db.example", 6543)]);
    assert_eq!(c.user, "app");
    assert_eq!(c.password(), Some("s@cret"));
    assert_eq!(c.dbname, "shop");
    assert_eq!(c.sslmode, SslMode::VerifyFull);
    assert_eq!(c.sslrootcert, Some(RootCert::File(PathBuf::from("/ca.pem"))));
    assert_eq!(c.connect_timeout, Some(DEFAULT_CONNECT_TIMEOUT));
    assert_eq!(c.target_session_attrs, TargetSessionAttrs::Any);
    assert_eq!(c.require_auth, None);
    assert_eq!(c.channel_binding, ChannelBinding::Prefer);
    assert!(c.keepalives.enabled);
}

#[test]
fn unix_socket_host_in_authority_or_query() {
    let a = p("postgres://u@%2Fvar%2Frun%2Fpostgresql:5433/db");
    assert_eq!(hosts(&a), vec![(Host::Unix("/var/run/postgresql".into()), 5433)]);
    let b = p("postgresql://u@/db?host=/tmp");
    assert_eq!(hosts(&b), vec![(Host::Unix("/tmp".into()), 5432)]);
    assert!(b.hosts[0].is_unix_socket());
    let c = p("host=/tmp,db2 port=5433 user=u");
    assert_eq!(hosts(&c), vec![(Host::Unix("/tmp".into()), 5433), tcp("db2", 5433)]);
    assert_eq!(c.hosts[0].label(), "/tmp/.s.PGSQL.5433");
}

#[test]
fn ipv6_host() {
    let c = p("postgres://u@[::1]:5999/db");
    assert_eq!(hosts(&c), vec![tcp("::1", 5999)]);
    assert_eq!(c.hosts[0].label(), "[::1]:5999");
    assert_eq!(c.redacted(), "postgres://u@[::1]:5999/db");
}

#[test]
fn redaction_hides_password() {
    let c = p("postgres://u:hunter2@h/db");
    assert!(!c.redacted().contains("hunter2"));
    assert!(!format!("{c:?}").contains("hunter2"));
    assert!(c.redacted().contains("****"));
}

#[test]
fn errors_name_the_problem() {
    let e = Config::parse_with_env("mysql://x", &no_env).unwrap_err().to_string();
    assert!(e.contains("postgres://"), "{e}");
    let e = parse_env("postgres://u@h/db?sslmode=bogus", &[]).unwrap_err().to_string();
    assert!(e.contains("sslmode=bogus"), "{e}");
    let e = parse_env("postgres://u@h:99999/db", &[]).unwrap_err().to_string();
    assert!(e.contains("99999"), "{e}");
    let e = parse_env("postgres://u@h/db?sslmode=verify-ca", &[]).unwrap_err().to_string();
    assert!(e.contains("sslrootcert"), "{e}");
    let e = parse_env("postgres://u@h/db?frobnicate=1", &[]).unwrap_err().to_string();
    assert!(e.contains("frobnicate"), "{e}");
    let e = parse_env("host=h frobnicate=1", &[]).unwrap_err().to_string();
    assert!(e.contains("frobnicate"), "{e}");
    let e = parse_env("", &[("PGSSLMODE", "bogus")]).unwrap_err().to_string();
    assert!(e.contains("sslmode=bogus (from PGSSLMODE)"), "{e}");
}

#[test]
fn url_and_key_value_forms_agree() {
    let url = p("postgresql://app:pw@a:5432,b:5433/shop?sslmode=require&application_name=relay&target_session_attrs=read-write&connect_timeout=3");
    let kv = p("host=a,b port=5432,5433 dbname=shop user=app password=pw sslmode=require application_name=relay target_session_attrs=read-write connect_timeout=3");
    assert_eq!(url, kv);
    assert_eq!(hosts(&url), vec![tcp("a", 5432), tcp("b", 5433)]);
    assert_eq!(url.connect_timeout, Some(Duration::from_secs(3)));
    assert_eq!(url.target_session_attrs, TargetSessionAttrs::ReadWrite);
    assert_eq!(url.redacted(), "postgres://app:****@a:5432,b:5433/shop");
}

#[test]
fn libpq_host_and_port_list_rules() {
    // One port for every host.
    assert_eq!(hosts(&p("host=a,b,c port=6000")), vec![tcp("a", 6000), tcp("b", 6000), tcp("c", 6000)]);
    // Empty entries take the defaults.
    assert_eq!(hosts(&p("host=a,,c port=1,,3")), vec![tcp("a", 1), tcp("localhost", 5432), tcp("c", 3)]);
    assert_eq!(hosts(&p("postgres://a,b:5433/db")), vec![tcp("a", 5432), tcp("b", 5433)]);
    assert_eq!(hosts(&p("postgres:///db")), vec![tcp("localhost", 5432)]);
    let e = parse_env("host=a,b,c port=1,2", &[]).unwrap_err().to_string();
    assert!(e.contains("could not match 2 port numbers to 3 hosts"), "{e}");
    // hostaddr: one per host, the host name kept for TLS and the password file.
    let c = p("host=db1,db2 hostaddr=10.0.0.1,10.0.0.2 port=5432");
    assert_eq!(c.hosts[1].hostaddr, Some("10.0.0.2".parse().unwrap()));
    assert_eq!(c.hosts[1].host, Host::Tcp("db2".into()));
    assert_eq!(c.hosts[1].label(), "db2:5432 (hostaddr 10.0.0.2)");
    assert!(c.redacted().ends_with("?hostaddr=10.0.0.1,10.0.0.2"), "{}", c.redacted());
    let c = p("hostaddr=127.0.0.1");
    assert_eq!(hosts(&c), vec![tcp("127.0.0.1", 5432)]);
    let e = parse_env("host=a,b hostaddr=10.0.0.1", &[]).unwrap_err().to_string();
    assert!(e.contains("could not match 2 host names to 1 hostaddr values"), "{e}");
    let e = parse_env("hostaddr=db.example", &[]).unwrap_err().to_string();
    assert!(e.contains("not a numeric IP address"), "{e}");
}

#[test]
fn pg_environment_variables_are_defaults_the_text_overrides() {
    let env = [
        ("PGHOST", "e1,e2"),
        ("PGPORT", "7001,7002"),
        ("PGUSER", "envuser"),
        ("PGDATABASE", "envdb"),
        ("PGPASSWORD", "envpw"),
        ("PGSSLMODE", "require"),
        ("PGSSLROOTCERT", "/env/ca.pem"),
        ("PGAPPNAME", "envapp"),
        ("PGCONNECT_TIMEOUT", "0"),
        ("PGTARGETSESSIONATTRS", "primary"),
        ("PGREQUIREAUTH", "scram-sha-256"),
        ("PGCHANNELBINDING", "require"),
    ];
    let c = parse_env("", &env).unwrap();
    assert_eq!(hosts(&c), vec![tcp("e1", 7001), tcp("e2", 7002)]);
    assert_eq!((c.user.as_str(), c.dbname.as_str(), c.password()), ("envuser", "envdb", Some("envpw")));
    assert_eq!(c.sslmode, SslMode::Require);
    assert_eq!(c.sslrootcert, Some(RootCert::File("/env/ca.pem".into())));
    assert!(c.verifies_certificate(), "require with a root file checks the chain, as libpq");
    assert_eq!(c.application_name, "envapp");
    assert_eq!(c.connect_timeout, None, "0 means no limit");
    assert_eq!(c.target_session_attrs, TargetSessionAttrs::Primary);
    assert_eq!(c.require_auth.as_ref().map(ToString::to_string).as_deref(), Some("require_auth=scram-sha-256"));
    assert_eq!(c.channel_binding, ChannelBinding::Require);

    let c = parse_env("postgres://u:pw@h:1/db?sslmode=disable&application_name=mine&connect_timeout=1", &env).unwrap();
    assert_eq!(hosts(&c), vec![tcp("h", 1)]);
    assert_eq!((c.user.as_str(), c.dbname.as_str(), c.password()), ("u", "db", Some("pw")));
    assert_eq!(c.sslmode, SslMode::Disable);
    assert_eq!(c.application_name, "mine");
    assert_eq!(c.connect_timeout, Some(Duration::from_secs(2)), "1 counts as 2, as in libpq");

    // An explicitly empty value means the built-in default, not the variable.
    let c = parse_env("host='' port='' dbname=x", &env).unwrap();
    assert_eq!(hosts(&c), vec![tcp("localhost", 5432)]);
    // libpq's list rule holds across sources: one host from the text, two ports from PGPORT.
    let e = parse_env("host=one", &env).unwrap_err().to_string();
    assert!(e.contains("could not match 2 port numbers to 1 hosts (from PGPORT)"), "{e}");
    // No PGUSER: the OS user; no dbname: the user name.
    let c = parse_env("host=h", &[]).unwrap();
    assert_eq!((c.user.as_str(), c.dbname.as_str()), ("osuser", "osuser"));
    let e = Config::parse_with_env("host=h", &no_env).unwrap_err().to_string();
    assert!(e.contains("no user name"), "{e}");
}

#[test]
fn connect_timeout_and_keepalives() {
    assert_eq!(p("host=h connect_timeout=-5").connect_timeout, None);
    assert_eq!(p("host=h connect_timeout=30").connect_timeout, Some(Duration::from_secs(30)));
    let e = parse_env("host=h connect_timeout=soon", &[]).unwrap_err().to_string();
    assert!(e.contains("connect_timeout=soon"), "{e}");
    let k = p("host=h keepalives=1 keepalives_idle=30 keepalives_interval=5 keepalives_count=3").keepalives;
    assert_eq!(
        k,
        Keepalives {
            enabled: true,
            idle: Some(Duration::from_secs(30)),
            interval: Some(Duration::from_secs(5)),
            count: Some(3)
        }
    );
    assert!(!p("host=h keepalives=0").keepalives.enabled);
}

#[test]
fn require_auth_follows_libpq() {
    let r = |t: &str| p(&format!("host=h require_auth={t}")).require_auth.unwrap();
    let pos = r("password,scram-sha-256");
    assert!(pos.allows(AuthMethod::Password) && pos.allows(AuthMethod::ScramSha256));
    assert!(!pos.allows(AuthMethod::Md5) && !pos.allows(AuthMethod::None));
    let neg = r("!password,!md5");
    assert!(!neg.allows(AuthMethod::Password) && !neg.allows(AuthMethod::Md5));
    assert!(neg.allows(AuthMethod::ScramSha256) && neg.allows(AuthMethod::None));
    assert!(!r("!none").allows(AuthMethod::None));
    assert!(r("none").allows(AuthMethod::None) && !r("none").allows(AuthMethod::ScramSha256));
    assert_eq!(neg.to_string(), "require_auth=!password,!md5");
    for (bad, expect) in [
        ("password,!md5", "cannot be mixed"),
        ("md5,md5", "more than once"),
        ("kerberos", "'kerberos' is not one of"),
        ("password,", "'' is not one of"),
    ] {
        let e = parse_env(&format!("host=h require_auth={bad}"), &[]).unwrap_err().to_string();
        assert!(e.contains(expect), "{bad}: {e}");
    }
    let e = parse_env("host=h", &[("PGREQUIREAUTH", "nope")]).unwrap_err().to_string();
    assert!(e.contains("(from PGREQUIREAUTH)"), "{e}");
    assert!(parse_env("host=h channel_binding=always", &[])
        .unwrap_err()
        .to_string()
        .contains("channel_binding=always"));
}

#[test]
fn sslrootcert_system_means_verify_full() {
    let c = p("host=h sslrootcert=system");
    assert_eq!((c.sslmode, c.sslrootcert.clone()), (SslMode::VerifyFull, Some(RootCert::System)));
    for weak in ["disable", "prefer", "require", "verify-ca"] {
        let e = parse_env(&format!("host=h sslrootcert=system sslmode={weak}"), &[]).unwrap_err().to_string();
        assert!(e.contains("only sslmode=verify-full"), "{weak}: {e}");
    }
    assert!(!p("host=h sslmode=require").verifies_certificate());
    assert!(p("host=h sslmode=prefer sslrootcert=/ca.pem").verifies_certificate());
    assert!(!p("host=h sslmode=disable sslrootcert=/ca.pem").verifies_certificate());
}

#[test]
fn pinned_config_keeps_everything_but_the_other_hosts() {
    let c = p("host=a,b port=1,2 user=u password=pw target_session_attrs=read-write");
    let pinned = c.pinned_to(&c.hosts[1]);
    assert_eq!(hosts(&pinned), vec![tcp("b", 2)]);
    assert_eq!(pinned.password(), Some("pw"));
    assert_eq!(pinned.target_session_attrs, TargetSessionAttrs::ReadWrite);
}

#[test]
fn password_file_per_host_with_libpq_precedence() {
    let dir = temp_dir("pgpass");
    let file = dir.join("pgpass");
    write_mode(
        &file,
        "a:5432:shop:app:pw-a\n*:5433:shop:app:pw-any-5433\nlocalhost:5432:*:app:pw-local\n/srv/sock:5432:*:*:pw-sock\n",
        0o600,
    );
    let path = file.display().to_string();
    let c = parse_env(
        &format!(
            "host=a,b,/var/run/postgresql,/srv/sock port=5432,5433,5432,5432 dbname=shop user=app passfile={path}"
        ),
        &[],
    )
    .unwrap();
    let got: Vec<Option<&str>> = c.hosts.iter().map(|h| c.password_for(h)).collect();
    assert_eq!(got, vec![Some("pw-a"), Some("pw-any-5433"), Some("pw-local"), Some("pw-sock")]);
    assert_eq!(c.password(), None);
    assert_eq!(c.passfile.as_deref(), Some(file.as_path()));
    assert!(!format!("{c:?}").contains("pw-") && !c.redacted().contains("pw-"), "{c:?}");
    assert!(!format!("{:?}", c.hosts).contains("pw-"), "{:?}", c.hosts);

    // PGPASSFILE, and $HOME/.pgpass as the last resort.
    let c = parse_env("host=a dbname=shop user=app", &[("PGPASSFILE", &path)]).unwrap();
    assert_eq!(c.password_for(&c.hosts[0]), Some("pw-a"));
    write_mode(&dir.join(".pgpass"), "*:*:*:*:from-home\n", 0o600);
    let home = dir.display().to_string();
    let c = parse_env("host=a dbname=shop user=app", &[("HOME", &home)]).unwrap();
    assert_eq!(c.password_for(&c.hosts[0]), Some("from-home"));

    // A password in the text or PGPASSWORD wins; the file is not even read.
    let c = parse_env(&format!("host=a dbname=shop user=app passfile={path}"), &[("PGPASSWORD", "env")]).unwrap();
    assert_eq!(c.password_for(&c.hosts[0]), Some("env"));
    assert_eq!(c.passfile, None);

    // A missing file is no error.
    let c = parse_env("host=a user=app passfile=/nonexistent/pgpass", &[]).unwrap();
    assert_eq!((c.password_for(&c.hosts[0]), c.passfile_note()), (None, None));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn password_file_with_group_or_world_access_is_ignored_with_the_chmod_to_run() {
    let dir = temp_dir("pgpass-mode");
    let file = dir.join("pgpass");
    for mode in [0o640, 0o604, 0o660] {
        write_mode(&file, "*:*:*:*:secret-pw\n", mode);
        let c = parse_env(&format!("host=a user=app passfile={}", file.display()), &[]).unwrap();
        assert_eq!(c.password_for(&c.hosts[0]), None, "mode {mode:o}");
        let note = c.passfile_note().unwrap();
        assert!(note.contains("group or world access") && note.contains("chmod 0600"), "{note}");
        assert!(!note.contains("secret-pw"));
    }
    let c = parse_env(&format!("host=a user=app passfile={}", dir.display()), &[]).unwrap();
    assert!(c.passfile_note().unwrap().contains("not a plain file"));
    let _ = std::fs::remove_dir_all(&dir);
}

/// Every way of getting a connection string wrong, with a password full of URL
/// delimiters in it: the error never shows the password, nor any part of it.
#[test]
fn regression_canary_password_never_in_config_errors() {
    let enc = |s: &str| {
        s.bytes()
            .map(|b| if b.is_ascii_alphanumeric() { char::from(b).to_string() } else { format!("%{b:02X}") })
            .collect::<String>()
    };
    let quoted = CANARY.replace('\\', "\\\\").replace('\'', "\\'");
    let c = CANARY;
    let cases: Vec<String> = vec![
        format!("postgres://app:{c}@h:99999/db"),
        format!("postgres://app:{c}@h:notaport/db"),
        format!("postgres://app:{c}/db"),
        format!("postgres://app:{c}"),
        format!("postgres://app:{c}@[::1/db"),
        format!("postgres://app:{c}@h/db?sslmode=bogus"),
        format!("postgres://app:{c}@h/db?frobnicate=1"),
        format!("postgres://app:{c}@h/db?sslmode"),
        format!("postgres://app:{c}@h/db?sslmode=verify-ca"),
        format!("postgres://app:{c}%zz@h/db"),
        format!("postgres://app@h/db?password={c}"),
        format!("postgres://app@h/db?password={c}&sslmode=bogus"),
        format!("postgres://app@h/db?password={}&x", enc(c)),
        format!("postgresql://{c}"),
        format!("postgres:/app:{c}@h/db"),
        format!("postgress://app:{c}@h/db"),
        format!("postgres//app:{c}@h/db"),
        format!("host=h password={c}"),
        format!("host=h password={c} sslmode=bogus"),
        format!("host=h password='{quoted}' port=x"),
        format!("host=h password='{quoted}"),
        format!("host=h password = '{quoted}' frobnicate"),
        format!("host=h password {quoted}"),
        format!("{c}"),
        format!("password={c} host"),
        format!("host=h,{c} port=1,2,3"),
        format!("hostaddr={} password={c}", "not-an-ip"),
    ];
    let fragments: Vec<&str> = CANARY.split(|ch: char| "/@?#:&' \\".contains(ch)).collect();
    for text in &cases {
        let result = parse_env(text, &[("PGPASSWORD", CANARY)]);
        let shown = match &result {
            Err(e) => format!("{e} {e:?}"),
            Ok(config) => format!("{} {config:?} {:?}", config.redacted(), config.hosts),
        };
        assert!(!shown.contains(CANARY), "{text}\n -> {shown}");
        for f in &fragments {
            assert!(!shown.contains(f), "fragment {f:?} of the password shown for {text}\n -> {shown}");
        }
    }
    // And the well-formed strings parse to exactly the password.
    assert_eq!(p(&format!("postgres://app:{c}@h:5/db")).password(), Some(CANARY));
    assert_eq!(p(&format!("postgres://app:{}@h:5/db", enc(c))).password(), Some(CANARY));
    assert_eq!(p(&format!("host=h password='{quoted}'")).password(), Some(CANARY));
}

/// A session's search_path is walpost's whatever the user's `options` hold: a role with
/// CREATE on `public` could otherwise plant a function walpost's SQL would call.
#[test]
fn regression_startup_options_keep_the_users_and_end_with_the_fixed_search_path() {
    let fixed = "-c search_path=pg_catalog,pg_temp";
    assert_eq!(p("host=h").startup_options(), fixed);
    assert_eq!(p("host=h").options, None);
    // The user's switches are kept, from either form or PGOPTIONS, and come first.
    let kv = p("host=h options='-c statement_timeout=5s -c lock_timeout=1s'");
    assert_eq!(kv.startup_options(), format!("-c statement_timeout=5s -c lock_timeout=1s {fixed}"));
    let url = p("postgres://u@h/db?options=-c%20statement_timeout%3D5s");
    assert_eq!(url.startup_options(), format!("-c statement_timeout=5s {fixed}"));
    let env = parse_env("host=h", &[("PGOPTIONS", "-c work_mem=8MB")]).unwrap();
    assert_eq!(env.startup_options(), format!("-c work_mem=8MB {fixed}"));
    // The string's options win over PGOPTIONS, as every keyword does.
    let both = parse_env("host=h options=-cgeqo=off", &[("PGOPTIONS", "-c work_mem=8MB")]).unwrap();
    assert_eq!(both.startup_options(), format!("-cgeqo=off {fixed}"));
    // A search_path of the user's is kept but comes before walpost's, which the server
    // applies last.
    let theirs = p("host=h options='-c search_path=app,public'");
    let merged = theirs.startup_options();
    assert!(merged.ends_with(fixed), "{merged}");
    assert!(merged.find("app,public") < merged.find("pg_catalog"), "{merged}");
    // An escaped backslash at the end is the user's; a lone one would swallow the space
    // before walpost's switch, so it is refused.
    assert_eq!(p(r"host=h options='-c x=a\\\\'").startup_options(), format!(r"-c x=a\\ {fixed}"));
    let e = parse_env(r"host=h options='-c x=a\\'", &[]).unwrap_err().to_string();
    assert!(e.contains("options ends with a lone backslash"), "{e}");
    let e = parse_env("host=h", &[("PGOPTIONS", r"-c x=a\")]).unwrap_err().to_string();
    assert!(e.contains("options (from PGOPTIONS) ends with a lone backslash"), "{e}");
}
