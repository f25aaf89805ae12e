//! Small process / file-system helpers shared by the PostgreSQL and Kafka harnesses.

use std::collections::HashSet;
use std::fmt::Write as _;
use std::fs;
use std::io::{Read, Seek, SeekFrom};
use std::net::{Ipv4Addr, TcpListener};
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Output, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::{Error, Result};

pub(crate) fn err(msg: impl Into<String>) -> Error {
    msg.into().into()
}

/// Whether the current process runs with effective uid 0.
pub(crate) fn is_root() -> bool {
    static ROOT: OnceLock<bool> = OnceLock::new();
    *ROOT.get_or_init(|| {
        if let Ok(status) = fs::read_to_string("/proc/self/status") {
            for line in status.lines() {
                if let Some(rest) = line.strip_prefix("Uid:") {
                    // real, effective, saved, fs
                    if let Some(euid) = rest.split_whitespace().nth(1) {
                        return euid == "0";
                    }
                }
            }
        }
        Command::new("id").arg("-u").output().map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0").unwrap_or(false)
    })
}

pub(crate) fn keep_dirs() -> bool {
    std::env::var_os("WALPOST_KEEP_TEST_DIRS").is_some()
}

static COUNTER: AtomicU64 = AtomicU64::new(0);

/// A name unique within this machine for practical purposes: `{prefix}_{pid}_{n}`, made of
/// lower-case ASCII letters, digits and `_` if `prefix` is (a valid unquoted SQL
/// identifier, replication slot name and Kafka topic name).
pub fn unique_name(prefix: &str) -> String {
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("{prefix}_{}_{n}", std::process::id())
}

/// Creates a fresh directory `$TMPDIR/walpost-{kind}-{pid}-{n}`.
pub(crate) fn make_temp_dir(kind: &str) -> Result<PathBuf> {
    let base = std::env::temp_dir();
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.subsec_nanos()).unwrap_or(0);
    for _ in 0..1000 {
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let dir = base.join(format!("walpost-{kind}-{}-{n}-{:x}", std::process::id(), nanos & 0xffff));
        match fs::create_dir(&dir) {
            Ok(()) => return Ok(dir),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(err(format!("cannot create temp dir {}: {e}", dir.display()))),
        }
    }
    Err(err(format!("cannot create a temp dir under {}", base.display())))
}

pub(crate) fn remove_dir(dir: &Path) {
    if keep_dirs() {
        eprintln!("testkit: keeping {} (WALPOST_KEEP_TEST_DIRS)", dir.display());
    } else {
        let _ = fs::remove_dir_all(dir);
    }
}

/// A TCP port on 127.0.0.1 that was free a moment ago (bind to port 0, read, close).
/// Never returns the same port twice within one process. Another process may still grab
/// it before the server binds it; the harness retries with a new port when that happens.
pub fn free_port() -> u16 {
    static HANDED_OUT: Mutex<Option<HashSet<u16>>> = Mutex::new(None);
    let mut guard = HANDED_OUT.lock().unwrap_or_else(|e| e.into_inner());
    let handed_out = guard.get_or_insert_with(HashSet::new);
    for _ in 0..1000 {
        let port = match TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).and_then(|l| l.local_addr()) {
            Ok(addr) => addr.port(),
            Err(e) => panic!("testkit: cannot bind 127.0.0.1:0: {e}"),
        };
        if handed_out.insert(port) {
            return port;
        }
    }
    panic!("testkit: no free port found")
}

/// Runs a command to completion, capturing output; Err (with both streams) unless it
/// exits 0.
pub(crate) fn run(cmd: &mut Command, what: &str) -> Result<Output> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|e| err(format!("{what}: cannot run {:?}: {e}", cmd.get_program())))?;
    if out.status.success() {
        Ok(out)
    } else {
        Err(err(format!(
            "{what} failed ({}):\n--- stdout ---\n{}\n--- stderr ---\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout).trim_end(),
            String::from_utf8_lossy(&out.stderr).trim_end()
        )))
    }
}

pub(crate) fn file_len(path: &Path) -> u64 {
    fs::metadata(path).map(|m| m.len()).unwrap_or(0)
}

/// The contents of `path` from byte `offset` on (lossy UTF-8); empty if unreadable.
pub(crate) fn read_from(path: &Path, offset: u64) -> String {
    let mut s = Vec::new();
    if let Ok(mut f) = fs::File::open(path) {
        if f.seek(SeekFrom::Start(offset)).is_ok() {
            let _ = f.read_to_end(&mut s);
        }
    }
    String::from_utf8_lossy(&s).into_owned()
}

/// The last `n` lines of a text file (reads at most the last 1 MiB).
pub(crate) fn tail_file(path: &Path, n: usize) -> String {
    let len = file_len(path);
    let text = read_from(path, len.saturating_sub(1 << 20));
    let lines: Vec<&str> = text.lines().collect();
    let start = lines.len().saturating_sub(n);
    let mut out = String::new();
    for l in &lines[start..] {
        let _ = writeln!(out, "{l}");
    }
    out
}

/// uid and gid of an OS user, or None if it does not exist.
pub(crate) fn user_ids(user: &str) -> Option<(u32, u32)> {
    let q = |flag: &str| -> Option<u32> {
        let out = Command::new("id").arg(flag).arg(user).stderr(Stdio::null()).output().ok()?;
        if !out.status.success() {
            return None;
        }
        String::from_utf8_lossy(&out.stdout).trim().parse().ok()
    };
    Some((q("-u")?, q("-g")?))
}

pub(crate) fn chown_recursive(path: &Path, uid: u32, gid: u32) -> Result<()> {
    std::os::unix::fs::lchown(path, Some(uid), Some(gid)).map_err(|e| err(format!("chown {}: {e}", path.display())))?;
    if fs::symlink_metadata(path)?.is_dir() {
        for entry in fs::read_dir(path)? {
            chown_recursive(&entry?.path(), uid, gid)?;
        }
    }
    Ok(())
}

/// Sends a signal by name (`TERM`, `QUIT`, `KILL`, ...) with kill(1); std has no portable
/// non-KILL signal API and `unsafe` (libc) is not allowed in this workspace.
pub(crate) fn signal(pid: u32, sig: &str) -> bool {
    Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

/// Kills servers when the test process goes away, however that happens.
///
/// A `sh` process in its own process group (so terminal Ctrl-C does not hit it) blocks
/// in `cat` on a pipe whose write end only this process holds (std opens pipes with
/// `O_CLOEXEC`, so no other child inherits it). When the test process dies the pipe
/// reaches EOF, and for each watched server the script reads its pid from the server's
/// pid file (first line), checks that `/proc/PID/cmdline` mentions the server's marker
/// (guards against pid reuse) and sends `first_signal`; it then waits up to 10 s for
/// all of them, sends SIGKILL to those left, and removes `dir` unless
/// WALPOST_KEEP_TEST_DIRS is set. The pid files are read only at that moment, so a
/// server restarted (new pid) since the watchdog was spawned is still found.
///
/// Dropping the `Watchdog` (normal clean-up path) kills the script without it doing
/// anything; the owner then cleans up synchronously.
#[derive(Debug)]
pub(crate) struct Watchdog {
    child: Child,
    stdin: Option<ChildStdin>,
}

const WATCHDOG_SCRIPT: &str = r#"
trap '' INT HUP TERM QUIT PIPE
cat >/dev/null 2>&1
pids=
i=1
while [ "$i" -le "$WD_N" ]; do
    eval "pf=\$WD_PIDFILE_$i; mk=\$WD_MARKER_$i"
    pid=$(head -n 1 "$pf" 2>/dev/null)
    case "$pid" in ''|*[!0-9]*) pid= ;; esac
    if [ -n "$pid" ] && grep -qaF -- "$mk" "/proc/$pid/cmdline" 2>/dev/null; then
        kill "-$WD_SIGNAL" "$pid" 2>/dev/null
        pids="$pids $pid"
    fi
    i=$((i+1))
done
alive() { for p in $pids; do kill -0 "$p" 2>/dev/null && return 0; done; return 1; }
i=0
while alive && [ "$i" -lt 100 ]; do sleep 0.1; i=$((i+1)); done
for p in $pids; do kill -9 "$p" 2>/dev/null; done
i=0
while alive && [ "$i" -lt 50 ]; do sleep 0.1; i=$((i+1)); done
if [ -z "$WD_KEEP" ]; then rm -rf -- "$WD_DIR"; fi
"#;

impl Watchdog {
    /// One server: its pid file and a string its command line contains.
    pub(crate) fn spawn(pid_file: &Path, marker: &str, first_signal: &str, dir: &Path) -> Result<Watchdog> {
        Watchdog::spawn_many(&[(pid_file.to_path_buf(), marker.to_string())], first_signal, dir)
    }

    /// Several servers (`(pid file, marker)` each) sharing one directory.
    pub(crate) fn spawn_many(servers: &[(PathBuf, String)], first_signal: &str, dir: &Path) -> Result<Watchdog> {
        let mut cmd = Command::new("sh");
        cmd.arg("-c")
            .arg(WATCHDOG_SCRIPT)
            .env("WD_N", servers.len().to_string())
            .env("WD_SIGNAL", first_signal)
            .env("WD_DIR", dir)
            .env("WD_KEEP", if keep_dirs() { "1" } else { "" })
            .current_dir("/")
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0);
        for (i, (pid_file, marker)) in servers.iter().enumerate() {
            cmd.env(format!("WD_PIDFILE_{}", i + 1), pid_file).env(format!("WD_MARKER_{}", i + 1), marker);
        }
        let mut child = cmd.spawn().map_err(|e| err(format!("cannot spawn watchdog sh: {e}")))?;
        let stdin = child.stdin.take();
        Ok(Watchdog { child, stdin })
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        // Kill the script first, then close the pipe: its `cat` child then sees EOF and
        // exits, and the script is gone so nothing gets killed or removed.
        let _ = self.child.kill();
        let _ = self.child.wait();
        drop(self.stdin.take());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The watchdog kills every watched server and removes the directory when the pipe
    /// closes (here: closed on purpose instead of by the death of the test process).
    #[test]
    fn watchdog_kills_several_servers_and_removes_dir() {
        let dir = make_temp_dir("wdtest").expect("dir");
        let mut servers = Vec::new();
        let mut children = Vec::new();
        for i in 0..2 {
            // A unique duration doubles as the marker in /proc/PID/cmdline.
            let marker = format!("{}.{i}{}", 5000 + i, std::process::id());
            let child = Command::new("sleep").arg(&marker).spawn().expect("sleep");
            let pid_file = dir.join(format!("s{i}.pid"));
            fs::write(&pid_file, format!("{}\n", child.id())).expect("pid file");
            servers.push((pid_file, marker));
            children.push(child);
        }
        let mut wd = Watchdog::spawn_many(&servers, "TERM", &dir).expect("watchdog");
        drop(wd.stdin.take()); // as if this process had died
        for c in &mut children {
            let status = c.wait().expect("wait");
            assert!(!status.success(), "{status}");
        }
        let _ = wd.child.wait();
        if !keep_dirs() {
            assert!(!dir.exists(), "{} left", dir.display());
        }
    }
}
