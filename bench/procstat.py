"""The benchmarks' one /proc sampler: CPU time, peak RSS and threads of processes.

run.py and inbox.py import it; the shell scripts (ab-drain.sh) call its command line:

    python3 bench/procstat.py ticks PID [PID...]      # utime + stime, clock ticks, summed
    python3 bench/procstat.py hwm-mb PID              # peak RSS (VmHWM), MB
    python3 bench/procstat.py threads PID EVENTS      # CPU us per event: main broker dr other
    python3 bench/procstat.py follow PID FILE [SECS]  # FILE holds PID's ticks until it exits

CPU is `utime + stime` of /proc/PID/stat (all threads of the process); peak RSS is
`VmHWM` of /proc/PID/status (`ru_maxrss` is not used: for a child started by fork/vfork
+ exec it includes the Python parent's pages). A process that is gone reads as None.
"""

import os
import sys
import time
from pathlib import Path

CLK = os.sysconf("SC_CLK_TCK")


def loadavg() -> str:
    """The 1, 5 and 15 minute load averages."""
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo)."""
    lines = Path("/proc/cpuinfo").read_text().splitlines()
    return next((l.split(":", 1)[1].strip() for l in lines if l.startswith("model name")), "?")


def memory_mb() -> int:
    """Total memory (/proc/meminfo), MB."""
    return int(Path("/proc/meminfo").read_text().splitlines()[0].split()[1]) // 1024


def _stat_fields(path: str) -> list[str]:
    # comm (field 2) may hold spaces and parentheses: the fields after the last ")".
    s = Path(path).read_text()
    return s[s.rindex(")") + 2 :].split()


def ticks(pid: int) -> int | None:
    """utime + stime of a live process (all its threads), in clock ticks."""
    try:
        f = _stat_fields(f"/proc/{pid}/stat")
    except (OSError, ValueError):
        return None
    return int(f[11]) + int(f[12])


def cpu_s(pid: int) -> float | None:
    """utime + stime of a live process (all its threads), in seconds."""
    t = ticks(pid)
    return None if t is None else t / CLK


def hwm_kb(pid: int) -> int | None:
    """The process's peak resident set size (VmHWM), in kB."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (children, their children, ...)."""
    children: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            ppid = int(_stat_fields(f"/proc/{d}/stat")[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(d))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def threads(pid: int) -> list[tuple[int, str, float]]:
    """(thread id, name, CPU seconds) of every thread of `pid`."""
    out = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            name = (task / "comm").read_text().strip()
            f = _stat_fields(str(task / "stat"))
            out.append((int(task.name), name, (int(f[11]) + int(f[12])) / CLK))
        except (OSError, ValueError, IndexError):
            pass
    return out


def thread_cpu(pid: int, name: str) -> float:
    """CPU seconds of the threads of `pid` named `name` (e.g. walpost-otlp)."""
    return sum(s for _, n, s in threads(pid) if n == name)


def walpost_thread_roles(pid: int) -> dict[str, float]:
    """walpost's CPU seconds by role: `main` (the runtime thread: decode, route, hand
    over), `broker` (librdkafka's broker threads: requests, compression), `dr` (the
    delivery-report thread) and `other`."""
    roles = {"main": 0.0, "broker": 0.0, "dr": 0.0, "other": 0.0}
    for tid, name, s in threads(pid):
        if tid == pid:
            roles["main"] += s
        elif name.startswith("rdk:broker"):
            roles["broker"] += s
        elif name.startswith("producer"):
            roles["dr"] += s
        else:
            roles["other"] += s
    return roles


class Tree:
    """CPU and peak RSS of a process and its descendants, sampled while they run."""

    def __init__(self, pid: int):
        self.pid = pid
        self.cpu: dict[int, float] = {}
        self.hwm: dict[int, int] = {}
        self.last_scan = 0.0
        self.pids = [pid]

    def sample(self) -> None:
        now = time.monotonic()
        if now - self.last_scan > 1.0:
            self.pids = [self.pid] + descendants(self.pid)
            self.last_scan = now
        for p in self.pids:
            c = cpu_s(p)
            if c is not None:
                self.cpu[p] = c
            h = hwm_kb(p)
            if h is not None:
                self.hwm[p] = max(h, self.hwm.get(p, 0))

    def cpu_s(self) -> float:
        return sum(self.cpu.values())

    def peak_rss_mb(self) -> float:
        return sum(self.hwm.values()) / 1024


def follow(pid: int, path: str, every: float = 0.02) -> None:
    """Writes `pid`'s CPU ticks to `path` every `every` seconds until it exits, so the
    last value is within `every` of its total (the file is replaced whole each time: a
    reader never sees it half-written)."""
    tmp = f"{path}.tmp"
    while (t := ticks(pid)) is not None:
        with open(tmp, "w") as f:
            f.write(f"{t}\n")
        os.replace(tmp, path)
        time.sleep(every)


def main(argv: list[str]) -> int:
    usage = __doc__.split("\n\n")[2]
    if len(argv) < 2:
        print(usage, file=sys.stderr)
        return 2
    cmd, args = argv[0], argv[1:]
    if cmd == "ticks":
        alive = [t for t in (ticks(int(p)) for p in args) if t is not None]
        print(sum(alive))
        return 0 if alive else 1
    if cmd == "hwm-mb" and len(args) == 1:
        kb = hwm_kb(int(args[0]))
        if kb is None:
            return 1
        print(f"{kb / 1024:.1f}")
        return 0
    if cmd == "threads" and len(args) == 2:
        events = int(args[1])
        roles = walpost_thread_roles(int(args[0]))
        print(" ".join(f"{roles[r] * 1e6 / events:6.2f}" for r in ("main", "broker", "dr", "other")))
        return 0
    if cmd == "follow" and len(args) in (2, 3):
        follow(int(args[0]), args[1], float(args[2]) if len(args) == 3 else 0.02)
        return 0
    print(usage, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
