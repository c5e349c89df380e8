"""`PerfStore.coverage`: rows and newest finished run per device, on a real SQLite file."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pandas as pd

from gpuplan_estimator.perfdb.store import PerfStore


def _frame(n: int, device: str) -> pd.DataFrame:
    return pd.DataFrame({
        "device": device, "backend": "b", "kernel": "gemm", "op": "matmul", "dtype": "float32",
        "dims": [f'{{"m":{i}}}' for i in range(n)], "latency_ms": [1.0] * n,
        "latency_std_ms": [0.0] * n, "repeats": 3, "source": "test",
    })


class StepClock:
    """Each call is one day after the previous one, so run end times are distinct."""

    def __init__(self) -> None:
        self.now = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)

    def __call__(self) -> dt.datetime:
        self.now += dt.timedelta(days=1)
        return self.now


def test_empty_database_has_no_devices(tmp_path: Path) -> None:
    with PerfStore.open(f"sqlite:///{tmp_path / 'p.db'}") as store:
        assert store.coverage() == {}


def test_rows_and_newest_done_run_per_device(tmp_path: Path) -> None:
    clock = StepClock()
    with PerfStore.open(f"sqlite:///{tmp_path / 'p.db'}", clock=clock) as store:
        old = store.add_run(device="t4", backend="b")
        store.add_measurements(old, _frame(3, "t4"))
        store.finish_run(old, "done")
        new = store.add_run(device="t4", backend="b")
        store.add_measurements(new, _frame(2, "t4"))
        store.finish_run(new, "done")  # the newest done run of t4
        failed = store.add_run(device="t4", backend="b")
        store.finish_run(failed, "failed")  # later, but failed: no fresh data
        running = store.add_run(device="l4", backend="b")  # never finished
        store.add_measurements(running, _frame(4, "l4"))
        empty = store.add_run(device="h100-sxm-80gb", backend="b")
        store.finish_run(empty, "done")  # a run without rows
        got = store.coverage()
    assert got == {
        "t4": (5, dt.datetime(2026, 1, 5, tzinfo=dt.UTC)),
        "l4": (4, None),
        "h100-sxm-80gb": (0, dt.datetime(2026, 1, 10, tzinfo=dt.UTC)),
    }
