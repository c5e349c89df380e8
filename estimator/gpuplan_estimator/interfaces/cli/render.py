"""Estimates as terminal text: header lines, table rows, a device's detail, roll-ups (pure).

Functions here return strings and rows; `output` prints them. Numbers are rounded for reading
(three significant figures where the spread is wide); JSON keeps them exact.
"""

from __future__ import annotations

from collections.abc import Sequence

from gpuplan_estimator.core import options, precisions
from gpuplan_estimator.core.durations import format_duration
from gpuplan_estimator.core.layers import ModelGraph
from gpuplan_estimator.interfaces.cli.output import Column
from gpuplan_estimator.latency import basis
from gpuplan_estimator.planning import estimates, rollup
from gpuplan_estimator.planning.estimates import DeviceStepEstimate, LayerTimeEstimate
from gpuplan_estimator.planning.ranking import Recommendation
from gpuplan_estimator.step import attention
from gpuplan_estimator.step.decomposition import TrainingSettings

GIB = 1024**3
RECOMMENDED_MARK = "*"
BASIS_WORDS = {
    basis.MEASURED: "from this GPU's kernel measurements",
    basis.PROBED: "spec-sheet transfer corrected by a few probe measurements",
    basis.EXTRAPOLATED: "extrapolated from the spec sheet (no measurement of this GPU)",
    basis.ROOFLINE: "analytic roofline (no learned model)",
}


def gib(n_bytes: int) -> str:
    """Bytes as GiB with one decimal, e.g. ``12.3 GiB``."""
    return f"{n_bytes / GIB:.1f} GiB"


def duration(seconds: float | None) -> str:
    """Seconds for a reader (`core.durations.format_duration`): ``3h 35m``, ``850 ms``."""
    return format_duration(seconds)


def ms(value: float) -> str:
    """Milliseconds with three significant figures (two decimals below 10 ms)."""
    return f"{value:,.0f}" if value >= 100 else f"{value:.1f}" if value >= 10 else f"{value:.2f}"


def usd(value: float | None) -> str:
    """Dollars: ``$1,234``, ``$12.35``, ``$0.0237``; ``?`` when the price is unknown."""
    if value is None:
        return "?"
    if value >= 100:
        return f"${value:,.0f}"
    return f"${value:.2f}" if value >= 1 else f"${value:.3g}"


def rate(value: float | None) -> str:
    """A throughput with three significant figures and thousands separators."""
    if value is None:
        return "-"
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


def flops(value: float) -> str:
    """FLOPs with an SI prefix: ``795 GFLOP``, ``1.2 PFLOP``."""
    for prefix, size in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6)):
        if value >= size:
            return f"{value / size:.3g} {prefix}FLOP"
    return f"{value:.3g} FLOP"


def header(graph: ModelGraph, settings: TrainingSettings, predictor_source: str) -> str:
    """Two lines naming the model (layers, parameters, dims), the settings and predictor."""
    bindings = ", ".join(f"{k}={v}" for k, v in sorted(graph.dim_bindings.items()))
    optimizer = (f", optimizer {settings.optimizer} ({settings.optimizer_impl})"
                 if settings.mode == "train" else "")
    return (
        f"model {graph.name}: {len(graph.layers)} layers, "
        f"{graph.parameter_count / 1e6:.1f} M parameters"
        + (f" ({bindings})" if bindings else "")
        + f"\n{settings.mode}, batch {settings.batch_size}{optimizer}, precision "
        f"{settings.precision}, {settings.attention} attention; predictor: {predictor_source}"
    )


def _cost_column(results: Sequence[DeviceStepEstimate]) -> tuple[str, str]:
    """The cost column's header and which span it prices: the run, an epoch or 1,000 steps."""
    if results and results[0].total_seconds is not None:
        return "COST/RUN", "run"
    if results and results[0].epoch_seconds is not None:
        return "COST/EPOCH", "epoch"
    return "COST/1K STEPS", "1k"


def _time_column(results: Sequence[DeviceStepEstimate]) -> str | None:
    if results and results[0].total_seconds is not None:
        return "TIME/RUN"
    if results and results[0].epoch_seconds is not None:
        return "TIME/EPOCH"
    return None


def estimate_columns(results: Sequence[DeviceStepEstimate], settings: TrainingSettings
                     ) -> list[Column]:
    """The columns of the estimate table for these results (wide ones marked)."""
    train = settings.mode == "train"
    tokens = bool(results) and results[0].tokens_per_sample is not None
    time_header = _time_column(results)
    columns = [
        Column(""), Column("DEVICE"), Column("BASIS"), Column("STEP ms", numeric=True),
        Column("P10-P90 ms", numeric=True),
        Column("TOKENS/S" if tokens else "SAMPLES/S", numeric=True),
        Column("MFU", numeric=True), Column("MEMORY", numeric=True), Column("FITS"),
        Column("BOUND"),
        *([Column(time_header, numeric=True)] if time_header else []),
        Column(_cost_column(results)[0], numeric=True),
        Column("FWD ms", numeric=True, wide_only=True),
        *([Column("BWD ms", numeric=True, wide_only=True),
           Column("OPT ms", numeric=True, wide_only=True)] if train else []),
        Column("$/H", numeric=True, wide_only=True),
        Column("PREDICTED BY", wide_only=True),
    ]
    return columns


def estimate_rows(results: Sequence[DeviceStepEstimate], settings: TrainingSettings,
                  recommended: DeviceStepEstimate | None) -> list[list[str]]:
    """One row per device, in the order given (already ranked), matching `estimate_columns`."""
    _, span = _cost_column(results)
    time_header = _time_column(results)
    rows = []
    for r in results:
        lo, hi = r.interval_ms
        seconds = {"run": r.total_seconds, "epoch": r.epoch_seconds,
                   "1k": r.step_time_ms}[span]  # 1,000 steps of ms = seconds
        main_predictor = max(r.predictor.items(), key=lambda kv: kv[1], default=("-", 0.0))
        rows.append([
            RECOMMENDED_MARK if r is recommended else "", r.device, r.data_basis,
            ms(r.step_time_ms), f"{ms(lo)}-{ms(hi)}",
            rate(r.tokens_per_s if r.tokens_per_sample is not None else r.samples_per_s),
            f"{r.mfu:.0%}" if r.mfu is not None else "-",
            f"{r.memory.total_bytes / GIB:.1f}/{r.memory_available_bytes / GIB:.0f} GiB",
            "yes" if r.fits else "NO",
            estimates.bound_of(r),
            *([duration(r.total_seconds if time_header == "TIME/RUN" else r.epoch_seconds)]
              if time_header else []),
            usd(r.cost_usd(seconds)),
            ms(r.forward_ms),
            *([ms(r.backward_ms), ms(r.optimizer_ms)] if settings.mode == "train" else []),
            usd(r.price_per_hour_usd),
            f"{main_predictor[0]} {main_predictor[1]:.0%}",
        ])
    return rows


def recommendation_lines(rec: Recommendation, prefer: str) -> list[str]:
    """What is recommended under the objective, and why."""
    if rec.device is None:
        return [f"no recommendation: {rec.reason}"]
    return [f"{RECOMMENDED_MARK} recommended ({prefer}): {rec.device.device}, {rec.reason}"]


def precision_lines(settings: TrainingSettings) -> list[str]:
    """What the precision means as PyTorch runs it (`core.precisions`)."""
    entry = precisions.precision(settings.precision)
    if entry.autocast:
        return [f"precision: {entry.name} is torch.autocast over fp32 weights (casts each step; "
                "softmax, norms and losses kept in fp32)"]
    gemm = "TF32" if entry.gemm_math == precisions.TF32_MATH else "true fp32"
    conv = "TF32" if entry.conv_math == precisions.TF32_MATH else "true fp32"
    return [f"precision: {entry.name}: matmuls in {gemm}, convolutions in {conv} on GPUs with "
            "TF32 (PyTorch's defaults" + (")" if entry.name != "fp32" else
                                          "; --precision tf32 for TF32 matmuls)")]


def host_lines(results: Sequence[DeviceStepEstimate]) -> list[str]:
    """Which devices' steps are bound by the host issuing kernels, and by how much."""
    bound = [r for r in results if r.host_bound and r.step_time_ms > 0]
    if not bound:
        return []
    worst = max(bound, key=lambda r: 1.0 - r.gpu_busy_ms / r.step_time_ms)
    idle = 1.0 - worst.gpu_busy_ms / worst.step_time_ms
    saving = estimates.compiled_saving_ms(worst) or 0.0
    names = ", ".join(r.device for r in bound[:4]) + (" ..." if len(bound) > 4 else "")
    return [f"host-bound on {names}: the GPU waits for the CPU issuing kernels (up to "
            f"{idle:.0%} of the step); a compiled step in CUDA graphs (--framework "
            f"pytorch-compiled, mode reduce-overhead) would save up to {ms(saving)} ms a step "
            f"on {worst.device}, a larger batch uses the GPU better"]


def attention_lines(graph: ModelGraph, settings: TrainingSettings) -> list[str]:
    """A warning when fused attention was asked for and the graph has no core (or not only
    cores) to fuse; a hint when it has cores priced eager: most PyTorch 2 trainers run them
    fused, and at long sequences the two differ by whole multiples in time and memory."""
    report = attention.attention_report(graph, settings.attention)
    if report.warning is not None:
        return [f"attention: NOT FUSED: {report.warning}"]
    if not report.cores or settings.attention != options.EAGER_ATTENTION:
        return []
    return [f"attention: {report.cores} attention core(s) priced eager (op by op, scores in "
            "memory); --attention fused if the trainer runs scaled_dot_product_attention "
            "(Hugging Face's default \"sdpa\")"]


def basis_lines(results: Sequence[DeviceStepEstimate]) -> list[str]:
    """One line per data basis present, naming its devices: what each figure rests on."""
    lines = []
    for name in basis.BASES:
        keys = [r.device for r in results if r.data_basis == name]
        if keys:
            lines.append(f"  {name}: {BASIS_WORDS[name]}: {', '.join(keys)}")
    return ["basis:", *lines] if lines else []


def device_detail(r: DeviceStepEstimate, *, mode: str = "train") -> str:
    """One device's step split, epoch/total time, throughput, memory breakdown, predictors."""
    m = r.memory
    shares = ", ".join(f"{name} {share:.0%}" for name, share in sorted(r.predictor.items()))
    split = (f"forward {ms(r.forward_ms)}, backward {ms(r.backward_ms)}, optimizer "
             f"{ms(r.optimizer_ms)}" if mode == "train" else f"forward {ms(r.forward_ms)}")
    training_parts = (f"gradients {gib(m.gradients_bytes)}, optimizer "
                      f"{gib(m.optimizer_state_bytes)}, " if mode == "train" else "")
    throughput = (f"{rate(r.tokens_per_s)} tokens/s" if r.tokens_per_s is not None
                  else f"{rate(r.samples_per_s)} samples/s")
    mfu = f", MFU {r.mfu:.0%} of the datasheet peak" if r.mfu is not None else ""
    lines = [
        f"{r.device} ({r.data_basis}): step {ms(r.step_time_ms)} ms ({split}); p10-p90 "
        f"{ms(r.interval_ms[0])}-{ms(r.interval_ms[1])} ms",
        f"  {throughput}, {flops(r.model_flops_per_step)} per step{mfu}",
        f"  epoch {duration(r.epoch_seconds)}, total {duration(r.total_seconds)}"
        + (f" ({r.steps_per_epoch:,} steps/epoch)" if r.steps_per_epoch else ""),
        f"  memory {gib(m.total_bytes)} of {gib(r.memory_available_bytes)}: "
        f"{'fits' if r.fits else 'DOES NOT FIT'} (parameters {gib(m.parameters_bytes)}, "
        f"{training_parts}activations {gib(m.activations_bytes)}, workspace "
        f"{gib(m.workspace_bytes)}, framework {gib(m.framework_overhead_bytes)})",
        f"  priced by: {shares or 'nothing'}; shape-only layers: {r.shape_only_layers}",
    ]
    if r.uncovered_ops:
        lines.append(f"  uncovered ops (roofline only): {', '.join(r.uncovered_ops)}")
    return "\n".join(lines)


def top_layer_lines(r: DeviceStepEstimate, n: int = 5) -> list[str]:
    """The `n` most expensive layers of a device, one line each."""
    return ["  most expensive layers:", *("    " + layer_line(x) for x in r.top_layers(n))]


def layer_line(layer: LayerTimeEstimate) -> str:
    """One layer's name, op type, forward and backward ms and predictor, column-aligned."""
    return (f"{layer.name[:40]:<40} {layer.op_type:<20} fwd {layer.forward_ms:9.3f} ms  "
            f"bwd {layer.backward_ms:9.3f} ms  [{layer.predictor}]")


ROLLUP_ROWS = 15
"""Groups shown per roll-up; the rest are summed into one line."""


def rollup_lines(title: str, groups: Sequence[rollup.Group], limit: int = ROLLUP_ROWS
                 ) -> list[str]:
    """A roll-up as aligned lines: name, layers, fwd, bwd, share and cumulative share."""
    lines = [f"  {title}:", f"    {'':<36} {'layers':>6} {'fwd ms':>10} {'bwd ms':>10} "
             f"{'share':>6} {'cum':>6}"]
    running = 0.0
    for g in groups[:limit]:
        running += g.share
        lines.append(f"    {g.name[:36]:<36} {g.layers:>6} {g.forward_ms:>10.3f} "
                     f"{g.backward_ms:>10.3f} {g.share:>6.1%} {running:>6.1%}")
    rest = groups[limit:]
    if rest:
        lines.append(f"    {f'({len(rest)} more)':<36} {sum(g.layers for g in rest):>6} "
                     f"{sum(g.forward_ms for g in rest):>10.3f} "
                     f"{sum(g.backward_ms for g in rest):>10.3f} "
                     f"{sum(g.share for g in rest):>6.1%} {1.0:>6.1%}")
    return lines


def explain_lines(r: DeviceStepEstimate, *, layers: bool = False) -> list[str]:
    """Where `r`'s step time goes: by op type, by block, and every layer when `layers`."""
    lines = [f"explain {r.device}:"]
    lines += rollup_lines("by op type", rollup.by_op_type(r.layers))
    blocks = rollup.by_block(r.layers)
    if len(blocks) == 1 and blocks[0].name == rollup.OUTSIDE_BLOCKS:
        lines.append("  by block: the layer names carry no block structure (e.g. "
                     f"{r.layers[0].name if r.layers else '-'}); see by op type")
    else:
        lines += rollup_lines("by block", blocks)
    if layers:
        lines.append("  every layer (most expensive first): layer, op, fwd ms, bwd ms, "
                     "p10-p90 ms, predictor, cum %")
        total = sum(layer.total_ms for layer in r.layers) or 1.0
        running = 0.0
        for layer in sorted(r.layers, key=lambda x: -x.total_ms):
            running += layer.total_ms
            lines.append(
                f"    {layer.name[:40]:<40} {layer.op_type:<14} {layer.forward_ms:9.3f} "
                f"{layer.backward_ms:9.3f}  {layer.p10_ms:9.3f}-{layer.p90_ms:<9.3f} "
                f"{layer.predictor:<22} {100 * running / total:5.1f}")
    return lines
