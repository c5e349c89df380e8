"""What an export left out of a graph that training runs (#35): BatchNorm folded into Conv.

Both torch.onnx exporters fold BatchNorm into the preceding convolution: TorchScript's in eval
mode (its constant folding rewrites the weights), dynamo's optimizer in either mode (the
onnxscript rule `FuseBatchNormIntoConv`). Priced for training, such a graph misses the
BatchNorm layers' time and saved activations (a torchvision ResNet-50 at batch 64 on a T4: 4.0
GiB / 399 ms folded against 6.6 GiB / 435 ms with BatchNorm, issue #35). The evidence, strongest
first: the dynamo rewrite's name in a Conv node's metadata; Conv weights TorchScript renamed to
`onnx::Conv_N` constants; failing both, a CNN whose every Conv has a bias and which has no
normalization op at all (the shape folding leaves; a VGG without BatchNorm looks the same, so
that one is worded as a likelihood).
"""

from __future__ import annotations

from onnx import ModelProto, NodeProto

FOLD_RULE = "FuseBatchNormIntoConv"
"""The onnxscript rewrite rule the dynamo exporter's optimizer records on a node it folded."""
RULE_KEY = "pkg.onnxscript.rewriter.rule_name"
TORCHSCRIPT_CONSTANT = "onnx::Conv_"
"""How the TorchScript exporter names a Conv weight its constant folding rewrote."""
# A net normalised some other way (AlexNet's LRN, ConvNeXt's LayerNorm) folded nothing.
NORM_OPS = frozenset({"BatchNormalization", "InstanceNormalization", "GroupNormalization",
                      "LayerNormalization", "LpNormalization", "LRN"})
MIN_CONVS = 4
"""Fewer convolutions than this are not a CNN the bias-only pattern can speak for."""

TRAIN_EXPORT_FIX = (
    "export for training instead: TorchScript `torch.onnx.export(model, args, path, "
    "dynamo=False, training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False)`, "
    "dynamo `torch.onnx.export(model, args, path, dynamo=True, optimize=False)` "
    "(docs/export.md)")


def _folded_by_dynamo(conv: NodeProto) -> bool:
    return any(p.key == RULE_KEY and FOLD_RULE in p.value for p in conv.metadata_props)


def folded_batchnorm(model: ModelProto) -> str:
    """Why `model`'s BatchNorm looks folded into its convolutions, or "" when it does not."""
    nodes = model.graph.node
    convs = [n for n in nodes if n.op_type == "Conv"]
    if not convs or any(n.op_type == "BatchNormalization" for n in nodes):
        return ""
    dynamo = sum(_folded_by_dynamo(n) for n in convs)
    if dynamo:
        return (f"{dynamo} of its {len(convs)} Conv nodes record torch.onnx's "
                f"'{FOLD_RULE}' rewrite (the dynamo exporter's optimizer folded BatchNorm)")
    renamed = sum(len(n.input) > 1 and n.input[1].startswith(TORCHSCRIPT_CONSTANT)
                  for n in convs)
    if model.producer_name == "pytorch" and renamed:
        return (f"{renamed} of its {len(convs)} Conv weights are TorchScript-exporter "
                f"constants ('{TORCHSCRIPT_CONSTANT}…') and no BatchNormalization is left (an "
                "eval-mode export folded it)")
    biased = all(len(n.input) > 2 and n.input[2] for n in convs)
    if len(convs) >= MIN_CONVS and biased and not any(n.op_type in NORM_OPS for n in nodes):
        return (f"all {len(convs)} Conv nodes have a bias and the graph has no normalization "
                "op, what BatchNorm folded by an eval-mode export leaves (a model built without "
                "BatchNorm looks the same)")
    return ""


def training_warnings(mode: str, folded_evidence: str) -> list[str]:
    """Warnings for pricing `mode` on a graph with that folding evidence ("" = none)."""
    if mode != "train" or not folded_evidence:
        return []
    return [f"BatchNorm looks folded into the convolutions: {folded_evidence}. Training runs "
            "BatchNorm, so its time and saved activations are missing from these figures; "
            + TRAIN_EXPORT_FIX]
