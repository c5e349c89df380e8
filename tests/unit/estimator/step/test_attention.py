"""Fused attention (SDPA/FlashAttention) against the same graph's eager attention core."""

from __future__ import annotations

import dataclasses
from collections import Counter

import pytest

from gpuplan_estimator import devices, graph
from gpuplan_estimator.core import options, workload
from gpuplan_estimator.core.errors import InvalidRequestError
from gpuplan_estimator.core.layers import ModelGraph
from gpuplan_estimator.core.workload import Phase
from gpuplan_estimator.cost import roofline
from gpuplan_estimator.graph import zoo
from gpuplan_estimator.step import attention, memory, training_ops
from gpuplan_estimator.step.decomposition import StepWork, TrainingSettings, build_step

LAYERS, HEADS, HIDDEN, SEQUENCE, BATCH = 2, 4, 64, 128, 2
GPT2 = {"model_type": "gpt2", "n_embd": HIDDEN, "n_head": HEADS, "n_layer": LAYERS,
        "vocab_size": 1000, "n_positions": SEQUENCE}
FUSED, EAGER = options.FUSED_ATTENTION, options.EAGER_ATTENTION


@pytest.fixture(scope="module")
def gpt2() -> ModelGraph:
    data = zoo.build_transformer(GPT2, name="gpt2").SerializeToString()
    return graph.load_model(data, batch=BATCH, dim_bindings={"sequence": SEQUENCE})


def _settings(attention_impl: str, mode: str = "train", **kw: str) -> TrainingSettings:
    return TrainingSettings(batch_size=BATCH, mode=mode, attention=attention_impl, **kw)


def test_each_attention_core_folds_its_softmax_mask_and_scale(gpt2: ModelGraph) -> None:
    fused = attention.fused_attention(gpt2, FUSED)
    ops = Counter(layer.op_type for layer in gpt2.layers if layer.name in fused.folded)
    assert ops == {"Div": LAYERS, "Where": LAYERS, "Softmax": LAYERS}
    assert len(fused.recomputed) == len(fused.kept) == LAYERS
    # The scores, scaled and masked scores and probabilities never reach memory.
    assert len(fused.internal) == 4 * LAYERS
    assert attention.fused_attention(gpt2, EAGER) == attention.EAGER
    with pytest.raises(ValueError):
        attention.fused_attention(gpt2, "flash")


def test_fused_backward_runs_five_gemms_per_core_and_no_softmax(gpt2: ModelGraph) -> None:
    eager, fused = (build_step(gpt2, _settings(a)) for a in (EAGER, FUSED))
    fused_names = attention.fused_attention(gpt2, FUSED).folded
    assert set(fused.fused) == fused_names
    assert all(i.kernel == "none" for i in fused.forward if i.layer in fused_names)
    assert not any(i.layer in fused_names for i in fused.backward)
    recomputes = [i for i in fused.backward if i.role == "recompute"]
    assert len(recomputes) == LAYERS
    forward_of = {i.layer: i for i in fused.forward}
    for item in recomputes:  # Q·Kᵀ again, the same GEMM as in forward
        assert item.phase is Phase.BACKWARD
        assert (item.kernel, dict(item.dims), item.flops) == (
            forward_of[item.layer].kernel, dict(forward_of[item.layer].dims),
            forward_of[item.layer].flops)
    scores_and_context = {i.layer for i in fused.backward if i.role == "recompute"} | {
        name for name, out in attention.fused_attention(gpt2, FUSED).kept.items()}
    gemms = [i for i in fused.backward if i.layer in scores_and_context and i.kernel == "gemm"]
    assert len(gemms) == 5 * LAYERS
    # Every GEMM of the eager step is still there, plus the recomputed scores.
    eager_gemm_flops = sum(i.flops for i in eager.items if i.kernel == "gemm")
    fused_gemm_flops = sum(i.flops for i in fused.items if i.kernel == "gemm")
    assert fused_gemm_flops == eager_gemm_flops + sum(i.flops for i in recomputes)
    def attention_softmaxes(step: StepWork) -> int:  # the loss's LogSoftmax left out
        return sum(i.kernel == "softmax" and i.op != training_ops.LOSS_OP for i in step.items)

    assert attention_softmaxes(fused) == 0
    assert attention_softmaxes(eager) == 2 * LAYERS  # forward, backward


def test_fused_training_keeps_output_and_logsumexp_instead_of_probabilities(
        gpt2: ModelGraph) -> None:
    eager, fused = (memory.training_memory(gpt2, _settings(a)).saved_activations_bytes
                    for a in (EAGER, FUSED))
    head_dim = HIDDEN // HEADS
    probabilities = LAYERS * BATCH * HEADS * SEQUENCE * SEQUENCE * 4
    kept = LAYERS * BATCH * HEADS * SEQUENCE * (head_dim + 1) * 4  # output and logsumexp
    # Both keep Q, Kᵀ, V, the causal mask and the scale's divisor; the fused kernel also the
    # masked-out value (one scalar shared by every layer), which eager's Where does not read.
    assert eager - fused == probabilities - kept - 4


def test_fused_inference_never_holds_the_scores() -> None:
    sequence = 512  # the scores outgrow the logits, so they set the eager peak
    data = zoo.build_transformer({**GPT2, "n_positions": sequence}, name="gpt2")
    long = graph.load_model(data.SerializeToString(), batch=BATCH,
                            dim_bindings={"sequence": sequence})
    eager, fused = (memory.training_memory(long, _settings(a, mode="inference"))
                    for a in (EAGER, FUSED))
    scores = BATCH * HEADS * sequence * sequence * 4
    # Eager's peak is at a softmax over the scores (its input and output live at once);
    # fused has neither.
    assert eager.activations_bytes >= 2 * scores
    assert eager.activations_bytes - fused.activations_bytes >= scores


def test_attention_is_validated_and_refused_where_no_fused_kernel_runs() -> None:
    with pytest.raises(InvalidRequestError) as bad:
        _settings("flash").check()
    assert bad.value.field == "attention"
    with pytest.raises(InvalidRequestError) as ort:
        _settings(FUSED, mode="inference", framework=options.ONNXRUNTIME).check()
    assert ort.value.field == "attention" and "onnxruntime" in ort.value.message
    _settings(FUSED, mode="inference", framework=options.PYTORCH_COMPILED).check()


def test_compiled_inference_with_fused_attention_runs_no_softmax(gpt2: ModelGraph) -> None:
    s = _settings(FUSED, mode="inference", framework=options.PYTORCH_COMPILED)
    step = build_step(gpt2, s)
    assert not any(i.kernel == "softmax" for i in step.forward)
    gemms = sum(i.kernel == "gemm" for i in step.forward)
    assert gemms == sum(i.kernel == "gemm" for i in build_step(
        gpt2, _settings(EAGER, mode="inference", framework=options.PYTORCH_COMPILED)).forward)


def test_fused_gemms_move_no_scores_and_are_priced_against_that_roofline(
        gpt2: ModelGraph) -> None:
    """Every GEMM of a fused core says what it moves without the [S, S] scores; the roofline
    prices exactly that, and a bundle model scales its unfused price by the same ratio."""
    step = build_step(gpt2, _settings(FUSED, precision="bf16"))
    fused = attention.fused_attention(gpt2, FUSED)
    core = {*fused.recomputed, *fused.kept}
    tagged = [i for i in step.items if workload.FUSED_IO_BYTES in i.attributes]
    assert {i.layer for i in tagged} == core
    assert len(tagged) == 7 * LAYERS  # 2 forward, 1 recomputed, 4 gradient GEMMs per core
    head_dim, width = HIDDEN // HEADS, 2
    for item in tagged:
        # Each moves two [S, head_dim] matrices per batch x head once the scores are gone.
        assert item.attributes[workload.FUSED_IO_BYTES] == (
            BATCH * HEADS * 2 * SEQUENCE * head_dim * width)
    h100 = devices.resolve_device("h100-sxm-80gb")
    priced = roofline.RooflinePredictor().predict(tagged, h100).median_ms
    flops_only = [roofline.roofline_ms(i.flops, float(i.attributes[workload.FUSED_IO_BYTES]),
                                       i.dtype, h100) for i in tagged]
    assert list(priced) == pytest.approx(flops_only)
    idx, factor = roofline.fused_io_factors(tagged, h100)
    assert list(idx) == list(range(len(tagged))) and all(0 < f < 1 for f in factor)


def test_a_float32_core_runs_fp32_math_whatever_tf32_asks_of_other_gemms(
        gpt2: ModelGraph) -> None:
    step = build_step(gpt2, _settings(FUSED, precision="tf32"))
    gemms = [i for i in step.items if i.kernel == "gemm"]
    core = [i for i in gemms if workload.FUSED_IO_BYTES in i.attributes]
    rest = [i for i in gemms if workload.FUSED_IO_BYTES not in i.attributes]
    assert core and rest
    assert all("math" not in i.attributes for i in core)
    assert all(i.attributes.get("math") == "tf32" for i in rest)


def test_eager_gemms_keep_their_own_bytes(gpt2: ModelGraph) -> None:
    step = build_step(gpt2, _settings(EAGER, precision="bf16"))
    assert not any(workload.FUSED_IO_BYTES in i.attributes for i in step.items)


def test_a_bundle_model_prices_a_fused_gemm_at_its_unfused_efficiency(
        gpt2: ModelGraph) -> None:
    from gpuplan_estimator.latency import bundles, learned

    # Without the aligned-GEMM utilisation, which would price the untagged copies itself.
    predictor = learned.LearnedPredictor(bundles.load_bundle(
        bundles.SHIPPED_BUNDLE, origin="shipped")).with_aligned_gemm(None)
    step = build_step(gpt2, _settings(FUSED, precision="bf16"))
    tagged = [i for i in step.items if workload.FUSED_IO_BYTES in i.attributes]
    untagged = [dataclasses.replace(i, attributes={
        k: v for k, v in i.attributes.items() if k != workload.FUSED_IO_BYTES}) for i in tagged]
    a100 = devices.resolve_device("a100-sxm4-80gb")
    fused = predictor.predict(tagged, a100)
    unfused = predictor.predict(untagged, a100)
    assert all(label.startswith("lightgbm:gemm") for label in fused.predictor)
    _, factor = roofline.fused_io_factors(tagged, a100)
    for name in ("median_ms", "p10_ms", "p90_ms"):
        assert list(getattr(fused, name)) == pytest.approx(list(getattr(unfused, name) * factor))


def test_the_report_says_how_many_cores_were_fused_and_warns_when_none_could_be(
        gpt2: ModelGraph) -> None:
    fused = attention.attention_report(gpt2, FUSED)
    assert (fused.requested, fused.cores, fused.fused_cores, fused.warning) == (
        FUSED, LAYERS, LAYERS, None)
    eager = attention.attention_report(gpt2, EAGER)
    assert (eager.cores, eager.fused_cores, eager.warning) == (LAYERS, 0, None)
    assert eager.as_dict() == {"requested": EAGER, "cores": LAYERS, "fused_cores": 0,
                               "unfused_scores": 0, "warning": None}
    bare = dataclasses.replace(gpt2, units=())  # a graph with no attention core at all
    none_found = attention.attention_report(bare, FUSED)
    assert (none_found.cores, none_found.fused_cores) == (0, 0)
    assert none_found.warning is not None and "no attention core" in none_found.warning
    assert attention.attention_report(bare, EAGER).warning is None
    with pytest.raises(ValueError):
        attention.attention_report(gpt2, "flash")


def test_softmaxes_without_a_product_with_v_are_reported_as_priced_eager(
        gpt2: ModelGraph) -> None:
    """One core whose probabilities escape (output_attentions) is only a scores unit: fused
    attention warns that it stays eager beside the cores it did fuse."""
    first, *rest = [u for u in gpt2.units if u.pattern == attention.ATTENTION_PATTERN]
    scores_only = dataclasses.replace(first, pattern=attention.SCORES_PATTERN)
    mixed = dataclasses.replace(gpt2, units=(scores_only, *rest))
    report = attention.attention_report(mixed, FUSED)
    assert (report.cores, report.fused_cores, report.unfused_scores) == (
        LAYERS - 1, LAYERS - 1, 1)
    assert report.warning is not None and "priced eager" in report.warning
    assert attention.attention_report(mixed, EAGER).warning is None
