"""Autograd's gradient sums: one add per differentiable use of a tensor beyond the first."""

from __future__ import annotations

from gpuplan_estimator.core.layers import ModelGraph
from gpuplan_estimator.core.workload import Phase
from gpuplan_estimator.step import autocast, gradient_sums
from gpuplan_estimator.step.decomposition import TrainingSettings, build_step, gradient_tensors
from gpuplan_testing.layer_builders import layer, t


def block() -> ModelGraph:
    """A pre-norm block: x feeds the norm and the residual; n feeds three projections (q, k, v
    of separate weights), a Shape (no gradient) and, twice, one Mul; the two last projections
    share one weight."""
    x, n = t("x", 4, 8, 16), t("n", 4, 8, 16)
    return ModelGraph("block", (
        layer("embed", "Gather", [t("table", 100, 16), t("ids", 4, 8, dtype="int64")], [x],
              params=["table"]),
        layer("ln", "LayerNormalization", [x, t("g", 16), t("b", 16)], [n], params=["g", "b"]),
        layer("size", "Shape", [n], [t("s", 3, dtype="int64")]),
        layer("q", "MatMul", [n, t("wq", 16, 16)], [t("hq", 4, 8, 16)], params=["wq"]),
        layer("k", "MatMul", [n, t("w", 16, 16)], [t("hk", 4, 8, 16)], params=["w"]),
        layer("v", "MatMul", [n, t("w", 16, 16)], [t("hv", 4, 8, 16)], params=["w"]),
        layer("sq", "Mul", [n, n], [t("n2", 4, 8, 16)]),
        layer("res", "Add", [x, t("hq", 4, 8, 16)], [t("r", 4, 8, 16)]),
    ), (), {}, 17)


def sums_by_tensor_owner(items: dict[str, tuple]) -> dict[str, tuple[int, str, int]]:
    return {owner: (i.count, i.dtype, i.dims["rows"] * i.dims["cols"])
            for owner, got in items.items() for i in got}


def test_one_add_per_use_beyond_the_first_at_the_tensors_size() -> None:
    g = block()
    got = gradient_sums.gradient_sum_items(g, gradient_tensors(g), "float32", {})
    # x: norm + residual (1); n: q, k, v and the Mul's two operands, not the Shape (4);
    # w: two projections (1, with its first user); wq, g, b, table: one use each.
    assert sums_by_tensor_owner(got) == {
        "embed": (1, "float32", 4 * 8 * 16), "ln": (4, "float32", 4 * 8 * 16),
        "k": (1, "float32", 16 * 16)}
    item = got["ln"][0]
    assert (item.phase, item.kernel, item.op, item.role) == (
        Phase.BACKWARD, "elementwise", "add", gradient_sums.ROLE)
    assert item.bytes_moved == 3 * 4 * 8 * 16 * 4  # two gradients read, their sum written


def test_sums_run_at_each_tensors_run_time_dtype() -> None:
    g = block()
    dtypes = autocast.tensor_dtypes(g, "bf16")
    got = sums_by_tensor_owner(gradient_sums.gradient_sum_items(
        g, gradient_tensors(g), "bfloat16", dtypes))
    assert got["ln"][1] == "float32"  # a LayerNorm output stays fp32 under autocast
    assert got["k"][1] == "float32"  # master weights are fp32
    fp16 = sums_by_tensor_owner(gradient_sums.gradient_sum_items(
        g, gradient_tensors(g), "float16", {}))
    assert {dtype for _, dtype, _ in fp16.values()} == {"float16"}


def test_a_fused_core_reads_each_tensor_once() -> None:
    g = block()
    got = sums_by_tensor_owner(gradient_sums.gradient_sum_items(
        g, gradient_tensors(g), "float32", {}, fused_core={"k", "v", "sq"}))
    assert got["ln"][0] == 1  # q, and the core once
    assert "k" not in got  # the shared weight: read once, inside the core


def test_training_steps_carry_the_sums_and_inference_none() -> None:
    g = block()
    train = build_step(g, TrainingSettings(batch_size=4, precision="fp32", mode="train"))
    sums = [i for i in train.backward if i.role == gradient_sums.ROLE]
    # Dropout and the loss hang off the tensors they read: no use of their own.
    assert sum(i.count for i in sums) == 6
    infer = build_step(g, TrainingSettings(batch_size=4, precision="fp32", mode="inference"))
    assert not infer.backward
