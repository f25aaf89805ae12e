//! Physical streaming standbys of a [`Postgres`] cluster, promotion, and (PostgreSQL
//! 17+) failover-slot synchronization.
//!
//! The base copy is taken with the low-level backup API over psql — no `pg_basebackup`
//! needed, which the npm server builds lack — while the primary keeps running:
//! `pg_backup_start` (14: `pg_start_backup(..., exclusive => false)`), a file copy of the
//! data directory done by this process, then `pg_backup_stop` in the same session, whose
//! label file becomes the standby's `backup_label`.

use std::fs;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::{append_conf, Postgres, StandbyLink, ROLE};
use crate::util::{self, err};
use crate::Result;

/// How long the standby helpers wait (streaming started, replay, promotion, slot sync).
pub const STANDBY_TIMEOUT: Duration = Duration::from_secs(60);

/// Options for [`Postgres::start_standby`].
#[derive(Debug, Clone, Default)]
pub struct StandbyOptions {
    /// Name of the physical replication slot created on the primary for this standby
    /// (`primary_slot_name`); `None`: a [`crate::unique_name`] with prefix `standby`.
    pub slot_name: Option<String>,
    /// Extra `postgresql.conf` settings of the standby, written last.
    pub extra_conf: Vec<(String, String)>,
    /// PostgreSQL 17+: do **not** set up failover-slot synchronization (by default the
    /// standby gets `sync_replication_slots = on` and the primary lists the standby's
    /// slot in `synchronized_standby_slots`). Ignored before 17.
    pub no_slot_sync: bool,
}

/// Files at the top of the data directory that a base backup leaves out.
const SKIP_TOP_FILES: &[&str] = &[
    "postmaster.pid",
    "postmaster.opts",
    "backup_label",
    "backup_label.old",
    "tablespace_map",
    "tablespace_map.old",
    "current_logfiles",
    "standby.signal",
    "recovery.signal",
];
/// Directories at the top of the data directory copied empty (their contents are
/// runtime state or come from the primary by streaming).
const EMPTY_TOP_DIRS: &[&str] =
    &["pg_wal", "pg_replslot", "pg_dynshmem", "pg_notify", "pg_serial", "pg_snapshots", "pg_stat_tmp", "pg_subtrans"];

impl Postgres {
    /// Creates a hot standby of `primary` and starts it; the standby is a [`Postgres`]
    /// of its own (same binaries, OS user, superuser password and `pg_hba.conf`; its own
    /// directory and port; [`Postgres::psql`] works, read-only).
    ///
    /// Steps: a physical slot is created on the primary with WAL reserved at once; a
    /// base copy is taken with the low-level backup API while the primary runs (see the
    /// module docs; `postmaster.pid`, WAL, slots and other runtime state are left out,
    /// and `synchronized_standby_slots` is removed from the copied
    /// `postgresql.auto.conf`); the standby gets `standby.signal` and
    /// `primary_conninfo = 'host=127.0.0.1 port=PRIMARY user=walpost password=...
    /// dbname=walpost application_name=SLOT'`, `primary_slot_name = SLOT`,
    /// `hot_standby = on`, `hot_standby_feedback = on`, `wal_level = logical`; on 17+
    /// also `sync_replication_slots = on`, and the primary's `synchronized_standby_slots`
    /// gets SLOT added (`ALTER SYSTEM` + reload) — unless
    /// [`StandbyOptions::no_slot_sync`]. With TLS on the primary, its `tls/` files are
    /// copied too.
    ///
    /// Returns once the standby accepts connections, its WAL receiver is `streaming`,
    /// and it has replayed the primary's flush position of that moment. Measured:
    /// ~1.5-3 s on the shared 2-core machine (a fresh cluster's data directory is ~40 MB).
    ///
    /// Drop the standby before its primary, then call [`Postgres::drop_standby_slot`] on
    /// a primary that lives on (an abandoned slot pins WAL, and on 17+ a slot listed in
    /// `synchronized_standby_slots` holds back logical decoding of failover slots).
    pub fn start_standby(primary: &Postgres, opts: StandbyOptions) -> Result<Postgres> {
        let t0 = Instant::now();
        let slot = opts.slot_name.clone().unwrap_or_else(|| util::unique_name("standby"));
        primary.psql_with("SELECT pg_create_physical_replication_slot(:'slot', true)", &[("slot", &slot)])?;
        let dir = util::make_temp_dir("pg-standby")?;
        let mut sb = Postgres {
            data_dir: dir.join("data"),
            dir,
            bin_dir: primary.bin_dir.clone(),
            os_user: primary.os_user.clone(),
            port: 0,
            major: primary.major,
            password: primary.password.clone(),
            tls_dir: None,
            watchdog: Mutex::new(None),
            standby_of: Some(StandbyLink { primary_port: primary.port, slot: slot.clone() }),
        };
        // From here on, Drop cleans up on error.
        let owner = sb.arm()?;
        let label = primary.base_backup(&sb.data_dir, &sb.dir)?;
        let copy_ms = t0.elapsed().as_millis();
        fs::write(sb.data_dir.join("backup_label"), label)?;
        fs::write(sb.data_dir.join("standby.signal"), "")?;
        strip_auto_conf(&sb.data_dir, "synchronized_standby_slots")?;

        let conninfo = format!(
            "host=127.0.0.1 port={} user={ROLE} password={} dbname={ROLE} application_name={}",
            primary.port,
            conninfo_quote(&primary.password),
            conninfo_quote(&slot)
        );
        let sync = primary.major >= 17 && !opts.no_slot_sync;
        let mut conf: Vec<(String, String)> = vec![
            ("unix_socket_directories".into(), sb.dir.to_string_lossy().into_owned()),
            ("primary_conninfo".into(), conninfo),
            ("primary_slot_name".into(), slot.clone()),
            ("hot_standby".into(), "on".into()),
            ("hot_standby_feedback".into(), "on".into()),
            ("wal_level".into(), "logical".into()),
        ];
        if sync {
            conf.push(("sync_replication_slots".into(), "on".into()));
        }
        if let Some(ptls) = &primary.tls_dir {
            let tls = sb.dir.join("tls");
            copy_tree(ptls, &tls, &|_, _| true)?;
            let p = |f: &str| tls.join(f).to_string_lossy().into_owned();
            conf.push(("ssl_cert_file".into(), p("server.crt")));
            conf.push(("ssl_key_file".into(), p("server.key")));
            conf.push(("ssl_ca_file".into(), p("ca.crt")));
            sb.tls_dir = Some(tls);
        }
        conf.extend(opts.extra_conf.iter().cloned());
        append_conf(&sb.data_dir, "testkit standby", &conf)?;
        if let Some((uid, gid)) = owner {
            util::chown_recursive(&sb.dir, uid, gid)?;
        }
        sb.start_with_port_retries()?;
        sb.wait_sql("SELECT status FROM pg_stat_wal_receiver", &[], "streaming", "WAL receiver streaming")?;
        if sync {
            primary.add_synchronized_standby_slot(&slot)?;
        }
        sb.wait_caught_up(primary)?;
        eprintln!(
            "testkit: PostgreSQL {} standby of :{} on 127.0.0.1:{} (slot {slot}) streaming in {} ms (base copy {} ms) — {}",
            sb.major,
            primary.port,
            sb.port,
            t0.elapsed().as_millis(),
            copy_ms,
            sb.dir.display()
        );
        Ok(sb)
    }

    /// Copies this (running) cluster's data directory to `dest` between
    /// `pg_backup_start` and `pg_backup_stop` of one psql session; returns the backup
    /// label. `sync_dir` holds the two files that pace the psql script.
    fn base_backup(&self, dest: &Path, sync_dir: &Path) -> Result<String> {
        let started = sync_dir.join(".backup-started");
        let copied = sync_dir.join(".backup-copied");
        let (start, stop) = if self.major >= 15 {
            ("SELECT pg_backup_start('testkit standby', true);", "pg_backup_stop(false)")
        } else {
            ("SELECT pg_start_backup('testkit standby', true, false);", "pg_stop_backup(false, false)")
        };
        let script = format!(
            "{start}\n\\! touch {s} && while [ ! -e {c} ]; do sleep 0.02; done\n\
             SELECT encode(convert_to(labelfile, 'UTF8'), 'hex') FROM {stop};\n",
            s = sh_quote(&started),
            c = sh_quote(&copied),
        );
        let (copy_result, psql_result) = std::thread::scope(|scope| {
            let psql = scope.spawn(|| self.psql(&script));
            let deadline = Instant::now() + STANDBY_TIMEOUT;
            let copy_result = loop {
                if started.exists() {
                    break copy_data_dir(&self.data_dir, dest);
                }
                if psql.is_finished() {
                    break Err(err("pg_backup_start failed"));
                }
                if Instant::now() >= deadline {
                    break Err(err(format!("pg_backup_start did not return within {STANDBY_TIMEOUT:?}")));
                }
                std::thread::sleep(Duration::from_millis(20));
            };
            // Always let the script go on, so the backup is stopped.
            let _ = fs::write(&copied, "");
            let psql_result = psql.join().unwrap_or_else(|_| Err(err("psql thread panicked")));
            (copy_result, psql_result)
        });
        let _ = fs::remove_file(&started);
        let _ = fs::remove_file(&copied);
        let out = psql_result.map_err(|e| err(format!("base backup: {e}")))?;
        copy_result.map_err(|e| err(format!("base backup: copying {}: {e}", self.data_dir.display())))?;
        let hex = out.lines().last().unwrap_or_default().trim();
        let label = decode_hex(hex).ok_or_else(|| err(format!("base backup: unexpected psql output {out:?}")))?;
        if !label.contains("START WAL LOCATION") {
            return Err(err(format!("base backup: not a backup label: {label:?}")));
        }
        Ok(label)
    }

    /// Adds `slot` to `synchronized_standby_slots` (17+) and reloads.
    fn add_synchronized_standby_slot(&self, slot: &str) -> Result<()> {
        let current = self.psql("SHOW synchronized_standby_slots")?;
        let mut slots: Vec<&str> = current.split(',').map(str::trim).filter(|s| !s.is_empty()).collect();
        if !slots.contains(&slot) {
            slots.push(slot);
        }
        self.psql_with(
            "ALTER SYSTEM SET synchronized_standby_slots = :'slots';\nSELECT pg_reload_conf();",
            &[("slots", &slots.join(","))],
        )?;
        self.wait_sql(
            "SELECT :'slot' = ANY(string_to_array(current_setting('synchronized_standby_slots'), ','))",
            &[("slot", slot)],
            "t",
            "synchronized_standby_slots reloaded",
        )
    }

    /// On a primary: forgets a standby created by [`Postgres::start_standby`] that is
    /// gone (dropped or stopped): removes its slot from `synchronized_standby_slots`
    /// (17+, reloads) and drops the physical slot. Err if the slot is still in use.
    pub fn drop_standby_slot(&self, slot: &str) -> Result<()> {
        if self.major >= 17 {
            let current = self.psql("SHOW synchronized_standby_slots")?;
            let rest: Vec<&str> = current.split(',').map(str::trim).filter(|s| !s.is_empty() && *s != slot).collect();
            let set = if rest.is_empty() {
                "ALTER SYSTEM RESET synchronized_standby_slots;"
            } else {
                "ALTER SYSTEM SET synchronized_standby_slots = :'slots';"
            };
            self.psql_with(&format!("{set}\nSELECT pg_reload_conf();"), &[("slots", &rest.join(","))])?;
        }
        // The walsender may take a moment to notice a standby that just went away.
        self.wait_sql(
            "SELECT count(*) FROM pg_replication_slots WHERE slot_name = :'slot' AND active",
            &[("slot", slot)],
            "0",
            "standby slot inactive",
        )?;
        self.psql_with("SELECT pg_drop_replication_slot(:'slot')", &[("slot", slot)])?;
        Ok(())
    }

    /// The physical slot on the primary this cluster streams through, if it was
    /// created by [`Postgres::start_standby`] (kept after [`Postgres::promote`]).
    pub fn primary_slot_name(&self) -> Option<&str> {
        self.standby_of.as_ref().map(|l| l.slot.as_str())
    }

    /// Port of the primary this cluster was created as a standby of.
    pub fn primary_port(&self) -> Option<u16> {
        self.standby_of.as_ref().map(|l| l.primary_port)
    }

    /// `SELECT pg_is_in_recovery()`: true on a standby (until promoted).
    pub fn is_in_recovery(&self) -> Result<bool> {
        Ok(self.psql("SELECT pg_is_in_recovery()")? == "t")
    }

    /// On a standby: waits (up to [`STANDBY_TIMEOUT`]) until `pg_last_wal_replay_lsn()`
    /// is at least `lsn` (text form, e.g. `0/3000148`).
    pub fn wait_for_replay(&self, lsn: &str) -> Result<()> {
        self.wait_sql(
            "SELECT pg_last_wal_replay_lsn() >= :'lsn'::pg_lsn",
            &[("lsn", lsn)],
            "t",
            &format!("replay up to {lsn}"),
        )
    }

    /// On a standby: takes `pg_current_wal_flush_lsn()` on `primary` and waits until it
    /// is replayed here ([`Postgres::wait_for_replay`]); returns that LSN. Everything
    /// committed on the primary before the call is then visible on the standby.
    pub fn wait_caught_up(&self, primary: &Postgres) -> Result<String> {
        let lsn = primary.psql("SELECT pg_current_wal_flush_lsn()")?;
        self.wait_for_replay(&lsn)?;
        Ok(lsn)
    }

    /// Promotes a standby (`pg_ctl promote -w`) and waits (up to [`STANDBY_TIMEOUT`])
    /// until `pg_is_in_recovery()` is false. The new primary keeps this port. Synced
    /// failover slots (17+) stay, still showing `synced = true` — PostgreSQL's doc: the
    /// column "has no meaning on the primary" —, and can be used for logical decoding.
    pub fn promote(&self) -> Result<()> {
        let t0 = Instant::now();
        let mut cmd = self.pg_command("pg_ctl");
        cmd.arg("-D").arg(&self.data_dir).args(["-w", "-t", "60", "promote"]);
        util::run(&mut cmd, "pg_ctl promote")
            .map_err(|e| err(format!("{e}\n--- server log ---\n{}", self.log_tail(30))))?;
        self.wait_sql("SELECT pg_is_in_recovery()", &[], "f", "end of recovery")?;
        eprintln!("testkit: PostgreSQL on 127.0.0.1:{} promoted in {} ms", self.port, t0.elapsed().as_millis());
        Ok(())
    }

    /// PostgreSQL 17+, on a standby: whether logical slot `name` exists here as a
    /// synchronized failover slot ready for use after a promotion (`synced` and not
    /// `temporary` in `pg_replication_slots`; a slot still being created by the sync
    /// worker is temporary). Err before 17.
    pub fn slot_synced(&self, name: &str) -> Result<bool> {
        if self.major < 17 {
            return Err(err(format!("slot_synced needs PostgreSQL 17+ (this is {})", self.major)));
        }
        let out = self.psql_with(
            "SELECT count(*) FROM pg_replication_slots WHERE slot_name = :'name' AND synced AND NOT temporary",
            &[("name", name)],
        )?;
        Ok(out == "1")
    }

    /// PostgreSQL 17+, on a standby: waits (up to [`STANDBY_TIMEOUT`]) until logical
    /// slot `name` is synced here ([`Postgres::slot_synced`]) **and** has reached the
    /// `confirmed_flush_lsn` the slot has on `primary` at the time of the call; returns
    /// that LSN. (`synced = true` alone may describe an older state of the primary's
    /// slot: the worker copies the slot's position each time it runs, so a promotion
    /// right after a consume replays changes from the older position — observed.)
    ///
    /// The standby's sync worker persists a new slot only once the primary slot's
    /// `restart_lsn` and `catalog_xmin` have moved past what the standby reserved (until
    /// then its log says "could not synchronize replication slot ... Synchronization
    /// could lead to data loss"). A fresh slot on an idle primary does not move by
    /// itself: on the primary, call [`Postgres::log_standby_snapshot`] and then consume
    /// the slot (`pg_logical_slot_get_changes`, or a client confirming) — see the
    /// failover test in `tests/pg_standby.rs`. A slot whose `restart_lsn` precedes the
    /// standby's base copy cannot be synced either until it moves past the copy's start.
    /// The worker naps between 200 ms and 30 s, doubling while nothing changes; while
    /// waiting, this calls `pg_reload_conf()` on the standby every 0.5 s, which wakes
    /// the worker for a sync cycle.
    pub fn wait_slot_synced(&self, name: &str, primary: &Postgres) -> Result<String> {
        let target = primary.psql_with(
            "SELECT confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = :'name' AND slot_type = 'logical'",
            &[("name", name)],
        )?;
        if target.is_empty() {
            return Err(err(format!("no logical slot {name} on the primary")));
        }
        if self.major < 17 {
            return Err(err(format!("slot synchronization needs PostgreSQL 17+ (this is {})", self.major)));
        }
        let sql = "SELECT count(*) FROM pg_replication_slots WHERE slot_name = :'name' AND synced AND NOT temporary \
                   AND confirmed_flush_lsn >= :'target'::pg_lsn";
        let vars = [("name", name), ("target", target.as_str())];
        let deadline = Instant::now() + STANDBY_TIMEOUT;
        let mut polls = 0u32;
        loop {
            if self.psql_with(sql, &vars)? == "1" {
                return Ok(target);
            }
            polls += 1;
            if polls % 5 == 0 {
                // A reload (SIGHUP) sets the sync worker's latch: it wakes from its nap
                // (which doubles up to 30 s while nothing changes) and syncs at once.
                let _ = self.psql("SELECT pg_reload_conf()");
            }
            if Instant::now() >= deadline {
                let slots = self
                    .psql("SELECT slot_name, slot_type, synced, temporary, restart_lsn, confirmed_flush_lsn FROM pg_replication_slots")
                    .unwrap_or_default();
                return Err(err(format!(
                    "slot {name} not synced up to {target} within {STANDBY_TIMEOUT:?}; standby slots:\n{slots}\n--- standby log ---\n{}",
                    self.log_tail(20)
                )));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// PostgreSQL 16+, on a primary: `SELECT pg_log_standby_snapshot()` (writes a
    /// running-xacts WAL record), then waits until that record is flushed — the
    /// function does not flush, and logical decoding (`pg_logical_slot_get_changes`,
    /// walsenders) only reads flushed WAL. Decoding that record is what moves a logical
    /// slot's `restart_lsn` and `catalog_xmin` forward (see
    /// [`Postgres::wait_slot_synced`]). Returns the LSN just past the record.
    pub fn log_standby_snapshot(&self) -> Result<String> {
        let lsn = self.psql("SELECT pg_log_standby_snapshot()")?;
        self.wait_sql(
            "SELECT pg_current_wal_flush_lsn() >= :'lsn'::pg_lsn",
            &[("lsn", &lsn)],
            "t",
            "flush of the standby snapshot record",
        )?;
        Ok(lsn)
    }

    /// Polls `sql` (every 50 ms, up to [`STANDBY_TIMEOUT`]) until it prints `want`.
    /// Polls `sql` (with psql variables `vars`) until it prints `want`.
    fn wait_sql(&self, sql: &str, vars: &[(&str, &str)], want: &str, what: &str) -> Result<()> {
        let deadline = Instant::now() + STANDBY_TIMEOUT;
        loop {
            let got = self.psql_with(sql, vars);
            if got.as_deref().is_ok_and(|g| g == want) {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(err(format!(
                    "127.0.0.1:{}: no {what} within {STANDBY_TIMEOUT:?} ({sql} -> {got:?}); log tail:\n{}",
                    self.port,
                    self.log_tail(20)
                )));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// Copies a data directory for a base backup (see [`SKIP_TOP_FILES`],
/// [`EMPTY_TOP_DIRS`]; subdirectories of `pg_wal` such as `archive_status` are kept,
/// empty); files that vanish while copying are skipped, as are `pg_internal.init` and
/// `pgsql_tmp*`.
fn copy_data_dir(src: &Path, dst: &Path) -> Result<()> {
    let keep = |rel: &Path, is_dir: bool| -> bool {
        let mut parts = rel.iter().map(|c| c.to_string_lossy());
        let Some(top) = parts.next() else { return true };
        let name = rel.file_name().map(|n| n.to_string_lossy()).unwrap_or_default();
        if name == "pg_internal.init" || name.starts_with("pgsql_tmp") {
            return false;
        }
        let depth = rel.iter().count();
        if depth == 1 {
            return is_dir || !SKIP_TOP_FILES.contains(&&*top);
        }
        if EMPTY_TOP_DIRS.contains(&&*top) {
            // Only pg_wal's directories (archive_status, summaries), never files.
            return top == "pg_wal" && is_dir && depth == 2;
        }
        true
    };
    copy_tree(src, dst, &keep)
}

/// Recursive copy keeping modes and symlinks; `keep(relative path, is_dir)` filters.
fn copy_tree(src: &Path, dst: &Path, keep: &dyn Fn(&Path, bool) -> bool) -> Result<()> {
    fn walk(root: &Path, rel: &Path, dst_root: &Path, keep: &dyn Fn(&Path, bool) -> bool) -> Result<()> {
        let from_dir = root.join(rel);
        let to_dir = dst_root.join(rel);
        fs::create_dir(&to_dir).map_err(|e| err(format!("mkdir {}: {e}", to_dir.display())))?;
        fs::set_permissions(&to_dir, fs::metadata(&from_dir)?.permissions())?;
        for entry in fs::read_dir(&from_dir)? {
            let entry = match entry {
                Ok(e) => e,
                Err(e) if e.kind() == ErrorKind::NotFound => continue,
                Err(e) => return Err(e.into()),
            };
            let rel_child: PathBuf = rel.join(entry.file_name());
            let ft = match entry.file_type() {
                Ok(t) => t,
                Err(e) if e.kind() == ErrorKind::NotFound => continue,
                Err(e) => return Err(e.into()),
            };
            if !keep(&rel_child, ft.is_dir()) {
                continue;
            }
            let to = dst_root.join(&rel_child);
            if ft.is_dir() {
                walk(root, &rel_child, dst_root, keep)?;
            } else if ft.is_symlink() {
                std::os::unix::fs::symlink(fs::read_link(entry.path())?, &to)?;
            } else {
                match fs::copy(entry.path(), &to) {
                    Ok(_) => {}
                    Err(e) if e.kind() == ErrorKind::NotFound => {}
                    Err(e) => return Err(err(format!("copy {}: {e}", entry.path().display()))),
                }
            }
        }
        Ok(())
    }
    walk(src, Path::new(""), dst, keep)
}

/// Drops `key = ...` lines from `postgresql.auto.conf` (if any).
fn strip_auto_conf(data_dir: &Path, key: &str) -> Result<()> {
    let path = data_dir.join("postgresql.auto.conf");
    let Ok(text) = fs::read_to_string(&path) else {
        return Ok(());
    };
    let kept: Vec<&str> = text
        .lines()
        .filter(|l| {
            let t = l.trim_start();
            !(t.starts_with(key) && t[key.len()..].trim_start().starts_with('='))
        })
        .collect();
    fs::write(&path, kept.join("\n") + "\n")?;
    Ok(())
}

/// A libpq conninfo value, single-quoted.
fn conninfo_quote(v: &str) -> String {
    format!("'{}'", v.replace('\\', "\\\\").replace('\'', "\\'"))
}

/// A path as one single-quoted `sh` word.
fn sh_quote(p: &Path) -> String {
    format!("'{}'", p.to_string_lossy().replace('\'', "'\\''"))
}

fn decode_hex(s: &str) -> Option<String> {
    if s.len() % 2 != 0 {
        return None;
    }
    let bytes: Option<Vec<u8>> =
        (0..s.len()).step_by(2).map(|i| s.get(i..i + 2).and_then(|h| u8::from_str_radix(h, 16).ok())).collect();
    String::from_utf8(bytes?).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn helpers() {
        assert_eq!(decode_hex("41420a").as_deref(), Some("AB\n"));
        assert_eq!(decode_hex("4"), None);
        assert_eq!(conninfo_quote(r"a'b\c"), r"'a\'b\\c'");
        assert_eq!(sh_quote(Path::new("/t/it's")), r"'/t/it'\''s'");
    }

    #[test]
    fn copy_skips_runtime_state() {
        let src = util::make_temp_dir("copytest-src").expect("dir");
        for d in ["base/1", "pg_wal/archive_status", "pg_replslot/s", "global"] {
            fs::create_dir_all(src.join(d)).expect("mkdir");
        }
        for f in
            ["postmaster.pid", "PG_VERSION", "base/1/123", "pg_wal/000000010000000000000001", "pg_replslot/s/state"]
        {
            fs::write(src.join(f), "x").expect("write");
        }
        let dst = src.with_extension("copy");
        copy_data_dir(&src, &dst).expect("copy");
        assert!(dst.join("PG_VERSION").is_file() && dst.join("base/1/123").is_file());
        assert!(dst.join("pg_wal/archive_status").is_dir() && dst.join("pg_replslot").is_dir());
        assert!(!dst.join("postmaster.pid").exists());
        assert!(!dst.join("pg_wal/000000010000000000000001").exists());
        assert!(!dst.join("pg_replslot/s").exists());
        let _ = fs::remove_dir_all(&src);
        let _ = fs::remove_dir_all(&dst);
    }
}
