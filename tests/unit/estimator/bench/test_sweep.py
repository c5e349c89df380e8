"""Sweep specs: validation, deterministic sampling, limits, canonical dims."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from gpuplan_estimator.bench import runner, shapes, sweep
from gpuplan_estimator.core import errors
from gpuplan_estimator.cost import aligned_gemm

SHIPPED = runner.DEFAULT_SWEEP_DIR


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


GEMM = """
kernel: gemm
ops: [matmul]
dims:
  batch: {choice: [1, 2]}
  m: {log: [1, 64]}
  k: {int: [1, 64]}
  n: {ref: m}
  bias: 0
limits:
  cpu: {max_flops: 1.0e5, max_bytes: 1.0e6}
"""


def test_shipped_specs_cover_every_family_and_sample_for_cpu_and_cuda() -> None:
    specs = sweep.load_specs([SHIPPED])
    assert {s.kernel for s in specs} == set(sweep.KERNELS)
    for kind in ("cpu", "cuda"):
        plan = sweep.sample_plan(specs, samples=70, seed=3, device_kind=kind)
        assert len(plan) == 70
        assert {it.kernel for it in plan} == set(sweep.KERNELS)
        for it in plan:
            # A kernel may have several specs (gemm: the wide sweep and batch-1 GEMV); the
            # item must fit the caps of one of them.
            flops, nbytes = shapes.cost(it.kernel, it.op, it.dims, it.dtype)
            assert any(flops <= s.limits[kind].max_flops and nbytes <= s.limits[kind].max_bytes
                       for s in specs if s.kernel == it.kernel)


def test_sampling_is_deterministic_by_seed(tmp_path: Path) -> None:
    specs = [sweep.load_spec(write(tmp_path, "g.yaml", GEMM))]
    a = sweep.sample_plan(specs, samples=20, seed=7, device_kind="cpu")
    b = sweep.sample_plan(specs, samples=20, seed=7, device_kind="cpu")
    c = sweep.sample_plan(specs, samples=20, seed=8, device_kind="cpu")
    assert a == b
    assert a != c
    assert len({it.key() for it in a}) == 20  # distinct items
    for it in a:
        assert it.dims["n"] == it.dims["m"] and it.dims["bias"] == 0
        assert 2 * it.dims["batch"] * it.dims["m"] * it.dims["k"] * it.dims["n"] <= 1e5


def test_canonical_dims_for_elementwise_and_memcpy() -> None:
    specs = sweep.load_specs([SHIPPED])
    plan = sweep.sample_plan(specs, samples=200, seed=1, device_kind="cpu",
                             families=["elementwise", "memcpy"])
    assert {it.kernel for it in plan} == {"elementwise", "memcpy"}
    for it in plan:
        if it.kernel == "memcpy":
            assert set(it.dims) == {"elements"} and it.dims["elements"] % 64 == 0
        else:
            assert set(it.dims) == {"rows", "cols", "operands"}
            if it.op in shapes.WINDOW_OPS:  # LRN: the window size plays operands
                assert it.dims["operands"] in (3, 5)
            else:
                assert it.dims["operands"] == (2 if it.op in ("add", "mul", "div", "pow") else 1)


def test_conv_same_padding_and_valid_output() -> None:
    specs = sweep.load_specs([SHIPPED / "conv2d.yaml"])
    for it in sweep.sample_plan(specs, samples=50, seed=2, device_kind="cpu"):
        d = it.dims
        assert d["pad_h"] == d["kernel_h"] // 2 and d["w"] == d["h"]
        assert 7 <= d["h"] <= 224 and d["kernel_h"] in (1, 3, 5, 7)
        assert min(shapes.conv_out(d)) >= 1


def test_plan_item_json_roundtrip() -> None:
    item = sweep.PlanItem("gemm", "matmul", "float32", {"m": 2, "batch": 1})
    assert sweep.PlanItem.from_json(item.to_json()) == item
    assert item.key()[3] == '{"batch":1,"m":2}'


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("kernel: gemm\nops: [matmul]\nlimits: {}\n", "missing field 'dims'"),
        (GEMM.replace("kernel: gemm", "kernel: fft"), "kernel 'fft' not one of"),
        (GEMM.replace("{ref: m}", "{ref: zz}"), r"dims.n: ref must name an earlier dim"),
        (GEMM.replace("{int: [1, 64]}", "{int: [9, 1]}"), r"dims.k: int needs \[lo, hi\]"),
        (GEMM.replace("{int: [1, 64]}", "{normal: 3}"), "unknown distribution 'normal'"),
        (GEMM.replace("{int: [1, 64]}", "{aligned: [8, 64, 16]}"), r"dims.k: aligned needs"),
        (GEMM.replace("{int: [1, 64]}", "{aligned: [8, 64]}"), r"dims.k: aligned needs"),
        (GEMM.replace("max_bytes: 1.0e6", "max_bytes: lots"), "limits.cpu needs numeric"),
        ("- a\n- b\n", "must be a mapping"),
        ("kernel: [unclosed\n", "invalid YAML"),
    ],
)
def test_bad_specs_name_file_and_field(tmp_path: Path, text: str, match: str) -> None:
    path = write(tmp_path, "bad.yaml", text)
    with pytest.raises(errors.GpuplanError, match=match) as info:
        sweep.load_spec(path)
    assert str(path) in str(info.value)


def test_unknown_family_and_impossible_limits(tmp_path: Path) -> None:
    specs = [sweep.load_spec(write(tmp_path, "g.yaml", GEMM))]
    with pytest.raises(errors.GpuplanError, match="no sweep spec for famil"):
        sweep.sample_plan(specs, samples=3, seed=0, device_kind="cpu", families=["conv2d"])
    with pytest.raises(errors.GpuplanError, match="no limits for device kind 'cuda'"):
        sweep.sample_plan(specs, samples=3, seed=0, device_kind="cuda")
    tight = [sweep.load_spec(write(tmp_path, "t.yaml", GEMM.replace("1.0e5", "1.0")))]
    with pytest.raises(errors.GpuplanError, match="could only sample"):
        sweep.sample_items(tight[0], 2, "cpu", np.random.default_rng(0))


@pytest.mark.parametrize(
    ("weights", "total", "expected"),
    [([1, 1, 1], 10, [4, 3, 3]), ([3, 1], 8, [6, 2]), ([1], 5, [5]), ([2, 1, 1], 1, [1, 0, 0])],
)
def test_allocate_by_weight(weights: list[float], total: int, expected: list[int]) -> None:
    assert sweep.allocate(weights, total) == expected


def test_plan_interleaves_families_so_a_budget_cut_keeps_coverage() -> None:
    specs = sweep.load_specs([SHIPPED])
    plan = sweep.sample_plan(specs, samples=100, seed=0, device_kind="cpu")
    assert {it.kernel for it in plan[: len(specs)]} == set(sweep.KERNELS)
    assert {(it.kernel, it.op) for it in plan[: len(specs)]} >= {("elementwise", "lrn")}


def test_plan_digest_changes_with_parameters(tmp_path: Path) -> None:
    specs = [sweep.load_spec(write(tmp_path, "g.yaml", GEMM))]
    a = sweep.plan_digest(specs, samples=5, seed=1)
    assert a == sweep.plan_digest(specs, samples=5, seed=1)
    assert a != sweep.plan_digest(specs, samples=5, seed=2)
    other = [sweep.load_spec(write(tmp_path, "h.yaml", GEMM.replace("64]", "65]")))]
    assert a != sweep.plan_digest(other, samples=5, seed=1)


def test_grouped_and_depthwise_conv_specs_sample_valid_groups() -> None:
    depthwise = sweep.load_spec(SHIPPED / "conv2d-depthwise.yaml")
    grouped = sweep.load_spec(SHIPPED / "conv2d-grouped.yaml")
    depthwise_plan = sweep.sample_plan([depthwise], samples=30, seed=1, device_kind="cpu")
    assert len(depthwise_plan) == 30
    for it in depthwise_plan:
        assert it.dims["groups"] == it.dims["c_in"] == it.dims["c_out"] > 1
    plan = sweep.sample_plan([grouped], samples=30, seed=1, device_kind="cpu")
    assert {it.dims["groups"] for it in plan} > {2}
    for it in plan:
        assert it.dims["c_in"] % it.dims["groups"] == 0
        assert it.dims["c_out"] % it.dims["groups"] == 0


def test_aligned_dims_are_multiples_of_their_step_within_range(tmp_path: Path) -> None:
    text = GEMM.replace("{log: [1, 64]}", "{aligned: [64, 4096, 64]}").replace(
        "{int: [1, 64]}", "{aligned: [96, 1000, 32]}").replace("max_flops: 1.0e5",
                                                                "max_flops: 1.0e12").replace(
        "max_bytes: 1.0e6", "max_bytes: 1.0e12")
    spec = sweep.load_spec(write(tmp_path, "aligned.yaml", text))
    plan = sweep.sample_plan([spec], samples=60, seed=1, device_kind="cpu")
    assert all(it.dims["m"] % 64 == 0 and 64 <= it.dims["m"] <= 4096 for it in plan)
    assert all(it.dims["k"] % 32 == 0 and 96 <= it.dims["k"] <= 992 for it in plan)
    assert len({it.dims["m"] for it in plan}) > 10  # spread over the range, not one value


def test_the_shipped_model_shaped_sweeps_draw_tensor_core_aligned_shapes() -> None:
    specs = [s for s in sweep.load_specs([SHIPPED]) if "aligned" in Path(s.path).name]
    assert {s.kernel for s in specs} == {"gemm", "conv2d"}
    plan = sweep.sample_plan(specs, samples=40, seed=0, device_kind="cuda")
    for it in plan:
        dims = ("m", "k", "n") if it.kernel == "gemm" else ("c_in", "c_out")
        assert all(it.dims[d] % 32 == 0 for d in dims), it
    (vocab,) = [s for s in sweep.load_specs([SHIPPED]) if Path(s.path).name == "gemm-vocab.yaml"]
    for kind in ("cpu", "cuda"):
        heads = sweep.sample_plan([vocab], samples=20, seed=0, device_kind=kind)
        # past the wide sweep's 8,192, where the profile-fitted LM-head classes price them
        assert all(it.dims["n"] >= aligned_gemm.VOCABULARY_MIN_DIM for it in heads)
    (losses,) = [s for s in sweep.load_specs([SHIPPED]) if Path(s.path).name ==
                 "softmax-vocab.yaml"]
    for kind in ("cpu", "cuda"):
        rows = sweep.sample_plan([losses], samples=20, seed=0, device_kind=kind)
        # a loss's LogSoftmax over a vocabulary, past the wide softmax sweep's 16,384 columns
        assert rows and all(it.dims["cols"] >= 16384 for it in rows)
    (casts,) = [s for s in sweep.load_specs([SHIPPED]) if Path(s.path).name ==
                "elementwise-cast.yaml"]
    for kind in ("cpu", "cuda"):
        rows = sweep.sample_plan([casts], samples=20, seed=0, device_kind=kind)
        # autocast's casts, one operand read in the other dtype (`shapes.cast_source`)
        assert rows and all(it.op == "cast" and it.dims["operands"] == 1 for it in rows)

