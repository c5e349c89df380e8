"""Fitting the scaling model from stored outcomes: known constants recovered from noisy
synthetic runs, the analytic model (with the reason) when samples are too few or the fit does
not beat it on held-out runs, and outcome records turned into samples."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from gpuplan_estimator.parallel import scaling
from gpuplan_estimator.parallel.scaling import ScalingModel, ScalingSample
from gpuplan_estimator.planning import calibrating

FORWARD_MS, BACKWARD_MS, OPTIMIZER_MS = 40.0, 80.0, 5.0


def synthetic(truth: ScalingModel, counts: tuple[int, ...], *, gpus_per_node: int = 8,
              noise: float = 0.02, seed: int = 7) -> list[ScalingSample]:
    """Runs timed as `truth` predicts them, times a log-normal noise of sd `noise`."""
    rng = np.random.default_rng(seed)
    out = []
    for n in counts:
        for grad in (4 * 10**9, 16 * 10**9):  # large enough that backward cannot hide it all
            ar = truth.allreduce_ms(gradient_bytes=grad, gpu_count=n,
                                    gpus_per_node=gpus_per_node, intra_node_gbps=300.0)
            step = truth.step_time_ms(compute_ms=FORWARD_MS + BACKWARD_MS,
                                      backward_ms=BACKWARD_MS, optimizer_ms=OPTIMIZER_MS,
                                      allreduce_ms=ar)
            out.append(ScalingSample(n, gpus_per_node, 300.0, grad, FORWARD_MS + BACKWARD_MS,
                                     BACKWARD_MS, OPTIMIZER_MS,
                                     step * float(np.exp(rng.normal(0.0, noise)))))
    return out


def test_the_fit_recovers_known_constants_inter_node_included() -> None:
    truth = ScalingModel(overlap=0.3, bandwidth_efficiency=0.55, hop_latency_us=30.0,
                         inter_node_gbps=12.0)
    got = scaling.fit_from_samples(synthetic(truth, (2, 4, 8, 16, 32)), random_state=0)
    assert (got.source, got.inter_node_source, got.samples) == ("fitted", "fitted", 10)
    assert got.model.overlap == pytest.approx(0.3, abs=0.05)
    assert got.model.bandwidth_efficiency == pytest.approx(0.55, rel=0.1)
    assert got.model.inter_node_gbps == pytest.approx(12.0, rel=0.1)
    # 2 % noise: held out, the fit is off by about the noise; the defaults by far more.
    assert got.held_out_error_pct is not None and got.held_out_error_pct < 5.0
    assert got.analytic_error_pct is not None and got.analytic_error_pct > 10.0
    assert "held-out error" in got.reason


def test_without_multi_node_runs_the_inter_node_bandwidth_stays_the_default() -> None:
    truth = ScalingModel(overlap=0.6, bandwidth_efficiency=0.4, hop_latency_us=10.0)
    got = scaling.fit_from_samples(synthetic(truth, (2, 4, 8)), random_state=0)
    assert (got.source, got.inter_node_source) == ("fitted", "default")
    assert got.model.inter_node_gbps == scaling.DEFAULT_INTER_NODE_GBPS
    assert got.model.bandwidth_efficiency == pytest.approx(0.4, rel=0.1)


def test_same_random_state_same_fit() -> None:
    samples = synthetic(ScalingModel(overlap=0.2, bandwidth_efficiency=0.5), (2, 4, 8))
    first = scaling.fit_from_samples(samples, random_state=3)
    assert scaling.fit_from_samples(samples, random_state=3) == first


@pytest.mark.parametrize("counts", [(), (4,)])
def test_too_few_samples_keep_the_analytic_model_and_say_why(counts: tuple[int, ...]) -> None:
    samples = synthetic(ScalingModel(overlap=0.1), counts)  # 0 or 2 runs
    got = scaling.fit_from_samples(samples, random_state=0, min_samples=3)
    assert (got.source, got.model, got.samples) == ("analytic", ScalingModel(), len(samples))
    assert ("no multi-GPU runs" in got.reason if not samples
            else f"{len(samples)} multi-GPU run(s), a fit needs 3" in got.reason)


def test_single_gpu_runs_do_not_count_as_samples() -> None:
    one = ScalingSample(1, 8, 300.0, 10**9, 120.0, 80.0, 5.0, 130.0)
    got = scaling.fit_from_samples([one] * 5, random_state=0)
    assert (got.source, got.samples, got.held_out_error_pct) == ("analytic", 0, None)


def test_a_fit_no_better_than_analytic_on_held_out_runs_is_not_used() -> None:
    # Runs exactly as the analytic defaults predict: nothing a fit can improve on held out.
    samples = synthetic(ScalingModel(), (2, 4, 8), noise=0.0)
    got = scaling.fit_from_samples(samples, random_state=0)
    assert (got.source, got.model) == ("analytic", ScalingModel())
    assert got.held_out_error_pct == pytest.approx(0.0, abs=1e-9)
    assert "is not below the analytic model's" in got.reason


def test_min_samples_below_three_is_refused() -> None:
    with pytest.raises(ValueError, match="min_samples"):
        scaling.fit_from_samples([], random_state=0, min_samples=2)


ROW: dict[str, Any] = {
    "device": "h100", "gpu_count": 16, "gpus_per_node": 8, "nodes": 2, "per_gpu_batch": 8,
    "steps": 500, "forward_ms": 10.0, "backward_ms": 20.0, "optimizer_ms": 2.0,
    "gradient_bytes": 10**9, "intra_node_gbps": 450.0, "estimated_seconds": 20.0,
    "actual_seconds": 25.0,
}


def test_outcome_records_become_samples_only_when_complete_and_multi_gpu() -> None:
    rows = [ROW, {**ROW, "gpu_count": 1}, {**ROW, "steps": None},
            {**ROW, "gradient_bytes": math.nan}, {k: v for k, v in ROW.items() if k != "nodes"}]
    got = scaling.samples_from_outcomes(rows)
    assert got == [ScalingSample(16, 8, 450.0, 10**9, 30.0, 20.0, 2.0, 50.0, "h100",
                                 "job_outcome")] * 2  # `nodes` is not needed by the fit


def test_the_compute_factor_scales_the_planned_parts_per_device() -> None:
    [sample] = scaling.samples_from_outcomes([ROW], compute_factor={"h100": 1.5}.__getitem__)
    assert (sample.compute_ms, sample.backward_ms, sample.optimizer_ms) == (45.0, 30.0, 3.0)
    assert sample.measured_step_ms == 50.0  # measured is measured


def test_the_single_gpu_factor_comes_from_single_gpu_outcomes_only() -> None:
    slow = {**ROW, "gpu_count": 1, "estimated_seconds": 10.0, "actual_seconds": 20.0}
    factor = calibrating.single_gpu_compute_factor([ROW, slow, {**slow, "device": "a100"}])
    assert factor("h100") > 1.0 and factor("a100") > 1.0
    assert calibrating.single_gpu_compute_factor([ROW])("h100") == 1.0


def test_fit_from_outcomes_reads_the_records() -> None:
    truth = ScalingModel(overlap=0.3, bandwidth_efficiency=0.5)
    rows = [{**ROW, "gpu_count": s.gpu_count, "gradient_bytes": s.gradient_bytes,
             "intra_node_gbps": 300.0, "forward_ms": FORWARD_MS, "backward_ms": BACKWARD_MS,
             "optimizer_ms": OPTIMIZER_MS, "steps": 100,
             "actual_seconds": s.measured_step_ms * 100 / 1000.0}
            for s in synthetic(truth, (2, 4, 8))]
    got = scaling.fit_from_outcomes(rows, random_state=0)
    assert (got.source, got.samples) == ("fitted", 6)
    assert got.model.bandwidth_efficiency == pytest.approx(0.5, rel=0.1)
    assert got.as_dict()["source"] == "fitted"
