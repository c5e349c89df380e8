"""Wire JSON of a named parallel layout (issue #34): the optional `layout` object of
`POST /v1/estimate` and the per-rank answer to it. `gpuplan estimate --dp ...` sends and
prints the same documents, so the CLI and the service give the same numbers."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from gpuplan_estimator.core import limits
from gpuplan_estimator.parallel import named
from gpuplan_estimator.parallel.named import LayoutRequest
from gpuplan_estimator.planning.named_layouts import LayoutEstimate

LAYOUT_SCHEMA_VERSION = 1
"""Version of the layout answer's shape (`layout_estimates_json`)."""


class LayoutBody(BaseModel):
    """A named parallel layout: dp x tp x pp must be `gpus`; ZeRO and FSDP are exclusive; ep
    ranks come out of dp."""

    model_config = ConfigDict(strict=True, frozen=True, extra="forbid")
    gpus: int = Field(ge=1, le=named.MAX_GPUS)
    dp: int = Field(ge=1, le=named.MAX_GPUS, description="Data-parallel replicas.")
    tp: int = Field(1, ge=1, le=named.MAX_GPUS, description="Tensor-parallel group size.")
    pp: int = Field(1, ge=1, le=named.MAX_GPUS, description="Pipeline stages.")
    gpus_per_node: int = Field(
        8, ge=1, le=limits.MAX_GPUS_PER_NODE,
        description="GPUs per node: TP groups stay inside one; links past it are the network.")
    fsdp: Literal["none", "full", "hybrid"] = "none"
    zero_stage: Literal[0, 1, 2, 3] = 0
    checkpointing: Literal["none", "selective", "full", "per-block"] = "none"
    checkpoint_fraction: float | None = Field(
        None, gt=0, le=1, description="per-block only: the share of blocks checkpointed.")
    micro_batch: int | None = Field(
        None, ge=1, le=limits.MAX_BATCH_SIZE,
        description="Samples per micro-batch; absent: batch / (dp x gradient_accumulation).")
    gradient_accumulation: int | None = Field(
        None, ge=1, le=limits.MAX_BATCH_SIZE,
        description="Micro-batches per step and replica (the pipeline's under tp/pp); absent: "
                    "batch / (dp x micro_batch), or 1.")
    pp_schedule: Literal["1f1b", "interleaved"] = "1f1b"
    virtual_stages: int = Field(1, ge=1, le=named.MAX_GPUS,
                                description="Model chunks per pipeline rank (interleaved).")
    ep: int = Field(1, ge=1, le=named.MAX_GPUS,
                    description="Expert-parallel ranks (mixture of experts): taken from dp, "
                                "must divide dp and the experts per layer.")


class _Answer(BaseModel):
    model_config = ConfigDict(strict=True, frozen=True, extra="forbid")


class RankLayout(_Answer):
    """The layout as priced: micro_batches counts every micro-batch of a step and replica."""

    gpus: int
    dp: int
    tp: int
    pp: int
    micro_batch: int
    micro_batches: int
    virtual_stages: int
    ep: int
    gpus_per_node: int
    strategy: str = Field(description="ZeRO/FSDP, accumulation and checkpointing, e.g. zero-1.")


class RankStep(_Answer):
    """One rank's step in ms: the parts add up to `step_time_ms`."""

    compute: float = Field(description="Forward, backward, recomputation, optimizer.")
    exposed_comm: dict[str, float] = Field(
        description="Communication compute does not hide, by collective: all-reduce, "
                    "reduce-scatter, all-gather, p2p, all-to-all (expert parallelism).")
    pipeline_bubble: float
    host: float = Field(description="Host work in the critical path (offload copies).")


class RankEstimate(_Answer):
    """One device's step under the named layout, per rank."""

    device: str
    layout: RankLayout
    step_time_ms: float
    step_ms: RankStep
    step_parts_ms: dict[str, float] = Field(description="As a plan's candidate shows them.")
    memory_per_rank: dict[str, int] = Field(description="Bytes by part, total_bytes included.")
    memory_available_bytes: int
    fits: bool
    throughput: dict[str, float | None] = Field(
        description="samples_per_s_per_gpu, tokens_per_s_per_gpu (null: no sequence dim).")
    model_flops_per_step: float = Field(description="Graph forward FLOPs x 3 (training).")
    peak_flops_per_s: float | None
    mfu: float | None = Field(description="model FLOPs / (step time x GPUs x peak).")
    data_basis: str
    calibration_factor: float


class LayoutEstimateResponse(_Answer):
    """`POST /v1/estimate` 200 with a `layout`: the per-rank answer on each device."""

    layout_schema_version: int
    layout_estimates: list[RankEstimate]
    bundle_version: int | None = None


def to_request(body: LayoutBody) -> LayoutRequest:
    """The planner-side request of a validated body."""
    return LayoutRequest(**body.model_dump())


def _rank_json(e: LayoutEstimate) -> dict[str, Any]:
    layout, strategy = e.resolved.layout, e.resolved.strategy
    return {
        "device": e.device,
        "layout": {"gpus": layout.gpu_count, "dp": layout.dp, "tp": layout.tp, "pp": layout.pp,
                   "micro_batch": e.resolved.micro_batch, "micro_batches": layout.micro_batches,
                   "virtual_stages": layout.virtual_stages, "ep": layout.ep,
                   "gpus_per_node": e.resolved.gpus_per_node, "strategy": strategy.label},
        "step_time_ms": e.step_time_ms,
        "step_ms": {"compute": e.compute_ms,
                    "exposed_comm": dict(e.exposed_comm_ms),
                    "pipeline_bubble": e.pipeline_bubble_ms, "host": e.host_ms},
        "step_parts_ms": dict(e.setup.parts_ms),
        "memory_per_rank": e.setup.memory.as_dict(),
        "memory_available_bytes": e.memory_available_bytes,
        "fits": e.fits,
        "throughput": {"samples_per_s_per_gpu": e.samples_per_s_per_gpu,
                       "tokens_per_s_per_gpu": e.tokens_per_s_per_gpu},
        "model_flops_per_step": e.model_flops_per_step,
        "peak_flops_per_s": e.peak_flops_per_s,
        "mfu": e.mfu,
        "data_basis": e.data_basis,
        "calibration_factor": e.calibration_factor,
    }


def layout_estimates_json(results: Sequence[LayoutEstimate]) -> dict[str, Any]:
    """The answer to an estimate with a layout: one entry per device, per rank."""
    return {"layout_schema_version": LAYOUT_SCHEMA_VERSION,
            "layout_estimates": [_rank_json(e) for e in results]}
