"""Precisions a benchmark sweeps: fp32, tf32 and bf16 versions of every float32 plan item.

A sweep spec names one dtype (float32 for the float families). ``--precisions`` turns each
float32 item into one item per precision:

- ``fp32``: float32 tensors, IEEE float32 math (TF32 switched off for matmul and cuDNN).
- ``tf32``: float32 tensors with TF32 tensor-core math, only for the kernels where the estimator
  prices it (`step.backward.math_attributes`: gemm, conv2d); other kernels do no matmul, so a
  tf32 row would repeat the fp32 one. The row says so with the dim `TF32_DIM` = 1: dims are the
  only free-form part of a measurement row's key, so the tf32 and fp32 rows of one shape stay
  two rows (training reads only each kernel's canonical dims and ignores the extra one).
- ``bf16``: bfloat16 tensors.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from gpuplan_estimator.bench.sweep import PlanItem
from gpuplan_estimator.core import errors
from gpuplan_estimator.core.precisions import TF32_DIM
from gpuplan_estimator.step.backward import math_attributes

PRECISIONS = ("fp32", "tf32", "bf16")
_FLOAT_SOURCE = "float32"
_DTYPE_OF = {"fp32": "float32", "tf32": "float32", "bf16": "bfloat16"}


def parse_precisions(text: str) -> tuple[str, ...]:
    """``fp32,tf32,bf16`` → a tuple in that order; unknown or repeated names are an error."""
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    if not names:
        raise errors.InvalidRequestError("precisions", "empty list")
    unknown = [n for n in names if n not in PRECISIONS]
    if unknown:
        raise errors.InvalidRequestError(
            "precisions", f"unknown {', '.join(unknown)}; expected some of {', '.join(PRECISIONS)}")
    if len(set(names)) != len(names):
        raise errors.InvalidRequestError("precisions", f"repeated name in {text!r}")
    return names


def applies(kernel: str, precision: str) -> bool:
    """Whether `precision` gives `kernel` a row of its own (tf32 only where math changes)."""
    if precision == "tf32":
        return math_attributes(kernel, "tf32").get("math") == "tf32"
    return precision in _DTYPE_OF


def expand(plan: Sequence[PlanItem], precisions: Sequence[str]) -> list[PlanItem]:
    """One item per (float32 item, precision that applies); other dtypes pass through once.

    Order: item by item, precisions in the given order, so a budget-limited run covers every
    precision of the items it reaches.
    """
    out: list[PlanItem] = []
    for item in plan:
        if item.dtype != _FLOAT_SOURCE:
            out.append(item)
            continue
        for p in precisions:
            if applies(item.kernel, p):
                out.append(with_precision(item, p))
    return out


def with_precision(item: PlanItem, precision: str) -> PlanItem:
    """`item` (float32) as measured in `precision`."""
    dims: Mapping[str, int] = {k: v for k, v in item.dims.items() if k != TF32_DIM}
    if precision == "tf32":
        dims = {**dims, TF32_DIM: 1}
    return PlanItem(item.kernel, item.op, _DTYPE_OF[precision], dims)


def precision_of(item: PlanItem) -> str:
    """The precision an item is measured in: fp32/tf32/bf16, else its dtype (e.g. float16)."""
    if item.dtype == "bfloat16":
        return "bf16"
    if item.dtype == _FLOAT_SOURCE:
        return "tf32" if item.dims.get(TF32_DIM) == 1 else "fp32"
    return item.dtype


def family_of(item: PlanItem) -> str:
    """The family the stop rule and the rate report group by: ``kernel/precision``."""
    return f"{item.kernel}/{precision_of(item)}"
