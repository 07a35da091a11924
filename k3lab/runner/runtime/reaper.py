"""No Ray process outlives a sweep: the local Ray instance a sweep starts ends with its driver.

A sweep without --address starts a Ray instance of its own: gcs_server, raylet, dashboard,
log monitor, and under the raylet its agents and the trials' workers, all descendants of the
driver. `ray.shutdown()` ends them when the driver ends normally; when the driver is killed
(`kill -9`, out of memory) nothing does, and `ray::DashboardAgent` and `ray::RuntimeEnvAgent`
stay alive for good (they outlast SIGTERM).

So before it starts Ray the driver starts a watchdog (`python -m k3lab.runner.runtime.reaper`, in a session
of its own: Ctrl-C and a closed terminal do not reach it). Every `POLL_S` seconds it reads the
driver's process tree and keeps the instance's processes in `<storage>/<experiment>.ray.json`
(each one's PID, start time and name, and the Ray session folder): the driver's descendants that
were not there when the watchdog started and are programs of the ray package, and everything
under those. When the driver ends, however it ends, the watchdog ends each of them still alive,
by PID (SIGTERM, then SIGKILL after `GRACE_S`), writes one line about it to the sweep's log and
removes the record. A process is only ever ended when its PID still has the start time recorded
with it (not a new process that got the PID); a Ray instance k3lab did not start, or another
child of the driver (a test's services), is never recorded.

Should the watchdog have been killed too, the record stays behind: the next `k3lab sweep` or
`--resume` of the sweep (`end_leftovers`) ends the processes it names that still run and says
so in one line. Linux only (/proc); elsewhere nothing is watched.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

POLL_S = 0.5  # how often the watchdog reads the driver's process tree
GRACE_S = 3.0  # between SIGTERM and SIGKILL
DONE = b"done"  # the driver's last line to its watchdog: it shut Ray down itself

PROC = Path("/proc")


def supported() -> bool:
    return (PROC / "self" / "stat").exists()


# -- processes, from /proc ---------------------------------------------------------------


def _stat(pid: int) -> tuple[int, int] | None:
    """(parent PID, start time in clock ticks since boot) of a live process, else None."""
    try:
        text = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()  # after "pid (comm) ": state ppid ... starttime (field 22)
    if fields[0] in ("Z", "X"):  # a zombie has ended: only its parent's wait is missing
        return None
    return int(fields[1]), int(fields[19])


def start_time(pid: int) -> int | None:
    stat = _stat(pid)
    return None if stat is None else stat[1]


def name_of(pid: int) -> str:
    """The process's command line as `ps` shows it (Ray workers retitle themselves 'ray::...')."""
    try:
        raw = (PROC / str(pid) / "cmdline").read_bytes()
    except OSError:
        return "?"
    words = [w for w in raw.decode(errors="replace").split("\0") if w]
    if not words:
        return "?"
    if words[0].startswith("ray::"):
        return words[0]
    if Path(words[0]).name.startswith("python") and len(words) > 1:  # python -u .../log_monitor.py ...
        words = words[1:] if not words[1].startswith("-") else words[2:] or words
    return Path(words[0]).name


def is_alive(pid: int, started: int) -> bool:
    """The process `pid` runs and is the one that started at `started` (not a later one with its PID)."""
    return start_time(pid) == started


def process_tree(root: int) -> list[tuple[int, int, int]]:
    """(pid, parent pid, start time) of every live descendant of `root`, parents before children."""
    children: dict[int, list[tuple[int, int]]] = {}
    for entry in PROC.iterdir():
        if entry.name.isdigit():
            stat = _stat(int(entry.name))
            if stat is not None:
                children.setdefault(stat[0], []).append((int(entry.name), stat[1]))
    found, todo, seen = [], [root], {root}
    while todo:
        parent = todo.pop(0)
        for pid, started in children.get(parent, ()):
            if pid not in seen:
                seen.add(pid)
                found.append((pid, parent, started))
                todo.append(pid)
    return found


def descendants(root: int) -> dict[int, int]:
    """{pid: start time} of every live descendant of `root`."""
    return {pid: started for pid, _, started in process_tree(root)}


def is_ray_process(pid: int, ray_dir: str) -> bool:
    """A process of Ray's: a program or script of the installed ray package, or a worker ('ray::...')."""
    try:
        raw = (PROC / str(pid) / "cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return False
    return raw.startswith("ray::") or (bool(ray_dir) and ray_dir in raw)


def end_processes(processes: dict[int, int], grace_s: float = GRACE_S) -> list[int]:
    """SIGTERM each live process of {pid: start time}, SIGKILL those still alive after `grace_s`.
    Returns the PIDs that were alive."""
    alive = [pid for pid, started in processes.items() if is_alive(pid, started)]
    for pid in alive:
        _signal(pid, processes[pid], signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(is_alive(pid, processes[pid]) for pid in alive):
        time.sleep(0.1)
    for pid in alive:
        _signal(pid, processes[pid], signal.SIGKILL)
    deadline = time.monotonic() + grace_s  # SIGKILL is not instant: wait until they are gone
    while time.monotonic() < deadline and any(is_alive(pid, processes[pid]) for pid in alive):
        time.sleep(0.05)
    return alive


def _signal(pid: int, started: int, sig: int) -> None:
    if is_alive(pid, started):
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


# -- the record ---------------------------------------------------------------------------


def record_file(storage: Path, experiment: str) -> Path:
    """Where a sweep's watchdog keeps the processes of its Ray instance."""
    return storage / f"{experiment}.ray.json"


def read_record(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _write_record(path: Path, record: dict) -> None:
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(json.dumps(record, indent=1))
    os.replace(temporary, path)  # a reader never sees half a record


def _processes(record: dict) -> dict[int, int]:
    return {int(pid): int(entry["start"]) for pid, entry in record.get("processes", {}).items()}


def _names(record: dict, pids: list[int]) -> str:
    entries = record.get("processes", {})
    shown = [f"{pid} {entries.get(str(pid), {}).get('name', '?')}" for pid in pids[:8]]
    return ", ".join(shown) + (f" and {len(pids) - 8} more" if len(pids) > 8 else "")


# -- the watchdog ---------------------------------------------------------------------------


class Watchdog:
    """The driver's handle on its watchdog process (see the module's docstring)."""

    def __init__(self, process: subprocess.Popen | None, record: Path):
        self.process, self.record = process, record

    @classmethod
    def start(cls, record: Path, log_file: Path | None = None) -> "Watchdog":
        """Start watching this process's Ray processes, before it starts Ray; a no-op handle where
        /proc is missing. Waits until the watchdog has seen the processes already there."""
        if not supported():
            return cls(None, record)
        import ray

        record.parent.mkdir(parents=True, exist_ok=True)
        _remove(record)
        package_root = str(Path(__file__).resolve().parents[3])  # this k3lab, wherever it is imported from
        env = os.environ | {"PYTHONPATH": os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")]))}
        command = [sys.executable, "-m", "k3lab.runner.runtime.reaper", str(os.getpid()), str(start_time(os.getpid())),
                   str(record), str(Path(ray.__file__).resolve().parent)] + ([str(log_file)] if log_file else [])
        process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL, start_new_session=True, close_fds=True, env=env)
        deadline = time.monotonic() + 30  # its first record: it knows what was here before Ray
        while not record.exists() and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        return cls(process, record)

    def session(self, session_dir: str | None) -> None:
        """Tell the watchdog the Ray session folder (for its record and messages)."""
        if self.process and session_dir:
            try:
                self.process.stdin.write(f"session {session_dir}\n".encode())
                self.process.stdin.flush()
            except OSError:
                pass

    def close(self, timeout_s: float = 2 * GRACE_S + 5) -> None:
        """After `ray.shutdown()`: the watchdog ends what is left of the instance and exits; wait for it."""
        if self.process is None:
            return
        try:
            self.process.stdin.write(DONE + b"\n")  # a clean end: an EOF without it is a driver that died
            self.process.stdin.close()
        except OSError:
            pass
        try:
            self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:  # still ending a stubborn process: it finishes on its own
            pass


def watch(driver: int, driver_start: int, record_path: Path, ray_dir: str, log_file: Path | None = None,
          poll_s: float = POLL_S) -> None:
    """The watchdog's loop: follow the driver's Ray processes until the driver ends or closes our
    stdin, then end those still alive.

    The driver's Ray processes: the descendants that were not there when the watchdog started,
    are programs of the ray package (gcs_server, raylet, dashboard, log monitor) and everything
    under those (agents, workers). Other children of the driver (a test's services, when the
    driver is a test process) are never recorded."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the driver's Ctrl-C is not ours
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    me = os.getpid()
    before = set(descendants(driver).items())  # the driver's children before Ray: not ours to end
    record = {"driver": {"pid": driver, "start": driver_start}, "watchdog": {"pid": me, "start": start_time(me)},
              "session_dir": None, "processes": {}}
    _write_record(record_path, record)
    fd, buffered, written = sys.stdin.fileno(), b"", json.loads(json.dumps(record))
    ours: set[int] = set()
    said_done = False  # the driver's close() says so; a killed driver's pipe only closes
    while is_alive(driver, driver_start):
        ready, _, _ = select.select([fd], [], [], poll_s)
        if ready:
            data = os.read(fd, 4096)
            if not data:  # the driver closed the pipe (it is done) or died
                break
            buffered += data
            *lines, buffered = buffered.split(b"\n")
            for line in lines:
                if line.startswith(b"session "):
                    record["session_dir"] = line[len(b"session "):].decode(errors="replace")
                said_done = said_done or line == DONE
        for pid, parent, started in process_tree(driver):
            if (pid, started) in before or pid == me:
                continue
            if parent in ours or pid in ours or is_ray_process(pid, ray_dir):
                ours.add(pid)
                entry = {"start": started, "name": name_of(pid)}  # a worker renames itself 'ray::...' once up
                if record["processes"].get(str(pid)) != entry:
                    record["processes"][str(pid)] = entry
        if record != written:
            _write_record(record_path, record)
            written = json.loads(json.dumps(record))
    died = not said_done  # not is_alive(): a killed driver's pipe closes before the process is gone
    for pid, started in list(_processes(record).items()):  # started since the last look: under one we know
        if is_alive(pid, started):
            for child, child_start in descendants(pid).items():
                record["processes"].setdefault(str(child), {"start": child_start, "name": name_of(child)})
    ended = end_processes(_processes(record))
    if ended and log_file is not None:
        how = "ended without shutting Ray down" if died else "shut Ray down"
        _log(log_file, f"k3lab: the sweep's driver (PID {driver}) {how}; ended {len(ended)} process"
                       f"{'es' if len(ended) != 1 else ''} of its Ray instance ({record['session_dir']}): "
                       f"{_names(record, ended)}")
    _remove(record_path)


def _log(path: Path, line: str) -> None:
    try:
        with open(path, "a") as handle:
            handle.write(time.strftime("%Y-%m-%d %H:%M:%S ") + line + "\n")
    except OSError:
        pass


# -- what an earlier run left ---------------------------------------------------------------


def end_leftovers(record_path: Path, say=print, grace_s: float = GRACE_S) -> list[int]:
    """Before a sweep starts its Ray instance: end the processes of an earlier run's instance
    that `record_path` names and that still run, saying so in one line. Returns their PIDs.

    An earlier driver that still runs is not a leftover: a UserError says so (two sweeps of one
    experiment in one storage folder would write over each other). A watchdog still at work
    is given time to finish."""
    from k3lab.errors import UserError

    record = read_record(record_path)
    if record is None:  # none, or unreadable (half written by a watchdog killed mid-write: nothing to go on)
        _remove(record_path)
        return []
    driver, watchdog = record.get("driver", {}), record.get("watchdog", {})
    mine = bool(driver) and int(driver["pid"]) == os.getpid()  # an earlier sweep of this process: it has ended
    if driver and not mine and is_alive(int(driver["pid"]), int(driver["start"])):
        raise UserError(f"{record_path}: a sweep of this experiment is running (driver PID {driver['pid']}): "
                        "wait for it to end, or stop it, before starting another")
    if watchdog and is_alive(int(watchdog["pid"]), int(watchdog["start"])):
        deadline = time.monotonic() + 2 * grace_s + 5
        while time.monotonic() < deadline and is_alive(int(watchdog["pid"]), int(watchdog["start"])):
            time.sleep(0.1)
        record = read_record(record_path) or record
    ended = end_processes(_processes(record), grace_s)
    if ended:
        gone = "an earlier sweep of this process" if mine else f"driver PID {driver.get('pid', '?')} gone"
        say(f"ray: ended {len(ended)} process{'es' if len(ended) != 1 else ''} left by an earlier run of this "
            f"sweep ({gone}, Ray instance {record.get('session_dir') or '?'}): {_names(record, ended)}")
    _remove(record_path)
    return ended


def _remove(path: Path) -> None:
    try:
        path.unlink(missing_ok=True)
    except OSError:  # e.g. a storage path below a file: the preflight that follows names it
        pass


def main(argv: list[str]) -> int:
    """python -m k3lab.runner.runtime.reaper DRIVER_PID DRIVER_START RECORD RAY_DIR [LOG_FILE]"""
    driver, driver_start, record, ray_dir = int(argv[0]), int(argv[1]), Path(argv[2]), argv[3]
    watch(driver, driver_start, record, ray_dir, Path(argv[4]) if len(argv) > 4 else None)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
