"""`gpuplan bench` stopped by SIGTERM (what Kubernetes sends) or SIGINT: a real subprocess on CPU
with real onnxruntime and a SQLite file, signalled once it has stored rows.

The sweep's GEMMs are big enough that each row takes tens of milliseconds (a repeat lasts about
40 ms), so the 400-row plan is far longer than the test waits and the signal lands mid-run; the
rerun is cut by a short budget, which is enough to see it resume the same run.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpuplan_estimator.interfaces.cli import bench as cli
from gpuplan_estimator.perfdb.store import PerfStore

pytestmark = pytest.mark.slow

PLAN_ROWS = 400
WAIT_LIMIT_S = 300.0  # generous: a safety net for a loaded machine, not a timing assertion
POLL_S = 0.2
SLOW_GEMM = """
kernel: gemm
ops: [matmul]
dims: {batch: {choice: [1]}, m: {log: [128, 512]}, k: {log: [128, 512]}, n: {log: [128, 512]},
       bias: {choice: [0]}}
limits: {cpu: {max_flops: 1.0e9, max_bytes: 1.0e8}}
"""
ADDED = re.compile(r"run (\d+) on cpu .*?: (\w+), (\d+) rows added")


@pytest.fixture
def sweep_dir(tmp_path: Path) -> Path:
    d = tmp_path / "sweeps"
    d.mkdir()
    (d / "gemm.yaml").write_text(SLOW_GEMM)
    return d


def _bench(db_url: str, sweep_dir: Path, cache_dir: Path, *extra: str) -> subprocess.Popen[str]:
    cmd = [sys.executable, "-m", "gpuplan_estimator.interfaces.cli", "bench", "--device", "cpu",
           "--samples", str(PLAN_ROWS), "--seed", "3", "--repeats", "2", "--threads", "1",
           "--sweep", str(sweep_dir), "--db", db_url, "--no-progress", "--no-host-probe", *extra]
    # The CPU calibration is measured once into this cache, not into the user's ~/.cache.
    env = {**os.environ, "XDG_CACHE_HOME": str(cache_dir)}
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env)


def _finish(proc: subprocess.Popen[str]) -> tuple[int, str, str]:
    try:
        out, err = proc.communicate(timeout=WAIT_LIMIT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"gpuplan bench did not end; stderr: {err[-2000:]}")
    return proc.returncode, out, err


def _rows_once_stored(store: PerfStore, proc: subprocess.Popen[str]) -> int:
    """Poll until the process has flushed at least one row; the count seen then."""
    deadline = time.monotonic() + WAIT_LIMIT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            _, err = proc.communicate()
            pytest.fail(f"bench ended ({proc.returncode}) before it was signalled: {err[-2000:]}")
        seen = len(store.measurements())
        if seen:
            return seen
        time.sleep(POLL_S)
    proc.kill()
    pytest.fail("bench stored no row in time")


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_signal_flushes_marks_interrupted_and_rerun_resumes(
    sig: signal.Signals, code: int, sweep_dir: Path, tmp_path: Path
) -> None:
    url = f"sqlite:///{tmp_path / 'perf.db'}"
    with PerfStore.open(url) as store:
        proc = _bench(url, sweep_dir, tmp_path / "cache")
        seen = _rows_once_stored(store, proc)
        proc.send_signal(sig)
        rc, out, err = _finish(proc)
        assert rc == code, err[-2000:]
        assert f"stopped by {sig.name}" in err
        assert cli.exit_code_for_signal(sig) == code
        match = ADDED.search(out)
        assert match is not None, out
        run_id, status, reported = int(match[1]), match[2], int(match[3])
        (run,) = store.runs()
        assert (run.id, run.status, status) == (run_id, "interrupted", "interrupted")
        assert run.ended_at is not None
        stored = store.measurements(run_id=run_id)
        # Nothing buffered was lost: every row the process counted is in the database.
        assert len(stored) == reported >= seen
        assert len(stored) < PLAN_ROWS

        again = _bench(url, sweep_dir, tmp_path / "cache", "--budget-minutes", "0.02")
        rc, out, err = _finish(again)
        assert rc == cli.EXIT_BUDGET_SPENT, err[-2000:]
        assert "(resumed)" in out
        match = ADDED.search(out)
        assert match is not None and int(match[1]) == run_id, out
        assert [r.id for r in store.runs()] == [run_id]
        after = store.measurements(run_id=run_id)
        keys = after[["kernel", "op", "dtype", "dims"]].apply(tuple, axis=1)
        assert keys.is_unique
        assert len(after) == len(stored) + int(match[3])
        # The rows of the first invocation are kept as they were, not re-measured.
        assert after["dims"].tolist()[: len(stored)] == stored["dims"].tolist()


def test_first_signal_requests_a_stop_second_interrupts_handlers_restored() -> None:
    before = {sig: signal.getsignal(sig) for sig in cli.STOP_SIGNALS}
    with cli.StopOnSignals() as stop:
        assert not stop()
        os.kill(os.getpid(), signal.SIGTERM)  # delivered to this (main) thread
        assert stop() and stop.signum == signal.SIGTERM
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1.0)  # the handler runs at the next bytecode; this only bounds the wait
        assert stop.signum == signal.SIGTERM  # the first signal decides the exit code
    assert {sig: signal.getsignal(sig) for sig in cli.STOP_SIGNALS} == before
