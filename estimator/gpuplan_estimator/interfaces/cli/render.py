"""Pure text rendering of estimates for the terminal (the CLI prints what these return)."""

from __future__ import annotations

from collections.abc import Sequence

from gpuplan_estimator.core.layers import ModelGraph
from gpuplan_estimator.planning.estimates import DeviceEstimate, LayerEstimate
from gpuplan_estimator.step.decomposition import TrainingSettings

GIB = 1024**3


def gib(n_bytes: int) -> str:
    """Bytes as GiB with one decimal, e.g. ``12.3 GiB``."""
    return f"{n_bytes / GIB:.1f} GiB"


def duration(seconds: float | None) -> str:
    """Seconds as the largest sensible unit: 950 ms, 42.0 s, 12.5 min, 3.2 h, 4.1 d."""
    if seconds is None:
        return "-"
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    for unit, size in (("d", 86400.0), ("h", 3600.0), ("min", 60.0)):
        if seconds >= size:
            return f"{seconds / size:.1f} {unit}"
    return f"{seconds:.1f} s"


def header(graph: ModelGraph, settings: TrainingSettings, predictor_source: str) -> str:
    """Two lines naming the model (layers, parameters, dims), the settings and predictor."""
    bindings = ", ".join(f"{k}={v}" for k, v in sorted(graph.dim_bindings.items()))
    return (
        f"model {graph.name}: {len(graph.layers)} layers, "
        f"{graph.parameter_count / 1e6:.1f} M parameters"
        + (f" ({bindings})" if bindings else "")
        + f"\n{settings.mode}, batch {settings.batch_size}, optimizer {settings.optimizer}, "
        f"precision {settings.precision}; predictor: {predictor_source}"
    )


def table(results: Sequence[DeviceEstimate]) -> str:
    """One row per device: step time split, interval, epoch/total, memory need/have, fits."""
    head = (f"{'device':<22} {'step ms':>10} {'fwd':>9} {'bwd':>9} {'opt':>8} "
            f"{'p10-p90 ms':>19} {'epoch':>9} {'total':>9} {'memory need/have':>21} fits")
    rows = [head, "-" * len(head)]
    for r in results:
        lo, hi = r.interval_ms
        need = f"{r.memory.total_bytes / GIB:.1f}/{r.memory_available_bytes / GIB:.0f} GiB"
        rows.append(
            f"{r.device:<22} {r.step_time_ms:>10.2f} {r.forward_ms:>9.2f} {r.backward_ms:>9.2f} "
            f"{r.optimizer_ms:>8.2f} {f'{lo:.1f}-{hi:.1f}':>19} {duration(r.epoch_seconds):>9} "
            f"{duration(r.total_seconds):>9} {need:>21} {'yes' if r.fits else 'NO'}"
        )
    return "\n".join(rows)


def device_detail(r: DeviceEstimate, *, all_layers: bool = False) -> str:
    """One device's step split, epoch/total time, memory breakdown and top layers."""
    m = r.memory
    shares = ", ".join(f"{name} {share:.0%}" for name, share in sorted(r.predictor.items()))
    lines = [
        f"{r.device}: step {r.step_time_ms:.2f} ms (forward {r.forward_ms:.2f}, backward "
        f"{r.backward_ms:.2f}, optimizer {r.optimizer_ms:.2f}); p10-p90 "
        f"{r.interval_ms[0]:.2f}-{r.interval_ms[1]:.2f} ms",
        f"  epoch {duration(r.epoch_seconds)}, total {duration(r.total_seconds)}"
        + (f" ({r.steps_per_epoch} steps/epoch)" if r.steps_per_epoch else ""),
        f"  memory {gib(m.total_bytes)} of {gib(r.memory_available_bytes)}: "
        f"{'fits' if r.fits else 'DOES NOT FIT'} (parameters {gib(m.parameters_bytes)}, "
        f"gradients {gib(m.gradients_bytes)}, optimizer {gib(m.optimizer_state_bytes)}, "
        f"activations {gib(m.activations_bytes)}, workspace {gib(m.workspace_bytes)}, "
        f"framework {gib(m.framework_overhead_bytes)})",
        f"  priced by: {shares or 'nothing'}; shape-only layers: {r.shape_only_layers}",
    ]
    if r.uncovered_ops:
        lines.append(f"  uncovered ops (roofline only): {', '.join(r.uncovered_ops)}")
    layers = r.layers if all_layers else r.top_layers(5)
    lines.append("  all layers:" if all_layers else "  most expensive layers:")
    lines.extend("    " + layer_line(layer) for layer in layers)
    return "\n".join(lines)


def layer_line(layer: LayerEstimate) -> str:
    """One layer's name, op type, forward and backward ms and predictor, column-aligned."""
    return (f"{layer.name[:40]:<40} {layer.op_type:<20} fwd {layer.forward_ms:9.3f} ms  "
            f"bwd {layer.backward_ms:9.3f} ms  [{layer.predictor}]")
