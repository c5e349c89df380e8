"""Tensor, pipeline and data parallelism: layouts, communication formulas, whole steps (#19)."""

from __future__ import annotations

import dataclasses

import pytest

from gpuplan_estimator import devices, graph
from gpuplan_estimator.core.errors import InvalidRequestError
from gpuplan_estimator.core.layers import OpFamily
from gpuplan_estimator.cost.roofline import RooflinePredictor
from gpuplan_estimator.graph import hf_blocks, zoo
from gpuplan_estimator.parallel import layouts
from gpuplan_estimator.parallel.layouts import (
    ModelDims,
    ParallelLayout,
    RegionTime,
    SingleGpuSplit,
)
from gpuplan_estimator.parallel.scaling import ScalingModel
from gpuplan_estimator.planning import estimates, parallel_inputs
from gpuplan_estimator.step.decomposition import TrainingSettings

DIMS = ModelDims(hidden=1024, sequence=2048, blocks=24, element_bytes=2, heads=16)
EXACT = ScalingModel(bandwidth_efficiency=1.0, hop_latency_us=0.0, overlap=0.0)


def _device(key: str = "a100-sxm4-80gb") -> devices.DeviceSpec:
    return devices.load_catalog().resolve(key)


def _split(*, batch: int = 4, blocks_ms: float = 240.0, tp_fraction: float = 0.75,
           pre_ms: float = 0.0, post_ms: float = 0.0, optimizer_ms: float = 8.0,
           gradient_bytes: int = 10**9) -> SingleGpuSplit:
    compute = blocks_ms + pre_ms + post_ms
    return SingleGpuSplit(
        batch=batch, forward_ms=compute / 3, backward_ms=2 * compute / 3,
        optimizer_ms=optimizer_ms, gradient_bytes=gradient_bytes,
        pre=RegionTime(0.0, pre_ms), blocks=RegionTime(blocks_ms * tp_fraction,
                                                        blocks_ms * (1 - tp_fraction)),
        post=RegionTime(post_ms, 0.0))


# --- layouts -------------------------------------------------------------------------------


def test_uneven_batch_is_refused_with_the_leftover() -> None:
    layout = ParallelLayout(dp=3, tp=1, pp=1, micro_batches=2)
    problems = layouts.layout_problems(layout, gpu_count=3, gpus_per_node=8, global_batch=16)
    assert problems == ("layout.micro_batches: global batch 16 does not split into dp=3 x 2 "
                        "micro-batch(es) (4 sample(s) left over)",)
    with pytest.raises(InvalidRequestError, match="left over"):
        layout.micro_batch_size(16)
    assert ParallelLayout(dp=4, tp=1, pp=1, micro_batches=2).micro_batch_size(16) == 2


@pytest.mark.parametrize(("tp", "gpus_per_node", "ok"), [
    (8, 8, True), (4, 8, True), (8, 4, False), (3, 6, True), (4, 6, False)])
def test_tp_stays_inside_a_node(tp: int, gpus_per_node: int, ok: bool) -> None:
    layout = ParallelLayout(dp=1, tp=tp, pp=1, micro_batches=1)
    problems = layouts.layout_problems(layout, gpu_count=tp, gpus_per_node=gpus_per_node,
                                           global_batch=8)
    assert (problems == ()) is ok
    if not ok:
        assert problems[0].startswith("layout.tp:")


def test_every_problem_is_named_at_once() -> None:
    layout = ParallelLayout(dp=2, tp=3, pp=32, micro_batches=5)
    problems = layouts.layout_problems(layout, gpu_count=8, gpus_per_node=8, global_batch=8,
                                           dims=DIMS)
    fields = [p.split(":")[0] for p in problems]
    assert fields == ["layout", "layout.tp", "layout.micro_batches", "layout.tp", "layout.tp",
                      "layout.pp"]


def test_layouts_are_exactly_the_valid_ones() -> None:
    found = list(layouts.layouts(8, 4, 8, max_tp=4, dims=DIMS))
    assert found, "8 GPUs of 4-GPU nodes have layouts for batch 8"
    for layout in found:
        assert layout.gpu_count == 8
        assert layout.tp <= 4
        assert 8 % (layout.dp * layout.micro_batches) == 0
    assert ParallelLayout(dp=8, tp=1, pp=1, micro_batches=1) in found
    assert ParallelLayout(dp=1, tp=4, pp=2, micro_batches=8) in found
    assert not any(layout.tp == 8 for layout in found)  # tp 8 does not fit a 4-GPU node
    assert len(found) == len(set(found))


def test_layouts_respect_max_pp_and_block_count() -> None:
    shallow = dataclasses.replace(DIMS, blocks=2)
    found = list(layouts.layouts(8, 8, 8, dims=shallow))
    assert max(layout.pp for layout in found) == 2
    assert max(layout.pp for layout in layouts.layouts(8, 8, 8, max_pp=4)) == 4


# --- formulas on hand numbers --------------------------------------------------------------


def test_tp_message_and_allreduce_by_hand() -> None:
    # 2 x 2048 x 1024 x 2 bytes = 8 MiB; ring over 4 GPUs at 100 GB/s: 2*3/4*8388608/1e11 s
    assert layouts.activation_bytes(2, DIMS) == 8 * 2**20
    device = dataclasses.replace(_device(), interconnect_gbps=100.0)
    ms = layouts.tp_allreduce_ms(8 * 2**20, 4, gpus_per_node=8, device=device,
                                     scaling=EXACT)
    assert ms == pytest.approx(1.5 * 8 * 2**20 / 1e11 * 1e3)


def test_tp_comm_of_a_step_is_four_allreduces_per_block_plus_two() -> None:
    device = dataclasses.replace(_device(), interconnect_gbps=100.0)
    layout = ParallelLayout(dp=1, tp=4, pp=1, micro_batches=1)
    step = layouts.step_time(layout, _split(batch=2), DIMS, device, EXACT, gpus_per_node=8)
    one = 1.5 * layouts.activation_bytes(2, DIMS) / 1e11 * 1e3
    assert step.tp_comm_ms == pytest.approx((4 * 24 + 2) * one)


@pytest.mark.parametrize(("pp", "m", "expected"), [(1, 1, 0.0), (4, 1, 0.75), (4, 4, 3 / 7),
                                                   (2, 8, 1 / 9)])
def test_bubble_fraction(pp: int, m: int, expected: float) -> None:
    assert layouts.bubble_fraction(pp, m) == pytest.approx(expected)


def test_more_micro_batches_shrink_the_bubble_share() -> None:
    shares = [layouts.bubble_fraction(4, m) for m in (1, 2, 4, 8, 16, 32)]
    assert shares == sorted(shares, reverse=True)
    assert len(set(shares)) == len(shares)


def test_even_pipeline_is_m_plus_pp_minus_one_stages() -> None:
    assert layouts.pipeline_ms((10.0,) * 4, 8) == pytest.approx((8 + 4 - 1) * 10.0)
    # An uneven pipeline is paced by its slowest stage.
    assert layouts.pipeline_ms((10.0, 10.0, 20.0), 3) == pytest.approx(40.0 + 2 * 20.0)


def test_blocks_split_evenly_else_the_first_stages_take_one_more() -> None:
    assert layouts.stage_blocks(24, 4) == (6, 6, 6, 6)
    assert layouts.stage_blocks(10, 4) == (3, 3, 2, 2)


def test_pipeline_step_by_hand() -> None:
    # 24 blocks over 4 stages, no TP, 4 micro-batches of the 240 ms (for the micro-batch) step:
    # 60 ms a stage, (4 + 3) x 60 ms of pipeline; the bubble is 3 x 60 ms plus the sends of
    # the ramp: 6 sends in all stages, 2 in the slowest (a middle one) -> 6 + 3*2 - 4*2 = 4.
    layout = ParallelLayout(dp=1, tp=1, pp=4, micro_batches=4)
    step = layouts.step_time(layout, _split(gradient_bytes=0), DIMS, _device(), EXACT,
                                 gpus_per_node=8)
    assert step.compute_ms == pytest.approx(4 * 60.0)
    send_ms = step.pp_p2p_ms / (4 * 2)
    assert send_ms > 0
    assert step.pp_bubble_ms == pytest.approx(3 * 60.0 + 4 * send_ms)
    assert step.bubble_fraction == pytest.approx(3 / 7)
    assert step.optimizer_ms == pytest.approx(8.0 / 4)


def test_recomputation_is_stage_work_inside_the_pipeline() -> None:
    """Full checkpointing runs each stage's forward (1/3 of its 60 ms) again in every
    micro-batch's backward: 80 ms a stage, so fill and drain take 3 x 80 ms, not 3 x 60 ms;
    under TP the recomputed forward repeats its 2 all-reduces per block."""
    layout = ParallelLayout(dp=1, tp=1, pp=4, micro_batches=4)
    plain, full = (layouts.step_time(layout, _split(gradient_bytes=0), DIMS, _device(), EXACT,
                                     gpus_per_node=8, recompute_fraction=f) for f in (0.0, 1.0))
    assert plain.recompute_ms == 0.0
    assert full.compute_ms == plain.compute_ms == pytest.approx(4 * 60.0)
    assert full.recompute_ms == pytest.approx(4 * 20.0)
    assert full.pp_bubble_ms - plain.pp_bubble_ms == pytest.approx(3 * 20.0)
    assert full.total_ms - plain.total_ms == pytest.approx((4 + 3) * 20.0)
    device = dataclasses.replace(_device(), interconnect_gbps=100.0)
    tp = ParallelLayout(dp=1, tp=4, pp=1, micro_batches=1)
    half = layouts.step_time(tp, _split(batch=2), DIMS, device, EXACT, gpus_per_node=8,
                             recompute_fraction=0.5)
    one = 1.5 * layouts.activation_bytes(2, DIMS) / 1e11 * 1e3
    assert half.tp_comm_ms == pytest.approx((4 * 24 + 2 + 0.5 * 2 * 24) * one)
    assert half.recompute_ms == pytest.approx(0.5 * (240.0 * 0.75 / 4 + 240.0 * 0.25) / 3)


def test_dp_allreduces_the_shard_of_each_tp_pp_group() -> None:
    layout = ParallelLayout(dp=2, tp=2, pp=2, micro_batches=1)
    assert layouts.dp_shard_gradient_bytes(8 * 10**9, layout) == 2 * 10**9
    device = dataclasses.replace(_device(), interconnect_gbps=100.0)
    step = layouts.step_time(layout, _split(gradient_bytes=8 * 10**9), DIMS, device, EXACT,
                                 gpus_per_node=8)
    # Ring over dp=2 GPUs of the shard: 2 * 1/2 * 2e9 B / 1e11 B/s = 20 ms, nothing hidden.
    assert step.dp_allreduce_full_ms == pytest.approx(20.0)
    assert step.dp_allreduce_ms == pytest.approx(20.0)


@pytest.mark.parametrize(("order", "dp_crosses", "pp_crosses"), [
    ("tp-dp-pp", False, True), ("tp-pp-dp", True, False)])
def test_rank_order_decides_which_group_crosses_nodes(order: str, dp_crosses: bool,
                                                      pp_crosses: bool) -> None:
    # 8 GPUs on 4-GPU nodes: tp=2 inside, dp=2, pp=2.
    layout = ParallelLayout(dp=2, tp=2, pp=2, micro_batches=1)
    assert (layouts.dp_members_per_node(layout, 4, order) < layout.dp) is dp_crosses
    assert layouts.boundary_crosses_nodes(layout, 0, 4, order) is pp_crosses


def test_dp_allreduce_hides_behind_the_last_micro_batch_only() -> None:
    hiding = dataclasses.replace(EXACT, overlap=1.0)
    device = dataclasses.replace(_device(), interconnect_gbps=100.0)
    one = layouts.step_time(ParallelLayout(dp=2, tp=1, pp=1, micro_batches=1),
                                _split(batch=4, gradient_bytes=10**10), DIMS, device, hiding,
                                gpus_per_node=8)
    four = layouts.step_time(ParallelLayout(dp=2, tp=1, pp=1, micro_batches=4),
                                 _split(batch=1, blocks_ms=60.0, gradient_bytes=10**10), DIMS,
                                 device, hiding, gpus_per_node=8)
    assert one.dp_allreduce_full_ms == pytest.approx(four.dp_allreduce_full_ms)
    assert four.dp_allreduce_ms > one.dp_allreduce_ms


def test_step_refuses_an_invalid_layout_with_every_reason() -> None:
    with pytest.raises(InvalidRequestError) as err:
        layouts.step_time(ParallelLayout(dp=1, tp=16, pp=32, micro_batches=1), _split(),
                              DIMS, _device(), EXACT, gpus_per_node=8)
    assert any(d.startswith("layout.tp") for d in err.value.details)
    assert any(d.startswith("layout.pp") for d in err.value.details)


def test_from_totals_counts_everything_as_blocks() -> None:
    split = SingleGpuSplit.from_totals(batch=2, forward_ms=10.0, backward_ms=20.0,
                                       optimizer_ms=1.0, gradient_bytes=4, tp_split_fraction=0.8)
    assert split.problems() == ()
    assert split.blocks.tp_split_ms == pytest.approx(24.0)
    assert split.blocks.per_gpu_ms(4) == pytest.approx(24.0 / 4 + 6.0)
    moved = layouts.with_step(split, batch=4, forward_ms=20.0, backward_ms=40.0,
                                  optimizer_ms=1.0)
    assert moved.problems() == ()
    assert moved.blocks.tp_split_ms == pytest.approx(48.0)


# --- a whole step on a GPT-2-shaped graph --------------------------------------------------

GPT2_SMALLISH = {"model_type": "gpt2", "n_embd": 256, "n_head": 8, "n_layer": 6,
                 "n_positions": 128, "vocab_size": 1000}


@pytest.fixture(scope="module")
def gpt2() -> tuple[estimates.DeviceStepEstimate, graph.ModelGraph]:
    onnx_bytes = zoo.build_transformer(GPT2_SMALLISH, name="gpt2-test").SerializeToString()
    g = graph.load_at_batch(onnx_bytes, 4, {"sequence": 128})
    (e,) = estimates.estimate(g, [_device()], TrainingSettings(batch_size=4, precision="bf16"),
                              predictor=RooflinePredictor())
    return e, g


def test_dims_come_from_the_graph(gpt2: tuple[estimates.DeviceStepEstimate,
                                              graph.ModelGraph]) -> None:
    _, g = gpt2
    dims = parallel_inputs.model_dims_from_graph(g, precision="bf16")
    assert dims == ModelDims(hidden=256, sequence=128, blocks=6, element_bytes=2, heads=8)


LLAMA_SMALLISH = {"model_type": "llama", "hidden_size": 256, "num_attention_heads": 8,
                  "num_key_value_heads": 4, "num_hidden_layers": 3, "intermediate_size": 688,
                  "vocab_size": 1000}


def test_dims_of_a_llama_graph_whose_rmsnorm_is_spelled_out() -> None:
    # hf_blocks writes RMSNorm as Pow, ReduceMean, ... (as the exporters do): no norm layer to
    # read the width from, so it is the first projection's input.
    onnx_bytes = hf_blocks.build_decoder(LLAMA_SMALLISH, name="llama-test").SerializeToString()
    g = graph.load_at_batch(onnx_bytes, 2, {"sequence": 64})
    assert not any(layer.family is OpFamily.NORMALIZATION for layer in g.layers)
    dims = parallel_inputs.model_dims_from_graph(g, precision="bf16")
    assert dims == ModelDims(hidden=256, sequence=64, blocks=3, element_bytes=2, heads=8)
    (e,) = estimates.estimate(g, [_device()], TrainingSettings(batch_size=2, precision="bf16"),
                              predictor=RooflinePredictor())
    step = layouts.step_time(ParallelLayout(2, 2, 1, 1), parallel_inputs.split_from_estimate(e),
                             dims, _device(), ScalingModel(), gpus_per_node=8)
    assert step.tp_comm_ms > 0 and step.total_ms > 0


def test_estimate_is_cut_into_regions(gpt2: tuple[estimates.DeviceStepEstimate,
                                                  graph.ModelGraph]) -> None:
    e, _ = gpt2
    split = parallel_inputs.split_from_estimate(e)
    assert split.problems() == ()
    assert split.post.tp_split_ms > 0  # the LM head GEMM is vocab-parallel
    assert split.pre.tp_split_ms == 0  # embedding gathers stay whole
    assert 0.5 < split.blocks.tp_split_ms / split.blocks.total_ms < 1.0
    assert split.gradient_bytes == e.memory.reduced_gradients_bytes


@pytest.mark.parametrize("layout", [ParallelLayout(1, 1, 1, 1), ParallelLayout(4, 1, 1, 1),
                                    ParallelLayout(1, 4, 1, 1), ParallelLayout(1, 1, 4, 4),
                                    ParallelLayout(2, 2, 2, 2), ParallelLayout(1, 2, 3, 4)])
def test_whole_step_components_sum_to_total(
        gpt2: tuple[estimates.DeviceStepEstimate, graph.ModelGraph],
        layout: ParallelLayout) -> None:
    e, g = gpt2
    split = parallel_inputs.split_from_estimate(e)
    dims = parallel_inputs.model_dims_from_graph(g, precision="bf16")
    step = layouts.step_time(layout, split, dims, _device(), ScalingModel(), gpus_per_node=8)
    parts = (step.compute_ms, step.tp_comm_ms, step.pp_bubble_ms, step.pp_p2p_ms,
             step.dp_allreduce_ms, step.optimizer_ms)
    assert all(p >= 0 for p in parts)
    assert sum(parts) == pytest.approx(step.total_ms)
    assert (step.tp_comm_ms > 0) is (layout.tp > 1)
    assert (step.pp_bubble_ms > 0) is (layout.pp > 1)
    assert step.link == "nvlink3"


def test_tp_is_faster_than_one_gpu_but_not_tp_times(
        gpt2: tuple[estimates.DeviceStepEstimate, graph.ModelGraph]) -> None:
    e, g = gpt2
    split = parallel_inputs.split_from_estimate(e)
    dims = parallel_inputs.model_dims_from_graph(g, precision="bf16")
    one = layouts.step_time(ParallelLayout(1, 1, 1, 1), split, dims, _device(),
                                ScalingModel(), gpus_per_node=8)
    four = layouts.step_time(ParallelLayout(1, 4, 1, 1), split, dims, _device(),
                                 ScalingModel(), gpus_per_node=8)
    assert one.total_ms / 4 < four.total_ms < one.total_ms


def test_published_comparison_configs_are_valid_layouts() -> None:
    from gpuplan_estimator.evaluation import parallel_check

    assert len(parallel_check.PUBLISHED) == 11
    for p in parallel_check.PUBLISHED:
        assert layouts.layout_problems(
            p.layout, gpu_count=4, gpus_per_node=parallel_check.GPUS_PER_NODE,
            global_batch=p.global_batch) == ()
        assert devices.load_catalog().resolve(p.device).key == p.device


def test_host_waits_keep_the_regions_whole_and_are_not_split_by_tp(
        gpt2: tuple[estimates.DeviceStepEstimate, graph.ModelGraph]) -> None:
    """A step priced on two clocks holds the GPU's waits for the host beyond its kernels: they
    join the regions as replicated time (every TP rank's host issues all ops)."""
    from gpuplan_estimator.step import host

    _, g = gpt2
    probe = host.HostProbe(eager_op_us=50.0, module_call_us=60.0, autocast_linear_us=80.0,
                           linear_us=60.0, backward_node_us=50.0,
                           optimizer_foreach_us_per_tensor=20.0,
                           optimizer_for_loop_us_per_tensor=100.0,
                           optimizer_fused_us_per_tensor=6.0, launch_latency_us=10.0)
    coefficients = host.HostCoefficients(forward_kernel=2.0, forward_view=1.0, autocast_cast=1.0,
                                         backward_kernel=2.0, autocast_backward=1.0,
                                         optimizer_tensor=1.0)
    (e,) = estimates.estimate(g, [_device()], TrainingSettings(batch_size=4, precision="bf16"),
                              predictor=RooflinePredictor(),
                              host_model=host.HostModel(probe, coefficients))
    kernels = sum(layer.total_ms for layer in e.layers)
    assert e.forward_ms + e.backward_ms > kernels  # the GPU waited for the host
    split = parallel_inputs.split_from_estimate(e)
    assert split.problems() == ()
    assert split.pre.total_ms + split.blocks.total_ms + split.post.total_ms == pytest.approx(
        e.forward_ms + e.backward_ms)
    kernels_only = parallel_inputs.split_from_estimate(gpt2[0])  # the same step, one clock
    assert split.blocks.tp_split_ms == pytest.approx(kernels_only.blocks.tp_split_ms)
    assert split.blocks.replicated_ms > kernels_only.blocks.replicated_ms
