"""Predicted vs measured memory of small training steps on CPU, per component (issue #19).

Each case trains a small PyTorch model for one step under `torch.profiler.profile(
profile_memory=True, record_shapes=True, with_stack=True)` and reads PyTorch's memory profiler
(`torch.profiler._memory_profiler.MemoryProfile`, private API of torch 2.x), which labels every
allocation PARAMETER, GRADIENT, OPTIMIZER_STATE, INPUT, ACTIVATION, TEMPORARY or AUTOGRAD_DETAIL.
The prediction is `parallel.sharding.strategy_memory` for the same model: GPT-2 graphs come from
`graph.zoo` (the HF config, no torch), other modules through `graph.exporting.export_module`.

Measured, per component:
- parameters, gradients, optimizer state: the peak bytes of that category during the step;
- activations: INPUT + ACTIVATION bytes alive when backward starts (what forward kept),
  compared with the predicted activations less the recompute buffer (checkpointing rebuilds
  one block during backward, which the profiler labels AUTOGRAD_DETAIL with the gradients of
  activations, so it is not separable);
- step peak: all categories together, compared with the predicted parameters + gradients +
  optimizer state + activations + workspace less the CUDA-only constants (context, cuBLAS).

A warm-up step runs first, so optimizer state exists and the profiled step is a steady one.
GPT-2 runs with dropout 0 and eager attention, as `graph.zoo` writes it, and once with
Hugging Face's "sdpa" attention (`torch.nn.functional.scaled_dot_product_attention`), priced
with `attention="fused"`; the loss is the mean of the logits, whose backward keeps nothing (a
cross-entropy would keep the log-softmax of the logits, which the graph does not contain).

Run: ``gpuplan eval memory-check`` (a Markdown table on stdout).
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from gpuplan_estimator.core import extras, options
from gpuplan_estimator.core.layers import ModelGraph
from gpuplan_estimator.core.vocabulary import SEQUENCE_DIM
from gpuplan_estimator.graph import exporting, loading, zoo
from gpuplan_estimator.parallel import sharding
from gpuplan_estimator.parallel.strategies import MemoryStrategy
from gpuplan_estimator.planning import rollup
from gpuplan_estimator.step import attention, memory, memory_walk
from gpuplan_estimator.step.decomposition import TrainingSettings

COMPONENTS = ("parameters", "gradients", "optimizer_state", "activations", "step_peak")
BACKWARD_MARK = "gpuplan.memory_check.backward"
TINY_POSITIONS = 64
TINY_GPT2 = {"model_type": "gpt2", "n_embd": 64, "n_head": 4, "n_layer": 2,
             "vocab_size": 1000, "n_positions": TINY_POSITIONS, "activation_function": "gelu_new",
             "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0}


@dataclass(frozen=True)
class MemoryCase:
    """One model x setting to measure and predict."""

    name: str
    setting: str
    batch: int
    optimizer: str  # one of options.OPTIMIZERS
    checkpointing: bool
    attention: str  # one of options.ATTENTIONS: how the prediction prices the attention core
    build: Callable[[Any, bool], tuple[Any, tuple[Any, ...]]]
    """(torch, checkpointing) -> (module in train mode, example inputs)."""
    graph: Callable[[int], ModelGraph]
    """batch -> the same model's graph for the estimator."""


@dataclass(frozen=True)
class MemoryRow:
    """One component of one case: predicted and measured bytes."""

    model: str
    setting: str
    component: str
    predicted_bytes: int
    measured_bytes: int

    @property
    def error_pct(self) -> float:
        """(predicted - measured) / measured in percent (0 when both are 0)."""
        if self.measured_bytes == 0:
            return 0.0 if self.predicted_bytes == 0 else float("inf")
        return 100.0 * (self.predicted_bytes - self.measured_bytes) / self.measured_bytes


HF_ATTENTION = {options.EAGER_ATTENTION: "eager", options.FUSED_ATTENTION: "sdpa"}
"""Hugging Face's `attn_implementation` that runs each of `options.ATTENTIONS`."""


def gpt2_case(*, checkpointing: bool, batch: int = 4, sequence: int = 32,
              attention: str = options.EAGER_ATTENTION) -> MemoryCase:
    """A two-block GPT-2 (d=64) at [batch, sequence] tokens, AdamW."""

    config_dict = {**TINY_GPT2, "n_positions": max(TINY_POSITIONS, sequence)}

    def build(torch: Any, checkpoint: bool) -> tuple[Any, tuple[Any, ...]]:
        transformers = extras.require("transformers", "torch", needed_by="memory_check")
        config = transformers.GPT2Config(
            **{k: v for k, v in config_dict.items() if k != "model_type"},
            bos_token_id=0, eos_token_id=0, attn_implementation=HF_ATTENTION[attention])
        model = transformers.GPT2LMHeadModel(config)
        if checkpoint:
            model.activation_checkpointing_enable(  # torch.utils.checkpoint per GPT2Block
                activation_checkpointing_kwargs={"use_reentrant": False})
        ids = torch.randint(0, TINY_GPT2["vocab_size"], (batch, sequence))
        return model.train(), (ids,)

    def graph(b: int) -> ModelGraph:
        data = zoo.build_transformer(config_dict, name="tiny-gpt2").SerializeToString()
        return loading.load_model(data, batch=b, dim_bindings={SEQUENCE_DIM: sequence})

    setting = ("fp32, adamw" + (", full checkpointing" if checkpointing else "")
               + f", {HF_ATTENTION[attention]} attention, sequence {sequence}")
    return MemoryCase("gpt2 2x64", setting, batch, "adamw", checkpointing, attention, build, graph)


def cnn_case(*, batch: int = 8) -> MemoryCase:
    """A three-conv CNN on 3x32x32 images, SGD with momentum."""

    def module(torch: Any) -> Any:
        nn = torch.nn
        return nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
            nn.Flatten(), nn.Linear(64, 10))

    def build(torch: Any, checkpoint: bool) -> tuple[Any, tuple[Any, ...]]:
        return module(torch).train(), (torch.randn(batch, 3, 32, 32),)

    def graph(b: int) -> ModelGraph:
        torch = extras.require("torch", "torch", needed_by="memory_check")
        with torch.device("meta"):
            m = module(torch).eval()
        data = exporting.export_module(m, (torch.zeros(b, 3, 32, 32, device="meta"),),
                                       label="cnn")
        return loading.load_model(data)

    return MemoryCase("cnn 3-conv", "fp32, sgd momentum", batch, "momentum", False,
                options.EAGER_ATTENTION, build, graph)


def default_cases() -> tuple[MemoryCase, ...]:
    """The cases `docs/memory.md` reports."""
    long = 256  # a sequence where the scores outweigh the rest
    return (gpt2_case(checkpointing=False), gpt2_case(checkpointing=True),
            gpt2_case(checkpointing=False, sequence=long),
            gpt2_case(checkpointing=False, sequence=long, attention=options.FUSED_ATTENTION),
            cnn_case())


def predict(case: MemoryCase) -> dict[str, int]:
    """Bytes per component the model predicts for `case` (CPU: no CUDA constants).

    Parameters, gradients and optimizer state are each category's peak (all of them); the
    activations are the tensors kept for backward; the step peak is `memory_walk`'s as the
    CPU runs it (requested bytes, no 512-byte blocks; the per-tensor optimizer path; the
    mean-of-logits loss), or, with checkpointing, the parts summed as `sharding` counts them.
    """
    settings = TrainingSettings(batch_size=case.batch, optimizer=case.optimizer,
                                precision="fp32", attention=case.attention)
    strategy = MemoryStrategy(checkpointing="full" if case.checkpointing else "none")
    g = case.graph(case.batch)
    m = sharding.strategy_memory(
        g, settings, strategy, data_parallel=1, gpus_per_node=1,
        block_of=rollup.block_of, outside_label=rollup.OUTSIDE_BLOCKS)
    states = {"parameters": 4 * g.parameter_count, "gradients": 4 * g.parameter_count,
              "optimizer_state": 4 * g.parameter_count
              * memory.OPTIMIZER_STATE_WORDS[case.optimizer]}
    if case.checkpointing:
        kept = m.activations_bytes - m.recompute_bytes
        return {**states, "activations": kept,
                "step_peak": sum(states.values()) + m.activations_bytes}
    walk_settings = dataclasses.replace(memory.walk_settings(settings, 1.0),
                                        allocation_round_bytes=1,
                                        optimizer_impl=options.FOR_LOOP_OPTIMIZER,
                                        cross_entropy_loss=False)
    walked = memory_walk.peak(g, walk_settings,
                              attention.fused_attention(g, settings.attention))
    return {**states,
            "activations": memory.saved_activation_bytes(
                g, settings.activation_bytes, attention.fused_attention(g, settings.attention)),
            "step_peak": walked.total_bytes}


def measure(case: MemoryCase, *, seed: int = 0) -> dict[str, int]:
    """Bytes per component PyTorch's memory profiler attributes in one CPU training step."""
    torch = extras.require("torch", "torch", needed_by="memory_check")
    from torch.profiler import _memory_profiler as mp  # private: read from torch 2.x source

    torch.manual_seed(seed)
    model, inputs = case.build(torch, case.checkpointing)
    params = list(model.parameters())
    optimizer = (torch.optim.AdamW(params, foreach=False) if case.optimizer == "adamw"
                 else torch.optim.SGD(params, lr=1e-3, momentum=0.9, foreach=False))

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        loss = _loss(torch, model(*inputs))
        with torch.profiler.record_function(BACKWARD_MARK):
            loss.backward()
        optimizer.step()

    step()  # warm-up: creates the optimizer state
    activities = [torch.profiler.ProfilerActivity.CPU]
    with torch.profiler.profile(activities=activities, profile_memory=True, record_shapes=True,
                                with_stack=True) as prof:
        step()
    profile = prof._memory_profile()
    backward_ns = min(e.start_time_ns for e in profile._op_tree.dfs() if e.name == BACKWARD_MARK)
    cat = mp.Category
    peaks: dict[Any, int] = {}
    live: dict[Any, int] = {}
    at_backward: dict[Any, int] | None = None
    for t_ns, action, (key, version), size in profile.timeline:
        if key.device.type != "cpu":
            continue
        if at_backward is None and t_ns >= backward_ns:
            at_backward = dict(live)
        category = (profile._categories.get(key, version)
                    if isinstance(key, mp.TensorKey) else None)
        if action in (mp.Action.PREEXISTING, mp.Action.CREATE):
            live[category] = live.get(category, 0) + size
        elif action == mp.Action.INCREMENT_VERSION:
            new = profile._categories.get(key, version + 1)
            live[category] = live.get(category, 0) - size
            live[new] = live.get(new, 0) + size
        elif action == mp.Action.DESTROY:
            live[category] = live.get(category, 0) - size
        for c, v in live.items():
            peaks[c] = max(peaks.get(c, 0), v)
        peaks["all"] = max(peaks.get("all", 0), sum(live.values()))
    kept = at_backward or {}
    return {
        "parameters": peaks.get(cat.PARAMETER, 0), "gradients": peaks.get(cat.GRADIENT, 0),
        "optimizer_state": peaks.get(cat.OPTIMIZER_STATE, 0),
        "activations": kept.get(cat.INPUT, 0) + kept.get(cat.ACTIVATION, 0),
        "step_peak": peaks.get("all", 0),
    }


def _loss(torch: Any, output: Any) -> Any:
    logits = output.logits if hasattr(output, "logits") else output
    return logits.mean()  # MeanBackward keeps no tensor: the logits die before backward


def compare(cases: Sequence[MemoryCase]) -> list[MemoryRow]:
    """Predicted and measured bytes for every component of every case."""
    rows = []
    for case in cases:
        predicted, measured = predict(case), measure(case)
        rows += [MemoryRow(case.name, case.setting, c, predicted[c], measured[c])
                 for c in COMPONENTS]
    return rows


def render(rows: Sequence[MemoryRow], *, command: str) -> str:
    """A Markdown table with the command, torch version and date it came from."""
    torch = extras.require("torch", "torch", needed_by="memory_check")
    lines = [f"Produced by `{command}` with torch {torch.__version__} on "
             f"{datetime.date.today().isoformat()} (CPU).", "",
             "| model | setting | component | predicted (bytes) | measured (bytes) | error % |",
             "|---|---|---|---:|---:|---:|"]
    lines += [f"| {r.model} | {r.setting} | {r.component} | {r.predicted_bytes:,} | "
              f"{r.measured_bytes:,} | {r.error_pct:+.1f} |" for r in rows]
    return "\n".join(lines)


COMMAND = "gpuplan eval memory-check"


def run() -> int:
    """Print the table of predicted vs measured memory for the default cases (no settings:
    the cases are fixed)."""
    print(render(compare(default_cases()), command=COMMAND))
    return 0
