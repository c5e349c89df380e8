"""Eager PyTorch runs a permute as a view (issue #30): a Transpose costs a copy only where some
use of its view needs memory in another order."""

from __future__ import annotations

import pytest

from gpuplan_estimator.core.layers import ModelGraph
from gpuplan_estimator.step import attention, views
from gpuplan_estimator.step.decomposition import TrainingSettings, build_step
from gpuplan_testing.layer_builders import layer, t

B, S, H, D = 2, 8, 4, 16


@pytest.mark.parametrize(("shape", "strides", "new", "expected"), [
    ((B, S, H * D), (S * H * D, H * D, 1), (B, S, H, D), (S * H * D, H * D, D, 1)),  # split
    ((B, H, S, D), (S * H * D, D, H * D, 1), (B * H, S, D), None),  # heads apart: no view
    ((S, B * H, D), (B * H * D, D, 1), (S, B, H, D), (B * H * D, H * D, D, 1)),
    ((B * H, S, D), (D, B * H * D, 1), (B, H, S, D), (H * D, D, B * H * D, 1)),  # ViT's split
    ((B, 1, S), (S, 7, 1), (B, S), (S, 1)),  # size-1 dims take any stride
    ((B, S), (S, 1), (B, S + 1), None),  # not the same elements
])
def test_a_reshape_is_a_view_where_the_strides_allow(
        shape: tuple[int, ...], strides: tuple[int, ...], new: tuple[int, ...],
        expected: tuple[int, ...] | None) -> None:
    assert views.view_strides(shape, strides, new) == expected


def test_a_gemm_reads_transposed_matrices_and_collapsible_batches() -> None:
    assert views.gemm_reads((S, D), (1, S))  # Wᵀ: cuBLAS's transpose flag
    assert views.gemm_reads((B, H, S, D), (H * S * D, S * D, D, 1))
    assert not views.gemm_reads((B, H, S, D), (S * H * D, D, H * D, 1))  # batch dims apart
    assert not views.gemm_reads((S, D), (D * 2, 2))  # no unit stride in the matrix


def attention_block() -> ModelGraph:
    """x[B,S,H·D] -> q, k, v split into heads (permutes) -> scores -> softmax -> ·v -> merge
    heads (permute + reshape) -> residual add with a permuted copy of x."""
    ls = [layer("split", "Reshape", [t("x", B, S, H * D), t("shape4", 4, dtype="int64")],
                [t("x4", B, S, H, D)])]
    for name, perm, shape in (("q", [0, 2, 1, 3], (B, H, S, D)), ("k", [0, 2, 3, 1], (B, H, D, S)),
                              ("v", [0, 2, 1, 3], (B, H, S, D))):
        ls.append(layer(f"{name}.permute", "Transpose", [t("x4", B, S, H, D)],
                        [t(name, *shape)], attrs={"perm": perm}))
    ls += [
        layer("scores", "MatMul", [t("q", B, H, S, D), t("k", B, H, D, S)], [t("s", B, H, S, S)]),
        layer("softmax", "Softmax", [t("s", B, H, S, S)], [t("p", B, H, S, S)],
              attrs={"axis": -1}),
        layer("context", "MatMul", [t("p", B, H, S, S), t("v", B, H, S, D)],
              [t("c", B, H, S, D)]),
        layer("merge.permute", "Transpose", [t("c", B, H, S, D)], [t("cm", B, S, H, D)],
              attrs={"perm": [0, 2, 1, 3]}),
        layer("merge", "Reshape", [t("cm", B, S, H, D), t("shape3", 3, dtype="int64")],
              [t("o", B, S, H * D)]),
        layer("xt", "Transpose", [t("x", B, S, H * D)], [t("xT", S, B, H * D)],
              attrs={"perm": [1, 0, 2]}),
        layer("xt.back", "Transpose", [t("xT", S, B, H * D)], [t("xTT", B, S, H * D)],
              attrs={"perm": [1, 0, 2]}),
        layer("residual", "Add", [t("o", B, S, H * D), t("xTT", B, S, H * D)],
              [t("y", B, S, H * D)]),
        layer("shape_of_xT", "Shape", [t("xT", S, B, H * D)], [t("xs", 3, dtype="int64")]),
    ]
    return ModelGraph("block", tuple(ls), (), {}, 17)


def test_which_permutes_eager_pytorch_copies() -> None:
    g = attention_block()
    eager = views.view_layers(g, attention.EAGER)
    # torch.matmul folds (B, H) into one batch: heads split from a [B, S, H, D] tensor do not
    # fold, so q, k and v are copied; the merge is copied by its reshape; the residual's
    # permute pair is read by an elementwise add as it is.
    assert eager == {"xt", "xt.back"}
    fused = attention.FusedAttention(folded=frozenset({"softmax"}),
                                     recomputed=frozenset({"scores"}),
                                     internal=frozenset({"s", "p"}),
                                     kept={"context": ()})
    # scaled_dot_product_attention takes Q, K, V by their strides, and returns its output as
    # the heads-major view of a [B, S, H, D] buffer: the merge's permute makes it contiguous.
    assert views.view_layers(g, fused) == {"q.permute", "k.permute", "v.permute",
                                           "merge.permute", "xt", "xt.back"}


def split_block(reader: str) -> ModelGraph:
    """A fused Q/K/V projection's output split three ways on the hidden axis; q is read by a
    `reader` (Add reads strides, Softmax needs contiguous memory)."""
    return ModelGraph("split", (
        layer("proj", "MatMul", [t("x", B, S, H * D), t("w", H * D, 3 * H * D)],
              [t("qkv", B, S, 3 * H * D)], params=["w"]),
        layer("split", "Split", [t("qkv", B, S, 3 * H * D)],
              [t("q", B, S, H * D), t("k", B, S, H * D), t("v", B, S, H * D)],
              attrs={"axis": 2}),
        layer("use_q", reader, [t("q", B, S, H * D), t("k", B, S, H * D)]
              if reader == "Add" else [t("q", B, S, H * D)], [t("y", B, S, H * D)]),
        layer("use_v", "Add", [t("y", B, S, H * D), t("v", B, S, H * D)], [t("z", B, S, H * D)]),
    ), (), {}, 17)


def test_a_split_is_a_view_unless_a_use_needs_contiguous_memory() -> None:
    assert views.view_layers(split_block("Add"), attention.EAGER) == {"split"}
    assert views.view_layers(split_block("Softmax"), attention.EAGER) == frozenset()


def test_a_split_view_costs_no_forward_kernel_and_its_backward_one_cat() -> None:
    step = build_step(split_block("Add"), TrainingSettings(batch_size=B))
    (fwd,) = [i for i in step.forward if i.layer == "split"]
    assert fwd.kernel == "none"
    (back,) = [i for i in step.backward if i.layer == "split"]
    elements = B * S * 3 * H * D
    assert (back.kernel, back.dims["rows"] * back.dims["cols"]) == ("elementwise", elements)
    assert back.bytes_moved == 2 * elements * 4  # the slices' gradients read, the cat written


def test_a_view_costs_no_kernel_in_pytorch_and_a_copy_in_onnxruntime() -> None:
    g = attention_block()

    def kernels_of(framework: str) -> dict[str, str]:
        step = build_step(g, TrainingSettings(batch_size=B, mode="inference",
                                              framework=framework))
        return {item.layer: item.kernel for item in step.forward if "permute" in item.layer
                or item.layer.startswith("xt")}

    eager = kernels_of("pytorch-eager")
    assert eager["xt"] == eager["xt.back"] == "none"
    assert eager["q.permute"] == eager["merge.permute"] == "memcpy"
    assert set(kernels_of("onnxruntime").values()) == {"memcpy"}


def test_a_transpose_its_shapes_contradict_is_left_a_copy() -> None:
    g = ModelGraph("odd", (
        layer("odd", "Transpose", [t("x", B, S, H * D)], [t("y", H * D, S, B)],
              attrs={"perm": [1, 0]}),
        layer("use", "Relu", [t("y", H * D, S, B)], [t("z", H * D, S, B)]),
    ), (), {}, 17)
    assert views.view_layers(g, attention.EAGER) == frozenset()
