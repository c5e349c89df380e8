"""CPU time and memory of a process and its descendants, from /proc (the benchmarks' meters)."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path


def descendants(pid: int) -> list[int]:
    """`pid` and every process below it that is still there."""
    found, pending = [], [pid]
    while pending:
        current = pending.pop()
        with contextlib.suppress(OSError):
            children = Path(f"/proc/{current}/task/{current}/children").read_text()
            found.append(current)
            pending.extend(int(c) for c in children.split())
    return found


def cpu_seconds(pid: int, *, waited_children: bool = False) -> float:
    """utime + stime of a process (plus its reaped children's with `waited_children`), from
    /proc/<pid>/stat; resolution one clock tick."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2:].split()
    ticks = int(fields[11]) + int(fields[12])
    if waited_children:
        ticks += int(fields[13]) + int(fields[14])
    return ticks / os.sysconf("SC_CLK_TCK")


def rss_mib(pid: int) -> float:
    """Resident memory of a process, MiB; 0 for a zombie, which has none."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def tree_cpu_seconds(pid: int) -> float:
    """CPU seconds of `pid` and its descendants, reaped children included."""
    total = 0.0
    for member in descendants(pid):
        with contextlib.suppress(OSError):
            total += cpu_seconds(member, waited_children=True)
    return total


def tree_rss_mib(pid: int) -> float:
    """Resident memory of `pid` and its descendants, MiB."""
    total = 0.0
    for member in descendants(pid):
        with contextlib.suppress(OSError):
            total += rss_mib(member)
    return total
