"""Issue #34: expert parallelism, the pure parts: experts read from the graph, the all-to-all's
price, experts' memory per rank and their gradient collectives."""

from __future__ import annotations

import dataclasses

import pytest

from gpuplan_estimator import devices, graph
from gpuplan_estimator.core.errors import InvalidRequestError
from gpuplan_estimator.core.layers import ModelGraph
from gpuplan_estimator.graph import exporting, hf_blocks
from gpuplan_estimator.parallel import experts, layouts, setups, sharding, strategy_time
from gpuplan_estimator.parallel.layouts import ModelDims, ParallelLayout, RegionTime, SingleGpuSplit
from gpuplan_estimator.parallel.scaling import ScalingModel
from gpuplan_estimator.parallel.strategies import NO_STRATEGY, MemoryStrategy
from gpuplan_estimator.planning import model_facts
from gpuplan_estimator.step.decomposition import TrainingSettings
from gpuplan_testing.moe_configs import MIXTRAL_TINY

SEQUENCE = 128
SETTINGS = TrainingSettings(batch_size=16, precision="fp16")


def build(config: dict[str, object], batch: int = 16) -> ModelGraph:
    onnx_bytes = exporting.hf_config_graph(config, batch=batch, sequence=SEQUENCE, label="cfg")
    return graph.load_at_batch(onnx_bytes, batch, {"sequence": SEQUENCE})


@pytest.fixture(scope="module")
def moe_graph() -> ModelGraph:
    return build(MIXTRAL_TINY)


def test_the_experts_are_read_from_the_graph_as_the_config_gives_them(moe_graph: ModelGraph
                                                                      ) -> None:
    dims = experts.expert_dims(moe_graph)
    assert dims is not None
    h, f, e = 256, 512, 8
    assert (dims.experts, dims.moe_layers, dims.hidden) == (e, 4, h)
    assert dims.expert_parameter_count == 4 * 3 * e * h * f
    assert dims.parameter_count == hf_blocks.parameter_count(
        hf_blocks.decoder_shape(MIXTRAL_TINY))
    assert dims.routed_per_token == 2.0  # top-2, dropless (capacity factor 1)
    assert dims.tokens_per_sample == SEQUENCE
    # top-2 x 128 tokens x 256 wide x 2 bytes per sample
    assert dims.dispatch_bytes(4, 2) == 4 * SEQUENCE * 2 * h * 2


def test_a_dense_model_has_no_experts() -> None:
    llama = {**MIXTRAL_TINY, "model_type": "llama"}
    assert experts.expert_dims(build(llama)) is None


def test_the_all_to_all_is_free_alone_and_slower_across_nodes() -> None:
    scaling = ScalingModel()

    def alltoall(message_bytes: int, ep: int, per_node: int) -> float:
        return experts.alltoall_ms(message_bytes, ep=ep, members_per_node=per_node,
                                   intra_node_gbps=300.0, scaling=scaling)

    assert alltoall(1 << 20, 1, 8) == 0.0
    inside, across = alltoall(1 << 26, 4, 4), alltoall(1 << 26, 8, 4)
    # (ep-1)/ep of the buffer leaves the rank, at the node's link or the network's.
    sent = (1 << 26) * 3 / 4 / (scaling.bandwidth_efficiency * 300e9) * 1e3
    assert inside == pytest.approx(sent + 3 * scaling.hop_latency_us * 1e-3)
    assert across > 3 * inside


def test_expert_degrees_divide_the_experts_and_dp() -> None:
    assert experts.expert_degrees(8, 8) == (2, 4, 8)
    assert experts.expert_degrees(8, 12) == (2, 4)
    assert experts.expert_degrees(6, 4) == (2,)


def memory(g: ModelGraph, strategy: MemoryStrategy, ep: int) -> sharding.ShardedMemory:
    facts = model_facts.model_facts(g, SETTINGS)
    return facts.memory(2, strategy, ParallelLayout(8, 1, 1, 1, ep=ep), 8)


@pytest.mark.parametrize("strategy", [NO_STRATEGY, MemoryStrategy(zero_stage=1)])
def test_expert_states_per_rank_fall_as_one_over_ep(moe_graph: ModelGraph,
                                                    strategy: MemoryStrategy) -> None:
    one = memory(moe_graph, strategy, 1)
    fraction = experts.expert_dims(moe_graph).expert_fraction  # type: ignore[union-attr]
    assert fraction > 0.8  # Mixtral-shaped: the experts are most of the model
    for ep in (2, 4, 8):
        m = memory(moe_graph, strategy, ep)
        # Unsharded expert states (all of them; under ZeRO-1 the weights and gradients) are
        # 1/ep; ZeRO-1's optimizer shards are 1/dp with or without EP.
        share = 1 - fraction + fraction / ep
        if strategy == NO_STRATEGY:
            assert m.expert_states_bytes == pytest.approx(one.expert_states_bytes / ep, rel=1e-6)
            assert m.optimizer_state_bytes == pytest.approx(one.optimizer_state_bytes * share,
                                                            rel=1e-6)
            assert m.parameters_bytes == pytest.approx(one.parameters_bytes * share, rel=1e-6)
        else:
            assert m.optimizer_state_bytes == pytest.approx(one.optimizer_state_bytes, rel=1e-6)
            assert m.gradients_bytes == pytest.approx(one.gradients_bytes * share, rel=1e-6)
            assert m.parameters_bytes < one.parameters_bytes
        assert m.dispatch_buffers_bytes == experts.DISPATCH_BUFFERS * 2 * SEQUENCE * 2 * 256 * 2
        assert m.activations_bytes == one.activations_bytes
    assert one.dispatch_buffers_bytes == 0


def test_zero_sharded_expert_states_stay_one_over_dp(moe_graph: ModelGraph) -> None:
    zero2 = MemoryStrategy(zero_stage=2)
    one, eight = memory(moe_graph, zero2, 1), memory(moe_graph, zero2, 8)
    assert eight.gradients_bytes == pytest.approx(one.gradients_bytes, rel=1e-6)
    assert eight.optimizer_state_bytes == pytest.approx(one.optimizer_state_bytes, rel=1e-6)
    assert eight.parameters_bytes < one.parameters_bytes  # the fp16 weights are unsharded


def test_ep_one_is_priced_as_if_the_model_were_dense(moe_graph: ModelGraph) -> None:
    """The EP paths leave ep=1 alone: the MoE model at ep=1 prices exactly as the same graph
    whose experts the planner does not know about."""
    facts = model_facts.model_facts(moe_graph, SETTINGS)
    dense = dataclasses.replace(facts, experts=None,
                                memory=model_facts.memory_fn(moe_graph, SETTINGS, None))
    def priced(strategy: MemoryStrategy, f: setups.ModelFacts) -> setups.Setup:
        return setups.priced(ParallelLayout(8, 1, 1, 1), strategy, 2, 8, device=_device(),
                             facts=f, step_at=lambda _m: (3.0, 6.0, 1.0), split=None,
                             scaling=ScalingModel(), comm_factor=1.0)

    for strategy in (NO_STRATEGY, MemoryStrategy(zero_stage=1), MemoryStrategy(fsdp="full")):
        a, b = priced(strategy, facts), priced(strategy, dense)
        assert (a.step_ms, a.parts_ms, a.exposed_comm_ms) == (b.step_ms, b.parts_ms,
                                                               b.exposed_comm_ms)
        assert dataclasses.replace(a.memory, expert_states_bytes=0) == b.memory
        assert a.memory.expert_states_bytes > 0


def _device() -> devices.DeviceSpec:
    return devices.load_catalog().resolve("h100-sxm")


def test_expert_gradients_reduce_over_the_ranks_holding_the_same_experts() -> None:
    split = strategy_time.StepSplit(1.0, 2.0, 1.0)
    plain = strategy_time.time_overheads(split, NO_STRATEGY, settings=SETTINGS,
                                         parameter_count=1000, data_parallel=8, gpus_per_node=8)
    ep4 = strategy_time.time_overheads(split, NO_STRATEGY, settings=SETTINGS,
                                       parameter_count=1000, data_parallel=8, gpus_per_node=8,
                                       expert_parallel=4, expert_fraction=0.8)
    [whole] = plain.collectives
    dense, expert = ep4.collectives
    assert (dense.group_size, dense.payload_bytes) == (8, 400)  # 20 % of 1000 x 2 bytes
    assert (expert.group_size, expert.payload_bytes, expert.stride) == (2, 400, 4)
    assert whole.payload_bytes == 2000
    # Unsharded, a rank updates its dense parameters and 1/4 of the experts.
    assert ep4.optimizer_ms == pytest.approx(plain.optimizer_ms * (0.2 + 0.8 / 4))


def test_ep_beside_tp_and_pp_adds_each_stages_all_to_alls_and_shrinks_the_dp_reduce() -> None:
    """`layouts.step_time` with tp=2 and pp=2 (a graph whose widths the planner reads): the
    all-to-alls join each stage's micro-batch time; the experts' gradients leave the dp ring."""
    dims = ModelDims(hidden=1024, sequence=2048, blocks=8, element_bytes=2, heads=16)
    moe = experts.ExpertDims(experts=8, moe_layers=8, expert_parameter_count=800,
                             parameter_count=1000, routed_per_token=2.0, hidden=1024,
                             tokens_per_sample=2048)
    split = SingleGpuSplit(batch=2, forward_ms=40.0, backward_ms=80.0, optimizer_ms=8.0,
                           gradient_bytes=10**9, pre=RegionTime(0.0, 0.0),
                           blocks=RegionTime(90.0, 30.0), post=RegionTime(0.0, 0.0))
    scaling, device = ScalingModel(), _device()

    def step(ep: int) -> layouts.ParallelStep:
        return layouts.step_time(ParallelLayout(8, 2, 2, 4, ep=ep), split, dims, device,
                                 scaling, gpus_per_node=8, experts=moe)

    one, four = step(1), step(4)
    assert one.ep_alltoall_ms == 0.0
    # EP groups of 4 at stride tp=2 span 8 GPUs: one node. Each stage has 4 MoE layers.
    single = experts.alltoall_ms(2 * 2048 * 2 * 1024 * 2, ep=4, members_per_node=4,
                                 intra_node_gbps=device.interconnect_gbps, scaling=scaling)
    assert four.ep_alltoall_ms == pytest.approx(4 * 4 * experts.ALLTOALLS_PER_MOE_LAYER * single)
    assert four.compute_ms == one.compute_ms
    assert four.dp_allreduce_full_ms < one.dp_allreduce_full_ms
    assert four.total_ms == pytest.approx(
        four.compute_ms + four.tp_comm_ms + four.pp_bubble_ms + four.pp_p2p_ms
        + four.ep_alltoall_ms + four.dp_allreduce_ms + four.optimizer_ms)
    with pytest.raises(InvalidRequestError, match=r"layout\.ep: 4 needs a mixture-of-experts"):
        layouts.step_time(ParallelLayout(8, 2, 2, 4, ep=4), split, dims, device, scaling,
                          gpus_per_node=8)
