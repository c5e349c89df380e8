"""opcost: families, FLOPs, bytes and kernel dims, worked out by hand."""

from __future__ import annotations

import pytest

from gpuplan_estimator.core.layers import Layer, OpFamily, TensorInfo
from gpuplan_estimator.graph import opcost


def t(shape: tuple[int, ...], dtype: str = "float32", name: str = "t") -> TensorInfo:
    return TensorInfo(name, shape, dtype)


def layer(op: str, inputs: list[TensorInfo], outputs: list[TensorInfo],
          attrs: dict[str, object] | None = None, opset: int = 17) -> Layer:
    family = opcost.classify(op, attrs or {}, inputs_static=False, gathers_parameter=False)
    full = opcost.normalize_attributes(op, inputs, outputs, attrs or {}, opset)
    flops = opcost.node_flops(op, family, inputs, outputs, full)
    read, written = opcost.node_bytes(op, family, inputs, outputs)
    return Layer(op, op, family, tuple(inputs), tuple(outputs), flops, read, written, 0,
                 attributes=full)


@pytest.mark.parametrize(("op", "family"), [
    ("Conv", OpFamily.CONV), ("ConvTranspose", OpFamily.CONV), ("Gemm", OpFamily.MATMUL),
    ("MatMulInteger", OpFamily.MATMUL), ("GlobalAveragePool", OpFamily.POOLING),
    ("LRN", OpFamily.NORMALIZATION), ("RMSNormalization", OpFamily.NORMALIZATION),
    ("LogSoftmax", OpFamily.SOFTMAX), ("Erf", OpFamily.ELEMENTWISE),
    ("Where", OpFamily.ELEMENTWISE), ("Dropout", OpFamily.ELEMENTWISE),
    ("ArgMax", OpFamily.REDUCTION), ("CumSum", OpFamily.REDUCTION),
    ("Trilu", OpFamily.DATA_MOVEMENT), ("Identity", OpFamily.DATA_MOVEMENT),
    ("Reshape", OpFamily.SHAPE_ONLY), ("ConstantOfShape", OpFamily.SHAPE_ONLY),
    ("NoSuchOp", OpFamily.OTHER),
])
def test_families(op: str, family: OpFamily) -> None:
    assert opcost.classify(op, {}, inputs_static=False, gathers_parameter=False) is family


def test_context_decides_gather_einsum_and_static_inputs() -> None:
    c = opcost.classify
    assert c("Gather", {}, inputs_static=False, gathers_parameter=True) is OpFamily.EMBEDDING
    assert c("Gather", {}, inputs_static=False, gathers_parameter=False) is OpFamily.DATA_MOVEMENT
    assert c("Gather", {}, inputs_static=True, gathers_parameter=False) is OpFamily.SHAPE_ONLY
    assert c("Add", {}, inputs_static=True, gathers_parameter=False) is OpFamily.SHAPE_ONLY
    assert c("NoSuchOp", {}, inputs_static=True, gathers_parameter=False) is OpFamily.OTHER
    kw = {"inputs_static": False, "gathers_parameter": False}
    assert c("Einsum", {"equation": "bij,bjk->bik"}, **kw) is OpFamily.MATMUL
    assert c("Einsum", {"equation": "ij->ji"}, **kw) is OpFamily.DATA_MOVEMENT
    assert c("Einsum", {"equation": "ij->i"}, **kw) is OpFamily.REDUCTION
    assert c("Einsum", {"equation": "i,j->ij"}, **kw) is OpFamily.ELEMENTWISE


def test_conv_flops_bytes_and_dims() -> None:
    # 1x16x32x32 input, 32 3x3 filters, stride 2, pad 1 → 1x32x16x16; groups 2
    x, w, b = t((1, 16, 32, 32)), t((32, 8, 3, 3)), t((32,))
    y = t((1, 32, 16, 16))
    conv = layer("Conv", [x, w, b], [y], {"strides": [2, 2], "pads": [1, 1, 1, 1], "group": 2})
    macs = 32 * 16 * 16 * 8 * 9  # out elements · Cin/groups · kh·kw
    assert conv.flops == 2 * macs + 32 * 16 * 16
    assert conv.bytes_read == 4 * (16 * 32 * 32 + 32 * 8 * 9 + 32)
    assert conv.bytes_written == 4 * 32 * 16 * 16
    kernel, dims = opcost.kernel_dims(conv)
    assert kernel == "conv2d"
    assert dims == {"batch": 1, "c_in": 16, "c_out": 32, "h": 32, "w": 32, "kernel_h": 3,
                    "kernel_w": 3, "stride_h": 2, "stride_w": 2, "pad_h": 1, "pad_w": 1,
                    "dilation_h": 1, "dilation_w": 1, "groups": 2}


def test_conv_auto_pad_same_upper_spells_out_pads() -> None:
    x, w, y = t((1, 3, 7, 7)), t((4, 3, 3, 3)), t((1, 4, 4, 4))
    conv = layer("Conv", [x, w], [y], {"strides": [2, 2], "auto_pad": "SAME_UPPER"})
    # total pad = (4-1)·2 + 3 - 7 = 2 → 1 before, 1 after
    assert conv.attributes["pads"] == [1, 1, 1, 1]
    assert conv.flops == 2 * (4 * 16 * 3 * 9)


def test_gemm_and_batched_matmul() -> None:
    gemm = layer("Gemm", [t((64, 128)), t((256, 128)), t((256,))], [t((64, 256))],
                 {"transB": 1})
    assert gemm.flops == 2 * 64 * 128 * 256 + 64 * 256
    assert opcost.kernel_dims(gemm) == ("gemm", {"batch": 1, "m": 64, "k": 128, "n": 256,
                                                 "bias": 1})
    # nn.Linear on [8, 10, 32] @ [32, 16]: batch dims fold into m
    lin = layer("MatMul", [t((8, 10, 32)), t((32, 16))], [t((8, 10, 16))])
    assert lin.flops == 2 * 8 * 10 * 16 * 32
    assert opcost.kernel_dims(lin)[1] == {"batch": 1, "m": 80, "k": 32, "n": 16, "bias": 0}
    # broadcast bmm: [2, 1, 5, 6] @ [3, 6, 7] → [2, 3, 5, 7]
    bmm = layer("MatMul", [t((2, 1, 5, 6)), t((3, 6, 7))], [t((2, 3, 5, 7))])
    assert bmm.flops == 2 * (2 * 3 * 5 * 7) * 6
    assert opcost.kernel_dims(bmm)[1] == {"batch": 6, "m": 5, "k": 6, "n": 7, "bias": 0}


def test_einsum_contraction() -> None:
    e = layer("Einsum", [t((4, 5, 6)), t((4, 6, 7))], [t((4, 5, 7))],
              {"equation": "bij,bjk->bik"})
    assert e.family is OpFamily.MATMUL
    assert e.flops == 2 * 4 * 5 * 6 * 7
    assert opcost.kernel_dims(e)[1] == {"batch": 4, "m": 5, "k": 6, "n": 7, "bias": 0}


def test_pooling_norm_softmax_elementwise_reduction() -> None:
    pool = layer("MaxPool", [t((2, 8, 10, 10))], [t((2, 8, 5, 5))],
                 {"kernel_shape": [2, 2], "strides": [2, 2]})
    assert pool.flops == 2 * 8 * 25 * 4
    assert opcost.kernel_dims(pool)[1] == {"batch": 2, "channels": 8, "h": 10, "w": 10,
                                           "kernel_h": 2, "kernel_w": 2, "stride_h": 2,
                                           "stride_w": 2}
    ln = layer("LayerNormalization", [t((6, 10)), t((10,)), t((10,))], [t((6, 10))])
    assert ln.flops == 60 * 8
    assert opcost.kernel_dims(ln) == ("layernorm", {"rows": 6, "cols": 10})
    bn = layer("BatchNormalization", [t((2, 3, 4, 4))] + [t((3,))] * 4, [t((2, 3, 4, 4))])
    assert opcost.kernel_dims(bn) == ("batchnorm", {"rows": 3, "cols": 32})
    sm = layer("Softmax", [t((2, 3, 7))], [t((2, 3, 7))])
    assert sm.flops == 42 * opcost.SOFTMAX_FLOPS_PER_ELEMENT
    assert opcost.kernel_dims(sm) == ("softmax", {"rows": 6, "cols": 7})
    old = layer("Softmax", [t((2, 3, 7))], [t((2, 3, 7))], opset=11)  # 2-D coercion at axis 1
    assert opcost.kernel_dims(old) == ("softmax", {"rows": 2, "cols": 21})
    add = layer("Add", [t((4, 5)), t((5,))], [t((4, 5))])
    assert (add.flops, add.bytes_read, add.bytes_written) == (20, 4 * 25, 4 * 20)
    # The broadcast bias [5] is read (bytes) but is no full-size operand: like `addu`.
    assert opcost.kernel_dims(add) == ("elementwise", {"rows": 4, "cols": 5, "operands": 1})
    assert layer("Tanh", [t((4, 5))], [t((4, 5))]).flops == 20 * 6
    red = layer("ReduceMean", [t((4, 5, 6))], [t((4, 1, 6))], {"axes": [1]})
    assert red.flops == 120
    assert opcost.kernel_dims(red) == ("reduce", {"rows": 24, "cols": 5})


def test_data_movement_and_shape_only_bytes() -> None:
    tr = layer("Transpose", [t((3, 4))], [t((4, 3))])
    assert (tr.flops, tr.bytes_read, tr.bytes_written) == (0, 48, 48)
    assert opcost.kernel_dims(tr) == ("memcpy", {"elements": 12})
    rs = layer("Reshape", [t((3, 4)), t((2,), "int64")], [t((12,))])
    assert (rs.family, rs.bytes_read, rs.bytes_written) == (OpFamily.SHAPE_ONLY, 0, 0)
    assert opcost.kernel_dims(rs) == ("none", {})
    # a gather reads the rows it returns plus the indices, not the whole table
    table, idx, out = t((1000, 8)), t((2, 3), "int64"), t((2, 3, 8))
    emb = Layer("g", "Gather", OpFamily.EMBEDDING, (table, idx), (out,), 0,
                *opcost.node_bytes("Gather", OpFamily.EMBEDDING, [table, idx], [out]), 8000)
    assert emb.bytes_read == 6 * 8 + 48 * 4
    assert opcost.kernel_dims(emb) == ("memcpy", {"elements": 48})


def test_elementwise_operands_count_only_full_size_inputs() -> None:
    # Attention mask: scores [2,12,128,128] + mask [2,1,1,128] -> one full-size operand; bytes
    # still read the mask once: 4 * (2*12*128*128 + 2*128) in, 4 * 2*12*128*128 out.
    scores, mask = t((2, 12, 128, 128)), t((2, 1, 1, 128))
    add = layer("Add", [scores, mask], [t((2, 12, 128, 128))])
    assert (add.bytes_read, add.bytes_written) == (4 * (393216 + 256), 4 * 393216)
    assert opcost.kernel_dims(add) == ("elementwise",
                                       {"rows": 2 * 12 * 128, "cols": 128, "operands": 1})
    # Causal Where(cond [1,1,128,128] bool, x, -inf scalar): x is the only full-size operand.
    where = layer("Where", [t((1, 1, 128, 128), "bool"), scores, t(())], [t((2, 12, 128, 128))])
    assert opcost.kernel_dims(where)[1]["operands"] == 1
    # Residual add of two full tensors: two operands; three-way Sum: three.
    res = layer("Add", [t((8, 768)), t((8, 768))], [t((8, 768))])
    assert opcost.kernel_dims(res)[1] == {"rows": 8, "cols": 768, "operands": 2}
    three = layer("Sum", [t((8, 768))] * 3, [t((8, 768))])
    assert opcost.kernel_dims(three)[1]["operands"] == 3
    # Outer broadcast [4,1] * [1,5]: neither input is full-size; still one pass (operands 1).
    outer = layer("Mul", [t((4, 1)), t((1, 5))], [t((4, 5))])
    assert opcost.kernel_dims(outer)[1] == {"rows": 4, "cols": 5, "operands": 1}
