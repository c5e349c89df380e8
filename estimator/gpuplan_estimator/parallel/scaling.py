"""Data-parallel scaling: ring all-reduce time and how much of it backward hides.

step = compute + optimizer + max(0, allreduce - overlap * backward), with
allreduce = 2 (n-1)/n * gradient_bytes / (efficiency * bandwidth) + 2 (n-1) * hop_latency.
The three constants are fitted with `scipy.optimize.differential_evolution` against measured
multi-GPU step times when they exist (the generic performance model's approach); the defaults are
typical NCCL figures, not fitted values.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

DEFAULT_INTER_NODE_GBPS = 25.0  # one 200 Gb/s NIC per node
UNKNOWN_INTRA_NODE_GBPS = 16.0
"""A node's link when the catalog gives none: PCIe 3 x16."""


@dataclass(frozen=True)
class ScalingModel:
    """Data-parallel step time from ring all-reduce cost and its overlap with backward."""
    overlap: float = 0.5  # fraction of backward time that can hide all-reduce
    bandwidth_efficiency: float = 0.7  # achieved / nominal bus bandwidth (NCCL busbw)
    hop_latency_us: float = 10.0
    inter_node_gbps: float = DEFAULT_INTER_NODE_GBPS

    def allreduce_ms(
        self, *, gradient_bytes: int, gpu_count: int, gpus_per_node: int, intra_node_gbps: float
    ) -> float:
        """Ring all-reduce time of the gradients over `gpu_count` GPUs in ms (0 for one)."""
        if gpu_count <= 1 or gradient_bytes <= 0:
            return 0.0
        link_gbps = intra_node_gbps if intra_node_gbps > 0 else UNKNOWN_INTRA_NODE_GBPS
        if gpu_count > gpus_per_node:
            link_gbps = min(link_gbps, self.inter_node_gbps)
        bytes_per_s = self.bandwidth_efficiency * link_gbps * 1e9
        n = gpu_count
        transfer_s = 2.0 * (n - 1) / n * gradient_bytes / bytes_per_s
        latency_s = 2.0 * (n - 1) * self.hop_latency_us * 1e-6
        return (transfer_s + latency_s) * 1000.0

    def step_time_ms(
        self, *, compute_ms: float, backward_ms: float, optimizer_ms: float, allreduce_ms: float
    ) -> float:
        """Step time in ms: compute + optimizer + the all-reduce backward does not hide."""
        exposed = max(0.0, allreduce_ms - self.overlap * backward_ms)
        return compute_ms + optimizer_ms + exposed


@dataclass(frozen=True)
class ScalingSample:
    """One measured multi-GPU run, with the single-GPU estimate of its parts.

    `compute_ms` is forward + backward per step at the per-GPU batch (without the optimizer);
    the parts are the model's single-GPU estimate, the step measured. Job outcomes give
    `source="job_outcome"`; multi-GPU benchmark runs can give `"benchmark"` samples of the same
    shape (each timed step with the model's parts for that batch), and both fit together.
    """

    gpu_count: int
    gpus_per_node: int
    intra_node_gbps: float
    gradient_bytes: int
    compute_ms: float
    backward_ms: float
    optimizer_ms: float
    measured_step_ms: float
    device: str = ""  # catalog key
    source: str = "job_outcome"  # or "benchmark"


def _predict(model: ScalingModel, s: ScalingSample) -> float:
    ar = model.allreduce_ms(
        gradient_bytes=s.gradient_bytes,
        gpu_count=s.gpu_count,
        gpus_per_node=s.gpus_per_node,
        intra_node_gbps=s.intra_node_gbps,
    )
    return model.step_time_ms(
        compute_ms=s.compute_ms, backward_ms=s.backward_ms,
        optimizer_ms=s.optimizer_ms, allreduce_ms=ar,
    )


def fit_scaling(
    samples: Sequence[ScalingSample], *, base: ScalingModel | None = None, random_state: int = 0
) -> ScalingModel:
    """Fit overlap, bandwidth efficiency and hop latency to measured step times (log error)."""
    # Imported here: scipy.optimize costs every CLI start ~0.35 s, and only fits use it (#34).
    from scipy.optimize import differential_evolution

    if len(samples) < 3:
        raise ValueError(f"samples: need at least 3 measured multi-GPU runs, got {len(samples)}")
    start = base or ScalingModel()
    measured = np.log([s.measured_step_ms for s in samples])

    def loss(x: np.ndarray) -> float:
        m = replace(start, overlap=x[0], bandwidth_efficiency=x[1], hop_latency_us=x[2])
        predicted = np.log([max(_predict(m, s), 1e-9) for s in samples])
        return float(np.mean((predicted - measured) ** 2))

    result = differential_evolution(
        loss, bounds=[(0.0, 1.0), (0.05, 1.0), (0.0, 200.0)], seed=random_state, tol=1e-8,
        polish=True,
    )
    return replace(start, overlap=float(result.x[0]), bandwidth_efficiency=float(result.x[1]),
                   hop_latency_us=float(result.x[2]))


# -- fitting from stored outcomes (issue #19, part 3) ----------------------------------------

SCALING_SOURCES = ("fitted", "analytic")
INTER_NODE_SOURCES = ("fitted", "default")
MIN_FIT_SAMPLES = 3
"""Fewest multi-GPU runs a fit may use: with fewer, held-out error says nothing."""
MAX_HELD_OUT_FOLDS = 10
"""Leave-one-out up to this many samples, then this many folds (each refit costs a DE run)."""
# Bounds of the fitted constants. Inter-node: from one 10 GB/s link to 8 x 400 Gb/s NICs.
OVERLAP_BOUNDS = (0.0, 1.0)
EFFICIENCY_BOUNDS = (0.05, 1.0)
HOP_LATENCY_US_BOUNDS = (0.0, 200.0)
INTER_NODE_GBPS_BOUNDS = (1.0, 400.0)
OUTCOME_SCALING_FIELDS = ("gpus_per_node", "steps", "forward_ms", "backward_ms",
                          "optimizer_ms", "gradient_bytes", "intra_node_gbps")
"""Job outcome columns a scaling sample needs besides gpu_count and actual_seconds."""


def _sample_arrays(samples: Sequence[ScalingSample]) -> dict[str, np.ndarray]:
    return {
        "n": np.array([s.gpu_count for s in samples], dtype=float),
        "per_node": np.array([s.gpus_per_node for s in samples], dtype=float),
        "intra": np.array([s.intra_node_gbps if s.intra_node_gbps > 0 else UNKNOWN_INTRA_NODE_GBPS
                           for s in samples], dtype=float),
        "grad": np.array([s.gradient_bytes for s in samples], dtype=float),
        "compute": np.array([s.compute_ms for s in samples], dtype=float),
        "backward": np.array([s.backward_ms for s in samples], dtype=float),
        "optimizer": np.array([s.optimizer_ms for s in samples], dtype=float),
        "measured": np.array([s.measured_step_ms for s in samples], dtype=float),
    }


def _predict_arrays(m: ScalingModel, a: dict[str, np.ndarray]) -> np.ndarray:
    """`_predict` over many samples at once (the fit evaluates it tens of thousands of times)."""
    n = a["n"]
    link = np.where(n > a["per_node"], np.minimum(a["intra"], m.inter_node_gbps), a["intra"])
    transfer_s = 2.0 * (n - 1) / n * a["grad"] / (m.bandwidth_efficiency * link * 1e9)
    latency_s = 2.0 * (n - 1) * m.hop_latency_us * 1e-6
    allreduce = np.where((n > 1) & (a["grad"] > 0), (transfer_s + latency_s) * 1000.0, 0.0)
    exposed = np.maximum(0.0, allreduce - m.overlap * a["backward"])
    predicted: np.ndarray = a["compute"] + a["optimizer"] + exposed
    return predicted


def _error_pct(m: ScalingModel, samples: Sequence[ScalingSample]) -> float:
    """Mean absolute error of the step time in % of the measured one."""
    a = _sample_arrays(samples)
    return float(np.mean(np.abs(_predict_arrays(m, a) - a["measured"]) / a["measured"]) * 100)


def _has_multi_node(samples: Sequence[ScalingSample]) -> bool:
    return any(s.gpu_count > s.gpus_per_node for s in samples)


def fit_scaling_constants(
    samples: Sequence[ScalingSample], *, base: ScalingModel, fit_inter_node: bool,
    random_state: int,
) -> ScalingModel:
    """Overlap, efficiency, hop latency (and inter-node GB/s when asked) by differential
    evolution on the squared log error of the step time; `base` gives what is not fitted."""
    from scipy.optimize import differential_evolution  # only fits need it (see fit_scaling)

    if len(samples) < 2:
        raise ValueError(f"samples: need at least 2 measured multi-GPU runs, got {len(samples)}")
    a = _sample_arrays(samples)
    measured = np.log(a["measured"])
    bounds = [OVERLAP_BOUNDS, EFFICIENCY_BOUNDS, HOP_LATENCY_US_BOUNDS]
    if fit_inter_node:
        bounds.append(INTER_NODE_GBPS_BOUNDS)

    def model_of(x: np.ndarray) -> ScalingModel:
        inter = float(x[3]) if fit_inter_node else base.inter_node_gbps
        return replace(base, overlap=float(x[0]), bandwidth_efficiency=float(x[1]),
                       hop_latency_us=float(x[2]), inter_node_gbps=inter)

    def loss(x: np.ndarray) -> float:
        predicted = np.log(np.maximum(_predict_arrays(model_of(x), a), 1e-9))
        return float(np.mean((predicted - measured) ** 2))

    # tol 1e-4 then L-BFGS-B polish: the same optimum as 1e-8 on synthetic runs, in half the
    # evaluations (the held-out check repeats this fit up to MAX_HELD_OUT_FOLDS times).
    result = differential_evolution(loss, bounds=bounds, seed=random_state, tol=1e-4,
                                    maxiter=300, polish=True)
    return model_of(result.x)


@dataclass(frozen=True)
class FittedScaling:
    """The scaling model the planner should use, and where it came from.

    `held_out_error_pct` is the mean absolute step-time error of `model` on runs it was not
    fitted to (cross-validated for "fitted"; every sample for "analytic", which fits none);
    None when there were no samples to judge it on.
    """

    model: ScalingModel
    source: str  # one of SCALING_SOURCES
    samples: int  # multi-GPU runs available to the fit
    held_out_error_pct: float | None
    reason: str  # why this source: too few samples, a fit worse than analytic, or the errors
    inter_node_source: str = "default"  # one of INTER_NODE_SOURCES
    analytic_error_pct: float | None = None  # the analytic model's error on the same samples

    def as_dict(self) -> dict[str, object]:
        """What plans and `/v1/models` report."""
        return {
            "source": self.source, "samples": self.samples,
            "held_out_error_pct": (round(self.held_out_error_pct, 3)
                                   if self.held_out_error_pct is not None else None),
            "analytic_error_pct": (round(self.analytic_error_pct, 3)
                                   if self.analytic_error_pct is not None else None),
            "inter_node_source": self.inter_node_source,
            "inter_node_gbps": self.model.inter_node_gbps,
            "overlap": self.model.overlap,
            "bandwidth_efficiency": self.model.bandwidth_efficiency,
            "hop_latency_us": self.model.hop_latency_us,
            "reason": self.reason,
        }


ANALYTIC = FittedScaling(ScalingModel(), "analytic", 0, None, "no multi-GPU outcomes yet")
"""What the service plans with before its first refit."""


def _folds(count: int, random_state: int) -> list[np.ndarray]:
    """Held-out index sets: leave-one-out, or `MAX_HELD_OUT_FOLDS` shuffled folds."""
    order = np.random.default_rng(random_state).permutation(count)
    return [f for f in np.array_split(order, min(count, MAX_HELD_OUT_FOLDS)) if f.size]


def held_out_error_pct(
    samples: Sequence[ScalingSample], *, base: ScalingModel, fit_inter_node: bool,
    random_state: int,
) -> float:
    """Cross-validated mean absolute step-time error (%) of fits: each sample is predicted by a
    fit to the others (leave-one-out up to `MAX_HELD_OUT_FOLDS` samples, folds beyond)."""
    errors_pct = np.empty(len(samples))
    for fold in _folds(len(samples), random_state):
        held = set(fold.tolist())
        train = [s for i, s in enumerate(samples) if i not in held]
        # A fold whose training part has no multi-node run cannot fit the inter-node link.
        fitted = fit_scaling_constants(
            train, base=base, fit_inter_node=fit_inter_node and _has_multi_node(train),
            random_state=random_state)
        a = _sample_arrays([samples[i] for i in fold])
        errors_pct[fold] = np.abs(_predict_arrays(fitted, a) - a["measured"]) / a["measured"]
    return float(np.mean(errors_pct) * 100)


def fit_from_samples(
    samples: Sequence[ScalingSample], *, min_samples: int = MIN_FIT_SAMPLES,
    random_state: int, base: ScalingModel | None = None,
) -> FittedScaling:
    """The fitted scaling model when enough multi-GPU samples exist and its held-out error beats
    the analytic model's on the same samples; the analytic `base` otherwise, saying why.

    Samples may come from job outcomes (`samples_from_outcomes`) or, later, from multi-GPU
    benchmark runs: both are `ScalingSample`s. Single-GPU samples carry no scaling information
    and are dropped. The inter-node bandwidth is fitted only when some sample spans nodes.
    """
    if min_samples < MIN_FIT_SAMPLES:
        raise ValueError(f"min_samples: must be at least {MIN_FIT_SAMPLES}, got {min_samples}")
    analytic = base or ScalingModel()
    multi = [s for s in samples if s.gpu_count > 1]
    n = len(multi)
    if n == 0:
        return FittedScaling(analytic, "analytic", 0, None, "no multi-GPU runs with scaling "
                             "fields stored yet")
    analytic_pct = _error_pct(analytic, multi)
    if n < min_samples:
        return FittedScaling(analytic, "analytic", n, analytic_pct,
                             f"{n} multi-GPU run(s), a fit needs {min_samples}",
                             analytic_error_pct=analytic_pct)
    fit_inter = _has_multi_node(multi)
    held_pct = held_out_error_pct(multi, base=analytic, fit_inter_node=fit_inter,
                                  random_state=random_state)
    if not held_pct < analytic_pct:
        return FittedScaling(
            analytic, "analytic", n, analytic_pct,
            f"the fit's held-out error {held_pct:.1f}% is not below the analytic model's "
            f"{analytic_pct:.1f}%", analytic_error_pct=analytic_pct)
    model = fit_scaling_constants(multi, base=analytic, fit_inter_node=fit_inter,
                                  random_state=random_state)
    return FittedScaling(
        model, "fitted", n, held_pct,
        f"fitted to {n} multi-GPU runs: held-out error {held_pct:.1f}% vs analytic "
        f"{analytic_pct:.1f}%", inter_node_source="fitted" if fit_inter else "default",
        analytic_error_pct=analytic_pct)


def _present(value: object) -> bool:
    """Not None and not NaN (a NULL column read through pandas)."""
    return value is not None and not (isinstance(value, float) and math.isnan(value))


def samples_from_outcomes(
    rows: Iterable[Mapping[str, Any]], *, compute_factor: Callable[[str], float] | None = None,
) -> list[ScalingSample]:
    """Scaling samples of the multi-GPU job outcomes that carry every `OUTCOME_SCALING_FIELDS`.

    Rows are job outcome records (`PerfStore.job_outcomes()` as records): the measured step is
    actual_seconds / steps (so start-up and checkpoint time count as step time), the planned
    parts are the model's own (uncalibrated). `compute_factor(device)` corrects the parts
    (forward, backward, optimizer) by what single-GPU outcomes showed, so the fit attributes to
    communication only what compute does not explain; None: 1.
    """
    out = []
    for row in rows:
        if not all(_present(row.get(f)) for f in OUTCOME_SCALING_FIELDS):
            continue
        if int(row["gpu_count"]) <= 1 or int(row["steps"]) <= 0:
            continue
        device = str(row.get("device", ""))
        factor = compute_factor(device) if compute_factor is not None else 1.0
        out.append(ScalingSample(
            gpu_count=int(row["gpu_count"]), gpus_per_node=int(row["gpus_per_node"]),
            intra_node_gbps=float(row["intra_node_gbps"]),
            gradient_bytes=int(row["gradient_bytes"]),
            compute_ms=factor * (float(row["forward_ms"]) + float(row["backward_ms"])),
            backward_ms=factor * float(row["backward_ms"]),
            optimizer_ms=factor * float(row["optimizer_ms"]),
            measured_step_ms=float(row["actual_seconds"]) * 1000.0 / int(row["steps"]),
            device=device, source="job_outcome"))
    return out


def fit_from_outcomes(
    rows: Iterable[Mapping[str, Any]], *, min_samples: int = MIN_FIT_SAMPLES, random_state: int,
    base: ScalingModel | None = None, compute_factor: Callable[[str], float] | None = None,
) -> FittedScaling:
    """`fit_from_samples` over `samples_from_outcomes(rows)`."""
    return fit_from_samples(samples_from_outcomes(rows, compute_factor=compute_factor),
                            min_samples=min_samples, random_state=random_state, base=base)
