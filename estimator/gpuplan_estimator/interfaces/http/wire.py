"""Request bodies of the estimator service as pydantic models, and JSON → typed request (pure).

The models are the one description of what a client may send: the worker validates bodies with
them (`work`), and `openapi` writes them into docs/openapi.json. They are strict where JSON types
matter (`true` is not an integer, `"5"` is not a number) and take their bounds from
`core.limits`, `core.options` and the constants below. Unknown keys are ignored, so an older
service accepts a newer client's body.

A valid body becomes the planner's plain request (`planning.requests`). Every invalid field is
reported at once with its JSON path (``inventory[3].nodes``), at most `MAX_REPORTED_ERRORS`.
"""

from __future__ import annotations

import binascii
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
)
from pydantic_core import PydanticCustomError

from gpuplan_estimator.core import limits, options, vocabulary
from gpuplan_estimator.core.errors import InvalidRequestError
from gpuplan_estimator.graph import exporting
from gpuplan_estimator.interfaces.http import layout_wire
from gpuplan_estimator.interfaces.http.layout_wire import LayoutBody
from gpuplan_estimator.planning.placement import Objective
from gpuplan_estimator.planning.requests import (
    EstimateRequest,
    InventoryEntry,
    PlanRequest,
    TrainingRequest,
)

MAX_REPORTED_ERRORS = 20
"""Field errors kept per request: enough to fix a request, bounded for a hostile one (a
million bad inventory entries must not make a million-line answer)."""
MAX_INVENTORY_POOLS = 1000
"""GPU pools a plan request may list: one per GPU type and node shape; no cluster has more."""
MAX_NAMES = 1000
"""Names in `gpu_types` or `devices`: far more than the catalog holds."""
MAX_DEADLINE_SECONDS = 10 * 365 * 86400.0
"""Longest deadline or job duration accepted (ten years); anything longer is a typo or hostile."""
MAX_BUDGET_USD = 1e12
MAX_CALIBRATION_FACTOR = 1e3
"""Largest calibration factor an outcome may carry (the planner clips factors to x4 anyway)."""
MAX_OUTCOME_STEPS = limits.MAX_DATASET_SIZE * limits.MAX_EPOCHS
"""Most optimizer steps an outcome may report: every sample of the largest dataset, one per
step, for the most epochs."""
MAX_GRADIENT_BYTES = 2**50
"""A petabyte of gradients: far beyond any model, bounded so the database's BIGINT holds it."""
MAX_INTERCONNECT_GBPS = 1e5
BODY_FIELD = "body"
"""The `field` of an error about the body as a whole (not an object, no model given)."""


class InvalidFieldsError(InvalidRequestError):
    """Several fields are invalid: `problems` holds (JSON path, message) for each reported one,
    `dropped` counts those past `MAX_REPORTED_ERRORS`."""

    def __init__(self, problems: Sequence[tuple[str, str]], dropped: int = 0) -> None:
        self.problems = tuple(problems)
        self.dropped = dropped
        more = f"; and {dropped} more" if dropped else ""
        super().__init__(", ".join(p for p, _ in self.problems),
                         "; ".join(f"{p}: {m}" for p, m in self.problems) + more,
                         tuple(f"{p}: {m}" for p, m in self.problems))

    def __str__(self) -> str:
        return self.message


def _one_of(choices: tuple[str, ...]) -> Callable[[str], str]:
    def check(value: str) -> str:
        if value not in choices:
            raise PydanticCustomError("choice", "must be one of {choices}",
                                      {"choices": ", ".join(choices)})
        return value
    return check


def _at_most(count: int, what: str) -> Callable[[Any], Any]:
    """Refuse a container of more than `count` entries before its entries are validated, so a
    million bad ones make one error, not a million."""
    def check(value: Any) -> Any:
        if isinstance(value, list | dict) and len(value) > count:
            raise PydanticCustomError("too_long", "at most {count} {what}, got {got}",
                                      {"count": count, "what": what, "got": len(value)})
        return value
    return check


Mode = Annotated[str, AfterValidator(_one_of(options.MODES)),
                 Field(json_schema_extra={"enum": list(options.MODES)})]
Optimizer = Annotated[str, AfterValidator(_one_of(options.OPTIMIZERS)),
                      Field(json_schema_extra={"enum": list(options.OPTIMIZERS)})]
OptimizerImpl = Annotated[str, AfterValidator(_one_of(options.OPTIMIZER_IMPLS)),
                          Field(json_schema_extra={"enum": list(options.OPTIMIZER_IMPLS)})]
Precision = Annotated[str, AfterValidator(_one_of(options.PRECISIONS)),
                      Field(json_schema_extra={"enum": list(options.PRECISIONS)})]
Attention = Annotated[str, AfterValidator(_one_of(options.ATTENTIONS)),
                      Field(json_schema_extra={"enum": list(options.ATTENTIONS)})]
Prefer = Annotated[str, AfterValidator(_one_of(options.OBJECTIVES)),
                   Field(json_schema_extra={"enum": list(options.OBJECTIVES)})]
DimName = Annotated[str, Field(min_length=1, max_length=limits.MAX_DIM_NAME_CHARS)]
DimValue = Annotated[int, Field(ge=1, le=limits.MAX_DIM)]
Names = Annotated[list[Annotated[str, Field(min_length=1)]],
                  BeforeValidator(_at_most(MAX_NAMES, "names")), Field(max_length=MAX_NAMES)]
PositiveSeconds = Annotated[float, Field(gt=0, le=MAX_DEADLINE_SECONDS, allow_inf_nan=False)]
StepPartMs = Annotated[float, Field(ge=0, le=MAX_DEADLINE_SECONDS * 1000.0, allow_inf_nan=False)]


class _Body(BaseModel):
    model_config = ConfigDict(strict=True, frozen=True, extra="ignore")


class HfConfigBody(BaseModel):
    """A Hugging Face config.json object: `model_type` names the architecture; every other key
    is passed to its builder as is."""

    model_config = ConfigDict(strict=True, frozen=True, extra="allow")
    model_type: str = Field(min_length=1)


class TrainingBody(_Body):
    """What the job trains: batch, data, optimizer, precision, mode, attention and symbolic
    dims."""

    batch_size: int = Field(ge=1, le=limits.MAX_BATCH_SIZE,
                            description="Global batch in samples per optimizer step.")
    dataset_size: int | None = Field(
        None, ge=1, le=limits.MAX_DATASET_SIZE,
        description="Samples per epoch; absent or null: one batch.")
    epochs: int = Field(1, ge=1, le=limits.MAX_EPOCHS)
    optimizer: Optimizer = options.DEFAULT_OPTIMIZER
    optimizer_impl: OptimizerImpl = Field(
        options.DEFAULT_OPTIMIZER_IMPL,
        description="How torch.optim runs the update: foreach (PyTorch's default on CUDA), "
                    "fused (fused=True: one kernel per chunk; not for rmsprop) or for-loop "
                    "(foreach=False: ops launched per parameter tensor).")
    precision: Precision = options.DEFAULT_PRECISION
    mode: Mode = options.DEFAULT_MODE
    attention: Attention = Field(
        options.DEFAULT_ATTENTION,
        description="How the attention core runs: eager (op by op, its score matrix in memory) "
                    "or fused (one SDPA/FlashAttention kernel, Hugging Face's \"sdpa\"); "
                    "fused keeps no scores, so it needs less memory and time.")
    dims: Annotated[dict[DimName, DimValue] | None,
                    BeforeValidator(_at_most(limits.MAX_DIMS, "dims"))] = Field(
        None, max_length=limits.MAX_DIMS,
        description="Symbolic dims by name, e.g. {\"sequence\": 1024}; batch x every dim is "
                    f"at most {limits.MAX_SAMPLE_ELEMENTS} elements.")


class _ModelBody(_Body):
    model_onnx_b64: str | None = Field(
        None, min_length=1, description="Base64 of the ONNX graph (weights may be stripped). "
                                        "Exactly one of this and model_hf_config.")
    model_hf_config: HfConfigBody | None = Field(
        None, description="A Hugging Face config.json object, built into its graph by the "
                          "estimator (model_type "
                          f"{', '.join(exporting.WRITTEN_MODEL_TYPES)} without torch).")
    training: TrainingBody


class ObjectiveBody(_Body):
    """What the plan optimises, and its limits."""

    prefer: Prefer = options.DEFAULT_OBJECTIVE
    max_gpus: int = Field(options.DEFAULT_MAX_GPUS, ge=1, le=options.MAX_GPUS_CAP)
    deadline_seconds: PositiveSeconds | None = None
    budget_usd: Annotated[float, Field(gt=0, le=MAX_BUDGET_USD, allow_inf_nan=False)
                          ] | None = None


class InventoryPoolBody(_Body):
    """One pool of identical GPUs in the cluster."""

    gpu_type: str = Field(min_length=1, description="Node label value or catalog name.")
    gpus_per_node: int = Field(ge=1, le=limits.MAX_GPUS_PER_NODE)
    nodes: int = Field(1, ge=1, le=limits.MAX_NODES_PER_POOL)
    free_gpus: int | None = Field(
        None, ge=0, le=limits.MAX_GPUS_PER_NODE * limits.MAX_NODES_PER_POOL,
        description="GPUs free now; absent: gpus_per_node.")


class PlanRequestBody(_ModelBody):
    """`POST /v1/plans`: the model, what to train, the objective and the cluster's GPU pools."""

    objective: ObjectiveBody = ObjectiveBody.model_validate({})  # frozen: safe to share
    inventory: Annotated[list[InventoryPoolBody],
                         BeforeValidator(_at_most(MAX_INVENTORY_POOLS, "GPU pools"))] = Field(
        min_length=1, max_length=MAX_INVENTORY_POOLS)
    gpu_types: Names | None = Field(None, description="Allow-list of GPU types; empty: any.")
    layout: LayoutBody | None = Field(
        None, description="A pinned parallel layout: the plan takes it at its GPU count on each "
                          "pool (gpus_per_node is the pool's) or says why it cannot.")
    prices_provider: Annotated[str, StringConstraints(max_length=40)] | None = Field(
        None, description="Price every GPU from this provider's published, dated on-demand "
                          "list (e.g. aws, lambda): a GPU it does not list is unpriced. "
                          "Absent: the service's prices.")


class EstimateRequestBody(_ModelBody):
    """`POST /v1/estimate`: the model, what to train and the devices (absent or empty: all)."""

    devices: Names | None = None
    layout: LayoutBody | None = Field(
        None, description="A named parallel layout: the answer is then per rank under it "
                          "(docs/parallelism.md, \"Estimate a named layout\").")


class OutcomeBody(_Body):
    """`POST /v1/outcomes`: a finished job, reported by the operator to calibrate plans."""

    job_uid: str = Field(min_length=1)
    gpu_type: str = Field(min_length=1)
    gpu_count: int = Field(ge=1, le=options.MAX_GPUS_CAP)
    estimated_seconds: PositiveSeconds = Field(
        description="As planned, i.e. already multiplied by calibration_factor.")
    actual_seconds: PositiveSeconds
    model_digest: str = ""
    calibration_factor: Annotated[
        float, Field(gt=0, le=MAX_CALIBRATION_FACTOR, allow_inf_nan=False)] | None = Field(
        None, description="The plan's calibration.factor; absent: 1.")
    # For the multi-GPU scaling fit (issue #19); each optional, as planned (the plan's
    # step parts are calibrated like estimated_seconds, so the factor is divided out too).
    gpus_per_node: int | None = Field(None, ge=1, le=limits.MAX_GPUS_PER_NODE,
                                      description="GPUs of each pod (node) of the job.")
    nodes: int | None = Field(None, ge=1, le=limits.MAX_NODES_PER_POOL)
    per_gpu_batch: int | None = Field(None, ge=1, le=limits.MAX_BATCH_SIZE)
    steps: int | None = Field(None, ge=1, le=MAX_OUTCOME_STEPS,
                              description="Optimizer steps the job ran.")
    forward_ms: StepPartMs | None = Field(
        None, description="The plan's forward ms per step at per_gpu_batch, on one GPU.")
    backward_ms: StepPartMs | None = Field(
        None, description="The plan's backward ms per step at per_gpu_batch, on one GPU.")
    optimizer_ms: StepPartMs | None = Field(
        None, description="The plan's optimizer ms per step, on one GPU.")
    gradient_bytes: int | None = Field(None, ge=0, le=MAX_GRADIENT_BYTES,
                                       description="Gradient bytes all-reduced per step.")
    intra_node_gbps: Annotated[
        float, Field(gt=0, le=MAX_INTERCONNECT_GBPS, allow_inf_nan=False)] | None = Field(
        None, description="The GPU type's intra-node interconnect GB/s the plan assumed.")
    workload_id: str | None = Field(
        None, pattern=f"^{vocabulary.WORKLOAD_ID_PATTERN}$",
        description="The plan response's workload_id: links the outcome to the plan's stored "
                    "workload, which the promotion gate re-estimates with each bundle.")
    namespace: str = Field(
        "", pattern=f"^({vocabulary.NAMESPACE_PATTERN})?$",
        description="The TrainingJob's namespace, as the (authenticated) operator asserts it: "
                    "each namespace's weight in a GPU type's calibration is bounded "
                    "(docs/security.md). Absent: not known, one tenant with older rows.")


@dataclass(frozen=True)
class OutcomeScaling:
    """What a finished job adds for the scaling fit, as planned (calibrated like its
    estimated_seconds); each None when an older operator did not send it."""

    gpus_per_node: int | None = None
    nodes: int | None = None
    per_gpu_batch: int | None = None
    steps: int | None = None
    forward_ms: float | None = None
    backward_ms: float | None = None
    optimizer_ms: float | None = None
    gradient_bytes: int | None = None
    intra_node_gbps: float | None = None


@dataclass(frozen=True)
class OutcomeRequest:
    """A finished job, reported by the operator: the calibration sample of a plan."""

    job_uid: str
    gpu_type: str
    gpu_count: int
    estimated_seconds: float  # as planned, i.e. already multiplied by calibration_factor
    actual_seconds: float
    model_digest: str = ""
    calibration_factor: float = 1.0  # the plan's `calibration.factor`; 1 from older operators
    scaling: OutcomeScaling = OutcomeScaling()
    workload_id: str | None = None
    """The plan's stored workload (`planning.workloads`); None from older operators."""
    namespace: str = ""
    """The TrainingJob's namespace; "" from older operators."""


def json_path(loc: Sequence[int | str]) -> str:
    """A pydantic error location as a dotted JSON path with list indices: ``inventory[3].nodes``;
    the body itself is `BODY_FIELD`."""
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif part != "[key]":  # a dict key's own error: the path already ends at the key
            path += f".{part}" if path else part
    return path or BODY_FIELD


def _validated(model: type[_Body], body: Any) -> Any:
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        errors = exc.errors(include_url=False, include_input=False, include_context=False)
        problems = [(json_path(e["loc"]), e["msg"]) for e in errors[:MAX_REPORTED_ERRORS]]
        raise InvalidFieldsError(problems, max(0, len(errors) - MAX_REPORTED_ERRORS)) from None


def _raise_if_any(problems: list[tuple[str, str]]) -> None:
    if problems:
        raise InvalidFieldsError(problems[:MAX_REPORTED_ERRORS],
                                 max(0, len(problems) - MAX_REPORTED_ERRORS))


def _model(body: _ModelBody, problems: list[tuple[str, str]]) -> bytes:
    """The ONNX bytes of a body (empty for a Hugging Face config); problems are added."""
    if (body.model_onnx_b64 is None) == (body.model_hf_config is None):
        problems.append(("model_onnx_b64", "give exactly one of model_onnx_b64 (base64 of the "
                         "ONNX graph) and model_hf_config (a Hugging Face config.json object)"))
        return b""
    if body.model_onnx_b64 is None:
        return b""
    try:
        return binascii.a2b_base64(body.model_onnx_b64, strict_mode=True)
    except (binascii.Error, ValueError):
        problems.append(("model_onnx_b64", "is not valid base64"))
        return b""


def _training(body: TrainingBody, problems: list[tuple[str, str]]) -> TrainingRequest:
    dims = dict(body.dims or {})
    too_big = limits.sample_elements_error(body.batch_size, dims)
    if too_big is not None:
        problems.append(("training.dims", too_big))
    impl_problem = options.optimizer_impl_problem(body.optimizer, body.optimizer_impl)
    if impl_problem is not None:
        problems.append(("training.optimizer_impl", impl_problem))
    return TrainingRequest(
        batch_size=body.batch_size,
        dataset_size=body.dataset_size if body.dataset_size is not None else body.batch_size,
        epochs=body.epochs, optimizer=body.optimizer, optimizer_impl=body.optimizer_impl,
        precision=body.precision, mode=body.mode, attention=body.attention, dims=dims)


def _hf_config(body: _ModelBody) -> dict[str, Any] | None:
    return body.model_hf_config.model_dump() if body.model_hf_config is not None else None


def parse_plan_request(body: Any) -> PlanRequest:
    """Validate a decoded plan request body; InvalidFieldsError lists every bad field."""
    valid: PlanRequestBody = _validated(PlanRequestBody, body)
    problems: list[tuple[str, str]] = []
    model = _model(valid, problems)
    training = _training(valid.training, problems)
    _raise_if_any(problems)
    o = valid.objective
    objective = Objective(prefer=o.prefer, max_gpus=o.max_gpus,
                          deadline_seconds=o.deadline_seconds, budget_usd=o.budget_usd)
    inventory = tuple(
        InventoryEntry(gpu_type=p.gpu_type, gpus_per_node=p.gpus_per_node, nodes=p.nodes,
                       free_gpus=p.free_gpus if p.free_gpus is not None else p.gpus_per_node)
        for p in valid.inventory)
    return PlanRequest(model, training, objective, inventory, tuple(valid.gpu_types or ()),
                       model_hf_config=_hf_config(valid),
                       layout=layout_wire.to_request(valid.layout) if valid.layout else None,
                       prices_provider=valid.prices_provider)


def parse_estimate_request(body: Any) -> EstimateRequest:
    """Validate a decoded `POST /v1/estimate` body; InvalidFieldsError lists every bad field."""
    valid: EstimateRequestBody = _validated(EstimateRequestBody, body)
    problems: list[tuple[str, str]] = []
    model = _model(valid, problems)
    training = _training(valid.training, problems)
    _raise_if_any(problems)
    return EstimateRequest(model, training, tuple(valid.devices or ()),
                           model_hf_config=_hf_config(valid),
                           layout=layout_wire.to_request(valid.layout) if valid.layout else None)


MAX_ACTIVATE_REASON_CHARS = 4000
"""Longest reason stored with an activation (the database's limit too)."""
MAX_BUNDLE_VERSION = 2**31 - 1
"""Versions are the database's INTEGER keys; a larger path number cannot name one."""


class ActivateBody(_Body):
    """`POST /v1/models/{version}/activate`: why (optional; the body may be absent)."""

    reason: str = Field("", max_length=MAX_ACTIVATE_REASON_CHARS,
                        description="Stored with the activation, e.g. \"rollback: v8 "
                                    "underestimates H100\".")


def parse_activate_request(body: Any) -> str:
    """The reason of an activate request (None, an absent body: no reason)."""
    if body is None:
        return ""
    valid: ActivateBody = _validated(ActivateBody, body)
    return valid.reason


def parse_outcome_request(body: Any) -> OutcomeRequest:
    """Validate a decoded job outcome body; InvalidFieldsError lists every bad field."""
    valid: OutcomeBody = _validated(OutcomeBody, body)
    return OutcomeRequest(
        job_uid=valid.job_uid, gpu_type=valid.gpu_type, gpu_count=valid.gpu_count,
        estimated_seconds=valid.estimated_seconds, actual_seconds=valid.actual_seconds,
        model_digest=valid.model_digest,
        calibration_factor=(valid.calibration_factor
                            if valid.calibration_factor is not None else 1.0),
        scaling=OutcomeScaling(
            gpus_per_node=valid.gpus_per_node, nodes=valid.nodes,
            per_gpu_batch=valid.per_gpu_batch, steps=valid.steps,
            forward_ms=valid.forward_ms, backward_ms=valid.backward_ms,
            optimizer_ms=valid.optimizer_ms, gradient_bytes=valid.gradient_bytes,
            intra_node_gbps=valid.intra_node_gbps),
        workload_id=valid.workload_id, namespace=valid.namespace)
