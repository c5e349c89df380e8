"""The exit codes of every gpuplan program (`gpuplan`, `gpuplan-operator`, `gpuplan-extender`);
`interfaces.cli.exits` documents them and maps failures to them."""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    """The process exit status of a `gpuplan` command."""

    OK = 0
    INTERNAL = 1
    USAGE = 2
    INFEASIBLE = 3
    UNAVAILABLE = 4
    INCOMPLETE = 5
    INTERRUPTED = 130
