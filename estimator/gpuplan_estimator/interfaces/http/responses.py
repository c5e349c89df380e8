"""Response bodies of the estimator service as pydantic models, and the one error envelope.

The handlers build plain dicts (`interfaces.json_documents`: `plan_json`, `estimate_json`, ...);
these models describe them for docs/openapi.json. They forbid unknown keys, and the service tests
validate real answers against them, so a field added in code without its description fails.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class _Response(BaseModel):
    model_config = ConfigDict(strict=True, frozen=True, extra="forbid")


class FieldError(_Response):
    """One invalid request field."""

    field: str = Field(description="Dotted JSON path of the field, with list indices "
                                   "(`inventory[3].nodes`); `body` is the body itself.")
    message: str


class PlanRejection(_Response):
    """Why one GPU type has no feasible plan (the details of `NoFeasiblePlan`)."""

    gpu_type: str
    gpu_count: int | None = Field(description="The count ruled out; null: the whole type.")
    reason: str


class ErrorBody(_Response):
    """What went wrong: a constant reason, a message for people, and per-item details."""

    reason: str = Field(description="Constant, e.g. InvalidJSON, InvalidRequest, InvalidModel, "
                                    "NoFeasiblePlan, NotFound, MethodNotAllowed, "
                                    "RequestTooLarge, TooManyRequests, NotReady, Busy, "
                                    "Timeout, DatabaseUnavailable, Internal.")
    message: str
    details: list[FieldError | PlanRejection] = Field(
        description="InvalidRequest: one FieldError per bad field (at most 20); "
                    "NoFeasiblePlan: one PlanRejection per GPU type; otherwise empty.")


class ErrorEnvelope(_Response):
    """Every non-2xx answer of the service."""

    error: ErrorBody


WARNINGS_TEXT = ("What the figures may miss, with the fix: e.g. BatchNorm that the export "
                 "folded into the convolutions, priced for training (docs/export.md).")
BUNDLE_VERSION_TEXT = ("Version of the performance database's model bundle that answered "
                       "(gpuplan models list); null: the data-dir or shipped bundle, named by "
                       "predictor_source.")


class Calibration(_Response):
    """The correction learned from job outcomes that a figure includes."""

    factor: float = Field(description="Calibrated / model's own estimate.")
    outcomes: int = Field(description="Job outcomes it rests on.")
    level: str = Field(description="device+mode, mode, global, or none (factor 1).")


class Candidate(_Response):
    """One feasible GPU type x count; times include its calibration factor."""

    gpu_type: str = Field(description="As named in the inventory.")
    device: str = Field(description="Catalog key of the GPU type.")
    gpu_count: int
    gpus_per_node: int
    nodes: int
    per_gpu_batch: int
    step_time_ms: float
    allreduce_ms: float
    estimated_seconds: float = Field(description="Whole job: every epoch's steps.")
    interval_seconds: list[float] = Field(min_length=2, max_length=2,
                                          description="[p10, p90] of estimated_seconds.")
    memory_bytes_per_gpu: int
    cost_usd: float | None = Field(description="null when the GPU type has no known price "
                                   "(never read as free).")
    price_known: bool = Field(description="False: no price is known for this GPU type.")
    predictor: str
    data_basis: str = Field(description="measured, probed, extrapolated or roofline: what the "
                            "GPU type's figures rest on.")
    calibration: Calibration
    steps: int = Field(description="Steps of the whole run.")
    forward_ms: float = Field(description="The single-GPU step at per_gpu_batch, as planned "
                              "(calibrated): what a scaling fit compares the outcome with.")
    backward_ms: float
    optimizer_ms: float
    gradient_bytes: int = Field(description="Gradients of the whole model, all-reduced by data "
                                "parallelism.")
    intra_node_gbps: float = Field(description="The GPU type's interconnect, GB/s.")
    parallelism: Parallelism | None = None
    strategy: Strategy | None = None
    memory: StrategyMemory | None = None
    step_ms: dict[str, float] | None = Field(
        None, description="The step by part: compute, recompute, tp_comm, pp_bubble, pp_p2p, "
        "dp_comm, ep_comm, optimizer, offload_copies (absent parts are 0).")


class Parallelism(_Response):
    """How the GPUs split the work: data x tensor x pipeline ranks, and micro-batching."""

    dp: int
    tp: int
    pp: int
    micro_batches: int = Field(description="Per step, pipeline micro-batches and gradient "
                               "accumulation together.")
    micro_batch: int = Field(description="Samples per micro-batch.")
    ep: int = Field(1, description="Expert-parallel ranks out of dp (mixture of experts).")


class Strategy(_Response):
    """The memory-saving strategy the planner chose (the fastest that fits)."""

    label: str
    zero_stage: int
    fsdp: str
    checkpointing: str
    checkpoint_fraction: float | None
    gradient_accumulation: int
    offload_optimizer: bool


class StrategyMemory(_Response):
    """Memory one GPU needs under the strategy and layout, by part."""

    parameters_bytes: int
    gradients_bytes: int
    optimizer_state_bytes: int
    activations_bytes: int
    workspace_bytes: int
    framework_overhead_bytes: int
    gathered_parameters_bytes: int
    recompute_bytes: int
    host_bytes: int = Field(description="Offloaded to host memory; not in total_bytes.")
    expert_states_bytes: int = Field(
        0, description="Mixture of experts: the experts' weights, gradients and optimizer "
        "state on the rank (part of the first three; 1/ep of them under expert parallelism).")
    dispatch_buffers_bytes: int = Field(
        0, description="Expert parallelism: the all-to-all's send and receive buffers.")
    total_bytes: int


class CandidateRejection(_Response):
    """A GPU type x count the planner ruled out."""

    gpu_type: str
    gpu_count: int
    reason: str


class AttentionSummary(_Response):
    """How the graph's attention was priced, against what was asked for."""

    requested: str = Field(description="The request's attention: eager or fused.")
    cores: int = Field(description="Whole attention cores (Q·Kᵀ, scale and mask, Softmax, "
                       "·V) found in the graph.")
    fused_cores: int = Field(description="Cores priced as one fused kernel: all of them under "
                             "fused attention, 0 under eager.")
    unfused_scores: int = Field(description="Softmaxes over attention scores whose ·V product "
                                "was not found (their probabilities are read elsewhere): "
                                "priced eager whatever was asked.")
    warning: str | None = Field(description="Set when fused attention was asked for and no "
                                "core, or not every attention, could be fused: that part is "
                                "the eager price and memory.")


class PlanResponse(_Response):
    """`POST /v1/plans` 200: the chosen candidate, the best others and every rejection."""

    schema_version: int = Field(description="Bumped when a field changes meaning or goes away.")
    plan: Candidate
    candidates: list[Candidate] = Field(description="Feasible ones, best first (at most 20).")
    candidates_total: int = Field(description="Feasible candidates in all, listed or not.")
    rejected: list[CandidateRejection]
    reasons_by_type: dict[str, str] = Field(description="GPU type -> why it has no candidate.")
    notes: list[str] = Field(description="Inventory entries left out, and why.")
    scaling: FittedScalingSummary = Field(description="The multi-GPU scaling model the plan "
                                          "used.")
    attention: AttentionSummary
    warnings: list[str] = Field(description=WARNINGS_TEXT)
    bundle_version: int | None = Field(description=BUNDLE_VERSION_TEXT)
    workload_id: str | None = Field(
        description="Id of the chosen candidate's workload as stored in the performance "
                    "database; report it back with the job's outcome so the promotion gate can "
                    "re-estimate the job with each model bundle. null: nothing stored (no "
                    "database, the workload over its size cap, or storing it failed; the "
                    "service log says which).")


class ModelSummary(_Response):
    """The estimated graph."""

    name: str
    layers: int
    parameters: int
    opset: int
    dim_bindings: dict[str, int]
    flops_per_step: float = Field(description="Model FLOPs of one step (the MFU numerator).")


class EstimateSettings(_Response):
    """The training settings the estimate is for."""

    mode: str
    optimizer: str | None = Field(description="null for inference (no weights updated).")
    optimizer_impl: str | None = Field(
        description="How the update ran (foreach, fused or for-loop); null for inference.")
    precision: str
    attention: str = Field(description="How the attention core was priced: eager (op by op, "
                           "scores in memory) or fused (one SDPA/FlashAttention kernel).")
    batch_size: int
    epochs: int | None
    dataset_size: int | None


class Interval(_Response):
    """A p10..p90 interval in milliseconds."""

    p10: float
    p90: float


class Memory(_Response):
    """Memory one GPU needs, by part (docs/estimate-json.md)."""

    parameters_bytes: int
    gradients_bytes: int
    optimizer_state_bytes: int
    activations_bytes: int
    workspace_bytes: int
    framework_overhead_bytes: int
    total_bytes: int


class LayerEstimate(_Response):
    """One layer's forward and backward time."""

    name: str
    op_type: str
    family: str
    forward_ms: float
    backward_ms: float
    p10_ms: float
    p90_ms: float
    predictor: str


class Throughput(_Response):
    """Work per second at the estimated step time."""

    samples_per_s: float
    tokens_per_s: float | None = Field(description="null unless a `sequence` dim is bound.")


class Cost(_Response):
    """What the estimate costs at the device's hourly price; null where either is unknown."""

    price_per_hour: float | None
    per_step: float | None
    per_epoch: float | None
    total: float | None


class HostTimeline(_Response):
    """The step on two clocks: the host issuing kernels, the GPU running them."""

    gpu_busy_ms: float = Field(description="The kernels alone, summed.")
    host_ms: float | None = Field(description="The host's time to issue the step; null where "
                                  "no host model applies (CPU devices, fused frameworks).")
    bound: str = Field(description="host (issuing the step takes the CPU longer than its "
                       "kernels take the GPU: a faster GPU would not shorten it), gpu, or "
                       "unknown (no host model).")
    compiled_saving_ms: float | None = Field(
        description="At most this much of the step is the GPU waiting for the host: what a "
                    "step captured in CUDA graphs (torch.compile mode reduce-overhead) saves; "
                    "null without a host model.")
    probe: str = Field(description="Where the host's per-op costs were measured.")


class DeviceEstimate(_Response):
    """One device's estimate; see docs/estimate-json.md for every field."""

    device: str
    data_basis: str = Field(description="measured, probed, extrapolated or roofline.")
    forward_ms: float
    backward_ms: float
    optimizer_ms: float
    step_time_ms: float
    interval_ms: Interval
    steps_per_epoch: int | None
    epoch_seconds: float | None
    total_seconds: float | None
    calibration: Calibration
    calibrated_step_time_ms: float
    calibrated_interval_ms: Interval
    calibrated_epoch_seconds: float | None
    calibrated_total_seconds: float | None
    throughput: Throughput
    mfu: float | None = Field(description="Model FLOPs utilisation; null without a peak.")
    cost_usd: Cost
    memory_bytes: int
    memory: Memory
    memory_available_bytes: int
    fits: bool
    predictor: dict[str, float] = Field(description="Predictor label -> share of step time.")
    uncovered_ops: list[str]
    shape_only_layers: int
    host: HostTimeline
    top_layers: list[LayerEstimate]
    layers: list[LayerEstimate] | None = Field(None, description="CLI --layers only.")


class EstimateResponse(_Response):
    """`POST /v1/estimate` 200: the estimate document of docs/estimate-json.md."""

    schema_version: int
    model: ModelSummary
    settings: EstimateSettings
    attention: AttentionSummary
    warnings: list[str] = Field(description=WARNINGS_TEXT)
    predictor_source: str
    devices: list[DeviceEstimate] = Field(description="In request order.")
    bundle_version: int | None = Field(description=BUNDLE_VERSION_TEXT)


class OutcomeResponse(_Response):
    """`POST /v1/outcomes` 201 (new) or 200 (this job uid was already recorded)."""

    id: int = Field(description="Row of the outcome in the performance database.")
    device: str = Field(description="Catalog key of the job's GPU type.")
    duplicate: bool


class DeviceCoverage(_Response):
    """What the estimator knows about one device."""

    measurements: int = Field(description="Benchmark rows in the performance database.")
    newest_run_unix: float | None = Field(description="End of the newest finished run.")
    in_bundle: bool = Field(description="The model bundle has learned latency models for it.")
    bundle_rows: int = Field(
        description="Rows the served bundle was trained on for this device (0: none), from "
                    "its manifest's device_rows (bundles trained since issue #17). Older "
                    "bundles record no per-device training rows: for them this is the device's "
                    "held-out rows in the manifest's random-split metrics, summed over kernels.")


class CoverageResponse(_Response):
    """`GET /v1/coverage`: every catalog, bundle or database device (absent means 0 rows)."""

    bundle_version: int | None = Field(description=BUNDLE_VERSION_TEXT)
    devices: dict[str, DeviceCoverage]


class ActivateResponse(_Response):
    """`POST /v1/models/{version}/activate` 200: the database's active bundle now."""

    active_version: int = Field(description="The version now active in the database.")
    serving_version: int | None = Field(
        description="The version this replica answers with after reloading; another "
                    "replica follows within its bundle poll. Differs from active_version only "
                    "when the reload failed (the service log says why).")


class CalibrationSummary(_Response):
    """The calibration in use, fitted from job outcomes."""

    outcomes: int
    stale: bool = Field(description="The last refit failed; the previous one is in use.")
    factors: dict[str, float] = Field(description="\"device/mode\" (or */mode, */*) -> factor.")


class FittedScalingSummary(_Response):
    """The multi-GPU scaling model in use: fitted from job outcomes, or the analytic one."""

    source: str = Field(json_schema_extra={"enum": ["fitted", "analytic"]})
    samples: int = Field(description="Multi-GPU outcomes with the scaling fields.")
    held_out_error_pct: float | None = Field(
        description="Mean absolute step-time error (%) on runs the model was not fitted to; "
                    "null without samples.")
    analytic_error_pct: float | None = Field(
        description="The analytic model's error (%) on the same runs.")
    inter_node_source: str = Field(json_schema_extra={"enum": ["fitted", "default"]})
    inter_node_gbps: float
    overlap: float
    bandwidth_efficiency: float
    hop_latency_us: float
    reason: str = Field(description="Why this source (too few runs, a fit no better held out).")


class ScalingSummary(FittedScalingSummary):
    """The scaling model in use, and whether its last refit failed."""

    stale: bool = Field(description="The last refit failed; the previous one is in use.")


class ModelsResponse(_Response):
    """`GET /v1/models`: the predictor, its bundle manifest, the catalog, the calibration and
    the scaling model."""

    predictor: str
    source: str
    manifest: dict[str, Any]
    devices: list[str]
    bundle_version: int | None = Field(description=BUNDLE_VERSION_TEXT)
    calibration: CalibrationSummary
    scaling: ScalingSummary


class HealthResponse(_Response):
    """`GET /healthz`: the process answers."""

    status: str


class ReadyResponse(_Response):
    """`GET /readyz` 200: the model bundle is loaded."""

    status: str
    predictor: str


def error_json(reason: str, message: str, details: list[dict[str, Any]] | None = None
               ) -> dict[str, Any]:
    """The error envelope (`ErrorEnvelope`) as JSON-ready data."""
    return {"error": {"reason": reason, "message": message, "details": details or []}}


def field_errors(problems: list[tuple[str, str]] | tuple[tuple[str, str], ...]
                 ) -> list[dict[str, Any]]:
    """`FieldError` details for (JSON path, message) pairs."""
    return [{"field": path, "message": message} for path, message in problems]
