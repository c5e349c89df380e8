"""Plain-data types for a parsed model graph: tensors, op families, layers and fusion units.

These are the contract between `graph` (the only ONNX reader) and everything downstream.
All sizes are concrete: a symbolic dim is bound before a `Layer` exists, never read as 0.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

FLOAT_DTYPES = frozenset({"float64", "float32", "float16", "bfloat16", "float8"})
"""Tensor dtypes autograd can differentiate (and mixed precision casts)."""
DTYPE_BYTES: Mapping[str, int] = MappingProxyType(
    {
        "float64": 8,
        "float32": 4,
        "float16": 2,
        "bfloat16": 2,
        "float8": 1,
        "int64": 8,
        "int32": 4,
        "int16": 2,
        "int8": 1,
        "uint8": 1,
        "bool": 1,
    }
)


class OpFamily(str, enum.Enum):
    """Kind of kernel a node runs; each family gets its own latency model."""

    CONV = "conv"
    MATMUL = "matmul"  # MatMul, Gemm, batched matmul, Einsum contractions
    POOLING = "pooling"
    NORMALIZATION = "normalization"  # BatchNorm, LayerNorm, GroupNorm, InstanceNorm, RMSNorm
    SOFTMAX = "softmax"
    ELEMENTWISE = "elementwise"  # arithmetic and activations
    REDUCTION = "reduction"
    DATA_MOVEMENT = "data_movement"  # Transpose, Concat, Split, Slice, Pad, copying Reshape...
    EMBEDDING = "embedding"  # Gather from a parameter table
    SHAPE_ONLY = "shape_only"  # costs nothing at run time: Shape, metadata-only Reshape, ...
    OTHER = "other"  # unknown ops: priced by the roofline and listed as uncovered


@dataclass(frozen=True)
class TensorInfo:
    """A tensor with fully concrete shape."""

    name: str
    shape: tuple[int, ...]
    dtype: str  # key of DTYPE_BYTES

    @property
    def elements(self) -> int:
        """Number of elements: the product of the shape (1 for a scalar)."""
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def size_bytes(self) -> int:
        """Size of the tensor in bytes at its dtype."""
        return self.elements * DTYPE_BYTES[self.dtype]


@dataclass(frozen=True)
class Layer:
    """One ONNX node with its cost features (forward pass, one batch)."""

    name: str
    op_type: str
    family: OpFamily
    inputs: tuple[TensorInfo, ...]
    outputs: tuple[TensorInfo, ...]
    flops: int  # floating-point operations; a multiply-accumulate counts 2
    bytes_read: int
    bytes_written: int
    parameter_count: int  # trainable elements this node owns (weights, bias, scale...)
    parameter_inputs: tuple[str, ...] = ()  # names of inputs that are trainable parameters
    attributes: Mapping[str, Any] = field(default_factory=dict)  # kernel, strides, pads, ...
    unit: str = ""  # id of the fusion unit this layer belongs to ("" = alone)

    @property
    def bytes_moved(self) -> int:
        """Bytes read plus bytes written by one forward run of the node."""
        return self.bytes_read + self.bytes_written

    @property
    def arithmetic_intensity(self) -> float:
        """FLOPs per byte moved (0.0 when the node moves no bytes)."""
        return self.flops / self.bytes_moved if self.bytes_moved else 0.0


@dataclass(frozen=True)
class FusionUnit:
    """Nodes a framework typically runs as one kernel (e.g. Conv+BatchNorm+Relu)."""

    id: str
    pattern: str  # e.g. "conv_bn_relu", "matmul_bias_act", "gelu", "layernorm"
    layer_names: tuple[str, ...]


KV_CACHE_METADATA_KEY = "gpuplan.kv_cache"
"""ONNX model metadata naming, comma-separated, the tensors a decoder with `use_cache` copies
into its cache (Hugging Face's `DynamicCache.update` concatenates each layer's keys and values
into tensors of its own, which the returned output holds): what `graph.zoo`, `graph.hf_blocks`
and `graph.hf_seq2seq` write for a decoder, `ModelGraph.cache_tensors` once loaded."""


DROPOUT_METADATA_KEY = "gpuplan.dropout"
"""ONNX model metadata naming, comma-separated, the tensors a training forward applies dropout
to (a Hugging Face config's hidden, residual and embedding dropout above 0): the graphs leave
Dropout out, as an eval export does, but training keeps a bool mask of each for backward."""


@dataclass(frozen=True)
class ModelGraph:
    """A parsed model: layers in topological order plus what could not be classified."""

    name: str
    layers: tuple[Layer, ...]
    units: tuple[FusionUnit, ...]
    dim_bindings: Mapping[str, int]
    opset: int
    unknown_op_types: tuple[str, ...] = ()  # op types that landed in OpFamily.OTHER
    # Why the export looks to have folded BatchNorm into Conv ("" = it does not; #35).
    folded_batchnorm: str = ""
    cache_tensors: tuple[str, ...] = ()
    """Tensors a decoder's forward copies into its key/value cache (`KV_CACHE_METADATA_KEY`):
    each layer's keys and values (`step.memory_walk` says how long the copies live)."""
    dropout_tensors: tuple[str, ...] = ()
    """Tensors a training forward applies dropout to (`DROPOUT_METADATA_KEY`): each keeps a
    one-byte mask for its backward."""

    @property
    def parameter_count(self) -> int:
        """Trainable parameter elements summed over all layers."""
        return sum(layer.parameter_count for layer in self.layers)

    @property
    def parameter_tensor_count(self) -> int:
        """Distinct trainable tensors (an optimizer's per-tensor work counts these)."""
        return len({name for layer in self.layers for name in layer.parameter_inputs})
