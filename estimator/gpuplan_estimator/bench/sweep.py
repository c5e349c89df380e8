"""Sweep specs (YAML) and deterministic sampling of single-kernel benchmark plans.

A spec file describes one kernel family: the ops to draw from, a distribution per canonical dim
(`workload.py`) and per-device-kind limits on FLOPs and bytes so a CPU run stays short. Wide
spaces are random-uniformly subsampled (log-uniform for sizes), never enumerated.

Dim distributions: ``7`` (constant), ``{choice: [...]}``, ``{int: [lo, hi]}`` (uniform),
``{log: [lo, hi]}`` (log-uniform integer), ``{aligned: [lo, hi, step]}`` (log-uniform, rounded
to a multiple of step: the hidden sizes and channel counts models have), ``{ref: other}`` (same
value as an earlier dim), ``{half: other}`` (earlier dim // 2, e.g. "same" padding).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from gpuplan_estimator.bench import shapes
from gpuplan_estimator.core import errors, kernels
from gpuplan_estimator.core.layers import DTYPE_BYTES

KERNELS = kernels.BENCHED_KERNELS
MAX_ATTEMPTS_PER_SAMPLE = 2000
MAX_SPEC_BYTES = 1 << 20


@dataclass(frozen=True)
class Limits:
    """Caps on a sampled item's forward FLOPs and bytes moved, for one device kind."""
    max_flops: float
    max_bytes: float


@dataclass(frozen=True)
class SweepSpec:
    """One parsed sweep YAML file: kernel family, ops, dim distributions and limits."""
    kernel: str
    ops: tuple[str, ...]
    dims: Mapping[str, Any]
    limits: Mapping[str, Limits]  # by device kind: "cpu", "cuda"
    weight: float
    dtype: str
    path: str
    digest: str  # sha256 of the file text


@dataclass(frozen=True)
class PlanItem:
    """One kernel to benchmark: family, op, dtype and canonical dims."""
    kernel: str
    op: str
    dtype: str
    dims: Mapping[str, int]

    def key(self) -> tuple[str, str, str, str]:
        """Identity of the item as (kernel, op, dtype, canonical dims JSON)."""
        return (self.kernel, self.op, self.dtype, dims_json(self.dims))

    def to_json(self) -> dict[str, Any]:
        """The item as a JSON-ready mapping (the form stored in a run's plan)."""
        return {"kernel": self.kernel, "op": self.op, "dtype": self.dtype, "dims": dict(self.dims)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PlanItem:
        """Rebuild an item from its `to_json` mapping."""
        dims = {str(k): int(v) for k, v in data["dims"].items()}
        return cls(str(data["kernel"]), str(data["op"]), str(data["dtype"]), dims)


def dims_json(dims: Mapping[str, int]) -> str:
    """Dims as compact JSON with sorted keys, so equal dims give equal strings."""
    return json.dumps({k: int(v) for k, v in sorted(dims.items())}, separators=(",", ":"))


def load_spec(path: str | Path) -> SweepSpec:
    """Parse and validate one sweep YAML file; errors name the file and the field."""
    p = Path(path)
    try:
        raw_bytes = p.read_bytes()
    except OSError as exc:
        raise errors.GpuplanError(f"{p}: cannot read sweep spec: {exc}") from exc
    if len(raw_bytes) > MAX_SPEC_BYTES:
        raise errors.GpuplanError(f"{p}: sweep spec larger than {MAX_SPEC_BYTES} bytes")
    try:
        raw = yaml.safe_load(raw_bytes)
    except yaml.YAMLError as exc:
        raise errors.GpuplanError(f"{p}: invalid YAML: {exc}") from exc
    if not isinstance(raw, dict):
        raise errors.GpuplanError(f"{p}: a sweep spec must be a mapping")
    kernel = _field(raw, "kernel", p)
    if kernel not in KERNELS:
        raise errors.GpuplanError(f"{p}: kernel {kernel!r} not one of {', '.join(KERNELS)}")
    ops = _field(raw, "ops", p)
    dims = _field(raw, "dims", p)
    limits_raw = _field(raw, "limits", p)
    if not isinstance(ops, list) or not ops:
        raise errors.GpuplanError(f"{p}: ops must be a non-empty list")
    if not isinstance(dims, dict) or not dims:
        raise errors.GpuplanError(f"{p}: dims must be a non-empty mapping")
    for name, dist in dims.items():
        _check_dist(dist, f"{p}: dims.{name}", seen=list(dims)[: list(dims).index(name)])
    limits = {}
    for kind, lim in (limits_raw or {}).items():
        try:
            limits[str(kind)] = Limits(float(lim["max_flops"]), float(lim["max_bytes"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise errors.GpuplanError(
                f"{p}: limits.{kind} needs numeric max_flops and max_bytes"
            ) from exc
    dtype = str(raw.get("dtype", "float32"))
    if dtype not in DTYPE_BYTES:
        raise errors.GpuplanError(f"{p}: dtype {dtype!r} unknown")
    return SweepSpec(
        kernel=kernel,
        ops=tuple(str(o) for o in ops),
        dims=dims,
        limits=limits,
        weight=float(raw.get("weight", 1.0)),
        dtype=dtype,
        path=str(p),
        digest=hashlib.sha256(raw_bytes).hexdigest(),
    )


def _field(raw: Mapping[str, Any], name: str, path: Path) -> Any:
    if name not in raw:
        raise errors.GpuplanError(f"{path}: missing field {name!r}")
    return raw[name]


def _check_dist(dist: Any, where: str, seen: Sequence[str]) -> None:
    if isinstance(dist, int) and not isinstance(dist, bool):
        return
    if not isinstance(dist, dict) or len(dist) != 1:
        raise errors.GpuplanError(f"{where}: expected an int or a one-key mapping")
    (kind, arg), = dist.items()
    if kind == "choice":
        if not isinstance(arg, list) or not arg or not all(isinstance(v, int) for v in arg):
            raise errors.GpuplanError(f"{where}: choice needs a non-empty list of ints")
    elif kind in ("int", "log"):
        ok = isinstance(arg, list) and len(arg) == 2 and all(isinstance(v, int) for v in arg)
        if not ok or arg[0] > arg[1] or (kind == "log" and arg[0] < 1):
            raise errors.GpuplanError(f"{where}: {kind} needs [lo, hi] ints with lo <= hi")
    elif kind == "aligned":
        ok = isinstance(arg, list) and len(arg) == 3 and all(isinstance(v, int) for v in arg)
        if not ok or not 1 <= arg[2] <= arg[0] <= arg[1]:
            raise errors.GpuplanError(f"{where}: aligned needs [lo, hi, step] ints with "
                                      f"1 <= step <= lo <= hi")
    elif kind in ("ref", "half"):
        if arg not in seen:
            raise errors.GpuplanError(f"{where}: {kind} must name an earlier dim, got {arg!r}")
    else:
        raise errors.GpuplanError(f"{where}: unknown distribution {kind!r}")


def load_specs(paths: Sequence[str | Path]) -> list[SweepSpec]:
    """Specs from files and directories (``*.yaml`` inside), sorted by kernel then path."""
    files: list[Path] = []
    for path in paths:
        p = Path(path)
        files.extend(sorted(p.glob("*.yaml")) if p.is_dir() else [p])
    if not files:
        raise errors.GpuplanError(
            f"no sweep specs found in {', '.join(map(str, paths))}; pass --sweep PATH"
        )
    return sorted((load_spec(f) for f in files), key=lambda s: (s.kernel, s.path))


def _draw(dist: Any, rng: np.random.Generator, drawn: Mapping[str, int]) -> int:
    if isinstance(dist, int):
        return dist
    (kind, arg), = dist.items()
    if kind == "choice":
        return int(arg[int(rng.integers(len(arg)))])
    if kind == "int":
        return int(rng.integers(arg[0], arg[1] + 1))
    if kind == "log":
        value = math.exp(rng.uniform(math.log(arg[0]), math.log(arg[1] + 1)))
        return int(min(max(math.floor(value), arg[0]), arg[1]))
    if kind == "aligned":
        lo, hi, step = arg
        value = math.exp(rng.uniform(math.log(lo), math.log(hi + 1)))
        return int(min(max(round(value / step) * step, step), hi - hi % step))
    if kind == "ref":
        return drawn[arg]
    return drawn[arg] // 2  # half


def sample_items(
    spec: SweepSpec, count: int, device_kind: str, rng: np.random.Generator
) -> list[PlanItem]:
    """`count` distinct valid items under the spec's limits for `device_kind`."""
    if device_kind not in spec.limits:
        raise errors.GpuplanError(f"{spec.path}: no limits for device kind {device_kind!r}")
    lim = spec.limits[device_kind]
    items: dict[tuple[str, str, str, str], PlanItem] = {}
    attempts = 0
    while len(items) < count:
        attempts += 1
        if attempts > MAX_ATTEMPTS_PER_SAMPLE * max(count, 1):
            raise errors.GpuplanError(
                f"{spec.path}: could only sample {len(items)} of {count} items within limits"
            )
        op = spec.ops[int(rng.integers(len(spec.ops)))]
        dims: dict[str, int] = {}
        for name, dist in spec.dims.items():
            dims[name] = _draw(dist, rng, dims)
        dims = shapes.canonical(spec.kernel, op, dims)
        if not shapes.valid(spec.kernel, dims):
            continue
        flops, nbytes = shapes.cost(spec.kernel, op, dims, spec.dtype)
        if flops > lim.max_flops or nbytes > lim.max_bytes:
            continue
        item = PlanItem(spec.kernel, op, spec.dtype, dims)
        items.setdefault(item.key(), item)
    return list(items.values())


def allocate(weights: Sequence[float], total: int) -> list[int]:
    """Split `total` samples by weight (largest remainder; deterministic)."""
    wsum = sum(weights)
    if wsum <= 0:
        raise errors.GpuplanError("sweep spec weights must sum to a positive number")
    exact = [total * w / wsum for w in weights]
    counts = [math.floor(x) for x in exact]
    order = sorted(range(len(weights)), key=lambda i: (-(exact[i] - counts[i]), i))
    for i in order[: total - sum(counts)]:
        counts[i] += 1
    return counts


def sample_plan(
    specs: Sequence[SweepSpec],
    *,
    samples: int,
    seed: int,
    device_kind: str,
    families: Sequence[str] | None = None,
) -> list[PlanItem]:
    """A deterministic plan: the same specs, samples, seed and device kind give the same list.

    Items are interleaved across families so a budget-limited run still covers every family.
    """
    chosen = [s for s in specs if families is None or s.kernel in families]
    if families is not None:
        unknown = sorted(set(families) - {s.kernel for s in specs})
        if unknown:
            raise errors.GpuplanError(f"no sweep spec for famil(ies): {', '.join(unknown)}")
    if samples < 1:
        raise errors.InvalidRequestError("samples", f"must be >= 1, got {samples}")
    counts = allocate([s.weight for s in chosen], samples)
    per_family: list[list[PlanItem]] = []
    for i, (spec, n) in enumerate(zip(chosen, counts, strict=True)):
        rng = np.random.default_rng([seed, i])
        per_family.append(sample_items(spec, n, device_kind, rng))
    plan: list[PlanItem] = []
    for k in range(max((len(f) for f in per_family), default=0)):
        plan.extend(f[k] for f in per_family if k < len(f))
    return plan


def plan_digest(specs: Sequence[SweepSpec], **params: Any) -> str:
    """Identity of a sampled plan: spec contents plus sampling parameters."""
    h = hashlib.sha256()
    for s in specs:
        h.update(s.digest.encode())
    h.update(json.dumps(params, sort_keys=True, default=str).encode())
    return h.hexdigest()[:32]
