//! Throwaway PostgreSQL clusters.
//!
//! Why one file over 600 lines: a cluster's whole life (initdb as an ordinary user,
//! configuration, TLS, start, a physical standby, SQL through psql, stop) is one type
//! the tests drive; this is test harness, not walpost.

use std::fmt::Write as _;
use std::fs;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::Instant;

use crate::util::{self, err, Watchdog};
use crate::Result;

mod standby;
pub use standby::{StandbyOptions, STANDBY_TIMEOUT};

/// Name of the superuser role clients log in as (and of the default database).
pub(crate) const ROLE: &str = "walpost";
/// Default password of [`ROLE`].
pub(crate) const DEFAULT_PASSWORD: &str = "walpost";

/// Options for [`Postgres::start`]. Build with struct-update syntax:
/// `PgOptions { extra_conf: vec![("max_connections".into(), "50".into())], ..Default::default() }`.
#[derive(Debug, Clone, Default)]
pub struct PgOptions {
    /// Extra `postgresql.conf` settings, written after (and so overriding) the harness's
    /// own. Values are written single-quoted, which PostgreSQL accepts for every type.
    pub extra_conf: Vec<(String, String)>,
    /// Password of the `walpost` superuser role; `None` means `walpost`.
    pub superuser_password: Option<String>,
    /// Extra `pg_hba.conf` lines, placed **before** the defaults (first match wins), e.g.
    /// `"host all md5_user 127.0.0.1/32 md5"`. Defaults: `local all all trust`,
    /// `local replication all trust`, `host all all 127.0.0.1/32 scram-sha-256`,
    /// `host replication all 127.0.0.1/32 scram-sha-256`.
    pub extra_hba: Vec<String>,
    /// Turn on TLS (`ssl = on`): a throwaway CA, a server certificate for `127.0.0.1` /
    /// `localhost` and a client certificate with CN `walpost` are generated with the
    /// `openssl` CLI into [`Postgres::tls_dir`] (`ca.crt`, `server.crt`, `server.key`,
    /// `client.crt`, `client.key`); `ssl_ca_file` is set to the CA so `clientcert=...`
    /// and `cert` auth work in `extra_hba` lines. Plain connections stay allowed.
    pub tls: bool,
    /// Directory of the server binaries for this cluster (e.g. from
    /// [`crate::pg_bin_dir_for_major`]); `None`: `WALPOST_PG_BINDIR` or the defaults
    /// (see the crate docs).
    pub bin_dir: Option<PathBuf>,
}

/// Shutdown mode for [`Postgres::stop`] (`pg_ctl stop -m ...`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopMode {
    /// Wait for all clients (including replication connections) to disconnect.
    Smart,
    /// Disconnect clients, shut down cleanly (checkpoint).
    Fast,
    /// Abort without a checkpoint; crash recovery at next start.
    Immediate,
}

impl StopMode {
    fn arg(self) -> &'static str {
        match self {
            StopMode::Smart => "smart",
            StopMode::Fast => "fast",
            StopMode::Immediate => "immediate",
        }
    }
}

/// A running PostgreSQL cluster in a temporary directory. Stopped (immediate) and
/// deleted on drop.
///
/// Layout of [`Postgres::dir`]: `data/` (the cluster), `postgres.log` (server log),
/// the Unix socket `.s.PGSQL.PORT`, and `tls/` when [`PgOptions::tls`] is set.
#[derive(Debug)]
pub struct Postgres {
    dir: PathBuf,
    data_dir: PathBuf,
    bin_dir: PathBuf,
    /// OS user running the cluster when we are root (commands go through `runuser`).
    os_user: Option<String>,
    port: u16,
    major: u32,
    password: String,
    tls_dir: Option<PathBuf>,
    watchdog: Mutex<Option<Watchdog>>,
    /// Set when the cluster was created by [`Postgres::start_standby`].
    standby_of: Option<StandbyLink>,
}

/// Where a standby streams from.
#[derive(Debug, Clone)]
struct StandbyLink {
    primary_port: u16,
    slot: String,
}

impl Postgres {
    /// Creates a cluster with `initdb` and starts it. See the crate docs for what is
    /// configured; clients use [`Postgres::url`].
    pub fn start(opts: PgOptions) -> Result<Postgres> {
        let t0 = Instant::now();
        let bin_dir = match &opts.bin_dir {
            Some(d) if d.join("initdb").is_file() && d.join("pg_ctl").is_file() => d.clone(),
            Some(d) => return Err(err(format!("PgOptions::bin_dir {} has no initdb/pg_ctl", d.display()))),
            None => find_bin_dir()?,
        };
        let os_user = if util::is_root() { Some(os_user_for_root()?) } else { None };
        let dir = util::make_temp_dir("pg")?;
        let mut pg = Postgres {
            data_dir: dir.join("data"),
            dir,
            bin_dir,
            os_user,
            port: 0,
            major: 0,
            password: opts.superuser_password.clone().unwrap_or_else(|| DEFAULT_PASSWORD.to_string()),
            tls_dir: None,
            watchdog: Mutex::new(None),
            standby_of: None,
        };
        // From here on, Drop cleans up on error.
        pg.init(&opts)?;
        let init_ms = t0.elapsed().as_millis();
        pg.start_with_port_retries()?;
        pg.bootstrap_roles()?;
        eprintln!(
            "testkit: PostgreSQL {} on 127.0.0.1:{} ready in {} ms (initdb {} ms) — {}",
            pg.major,
            pg.port,
            t0.elapsed().as_millis(),
            init_ms,
            pg.dir.display()
        );
        Ok(pg)
    }

    /// Arms the watchdog for this cluster's directory and hands the directory to the
    /// cluster's OS user (when root); returns that user's uid/gid.
    fn arm(&mut self) -> Result<Option<(u32, u32)>> {
        // First of all: make sure the server and directory go away with this process.
        let wd = Watchdog::spawn(
            &self.data_dir.join("postmaster.pid"),
            &self.data_dir.to_string_lossy(),
            "QUIT",
            &self.dir,
        )?;
        *self.watchdog.lock().unwrap_or_else(|e| e.into_inner()) = Some(wd);
        match &self.os_user {
            Some(u) => {
                let (uid, gid) = util::user_ids(u).ok_or_else(|| err(format!("OS user {u} vanished")))?;
                std::os::unix::fs::chown(&self.dir, Some(uid), Some(gid))
                    .map_err(|e| err(format!("chown {} to {u}: {e}", self.dir.display())))?;
                Ok(Some((uid, gid)))
            }
            None => Ok(None),
        }
    }

    fn init(&mut self, opts: &PgOptions) -> Result<()> {
        let owner = self.arm()?;

        let mut initdb = self.pg_command("initdb");
        initdb
            .arg("-D")
            .arg(&self.data_dir)
            .args(["--encoding=UTF8", "--locale=C", "--no-sync", "--no-instructions"])
            .args(["--auth-local=trust", "--auth-host=scram-sha-256"]);
        util::run(&mut initdb, "initdb")?;
        self.major = fs::read_to_string(self.data_dir.join("PG_VERSION"))?
            .trim()
            .parse()
            .map_err(|e| err(format!("bad PG_VERSION: {e}")))?;

        if opts.tls {
            let tls = self.dir.join("tls");
            make_tls_files(&tls)?;
            if let Some((uid, gid)) = owner {
                util::chown_recursive(&tls, uid, gid)?;
            }
            self.tls_dir = Some(tls);
        }

        // pg_hba.conf: overwritten (keeps owner and mode).
        let mut hba = String::from("# written by testkit\n");
        for line in &opts.extra_hba {
            let _ = writeln!(hba, "{line}");
        }
        hba.push_str(
            "local all all trust\n\
             local replication all trust\n\
             host all all 127.0.0.1/32 scram-sha-256\n\
             host replication all 127.0.0.1/32 scram-sha-256\n",
        );
        fs::write(self.data_dir.join("pg_hba.conf"), hba)?;

        let mut conf: Vec<(String, String)> = [
            ("listen_addresses", "127.0.0.1"),
            ("unix_socket_directories", &*self.dir.to_string_lossy()),
            ("wal_level", "logical"),
            ("max_wal_senders", "10"),
            ("max_replication_slots", "10"),
            ("wal_sender_timeout", "60s"),
            ("fsync", "off"),
            ("full_page_writes", "off"),
            ("synchronous_commit", "on"),
            ("password_encryption", "scram-sha-256"),
            ("logging_collector", "off"),
            ("log_line_prefix", "%m [%p] %q%u@%d/%a "),
            ("log_replication_commands", "on"),
            ("timezone", "UTC"),
            ("log_timezone", "UTC"),
            ("lc_messages", "C"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        if let Some(tls) = &self.tls_dir {
            let p = |f: &str| tls.join(f).to_string_lossy().into_owned();
            conf.push(("ssl".into(), "on".into()));
            conf.push(("ssl_cert_file".into(), p("server.crt")));
            conf.push(("ssl_key_file".into(), p("server.key")));
            conf.push(("ssl_ca_file".into(), p("ca.crt")));
        }
        conf.extend(opts.extra_conf.iter().cloned());
        append_conf(&self.data_dir, "testkit", &conf)
    }

    fn start_with_port_retries(&mut self) -> Result<()> {
        let mut last_err = None;
        for _ in 0..5 {
            self.port = util::free_port();
            append(&self.data_dir.join("postgresql.conf"), &format!("port = {}\n", self.port))?;
            let log_before = util::file_len(&self.log_path());
            match self.start_again() {
                Ok(()) => return Ok(()),
                Err(e) => {
                    let log = util::read_from(&self.log_path(), log_before);
                    if log.contains("could not bind") || log.contains("could not create any TCP/IP sockets") {
                        last_err = Some(e);
                        continue;
                    }
                    return Err(e);
                }
            }
        }
        Err(last_err.unwrap_or_else(|| err("PostgreSQL: could not find a free port")))
    }

    fn bootstrap_roles(&self) -> Result<()> {
        let bootstrap_user = self.bootstrap_superuser();
        let sql = format!(
            "SET password_encryption = 'scram-sha-256';\n\
             CREATE ROLE {ROLE} WITH SUPERUSER LOGIN REPLICATION PASSWORD :'password';\n\
             CREATE DATABASE {ROLE} OWNER {ROLE};\n"
        );
        self.psql_inner(&bootstrap_user, "postgres", PsqlInput::Sql(&sql), &[("password", &self.password)])?;
        Ok(())
    }

    /// The initdb superuser (named after the OS user running the cluster).
    fn bootstrap_superuser(&self) -> String {
        match &self.os_user {
            Some(u) => u.clone(),
            None => current_user_name(),
        }
    }

    /// TCP port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `postgres://walpost:PASSWORD@127.0.0.1:PORT/walpost`
    pub fn url(&self) -> String {
        self.url_for(ROLE, &self.password, ROLE)
    }

    /// `postgres://USER:PASSWORD@127.0.0.1:PORT/DB` (components percent-encoded).
    pub fn url_for(&self, user: &str, password: &str, db: &str) -> String {
        format!("postgres://{}:{}@127.0.0.1:{}/{}", pct(user), pct(password), self.port, pct(db))
    }

    /// Password of the `walpost` superuser role.
    pub fn password(&self) -> &str {
        &self.password
    }

    /// Directory of the Unix socket (also the temporary root directory).
    pub fn socket_dir(&self) -> &Path {
        &self.dir
    }

    /// Temporary root directory (data dir, log, socket, TLS files).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The cluster's data directory.
    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// Directory of the PostgreSQL binaries used.
    pub fn bin_dir(&self) -> &Path {
        &self.bin_dir
    }

    /// The `psql` used by [`Postgres::psql`]: `WALPOST_PSQL` if set, else `psql` in
    /// [`Postgres::bin_dir`], else (server-only builds such as the npm
    /// `@embedded-postgres` packages) the highest `/usr/lib/postgresql/*/bin/psql`,
    /// else `psql` from `PATH`. An older psql talks to a newer server fine for what the
    /// harness does (plain SQL scripts).
    pub fn psql_path(&self) -> PathBuf {
        find_psql(&self.bin_dir)
    }

    /// Major server version, e.g. 15.
    pub fn major_version(&self) -> u32 {
        self.major
    }

    /// OS user the server runs as.
    pub fn os_user(&self) -> String {
        self.bootstrap_superuser()
    }

    /// With [`PgOptions::tls`]: directory with `ca.crt`, `server.crt`, `server.key`,
    /// `client.crt`, `client.key` (PEM).
    pub fn tls_dir(&self) -> Option<&Path> {
        self.tls_dir.as_deref()
    }

    /// Runs SQL with `psql -X -q -At -v ON_ERROR_STOP=1` as `walpost` (superuser) over
    /// the Unix socket against database `walpost`. The SQL is fed as a script (several
    /// statements allowed, each in its own transaction unless you write BEGIN/COMMIT;
    /// `CREATE DATABASE` works). Returns stdout trimmed: unaligned, tuples only, `|`
    /// between columns, one row per line. Err carries psql's stderr.
    pub fn psql(&self, sql: &str) -> Result<String> {
        self.psql_inner(ROLE, ROLE, PsqlInput::Sql(sql), &[])
    }

    /// Like [`Postgres::psql`], with psql variables: `(name, value)` is `-v name=value`,
    /// and the SQL writes `:'name'` where the value goes (psql quotes it with libpq's
    /// `PQescapeLiteral`; the harness never quotes a value itself).
    pub fn psql_with(&self, sql: &str, vars: &[(&str, &str)]) -> Result<String> {
        self.psql_inner(ROLE, ROLE, PsqlInput::Sql(sql), vars)
    }

    /// Like [`Postgres::psql`] against another database.
    pub fn psql_db(&self, db: &str, sql: &str) -> Result<String> {
        self.psql_inner(ROLE, db, PsqlInput::Sql(sql), &[])
    }

    /// Like [`Postgres::psql`] as another role (login via trust over the socket).
    pub fn psql_as(&self, user: &str, db: &str, sql: &str) -> Result<String> {
        self.psql_inner(user, db, PsqlInput::Sql(sql), &[])
    }

    /// Runs a SQL file with psql (`-f`), like [`Postgres::psql`].
    pub fn psql_file(&self, path: &Path) -> Result<String> {
        self.psql_inner(ROLE, ROLE, PsqlInput::File(path), &[])
    }

    fn psql_inner(&self, user: &str, db: &str, input: PsqlInput<'_>, vars: &[(&str, &str)]) -> Result<String> {
        let mut cmd = Command::new(self.psql_path());
        cmd.args(["-X", "-q", "-At", "-v", "ON_ERROR_STOP=1"]);
        for (name, value) in vars {
            cmd.arg("-v").arg(format!("{name}={value}"));
        }
        cmd.arg("-h")
            .arg(&self.dir)
            .arg("-p")
            .arg(self.port.to_string())
            .arg("-U")
            .arg(user)
            .arg("-d")
            .arg(db)
            .env("LC_ALL", "C")
            .env("PGCONNECT_TIMEOUT", "20")
            .env_remove("PGOPTIONS")
            .env_remove("PGSERVICE")
            .env_remove("PGSERVICEFILE")
            .env_remove("PGPASSFILE")
            .env_remove("PGSSLMODE")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let out = match input {
            PsqlInput::File(path) => {
                cmd.arg("-f").arg(path).stdin(Stdio::null());
                cmd.output()?
            }
            PsqlInput::Sql(sql) => {
                cmd.args(["-f", "-"]).stdin(Stdio::piped());
                let mut child = cmd.spawn().map_err(|e| err(format!("cannot run psql: {e}")))?;
                let mut stdin = child.stdin.take().ok_or_else(|| err("psql stdin"))?;
                let sql = sql.to_owned();
                let writer = std::thread::spawn(move || {
                    let _ = stdin.write_all(sql.as_bytes());
                    let _ = stdin.write_all(b"\n");
                });
                let out = child.wait_with_output()?;
                let _ = writer.join();
                out
            }
        };
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
        } else {
            Err(err(format!(
                "psql ({user}@{db}) failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            )))
        }
    }

    /// Creates database `name` (owner `walpost`) and returns its URL for `walpost`.
    pub fn create_database(&self, name: &str) -> Result<String> {
        self.psql(&format!("CREATE DATABASE {} OWNER {ROLE}", quote_ident(name)))?;
        Ok(self.url_for(ROLE, &self.password, name))
    }

    /// `pg_ctl stop -m MODE`, waiting for the shutdown to finish (up to 60 s).
    pub fn stop(&self, mode: StopMode) -> Result<()> {
        let mut cmd = self.pg_command("pg_ctl");
        cmd.arg("-D").arg(&self.data_dir).args(["-m", mode.arg(), "-w", "-t", "60", "stop"]);
        util::run(&mut cmd, "pg_ctl stop")?;
        Ok(())
    }

    /// Starts the (stopped) cluster again: same data directory and port; waits until it
    /// accepts connections (crash recovery included).
    pub fn start_again(&self) -> Result<()> {
        let mut cmd = self.pg_command("pg_ctl");
        cmd.arg("-D").arg(&self.data_dir).arg("-l").arg(self.log_path()).args(["-w", "-t", "120", "start"]);
        util::run(&mut cmd, "pg_ctl start")
            .map_err(|e| err(format!("{e}\n--- server log ---\n{}", self.log_tail(30))))?;
        Ok(())
    }

    /// [`Postgres::stop`] with `mode`, then [`Postgres::start_again`].
    pub fn restart(&self, mode: StopMode) -> Result<()> {
        self.stop(mode)?;
        self.start_again()
    }

    /// Whether the postmaster is running (`pg_ctl status`).
    pub fn is_running(&self) -> bool {
        let mut cmd = self.pg_command("pg_ctl");
        cmd.arg("-D").arg(&self.data_dir).arg("status");
        util::run(&mut cmd, "pg_ctl status").is_ok()
    }

    /// The server log (`pg_ctl -l`).
    pub fn log_path(&self) -> PathBuf {
        self.dir.join("postgres.log")
    }

    /// Last `n` lines of the server log.
    pub fn log_tail(&self, n: usize) -> String {
        util::tail_file(&self.log_path(), n)
    }

    /// A command for a PostgreSQL binary, run as the cluster's OS user.
    fn pg_command(&self, program: &str) -> Command {
        let exe = self.bin_dir.join(program);
        let mut cmd = match &self.os_user {
            Some(user) => {
                let mut c = Command::new(runuser());
                c.arg("-u").arg(user).arg("--").arg(exe);
                c
            }
            None => Command::new(exe),
        };
        cmd.current_dir(&self.dir).env("LC_ALL", "C").env_remove("PGOPTIONS");
        cmd
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        // Disarm the watchdog first so it does not race us.
        drop(self.watchdog.lock().unwrap_or_else(|e| e.into_inner()).take());
        if self.data_dir.join("postmaster.pid").exists() {
            let mut cmd = self.pg_command("pg_ctl");
            cmd.arg("-D").arg(&self.data_dir).args(["-m", "immediate", "-w", "-t", "30", "stop"]);
            let _ = util::run(&mut cmd, "pg_ctl stop");
        }
        util::remove_dir(&self.dir);
    }
}

enum PsqlInput<'a> {
    Sql(&'a str),
    File(&'a Path),
}

/// Appends settings (values single-quoted) under a `# ---- {title} ----` header.
fn append_conf(data_dir: &Path, title: &str, conf: &[(String, String)]) -> Result<()> {
    let mut text = format!("\n# ---- {title} ----\n");
    for (k, v) in conf {
        let _ = writeln!(text, "{k} = '{}'", v.replace('\'', "''"));
    }
    append(&data_dir.join("postgresql.conf"), &text)
}

fn append(path: &Path, text: &str) -> Result<()> {
    let mut f = fs::OpenOptions::new().append(true).open(path)?;
    f.write_all(text.as_bytes())?;
    Ok(())
}

fn quote_ident(s: &str) -> String {
    format!("\"{}\"", s.replace('"', "\"\""))
}

/// Percent-encodes everything but unreserved URL characters.
fn pct(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

fn runuser() -> PathBuf {
    for p in ["/usr/sbin/runuser", "/sbin/runuser", "/usr/bin/runuser"] {
        if Path::new(p).exists() {
            return PathBuf::from(p);
        }
    }
    PathBuf::from("runuser")
}

fn current_user_name() -> String {
    Command::new("id")
        .arg("-un")
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .filter(|s| !s.is_empty())
        .or_else(|| std::env::var("USER").ok())
        .unwrap_or_else(|| "postgres".to_string())
}

/// WALPOST_PG_BINDIR, else `pg_config --bindir` if it holds initdb, else the highest
/// /usr/lib/postgresql/*/bin.
fn find_bin_dir() -> Result<PathBuf> {
    static DIR: OnceLock<std::result::Result<PathBuf, String>> = OnceLock::new();
    DIR.get_or_init(|| {
        let has_initdb = |d: &Path| d.join("initdb").is_file() && d.join("pg_ctl").is_file();
        if let Some(d) = std::env::var_os("WALPOST_PG_BINDIR") {
            let d = PathBuf::from(d);
            return if has_initdb(&d) {
                Ok(d)
            } else {
                Err(format!("WALPOST_PG_BINDIR={} has no initdb/pg_ctl", d.display()))
            };
        }
        if let Ok(out) = Command::new("pg_config").arg("--bindir").stderr(Stdio::null()).output() {
            let d = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
            if out.status.success() && has_initdb(&d) {
                return Ok(d);
            }
        }
        let mut best: Option<(u32, PathBuf)> = None;
        if let Ok(entries) = fs::read_dir("/usr/lib/postgresql") {
            for e in entries.flatten() {
                let Ok(v) = e.file_name().to_string_lossy().parse::<u32>() else { continue };
                let d = e.path().join("bin");
                if has_initdb(&d) && best.as_ref().is_none_or(|(bv, _)| v > *bv) {
                    best = Some((v, d));
                }
            }
        }
        best.map(|(_, d)| d).ok_or_else(|| {
            "PostgreSQL server binaries not found (set WALPOST_PG_BINDIR or run scripts/setup-deps.sh)".to_string()
        })
    })
    .clone()
    .map_err(err)
}

/// See [`Postgres::psql_path`].
fn find_psql(bin_dir: &Path) -> PathBuf {
    if let Some(p) = std::env::var_os("WALPOST_PSQL").filter(|p| !p.is_empty()) {
        return PathBuf::from(p);
    }
    let own = bin_dir.join("psql");
    if own.is_file() {
        return own;
    }
    let mut best: Option<(u32, PathBuf)> = None;
    if let Ok(entries) = fs::read_dir("/usr/lib/postgresql") {
        for e in entries.flatten() {
            let Ok(v) = e.file_name().to_string_lossy().parse::<u32>() else {
                continue;
            };
            let p = e.path().join("bin/psql");
            if p.is_file() && best.as_ref().is_none_or(|(bv, _)| v > *bv) {
                best = Some((v, p));
            }
        }
    }
    best.map(|(_, p)| p).unwrap_or_else(|| PathBuf::from("psql"))
}

/// The ordinary OS user that runs clusters when we are root; created if missing.
fn os_user_for_root() -> Result<String> {
    static USER: OnceLock<std::result::Result<String, String>> = OnceLock::new();
    USER.get_or_init(|| {
        let wanted = match std::env::var("WALPOST_PG_OS_USER") {
            Ok(u) if !u.is_empty() => u,
            _ if util::user_ids("postgres").is_some() => "postgres".to_string(),
            _ => "walpost-pg".to_string(),
        };
        if util::user_ids(&wanted).is_some() {
            return Ok(wanted);
        }
        let mut cmd = Command::new("useradd");
        cmd.args(["--system", "--user-group", "--no-create-home", "--home-dir", "/nonexistent"])
            .args(["--shell", "/usr/sbin/nologin"])
            .arg(&wanted);
        let res = util::run(&mut cmd, "useradd");
        // Another test process may have created it concurrently.
        if util::user_ids(&wanted).is_some() {
            eprintln!("testkit: created OS user {wanted} for PostgreSQL test clusters");
            Ok(wanted)
        } else {
            Err(format!(
                "running as root and no OS user for PostgreSQL ({wanted}) could be created: {}",
                res.err().map(|e| e.to_string()).unwrap_or_default()
            ))
        }
    })
    .clone()
    .map_err(err)
}

/// Throwaway CA + server cert (127.0.0.1, localhost) + client cert (CN=walpost).
pub fn make_tls_files(dir: &Path) -> Result<()> {
    fs::create_dir_all(dir)?;
    let openssl = |args: &[&str], what: &str| -> Result<()> {
        let mut cmd = Command::new("openssl");
        cmd.args(args).current_dir(dir);
        util::run(&mut cmd, what).map(|_| ())
    };
    let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"];
    openssl(
        &[
            &["req", "-x509"],
            &ec[..],
            &["-days", "3650", "-subj", "/CN=walpost-test-ca", "-keyout", "ca.key", "-out", "ca.crt"],
        ]
        .concat(),
        "openssl (CA)",
    )?;
    fs::write(
        dir.join("server.ext"),
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n",
    )?;
    fs::write(
        dir.join("client.ext"),
        "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=clientAuth\n",
    )?;
    for (name, cn) in [("server", "127.0.0.1"), ("client", ROLE)] {
        let subj = format!("/CN={cn}");
        let key = format!("{name}.key");
        let csr = format!("{name}.csr");
        let crt = format!("{name}.crt");
        let ext = format!("{name}.ext");
        openssl(&[&["req"], &ec[..], &["-subj", &subj, "-keyout", &key, "-out", &csr]].concat(), "openssl (csr)")?;
        openssl(
            &[
                "x509",
                "-req",
                "-in",
                &csr,
                "-CA",
                "ca.crt",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-days",
                "3650",
                "-out",
                &crt,
                "-extfile",
                &ext,
            ],
            "openssl (sign)",
        )?;
    }
    use std::os::unix::fs::PermissionsExt as _;
    for key in ["ca.key", "server.key", "client.key"] {
        fs::set_permissions(dir.join(key), fs::Permissions::from_mode(0o600))?;
    }
    Ok(())
}

/// The directory of PostgreSQL `major`'s server binaries, for [`PgOptions::bin_dir`]:
/// the default one (`WALPOST_PG_BINDIR`, ...) if it is that major, else Debian's
/// `/usr/lib/postgresql/MAJOR/bin`, else the npm build installed (downloaded once, then
/// cached) by `scripts/fetch-postgres.sh MAJOR`.
pub fn pg_bin_dir_for_major(major: u32) -> Result<PathBuf> {
    let has_initdb = |d: &Path| d.join("initdb").is_file() && d.join("pg_ctl").is_file();
    if let Ok(d) = find_bin_dir() {
        if bin_major(&d) == Some(major) {
            return Ok(d);
        }
    }
    let debian = PathBuf::from(format!("/usr/lib/postgresql/{major}/bin"));
    if has_initdb(&debian) {
        return Ok(debian);
    }
    static FETCH: Mutex<()> = Mutex::new(());
    let _guard = FETCH.lock().unwrap_or_else(|e| e.into_inner());
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/fetch-postgres.sh");
    let mut cmd = Command::new("bash");
    cmd.arg(&script).arg(major.to_string());
    let out = util::run(&mut cmd, "scripts/fetch-postgres.sh")?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let dir = PathBuf::from(stdout.lines().last().unwrap_or_default().trim());
    if has_initdb(&dir) && bin_major(&dir) == Some(major) {
        Ok(dir)
    } else {
        Err(err(format!(
            "{} {major} gave {}, which is not a PostgreSQL {major} bin directory",
            script.display(),
            dir.display()
        )))
    }
}

/// The server bin directory [`Postgres::start`] uses without [`PgOptions::bin_dir`]
/// (`WALPOST_PG_BINDIR`, else `pg_config --bindir`, else the highest
/// `/usr/lib/postgresql/*/bin`).
pub fn pg_default_bin_dir() -> Result<PathBuf> {
    find_bin_dir()
}

/// Major version of the PostgreSQL server in bin directory `dir` (`postgres --version`).
pub fn pg_bin_major(dir: &Path) -> Option<u32> {
    bin_major(dir)
}

/// Major version of `DIR/postgres --version` ("postgres (PostgreSQL) 17.10").
fn bin_major(dir: &Path) -> Option<u32> {
    let out = Command::new(dir.join("postgres")).arg("--version").stdin(Stdio::null()).output().ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let version = text.rsplit(' ').next()?.trim();
    version.split(['.', 'b', 'r']).next()?.parse().ok()
}
