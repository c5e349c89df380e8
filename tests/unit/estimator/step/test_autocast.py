"""Mixed precision as torch.autocast runs it: dtypes, casts and their gradients."""

from __future__ import annotations

from gpuplan_estimator.core.layers import DTYPE_BYTES, Layer, ModelGraph, OpFamily, TensorInfo
from gpuplan_estimator.core.workload import DYNAMIC_CAST, Phase
from gpuplan_estimator.step import autocast, eager, memory_walk
from gpuplan_estimator.step.decomposition import TrainingSettings, build_step, gradient_tensors

FAMILY = {"MatMul": OpFamily.MATMUL, "Gemm": OpFamily.MATMUL, "Add": OpFamily.ELEMENTWISE,
          "LayerNormalization": OpFamily.NORMALIZATION, "Softmax": OpFamily.SOFTMAX,
          "Relu": OpFamily.ELEMENTWISE, "Gather": OpFamily.EMBEDDING, "Mul": OpFamily.ELEMENTWISE}


def t(name: str, *shape: int, dtype: str = "float32") -> TensorInfo:
    return TensorInfo(name, tuple(shape), dtype)


def layer(name: str, op: str, inputs: list[TensorInfo], outputs: list[TensorInfo],
          params: tuple[str, ...] = ()) -> Layer:
    return Layer(name, op, FAMILY[op], tuple(inputs), tuple(outputs), flops=1, bytes_read=1,
                 bytes_written=1, parameter_count=sum(
                     x.elements for x in inputs if x.name in params), parameter_inputs=params)


def block() -> ModelGraph:
    """Embedding -> LayerNorm -> two GEMMs sharing one weight -> residual add -> softmax."""
    return ModelGraph("block", (
        layer("embed", "Gather", [t("table", 100, 16), t("ids", 4, 8, dtype="int64")],
              [t("x", 4, 8, 16)], params=("table",)),
        layer("ln", "LayerNormalization", [t("x", 4, 8, 16), t("g", 16), t("b", 16)],
              [t("n", 4, 8, 16)], params=("g", "b")),
        layer("fc1", "MatMul", [t("n", 4, 8, 16), t("w", 16, 16)], [t("h1", 4, 8, 16)],
              params=("w",)),
        layer("fc2", "MatMul", [t("h1", 4, 8, 16), t("w", 16, 16)], [t("h2", 4, 8, 16)],
              params=("w",)),
        layer("res", "Add", [t("x", 4, 8, 16), t("h2", 4, 8, 16)], [t("r", 4, 8, 16)]),
        layer("soft", "Softmax", [t("r", 4, 8, 16)], [t("p", 4, 8, 16)]),
    ), (), {}, 17)


def test_dtypes_follow_autocast_rules() -> None:
    dtypes = autocast.tensor_dtypes(block(), "bf16")
    assert dtypes["x"] == "float32"  # gathered from an fp32 table
    assert dtypes["n"] == "float32"  # LayerNorm is kept in fp32
    assert dtypes["h1"] == dtypes["h2"] == "bfloat16"  # lowered GEMMs
    assert dtypes["r"] == "float32"  # fp32 + bf16 promotes: the residual stream stays fp32
    assert dtypes["p"] == "float32"
    assert autocast.tensor_dtypes(block(), "fp32") == {}


def test_casts_weights_once_and_activations_per_use_with_gradient_casts() -> None:
    g = block()
    dtypes = autocast.tensor_dtypes(g, "bf16")
    forward, backward = autocast.cast_items(g, "bf16", dtypes, gradient_tensors(g))
    cast = [(i.layer, i.dims["rows"] * i.dims["cols"]) for i in forward]
    # fc1: its fp32 input and the weight; fc2: nothing (bf16 input, weight cached);
    # softmax: its fp32 input needs none.
    assert cast == [("fc1", 4 * 8 * 16), ("fc1", 16 * 16)]
    assert {i.bytes_moved for i in forward} == {4 * 8 * 16 * 6, 16 * 16 * 6}
    assert [i.phase for i in backward] == [Phase.BACKWARD] * 2
    assert autocast.cast_items(g, "tf32", {}, gradient_tensors(g)) == ((), ())


def test_upcasts_run_unrolled_and_a_downcast_reads_two_halves_of_bytes() -> None:
    g = block()
    dtypes = autocast.tensor_dtypes(g, "bf16")
    forward, backward = autocast.cast_items(g, "bf16", dtypes, gradient_tensors(g))
    down, up = forward[0], backward[0]  # fc1's input to bf16; its gradient back to fp32
    assert (down.dtype, down.dims["operands"], down.attributes.get(DYNAMIC_CAST)) == (
        "bfloat16", 2, None)  # PyTorch's fp32-to-half copy is vectorised
    assert (up.dtype, up.dims["operands"], up.attributes.get(DYNAMIC_CAST)) == ("float32", 1, 1)


def test_an_add_over_two_dtypes_runs_unrolled_and_casts_its_half_operands_gradient() -> None:
    step = build_step(block(), TrainingSettings(batch_size=4, precision="bf16"))
    forward = {(i.layer, i.role): i for i in step.forward}
    assert forward[("res", "fwd")].attributes.get(DYNAMIC_CAST) == 1  # fp32 x + bf16 h2
    assert forward[("soft", "fwd")].attributes.get(DYNAMIC_CAST) is None
    # dY passes through the add; the engine casts h2's fp32 gradient to bf16, vectorised
    grads = [(i.op, i.dtype, i.dims["rows"] * i.dims["cols"], i.attributes.get(DYNAMIC_CAST))
             for i in step.backward if i.layer == "res"]
    assert grads == [("cast", "bfloat16", 4 * 8 * 16, None)]
    fp32 = build_step(block(), TrainingSettings(batch_size=4, precision="fp32"))
    assert not any(i.attributes.get(DYNAMIC_CAST) for i in fp32.items)
    assert not any(i.layer == "res" for i in fp32.backward)


def test_only_eager_pytorch_runs_dtype_conversions_unrolled() -> None:
    def marked(framework: str) -> list[str]:
        step = build_step(block(), TrainingSettings(batch_size=4, precision="bf16",
                                                    mode="inference", framework=framework))
        return sorted(i.layer for i in step.items if i.attributes.get(DYNAMIC_CAST))

    assert marked("pytorch-eager") == ["res"]
    assert marked("pytorch-compiled") == []  # Inductor's kernels convert as they load


def test_a_mul_over_two_dtypes_reads_the_half_operand_in_one_gradient() -> None:
    g = ModelGraph("gate", (
        layer("ln", "LayerNormalization", [t("x", 4, 16), t("g", 16), t("b", 16)],
              [t("n", 4, 16)], params=("g", "b")),
        layer("fc", "MatMul", [t("n", 4, 16), t("w", 16, 16)], [t("h", 4, 16)],
              params=("w",)),
        layer("gate", "Mul", [t("h", 4, 16), t("n", 4, 16)], [t("y", 4, 16)]),
    ), (), {}, 16 * 16 + 32)
    step = build_step(g, TrainingSettings(batch_size=4, precision="bf16"))
    grads = [(i.op, i.dtype, i.attributes.get(DYNAMIC_CAST))
             for i in step.backward if i.layer == "gate"]
    # dh = dY * n (fp32 by fp32, then cast to bf16); dn = dY * h reads bf16 h: unrolled
    assert grads == [("mul_grad", "float32", None), ("cast", "bfloat16", None),
                     ("mul_grad", "float32", 1)]


def test_build_step_prices_kept_fp32_ops_at_fp32_width_under_bf16() -> None:
    step = build_step(block(), TrainingSettings(batch_size=4, precision="bf16"))
    by_role = {(i.layer, i.role): i for i in step.forward}
    assert by_role[("ln", "fwd")].dtype == "float32"
    assert by_role[("fc1", "fwd")].dtype == "bfloat16"
    assert by_role[("res", "fwd")].dtype == "float32"
    assert sum(i.role == "autocast_cast" for i in step.forward) == 2
    fp32 = build_step(block(), TrainingSettings(batch_size=4, precision="fp32"))
    assert not any(i.role.startswith("autocast") for i in fp32.items)


def test_a_fused_attention_core_has_no_casts_inside() -> None:
    """One scaled_dot_product_attention under autocast: the scores' cast up for Softmax and
    the probabilities' cast down for ·V never happen; an fp32 V entering the core still is."""
    from gpuplan_estimator.step.attention import FusedAttention
    g = ModelGraph("core", (
        layer("qk", "MatMul", [t("q", 2, 8, 4, dtype="float32"), t("k", 2, 4, 8)],
              [t("s", 2, 8, 8)]),
        layer("soft", "Softmax", [t("s", 2, 8, 8)], [t("p", 2, 8, 8)]),
        layer("pv", "MatMul", [t("p", 2, 8, 8), t("v", 2, 8, 4)], [t("o", 2, 8, 4)]),
    ), (), {}, 0)
    dtypes = autocast.tensor_dtypes(g, "bf16")
    eager, _ = autocast.cast_items(g, "bf16", dtypes, frozenset())
    assert {(i.layer, i.dims["rows"] * i.dims["cols"]) for i in eager} == {
        ("qk", 64), ("soft", 128), ("pv", 128), ("pv", 64)}
    fused = FusedAttention(folded=frozenset({"soft"}), recomputed=frozenset({"qk"}),
                           internal=frozenset({"s", "p"}))
    inside, _ = autocast.cast_items(g, "bf16", dtypes, frozenset(), fused)
    assert sorted((i.layer, i.dims["rows"] * i.dims["cols"]) for i in inside) == [
        ("pv", 64), ("qk", 64), ("qk", 64)]


FAMILY.update({"Conv": OpFamily.CONV, "BatchNormalization": OpFamily.NORMALIZATION})


def cnn_block() -> ModelGraph:
    """Conv -> batch norm (fp32 weight, bias and running stats) -> ReLU -> conv."""
    bn_params = ("scale", "shift", "mean", "var")
    return ModelGraph("cnn", (
        layer("conv1", "Conv", [t("img", 2, 3, 8, 8), t("k1", 4, 3, 3, 3)], [t("c1", 2, 4, 8, 8)],
              params=("k1",)),
        layer("bn", "BatchNormalization",
              [t("c1", 2, 4, 8, 8), *(t(p, 4) for p in bn_params)], [t("b1", 2, 4, 8, 8)],
              params=bn_params),
        layer("relu", "Relu", [t("b1", 2, 4, 8, 8)], [t("a1", 2, 4, 8, 8)]),
        layer("conv2", "Conv", [t("a1", 2, 4, 8, 8), t("k2", 4, 4, 3, 3)], [t("c2", 2, 4, 8, 8)],
              params=("k2",)),
    ), (), {}, 4 * 27 + 16 + 4 * 36)


def test_batch_norm_keeps_its_inputs_half_dtype_so_no_activation_is_cast() -> None:
    g = cnn_block()
    dtypes = autocast.tensor_dtypes(g, "bf16")
    assert dtypes["b1"] == dtypes["a1"] == "bfloat16"  # fp32 BN parameters do not promote
    forward, _ = autocast.cast_items(g, "bf16", dtypes, gradient_tensors(g))
    # the image and the two kernels; the second conv's activation is half already
    assert sorted(i.layer for i in forward) == ["conv1", "conv1", "conv2"]


def linear_block() -> ModelGraph:
    """torch's linear over a 3-D input as dynamo writes it (MatMul + Add bias), then ReLU."""
    return ModelGraph("linear", (
        layer("mm", "MatMul", [t("x", 2, 4, 8), t("w", 8, 8)], [t("p", 2, 4, 8)], params=("w",)),
        layer("linear", "Add", [t("p", 2, 4, 8), t("bias", 8)], [t("l", 2, 4, 8)],
              params=("bias",)),
        layer("relu", "Relu", [t("l", 2, 4, 8)], [t("y", 2, 4, 8)]),
    ), (), {}, 72)


def test_a_linears_bias_add_is_half_like_its_gemm() -> None:
    dtypes = autocast.tensor_dtypes(linear_block(), "bf16")
    assert dtypes["l"] == dtypes["y"] == "bfloat16"  # the fp32 bias does not promote


def test_the_memory_walk_runs_the_dtypes_autocast_assigns() -> None:
    """The memory walk's element widths are the compute path's dtypes (one autocast flow)."""
    for g in (block(), cnn_block(), linear_block()):
        params = eager.parameter_sizes(g)
        widths = memory_walk.run_widths(g.layers, params, 2,
                                        frozenset(eager.linear_biases(g.layers, params)))
        dtypes = autocast.tensor_dtypes(g, "bf16")
        assert dtypes, g.name
        assert {n: DTYPE_BYTES[d] for n, d in dtypes.items()} == {
            n: widths[n] for n in dtypes}, g.name
