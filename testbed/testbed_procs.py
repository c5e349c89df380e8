"""Process and network edge of the testbed: free ports, spawning, PID records, probes, stopping.

Each component runs in its own session (process group) so that `down` can stop it, and anything
it forked, even when the Python process that started it has crashed. A PID record also stores
the kernel's start time of the process, so a recycled PID is never signalled.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

from testbed_common import Layout, TestbedError

PROBE_TIMEOUT_S = 2.0
POLL_INTERVAL_S = 0.3
LOG_TAIL_LINES = 40


def free_ports(count: int) -> list[int]:
    """`count` distinct ports on 127.0.0.1 that were free a moment ago (held open together)."""
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def start(layout: Layout, name: str, argv: list[str]) -> dict[str, Any]:
    """Spawn `argv` in its own session, logging to `logs/<name>.log`; returns the record."""
    binary = pathlib.Path(argv[0])
    if not os.access(binary, os.X_OK):
        raise TestbedError(f"{name}: binary {binary} is missing; run `make testbed-build`")
    layout.logs.mkdir(parents=True, exist_ok=True)
    layout.pids.mkdir(parents=True, exist_ok=True)
    with open(layout.log(name), "ab") as log:
        log.write(f"\n=== {time.strftime('%FT%TZ', time.gmtime())} {' '.join(argv)}\n".encode())
        log.flush()
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                cwd=layout.state_dir, start_new_session=True)
    record = {"name": name, "pid": proc.pid, "start_ticks": start_ticks(proc.pid),
              "argv0": str(binary)}
    layout.pid(name).write_text(json.dumps(record))
    return record


def read_record(layout: Layout, name: str) -> dict[str, Any] | None:
    path = layout.pid(name)
    try:
        record: dict[str, Any] = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise TestbedError(f"{path}: unreadable PID record ({exc}); delete it by hand") from exc
    return record


def is_alive(record: dict[str, Any] | None) -> bool:
    """True if the recorded process still runs (same PID *and* same start time, not a zombie)."""
    if record is None:
        return False
    pid = int(record["pid"])
    stat = _proc_stat(pid)
    if stat is None or int(stat[19]) != record["start_ticks"]:
        return False
    # A Go program's leader thread shows "Z" while its other threads are still exiting.
    return stat[0] != "Z" or _any_live_thread(pid)


def stop(layout: Layout, name: str, grace_s: float = 10.0) -> bool:
    """SIGTERM the recorded process group, SIGKILL after `grace_s`; True if it was running."""
    record = read_record(layout, name)
    was_running = is_alive(record)
    if record is not None and was_running:
        pid = int(record["pid"])
        _signal_group(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while is_alive(record) and time.monotonic() < deadline:
            _reap(pid)
            time.sleep(0.1)
        if is_alive(record):
            _signal_group(pid, signal.SIGKILL)
            time.sleep(0.2)
        _reap(pid)
    layout.pid(name).unlink(missing_ok=True)
    return was_running


def rss_bytes(record: dict[str, Any] | None) -> int:
    """Resident memory of the recorded process (0 when it is not running)."""
    if not is_alive(record) or record is None:
        return 0
    with contextlib.suppress(OSError):
        for line in pathlib.Path(f"/proc/{record['pid']}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def http_ok(url: str, context: ssl.SSLContext | None = None) -> bool:
    """GET `url`; True on HTTP 200. Never raises for connection problems."""
    try:
        with urllib.request.urlopen(url, timeout=PROBE_TIMEOUT_S, context=context) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError, ssl.SSLError):
        return False


def insecure_tls() -> ssl.SSLContext:
    """For the self-signed health endpoints of kcm and the schedulers (loopback only)."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


def wait_until(layout: Layout, name: str, check: Callable[[], bool], timeout_s: float) -> float:
    """Poll `check` until True; fail naming `name` with its log tail if it dies or times out.

    Returns the seconds waited.
    """
    started = time.monotonic()
    while True:
        if check():
            return time.monotonic() - started
        if not is_alive(read_record(layout, name)):
            raise TestbedError(f"{name} exited during start-up; last log lines of "
                               f"{layout.log(name)}:\n{log_tail(layout.log(name))}")
        if time.monotonic() - started > timeout_s:
            raise TestbedError(f"{name} not ready after {timeout_s:.0f} s; last log lines of "
                               f"{layout.log(name)}:\n{log_tail(layout.log(name))}")
        time.sleep(POLL_INTERVAL_S)


def log_tail(path: pathlib.Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 64 * 1024))
            text = f.read().decode(errors="replace")
    except OSError as exc:
        return f"(no log: {exc})"
    return "\n".join(text.splitlines()[-lines:])


def _proc_stat(pid: int) -> list[str] | None:
    """Fields of /proc/<pid>/stat after the command name (index 0 is the state letter)."""
    try:
        raw = pathlib.Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return raw[raw.rindex(")") + 2:].split()


def _any_live_thread(pid: int) -> bool:
    try:
        tasks = list(pathlib.Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return False
    for task in tasks:
        with contextlib.suppress(OSError, ValueError):
            raw = (task / "stat").read_text()
            if raw[raw.rindex(")") + 2] not in "ZX":
                return True
    return False


def start_ticks(pid: int) -> int:
    """Kernel start time of `pid` in clock ticks: with the PID it identifies one process."""
    stat = _proc_stat(pid)
    if stat is None:
        raise TestbedError(f"process {pid} vanished right after start")
    return int(stat[19])


def _signal_group(pid: int, sig: signal.Signals) -> None:
    # start_new_session made pid the group leader; the group id survives the leader's death.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def _reap(pid: int) -> None:
    """Collect the exit status if the process is our child (else it is init's to reap)."""
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)
