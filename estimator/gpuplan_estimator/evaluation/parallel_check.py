"""Multi-GPU step times predicted by `parallel.layouts` next to published measurements.

    gpuplan eval parallel-check [--bundle DIR]

Prints the markdown table of docs/parallelism.md. The published numbers are used for comparison
only: nothing here is fitted to them. The single-GPU step comes from the shipped estimator
(`planning.estimates.estimate` on the `graph.zoo` GPT-2 graph, with the default predictor
selection of `gpuplan estimate`), the layout model from `parallel.layouts` with the default
`ScalingModel`.

Source of the measurements: NeuSight (S. Lee, A. Phanishayee, D. Mahajan, "Forecasting GPU
Performance for Deep Learning Training and Inference", ASPLOS 2025), distributed-training table,
as published in its artifact at scripts/asplos/summary/distributed.csv (read from the mirror
github.com/trsharm25/NeuSight at commit bca31fb12ae6). Their setup
(scripts/asplos/run_label_distributed.py and collect_label_distributed.py there): HF Accelerate
with Megatron-LM, one node of 4 GPUs (A100x4 = "NVIDIA A100-SXM4-40GB", H100x4 = "NVIDIA H100
80GB HBM3"), fp32 (`--mixed_precision=no`), AdamW, no sequence parallelism, no recomputation, no
distributed optimizer; the timed region is Accelerate's Megatron `train_step` (forward, backward,
gradient reduction and optimizer step), the mean of the 10 fastest of 50 steps. "pp4_1" is
pp=4 with ONE micro-batch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpuplan_estimator import devices, graph
from gpuplan_estimator.core.vocabulary import SEQUENCE_DIM
from gpuplan_estimator.graph import exporting
from gpuplan_estimator.latency import selection
from gpuplan_estimator.parallel import layouts
from gpuplan_estimator.parallel.scaling import ScalingModel
from gpuplan_estimator.planning import estimates, parallel_inputs
from gpuplan_estimator.step.decomposition import TrainingSettings

SOURCE = "NeuSight (Lee et al., ASPLOS 2025), artifact scripts/asplos/summary/distributed.csv"
GPUS_PER_NODE = 4  # their machines: one node of 4 GPUs
PRECISION = "fp32"
OPTIMIZER = "adamw"

# The HF configs of their scripts/asplos/data/DLmodel_configs (fields the zoo builder reads).
CONFIGS: Mapping[str, Mapping[str, Any]] = {
    "GPT2-Large": {"model_type": "gpt2", "n_embd": 1280, "n_head": 20, "n_layer": 36,
                   "n_positions": 1024, "vocab_size": 50257,
                   "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5},
    "GPT3-XL": {"model_type": "gpt2", "n_embd": 3072, "n_head": 24, "n_layer": 24,
                "n_positions": 2048, "vocab_size": 50257,
                "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5},
}
SEQUENCE = {"GPT2-Large": 1024, "GPT3-XL": 2048}


@dataclass(frozen=True)
class Published:
    """One measured multi-GPU step: model, global batch, device, layout and its time (ms)."""

    model: str
    global_batch: int
    device: str  # catalog key
    layout: layouts.ParallelLayout
    measured_ms: float
    neusight_ms: float  # NeuSight's own prediction, for reference


def _lay(kind: str) -> layouts.ParallelLayout:
    dp, tp, pp = {"DP": (4, 1, 1), "TP": (1, 4, 1), "PP": (1, 1, 4)}[kind]
    return layouts.ParallelLayout(dp=dp, tp=tp, pp=pp, micro_batches=1)


_A100, _H100 = "a100-sxm4-40gb", "h100-sxm-80gb"
PUBLISHED: tuple[Published, ...] = (
    Published("GPT2-Large", 4, _A100, _lay("DP"), 452.3, 510.5),
    Published("GPT2-Large", 4, _A100, _lay("TP"), 484.9, 525.6),
    Published("GPT2-Large", 4, _A100, _lay("PP"), 1597.6, 1761.6),
    Published("GPT2-Large", 4, _H100, _lay("DP"), 194.9, 214.1),
    Published("GPT2-Large", 4, _H100, _lay("TP"), 211.1, 228.1),
    Published("GPT2-Large", 4, _H100, _lay("PP"), 637.5, 650.2),
    Published("GPT2-Large", 16, _H100, _lay("DP"), 642.1, 649.6),
    Published("GPT2-Large", 16, _H100, _lay("TP"), 729.7, 825.1),
    Published("GPT2-Large", 16, _H100, _lay("PP"), 2384.0, 2638.4),
    Published("GPT3-XL", 4, _H100, _lay("TP"), 1010.5, 1047.6),
    Published("GPT3-XL", 4, _H100, _lay("PP"), 3554.4, 3717.0),
)


@dataclass(frozen=True)
class ParallelRow:
    """A published step with our prediction and its parts."""

    published: Published
    step: layouts.ParallelStep
    data_basis: str

    @property
    def error_pct(self) -> float:
        """Signed error of our prediction against the measurement, in %."""
        return 100.0 * (self.step.total_ms / self.published.measured_ms - 1.0)


def predict(p: Published, *, bundle: str | None = None) -> ParallelRow:
    """Our prediction of one published configuration."""
    predictor, _ = selection.select_predictor(bundle)
    device = devices.load_catalog().resolve(p.device)
    micro = p.layout.micro_batch_size(p.global_batch)
    model = exporting.hf_config_graph(CONFIGS[p.model], batch=micro, sequence=SEQUENCE[p.model],
                                      label=p.model)
    g = graph.load_at_batch(model, micro, {SEQUENCE_DIM: SEQUENCE[p.model]})
    settings = TrainingSettings(batch_size=micro, precision=PRECISION, optimizer=OPTIMIZER)
    (single,) = estimates.estimate(g, [device], settings, predictor=predictor)
    step = layouts.step_time(
        p.layout, parallel_inputs.split_from_estimate(single),
        parallel_inputs.model_dims_from_graph(g, precision=PRECISION), device, ScalingModel(),
        gpus_per_node=GPUS_PER_NODE)
    return ParallelRow(p, step, single.data_basis)


def table(rows: Sequence[ParallelRow]) -> str:
    """The markdown comparison table, with the mean absolute error."""
    lines = ["| model, global batch | hardware | layout | published (ms) | NeuSight (ms) | ours "
             "(ms) | error | compute / TP / bubble / p2p / DP / optimizer (ms) |",
             "|---|---|---|---:|---:|---:|---:|---|"]
    for r in rows:
        p, s = r.published, r.step
        parts = " / ".join(f"{v:.0f}" for v in (s.compute_ms, s.tp_comm_ms, s.pp_bubble_ms,
                                                 s.pp_p2p_ms, s.dp_allreduce_ms, s.optimizer_ms))
        lines.append(f"| {p.model}, {p.global_batch} | 4 x {p.device} ({r.data_basis}) | "
                     f"{p.layout.describe()} | {p.measured_ms:.1f} | {p.neusight_ms:.1f} | "
                     f"{s.total_ms:.1f} | {r.error_pct:+.1f} % | {parts} |")
    mean = sum(abs(r.error_pct) for r in rows) / len(rows)
    worst = max(abs(r.error_pct) for r in rows)
    lines.append(f"\nMean absolute error {mean:.1f} % over {len(rows)} steps, worst {worst:.1f} %.")
    return "\n".join(lines)


@dataclass(frozen=True)
class ParallelCheckSettings:
    """`gpuplan eval parallel-check`'s flags."""
    bundle: str | None
    """Model bundle to predict with (None: as `gpuplan estimate`)."""


def run(settings: ParallelCheckSettings) -> int:
    """Print the comparison table."""
    print(f"Source: {SOURCE}")
    print(table([predict(p, bundle=settings.bundle) for p in PUBLISHED]))
    return 0
