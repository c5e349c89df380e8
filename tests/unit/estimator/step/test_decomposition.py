"""Training-step decomposition: forward items, derived backward work, optimizer passes."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import pytest

from gpuplan_estimator.core.errors import InvalidRequestError
from gpuplan_estimator.core.layers import Layer, ModelGraph, OpFamily
from gpuplan_estimator.core.workload import Phase, WorkItem
from gpuplan_estimator.graph import examples
from gpuplan_estimator.step import backward, eager, gradient_sums, host, training_ops
from gpuplan_estimator.step.decomposition import (
    CONSTANT_ROLE,
    TrainingSettings,
    build_step,
    gradient_tensors,
    optimizer_items,
)
from gpuplan_testing.layer_builders import layer, t


def graph(*layers: Layer) -> ModelGraph:
    unknown = tuple(sorted({x.op_type for x in layers if x.family is OpFamily.OTHER}))
    return ModelGraph("test", tuple(layers), (), {}, 17, unknown)


def mlp(batch: int = 32) -> ModelGraph:
    return graph(
        layer("fc1", "Gemm", [t("x", batch, 784), t("w1", 784, 256), t("b1", 256)],
              [t("h", batch, 256)], params=["w1", "b1"]),
        layer("relu", "Relu", [t("h", batch, 256)], [t("a", batch, 256)]),
        layer("fc2", "Gemm", [t("a", batch, 256), t("w2", 256, 10), t("b2", 10)],
              [t("y", batch, 10)], params=["w2", "b2"]),
        layer("softmax", "Softmax", [t("y", batch, 10)], [t("p", batch, 10)]),
    )


def settings(**kw: Any) -> TrainingSettings:
    return TrainingSettings(**({"batch_size": 32} | kw))


def by_layer(items: Sequence[WorkItem], name: str) -> list[WorkItem]:
    return [i for i in items if i.layer == name]


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        ({"mode": "serve"}, "mode"),
        ({"optimizer": "lamb"}, "optimizer"),
        ({"precision": "fp8"}, "precision"),
        ({"batch_size": 0}, "batch_size"),
        ({"batch_size": -3}, "batch_size"),
        ({"batch_size": 2.5}, "batch_size"),
        ({"optimizer_impl": "apex"}, "optimizer_impl"),
        ({"optimizer": "rmsprop", "optimizer_impl": "fused"}, "optimizer_impl"),
    ],
)
def test_validate_names_the_bad_field(kw: dict[str, Any], field: str) -> None:
    errors = settings(**kw).validate()
    assert len(errors) == 1 and errors[0].startswith(f"{field}: ")
    with pytest.raises(InvalidRequestError) as info:
        build_step(mlp(), settings(**kw))
    assert info.value.field == field


def test_validate_reports_every_error() -> None:
    errors = TrainingSettings(batch_size=0, mode="x", optimizer="y", precision="z").validate()
    assert [e.split(":")[0] for e in errors] == ["mode", "optimizer", "precision", "batch_size"]
    assert settings().validate() == ()


def test_mlp_backward_gemms_follow_the_chain_rule() -> None:
    step = build_step(mlp(), settings())
    fc1 = by_layer(step.backward, "fc1")
    # x is a graph input: no dgrad, only the weight and bias gradients.
    assert [(i.kernel, i.role) for i in fc1] == [("gemm", "wgrad"), ("reduce", "bgrad")]
    assert dict(fc1[0].dims) == {"batch": 1, "m": 784, "k": 32, "n": 256, "bias": 0}
    assert dict(fc1[1].dims) == {"rows": 256, "cols": 32}
    fc2 = by_layer(step.backward, "fc2")
    assert [i.role for i in fc2] == ["dgrad", "wgrad", "bgrad"]
    assert dict(fc2[0].dims) == {"batch": 1, "m": 32, "k": 10, "n": 256, "bias": 0}
    fwd_flops = by_layer(step.forward, "fc2")[0].flops
    gemm_bwd = sum(i.flops for i in fc2 if i.kernel == "gemm")
    # 2·M·K·N each for dX and dW versus forward 2·M·K·N (+ the fused bias add).
    assert gemm_bwd == 2 * (fwd_flops - 32 * 10)
    assert [i.kernel for i in by_layer(step.backward, "relu")] == ["elementwise"]
    assert by_layer(step.backward, "relu")[0].op == "relu_grad"
    assert [i.kernel for i in by_layer(step.backward, "softmax")] == ["softmax"]
    assert all(i.phase is Phase.BACKWARD for i in step.backward)


def test_attention_bmm_computes_both_operand_gradients() -> None:
    g = graph(
        layer("q", "MatMul", [t("x", 8, 128, 64), t("wq", 64, 64)], [t("q", 8, 128, 64)],
              params=["wq"]),
        layer("k", "MatMul", [t("x", 8, 128, 64), t("wk", 64, 64)], [t("k", 8, 128, 64)],
              params=["wk"]),
        layer("kt", "Transpose", [t("k", 8, 128, 64)], [t("kt", 8, 64, 128)],
              attrs={"perm": [0, 2, 1]}),
        layer("scores", "MatMul", [t("q", 8, 128, 64), t("kt", 8, 64, 128)],
              [t("s", 8, 128, 128)]),
    )
    step = build_step(g, settings(batch_size=8))
    scores = by_layer(step.backward, "scores")
    assert [i.role for i in scores] == ["dgrad", "dgrad"]
    assert dict(scores[0].dims) == {"batch": 8, "m": 128, "k": 128, "n": 64, "bias": 0}
    assert dict(scores[1].dims) == {"batch": 8, "m": 64, "k": 128, "n": 128, "bias": 0}
    # Projections of a graph input: weight gradient only, batch folded into the contraction.
    assert [(i.role, dict(i.dims)["k"]) for i in by_layer(step.backward, "q")] == [
        ("wgrad", 8 * 128)]
    # Kᵀ is a view in eager PyTorch (the GEMM reads it through cuBLAS's transpose flag), and so
    # is its gradient: no copy either way (`step.views`).
    assert by_layer(step.backward, "kt") == [] and "kt" in step.shape_only


def test_conv_dgrad_swaps_channels_on_output_grid_with_forward_flops() -> None:
    x, w = t("x", 4, 64, 56, 56), t("w", 128, 64, 3, 3)
    conv = layer("conv", "Conv", [x, w], [t("y", 4, 128, 28, 28)], params=["w"],
                 attrs={"strides": [2, 2], "pads": [1, 1, 1, 1]})
    prep = layer("prep", "Relu", [t("raw", 4, 64, 56, 56)], [t("x0", 4, 64, 56, 56)])
    scale = layer("scale", "Mul", [t("s", 1), t("x0", 4, 64, 56, 56)],
                  [t("x0b", 4, 64, 56, 56)], params=["s"])
    relu_in = layer("pre", "Relu", [t("x0b", 4, 64, 56, 56)], [x])
    g = graph(prep, scale, relu_in, conv)
    step = build_step(g, settings(batch_size=4))
    dgrad, wgrad = by_layer(step.backward, "conv")
    fwd = by_layer(step.forward, "conv")[0]
    assert (dgrad.role, wgrad.role) == ("dgrad", "wgrad")
    assert dgrad.dims["c_in"] == 128 and dgrad.dims["c_out"] == 64
    assert (dgrad.dims["h"], dgrad.dims["w"], dgrad.dims["stride_h"]) == (28, 28, 1)
    assert dgrad.flops == wgrad.flops == fwd.flops
    assert dict(wgrad.dims) == dict(fwd.dims)
    # "raw" is a graph input: the preprocessing before the first parameter needs no backward.
    assert step.no_grad == ("prep",)
    assert [i.op for i in by_layer(step.backward, "scale")] == ["mul_grad", "ReduceSum"]


def test_gradient_tensors_follow_parameters_only_through_float_tensors() -> None:
    g = graph(
        layer("emb", "Gather", [t("table", 100, 16), t("ids", 2, 5, dtype="int64")],
              [t("e", 2, 5, 16)], params=["table"]),
        layer("shape", "Shape", [t("e", 2, 5, 16)], [t("s", 3, dtype="int64")]),
        layer("norm", "LayerNormalization", [t("e", 2, 5, 16), t("g", 16), t("b", 16)],
              [t("n", 2, 5, 16)], params=["g", "b"]),
    )
    needs = gradient_tensors(g)
    assert {"table", "e", "g", "b", "n"} <= needs
    assert "s" not in needs and "ids" not in needs
    step = build_step(g, settings(batch_size=2))
    assert step.shape_only == ("shape",)
    shape_item = by_layer(step.forward, "shape")[0]
    assert (shape_item.kernel, shape_item.flops, shape_item.bytes_moved) == ("none", 0, 0)
    emb = by_layer(step.backward, "emb")
    assert [(i.role, dict(i.dims)) for i in emb] == [
        ("grad_zero", {"rows": 100, "cols": 16, "operands": 0}),
        ("scatter_add", {"elements": 160})]
    (norm,) = by_layer(step.backward, "norm")
    assert norm.kernel == "layernorm" and norm.count == 2


def test_inference_has_forward_only() -> None:
    step = build_step(mlp(), settings(mode="inference"))
    assert len(step.forward) == 4 and step.backward == () and step.optimizer == ()


@pytest.mark.parametrize(
    ("optimizer", "bytes_per_param", "passes"),
    [("sgd", 12, 1), ("momentum", 32, 3), ("adam", 72, 7), ("adamw", 80, 8),
     ("adagrad", 44, 4), ("rmsprop", 52, 5)],
)
def test_optimizer_passes_match_pytorch_foreach_arithmetic(
    optimizer: str, bytes_per_param: int, passes: int
) -> None:
    items = optimizer_items(1_000_000, settings(optimizer=optimizer))
    assert len(items) == passes
    assert sum(i.bytes_moved for i in items) == bytes_per_param * 1_000_000
    assert {i.dtype for i in items} == {"float32"}
    assert all(i.phase is Phase.OPTIMIZER and i.kernel == "elementwise" for i in items)
    assert items[0].dims["rows"] * items[0].dims["cols"] >= 1_000_000


def test_mixed_precision_optimizer_has_no_cast_and_fp16_unscales() -> None:
    fp32 = optimizer_items(1000, settings())
    bf16 = optimizer_items(1000, settings(precision="bf16"))
    fp16 = optimizer_items(1000, settings(precision="fp16"))
    assert [i.op for i in bf16] == [i.op for i in fp32]  # weight casts are forward work
    assert [i.op for i in fp16] == ["unscale"] + [i.op for i in bf16]


@pytest.mark.parametrize(
    ("optimizer", "bytes_per_param"),
    [("sgd", 12), ("momentum", 20), ("adam", 28), ("adamw", 28), ("adagrad", 20)],
)
def test_a_fused_optimizer_reads_and_writes_each_tensor_once(optimizer: str,
                                                            bytes_per_param: int) -> None:
    foreach = optimizer_items(1_000_000, settings(optimizer=optimizer))
    fused = optimizer_items(1_000_000, settings(optimizer=optimizer, optimizer_impl="fused"))
    assert len(fused) == 1 and fused[0].bytes_moved == bytes_per_param * 1_000_000
    assert fused[0].bytes_moved <= sum(i.bytes_moved for i in foreach)
    assert fused[0].flops == sum(i.flops for i in foreach)  # the same arithmetic, one pass


def test_a_fused_optimizer_unscales_fp16_gradients_inside_its_kernel() -> None:
    fused = optimizer_items(1000, settings(precision="fp16", optimizer_impl="fused"))
    assert [i.op for i in fused] == ["fused_adamw"]


def test_a_for_loop_optimizer_does_the_foreach_arithmetic() -> None:
    # Its extra cost is one launch per tensor and pass: the host model's, not the kernels'.
    foreach = optimizer_items(1000, settings())
    loop = optimizer_items(1000, settings(optimizer_impl="for-loop"))
    assert [(i.op, i.bytes_moved) for i in loop] == [(i.op, i.bytes_moved) for i in foreach]


def test_precision_sets_compute_dtype_and_bytes() -> None:
    fp32 = build_step(mlp(), settings())
    fp16 = build_step(mlp(), settings(precision="fp16"))
    tf32 = build_step(mlp(), settings(precision="tf32"))
    fc1_fp16 = next(i for i in fp16.forward if i.layer == "fc1" and i.role == "fwd")
    # softmax and the loss's LogSoftmax over its output run in fp32 (autocast's fp32 list)
    assert {i.dtype for i in fp16.forward if i.layer not in ("softmax", "p.loss")} == {
        "float16"}
    assert fc1_fp16.bytes_moved * 2 == fp32.forward[0].bytes_moved
    assert tf32.forward[0].attributes == {"math": "tf32"}
    assert tf32.forward[1].attributes == {}
    assert {i.dtype for i in tf32.forward} == {"float32"}


def test_elementwise_add_passes_gradient_and_reduces_broadcast_bias() -> None:
    g = graph(
        layer("mm", "MatMul", [t("x", 64, 32), t("w", 32, 16)], [t("y", 64, 16)], params=["w"]),
        layer("bias", "Add", [t("y", 64, 16), t("b", 16)], [t("z", 64, 16)], params=["b"]),
        layer("mul", "Mul", [t("z", 64, 16), t("y", 64, 16)], [t("m", 64, 16)]),
    )
    step = build_step(g, settings(batch_size=64))
    assert [(i.kernel, dict(i.dims)) for i in by_layer(step.backward, "bias")] == [
        ("reduce", {"rows": 16, "cols": 64})]
    assert [i.op for i in by_layer(step.backward, "mul")] == ["mul_grad", "mul_grad"]


def test_unknown_kernel_cost_is_an_error() -> None:
    with pytest.raises(ValueError, match="pool"):
        backward.kernel_cost("pool", {}, 4)


def test_elementwise_gradient_reads_broadcast_operands_for_free() -> None:
    # scale: z [64,16] * gamma [16]; dz = dY * gamma (gamma broadcast -> operands 1),
    # dgamma = reduce(dY * z) (z full-size -> operands 2), then the [16] column sum.
    g = graph(
        layer("mm", "MatMul", [t("x", 64, 32), t("w", 32, 16)], [t("z", 64, 16)], params=["w"]),
        layer("scale", "Mul", [t("z", 64, 16), t("gamma", 16)], [t("s", 64, 16)],
              params=["gamma"]),
        layer("act", "Tanh", [t("s", 64, 16)], [t("a", 64, 16)]),
    )
    step = build_step(g, settings(batch_size=64))
    assert [(i.kernel, i.dims.get("operands")) for i in by_layer(step.backward, "scale")] == [
        ("elementwise", 1), ("elementwise", 2), ("reduce", None)]
    assert [dict(i.dims) for i in by_layer(step.backward, "act")] == [
        {"rows": 64, "cols": 16, "operands": 2}]  # unary: dY and X


def cnn_block(op: str, attrs: dict[str, Any] | None = None) -> ModelGraph:
    """conv -> `op` (on the conv output and, for Concat, the input) -> conv."""
    x, y = t("x", 8, 16, 12, 12), t("y", 8, 16, 12, 12)
    inputs = [y, x] if op == "Concat" else [y]
    if op == "BatchNormalization":
        inputs += [t(n, 16) for n in ("scale", "bias", "mean", "var")]
    c_out = 32 if op == "Concat" else 16
    return graph(
        layer("conv1", "Conv", [x, t("w1", 16, 16, 3, 3)], [y], params=["w1"],
              attrs={"pads": [1, 1, 1, 1]}),
        layer("mid", op, inputs, [t("z", 8, c_out, 12, 12)],
              params=["scale", "bias"] if op == "BatchNormalization" else [], attrs=attrs),
        layer("conv2", "Conv", [t("z", 8, c_out, 12, 12), t("w2", 16, c_out, 3, 3)],
              [t("o", 8, 16, 12, 12)], params=["w2"], attrs={"pads": [1, 1, 1, 1]}),
    )


def test_concat_is_one_contiguous_copy_whose_gradients_are_views() -> None:
    step = build_step(cnn_block("Concat", {"axis": 1}), settings(batch_size=8))
    (fwd,) = by_layer(step.forward, "mid")
    assert (fwd.kernel, dict(fwd.dims)) == (
        "elementwise", {"rows": 8 * 32 * 12, "cols": 12, "operands": 1})
    assert by_layer(step.backward, "mid") == []  # torch.cat's backward slices dY: no kernel


def test_lrn_backward_is_the_lrn_kernel_again() -> None:
    step = build_step(cnn_block("LRN", {"size": 5}), settings(batch_size=8))
    (fwd,) = by_layer(step.forward, "mid")
    (bwd,) = by_layer(step.backward, "mid")
    assert (bwd.kernel, bwd.op, dict(bwd.dims)) == (fwd.kernel, fwd.op, dict(fwd.dims))
    assert fwd.dims["operands"] == 5 and bwd.phase is Phase.BACKWARD


def test_batchnorm_backward_is_one_forward_shaped_pass() -> None:
    step = build_step(cnn_block("BatchNormalization"), settings(batch_size=8))
    (fwd,) = by_layer(step.forward, "mid")
    assert (fwd.kernel, dict(fwd.dims)) == ("batchnorm", {"rows": 16, "cols": 8 * 12 * 12})
    assert [(i.kernel, dict(i.dims), i.count) for i in by_layer(step.backward, "mid")] == [
        ("batchnorm", dict(fwd.dims), 1)]


def test_an_eval_mode_batchnorm_is_one_affine_pass_over_its_tensor() -> None:
    """model.eval(): running statistics, no reduction; priced as a tensor-scalar multiply."""
    g = cnn_block("BatchNormalization")
    (train,) = by_layer(build_step(g, settings(batch_size=8)).forward, "mid")
    (infer,) = by_layer(build_step(g, settings(batch_size=8, mode="inference")).forward, "mid")
    assert (infer.kernel, infer.op, dict(infer.dims)) == (
        "elementwise", eager.COPY_PASS_OP, {"rows": 8 * 16 * 12, "cols": 12, "operands": 1})
    assert infer.bytes_moved == train.bytes_moved and infer.flops == 2 * 8 * 16 * 12 * 12
    assert train.kernel == "batchnorm"


def qkv_block() -> ModelGraph:
    """torchvision's attention input as dynamo writes it: linear over 3-D (MatMul + Add bias),
    `.contiguous()` of the split heads (Identity), q/k/v by `select` (Gather, 0-d index)."""
    b, s, e = 4, 10, 16
    return graph(
        layer("in_proj", "MatMul", [t("x", b, s, e), t("w", e, 3 * e)], [t("p", b, s, 3 * e)],
              params=["w"]),
        layer("linear", "Add", [t("p", b, s, 3 * e), t("bias", 3 * e)], [t("l", b, s, 3 * e)],
              params=["bias"]),
        layer("clone", "Identity", [t("l", b, s, 3 * e)], [t("c", 3, b, s, e)]),
        *(layer(f"select_{i}", "Gather", [t("c", 3, b, s, e), t(f"i{i}", dtype="int64")],
                [t(f"q{i}", b, s, e)], attrs={"axis": 0}) for i in range(3)),
        layer("mix", "Mul", [t("q0", b, s, e), t("q1", b, s, e)], [t("m", b, s, e)]),
        layer("out", "Add", [t("m", b, s, e), t("q2", b, s, e)], [t("y", b, s, e)]),
    )


def test_eager_pytorch_runs_a_linears_bias_in_its_gemm_and_selects_as_views() -> None:
    g = qkv_block()
    step = build_step(g, settings(batch_size=4, precision="bf16"))
    fwd = {i.layer: i for i in step.forward if i.role != "autocast_cast"}
    assert (fwd["linear"].kernel, fwd["linear"].role) == ("none", "fused")
    assert "linear" in step.fused
    assert all(fwd[f"select_{i}"].kernel == "none" for i in range(3))
    # the sum is the GEMM's own output: half, so the clone copies half elements
    assert fwd["clone"].dtype == "bfloat16"
    assert (fwd["clone"].kernel, fwd["clone"].op, fwd["clone"].dims["operands"]) == (
        "elementwise", eager.COPY_PASS_OP, 1)
    # backward still sums the bias gradient, copies the clone's gradient once and scatters
    # each select's, whose three gradients of the clone autograd adds up (two sums)
    back = [(i.layer, i.kernel) for i in step.backward
            if i.role not in {"autocast_cast_grad", gradient_sums.ROLE}]
    assert ("linear", "reduce") in back
    assert back.count(("clone", "elementwise")) == 1
    assert {f"select_{i}" for i in range(3)} <= {name for name, _ in back}
    sums = [(i.layer, i.count) for i in step.backward if i.role == gradient_sums.ROLE]
    assert sums == [("clone", 2)]


def test_onnxruntime_runs_each_node_as_exported() -> None:
    step = build_step(qkv_block(), settings(batch_size=4, framework="onnxruntime",
                                            mode="inference"))
    fwd = {i.layer: i for i in step.forward}
    assert fwd["linear"].kernel == "elementwise" and fwd["select_0"].kernel == "memcpy"
    assert fwd["clone"].kernel == "memcpy"


def test_a_structure_only_graphs_weights_and_buffers_are_constants_nothing_issues() -> None:
    # `graph.exporting` writes each weight as ConstantOfShape(literal shape) and each buffer
    # as Expand(Constant scalar, literal shape); eager PyTorch holds both as tensors.
    g = graph(
        layer("w__CONST", "ConstantOfShape", [t("w__SHAPE", 2, dtype="int64")],
              [t("w", 784, 256)]),
        layer("fill", "Constant", [], [t("fill", dtype="float32")]),
        # The loader reads an Expand of literals as shape-only (`opcost.classify`, static).
        replace(layer("mean__BUFFER", "Expand", [t("fill", dtype="float32"),
                                                 t("mean__SHAPE", 1, dtype="int64")],
                      [t("mean", 256)]), family=OpFamily.SHAPE_ONLY),
        layer("fc", "MatMul", [t("x", 32, 784), t("w", 784, 256)], [t("h", 32, 256)],
              params=["w"]),
        layer("shape", "Shape", [t("h", 32, 256)], [t("hs", 2, dtype="int64")]),
        # Data-dependent: a mask the size of h, made each forward; and a broadcast of h.
        layer("mask", "ConstantOfShape", [t("hs", 2, dtype="int64")], [t("m", 32, 256)]),
        layer("wide", "Expand", [t("h", 32, 256), t("ws", 2, dtype="int64")],
              [t("hw", 32, 256)]),
    )
    assert eager.materialised_constants(g) == {"w__CONST", "mean__BUFFER"}
    roles = {i.layer: i.role for i in build_step(g, settings(mode="inference")).forward}
    assert roles["w__CONST"] == roles["mean__BUFFER"] == CONSTANT_ROLE
    assert roles["mask"] == roles["shape"] == "shape_only"
    assert CONSTANT_ROLE in host.HOST_FREE_ROLES


def test_a_stored_resnets_weights_cost_the_host_nothing() -> None:
    g = examples.resnet50(2)  # ONNX's light model: every initializer a ConstantOfShape
    constants = eager.materialised_constants(g)
    made_by = {t.name: la.name for la in g.layers for t in la.outputs}
    weights = {n for la in g.layers for n in la.parameter_inputs}
    assert len(weights) == 161  # 53 convolutions, 53 batch norms' scale and shift, the fc
    stripped = {made_by[w] for w in weights if w in made_by}  # the small ones stay data
    assert len(stripped) == 147 and stripped <= constants
    assert all(g.layers[i].family is OpFamily.SHAPE_ONLY for i in range(len(g.layers))
               if g.layers[i].name in constants)
    items = build_step(g, settings(batch_size=2, mode="inference")).forward
    assert {i.layer for i in items if i.role == CONSTANT_ROLE} == constants
    assert not any(i.role == CONSTANT_ROLE for i in items if i.kernel != "none")


def lm(dropped: tuple[str, ...] = ()) -> ModelGraph:
    """An embedding, a projection to a 1,000-token vocabulary and a cache output."""
    g = graph(
        layer("emb", "Gather", [t("table", 1000, 64), t("ids", 4, 8, dtype="int64")],
              [t("e", 4, 8, 64)], params=["table"]),
        layer("mlp", "Relu", [t("e", 4, 8, 64)], [t("h", 4, 8, 64)]),
        layer("head", "MatMul", [t("h", 4, 8, 64), t("w", 64, 1000)], [t("logits", 4, 8, 1000)],
              params=["w"]),
        layer("cache", "Relu", [t("e", 4, 8, 64)], [t("present.0.key", 4, 8, 64)]),
    )
    return replace(g, dropout_tensors=dropped)


def test_a_training_step_runs_the_loss_and_the_dropout_an_eval_graph_leaves_out() -> None:
    step = build_step(lm(dropped=("e", "h")), settings(batch_size=4))
    layers = [i.layer for i in step.forward]
    # Each dropout right after its tensor's producer, the loss last, over the logits alone.
    assert layers == ["emb", "e.dropout", "mlp", "h.dropout", "head", "cache", "logits.loss"]
    (loss,) = by_layer(step.forward, "logits.loss")
    assert (loss.kernel, loss.op, dict(loss.dims), loss.dtype) == (
        "softmax", "LogSoftmax", {"rows": 32, "cols": 1000}, "float32")
    (dropout,) = by_layer(step.forward, "h.dropout")
    assert (dropout.kernel, dropout.op, dropout.dims["rows"] * dropout.dims["cols"]) == (
        "elementwise", "dropout", 4 * 8 * 64)
    assert [i.kernel for i in by_layer(step.backward, "logits.loss")] == ["softmax"]
    assert [i.kernel for i in by_layer(step.backward, "h.dropout")] == ["elementwise"]
    # The host prices them as what they are (`step.host`), both ways.
    added = [i for i in step.items if i.layer in ("e.dropout", "h.dropout", "logits.loss")]
    assert len(added) == 6 and {i.role for i in added} == {training_ops.ROLE}
    assert [la.name for la in step.layers][-1] == "logits.loss"
    # Inference runs neither.
    inference = build_step(lm(dropped=("e", "h")), settings(batch_size=4, mode="inference"))
    assert [i.layer for i in inference.forward] == ["emb", "mlp", "head", "cache"]


def test_a_dead_constant_is_no_output_the_loss_scores() -> None:
    """An export keeps constants whose readers were folded away (ViT-B/16's: 60 float scalars);
    they are made and never read like the logits, but from nothing: no loss over them."""
    g = lm()
    dead = layer("node_Constant_1", "Constant", [], [t("val_1", 1)])
    g = replace(g, layers=(*g.layers, dead))
    assert [o.name for o in training_ops.loss_outputs(g.layers)] == ["logits"]
    step = build_step(g, settings(batch_size=4))
    assert [la.name for la in step.layers if la.op_type == "LogSoftmax"] == ["logits.loss"]


def test_half_logits_are_cast_up_for_the_loss_under_autocast() -> None:
    step = build_step(lm(), settings(batch_size=4, precision="bf16"))
    casts = [i for i in by_layer(step.forward, "logits.loss") if i.role == "autocast_cast"]
    assert [(i.dtype, i.dims["rows"] * i.dims["cols"]) for i in casts] == [
        ("float32", 4 * 8 * 1000)]
    grads = [i for i in by_layer(step.backward, "logits.loss") if i.role == "autocast_cast_grad"]
    assert [i.dtype for i in grads] == ["bfloat16"]
    # fp32 logits need no cast.
    fp32 = build_step(lm(), settings(batch_size=4))
    assert not [i for i in fp32.forward if i.role == "autocast_cast"]


def test_an_embedding_gradient_is_zeroed_by_a_fill_not_a_copy() -> None:
    step = build_step(lm(), settings(batch_size=4))
    (zero,) = [i for i in by_layer(step.backward, "emb") if i.role == "grad_zero"]
    # One write of the table: an elementwise kernel with no operand to read.
    assert (zero.kernel, dict(zero.dims), zero.bytes_moved) == (
        "elementwise", {"rows": 1000, "cols": 64, "operands": 0}, 1000 * 64 * 4)
