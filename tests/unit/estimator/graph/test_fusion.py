"""fusion: patterns found on producer/consumer structure of tiny ONNX graphs."""

from __future__ import annotations

import math
from typing import Any

import onnx
from onnx import TensorProto, helper

from gpuplan_estimator import graph

F = TensorProto.FLOAT


def load(nodes: list[onnx.NodeProto], inits: list[onnx.TensorProto], shape: list[Any],
         outputs: tuple[str, ...] = ("y",)) -> Any:
    m = helper.make_model(
        helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, shape)],
                          [helper.make_tensor_value_info(o, F, None) for o in outputs],
                          initializer=inits),
        opset_imports=[helper.make_opsetid("", 17)])
    return graph.load_model(m.SerializeToString(), batch=2)


def scalar(name: str, value: float) -> onnx.TensorProto:
    return helper.make_tensor(name, F, [], [value])


def vec(name: str, n: int) -> onnx.TensorProto:
    return helper.make_tensor(name, F, [n], [1.0] * n)


def units(g: Any) -> list[tuple[str, tuple[str, ...]]]:
    return [(u.pattern, u.layer_names) for u in g.units]


def test_gelu_erf_form() -> None:
    nodes = [helper.make_node("Div", ["x", "sqrt2"], ["d"], name="div"),
             helper.make_node("Erf", ["d"], ["e"], name="erf"),
             helper.make_node("Add", ["e", "one"], ["a"], name="add"),
             helper.make_node("Mul", ["x", "a"], ["m"], name="mul"),
             helper.make_node("Mul", ["m", "half"], ["y"], name="half")]
    g = load(nodes, [scalar("sqrt2", math.sqrt(2)), scalar("one", 1), scalar("half", 0.5)],
             ["batch", 8])
    assert units(g) == [("gelu", ("div", "erf", "add", "mul", "half"))]
    assert {ly.unit for ly in g.layers} == {"u0"}


def test_gelu_tanh_form_hf_order() -> None:
    nodes = [helper.make_node("Mul", ["c_half", "x"], ["h"], name="h"),
             helper.make_node("Pow", ["x", "three"], ["p"], name="pow"),
             helper.make_node("Mul", ["coef", "p"], ["pc"], name="coef"),
             helper.make_node("Add", ["x", "pc"], ["i"], name="inner"),
             helper.make_node("Mul", ["k", "i"], ["s"], name="scale"),
             helper.make_node("Tanh", ["s"], ["t"], name="tanh"),
             helper.make_node("Add", ["one", "t"], ["a"], name="plus"),
             helper.make_node("Mul", ["h", "a"], ["y"], name="out")]
    inits = [scalar("c_half", 0.5), scalar("three", 3), scalar("coef", 0.044715),
             scalar("k", 0.79788), scalar("one", 1)]
    g = load(nodes, inits, ["batch", 8])
    assert units(g) == [("gelu", ("h", "pow", "coef", "inner", "scale", "tanh", "plus", "out"))]


def test_decomposed_layernorm_and_softmax() -> None:
    ln = [helper.make_node("ReduceMean", ["x"], ["mu"], name="mean", axes=[-1]),
          helper.make_node("Sub", ["x", "mu"], ["d"], name="sub"),
          helper.make_node("Pow", ["d", "two"], ["sq"], name="pow"),
          helper.make_node("ReduceMean", ["sq"], ["var"], name="var", axes=[-1]),
          helper.make_node("Add", ["var", "eps"], ["ve"], name="eps"),
          helper.make_node("Sqrt", ["ve"], ["std"], name="sqrt"),
          helper.make_node("Div", ["d", "std"], ["nrm"], name="div"),
          helper.make_node("Mul", ["nrm", "gamma"], ["sc"], name="gamma"),
          helper.make_node("Add", ["sc", "beta"], ["ln"], name="beta")]
    sm = [helper.make_node("ReduceMax", ["ln"], ["mx"], name="max", axes=[-1]),
          helper.make_node("Sub", ["ln", "mx"], ["sh"], name="shift"),
          helper.make_node("Exp", ["sh"], ["ex"], name="exp"),
          helper.make_node("ReduceSum", ["ex", "ax"], ["tot"], name="sum"),
          helper.make_node("Div", ["ex", "tot"], ["y"], name="norm")]
    inits = [scalar("two", 2), scalar("eps", 1e-5), vec("gamma", 8), vec("beta", 8),
             helper.make_tensor("ax", TensorProto.INT64, [1], [-1])]
    g = load(ln + sm, inits, ["batch", 8])
    assert units(g) == [
        ("layernorm", ("mean", "sub", "pow", "var", "eps", "sqrt", "div", "gamma", "beta")),
        ("softmax", ("max", "shift", "exp", "sum", "norm")),
    ]


def test_attention_scores_and_matmul_bias_act() -> None:
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="proj"),
             helper.make_node("Add", ["h", "b"], ["hb"], name="bias"),
             helper.make_node("Relu", ["hb"], ["r"], name="relu"),
             helper.make_node("Transpose", ["r"], ["rt"], name="kt", perm=[0, 2, 1]),
             helper.make_node("MatMul", ["r", "rt"], ["sc"], name="scores"),
             helper.make_node("Div", ["sc", "root"], ["ss"], name="scale"),
             helper.make_node("Add", ["ss", "mask"], ["sm"], name="mask"),
             helper.make_node("Softmax", ["sm"], ["y"], name="softmax", axis=-1)]
    inits = [helper.make_tensor("w", F, [8, 8], [0.0] * 64), vec("b", 8),
             scalar("root", 8 ** 0.5), helper.make_tensor("mask", F, [1, 4, 4], [0.0] * 16)]
    g = load(nodes, inits, ["batch", 4, 8])
    assert units(g) == [("attention_scores", ("scores", "scale", "mask", "softmax")),
                        ("matmul_bias_act", ("proj", "bias", "relu"))]


def _attention_nodes(dropout: bool) -> list[onnx.NodeProto]:
    probs = "p"
    nodes = [helper.make_node("Transpose", ["x"], ["kt"], name="kt", perm=[0, 2, 1]),
             helper.make_node("MatMul", ["x", "kt"], ["sc"], name="scores"),
             helper.make_node("Div", ["sc", "root"], ["ss"], name="scale"),
             helper.make_node("Softmax", ["ss"], ["p"], name="softmax", axis=-1)]
    if dropout:
        nodes.append(helper.make_node("Dropout", ["p"], ["pd"], name="dropout"))
        probs = "pd"
    return [*nodes, helper.make_node("MatMul", [probs, "x"], ["y"], name="context")]


def test_the_whole_attention_core_through_the_product_with_v() -> None:
    inits = [scalar("root", 8 ** 0.5)]
    g = load(_attention_nodes(dropout=False), inits, ["batch", 4, 8])
    assert units(g) == [("attention", ("scores", "scale", "softmax", "context"))]
    g = load(_attention_nodes(dropout=True), inits, ["batch", 4, 8])
    assert units(g) == [("attention", ("scores", "scale", "softmax", "dropout", "context"))]


def test_the_exporters_sdpa_form_scales_q_and_k_before_the_product() -> None:
    """torch.onnx's decomposition of scaled_dot_product_attention: Q and Kᵀ each times
    sqrt(scale), their product straight into the Softmax, then ·V."""
    nodes = [helper.make_node("Transpose", ["x"], ["kt"], name="kt", perm=[0, 2, 1]),
             helper.make_node("Mul", ["x", "s"], ["qs"], name="q_scale"),
             helper.make_node("Mul", ["kt", "s"], ["ks"], name="k_scale"),
             helper.make_node("MatMul", ["qs", "ks"], ["sc"], name="scores"),
             helper.make_node("Softmax", ["sc"], ["p"], name="softmax", axis=-1),
             helper.make_node("MatMul", ["p", "x"], ["y"], name="context")]
    g = load(nodes, [scalar("s", 8 ** -0.25)], ["batch", 4, 8])
    assert units(g) == [("attention", ("q_scale", "k_scale", "scores", "softmax", "context"))]


def test_a_bare_product_into_a_softmax_is_no_scores_unit() -> None:
    nodes = [helper.make_node("Transpose", ["x"], ["kt"], name="kt", perm=[0, 2, 1]),
             helper.make_node("MatMul", ["x", "kt"], ["sc"], name="scores"),
             helper.make_node("Softmax", ["sc"], ["y"], name="softmax", axis=-1)]
    assert load(nodes, [], ["batch", 4, 8]).units == ()


def test_no_attention_core_when_the_probabilities_escape() -> None:
    # The probabilities are also a graph output (e.g. output_attentions=True): an SDPA kernel
    # could not return them, so only the scores unit is kept.
    g = load(_attention_nodes(dropout=False), [scalar("root", 8 ** 0.5)], ["batch", 4, 8],
             outputs=("y", "p"))
    assert units(g) == [("attention_scores", ("scores", "scale", "softmax"))]


def test_no_unit_when_an_intermediate_escapes() -> None:
    # the Erf output is also a graph output: fusing would hide a tensor someone reads
    nodes = [helper.make_node("Div", ["x", "sqrt2"], ["d"], name="div"),
             helper.make_node("Erf", ["d"], ["e"], name="erf"),
             helper.make_node("Identity", ["e"], ["e2"], name="leak"),
             helper.make_node("Add", ["e", "one"], ["a"], name="add"),
             helper.make_node("Mul", ["x", "a"], ["m"], name="mul"),
             helper.make_node("Mul", ["m", "half"], ["y"], name="half")]
    g = load(nodes, [scalar("sqrt2", 1.4), scalar("one", 1), scalar("half", 0.5)],
             ["batch", 8], outputs=("y", "e2"))
    assert g.units == ()
    assert all(ly.unit == "" for ly in g.layers)


def test_conv_followed_by_two_consumers_is_not_fused() -> None:
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
             helper.make_node("Relu", ["c"], ["y"], name="relu"),
             helper.make_node("Sigmoid", ["c"], ["z"], name="sig")]
    g = load(nodes, [helper.make_tensor("w", F, [2, 3, 1, 1], [0.0] * 6)],
             ["batch", 3, 4, 4], outputs=("y", "z"))
    assert g.units == ()


def test_conv_with_per_channel_scale_and_shift_then_relu_is_one_unit() -> None:
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
             helper.make_node("Mul", ["c", "s"], ["m"], name="scale"),
             helper.make_node("Add", ["m", "b"], ["a"], name="shift"),
             helper.make_node("Relu", ["a"], ["y"], name="relu")]
    inits = [helper.make_tensor("w", F, [2, 3, 1, 1], [0.0] * 6),
             helper.make_tensor("s", F, [2, 1, 1], [1.0] * 2),
             helper.make_tensor("b", F, [2, 1, 1], [0.0] * 2)]
    g = load(nodes, inits, ["batch", 3, 4, 4])
    assert units(g) == [("conv_affine_act", ("conv", "scale", "shift", "relu"))]


def test_conv_plus_a_full_size_tensor_is_not_folded() -> None:
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
             helper.make_node("Add", ["c", "x"], ["y"], name="residual")]
    g = load(nodes, [helper.make_tensor("w", F, [3, 3, 1, 1], [0.0] * 9)], ["batch", 3, 4, 4])
    assert g.units == ()


def test_scale_made_by_constant_of_shape_folds_but_a_data_gate_does_not() -> None:
    made = [helper.make_node("ConstantOfShape", ["s_shape"], ["s0"], name="s_const"),
            helper.make_node("Unsqueeze", ["s0", "axes"], ["s"], name="s_unsq")]
    inits = [helper.make_tensor("w", F, [3, 3, 1, 1], [0.0] * 9),
             helper.make_tensor("s_shape", TensorProto.INT64, [1], [3]),
             helper.make_tensor("axes", TensorProto.INT64, [2], [1, 2])]
    folded = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
              helper.make_node("Mul", ["c", "s"], ["y"], name="scale")]
    g = load(made + folded, inits, ["batch", 3, 4, 4])
    assert units(g) == [("conv_affine", ("conv", "scale"))]
    gate = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
            helper.make_node("GlobalAveragePool", ["x"], ["p"], name="squeeze"),
            helper.make_node("Sigmoid", ["p"], ["g"], name="gate"),
            helper.make_node("Mul", ["c", "g"], ["y"], name="excite")]
    assert load(gate, inits[:1], ["batch", 3, 4, 4]).units == ()


def _sdpa_export_nodes(*, nan_guard: bool = True, scale_before_transpose: bool = False
                       ) -> list[onnx.NodeProto]:
    """torch.onnx's SDPA as the dynamo exporter writes it: the scale computed in the graph as
    Sqrt(CastLike(c, Q)), applied to Q and to Kᵀ separately, a mask selected by Where and
    added, the Softmax, the guard Where(IsNaN(p), 0, p) of fully masked rows, then ·V."""
    if scale_before_transpose:
        k = [helper.make_node("Mul", ["x", "s"], ["xs"], name="k_scale"),
             helper.make_node("Transpose", ["xs"], ["ks"], name="kt", perm=[0, 2, 1])]
    else:
        k = [helper.make_node("Transpose", ["x"], ["kt"], name="kt", perm=[0, 2, 1]),
             helper.make_node("Mul", ["kt", "s"], ["ks"], name="k_scale")]
    nodes = [helper.make_node("CastLike", ["c", "x"], ["cl"], name="castlike"),
             helper.make_node("Sqrt", ["cl"], ["s"], name="sqrt"),
             helper.make_node("Mul", ["x", "s"], ["qs"], name="q_scale"), *k,
             helper.make_node("MatMul", ["qs", "ks"], ["sc"], name="scores"),
             helper.make_node("Where", ["keep", "zero", "neg"], ["bias"], name="mask_bias"),
             helper.make_node("Add", ["sc", "bias"], ["sm"], name="mask"),
             helper.make_node("Softmax", ["sm"], ["p"], name="softmax", axis=-1)]
    probs = "p"
    if nan_guard:
        nodes += [helper.make_node("IsNaN", ["p"], ["nan"], name="isnan"),
                  helper.make_node("Where", ["nan", "zero", "p"], ["pg"], name="guard")]
        probs = "pg"
    return [*nodes, helper.make_node("MatMul", [probs, "x"], ["y"], name="context")]


def _sdpa_inits() -> list[onnx.TensorProto]:
    return [scalar("c", 8 ** -0.5), scalar("zero", 0.0), scalar("neg", -1e9),
            helper.make_tensor("keep", TensorProto.BOOL, [1, 4, 4], [True] * 16)]


def test_the_dynamo_sdpa_core_with_its_nan_guard_and_in_graph_scale() -> None:
    g = load(_sdpa_export_nodes(), _sdpa_inits(), ["batch", 4, 8])
    assert units(g) == [("attention", ("q_scale", "k_scale", "scores", "mask", "softmax",
                                       "isnan", "guard", "context"))]


def test_k_scaled_before_its_transpose_is_in_the_core() -> None:
    g = load(_sdpa_export_nodes(scale_before_transpose=True), _sdpa_inits(), ["batch", 4, 8])
    assert units(g) == [("attention", ("q_scale", "k_scale", "kt", "scores", "mask",
                                       "softmax", "isnan", "guard", "context"))]


def test_an_unguarded_sdpa_and_a_softmax_in_fp32_between_casts() -> None:
    assert units(load(_sdpa_export_nodes(nan_guard=False), _sdpa_inits(), ["batch", 4, 8]))[0][
        1] == ("q_scale", "k_scale", "scores", "mask", "softmax", "context")
    # Autocast's softmax: the masked scores cast up to fp32 and the probabilities back down.
    nodes = [helper.make_node("Transpose", ["x"], ["kt"], name="kt", perm=[0, 2, 1]),
             helper.make_node("MatMul", ["x", "kt"], ["sc"], name="scores"),
             helper.make_node("Mul", ["sc", "root"], ["ss"], name="scale"),
             helper.make_node("Where", ["keep", "ss", "neg"], ["sm"], name="causal"),
             helper.make_node("Cast", ["sm"], ["s32"], name="up", to=F),
             helper.make_node("Softmax", ["s32"], ["p"], name="softmax", axis=-1),
             helper.make_node("Cast", ["p"], ["p16"], name="down", to=F),
             helper.make_node("Dropout", ["p16"], ["pd"], name="dropout"),
             helper.make_node("MatMul", ["pd", "x"], ["y"], name="context")]
    inits = [scalar("root", 8 ** -0.5), scalar("neg", -1e9),
             helper.make_tensor("keep", TensorProto.BOOL, [1, 4, 4], [True] * 16)]
    assert units(load(nodes, inits, ["batch", 4, 8])) == [(
        "attention", ("scores", "scale", "causal", "up", "softmax", "down", "dropout",
                      "context"))]


def test_a_guard_whose_probabilities_escape_leaves_only_the_scores_unit() -> None:
    g = load(_sdpa_export_nodes(), _sdpa_inits(), ["batch", 4, 8], outputs=("y", "p"))
    assert units(g) == [("attention_scores", ("scores", "mask", "softmax"))]


def test_a_softmax_over_a_product_with_a_weight_is_no_attention() -> None:
    nodes = [helper.make_node("MatMul", ["x", "w"], ["sc"], name="proj"),
             helper.make_node("Mul", ["sc", "root"], ["ss"], name="scale"),
             helper.make_node("Softmax", ["ss"], ["p"], name="softmax", axis=-1),
             helper.make_node("MatMul", ["p", "x"], ["y"], name="context")]
    inits = [helper.make_tensor("w", F, [8, 4], [0.0] * 32), scalar("root", 0.5)]
    assert [u for u in units(load(nodes, inits, ["batch", 4, 8])) if "attention" in u[0]] == []
