"""Wire types of the estimator service: JSON request → typed request, plan → JSON (pure).

`POST /v1/plans` request::

    {"model_onnx_b64": "...",
     "training": {"batch_size": 64, "dataset_size": 1281167, "epochs": 1, "optimizer": "adamw",
                  "precision": "fp32", "mode": "train", "dims": {"sequence": 1024}},
     "objective": {"prefer": "cheapest", "deadline_seconds": 14400, "budget_usd": null,
                   "max_gpus": 8},
     "inventory": [{"gpu_type": "NVIDIA-H100-80GB-HBM3", "gpus_per_node": 8, "nodes": 4,
                    "free_gpus": 32}],
     "gpu_types": []}

Instead of ``model_onnx_b64`` a request may carry ``model_hf_config``: a Hugging Face
config.json object, built into its graph by `graph.exporting` (GPT-2, BERT and OPT without
torch; other architectures need torch and transformers in the estimator's image).

Errors are every invalid field at once, each with its JSON path.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpuplan_estimator.core import limits, options
from gpuplan_estimator.core.errors import InvalidRequestError
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
MAX_DEADLINE_SECONDS = 10 * 365 * 86400.0
"""Longest deadline or job duration accepted (ten years); anything longer is a typo or hostile."""
MAX_BUDGET_USD = 1e12
MAX_CALIBRATION_FACTOR = 1e3
"""Largest calibration factor an outcome may carry (the planner clips factors to x4 anyway)."""


class _Errors:
    """Field errors of one request: the first `MAX_REPORTED_ERRORS` kept, the rest counted."""

    def __init__(self) -> None:
        self.items: list[tuple[str, str]] = []
        self.dropped = 0

    def add(self, path: str, message: str) -> None:
        if len(self.items) < MAX_REPORTED_ERRORS:
            self.items.append((path, message))
        else:
            self.dropped += 1

    def raise_if_any(self) -> None:
        if not self.items:
            return
        details = tuple(f"{p}: {m}" for p, m in self.items)
        more = f"; and {self.dropped} more" if self.dropped else ""
        raise InvalidRequestError(", ".join(p for p, _ in self.items),
                                  "; ".join(details) + more, details)


def _int(obj: Mapping[str, Any], key: str, path: str, errs: _Errors, *, maximum: int,
         minimum: int = 1, default: int | None = None) -> int:
    value = obj.get(key, default)
    if value is None:
        errs.add(f"{path}.{key}", "is required")
        return minimum
    if isinstance(value, bool) or not isinstance(value, int):
        errs.add(f"{path}.{key}", f"must be an integer, got {type(value).__name__}")
        return minimum
    if not minimum <= value <= maximum:
        shown = str(value) if value.bit_length() < 128 else f"a {value.bit_length()}-bit integer"
        errs.add(f"{path}.{key}", f"must be between {minimum} and {maximum}, got {shown}")
        return minimum
    return value


def _choice(obj: Mapping[str, Any], key: str, path: str, errs: _Errors, choices: tuple[str, ...],
            default: str) -> str:
    value = obj.get(key, default)
    if value not in choices:
        errs.add(f"{path}.{key}", f"must be one of {', '.join(choices)}, got {value!r}")
        return default
    return str(value)


def _positive_float(obj: Mapping[str, Any], key: str, path: str, errs: _Errors, *,
                    maximum: float) -> float | None:
    value = obj.get(key)
    if value is None:
        return None
    if (isinstance(value, bool) or not isinstance(value, int | float)
            or not 0 < value <= maximum):  # NaN and Infinity fail this too
        errs.add(f"{path}.{key}", f"must be a number in (0, {maximum:g}], got {value!r:.40}")
        return None
    return float(value)


def _mapping(body: Mapping[str, Any], key: str, errs: _Errors) -> Mapping[str, Any]:
    value = body.get(key, {})
    if not isinstance(value, Mapping):
        errs.add(key, "must be an object")
        return {}
    return value


def parse_training(obj: Mapping[str, Any], errs: _Errors, path: str = "training"
                   ) -> TrainingRequest:
    """The ``training`` object as a TrainingRequest; problems are added to `errs`."""
    dims = _parse_dims(obj.get("dims", {}) or {}, f"{path}.dims", errs)
    batch = _int(obj, "batch_size", path, errs, maximum=limits.MAX_BATCH_SIZE)
    too_big = limits.sample_elements_error(batch, dims)
    if too_big is not None:
        errs.add(f"{path}.dims", too_big)
    return TrainingRequest(
        batch_size=batch,
        dataset_size=_int(obj, "dataset_size", path, errs, default=obj.get("batch_size"),
                          maximum=limits.MAX_DATASET_SIZE),
        epochs=_int(obj, "epochs", path, errs, default=1, maximum=limits.MAX_EPOCHS),
        optimizer=_choice(obj, "optimizer", path, errs, options.OPTIMIZERS,
                          options.DEFAULT_OPTIMIZER),
        precision=_choice(obj, "precision", path, errs, options.PRECISIONS,
                          options.DEFAULT_PRECISION),
        mode=_choice(obj, "mode", path, errs, options.MODES, options.DEFAULT_MODE),
        dims=dims,
    )


def _parse_dims(raw: Any, path: str, errs: _Errors) -> dict[str, int]:
    """``dims``: at most `MAX_DIMS` names, each bound to an integer in [1, MAX_DIM]."""
    if not isinstance(raw, Mapping):
        errs.add(path, "must be an object of name -> positive integer")
        return {}
    if len(raw) > limits.MAX_DIMS:
        errs.add(path, f"at most {limits.MAX_DIMS} dims, got {len(raw)}")
        return {}
    dims: dict[str, int] = {}
    for name in raw:
        if len(name) > limits.MAX_DIM_NAME_CHARS:
            errs.add(path, f"a dim name is longer than {limits.MAX_DIM_NAME_CHARS} characters")
            continue
        dims[str(name)] = _int(raw, name, path, errs, maximum=limits.MAX_DIM)
    return dims


def parse_model(body: Mapping[str, Any], errs: _Errors) -> tuple[bytes, Mapping[str, Any] | None]:
    """The model of a request: ONNX bytes from ``model_onnx_b64``, or a Hugging Face config
    object from ``model_hf_config`` (exactly one; bytes empty then). Problems go to `errs`."""
    text, config = body.get("model_onnx_b64"), body.get("model_hf_config")
    if (config is None) == (text is None):
        errs.add("model_onnx_b64", "give exactly one of model_onnx_b64 (base64 of the ONNX "
                 "graph) and model_hf_config (a Hugging Face config.json object)")
        return b"", None
    if config is not None:
        if not isinstance(config, Mapping) or not isinstance(config.get("model_type"), str):
            errs.add("model_hf_config", "must be a Hugging Face config.json object with a "
                     "model_type")
            return b"", None
        return b"", config
    if not isinstance(text, str) or not text:
        errs.add("model_onnx_b64", "is required (base64 of the ONNX graph)")
        return b"", None
    try:
        return base64.b64decode(text, validate=True), None
    except (binascii.Error, ValueError):
        errs.add("model_onnx_b64", "is not valid base64")
        return b"", None


def parse_plan_request(body: Any) -> PlanRequest:
    """Validate a plan request body; InvalidRequestError lists every bad field."""
    if not isinstance(body, Mapping):
        raise InvalidRequestError("body", "must be a JSON object")
    errs = _Errors()
    model, config = parse_model(body, errs)
    training = parse_training(_mapping(body, "training", errs), errs)
    obj = _mapping(body, "objective", errs)
    objective = Objective(
        prefer=_choice(obj, "prefer", "objective", errs, options.OBJECTIVES,
                       options.DEFAULT_OBJECTIVE),
        max_gpus=_int(obj, "max_gpus", "objective", errs, default=options.DEFAULT_MAX_GPUS,
                       maximum=options.MAX_GPUS_CAP),
        deadline_seconds=_positive_float(obj, "deadline_seconds", "objective", errs,
                                         maximum=MAX_DEADLINE_SECONDS),
        budget_usd=_positive_float(obj, "budget_usd", "objective", errs,
                                   maximum=MAX_BUDGET_USD),
    )
    inventory = _parse_inventory(body.get("inventory"), errs)
    gpu_types = body.get("gpu_types") or []
    if not isinstance(gpu_types, list) or not all(isinstance(t, str) for t in gpu_types):
        errs.add("gpu_types", "must be a list of GPU type names")
        gpu_types = []
    errs.raise_if_any()
    return PlanRequest(model, training, objective, inventory, tuple(gpu_types),
                       model_hf_config=config)


def _parse_inventory(raw: Any, errs: _Errors) -> tuple[InventoryEntry, ...]:
    if not isinstance(raw, list) or not raw:
        errs.add("inventory", "must be a non-empty list of GPU pools")
        return ()
    if len(raw) > MAX_INVENTORY_POOLS:
        errs.add("inventory", f"at most {MAX_INVENTORY_POOLS} GPU pools, got {len(raw)}")
        return ()
    out = []
    for i, entry in enumerate(raw):
        path = f"inventory[{i}]"
        if not isinstance(entry, Mapping) or not isinstance(entry.get("gpu_type"), str):
            errs.add(f"{path}.gpu_type", "is required")
            continue
        out.append(InventoryEntry(
            gpu_type=entry["gpu_type"],
            gpus_per_node=_int(entry, "gpus_per_node", path, errs,
                               maximum=limits.MAX_GPUS_PER_NODE),
            nodes=_int(entry, "nodes", path, errs, default=1, maximum=limits.MAX_NODES_PER_POOL),
            free_gpus=_int(entry, "free_gpus", path, errs, minimum=0,
                           maximum=limits.MAX_GPUS_PER_NODE * limits.MAX_NODES_PER_POOL,
                           default=entry.get("gpus_per_node")),
        ))
    return tuple(out)


def error_json(reason: str, message: str, details: list[str] | None = None) -> dict[str, Any]:
    """The JSON error body: reason, message and per-field details."""
    return {"error": {"reason": reason, "message": message, "details": details or []}}


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


def parse_outcome_request(body: Any) -> OutcomeRequest:
    """Validate a job outcome body; InvalidRequestError lists every bad field."""
    if not isinstance(body, Mapping):
        raise InvalidRequestError("body", "must be a JSON object")
    errs = _Errors()
    texts = {}
    for key in ("job_uid", "gpu_type"):
        value = body.get(key)
        if not isinstance(value, str) or not value:
            errs.add(key, "is required (non-empty string)")
        texts[key] = str(value or "")
    seconds: dict[str, float | None] = {}
    for key in ("estimated_seconds", "actual_seconds"):
        if body.get(key) is None:
            errs.add(f"outcome.{key}", "is required")
        seconds[key] = _positive_float(body, key, "outcome", errs,
                                       maximum=MAX_DEADLINE_SECONDS)
    digest = body.get("model_digest", "")
    factor = _positive_float(body, "calibration_factor", "outcome", errs,
                             maximum=MAX_CALIBRATION_FACTOR)
    outcome = OutcomeRequest(
        job_uid=texts["job_uid"], gpu_type=texts["gpu_type"],
        gpu_count=_int(body, "gpu_count", "outcome", errs, maximum=options.MAX_GPUS_CAP),
        estimated_seconds=seconds["estimated_seconds"] or 0.0,
        actual_seconds=seconds["actual_seconds"] or 0.0,
        model_digest=digest if isinstance(digest, str) else "",
        calibration_factor=factor or 1.0,
    )
    errs.raise_if_any()
    return outcome


def parse_estimate_request(body: Any) -> EstimateRequest:
    """`POST /v1/estimate` body → request; every invalid field at once."""
    if not isinstance(body, Mapping):
        raise InvalidRequestError("body", "must be a JSON object")
    errs = _Errors()
    model, config = parse_model(body, errs)
    training = parse_training(_mapping(body, "training", errs), errs)
    names = body.get("devices") or []
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        errs.add("devices", "must be a list of device names")
        names = []
    errs.raise_if_any()
    return EstimateRequest(model, training, tuple(names), model_hf_config=config)
