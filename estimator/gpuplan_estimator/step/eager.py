"""Pure: what eager PyTorch runs where an export writes something else (issue #30).

An exporter spells one PyTorch op as several ONNX nodes, or a view as a node, and the step's
compute (`decomposition`), dtype flow (`autocast`) and memory walk (`memory_walk`) must read
them the same way. The facts live here once:

- `linear_biases`: torch's `linear` over a 3-D input is exported as MatMul + Add(bias). Eager
  PyTorch runs one GEMM with the bias in its epilogue (addmm on the flattened input): the Add
  is no kernel of its own, and its output is the GEMM's, in the GEMM's dtype.
- `is_select`: `x[i]` / `torch.select` is exported as a Gather with a 0-d index. Eager PyTorch
  returns a view; only an embedding lookup (an index tensor) gathers.
- `CLONE_OPS`: `aten.clone` (`.contiguous()`) is exported as Identity. It is one TensorIterator
  copy: a read and a write of every element, whatever the strides of its input, which is what
  a one-operand elementwise kernel moves (`COPY_PASS_OP`).
- `materialised_constants`: a structure-only graph (`graph.exporting`, `graph.zoo`, a stored
  graph's stripped initializers) makes each weight a `ConstantOfShape` of its literal shape
  and each buffer an `Expand` of a literal scalar. Eager PyTorch holds them as tensors: no call
  issues them, in a step or anywhere.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from gpuplan_estimator.core.layers import Layer, ModelGraph

CLONE_OPS = frozenset({"Identity"})
"""A dynamo export's `aten.clone`: a copy of its own (not a view)."""
COPY_PASS_OP = "mulu"
"""The elementwise op a one-read-one-write pass is priced as (a clone, an eval-mode batch
norm's per-channel affine): the tensor-scalar multiply the benchmarks time moves the same
bytes."""
GEMM_OPS = frozenset({"MatMul", "Gemm"})
CONSTANT_MAKERS = frozenset({"ConstantOfShape", "Expand"})
"""Shape-only ops that, fed only literals, stand for a weight or buffer
(`materialised_constants`)."""
LITERAL_OPS = frozenset({"Constant"})
"""Ops whose output is a literal of the file."""


def parameter_sizes(graph: ModelGraph) -> dict[str, int]:
    """Parameter name -> elements. A layer may name a parameter it reads through a view (a
    dynamo export's MatMul reads Transpose(weight)), so sizes come from wherever the name is."""
    names = {n for la in graph.layers for n in la.parameter_inputs}
    params: dict[str, int] = {}
    for la in graph.layers:
        for t in (*la.inputs, *la.outputs):
            if t.name in names:
                params[t.name] = t.elements
    return params


def linear_biases(layers: Iterable[Layer], params: Mapping[str, int]) -> dict[str, str]:
    """Add layer -> the MatMul/Gemm output it adds a parameter bias to, when that Add is the
    product's only reader: torch's linear (addmm) makes the sum in place of the product."""
    layers = list(layers)
    readers: dict[str, int] = {}
    for la in layers:
        for t in la.inputs:
            readers[t.name] = readers.get(t.name, 0) + 1
    made_by = {t.name: la.op_type for la in layers for t in la.outputs}
    out: dict[str, str] = {}
    for la in layers:
        if la.op_type != "Add" or len(la.inputs) != 2:
            continue
        a, b = la.inputs
        for product, bias in ((a, b), (b, a)):
            if bias.name in params and made_by.get(product.name) in GEMM_OPS \
                    and readers.get(product.name) == 1:
                out[la.name] = product.name
    return out


def is_select(layer: Layer, params: Mapping[str, int]) -> bool:
    """`x[i]` with one index (torch's select): a view of `x`. An embedding lookup reads a
    parameter through an index tensor and copies."""
    return layer.op_type == "Gather" and len(layer.inputs) > 1 \
        and layer.inputs[0].name not in params and not layer.inputs[1].shape


def materialised_constants(graph: ModelGraph) -> frozenset[str]:
    """Layers that only materialise a literal: a `CONSTANT_MAKERS` node each of whose inputs is
    a `Constant`'s output or an integer tensor no layer makes (an initializer: a literal shape).
    Structure-only graphs write every weight and buffer so; a model's data path never reads
    only literals, and a graph input it reads is made by no layer but is not an integer
    shape fed to one of these."""
    made_by = {t.name: la.op_type for la in graph.layers for t in la.outputs}
    return frozenset(
        la.name for la in graph.layers
        if la.op_type in CONSTANT_MAKERS and la.inputs and all(
            made_by.get(t.name) in LITERAL_OPS
            or (t.name not in made_by and t.dtype in ("int64", "int32"))
            for t in la.inputs))
