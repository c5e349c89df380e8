"""Pure: how a framework runs the fusion units `fusion` found, as kernel overrides per layer.

PyTorch eager (the framework of the measured GPU data) runs every ONNX node as its own kernel,
so it needs no overrides. onnxruntime's default graph optimisations (ORT_ENABLE_ALL) rewrite
the graph at session load:

- Conv+BatchNormalization: the BN is folded into the conv weights and bias (inference only);
  Conv+activation runs as one FusedConv. The conv kernel is unchanged, the rest is free.
- MatMul+Add(bias)[+activation]: one Gemm / FusedMatMul with the bias (and activation) in its
  epilogue.
- The decomposed GELU (Div/Erf/Add/Mul/Mul) becomes one Gelu kernel; the decomposed
  LayerNorm (ReduceMean/Sub/Pow/ReduceMean/Add/Sqrt/Div[/Mul/Add]) one LayerNormalization;
  the decomposed softmax (ReduceMax/Sub/Exp/ReduceSum/Div) one Softmax.

- Pooling after its NCHWc layout transform runs as MLAS's blocked pooling kernel, for average
  as for max. The standalone AveragePool the bench times takes the generic NCHW path, 30-100x
  slower per element than MaxPool, so onnxruntime's AveragePool is priced as a MaxPool of the
  same window (Inception-v2 at batch 8: 39.7 ms predicted from the generic path, 2.1 ms
  measured in the model with onnxruntime's profiler).

- NCHWc layout (CPU): onnxruntime runs convolutions in MLAS's blocked NCHWc layout, with a
  ReorderInput/ReorderOutput around each. Reorders between two NCHWc ops cancel, and ReLU, Add,
  Concat, pooling and (folded) batch norm keep the layout, so inside a CNN they are gone
  (ResNet-50 at batch 8, profiled: 0.01 ms of reorders), while a single-Conv benchmark pays
  both (78 ms of its 423 ms over ResNet-50's 53 convs; the convs alone: 345 ms isolated, 347 ms
  in the model). The module `layout_credits` prices what the model does not run.

Attention (MatMul/scale/mask/Softmax) is only fused by the separate transformers optimizer,
so it keeps its per-node kernels here.

torch.compile (Inductor, inference) generates one Triton kernel per chain of pointwise ops and
the reduction they feed, while GEMMs stay cuBLAS calls:

- the decomposed GELU/LayerNorm/softmax units run as one kernel (as above);
- the attention scale and mask are computed inside the softmax kernel (folded);
- a residual Add that feeds a LayerNormalization is computed inside the LayerNorm kernel.

Both fused frameworks are priced for inference only: their folds have no backward here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from gpuplan_estimator.core.errors import InvalidRequestError
from gpuplan_estimator.core.layers import Layer, ModelGraph
from gpuplan_estimator.core.options import FRAMEWORKS, ONNXRUNTIME, PYTORCH_COMPILED, PYTORCH_EAGER
from gpuplan_estimator.graph import opcost

"""WorkItem attribute: elements of the conv's input and output whose NCHWc reorders the single-
node benchmark timed but the model skips."""

# Per-element FLOP conventions of the fused kernels, matching `opcost`'s single-op tables.
GELU_FLOPS_PER_ELEMENT = 8
LAYERNORM_FLOPS_PER_ELEMENT = 8


@dataclass(frozen=True)
class UnitKernel:
    """The one kernel a fused unit runs, priced on its sink layer."""

    kernel: str
    dims: Mapping[str, int]
    op: str
    flops: int
    elements_moved: int  # read + written, in elements of the activation dtype


# A layer name maps to its replacement kernel, or to None when its work is folded into
# another member's kernel (it costs nothing).
Overrides = Mapping[str, UnitKernel | None]


def overrides(graph: ModelGraph, framework: str) -> Overrides:
    """Kernel overrides of `framework` for the fusion units of `graph`."""
    if framework == PYTORCH_EAGER:
        return {}
    if framework not in FRAMEWORKS:
        raise InvalidRequestError(
            "framework", f"must be one of {', '.join(FRAMEWORKS)}, got {framework!r}")
    by_name = {layer.name: layer for layer in graph.layers}
    out: dict[str, UnitKernel | None] = {}
    for unit in graph.units:
        members = [by_name[name] for name in unit.layer_names if name in by_name]
        if len(members) != len(unit.layer_names) or len(members) < 2:
            continue
        if framework == ONNXRUNTIME:
            out.update(_unit_overrides(unit.pattern, members))
        else:
            out.update(_compiled_unit_overrides(unit.pattern, members))
    if framework == PYTORCH_COMPILED:
        out.update(dict.fromkeys(_residual_adds_into_layernorm(graph), None))
    if framework == ONNXRUNTIME:
        out.update({layer.name: _blocked_pool(layer) for layer in graph.layers
                    if layer.op_type == "AveragePool" and layer.name not in out})
    return out


def _blocked_pool(layer: Layer) -> UnitKernel:
    kernel, dims = opcost.kernel_dims(layer)
    moved = sum(t.elements for t in layer.inputs) + sum(t.elements for t in layer.outputs)
    return UnitKernel(kernel, dims, "MaxPool", layer.flops, moved)


def _compiled_unit_overrides(pattern: str, members: list[Layer]) -> dict[str, UnitKernel | None]:
    if pattern in ("attention_scores", "attention"):
        # The GEMMs and the softmax stay; the scale and mask between them fold into the softmax.
        soft = next(i for i, m in enumerate(members) if m.op_type == "Softmax")
        return dict.fromkeys((m.name for m in members[1:soft]), None)
    if pattern in ("gelu", "layernorm", "softmax"):
        return _unit_overrides(pattern, members)
    return {}  # conv/matmul epilogues: Inductor keeps cuBLAS/cuDNN calls and the eager BN


def _residual_adds_into_layernorm(graph: ModelGraph) -> list[str]:
    """Adds of two full-size tensors whose result a LayerNormalization reads."""
    normalised = {layer.inputs[0].name for layer in graph.layers
                  if layer.op_type == "LayerNormalization" and layer.inputs}
    return [layer.name for layer in graph.layers
            if layer.op_type == "Add" and layer.outputs
            and layer.outputs[0].name in normalised
            and opcost.full_size_operands(layer.inputs, layer.outputs[0]) == 2]


def _unit_overrides(pattern: str, members: list[Layer]) -> dict[str, UnitKernel | None]:
    if pattern.startswith(("conv", "matmul")):
        main = members[0]
        folded: dict[str, UnitKernel | None] = dict.fromkeys(
            (m.name for m in members[1:]), None)
        if pattern.startswith("matmul_bias") and main.op_type == "MatMul":
            folded[main.name] = _gemm_with_bias(main, members[1])
        return folded
    fused = {"gelu": _gelu, "layernorm": _layernorm, "softmax": _softmax}.get(pattern)
    if fused is None:  # attention_scores and future patterns: per-node kernels
        return {}
    sink = members[-1]
    result: dict[str, UnitKernel | None] = dict.fromkeys((m.name for m in members[:-1]), None)
    result[sink.name] = fused(members)
    return result


def _gemm_with_bias(matmul: Layer, add: Layer) -> UnitKernel:
    kernel, dims = opcost.kernel_dims(matmul)
    out = matmul.outputs[0].elements
    moved = sum(t.elements for t in matmul.inputs) + out + min(t.elements for t in add.inputs)
    return UnitKernel(kernel, {**dims, "bias": 1}, "Gemm", matmul.flops + out, moved)


def _rows_cols(layer: Layer) -> tuple[int, int]:
    """Rows and last-axis columns of the unit's input: the largest input of its first member
    (x of ``Mul(0.5, x)`` as well as of ``ReduceMean(x)``)."""
    x = max(layer.inputs, key=lambda t: t.elements)
    cols = x.shape[-1] if x.shape else 1
    return x.elements // max(cols, 1), cols


def _gelu(members: list[Layer]) -> UnitKernel:
    rows, cols = _rows_cols(members[0])
    n = rows * cols
    return UnitKernel("elementwise", {"rows": rows, "cols": cols, "operands": 1}, "gelu",
                      GELU_FLOPS_PER_ELEMENT * n, 2 * n)


def _layernorm(members: list[Layer]) -> UnitKernel:
    rows, cols = _rows_cols(members[0])
    n = rows * cols
    return UnitKernel("layernorm", {"rows": rows, "cols": cols}, "LayerNormalization",
                      LAYERNORM_FLOPS_PER_ELEMENT * n, 2 * n + 2 * cols)


def _softmax(members: list[Layer]) -> UnitKernel:
    rows, cols = _rows_cols(members[0])
    n = rows * cols
    return UnitKernel("softmax", {"rows": rows, "cols": cols}, "Softmax",
                      opcost.SOFTMAX_FLOPS_PER_ELEMENT * n, 2 * n)
