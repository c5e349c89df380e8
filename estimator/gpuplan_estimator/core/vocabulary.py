"""Names more than one package spells: the one source of each (issue #31).

The estimator's stages, its HTTP service and the operator (which imports this module) read
these instead of repeating the literals; `tests/unit/estimator/test_vocabulary.py` checks that
every user, the CRD and the copies that must stay literal (a regex in the OpenAPI schema) agree.
Caps on sizes live beside them in `core.limits`.
"""

from __future__ import annotations

import re

from gpuplan_estimator.core.errors import InvalidRequestError

SEQUENCE_DIM = "sequence"
"""The symbolic dim name of a text model's sequence length: `--dim sequence=S`, a request's
`dims.sequence`, a TrainingJob's `training.sequenceLength`; re-sequencing a fixed export binds
axis 1 of its integer inputs to it."""

CAST_OP = "cast"
"""The elementwise op of a dtype conversion: autocast's casts on the step (`step.autocast`),
the bench's cast rows (`bench.shapes`), one code of the elementwise model's op feature
(`cost.features.ELEMENTWISE_OPS`)."""

WORKLOAD_ID_CHARS = 64
"""A plan workload's id is a SHA-256 of its content, in hex."""
WORKLOAD_ID_PATTERN = f"[0-9a-f]{{{WORKLOAD_ID_CHARS}}}"
"""A workload id as issued: lowercase hex digits only (a regex, to be matched whole)."""
_WORKLOAD_ID = re.compile(WORKLOAD_ID_PATTERN)


NAMESPACE_PATTERN = "[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?"
"""A Kubernetes namespace name (an RFC 1123 label, at most 63 characters; a regex, matched
whole): whose job an outcome is, for the calibration's per-tenant weights (issue #33)."""
_NAMESPACE = re.compile(NAMESPACE_PATTERN)


def check_namespace(value: object) -> str:
    """`value` when it is "" (not known) or a namespace name, else `InvalidRequestError`."""
    if not isinstance(value, str) or (value and _NAMESPACE.fullmatch(value) is None):
        raise InvalidRequestError(
            "namespace", f"must be a Kubernetes namespace name (RFC 1123 label), got {value!r}")
    return value


def check_workload_id(value: object) -> str:
    """`value` when it is a workload id as issued, else `InvalidRequestError` on `workload_id`."""
    if not isinstance(value, str) or _WORKLOAD_ID.fullmatch(value) is None:
        raise InvalidRequestError(
            "workload_id", f"must be {WORKLOAD_ID_CHARS} lowercase hex digits, got {value!r}")
    return value


MODEL_COMPRESSION_MAGIC: dict[str, bytes] = {
    "gzip": b"\x1f\x8b", "xz": b"\xfd7zXZ\x00", "zstd": b"\x28\xb5\x2f\xfd"}
"""The compressions a model's bytes may come in, each with the magic bytes it starts with."""
MODEL_COMPRESSIONS: tuple[str, ...] = tuple(MODEL_COMPRESSION_MAGIC)
MODEL_FORMATS: tuple[str, ...] = ("auto", "raw", *MODEL_COMPRESSIONS)
"""A TrainingJob's `spec.model.format`: detect by magic (`auto`), plain ONNX (`raw`), or one
compression, checked against the bytes."""

MEMORY_PARTS: tuple[str, ...] = (
    "parameters_bytes", "gradients_bytes", "optimizer_state_bytes", "activations_bytes",
    "workspace_bytes", "framework_overhead_bytes")
"""The parts of one GPU's step memory, in drawing order (what the model owns first): the fields
of `step.memory.MemoryBreakdown`, an estimate's `memory` (JSON and HTTP), the memory plot."""
SHARDED_MEMORY_PARTS: tuple[str, ...] = (
    *MEMORY_PARTS, "gathered_parameters_bytes", "recompute_bytes", "host_bytes",
    "expert_states_bytes", "dispatch_buffers_bytes")
"""The parts under a memory strategy (`parallel.sharding.StrategyMemory`, a plan candidate's
`memory`, a TrainingJob's `status.plan.memoryBytesByPart`); `host_bytes` is offloaded to host
memory, so it is not in the total; `expert_states_bytes` (a mixture of experts' weights,
gradients and optimizer state on the rank) is part of the first three."""
MEMORY_TOTAL = "total_bytes"
"""The key of the parts' sum (what the fit compares with the card's usable memory)."""
