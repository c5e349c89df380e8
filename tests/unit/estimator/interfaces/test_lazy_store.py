"""The estimator's performance database is opened (and migrated) once, by one thread at a time."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from gpuplan_estimator.interfaces.cli import serving
from gpuplan_estimator.perfdb import PerfStore


def test_outcomes_arriving_together_open_the_database_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    opening = threading.Lock()
    opened: list[str | None] = []
    overlapped: list[bool] = []

    def slow_open(url: str | None) -> Any:
        # A migration takes a while; two at once on one SQLite file made one request fail.
        overlapped.append(not opening.acquire(blocking=False))
        try:
            time.sleep(0.05)
            opened.append(url)
            return object()
        finally:
            if not overlapped[-1]:
                opening.release()

    monkeypatch.setattr(PerfStore, "open", staticmethod(slow_open))
    sink_store = serving._lazy_store("sqlite:///x.db")
    history_store = serving._lazy_store("sqlite:///x.db")  # a second reader of the same file
    with ThreadPoolExecutor(max_workers=8) as pool:
        got = list(pool.map(lambda i: (sink_store if i % 2 else history_store)(), range(16)))
    assert opened == ["sqlite:///x.db", "sqlite:///x.db"]  # once per lazy store
    assert not any(overlapped)  # and never two openings at the same time
    assert len({id(s) for s in got}) == 2
