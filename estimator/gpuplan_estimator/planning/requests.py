"""Plain-data requests the planner answers (parsed from JSON by `interfaces.http.wire`)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpuplan_estimator.core import options
from gpuplan_estimator.parallel.named import LayoutRequest
from gpuplan_estimator.planning.placement import GpuPool, Objective


@dataclass(frozen=True)
class TrainingRequest:
    """What the job trains: batch, data, optimizer, precision, mode, attention and symbolic
    dims."""

    batch_size: int
    dataset_size: int
    epochs: int
    optimizer: str = options.DEFAULT_OPTIMIZER
    precision: str = options.DEFAULT_PRECISION
    mode: str = options.DEFAULT_MODE
    attention: str = options.DEFAULT_ATTENTION
    dims: Mapping[str, int] = field(default_factory=dict)
    optimizer_impl: str = options.DEFAULT_OPTIMIZER_IMPL

    @property
    def steps_per_epoch(self) -> int:
        """Optimizer steps per epoch at the global batch (the last, partial batch counts)."""
        return math.ceil(self.dataset_size / self.batch_size)


@dataclass(frozen=True)
class InventoryEntry:
    """One pool of identical GPUs in the cluster, as the operator reports it."""

    gpu_type: str
    gpus_per_node: int
    nodes: int
    free_gpus: int


@dataclass(frozen=True)
class PlanRequest:
    """A plan request: the model, what to train, the objective and the cluster's GPUs."""

    model_onnx: bytes  # empty when the model comes as a Hugging Face config
    training: TrainingRequest
    objective: Objective
    inventory: tuple[InventoryEntry, ...]
    gpu_types: tuple[str, ...]
    model_hf_config: Mapping[str, Any] | None = None
    layout: LayoutRequest | None = None
    """A pinned layout: the plan takes it or says why not (its gpus_per_node is the pool's)."""
    prices_provider: str | None = None  # price from this provider of the shipped book alone


@dataclass(frozen=True)
class EstimateRequest:
    """An estimate request: the model, what to train and which devices (empty: all)."""

    model_onnx: bytes  # empty when the model comes as a Hugging Face config
    training: TrainingRequest
    devices: tuple[str, ...]  # empty = every catalog device
    model_hf_config: Mapping[str, Any] | None = None
    layout: LayoutRequest | None = None
    """A named parallel layout to price (`planning.named_layouts`); None: one GPU each."""


def to_pool(entry: InventoryEntry, device_key: str) -> GpuPool:
    """The planner's pool for an inventory entry resolved to catalog key `device_key`."""
    return GpuPool(entry.gpu_type, device_key, entry.gpus_per_node, entry.nodes, entry.free_gpus)
