"""Builders for hand-made layers in unit tests: costed by the real `opcost`, as `graph` does."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gpuplan_estimator.core.layers import Layer, TensorInfo
from gpuplan_estimator.graph import opcost


def t(name: str, *shape: int, dtype: str = "float32") -> TensorInfo:
    return TensorInfo(name, tuple(shape), dtype)


def layer(
    name: str, op: str, inputs: Sequence[TensorInfo], outputs: Sequence[TensorInfo],
    params: Sequence[str] = (), attrs: Mapping[str, Any] | None = None,
) -> Layer:
    """A layer costed by the real `opcost`, as `graph` would build it."""
    a = opcost.normalize_attributes(op, inputs, outputs, attrs or {}, 17)
    static = op in ("Shape", "Constant")
    family = opcost.classify(op, a, inputs_static=static, gathers_parameter=bool(params))
    read, written = opcost.node_bytes(op, family, inputs, outputs)
    return Layer(
        name=name, op_type=op, family=family, inputs=tuple(inputs), outputs=tuple(outputs),
        flops=opcost.node_flops(op, family, inputs, outputs, a), bytes_read=read,
        bytes_written=written,
        parameter_count=sum(x.elements for x in inputs if x.name in params),
        parameter_inputs=tuple(params), attributes=a,
    )
