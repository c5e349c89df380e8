"""Single-kernel ONNX graphs for benchmark plan items (weights as random initializers)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import onnx
from onnx import TensorProto, helper, numpy_helper

from gpuplan_estimator.bench import shapes
from gpuplan_estimator.bench.sweep import PlanItem
from gpuplan_estimator.core import errors
from gpuplan_estimator.core.vocabulary import CAST_OP

OPSET = 20  # Gelu is a standard op from opset 20
IR_VERSION = 9  # the lowest IR that carries opset 20; onnxruntime 1.20+ loads it
MEMCPY_INNER = 64

_ONNX_DTYPES: Mapping[str, tuple[int, type[np.generic]]] = {
    "float32": (TensorProto.FLOAT, np.float32),
    "float16": (TensorProto.FLOAT16, np.float16),
    "float64": (TensorProto.DOUBLE, np.float64),
}
_ELEMENTWISE_OPS = {
    "add": "Add", "sub": "Sub", "mul": "Mul", "div": "Div", "pow": "Pow",
    "addu": "Add", "mulu": "Mul", "divu": "Div", "powu": "Pow",
    "relu": "Relu", "gelu": "Gelu", "tanh": "Tanh", "sigmoid": "Sigmoid",
    "exp": "Exp", "sqrt": "Sqrt", "erf": "Erf", "neg": "Neg",
}

Array = npt.NDArray[np.generic]


@dataclass(frozen=True)
class Unit:
    """A ready-to-run graph and the input values to feed it."""

    model: onnx.ModelProto
    feeds: Mapping[str, Array]


class _UnitGraphBuilder:
    def __init__(self, dtype: str, rng: np.random.Generator) -> None:
        if dtype not in _ONNX_DTYPES:
            raise errors.GpuplanError(f"bench dtype {dtype!r} unsupported")
        self.dtype = dtype
        self.elem, self.np_dtype = _ONNX_DTYPES[dtype]
        self.rng = rng
        self.inputs: list[onnx.ValueInfoProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.feeds: dict[str, Array] = {}

    def _values(self, shape: tuple[int, ...], positive: bool,
                np_dtype: type[np.generic] | None = None) -> Array:
        values = self.rng.random(shape, dtype=np.float32)
        # Keep pow/div/sqrt away from 0 and negatives so no NaN/inf slow paths are timed.
        values = values + 0.5 if positive else values * 2.0 - 1.0
        return values.astype(self.np_dtype if np_dtype is None else np_dtype)

    def input(self, name: str, shape: tuple[int, ...], positive: bool = False,
              dtype: str | None = None) -> str:
        """A graph input fed random values, in the unit's dtype unless `dtype` names another."""
        elem, np_dtype = _ONNX_DTYPES[dtype] if dtype is not None else (self.elem, self.np_dtype)
        self.inputs.append(helper.make_tensor_value_info(name, elem, list(shape)))
        self.feeds[name] = self._values(shape, positive, np_dtype)
        return name

    def weight(self, name: str, shape: tuple[int, ...], positive: bool = False) -> str:
        self.inits.append(numpy_helper.from_array(self._values(shape, positive), name))
        return name

    def build(
        self, node: onnx.NodeProto | list[onnx.NodeProto], out_shape: tuple[int, ...]
    ) -> Unit:
        nodes = node if isinstance(node, list) else [node]
        out = helper.make_tensor_value_info("y", self.elem, list(out_shape))
        graph = helper.make_graph(nodes, "unit", self.inputs, [out], initializer=self.inits)
        model = helper.make_model(
            graph,
            opset_imports=[helper.make_opsetid("", OPSET)],
            ir_version=IR_VERSION,
            producer_name="gpuplan-bench",
        )
        return Unit(model, dict(self.feeds))


def build_unit(item: PlanItem, rng: np.random.Generator) -> Unit:
    """The single-node ONNX graph that runs `item`'s kernel once."""
    b = _UnitGraphBuilder(item.dtype, rng)
    d = item.dims
    try:
        builder = _KERNEL_BUILDERS[item.kernel]
    except KeyError:
        raise errors.GpuplanError(f"no ONNX unit builder for kernel {item.kernel!r}") from None
    try:
        return builder(b, item.op, d)
    except KeyError as exc:
        raise errors.GpuplanError(
            f"{item.kernel} item lacks dim {exc.args[0]!r}: {dict(d)}"
        ) from exc


def _gemm(b: _UnitGraphBuilder, _op: str, d: Mapping[str, int]) -> Unit:
    batch, m, k, n = d["batch"], d["m"], d["k"], d["n"]
    lead = (batch,) if batch > 1 else ()
    x = b.input("x", (*lead, m, k))
    if d["bias"]:
        # nn.Linear-shaped: one weight shared over the batch, bias fused (Gemm when 2-D).
        w = b.weight("w", (k, n))
        bias = b.weight("b", (n,))
        if not lead:
            return b.build(helper.make_node("Gemm", [x, w, bias], ["y"]), (m, n))
        nodes = [
            helper.make_node("MatMul", [x, w], ["xw"]),
            helper.make_node("Add", ["xw", bias], ["y"]),
        ]
        return b.build(nodes, (*lead, m, n))
    y = b.input("x2", (*lead, k, n))
    return b.build(helper.make_node("MatMul", [x, y], ["y"]), (*lead, m, n))


def _conv(b: _UnitGraphBuilder, _op: str, d: Mapping[str, int]) -> Unit:
    g = d["groups"]
    x = b.input("x", (d["batch"], d["c_in"], d["h"], d["w"]))
    w = b.weight("w", (d["c_out"], d["c_in"] // g, d["kernel_h"], d["kernel_w"]))
    node = helper.make_node(
        "Conv", [x, w], ["y"],
        kernel_shape=[d["kernel_h"], d["kernel_w"]],
        strides=[d["stride_h"], d["stride_w"]],
        pads=[d["pad_h"], d["pad_w"], d["pad_h"], d["pad_w"]],
        dilations=[d["dilation_h"], d["dilation_w"]],
        group=g,
    )
    oh, ow = shapes.conv_out(d)
    return b.build(node, (d["batch"], d["c_out"], oh, ow))


def _pool(b: _UnitGraphBuilder, op: str, d: Mapping[str, int]) -> Unit:
    ops = {"maxpool": "MaxPool", "avgpool": "AveragePool"}
    if op not in ops:
        raise errors.GpuplanError(f"pool op {op!r} not one of {sorted(ops)}")
    x = b.input("x", (d["batch"], d["channels"], d["h"], d["w"]))
    node = helper.make_node(
        ops[op], [x], ["y"],
        kernel_shape=[d["kernel_h"], d["kernel_w"]],
        strides=[d["stride_h"], d["stride_w"]],
    )
    oh, ow = shapes.pool_out(d)
    return b.build(node, (d["batch"], d["channels"], oh, ow))


def _layernorm(b: _UnitGraphBuilder, _op: str, d: Mapping[str, int]) -> Unit:
    x = b.input("x", (d["rows"], d["cols"]))
    scale = b.weight("scale", (d["cols"],))
    bias = b.weight("bias", (d["cols"],))
    node = helper.make_node("LayerNormalization", [x, scale, bias], ["y"], axis=-1)
    return b.build(node, (d["rows"], d["cols"]))


def _batchnorm(b: _UnitGraphBuilder, _op: str, d: Mapping[str, int]) -> Unit:
    # rows are the channels, cols the N*H*W positions each channel normalises over (`opcost`).
    shape = (1, d["rows"], d["cols"], 1)
    x = b.input("x", shape)
    params = [b.weight(name, (d["rows"],), positive=True)
              for name in ("scale", "bias", "mean", "var")]
    return b.build(helper.make_node("BatchNormalization", [x, *params], ["y"]), shape)


def _softmax(b: _UnitGraphBuilder, _op: str, d: Mapping[str, int]) -> Unit:
    x = b.input("x", (d["rows"], d["cols"]))
    return b.build(helper.make_node("Softmax", [x], ["y"], axis=-1), (d["rows"], d["cols"]))


def _elementwise(b: _UnitGraphBuilder, op: str, d: Mapping[str, int]) -> Unit:
    if op in shapes.WINDOW_OPS:
        return _lrn(b, d)
    shape = (d["rows"], d["cols"])
    if op == CAST_OP:
        x = b.input("x", shape, dtype=shapes.cast_source(b.dtype, "float16"))
        return b.build(helper.make_node("Cast", [x], ["y"], to=b.elem), shape)
    if op not in _ELEMENTWISE_OPS:
        raise errors.GpuplanError(
            f"elementwise op {op!r} not one of {sorted([*_ELEMENTWISE_OPS, CAST_OP])}")
    positive = op in ("pow", "powu", "div", "divu", "sqrt")
    x = b.input("x", shape, positive=positive)
    if d["operands"] == 2:
        ins = [x, b.input("x2", shape, positive=positive)]
    elif op in shapes.SCALAR_OPS:
        ins = [x, b.weight("r", (), positive=True)]  # tensor (op) python scalar
    else:
        ins = [x]
    return b.build(helper.make_node(_ELEMENTWISE_OPS[op], ins, ["y"]), shape)


def _lrn(b: _UnitGraphBuilder, d: Mapping[str, int]) -> Unit:
    # rows play the channels the window slides over, cols the spatial positions: the same
    # per-element work as LRN on [N, C, H, W] with rows = N*C*H and cols = W.
    shape = (1, d["rows"], d["cols"], 1)
    x = b.input("x", shape)
    node = helper.make_node("LRN", [x], ["y"], size=d["operands"], alpha=1e-4, beta=0.75,
                            bias=1.0)
    return b.build(node, shape)


def _memcpy(b: _UnitGraphBuilder, op: str, d: Mapping[str, int]) -> Unit:
    if op != "transpose":
        raise errors.GpuplanError(f"memcpy op {op!r} unsupported (only transpose)")
    n = d["elements"]
    inner = MEMCPY_INNER if n % MEMCPY_INNER == 0 else 1
    x = b.input("x", (n // inner, inner))
    node = helper.make_node("Transpose", [x], ["y"], perm=[1, 0])
    return b.build(node, (inner, n // inner))


_KERNEL_BUILDERS = {
    "gemm": _gemm,
    "conv2d": _conv,
    "pool": _pool,
    "layernorm": _layernorm,
    "batchnorm": _batchnorm,
    "softmax": _softmax,
    "elementwise": _elementwise,
    "memcpy": _memcpy,
}
