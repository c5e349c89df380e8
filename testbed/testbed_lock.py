"""Sharing one testbed between concurrent users (several pytest sessions in one working tree).

`exclusive()` serialises up/down with an flock on `<state>/lock` (released by the kernel if the
holder dies). Each pytest session registers itself in `<state>/users/`; the last live user
stops a testbed that pytest started, so one session's teardown never pulls the control plane
from under another.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from collections.abc import Iterator

import testbed_procs as procs
from testbed_common import Layout, TestbedError

LOCK_TIMEOUT_S = 600.0  # a cold start under load can hold the lock for minutes


@contextlib.contextmanager
def exclusive(layout: Layout, timeout_s: float = LOCK_TIMEOUT_S) -> Iterator[None]:
    layout.state_dir.mkdir(parents=True, exist_ok=True)
    with open(layout.state_dir / "lock", "a+") as handle:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise TestbedError(f"{layout.state_dir}/lock still held after "
                                       f"{timeout_s:.0f} s by another testbed user") from None
                time.sleep(0.2)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def add_user(layout: Layout, pid: int | None = None) -> None:
    """Register process `pid` (default: this one) as a user of the running testbed."""
    pid = os.getpid() if pid is None else pid
    users = layout.state_dir / "users"
    users.mkdir(parents=True, exist_ok=True)
    record = {"name": f"user-{pid}", "pid": pid, "start_ticks": procs.start_ticks(pid)}
    (users / f"{pid}.json").write_text(json.dumps(record))


def remove_user(layout: Layout, pid: int | None = None) -> int:
    """Deregister `pid`; drop records of dead users; return how many live users remain."""
    pid = os.getpid() if pid is None else pid
    users = layout.state_dir / "users"
    (users / f"{pid}.json").unlink(missing_ok=True)
    remaining = 0
    for path in users.glob("*.json") if users.is_dir() else []:
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            record = None
        if procs.is_alive(record):
            remaining += 1
        else:
            path.unlink(missing_ok=True)
    return remaining
