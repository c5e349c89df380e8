"""Progress bars on stderr for the long subcommands (`train`, `eval`, `bench`).

The library reports `core.progress.Step`s; this module draws them with tqdm, one bar per task.
Bars are off when stderr is not a terminal (tqdm's ``disable=None``: logs and pipes stay clean)
and when the user gives ``--no-progress``.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, TextIO

from tqdm import tqdm

from gpuplan_estimator.core.progress import Step

NO_PROGRESS_HELP = "no progress bars on stderr (they are off anyway when stderr is not a terminal)"


def add_flag(parser: argparse.ArgumentParser) -> None:
    """Add ``--no-progress``, the one spelling every long subcommand uses."""
    parser.add_argument("--no-progress", action="store_true", help=NO_PROGRESS_HELP)


class TerminalProgress:
    """A `core.progress.Progress` callback drawing one tqdm bar per task on `stream`.

    Use as a context manager so that bars left open by an error are closed.
    """

    def __init__(self, *, enabled: bool, stream: TextIO | None = None) -> None:
        self._enabled = enabled
        self._stream = stream
        self._bars: dict[str, Any] = {}

    def __call__(self, step: Step) -> None:
        """Create, advance or close the bar of `step.task`."""
        bar = self._bars.get(step.task)
        if bar is None:
            bar = tqdm(total=step.total, initial=step.done, desc=step.task, unit="step",
                       file=self._stream if self._stream is not None else sys.stderr,
                       # None: tqdm turns itself off when the stream is not a TTY.
                       disable=None if self._enabled else True, leave=False, mininterval=0.5,
                       dynamic_ncols=True)
            self._bars[step.task] = bar
        bar.update(step.done - bar.n)
        if step.item:
            bar.set_postfix_str(step.item, refresh=False)
        if step.total is not None and step.done >= step.total:
            self._close(step.task)

    def _close(self, task: str) -> None:
        self._bars.pop(task).close()

    def __enter__(self) -> TerminalProgress:
        return self

    def __exit__(self, *_: object) -> None:
        for task in list(self._bars):
            self._close(task)


def for_args(args: argparse.Namespace) -> TerminalProgress:
    """The progress display a subcommand's parsed arguments ask for."""
    quiet = bool(getattr(args, "no_progress", False) or getattr(args, "quiet", False))
    return TerminalProgress(enabled=not quiet)
