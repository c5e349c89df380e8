"""Fixtures of the bench tests: a directory of tiny sweep specs and a SQLite perf store."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuplan_estimator.perfdb.store import PerfStore
from gpuplan_testing.bench_fixtures import TINY


@pytest.fixture
def sweep_dir(tmp_path: Path) -> Path:
    d = tmp_path / "sweeps"
    d.mkdir()
    for name, text in TINY.items():
        (d / name).write_text(text)
    return d


@pytest.fixture
def store(tmp_path: Path) -> Iterator[PerfStore]:
    with PerfStore.open(f"sqlite:///{tmp_path / 'perf.db'}") as s:
        yield s
