"""Kernels a training step runs that an eval-mode graph leaves out: dropout and the loss.

An export (and `graph.zoo`'s graphs) is the eval forward: it has no Dropout and ends at the
logits. A training step in eager PyTorch also runs

- dropout on each tensor the graph names in `ModelGraph.dropout_tensors`: one
  `fused_dropout` kernel forward (the output and a one-byte mask), one `masked_scale` kernel
  backward, each one op on the host;
- the loss, cross entropy over each float output that is not a key/value cache
  (`loss_outputs`), as `F.cross_entropy` and Hugging Face's losses run it: a LogSoftmax over
  the last axis (in fp32 under autocast, which casts half logits up first) and its backward.
  The NLL's gather and its gradient's scatter touch one element per row and are left out.

On the second H200 run's profiles these were a tenth of a bf16 forward's kernels (BERT-base at
batch 16: 0.43 of 2.8 ms; GPT-2 small at batch 4: the 50,257-wide LogSoftmax alone 0.38 ms
forward and 0.45 ms backward). `step.memory_walk` charges the same tensors' bytes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from gpuplan_estimator.core.layers import FLOAT_DTYPES, Layer, ModelGraph, OpFamily, TensorInfo
from gpuplan_estimator.graph import opcost

CACHE_OUTPUT_PREFIX = "present"
"""How Hugging Face's exporters (torch.onnx through `transformers`, Optimum) name a decoder's
key/value cache outputs: `present.{layer}.key`, `present.{layer}.value`,
`present_key_values...`. The loss reads the logits alone."""
DROPOUT_OP = "Dropout"
LOSS_OP = "LogSoftmax"
ROLE = "training_op"
"""The role of these ops' items, forward and backward. The host prices each as what it is, one
module call forward and one autograd node backward (`step.host`), not as the fitted average of
a model's own ops, whose Python (attention's reshapes, a block's bookkeeping) a dropout or the
loss does not run."""


def is_cache_output(name: str) -> bool:
    """Whether a graph output is a key/value cache (`CACHE_OUTPUT_PREFIX`), not a logit."""
    return name.lower().startswith(CACHE_OUTPUT_PREFIX)


def graph_outputs(layers: Sequence[Layer]) -> list[TensorInfo]:
    """Float tensors made and never read: the model's outputs (the logits, a cache). A layer
    that reads nothing is no output's maker: a torch.onnx export leaves constants whose
    readers were folded away (ViT-B/16's dynamo export: 571, 60 of them float scalars), and
    each would otherwise get a loss."""
    read = {t.name for la in layers for t in la.inputs}
    return [t for la in layers if la.inputs for t in la.outputs
            if t.name not in read and t.dtype in FLOAT_DTYPES and t.shape]


def loss_outputs(layers: Sequence[Layer]) -> list[TensorInfo]:
    """The outputs a training loss scores: every float output but a key/value cache."""
    return [t for t in graph_outputs(layers) if not is_cache_output(t.name)]


def with_training_ops(graph: ModelGraph) -> ModelGraph:
    """`graph` with a Dropout layer after the producer of each of its `dropout_tensors` and a
    LogSoftmax over each loss output at its end. The new layers' outputs are read by nothing
    (the layers after a dropout keep reading its input), so no other layer's work changes."""
    dropped = set(graph.dropout_tensors)
    layers: list[Layer] = []
    for layer in graph.layers:
        layers.append(layer)
        layers += [_layer(f"{t.name}.dropout", DROPOUT_OP, OpFamily.ELEMENTWISE, t, t.dtype)
                   for t in layer.outputs if t.name in dropped]
    losses = [_layer(f"{t.name}.loss", LOSS_OP, OpFamily.SOFTMAX, t, "float32",
                     {"axis": len(t.shape) - 1, "coerced_2d": False})
              for t in loss_outputs(graph.layers)]
    return replace(graph, layers=tuple(layers + losses))


def _layer(name: str, op_type: str, family: OpFamily, source: TensorInfo, dtype: str,
           attributes: dict[str, object] | None = None) -> Layer:
    out = TensorInfo(name, source.shape, dtype)
    attrs = dict(attributes or {})
    read, written = opcost.node_bytes(op_type, family, (source,), (out,))
    return Layer(name=name, op_type=op_type, family=family, inputs=(source,), outputs=(out,),
                 flops=opcost.node_flops(op_type, family, (source,), (out,), attrs),
                 bytes_read=read, bytes_written=written, parameter_count=0, attributes=attrs)
