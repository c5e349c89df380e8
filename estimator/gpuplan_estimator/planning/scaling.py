"""Data-parallel scaling: ring all-reduce time and how much of it backward hides.

step = compute + optimizer + max(0, allreduce - overlap * backward), with
allreduce = 2 (n-1)/n * gradient_bytes / (efficiency * bandwidth) + 2 (n-1) * hop_latency.
The three constants are fitted with `scipy.optimize.differential_evolution` against measured
multi-GPU step times when they exist (the generic performance model's approach); the defaults are
typical NCCL figures, not fitted values.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
from scipy.optimize import differential_evolution

DEFAULT_INTER_NODE_GBPS = 25.0  # one 200 Gb/s NIC per node


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
        link_gbps = intra_node_gbps if intra_node_gbps > 0 else 16.0  # PCIe 3 x16 when unknown
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
    """One measured multi-GPU run, with the single-GPU estimate of its parts."""

    gpu_count: int
    gpus_per_node: int
    intra_node_gbps: float
    gradient_bytes: int
    compute_ms: float
    backward_ms: float
    optimizer_ms: float
    measured_step_ms: float


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
