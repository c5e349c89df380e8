"""onnxruntime's com.microsoft transformer ops: shapes match what onnxruntime itself computes,
the nodes after them keep their shapes, and a fused attention is priced as its GEMMs."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from gpuplan_estimator import graph
from gpuplan_estimator.core.errors import InvalidModelError
from gpuplan_estimator.core.layers import OpFamily
from gpuplan_estimator.graph import contrib

BATCH, SEQUENCE, HIDDEN, HEADS = 2, 8, 16, 4
MS = "com.microsoft"


def _weight(name: str, dims: list[int]) -> tuple[object, object]:
    shape = numpy_helper.from_array(np.array(dims, np.int64), f"{name}__SHAPE")
    node = helper.make_node("ConstantOfShape", [shape.name], [name],
                            value=helper.make_tensor("value", TensorProto.FLOAT, [1], [0.01]))
    return shape, node


def _model(nodes: list, inputs: list, inits: list) -> bytes:
    g = helper.make_graph(nodes, "contrib", inputs,
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17),
                                               helper.make_opsetid(MS, 1)],
                             ir_version=8).SerializeToString()


def _x(name: str = "x", sequence: int = SEQUENCE) -> object:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, [BATCH, sequence, HIDDEN])


def attention_block() -> bytes:
    """Attention(x, Wqkv, b) → MatMul(Wo) → SkipLayerNormalization(x) → FastGelu: what
    onnxruntime's transformer optimizer writes for a BERT layer."""
    weights = [_weight("wqkv", [HIDDEN, 3 * HIDDEN]), _weight("bqkv", [3 * HIDDEN]),
               _weight("wo", [HIDDEN, HIDDEN]), _weight("gamma", [HIDDEN]),
               _weight("beta", [HIDDEN])]
    nodes = [node for _, node in weights] + [
        helper.make_node("Attention", ["x", "wqkv", "bqkv"], ["a"], domain=MS,
                         num_heads=HEADS, name="attn"),
        helper.make_node("MatMul", ["a", "wo"], ["o"]),
        helper.make_node("SkipLayerNormalization", ["o", "x", "gamma", "beta"], ["n"],
                         domain=MS, epsilon=1e-5),
        helper.make_node("FastGelu", ["n"], ["y"], domain=MS),
    ]
    return _model(nodes, [_x()], [shape for shape, _ in weights])


def multi_head_block(key_length: int) -> bytes:
    """MultiHeadAttention(q, k, v) with separate projections, as decoders' cross-attention."""
    nodes = [helper.make_node("MultiHeadAttention", ["q", "k", "v"], ["a"], domain=MS,
                              num_heads=HEADS, name="mha"),
             helper.make_node("Relu", ["a"], ["y"])]
    return _model(nodes, [_x("q"), _x("k", key_length), _x("v", key_length)], [])


def _run(data: bytes, feeds: dict[str, tuple[int, ...]]) -> tuple[int, ...]:
    session = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    arrays = {name: np.random.default_rng(0).standard_normal(shape).astype(np.float32)
              for name, shape in feeds.items()}
    return tuple(session.run(["y"], arrays)[0].shape)


def _output_shape(g: graph.ModelGraph) -> tuple[int, ...]:
    return next(t.shape for layer in g.layers for t in layer.outputs if t.name == "y")


def test_a_fused_bert_layer_has_onnxruntimes_shapes_and_its_attention_is_priced_as_gemms() -> None:
    data = attention_block()
    g = graph.load_model(data)
    assert _output_shape(g) == _run(data, {"x": (BATCH, SEQUENCE, HIDDEN)})
    assert g.unknown_op_types == ()
    parts = {layer.name: layer for layer in g.layers if layer.name.startswith("attn/")}
    assert sorted(parts) == ["attn/context", "attn/qkv", "attn/scores", "attn/softmax"]
    head = HIDDEN // HEADS
    assert parts["attn/qkv"].flops == 2 * BATCH * SEQUENCE * HIDDEN * 3 * HIDDEN
    assert parts["attn/scores"].flops == 2 * BATCH * HEADS * SEQUENCE * SEQUENCE * head
    assert parts["attn/context"].flops == parts["attn/scores"].flops
    assert parts["attn/softmax"].family is OpFamily.SOFTMAX
    # the packed QKV weights and bias are the projection's parameters, counted once
    assert parts["attn/qkv"].parameter_count == HIDDEN * 3 * HIDDEN + 3 * HIDDEN
    assert g.parameter_count == HIDDEN * 3 * HIDDEN + 3 * HIDDEN + HIDDEN**2 + 2 * HIDDEN


@pytest.mark.parametrize("key_length", [SEQUENCE, 12])
def test_multi_head_attention_matches_onnxruntime(key_length: int) -> None:
    data = multi_head_block(key_length)
    g = graph.load_model(data)
    feeds = {"q": (BATCH, SEQUENCE, HIDDEN), "k": (BATCH, key_length, HIDDEN),
             "v": (BATCH, key_length, HIDDEN)}
    assert _output_shape(g) == _run(data, feeds)
    scores = next(layer for layer in g.layers if layer.name == "mha/scores")
    assert scores.outputs[0].shape == (BATCH, HEADS, SEQUENCE, key_length)


def test_grouped_query_attention_follows_the_documented_layout() -> None:
    """query [B, S, heads·h], key/value [B, S, kv_heads·h] → [B, S, heads·h]; packed QKV
    when key is absent."""
    attrs = {"num_heads": 8, "kv_num_heads": 2}
    q, kv = (2, 5, 8 * 16), (2, 5, 2 * 16)
    assert contrib.output_shapes("GroupQueryAttention", [q, kv, kv], attrs, 3, "n") == [
        q, None, None]
    packed = (2, 5, (8 + 2 * 2) * 16)
    parts = contrib.attention_parts("GroupQueryAttention", [packed, None, None], attrs, "n")
    assert (parts.heads, parts.qk_head_size, parts.output_shape) == (8, 16, q)


def test_an_attention_layout_the_rules_do_not_know_is_named() -> None:
    with pytest.raises(InvalidModelError, match=r"node 'a'.*num_heads"):
        contrib.attention_parts("Attention", [(2, 5, 16), (16, 48)], {}, "node 'a'")
    with pytest.raises(InvalidModelError, match="does not split into 3"):
        contrib.attention_parts("Attention", [(2, 5, 16), (16, 50)], {"num_heads": 2}, "n")
