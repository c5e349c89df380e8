"""Progress of long library steps, reported through a callback that the caller owns.

The library layers (bench, training, evaluation) never draw on the terminal: they call a
`Progress` callback with a `Step` before the first and after every unit of work, and the CLI
decides whether and how to show it (issue #20: pure functions in the middle, the CLI owns the
terminal).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Step:
    """`done` of `total` units of the task `task` are finished; `item` names the last one."""

    task: str
    done: int
    total: int | None
    item: str = ""


Progress = Callable[[Step], None]
"""Receives every `Step` of every task, in order; must not raise."""


def silent(_step: Step) -> None:
    """The progress callback that shows nothing (the library default)."""


def track(items: Sequence[T], task: str, progress: Progress,
          label: Callable[[T], str] = str) -> Iterator[T]:
    """Yield `items`, reporting the task's start and each item once its work is done."""
    progress(Step(task, 0, len(items)))
    for done, item in enumerate(items, start=1):
        yield item
        progress(Step(task, done, len(items), label(item)))
