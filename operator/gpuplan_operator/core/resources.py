"""Typed views of the TrainingJob spec and status, condition helpers and Reason constants."""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Mapping, Sequence
from typing import Any

GROUP = "gpuplan.io"
VERSION = "v1alpha1"
PLURAL = "trainingjobs"
KIND = "TrainingJob"
OWNER_LABEL = "gpuplan.io/trainingjob"


class ConditionType:
    """Types of the conditions in a TrainingJob's `status.conditions`."""

    ESTIMATED = "Estimated"
    LAUNCHED = "Launched"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    SPEC_CHANGED = "SpecChangedAfterLaunch"
    QUEUED = "Queued"
    """True while the Job waits for Kueue to admit it (spec.kueue); False once admitted."""


class Reason:
    """CamelCase condition reasons (metav1.Condition requires the pattern)."""

    PLANNED = "Planned"
    INVALID_SPEC = "InvalidSpec"
    INVALID_MODEL = "InvalidModel"
    NO_FEASIBLE_PLAN = "NoFeasiblePlan"
    INVALID_REQUEST = "InvalidRequest"
    ESTIMATOR_UNAVAILABLE = "EstimatorUnavailable"
    MODEL_SOURCE_UNAVAILABLE = "ModelSourceUnavailable"
    JOB_CREATED = "JobCreated"
    JOB_COMPLETED = "JobCompleted"
    JOB_FAILED = "JobFailed"
    SPEC_CHANGE_IGNORED = "SpecChangeIgnored"
    CAPACITY_CHANGED = "CapacityChanged"
    JOB_REJECTED = "JobRejected"
    SERVICE_ACCOUNT_NOT_FOUND = "ServiceAccountNotFound"
    WAITING_FOR_ADMISSION = "WaitingForAdmission"
    ADMITTED = "Admitted"
    QUEUE_NOT_FOUND = "QueueNotFound"
    PODS_NOT_CREATED = "PodsNotCreated"
    """The Job controller could not create the Job's pods (FailedCreate: quota, admission)."""
    ATTENTION_NOT_FUSED = "AttentionNotFused"


@dataclasses.dataclass(frozen=True)
class ModelRef:
    """`spec.model`: a ConfigMap key or a URL holding the ONNX model and its compression, or
    (`hf_config`) a ConfigMap key holding a Hugging Face config.json."""

    config_map_name: str | None
    config_map_key: str | None
    url: str | None
    format: str  # auto | raw | gzip | xz | zstd
    hf_config: bool = False


@dataclasses.dataclass(frozen=True)
class Training:
    """`spec.training`: batch, dataset, epochs, optimizer (and how it runs), precision,
    attention and symbolic dims."""

    batch_size: int
    dataset_size: int
    epochs: int
    optimizer: str
    precision: str
    attention: str
    sequence_length: int | None
    dims: Mapping[str, int]
    optimizer_impl: str


@dataclasses.dataclass(frozen=True)
class ObjectiveSpec:
    """`spec.objective`: what the plan optimises, within deadline, budget and GPU cap."""

    prefer: str
    deadline_seconds: float | None
    budget_usd: float | None
    max_gpus: int


@dataclasses.dataclass(frozen=True)
class TrainingJobSpec:
    """A TrainingJob's `spec` after validation: model, training, objective, GPU types, template."""

    model: ModelRef
    training: Training
    objective: ObjectiveSpec
    gpu_types: tuple[str, ...]
    template: Mapping[str, Any]
    local_queue: str | None = None
    """`spec.kueue.localQueue`: the Kueue LocalQueue of the Job, in the TrainingJob's namespace;
    None runs the Job directly, unqueued."""
    layout: Mapping[str, Any] | None = None
    """`spec.layout`: a pinned parallel layout, as the estimator's `layout` object (snake_case
    keys); None lets the planner search."""
    gpuplan_scheduler: bool | None = None
    """`spec.scheduling.gpuplanScheduler`: this TrainingJob's opt-in (True) or opt-out (False)
    of gpuplan-scheduler; None lets its namespace's label decide."""


@dataclasses.dataclass(frozen=True)
class RejectedCandidate:
    """A (GPU type, count) candidate the estimator rejected, and why."""

    gpu_type: str
    gpu_count: int | None
    reason: str


SCALING_INPUT_KEYS = {"per_gpu_batch": "perGpuBatch", "steps": "steps",
                      "forward_ms": "forwardMs", "backward_ms": "backwardMs",
                      "optimizer_ms": "optimizerMs", "gradient_bytes": "gradientBytes",
                      "intra_node_gbps": "intraNodeGbps"}
"""Plan JSON key -> `status.plan.scalingInputs` key of each `ScalingInputs` field."""
SCALING_INPUT_INTS = frozenset({"per_gpu_batch", "steps", "gradient_bytes"})


@dataclasses.dataclass(frozen=True)
class ScalingInputs:
    """What the plan assumed per step, reported with the outcome so the estimator can fit its
    multi-GPU scaling model (issue #19); None where the estimator's plan did not say."""

    per_gpu_batch: int | None = None
    steps: int | None = None
    """Optimizer steps the job runs."""
    forward_ms: float | None = None
    backward_ms: float | None = None
    optimizer_ms: float | None = None
    gradient_bytes: int | None = None
    intra_node_gbps: float | None = None

    def present(self) -> dict[str, int | float]:
        """The known fields by their plan JSON (and outcome) names."""
        return {k: v for k in SCALING_INPUT_KEYS
                if (v := getattr(self, k)) is not None}


def _scaling_inputs(stored: Mapping[str, Any]) -> ScalingInputs:
    """`status.plan.scalingInputs` (camelCase) as ScalingInputs; absent keys stay None."""
    values: dict[str, Any] = {}
    for key, camel in SCALING_INPUT_KEYS.items():
        if stored.get(camel) is not None:
            values[key] = (int if key in SCALING_INPUT_INTS else float)(stored[camel])
    return ScalingInputs(**values)


@dataclasses.dataclass(frozen=True)
class PlannedParallelism:
    """How the plan splits the GPUs: data x tensor x pipeline ranks and micro-batching (the
    estimator's `Parallelism`, issue #19)."""

    dp: int
    tp: int
    pp: int
    micro_batches: int
    """Micro-batches per optimizer step and data-parallel rank: pipeline micro-batches and
    gradient accumulation together (global batch = dp x micro_batches x micro_batch)."""
    micro_batch: int
    """Samples per micro-batch on one data-parallel rank."""
    ep: int
    """Expert-parallel ranks of a mixture of experts, out of dp (1: none)."""

    def to_status(self) -> dict[str, int]:
        """As `status.plan.parallelism` (camelCase)."""
        return {"dp": self.dp, "tp": self.tp, "pp": self.pp,
                "microBatches": self.micro_batches, "microBatch": self.micro_batch,
                "ep": self.ep}

    @classmethod
    def from_status(cls, data: Mapping[str, Any]) -> PlannedParallelism:
        """Inverse of `to_status`; a status written before expert parallelism has no ep (1)."""
        return cls(dp=int(data["dp"]), tp=int(data["tp"]), pp=int(data["pp"]),
                   micro_batches=int(data["microBatches"]), micro_batch=int(data["microBatch"]),
                   ep=int(data.get("ep", 1)))


@dataclasses.dataclass(frozen=True)
class PlannedMemoryStrategy:
    """What the trainer must do for the plan's memory figures to hold (the estimator's
    `Strategy`, issue #19): ZeRO stage or FSDP sharding, activation checkpointing, gradient
    accumulation and optimizer offload."""

    label: str
    """Short human name, e.g. "zero-2 + accumulate x4"; "none" for plain data parallelism."""
    zero_stage: int
    fsdp: str
    """"none", "full" or "hybrid" (PyTorch FSDP sharding)."""
    checkpointing: str
    """"none", "full" or "per-block" activation checkpointing."""
    checkpoint_fraction: float | None
    """Per-block checkpointing only: the fraction of blocks checkpointed; None otherwise."""
    gradient_accumulation: int
    offload_optimizer: bool

    def to_status(self) -> dict[str, Any]:
        """As `status.plan.memoryStrategy` (camelCase; no checkpointFraction when None)."""
        out: dict[str, Any] = {
            "label": self.label, "zeroStage": self.zero_stage, "fsdp": self.fsdp,
            "checkpointing": self.checkpointing,
            "gradientAccumulation": self.gradient_accumulation,
            "offloadOptimizer": self.offload_optimizer}
        if self.checkpoint_fraction is not None:
            out["checkpointFraction"] = self.checkpoint_fraction
        return out

    @classmethod
    def from_status(cls, data: Mapping[str, Any]) -> PlannedMemoryStrategy:
        """Inverse of `to_status`."""
        fraction = data.get("checkpointFraction")
        return cls(label=str(data["label"]), zero_stage=int(data["zeroStage"]),
                   fsdp=str(data["fsdp"]), checkpointing=str(data["checkpointing"]),
                   checkpoint_fraction=float(fraction) if fraction is not None else None,
                   gradient_accumulation=int(data["gradientAccumulation"]),
                   offload_optimizer=bool(data["offloadOptimizer"]))


NO_STRATEGY_LABEL = "none"
"""The estimator's label of plain data parallelism (`parallel.strategies.MemoryStrategy.label`)."""
MAX_MEMORY_PARTS = 32
"""Bound on `status.plan.memoryBytesByPart` entries (the estimator sends twelve); the client
refuses more, the CRD's maxProperties says the same."""
MEMORY_PART_PATTERN = r"[a-z]+(_[a-z]+)*"
"""Estimator memory part names: snake case of letters, so the camelCase key maps back."""


def memory_part_key(part: str) -> str:
    """An estimator memory part (`optimizer_state_bytes`) as its status key
    (`optimizerStateBytes`)."""
    head, *rest = part.split("_")
    return head + "".join(word.capitalize() for word in rest)


def memory_part_name(key: str) -> str:
    """Inverse of `memory_part_key`."""
    return "".join(f"_{c.lower()}" if c.isupper() else c for c in key)


DATA_BASIS_PHRASES: Mapping[str, str] = {
    "measured": "measured on this GPU type",
    "probed": "spec sheet corrected by a probe of this GPU type",
    "extrapolated": "extrapolated from the spec sheet (no measurements of this GPU type)",
    "roofline": "roofline bound (no learned model)",
}
"""The estimator's `latency.basis` labels (tested equal), as the Estimated message says them."""
DATA_BASES: tuple[str, ...] = tuple(DATA_BASIS_PHRASES)


ATTENTION_WARNING_MAX_CHARS = 512
"""Longest estimator warning kept in `status.plan.attention` (the CRD's maxLength)."""


@dataclasses.dataclass(frozen=True)
class AttentionPricing:
    """How the estimator priced the model's attention against what `spec.training.attention`
    asked (issue #30): fused attention on a graph with no attention core it can find is the
    eager price and memory, and the warning says so."""

    requested: str
    cores: int
    """Whole attention cores found in the model's graph."""
    fused_cores: int
    """Cores priced as one fused kernel."""
    warning: str | None = None

    def to_status(self) -> dict[str, Any]:
        """`status.plan.attention`."""
        out: dict[str, Any] = {"requested": self.requested, "cores": self.cores,
                               "fusedCores": self.fused_cores}
        if self.warning is not None:
            out["warning"] = self.warning
        return out

    @classmethod
    def from_status(cls, data: Mapping[str, Any]) -> AttentionPricing:
        """Inverse of `to_status`."""
        warning = data.get("warning")
        return cls(str(data["requested"]), int(data["cores"]), int(data["fusedCores"]),
                   str(warning) if warning is not None else None)


@dataclasses.dataclass(frozen=True)
class StatusPlan:
    """The estimator's choice, as stored in `status.plan`."""

    gpu_type: str
    device: str
    gpu_count: int
    gpus_per_node: int
    nodes: int
    estimated_seconds: float
    step_time_ms: float
    memory_bytes_per_gpu: int
    cost_usd: float | None
    predictor: str
    observed_generation: int
    alternatives: tuple[Mapping[str, Any], ...] = ()
    rejected: tuple[RejectedCandidate, ...] = ()
    calibration_factor: float = 1.0
    """Job-outcome correction factor the estimator already multiplied into `estimated_seconds`.

    Reported back with the outcome so the estimator can store its model's own estimate.
    """
    scaling_inputs: ScalingInputs = ScalingInputs()
    parallelism: PlannedParallelism | None = None
    """None when the estimator predates issue #19's layouts (or the plan was stored before)."""
    strategy: PlannedMemoryStrategy | None = None
    """None when the estimator predates issue #19's memory strategies."""
    memory_bytes_by_part: Mapping[str, int] | None = None
    """Per-GPU bytes by part under the strategy, keyed as the estimator sends them
    (`parameters_bytes`, ..., `host_bytes` offloaded to host memory, `total_bytes`)."""
    bundle_version: int | None = None
    """The performance database's model bundle version that estimated the plan (issue #17);
    None for a file bundle, an estimator that predates bundle versions, or an older plan."""
    workload_id: str | None = None
    """The estimator's id of the plan's stored workload, reported back with the outcome so the
    promotion gate can re-estimate the job with each bundle (issue #17); None when the
    estimator stored none (no database, or it predates workloads)."""
    data_basis: str | None = None
    """What the estimate for this GPU type rests on (`DATA_BASES`, issue #18): kernel rows
    measured on it, a probe, or its spec sheet alone; None from an estimator that predates it."""
    attention: AttentionPricing | None = None
    """How the attention was priced (issue #30); None from an estimator that predates it."""
    p90_seconds: float | None = None
    """The P90 of `estimated_seconds` (the estimator's interval, issue #32: Kueue's maximum
    execution time); None from an older plan."""

    def attention_warning(self) -> str | None:
        """E.g. "attention not fused: fused attention was asked for, but no attention core
        ..."; None when the attention was priced as asked (or the estimator did not say)."""
        if self.attention is None or self.attention.warning is None:
            return None
        return f"attention not fused: {self.attention.warning}"

    def setup_summary(self) -> str:
        """The layout and strategy for people, e.g. "dp=8 tp=1 pp=1, zero-2 + accumulate x2";
        empty when the plan carries neither."""
        parts = []
        if self.parallelism is not None:
            par = self.parallelism
            parts.append(f"dp={par.dp} tp={par.tp} pp={par.pp}")
        if self.strategy is not None:
            label = self.strategy.label
            parts.append("no memory-saving strategy" if label == NO_STRATEGY_LABEL else label)
        return ", ".join(parts)

    def predictor_summary(self) -> str:
        """E.g. "predictor learned, bundle version 4, extrapolated from the spec sheet" (each
        part the plan has)."""
        parts = [f"predictor {self.predictor}"]
        if self.bundle_version is not None:
            parts.append(f"bundle version {self.bundle_version}")
        if self.data_basis is not None:
            parts.append(DATA_BASIS_PHRASES[self.data_basis])
        return ", ".join(parts)

    @property
    def multi_node(self) -> bool:
        """Whether the plan spans more than one node."""
        return self.nodes > 1

    def to_status(self) -> dict[str, Any]:
        """The plan as `status.plan`: camelCase keys, lists capped to bound the object's size."""
        out: dict[str, Any] = {
            "gpuType": self.gpu_type, "device": self.device, "gpuCount": self.gpu_count,
            "gpusPerNode": self.gpus_per_node, "nodes": self.nodes,
            "estimatedSeconds": self.estimated_seconds, "stepTimeMs": self.step_time_ms,
            "memoryBytes": self.memory_bytes_per_gpu, "predictor": self.predictor,
            "observedGeneration": self.observed_generation,
            "calibrationFactor": self.calibration_factor,
            "alternatives": [dict(a) for a in self.alternatives[:64]],
            "rejected": [{"gpuType": r.gpu_type, "gpuCount": r.gpu_count, "reason": r.reason}
                         for r in self.rejected[:256]],
        }
        if self.cost_usd is not None:
            out["costUsd"] = self.cost_usd
        if self.bundle_version is not None:
            out["bundleVersion"] = self.bundle_version
        if self.workload_id is not None:
            out["workloadId"] = self.workload_id
        if self.data_basis is not None:
            out["dataBasis"] = self.data_basis
        if self.attention is not None:
            out["attention"] = self.attention.to_status()
        if self.p90_seconds is not None:
            out["p90Seconds"] = self.p90_seconds
        inputs = self.scaling_inputs.present()
        if inputs:
            out["scalingInputs"] = {SCALING_INPUT_KEYS[k]: v for k, v in inputs.items()}
        if self.parallelism is not None:
            out["parallelism"] = self.parallelism.to_status()
        if self.strategy is not None:
            out["memoryStrategy"] = self.strategy.to_status()
        if self.memory_bytes_by_part is not None:
            out["memoryBytesByPart"] = {memory_part_key(k): v
                                        for k, v in self.memory_bytes_by_part.items()}
        return out

    @classmethod
    def from_status(cls, data: Mapping[str, Any]) -> StatusPlan:
        """Inverse of `to_status` (a restarted operator resumes from the stored plan)."""
        return cls(
            gpu_type=str(data["gpuType"]), device=str(data.get("device", "")),
            gpu_count=int(data["gpuCount"]), gpus_per_node=int(data["gpusPerNode"]),
            nodes=int(data["nodes"]), estimated_seconds=float(data["estimatedSeconds"]),
            step_time_ms=float(data["stepTimeMs"]), memory_bytes_per_gpu=int(data["memoryBytes"]),
            cost_usd=float(data["costUsd"]) if "costUsd" in data else None,
            predictor=str(data.get("predictor", "")),
            observed_generation=int(data.get("observedGeneration", 0)),
            alternatives=tuple(data.get("alternatives") or ()),
            rejected=tuple(RejectedCandidate(str(r.get("gpuType", "")), r.get("gpuCount"),
                                     str(r.get("reason", ""))) for r in data.get("rejected") or ()),
            # Plans stored before calibration existed were uncalibrated.
            calibration_factor=float(data.get("calibrationFactor", 1.0)),
            # Plans stored before issue #19 carry none: their outcomes only calibrate.
            scaling_inputs=_scaling_inputs(data.get("scalingInputs") or {}),
            # Plans stored before issue #19's layouts and strategies carry none of these.
            parallelism=(PlannedParallelism.from_status(data["parallelism"])
                         if data.get("parallelism") is not None else None),
            strategy=(PlannedMemoryStrategy.from_status(data["memoryStrategy"])
                      if data.get("memoryStrategy") is not None else None),
            memory_bytes_by_part=(
                {memory_part_name(k): int(v) for k, v in data["memoryBytesByPart"].items()}
                if data.get("memoryBytesByPart") is not None else None),
            # Plans stored before issue #17's database bundles carry none.
            bundle_version=(int(data["bundleVersion"]) if data.get("bundleVersion") is not None
                            else None),
            p90_seconds=(float(data["p90Seconds"]) if data.get("p90Seconds") is not None
                         else None),
            workload_id=(str(data["workloadId"]) if data.get("workloadId") is not None
                         else None),
            # Plans stored before issue #18's basis carry none.
            data_basis=(str(data["dataBasis"]) if data.get("dataBasis") is not None else None),
            # Plans stored before issue #30's attention report carry none.
            attention=(AttentionPricing.from_status(data["attention"])
                       if data.get("attention") is not None else None),
        )


@dataclasses.dataclass(frozen=True)
class Actual:
    """When a finished Job ran: its start and completion times."""

    start_time: datetime.datetime
    completion_time: datetime.datetime

    @property
    def seconds(self) -> float:
        """Wall-clock seconds from start to completion."""
        return (self.completion_time - self.start_time).total_seconds()

    def to_status(self) -> dict[str, Any]:
        """The run as `status.actual`."""
        return {"startTime": format_time(self.start_time),
                "completionTime": format_time(self.completion_time), "seconds": self.seconds}


def drift_ratio(actual_seconds: float, estimated_seconds: float) -> float | None:
    """actual / estimated; None when the estimate is not positive (no meaningful ratio)."""
    if estimated_seconds <= 0:
        return None
    return actual_seconds / estimated_seconds


def format_time(t: datetime.datetime) -> str:
    """RFC 3339 in UTC with whole seconds, as Kubernetes writes times."""
    return t.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(s: str) -> datetime.datetime:
    """Parse an RFC 3339 time as Kubernetes writes it (trailing `Z`)."""
    return datetime.datetime.fromisoformat(s.replace("Z", "+00:00"))


def set_condition(
    conditions: Sequence[Mapping[str, Any]], *, type_: str, status: bool, reason: str,
    message: str, observed_generation: int, now: datetime.datetime,
) -> list[dict[str, Any]]:
    """Return conditions with `type_` set; lastTransitionTime moves only when status changes."""
    status_str = "True" if status else "False"
    out: list[dict[str, Any]] = []
    previous = None
    for c in conditions:
        if c.get("type") == type_:
            previous = c
        else:
            out.append(dict(c))
    transition = format_time(now)
    if previous is not None and previous.get("status") == status_str:
        transition = str(previous.get("lastTransitionTime", transition))
    out.append({
        "type": type_, "status": status_str, "reason": reason,
        "message": message[:32768], "observedGeneration": observed_generation,
        "lastTransitionTime": transition,
    })
    return out


def find_condition(
    conditions: Sequence[Mapping[str, Any]], type_: str
) -> Mapping[str, Any] | None:
    """The condition of type `type_`, or None."""
    for c in conditions:
        if c.get("type") == type_:
            return c
    return None


def is_true(conditions: Sequence[Mapping[str, Any]], type_: str) -> bool:
    """Whether the condition of type `type_` is present and True."""
    c = find_condition(conditions, type_)
    return c is not None and c.get("status") == "True"
