"""Memory under strategies: ZeRO/FSDP sharding, TP/PP division, checkpointing, accumulation."""

from __future__ import annotations

from typing import Any

import pytest

from gpuplan_estimator.core.errors import InvalidRequestError
from gpuplan_estimator.core.layers import Layer, ModelGraph
from gpuplan_estimator.parallel import block_activations, sharding
from gpuplan_estimator.parallel.block_activations import ActivationLayout, BlockActivations
from gpuplan_estimator.parallel.strategies import MemoryStrategy
from gpuplan_estimator.step import memory
from gpuplan_estimator.step.decomposition import TrainingSettings
from gpuplan_testing.layer_builders import layer, t

OUTSIDE = "outside"
B, H, F, BLOCKS, IN = 8, 16, 64, 3, 10


def block_of(name: str) -> str:
    return ".".join(name.split(".")[:2]) if name.startswith("h.") else OUTSIDE


def toy_transformer(batch: int = B) -> ModelGraph:
    """embed -> 3 x (LayerNorm, Gemm, Relu, Gemm, residual Add) -> head."""
    layers: list[Layer] = [layer("embed", "Gemm", [t("inp", batch, IN), t("we", IN, H)],
                                 [t("x0", batch, H)], params=["we"])]
    for i in range(BLOCKS):
        p, x = f"h.{i}", f"x{i}"
        layers += [
            layer(f"{p}.ln", "LayerNormalization", [t(x, batch, H), t(f"{p}.g", H),
                                                    t(f"{p}.b", H)],
                  [t(f"{p}.n", batch, H)], params=[f"{p}.g", f"{p}.b"]),
            layer(f"{p}.fc1", "Gemm", [t(f"{p}.n", batch, H), t(f"{p}.w1", H, F)],
                  [t(f"{p}.h", batch, F)], params=[f"{p}.w1"]),
            layer(f"{p}.relu", "Relu", [t(f"{p}.h", batch, F)], [t(f"{p}.r", batch, F)]),
            layer(f"{p}.fc2", "Gemm", [t(f"{p}.r", batch, F), t(f"{p}.w2", F, H)],
                  [t(f"{p}.y", batch, H)], params=[f"{p}.w2"]),
            layer(f"{p}.add", "Add", [t(x, batch, H), t(f"{p}.y", batch, H)],
                  [t(f"x{i + 1}", batch, H)]),
        ]
    layers.append(layer("head", "Gemm", [t(f"x{BLOCKS}", batch, H), t("wh", H, 5)],
                        [t("logits", batch, 5)], params=["wh"]))
    return ModelGraph("toy", tuple(layers), (), {"batch": batch}, 17)


P = IN * H + BLOCKS * (2 * H + 2 * H * F) + H * 5
BLOCK_PARAMS = 2 * H + 2 * H * F
FP32 = 4
# Per block (fp32): LN keeps x_i, fc1 keeps the normalized n_i, Relu/fc2 keep r_i.
BLOCK_SAVED = FP32 * B * (H + H + F)
BLOCK_REPLICATED = FP32 * B * (H + H)  # LN input and output (Korthikanti et al. Table 2)
BLOCK_INPUT = FP32 * B * H
OUTSIDE_SAVED = FP32 * B * (IN + H)  # embed keeps inp, head keeps x_3


def settings(**kw: Any) -> TrainingSettings:
    return TrainingSettings(**({"batch_size": B, "optimizer": "adam"} | kw))


def layout(batch: int = B, **kw: Any) -> ActivationLayout:
    return block_activations.activation_layout(toy_transformer(batch), settings(batch_size=batch,
                                                                                **kw),
                                               block_of=block_of, outside_label=OUTSIDE)


def under(strategy: MemoryStrategy, *, s: TrainingSettings | None = None,
          **kw: Any) -> sharding.ShardedMemory:
    s = s or settings()
    breakdown = memory.training_memory(toy_transformer(), s)
    args: dict[str, Any] = {"data_parallel": 1, "gpus_per_node": 8,
                            "layout": block_activations.activation_layout(
                                toy_transformer(), s, block_of=block_of,
                                outside_label=OUTSIDE)} | kw
    return sharding.memory_under(breakdown, strategy, settings=s, **args)


def model_states(m: sharding.ShardedMemory) -> int:
    return m.parameters_bytes + m.gradients_bytes + m.optimizer_state_bytes


def test_layout_splits_the_saved_activations_by_block() -> None:
    lay = layout()
    assert [b.name for b in lay.blocks] == ["h.0", "h.1", "h.2"]
    assert {(b.input_bytes, b.saved_bytes, b.replicated_bytes, b.parameter_count)
            for b in lay.blocks} == {(BLOCK_INPUT, BLOCK_SAVED, BLOCK_REPLICATED, BLOCK_PARAMS)}
    assert lay.outside_saved_bytes == OUTSIDE_SAVED
    assert lay.saved_bytes == memory.saved_activation_bytes(toy_transformer(), 4)
    assert lay.gather_unit_parameter_count == BLOCK_PARAMS
    assert lay.at_batch(2 * B).blocks[0].saved_bytes == 2 * BLOCK_SAVED


def test_no_strategy_keeps_the_breakdown() -> None:
    m = under(MemoryStrategy())
    base = memory.training_memory(toy_transformer(), settings())
    assert (m.parameters_bytes, m.gradients_bytes, m.optimizer_state_bytes,
            m.activations_bytes, m.workspace_bytes) == (
        base.parameters_bytes, base.gradients_bytes, base.optimizer_state_bytes,
        base.activations_bytes, base.workspace_bytes)
    assert m.total_bytes == base.total_bytes
    assert m.host_bytes == m.gathered_parameters_bytes == m.recompute_bytes == 0


@pytest.mark.parametrize("nd", [2, 4, 8, 64])
@pytest.mark.parametrize(("stage", "bytes_per_param"), [
    # Rajbhandari et al. SC'20 Figure 1, mixed-precision Adam (K = 12), psi = P (stage 0,
    # plain data parallelism, is the walked peak: test_no_strategy_keeps_the_breakdown):
    (1, lambda nd: (2 + 2) * P + 12 * P / nd),  # P_os: 4 psi + 12 psi / Nd
    (2, lambda nd: 2 * P + 14 * P / nd),        # P_os+g: 2 psi + 14 psi / Nd
    (3, lambda nd: 16 * P / nd),                # P_os+g+p: 16 psi / Nd
])
def test_zero_stages_match_the_zero_paper(stage: int, bytes_per_param: Any, nd: int) -> None:
    m = under(MemoryStrategy(zero_stage=stage), s=settings(precision="bf16"), data_parallel=nd,
              gpus_per_node=nd)
    assert model_states(m) == pytest.approx(bytes_per_param(nd), abs=3)  # ceil per part


def test_fp32_zero1_shards_only_the_state_the_weights_are_the_master() -> None:
    m = under(MemoryStrategy(zero_stage=1), data_parallel=4)
    assert (m.parameters_bytes, m.gradients_bytes) == (4 * P, 4 * P)
    assert m.optimizer_state_bytes == pytest.approx(8 * P / 4, abs=1)


def test_fsdp_full_is_zero3_and_hybrid_shards_within_a_node() -> None:
    full = under(MemoryStrategy(fsdp="full"), data_parallel=16, gpus_per_node=8)
    zero3 = under(MemoryStrategy(zero_stage=3), data_parallel=16, gpus_per_node=8)
    hybrid = under(MemoryStrategy(fsdp="hybrid"), data_parallel=16, gpus_per_node=8)
    assert full == sharding.ShardedMemory(**(vars(zero3) | {"strategy": full.strategy}))
    assert model_states(hybrid) == pytest.approx(16 * P / 8, abs=3)
    # Two blocks gathered at compute width (FSDP limit_all_gathers).
    assert full.gathered_parameters_bytes == 2 * FP32 * BLOCK_PARAMS


def test_offload_moves_state_and_master_weights_to_the_host() -> None:
    s = settings(precision="bf16")
    m = under(MemoryStrategy(zero_stage=2, offload_optimizer=True), s=s, data_parallel=2)
    assert m.optimizer_state_bytes == 0
    assert m.parameters_bytes == 2 * P  # the bf16 working copy stays
    assert m.host_bytes == pytest.approx((8 + 4) * P / 2, abs=2)
    assert m.total_bytes < under(MemoryStrategy(zero_stage=2), s=s, data_parallel=2).total_bytes


@pytest.mark.parametrize(("tp", "pp"), [(2, 1), (4, 1), (1, 2), (2, 4)])
def test_tensor_and_pipeline_parallel_divide_model_states(tp: int, pp: int) -> None:
    m = under(MemoryStrategy(), tensor_parallel=tp, pipeline_parallel=pp)
    assert model_states(m) == pytest.approx(16 * P / (tp * pp), abs=3)


def test_tensor_parallel_splits_only_the_sharded_activations() -> None:
    tp = 4
    m = under(MemoryStrategy(), tensor_parallel=tp)
    sharded = BLOCK_SAVED - BLOCK_REPLICATED
    assert m.activations_bytes == OUTSIDE_SAVED + BLOCKS * (BLOCK_REPLICATED + sharded // tp)
    sp = under(MemoryStrategy(), tensor_parallel=tp, sequence_parallel=True)
    assert sp.activations_bytes == OUTSIDE_SAVED + BLOCKS * BLOCK_SAVED // tp


def test_pipeline_first_stage_holds_in_flight_micro_batches() -> None:
    one = under(MemoryStrategy(), pipeline_parallel=4).activations_bytes
    four = under(MemoryStrategy(), pipeline_parallel=4, in_flight_micro_batches=4)
    whole = OUTSIDE_SAVED + BLOCKS * BLOCK_SAVED
    assert one == pytest.approx(whole / 4, abs=1)
    assert four.activations_bytes == whole  # pp micro-batches of 1/pp of the model


def test_full_checkpointing_keeps_block_inputs_and_recomputes_one_block() -> None:
    m = under(MemoryStrategy(checkpointing="full"))
    assert m.recompute_bytes == BLOCK_SAVED
    assert m.activations_bytes == OUTSIDE_SAVED + BLOCKS * BLOCK_INPUT + BLOCK_SAVED
    assert m.activations_bytes < memory.saved_activation_bytes(toy_transformer(), 4)


def test_per_block_checkpointing_sits_between_none_and_full() -> None:
    third = under(MemoryStrategy(checkpointing="per-block", checkpoint_fraction=0.34))
    # ceil(0.34 * 3) = 2 blocks checkpointed, one kept whole.
    assert third.activations_bytes == (OUTSIDE_SAVED + 2 * BLOCK_INPUT + BLOCK_SAVED
                                       + BLOCK_SAVED)
    full = under(MemoryStrategy(checkpointing="full"))
    assert full.activations_bytes < third.activations_bytes <= memory.saved_activation_bytes(
        toy_transformer(), 4)


@pytest.mark.parametrize("steps", [2, 4, 8])
def test_accumulation_divides_activations_by_the_steps(steps: int) -> None:
    base = sharding.strategy_memory(toy_transformer(), settings(), MemoryStrategy(),
                                    data_parallel=1, gpus_per_node=8, block_of=block_of,
                                    outside_label=OUTSIDE)
    m = sharding.strategy_memory(toy_transformer(), settings(),
                                 MemoryStrategy(gradient_accumulation=steps), data_parallel=1,
                                 gpus_per_node=8, block_of=block_of, outside_label=OUTSIDE)
    assert m.micro_batch == B // steps
    # Accumulation is counted as ZeRO counts it: the kept tensors of one micro-batch, and the
    # whole model states (the gradients live across micro-steps).
    assert m.activations_bytes * steps == memory.saved_activation_bytes(toy_transformer(), 4)
    assert model_states(m) == 16 * P
    assert base.strategy == MemoryStrategy()


def test_accumulation_must_divide_the_per_gpu_batch() -> None:
    with pytest.raises(InvalidRequestError) as info:
        sharding.strategy_memory(toy_transformer(), settings(),
                                 MemoryStrategy(gradient_accumulation=3), data_parallel=1,
                                 gpus_per_node=8, block_of=block_of, outside_label=OUTSIDE)
    assert info.value.field == "gradient_accumulation"


@pytest.mark.parametrize(("kw", "field"), [
    ({"data_parallel": 0}, "data_parallel"),
    ({"tensor_parallel": 1.5}, "tensor_parallel"),
    ({"pipeline_parallel": 2, "in_flight_micro_batches": 3}, "in_flight_micro_batches"),
    ({"layout": None, "tensor_parallel": 2}, "layout"),
])
def test_bad_parallel_arguments_name_their_field(kw: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidRequestError) as info:
        under(MemoryStrategy(), **kw)
    assert info.value.field == field


def test_checkpointing_without_a_layout_is_refused() -> None:
    with pytest.raises(InvalidRequestError) as info:
        under(MemoryStrategy(checkpointing="full"), layout=None)
    assert info.value.field == "layout"


def test_layout_at_another_batch_is_refused() -> None:
    lay = ActivationLayout(per_gpu_batch=B + 1, blocks=(BlockActivations("h.0", 1, 2, 1, 3),),
                           outside_saved_bytes=0, largest_layer_parameter_count=3)
    with pytest.raises(InvalidRequestError) as info:
        under(MemoryStrategy(), layout=lay)
    assert info.value.field == "layout"


def test_more_sharding_never_raises_memory() -> None:
    totals = [under(MemoryStrategy(zero_stage=z), s=settings(precision="bf16"),
                    data_parallel=8).total_bytes - (2 * 2 * BLOCK_PARAMS if z == 3 else 0)
              for z in (0, 1, 2, 3)]
    assert totals == sorted(totals, reverse=True)
    assert totals[0] > totals[-1]
