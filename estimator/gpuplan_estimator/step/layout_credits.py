"""The CPU layout credit: NCHWc reorders a conv's benchmark rows timed but a model skips.

onnxruntime runs CPU convolutions in MLAS's blocked NCHWc layout with a ReorderInput and a
ReorderOutput around each. Inside a CNN the reorders between two NCHWc ops cancel (ReLU, Add,
Concat, pooling and folded batch norm keep the layout), while a single-Conv benchmark row pays
both. So each conv whose neighbours keep the layout carries a credit (`LAYOUT_CREDIT`, in
elements) on its forward work item, computed here from the graph, and a predictor built on
those measured rows takes the reorders' price off: priced as this host's copies (`copy_item`,
the memcpy kernel), at most `MAX_LAYOUT_CREDIT` of the conv's own time (`take_off`; the
profiled reorders were 8-36 % of a single-Conv session). The roofline has no credit to take
off: its price of a conv never included the reorders. Profiles and figures: docs/latency-models.md.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType

import numpy as np
import numpy.typing as npt

from gpuplan_estimator.core.layers import Layer, ModelGraph, OpFamily
from gpuplan_estimator.core.options import ONNXRUNTIME
from gpuplan_estimator.core.workload import Phase, WorkItem

# MLAS's NCHWc block on AVX-512 hosts (8 on AVX2 ones), both of which measured the shipped rows
# and the eval host: grouped convs are blocked only when the channels per group divide by it.
NCHWC_BLOCK = 16
# Ops onnxruntime runs in the NCHWc layout (or folds away), so a reorder before or after them
# cancels against the neighbouring conv's (profiled: ResNet-50, Inception-v2, VGG-19).
NCHWC_OPS = frozenset({"Relu", "Add", "Sum", "Concat", "MaxPool", "AveragePool",
                       "GlobalAveragePool", "GlobalMaxPool", "BatchNormalization"})
LAYOUT_CREDIT = "nchwc_reorder_elements"
"""Work-item attribute: elements of NCHWc reorders the conv's benchmark rows timed but the
model does not run."""
MAX_LAYOUT_CREDIT = 0.5
"""Largest share of a conv's time its layout credit may remove (see the module docstring)."""


def credits_for(graph: ModelGraph, framework: str,
                unit_overrides: Mapping[str, object | None]) -> Mapping[str, int]:
    """Conv layer -> elements of NCHWc reorders its rows include but this graph does not run.

    Only for onnxruntime; empty for any other `framework`. `unit_overrides` are
    `frameworks.overrides(graph, framework)`; a None override is a layer folded away.
    """
    if framework != ONNXRUNTIME:
        return {}
    consumers: dict[str, list[Layer]] = {}
    for layer in graph.layers:
        for t in layer.inputs:
            consumers.setdefault(t.name, []).append(layer)
    # What the conv folds in (BN, per-channel Mul/Add, activation) keeps its layout too.
    folded = frozenset(name for name, kernel in unit_overrides.items() if kernel is None)
    keeping = frozenset(layer.name for layer in graph.layers
                        if layer.op_type in NCHWC_OPS or layer.name in folded)
    blocked = _blocked_tensors(graph, keeping)
    stays = _stays_blocked(graph, consumers, blocked, keeping)
    credits: dict[str, int] = {}
    for layer in graph.layers:
        if not _is_nchwc_conv(layer):
            continue
        x, y = layer.inputs[0], layer.outputs[0]
        reordered_in = x.shape[1] >= NCHWC_BLOCK  # narrower inputs are read as NCHW
        n = (x.elements if reordered_in and x.name in blocked else 0) + (
            y.elements if y.name in stays else 0)
        if n:
            credits[layer.name] = n
    return credits


def _is_nchwc_conv(layer: Layer) -> bool:
    if layer.op_type != "Conv" or len(layer.inputs) < 2 or len(layer.inputs[0].shape) != 4:
        return False
    groups = int(layer.attributes.get("group", 1))
    c_in, c_out = layer.inputs[0].shape[1], layer.outputs[0].shape[1]
    if groups == 1 or groups == c_in == c_out:
        return True
    return (c_in // groups) % NCHWC_BLOCK == 0 and (c_out // groups) % NCHWC_BLOCK == 0


def _blocked_tensors(graph: ModelGraph, keeping: frozenset[str]) -> set[str]:
    """Tensors produced in NCHWc: by a blocked conv, or by a layout-keeping layer whose 4-D
    inputs all are."""
    blocked: set[str] = set()
    for layer in graph.layers:
        acts = [t for t in layer.inputs if len(t.shape) == 4]
        if _is_nchwc_conv(layer) or (layer.name in keeping and acts
                                     and all(t.name in blocked for t in acts)):
            blocked.update(t.name for t in layer.outputs)
    return blocked


def _stays_blocked(graph: ModelGraph, consumers: Mapping[str, list[Layer]],
                   blocked: set[str], keeping: frozenset[str]) -> set[str]:
    """Tensors that are never reordered back to NCHW: every consumer is a blocked conv, or a
    layout-keeping layer whose other 4-D inputs are blocked and whose outputs stay blocked
    too (reverse topological order)."""
    stays: set[str] = set()

    def keeps(user: Layer) -> bool:
        if _is_nchwc_conv(user):
            return True
        return (user.name in keeping
                and all(t.name in blocked for t in user.inputs if len(t.shape) == 4)
                and all(t.name in stays for t in user.outputs))

    for layer in reversed(graph.layers):
        for t in layer.outputs:
            users = consumers.get(t.name, [])
            if users and all(keeps(u) for u in users):
                stays.add(t.name)
    return stays


def credited(items: Sequence[WorkItem]) -> tuple[list[int], list[WorkItem]]:
    """Indices of the items that carry a credit and, for each, the reorder copy to price."""
    idx = [i for i, it in enumerate(items) if it.attributes.get(LAYOUT_CREDIT)]
    return idx, [copy_item(int(items[i].attributes[LAYOUT_CREDIT])) for i in idx]


def copy_item(elements: int) -> WorkItem:
    """A reorder of `elements` float32 values: one strided copy (the memcpy bench kernel)."""
    return WorkItem(layer="layout", family=OpFamily.DATA_MOVEMENT, kernel="memcpy",
                    phase=Phase.FORWARD, dims=MappingProxyType({"elements": elements}),
                    dtype="float32", flops=0, bytes_moved=8 * elements, op="transpose",
                    role="layout_reorder")


def take_off(values: npt.NDArray[np.float64], at: Sequence[int],
             copy_ms: npt.NDArray[np.float64]) -> None:
    """Subtract, in place, each credited item's reorder price from its time in `values`.

    Each item keeps at least ``1 - MAX_LAYOUT_CREDIT`` of its own time.
    """
    where = np.asarray(at, dtype=np.intp)
    values[where] = np.maximum(values[where] - copy_ms, (1.0 - MAX_LAYOUT_CREDIT) * values[where])
