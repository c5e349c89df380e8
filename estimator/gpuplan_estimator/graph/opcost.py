"""Pure per-node cost model: ONNX op type + shapes + attributes → family, FLOPs, bytes, kernel dims.

No ONNX import here: `graph` hands in plain `TensorInfo`s and attribute dicts. FLOP constants for
non-GEMM ops are conventions (stated next to each table), not measurements; the latency models
learn the real cost, these only feed the roofline prior and the features.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from gpuplan_estimator.core import errors, kernels
from gpuplan_estimator.core.layers import Layer, OpFamily, TensorInfo
from gpuplan_estimator.core.workload import elementwise_dims
from gpuplan_estimator.graph.contrib import ATTENTION_OPS

_F = OpFamily

# Ops whose family does not depend on context. Gather/Einsum are decided in `classify`.
_FAMILY_BY_OP: Mapping[str, OpFamily] = {
    **dict.fromkeys(["Conv", "ConvTranspose", "ConvInteger", "QLinearConv"], _F.CONV),
    **dict.fromkeys(
        ["MatMul", "Gemm", "MatMulInteger", "QLinearMatMul", "FusedMatMul"], _F.MATMUL
    ),
    **dict.fromkeys(
        ["MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool", "LpPool",
         "GlobalLpPool", "MaxRoiPool", "RoiAlign", "MaxUnpool"],
        _F.POOLING,
    ),
    **dict.fromkeys(
        ["BatchNormalization", "LayerNormalization", "GroupNormalization",
         "InstanceNormalization", "LRN", "SimplifiedLayerNormalization", "RMSNormalization",
         "SkipLayerNormalization", "SkipSimplifiedLayerNormalization", "LpNormalization",
         "MeanVarianceNormalization"],
        _F.NORMALIZATION,
    ),
    **dict.fromkeys(["Softmax", "LogSoftmax", "Hardmax"], _F.SOFTMAX),
    **dict.fromkeys(
        ["Add", "Sub", "Mul", "Div", "Pow", "Sqrt", "Exp", "Log", "Relu", "LeakyRelu",
         "Sigmoid", "Tanh", "Erf", "Gelu", "FastGelu", "BiasGelu", "Clip", "Where", "Neg",
         "Abs", "Max", "Min", "Sum", "Mean", "Cast", "CastLike", "Dropout", "HardSigmoid",
         "HardSwish", "Elu", "Selu", "Celu", "ThresholdedRelu", "Softplus", "Softsign",
         "PRelu", "Not", "And", "Or", "Xor", "Equal", "Less", "LessOrEqual", "Greater",
         "GreaterOrEqual", "Reciprocal", "Floor", "Ceil", "Round", "Sign", "Sin", "Cos",
         "Tan", "Asin", "Acos", "Atan", "Sinh", "Cosh", "Asinh", "Acosh", "Atanh", "Mish",
         "Mod", "BitShift", "IsNaN", "IsInf", "Shrink", "QuantizeLinear", "DequantizeLinear",
         "BitwiseAnd", "BitwiseOr", "BitwiseXor", "BitwiseNot", "Swish", "QuickGelu",
         "BiasAdd", "RotaryEmbedding"],
        _F.ELEMENTWISE,
    ),
    **dict.fromkeys(
        ["ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1",
         "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare", "ArgMax", "ArgMin",
         "TopK", "CumSum"],
        _F.REDUCTION,
    ),
    **dict.fromkeys(
        ["Transpose", "Concat", "Split", "Slice", "Pad", "Tile", "Expand", "Resize",
         "Upsample", "DepthToSpace", "SpaceToDepth", "GatherElements", "GatherND", "ScatterND",
         "ScatterElements", "Scatter", "Trilu", "Identity", "Compress", "ReverseSequence",
         "OneHot", "Col2Im", "CenterCropPad", "NonZero", "Range", "SplitToSequence",
         "ConcatFromSequence"],
        _F.DATA_MOVEMENT,
    ),
    **dict.fromkeys(
        ["Shape", "Size", "Constant", "ConstantOfShape", "Reshape", "Flatten", "Squeeze",
         "Unsqueeze", "EyeLike", "SequenceAt", "SequenceConstruct", "SequenceLength",
         "SequenceInsert", "SequenceEmpty"],
        _F.SHAPE_ONLY,
    ),
}

MAX_WINDOW = 2**31 - 1
"""Largest kernel, stride, dilation or pad accepted (int32, as every runtime stores them)."""
_WINDOWED_OPS = frozenset({"Conv", "ConvTranspose", "ConvInteger", "MaxPool", "AveragePool",
                           "LpPool"})

# Ops that only relabel a buffer (no copy): zero bytes even when they see real data.
METADATA_ONLY_OPS = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Shape", "Size"})

# Ops a framework runs as a view on a parameter (W.t(), unsqueeze of a BN scale): free.
VIEW_OPS = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Transpose", "Identity",
                      "Cast"})

# FLOPs per output element of elementwise ops. Default 1 (one arithmetic op, as FLOP counters
# such as fvcore count activations). Transcendentals get the instruction count of their usual
# fast-math expansion (exp ≈ 4, tanh/sigmoid ≈ exp + div + add); comparisons and casts 1.
_ELEMENTWISE_FLOPS: Mapping[str, int] = {
    "Exp": 4, "Log": 4, "Sqrt": 2, "Reciprocal": 1, "Pow": 4, "Erf": 6, "Tanh": 6,
    "Sigmoid": 6, "Softplus": 6, "Elu": 5, "Selu": 6, "Celu": 5, "Gelu": 8, "FastGelu": 8,
    "BiasGelu": 9, "Mish": 12, "Swish": 7, "HardSigmoid": 3, "HardSwish": 4,
    "Sin": 6, "Cos": 6, "Tan": 8, "Asin": 8, "Acos": 8, "Atan": 8, "Sinh": 8, "Cosh": 8,
    "Asinh": 8, "Acosh": 8, "Atanh": 8, "Dropout": 2,  # training dropout: mask draw + scale
    "QuickGelu": 7, "BiasAdd": 2,
    "RotaryEmbedding": 3,  # x·cos + rotate_half(x)·sin: two multiplies and an add
}

# Normalisation FLOPs per element: mean (1 add) + variance (sub, square, add = 3) + normalise
# (sub, mul by rstd = 2) + affine (mul, add = 2) = 8 for mean/variance norms; RMSNorm skips the
# mean and the shift = 4. Per-row rsqrt is amortised and ignored.
_NORM_FLOPS: Mapping[str, int] = {
    "BatchNormalization": 8, "LayerNormalization": 8, "GroupNormalization": 8,
    "InstanceNormalization": 8, "MeanVarianceNormalization": 7, "LpNormalization": 4,
    "SimplifiedLayerNormalization": 4, "RMSNormalization": 4,
    "SkipLayerNormalization": 9, "SkipSimplifiedLayerNormalization": 5,
}
# Softmax: max, subtract, exp (counted 1 here as it is one pass), sum, divide.
SOFTMAX_FLOPS_PER_ELEMENT = 5
# Trainable input slots per op; any other constant input (e.g. BN running stats) is a buffer.
PARAMETER_SLOTS: Mapping[str, frozenset[int]] = {
    "Conv": frozenset({1, 2}), "ConvTranspose": frozenset({1, 2}), "Gemm": frozenset({1, 2}),
    "MatMul": frozenset({0, 1}), "BatchNormalization": frozenset({1, 2}),
    "LayerNormalization": frozenset({1, 2}), "GroupNormalization": frozenset({1, 2}),
    "InstanceNormalization": frozenset({1, 2}), "SimplifiedLayerNormalization": frozenset({1}),
    "RMSNormalization": frozenset({1}), "PRelu": frozenset({1}), "Gather": frozenset({0}),
    "SkipLayerNormalization": frozenset({2, 3, 4}),
    "SkipSimplifiedLayerNormalization": frozenset({2, 3}),
    "Attention": frozenset({1, 2}), "BiasGelu": frozenset({1}), "FastGelu": frozenset({1}),
    "BiasAdd": frozenset({1}),
}
NON_PARAMETER_SLOTS: Mapping[str, frozenset[int]] = {
    "BatchNormalization": frozenset({3, 4}),
    "Reshape": frozenset({1}), "Expand": frozenset({1}), "Tile": frozenset({1}),
}


def is_known_op(op_type: str) -> bool:
    """Whether `op_type` has an op family (anything else is classified OTHER)."""
    return (op_type in _FAMILY_BY_OP or op_type in ("Gather", "Einsum")
            or op_type in ATTENTION_OPS)


def classify(
    op_type: str,
    attributes: Mapping[str, Any],
    *,
    inputs_static: bool,
    gathers_parameter: bool,
) -> OpFamily:
    """Family of a node; `inputs_static` means every input is a shape-computation tensor."""
    if not is_known_op(op_type):
        return _F.OTHER
    if inputs_static:
        return _F.SHAPE_ONLY
    if op_type == "Gather":
        return _F.EMBEDDING if gathers_parameter else _F.DATA_MOVEMENT
    if op_type == "Einsum":
        return _einsum_family(str(attributes.get("equation", "")))
    if op_type in ATTENTION_OPS:  # `records` prices it as its GEMMs and softmax
        return _F.MATMUL
    return _FAMILY_BY_OP[op_type]


def _einsum_terms(equation: str) -> tuple[list[str], str]:
    lhs, _, rhs = equation.replace(" ", "").partition("->")
    terms = lhs.split(",")
    if not rhs and "->" not in equation:
        letters = "".join(terms)
        rhs = "".join(sorted(c for c in set(letters) if letters.count(c) == 1))
    return terms, rhs


def _einsum_family(equation: str) -> OpFamily:
    terms, out = _einsum_terms(equation)
    summed = set("".join(terms)) - set(out) - {"."}
    if len(terms) >= 2:
        return _F.MATMUL if summed else _F.ELEMENTWISE
    return _F.REDUCTION if summed else _F.DATA_MOVEMENT


def node_flops(
    op_type: str,
    family: OpFamily,
    inputs: Sequence[TensorInfo],
    outputs: Sequence[TensorInfo],
    attributes: Mapping[str, Any],
) -> int:
    """Forward FLOPs of one node; a multiply-accumulate counts 2."""
    if family in (_F.SHAPE_ONLY, _F.DATA_MOVEMENT, _F.EMBEDDING, _F.OTHER) or not outputs:
        return 0
    out = outputs[0]
    if family is _F.CONV:
        return _conv_flops(op_type, inputs, out, attributes)
    if family is _F.MATMUL:
        return _matmul_flops(op_type, inputs, out, attributes)
    if family is _F.POOLING:
        if op_type.startswith("Global"):
            return inputs[0].elements
        return out.elements * math.prod(attributes.get("kernel_shape", [1]))
    if family is _F.NORMALIZATION:
        if op_type == "LRN":  # sum of squares over `size` channels, then scale and pow
            return out.elements * (2 * int(attributes.get("size", 1)) + 3)
        return out.elements * _NORM_FLOPS.get(op_type, 8)
    if family is _F.SOFTMAX:
        return out.elements * SOFTMAX_FLOPS_PER_ELEMENT
    if family is _F.REDUCTION:
        return inputs[0].elements
    per_element = _ELEMENTWISE_FLOPS.get(op_type, 1)
    if op_type in ("Sum", "Mean", "Max", "Min") and len(inputs) > 2:
        per_element = len(inputs) - 1
    return out.elements * per_element


def _conv_flops(
    op_type: str, inputs: Sequence[TensorInfo], out: TensorInfo, attrs: Mapping[str, Any]
) -> int:
    x, w = inputs[0], inputs[1]
    groups = int(attrs.get("group", 1))
    kernel = math.prod(w.shape[2:])
    if op_type == "ConvTranspose":  # every input pixel scatters into Cout/groups·k outputs
        macs = x.elements * (w.shape[1]) * kernel
    else:
        macs = out.elements * (x.shape[1] // groups) * kernel
    bias = out.elements if len(inputs) > 2 else 0
    return 2 * macs + bias


def _matmul_flops(
    op_type: str, inputs: Sequence[TensorInfo], out: TensorInfo, attrs: Mapping[str, Any]
) -> int:
    if op_type == "Einsum":
        terms, _ = _einsum_terms(str(attrs.get("equation", "")))
        sizes: dict[str, int] = {}
        for term, t in zip(terms, inputs, strict=False):
            sizes.update(zip(term.replace("...", ""), t.shape[-len(term.replace("...", "")):],
                             strict=False))
        return 2 * math.prod(sizes.values())
    a = inputs[0]
    if op_type == "Gemm":
        k = a.shape[0] if attrs.get("transA", 0) else a.shape[1]
        bias = out.elements if len(inputs) > 2 else 0
        return 2 * out.elements * k + bias
    return 2 * out.elements * a.shape[-1]


def node_bytes(
    op_type: str,
    family: OpFamily,
    inputs: Sequence[TensorInfo],
    outputs: Sequence[TensorInfo],
) -> tuple[int, int]:
    """(bytes_read, bytes_written): all inputs (parameters included) and all outputs.

    Exceptions, because a gather or slice touches only what it returns: Gather/GatherND/
    GatherElements/Slice/embedding read the indices plus output-sized data, not the whole table.
    """
    if family is _F.SHAPE_ONLY or op_type in METADATA_ONLY_OPS:
        return 0, 0
    written = sum(t.size_bytes for t in outputs)
    if op_type in ("Gather", "GatherND", "GatherElements", "Slice"):
        indices = sum(t.size_bytes for t in inputs[1:]) if op_type != "Slice" else 0
        return indices + written, written
    return sum(t.size_bytes for t in inputs), written


def normalize_attributes(
    op_type: str,
    inputs: Sequence[TensorInfo],
    outputs: Sequence[TensorInfo],
    raw: Mapping[str, Any],
    opset: int,
) -> dict[str, Any]:
    """Raw ONNX attributes plus the defaults spelled out (strides, pads, kernel_shape, axis)."""
    attrs = dict(raw)
    if op_type in _WINDOWED_OPS:
        spatial = len(inputs[0].shape) - 2
        if "kernel_shape" not in attrs and len(inputs) > 1:
            attrs["kernel_shape"] = list(inputs[1].shape[2:])
        attrs.setdefault("strides", [1] * spatial)
        attrs.setdefault("dilations", [1] * spatial)
        attrs.setdefault("group", 1)
        _check_window(op_type, attrs, spatial)
        if "pads" not in attrs or attrs.get("auto_pad", "NOTSET") not in ("NOTSET", ""):
            attrs["pads"] = _implied_pads(op_type, inputs, outputs, attrs, spatial)
        _check_ints(op_type, attrs, "pads", 2 * spatial, minimum=0)
    if op_type in ("Softmax", "LogSoftmax", "Hardmax"):
        rank = len(inputs[0].shape)
        axis = int_attribute(op_type, attrs, "axis", -1 if opset >= 13 else 1)
        attrs["axis"] = axis % rank if rank else 0
        attrs["coerced_2d"] = opset < 13  # before opset 13 softmax flattens to 2-D at axis
    if op_type in ("LayerNormalization", "SimplifiedLayerNormalization", "RMSNormalization"):
        rank = len(inputs[0].shape)
        attrs["axis"] = int_attribute(op_type, attrs, "axis", -1) % rank if rank else 0
    if op_type == "Gemm":
        attrs.setdefault("transA", 0)
        attrs.setdefault("transB", 0)
    return attrs


def int_attribute(op_type: str, attrs: Mapping[str, Any], key: str, default: int) -> int:
    """An int attribute (or its default); InvalidModelError when it holds another type."""
    value = attrs.get(key, default)
    if not isinstance(value, int):
        raise errors.InvalidModelError(f"{op_type} attribute {key}: {value!r} is not an int")
    return value


def _check_window(op_type: str, attrs: Mapping[str, Any], spatial: int) -> None:
    """Window attributes a conv or pool can run with: one positive int per spatial dim."""
    if spatial < 1:
        raise errors.InvalidModelError(f"{op_type}: input of rank {spatial + 2}, needs >= 3")
    for key in ("kernel_shape", "strides", "dilations"):
        _check_ints(op_type, attrs, key, spatial, minimum=1)
    group = attrs.get("group")
    if not isinstance(group, int) or group < 1:
        raise errors.InvalidModelError(f"{op_type} attribute group: {group!r} is not >= 1")


def _check_ints(op_type: str, attrs: Mapping[str, Any], key: str, length: int, *,
                minimum: int) -> None:
    value = attrs.get(key)
    if (not isinstance(value, list) or len(value) != length
            or not all(isinstance(v, int) and minimum <= v <= MAX_WINDOW for v in value)):
        raise errors.InvalidModelError(
            f"{op_type} attribute {key}: {value!r} is not {length} ints in "
            f"[{minimum}, {MAX_WINDOW}]")


def _implied_pads(
    op_type: str,
    inputs: Sequence[TensorInfo],
    outputs: Sequence[TensorInfo],
    attrs: Mapping[str, Any],
    spatial: int,
) -> list[int]:
    """Total padding implied by input/output sizes (auto_pad SAME_*), split begin/end."""
    if op_type == "ConvTranspose" or not outputs or attrs.get("auto_pad", "NOTSET") in (
        "NOTSET", "VALID", ""):
        return [0] * (2 * spatial)
    begins, ends = [], []
    for i in range(spatial):
        size_in, size_out = inputs[0].shape[2 + i], outputs[0].shape[2 + i]
        k = (attrs["kernel_shape"][i] - 1) * attrs["dilations"][i] + 1
        total = max(0, (size_out - 1) * attrs["strides"][i] + k - size_in)
        lower = total // 2 if attrs.get("auto_pad") == "SAME_UPPER" else total - total // 2
        begins.append(lower)
        ends.append(total - lower)
    return begins + ends


def kernel_dims(layer: Layer) -> tuple[str, dict[str, int]]:
    """The benchmark kernel that prices `layer` and its canonical dims (see `workload`).

    OTHER layers map to ``memcpy`` over their outputs so a roofline can still bound them; they
    stay listed as uncovered through their family.
    """
    family = layer.family
    if family is _F.SHAPE_ONLY:
        return kernels.FREE_KERNEL, {}
    if family is _F.CONV:
        return "conv2d", _conv_dims(layer)
    if family is _F.MATMUL:
        return "gemm", _gemm_dims(layer)
    if family is _F.POOLING:
        return "pool", _pool_dims(layer)
    if family is _F.NORMALIZATION:
        return _norm_dims(layer)
    if family is _F.SOFTMAX:
        return "softmax", _softmax_dims(layer)
    if family is _F.REDUCTION:
        return "reduce", _reduce_dims(layer)
    if family is _F.ELEMENTWISE:
        out = layer.outputs[0]
        return "elementwise", elementwise_dims(out, full_size_operands(layer.inputs, out))
    if layer.op_type in ("Concat", "ConcatFromSequence") and layer.outputs:
        # Concat copies each input once into its slice of the output, in contiguous runs
        # (torch.cat and onnxruntime alike): one read and one write per element, like a Relu,
        # not the transpose-shaped memcpy benchmark, 3x slower for the same bytes (SqueezeNet
        # at batch 8 with onnxruntime: 8.5 ms predicted from memcpy, 2.8 ms measured;
        # DenseNet-121's SGD step at batch 8 in PyTorch: 263 ms for its Concats, 21 ms profiled).
        return "elementwise", elementwise_dims(layer.outputs[0], 1)
    return "memcpy", {"elements": sum(t.elements for t in layer.outputs)}


def full_size_operands(inputs: Sequence[TensorInfo], out: TensorInfo) -> int:
    """Inputs as large as the output; at least 1.

    A broadcast operand (bias [C], attention mask [B,1,1,S], a scalar) is read once per
    distinct element and then served from cache, so it costs about what the scalar of a
    tensor-scalar benchmark (``addu``: operands=1) costs. Broadcast shapes divide the output
    size, so anything smaller is at most half of it.
    """
    return max(1, sum(1 for t in inputs if t.elements >= out.elements > 1))


def _spatial_2d(shape: Sequence[int]) -> tuple[int, int]:
    """(h, w) of an N-D spatial shape: 1-D → (1, L); 3-D folds depth into h."""
    if len(shape) == 1:
        return 1, shape[0]
    return math.prod(shape[:-1]), shape[-1]


def _conv_dims(layer: Layer) -> dict[str, int]:
    x, w = layer.inputs[0], layer.inputs[1]
    a = layer.attributes
    spatial = len(x.shape) - 2
    h, wd = _spatial_2d(x.shape[2:])
    kh, kw = _spatial_2d(w.shape[2:])
    strides, dil, pads = list(a["strides"]), list(a["dilations"]), list(a["pads"])
    groups = int(a["group"])
    transposed = layer.op_type == "ConvTranspose"
    c_out = w.shape[1] * groups if transposed else w.shape[0]
    dims = {
        "batch": x.shape[0], "c_in": x.shape[1], "c_out": c_out, "h": h, "w": wd,
        "kernel_h": kh, "kernel_w": kw,
        "stride_h": strides[0] if spatial > 1 else 1, "stride_w": strides[-1],
        "pad_h": pads[0] if spatial > 1 else 0, "pad_w": pads[spatial - 1],
        "dilation_h": dil[0] if spatial > 1 else 1, "dilation_w": dil[-1],
        "groups": groups,
    }
    if transposed:
        dims["transposed"] = 1
    return dims


def _gemm_dims(layer: Layer) -> dict[str, int]:
    if layer.op_type == "Einsum":
        return _einsum_dims(layer)
    a, b = layer.inputs[0].shape, layer.inputs[1].shape
    out = layer.outputs[0].shape
    if layer.op_type == "Gemm":
        m, k = (a[1], a[0]) if layer.attributes.get("transA", 0) else (a[0], a[1])
        n = b[0] if layer.attributes.get("transB", 0) else b[1]
        return {"batch": 1, "m": m, "k": k, "n": n, "bias": int(len(layer.inputs) > 2)}
    k = a[-1]
    n = b[-1] if len(b) > 1 else 1
    if len(b) <= 2:  # weight without batch dims: frameworks fold A's batch dims into m
        return {"batch": 1, "m": math.prod(a[:-1]) if a else 1, "k": k, "n": n, "bias": 0}
    m = a[-2] if len(a) > 1 else 1
    batch = math.prod(out[:-2]) if len(out) > 2 else 1
    return {"batch": batch, "m": m, "k": k, "n": n, "bias": 0}


def _einsum_dims(layer: Layer) -> dict[str, int]:
    terms, out = _einsum_terms(str(layer.attributes.get("equation", "")))
    sizes: dict[str, int] = {}
    for term, t in zip(terms, layer.inputs, strict=False):
        letters = term.replace("...", "")
        sizes.update(zip(letters, t.shape[len(t.shape) - len(letters):], strict=False))
    left, right = set(terms[0]), set(terms[1]) if len(terms) > 1 else set()

    def prod(letters: set[str]) -> int:
        return math.prod(sizes.get(c, 1) for c in letters)

    batch = left & right & set(out)
    return {"batch": prod(batch), "m": prod((left & set(out)) - batch),
            "k": prod((left | right) - set(out)), "n": prod((right & set(out)) - batch),
            "bias": 0}


def _pool_dims(layer: Layer) -> dict[str, int]:
    x = layer.inputs[0]
    h, w = _spatial_2d(x.shape[2:])
    if layer.op_type.startswith("Global"):
        kh, kw, sh, sw = h, w, 1, 1
    else:
        kh, kw = _spatial_2d(list(layer.attributes["kernel_shape"]))
        strides = list(layer.attributes["strides"])
        sh, sw = (strides[0] if len(strides) > 1 else 1), strides[-1]
    return {"batch": x.shape[0], "channels": x.shape[1], "h": h, "w": w,
            "kernel_h": kh, "kernel_w": kw, "stride_h": sh, "stride_w": sw}


def _norm_dims(layer: Layer) -> tuple[str, dict[str, int]]:
    x = layer.inputs[0]
    if layer.op_type == "BatchNormalization":  # statistics per channel over N·spatial
        channels = x.shape[1] if len(x.shape) > 1 else 1
        return "batchnorm", {"rows": channels, "cols": x.elements // channels}
    if layer.op_type in ("GroupNormalization", "InstanceNormalization"):
        groups = int(layer.attributes.get("num_groups", x.shape[1]))
        rows = x.shape[0] * groups
        return "layernorm", {"rows": rows, "cols": x.elements // rows}
    if layer.op_type == "LRN":
        return "elementwise", elementwise_dims(x, int(layer.attributes.get("size", 1)))
    axis = int(layer.attributes.get("axis", len(x.shape) - 1))
    cols = math.prod(x.shape[axis:])
    return "layernorm", {"rows": x.elements // max(cols, 1), "cols": cols}


def _softmax_dims(layer: Layer) -> dict[str, int]:
    x = layer.inputs[0]
    axis = int(layer.attributes.get("axis", len(x.shape) - 1))
    if layer.attributes.get("coerced_2d", False):
        cols = math.prod(x.shape[axis:])
    else:
        cols = x.shape[axis] if x.shape else 1
    return {"rows": x.elements // max(cols, 1), "cols": cols}


def _reduce_dims(layer: Layer) -> dict[str, int]:
    x, out = layer.inputs[0], layer.outputs[0]
    if out.elements >= x.elements:  # CumSum and friends keep the shape: reduce along axis
        axis = int(layer.attributes.get("axis", -1)) % max(len(x.shape), 1)
        cols = x.shape[axis] if x.shape else 1
        return {"rows": x.elements // max(cols, 1), "cols": cols}
    return {"rows": out.elements, "cols": x.elements // max(out.elements, 1)}
