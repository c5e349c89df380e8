"""Pure validation of a TrainingJob spec: every error with its field path, then a typed view."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from gpuplan_estimator.core import options, vocabulary
from gpuplan_estimator.core.durations import parse_duration_seconds
from gpuplan_operator.core import errors, resources

OPTIMIZERS = frozenset(options.OPTIMIZERS)
OPTIMIZER_IMPLS = frozenset(options.OPTIMIZER_IMPLS)
PRECISIONS = frozenset(options.PRECISIONS)
ATTENTIONS = frozenset(options.ATTENTIONS)
PREFERENCES = frozenset(options.OBJECTIVES)
FORMATS = frozenset(vocabulary.MODEL_FORMATS)
MAX_TRAINING_JOB_DIMS = 32
"""Named dims a TrainingJob may carry: the CRD's `training.dims` maxProperties (tested equal),
below what one estimator request may carry (`limits.MAX_DIMS`)."""
DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
"""RFC 1123 label: a LocalQueue name must also be a label value (`kueue.x-k8s.io/queue-name`)."""


def validate_spec(spec: Mapping[str, Any]) -> list[str]:
    """All problems of `spec`, each prefixed with its field path; empty when valid."""
    out: list[str] = []
    _check_model(spec.get("model"), out)
    _check_training(spec.get("training"), out)
    _check_objective(spec.get("objective", {}), out)
    _check_gpu_types(spec.get("gpuTypes", []), out)
    _check_template(spec.get("template"), out)
    _check_kueue(spec.get("kueue", {}), out)
    _check_layout(spec.get("layout", {}), out)
    _check_scheduling(spec.get("scheduling", {}), out)
    return out


def parse_spec(spec: Mapping[str, Any]) -> resources.TrainingJobSpec:
    """Typed view of a valid spec; raises InvalidSpecError listing every problem."""
    problems = validate_spec(spec)
    if problems:
        raise errors.InvalidSpecError(problems)
    model = spec["model"]
    onnx = model.get("onnx") or {}
    ref = (onnx or model.get("hfConfig") or {}).get("configMapKeyRef") or {}
    training, objective = spec["training"], spec.get("objective", {})
    deadline = objective.get("deadline")
    return resources.TrainingJobSpec(
        model=resources.ModelRef(
            config_map_name=ref.get("name"), config_map_key=ref.get("key"),
            url=onnx.get("url"), format=model.get("format", "auto"),
            hf_config="hfConfig" in model,
        ),
        training=resources.Training(
            batch_size=int(training["batchSize"]), dataset_size=int(training["datasetSize"]),
            epochs=int(training["epochs"]),
            optimizer=training.get("optimizer", options.DEFAULT_OPTIMIZER),
            optimizer_impl=training.get("optimizerImpl", options.DEFAULT_OPTIMIZER_IMPL),
            precision=training.get("precision", options.DEFAULT_PRECISION),
            attention=training.get("attention", options.DEFAULT_ATTENTION),
            sequence_length=training.get("sequenceLength"),
            dims={str(k): int(v) for k, v in (training.get("dims") or {}).items()},
        ),
        objective=resources.ObjectiveSpec(
            prefer=objective.get("prefer", options.DEFAULT_OBJECTIVE),
            deadline_seconds=float(parse_duration_seconds(deadline)) if deadline else None,
            budget_usd=float(objective["budget"]) if "budget" in objective else None,
            max_gpus=int(objective.get("maxGpus", options.DEFAULT_MAX_GPUS)),
        ),
        gpu_types=tuple(spec.get("gpuTypes") or ()),
        template=spec["template"],
        local_queue=(spec.get("kueue") or {}).get("localQueue"),
        layout=_layout(spec.get("layout")),
        gpuplan_scheduler=(spec.get("scheduling") or {}).get("gpuplanScheduler"),
    )


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _check_int(obj: Mapping[str, Any], key: str, path: str, lo: int, hi: int,
               out: list[str], *, required: bool) -> None:
    if key not in obj:
        if required:
            out.append(f"{path}.{key}: required")
        return
    v = obj[key]
    if not _is_int(v):
        out.append(f"{path}.{key}: must be an integer, got {v!r}")
    elif not lo <= v <= hi:
        out.append(f"{path}.{key}: must be in [{lo}, {hi}], got {v}")


def _check_enum(obj: Mapping[str, Any], key: str, path: str, allowed: frozenset[str],
                out: list[str]) -> None:
    if key in obj and obj[key] not in allowed:
        out.append(f"{path}.{key}: must be one of {sorted(allowed)}, got {obj[key]!r}")


def _check_model(model: object, out: list[str]) -> None:
    if not isinstance(model, Mapping):
        out.append("spec.model: required object")
        return
    _check_enum(model, "format", "spec.model", FORMATS, out)
    if ("onnx" in model) == ("hfConfig" in model):
        out.append("spec.model: set exactly one of onnx and hfConfig")
        return
    if "hfConfig" in model:
        config = model["hfConfig"]
        if not isinstance(config, Mapping) or "configMapKeyRef" not in config:
            out.append("spec.model.hfConfig.configMapKeyRef: required object")
            return
        _check_config_map_ref(config["configMapKeyRef"], "spec.model.hfConfig", out)
        return
    onnx = model["onnx"]
    if not isinstance(onnx, Mapping):
        out.append("spec.model.onnx: required object")
        return
    has_ref, has_url = "configMapKeyRef" in onnx, "url" in onnx
    if has_ref == has_url:
        out.append("spec.model.onnx: set exactly one of configMapKeyRef and url")
    if has_ref:
        _check_config_map_ref(onnx["configMapKeyRef"], "spec.model.onnx", out)
    if has_url:
        url = onnx["url"]
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            out.append(f"spec.model.onnx.url: must be an http:// or https:// URL, got {url!r}")


def _check_config_map_ref(ref: object, path: str, out: list[str]) -> None:
    for key in ("name", "key"):
        if not isinstance(ref, Mapping) or not isinstance(ref.get(key), str) or not ref[key]:
            out.append(f"{path}.configMapKeyRef.{key}: required non-empty string")


def _check_training(training: object, out: list[str]) -> None:
    path = "spec.training"
    if not isinstance(training, Mapping):
        out.append(f"{path}: required object")
        return
    _check_int(training, "batchSize", path, 1, 1 << 20, out, required=True)
    _check_int(training, "datasetSize", path, 1, 10**12, out, required=True)
    _check_int(training, "epochs", path, 1, 100_000, out, required=True)
    _check_int(training, "sequenceLength", path, 1, 1 << 20, out, required=False)
    _check_enum(training, "optimizer", path, OPTIMIZERS, out)
    _check_enum(training, "optimizerImpl", path, OPTIMIZER_IMPLS, out)
    impl_problem = options.optimizer_impl_problem(
        str(training.get("optimizer", options.DEFAULT_OPTIMIZER)),
        str(training.get("optimizerImpl", options.DEFAULT_OPTIMIZER_IMPL)))
    if impl_problem is not None:
        out.append(f"{path}.optimizerImpl: {impl_problem}")
    _check_enum(training, "precision", path, PRECISIONS, out)
    _check_enum(training, "attention", path, ATTENTIONS, out)
    dims = training.get("dims", {})
    if not isinstance(dims, Mapping):
        out.append(f"{path}.dims: must be a map of name to integer")
        return
    if len(dims) > MAX_TRAINING_JOB_DIMS:
        out.append(f"{path}.dims: at most {MAX_TRAINING_JOB_DIMS} entries, got {len(dims)}")
    for name in dims:
        _check_int(dims, name, f"{path}.dims", 1, 1 << 30, out, required=True)


def _check_objective(objective: object, out: list[str]) -> None:
    path = "spec.objective"
    if not isinstance(objective, Mapping):
        out.append(f"{path}: must be an object")
        return
    _check_enum(objective, "prefer", path, PREFERENCES, out)
    _check_int(objective, "maxGpus", path, 1, options.MAX_GPUS_CAP, out, required=False)
    if "deadline" in objective:
        d = objective["deadline"]
        if not isinstance(d, str) or not _is_duration(d):
            out.append(f"{path}.deadline: must be a duration like 4h, 90m or 1h30m, got {d!r}")
        elif parse_duration_seconds(d) <= 0:
            out.append(f"{path}.deadline: must be longer than 0s")
    if "budget" in objective:
        b = objective["budget"]
        if isinstance(b, bool) or not isinstance(b, int | float) or not b > 0:
            out.append(f"{path}.budget: must be a number > 0 (USD), got {b!r}")


def _check_gpu_types(gpu_types: object, out: list[str]) -> None:
    if not isinstance(gpu_types, list):
        out.append("spec.gpuTypes: must be a list of strings")
        return
    for i, g in enumerate(gpu_types):
        if not isinstance(g, str) or not g:
            out.append(f"spec.gpuTypes[{i}]: must be a non-empty string")
    if len(set(map(str, gpu_types))) != len(gpu_types):
        out.append("spec.gpuTypes: duplicate entries")


def _check_template(template: object, out: list[str]) -> None:
    path = "spec.template"
    if not isinstance(template, Mapping):
        out.append(f"{path}: required PodTemplateSpec")
        return
    pod_spec = template.get("spec")
    containers = pod_spec.get("containers") if isinstance(pod_spec, Mapping) else None
    if not isinstance(containers, list) or not containers:
        out.append(f"{path}.spec.containers: at least one container is required")
        return
    for i, c in enumerate(containers):
        if not isinstance(c, Mapping) or not c.get("name") or not c.get("image"):
            out.append(f"{path}.spec.containers[{i}]: needs name and image")
    restart = pod_spec.get("restartPolicy") if isinstance(pod_spec, Mapping) else None
    if restart not in (None, "Never"):
        # The Job's podFailurePolicy (manifests.pod_failure_policy) is only valid with Never;
        # the Job, not the kubelet, decides which failures are retried.
        out.append(f"{path}.spec.restartPolicy: must be Never or unset, got {restart!r}")
    for key in ("serviceAccountName", "serviceAccount"):
        account = pod_spec.get(key) if isinstance(pod_spec, Mapping) else None
        if account is not None and (not isinstance(account, str) or not account):
            out.append(f"{path}.spec.{key}: must be a non-empty string")


def _check_kueue(kueue: object, out: list[str]) -> None:
    path = "spec.kueue"
    if not isinstance(kueue, Mapping):
        out.append(f"{path}: must be an object")
        return
    if not kueue:
        return
    name = kueue.get("localQueue")
    if not isinstance(name, str) or not DNS_LABEL.fullmatch(name):
        out.append(f"{path}.localQueue: must be a DNS label (lower-case letters, digits and '-', "
                   f"at most 63 characters), got {name!r}")


LAYOUT_FIELDS = {"gpus": "gpus", "dp": "dp", "tp": "tp", "pp": "pp", "fsdp": "fsdp",
                 "zeroStage": "zero_stage", "checkpointing": "checkpointing",
                 "checkpointFraction": "checkpoint_fraction", "microBatch": "micro_batch",
                 "gradientAccumulation": "gradient_accumulation", "ppSchedule": "pp_schedule",
                 "virtualStages": "virtual_stages", "ep": "ep"}
"""`spec.layout`'s keys, by the estimator's `layout` field each becomes."""
LAYOUT_COUNTS = ("gpus", "dp", "tp", "pp", "microBatch", "gradientAccumulation",
                 "virtualStages", "ep")
LAYOUT_CHOICES = {"fsdp": frozenset({"none", "full", "hybrid"}),
                  "checkpointing": frozenset({"none", "selective", "full", "per-block"}),
                  "ppSchedule": frozenset({"1f1b", "interleaved"})}
MAX_LAYOUT_COUNT = 1 << 24


def _check_layout(layout: object, out: list[str]) -> None:
    """Types and choices; whether the layout can run is the planner's to say (a condition)."""
    path = "spec.layout"
    if not isinstance(layout, Mapping):
        out.append(f"{path}: must be an object")
        return
    if not layout:
        return
    out.extend(f"{path}.{k}: unknown field" for k in layout if k not in LAYOUT_FIELDS)
    for key in LAYOUT_COUNTS:
        _check_int(layout, key, path, 1, MAX_LAYOUT_COUNT, out, required=key in ("gpus", "dp"))
    for key, allowed in LAYOUT_CHOICES.items():
        _check_enum(layout, key, path, allowed, out)
    if "zeroStage" in layout and (not _is_int(layout["zeroStage"])
                                  or layout["zeroStage"] not in (0, 1, 2, 3)):
        out.append(f"{path}.zeroStage: must be one of [0, 1, 2, 3], got {layout['zeroStage']!r}")
    fraction = layout.get("checkpointFraction")
    if fraction is not None and (isinstance(fraction, bool)
                                 or not isinstance(fraction, int | float)
                                 or not 0 < fraction <= 1):
        out.append(f"{path}.checkpointFraction: must be a number in (0, 1], got {fraction!r}")


def _layout(layout: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The estimator's `layout` object of a valid `spec.layout`; None when absent or empty."""
    if not layout:
        return None
    return {LAYOUT_FIELDS[k]: v for k, v in layout.items()}
def _check_scheduling(scheduling: object, out: list[str]) -> None:
    if not isinstance(scheduling, Mapping):
        out.append("spec.scheduling: must be an object")
        return
    choice = scheduling.get("gpuplanScheduler")
    if choice is not None and not isinstance(choice, bool):
        out.append(f"spec.scheduling.gpuplanScheduler: must be true or false, got {choice!r}")


def service_account(template: Mapping[str, Any]) -> str | None:
    """The service account `template` names (serviceAccountName, else the deprecated
    serviceAccount), or None when it names none and the namespace's `default` applies."""
    pod_spec = template.get("spec") or {}
    name = pod_spec.get("serviceAccountName") or pod_spec.get("serviceAccount")
    return str(name) if name else None


def _is_duration(text: str) -> bool:
    try:
        parse_duration_seconds(text)
    except ValueError:
        return False
    return True
