"""The promotion gate's job-outcome measure (issue #17) through the real `main()` on SQLite with
real LightGBM bundles: finished jobs whose plan workload is stored are re-estimated by the
candidate and the active bundle; a candidate that ties on every manifest metric but is worse on
those jobs is refused, a better one promoted, and without linked workloads the measure is
skipped with the precise reason (shown by `gpuplan models show`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuplan_estimator import devices
from gpuplan_estimator.interfaces.cli import main as cli
from gpuplan_estimator.perfdb import PerfStore
from gpuplan_estimator.planning import workloads
from gpuplan_estimator.training import outcome_scoring
from gpuplan_testing import workload_builders as wb

SHAPES = [[(64, 512)], [(256, 1024), (8, 30000)], [(1024, 4096)], [(32, 128), (512, 512)],
          [(2048, 2048)]]


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = cli.main(list(argv))
    return code, capsys.readouterr().out


def _db(tmp_path: Path, *, active_seed: int, candidate_seed: int, right_seed: int | None
        ) -> tuple[str, int]:
    """Active and candidate bundles with the same held-out metrics; finished jobs planned by
    the active bundle whose actual seconds are what the `right_seed` bundle re-estimates (None:
    outcomes without workloads). Returns (url, candidate version)."""
    url = f"sqlite:///{tmp_path / 'perf.db'}"
    active = wb.gpu_bundle(tmp_path / "active", seed=active_seed, metrics_seed=0)
    candidate = wb.gpu_bundle(tmp_path / "candidate", seed=candidate_seed, metrics_seed=0)
    catalog = devices.load_catalog()
    with PerfStore.open(url) as store:
        store.add_bundle(active, state="active")
        version = store.add_bundle(candidate, state="candidate")
        planner_of = wb.predictor(active)
        for i, shapes in enumerate(SHAPES):
            w = wb.workload(wb.softmax_items(shapes), planner_of, planned_seconds=100.0 + i)
            workload_id, data = workloads.encode(w)
            if right_seed is None:
                actual, link = 120.0, None
            else:
                right = wb.predictor(tmp_path / ("active" if right_seed == active_seed
                                                 else "candidate"))
                (actual,) = workloads.repredict_seconds([w], right, catalog)
                store.add_workload(workload_id, data, device=w.device, gpu_count=w.gpu_count)
                link = workload_id
            store.record_job_outcome(job_uid=f"job-{i}", device=w.device, gpu_count=1,
                                     estimated_seconds=w.planned_seconds, actual_seconds=actual,
                                     workload_id=link)
    return url, version


def test_a_candidate_worse_on_finished_jobs_is_refused_though_its_metrics_tie(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url, version = _db(tmp_path, active_seed=1, candidate_seed=3, right_seed=1)
    code, out = _run(capsys, "models", "promote", str(version), "--db", url, "-o", "json")
    assert code == 3, out
    decision = json.loads(out)
    checks = {c["measure"]: c for c in decision["checks"]}
    assert checks["random-split MAPE"]["passed"] is True  # the manifests tie
    jobs = checks["job-outcome MAPE"]
    assert jobs["scope"] == f"{len(SHAPES)} finished jobs" and jobs["passed"] is False
    assert jobs["active_mape_pct"] == pytest.approx(0.0, abs=1e-9)
    assert jobs["candidate_mape_pct"] > 5.0
    assert decision["reason"].startswith(
        f"worse than the active bundle on job-outcome MAPE of {len(SHAPES)} finished jobs: ")
    assert decision["skipped"] == []
    code, out = _run(capsys, "models", "show", str(version), "--db", url)
    assert "state:        candidate" in out
    assert "refused by the promotion gate: worse than the active bundle on job-outcome MAPE" \
        in out


def test_a_candidate_better_on_finished_jobs_is_promoted(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url, version = _db(tmp_path, active_seed=1, candidate_seed=3, right_seed=3)
    code, out = _run(capsys, "models", "promote", str(version), "--db", url)
    assert code == 0, out
    assert f"version {version}: promoted: no worse on job-outcome MAPE, random-split MAPE" in out
    assert "job-outcome MAPE" in out and "5 finished jobs" in out


def test_without_linked_workloads_the_measure_is_skipped_with_the_reason(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url, version = _db(tmp_path, active_seed=1, candidate_seed=1, right_seed=None)
    code, out = _run(capsys, "models", "promote", str(version), "--db", url, "-o", "json")
    assert code == 0, out
    decision = json.loads(out)
    assert {c["measure"] for c in decision["checks"]} == {"random-split MAPE"}
    assert decision["skipped"] == [
        "job-outcome MAPE: no finished job with a stored workload (5 outcomes, none names a "
        "plan workload: reported by an operator or estimator that predates them)"]
    code, out = _run(capsys, "models", "show", str(version), "--db", url)
    assert "; skipped job-outcome MAPE: no finished job with a stored workload" in out


def test_only_the_newest_outcomes_are_scored(tmp_path: Path) -> None:
    url, _ = _db(tmp_path, active_seed=1, candidate_seed=3, right_seed=1)
    with PerfStore.open(url) as store:
        _, candidate = store.bundle(2)
        _, active = store.bundle(1)
        scored = outcome_scoring.from_store(store, candidate, active, limit=2)
        newest = [r.actual_seconds for r in store.outcome_workloads(limit=2)]
    assert scored.scores is not None and scored.skipped == ""
    assert list(scored.scores.actual_seconds) == newest
    assert list(scored.scores.active_seconds) == pytest.approx(newest, rel=1e-12)
