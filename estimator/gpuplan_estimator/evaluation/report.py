"""Pure accuracy summaries plus the writers of docs/accuracy.{md,json,png}.

Every table row carries MAPE and P90 APE together (the project's rule) and the share of rows
whose measurement fell inside the predicted P10–P90 interval.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from gpuplan_estimator.evaluation.cpu_loop import CpuResult
from gpuplan_estimator.evaluation.gpu_labels import RowResult, Skipped


@dataclass(frozen=True)
class Metrics:
    """Accuracy of a group of rows: MAPE, P90 APE and P10–P90 coverage, in percent."""
    rows: int
    mape_pct: float
    p90_ape_pct: float
    coverage_pct: float  # measured within P10–P90

    def as_dict(self) -> dict[str, float]:
        """The metrics rounded for the JSON report."""
        return {"rows": self.rows, "mape_pct": round(self.mape_pct, 2),
                "p90_ape_pct": round(self.p90_ape_pct, 2),
                "coverage_pct": round(self.coverage_pct, 1)}


def metrics(apes: Sequence[float], covered: Sequence[bool]) -> Metrics:
    """MAPE, P90 APE (linear interpolation) and interval coverage, in percent."""
    if not apes:
        raise ValueError("no rows to summarise")
    a = np.asarray(apes, dtype=np.float64)
    return Metrics(len(a), float(100 * a.mean()), float(100 * np.quantile(a, 0.9)),
                   float(100 * np.mean(np.asarray(covered, dtype=bool))))


def group_key(r: RowResult) -> tuple[str, str, str]:
    """(predictor, device, mode) with torch.compile rows as their own mode."""
    return r.predictor, r.device, r.row.mode + ("/compiled" if r.row.fused else "")


def summarise(results: Iterable[RowResult]) -> dict[tuple[str, str, str], Metrics]:
    """Per (predictor, device, mode) plus (predictor, "all", mode)."""
    groups: dict[tuple[str, str, str], list[RowResult]] = {}
    for r in results:
        p, d, m = group_key(r)
        groups.setdefault((p, d, m), []).append(r)
        groups.setdefault((p, "all", m), []).append(r)
    return {k: metrics([r.ape for r in v], [r.covered for r in v])
            for k, v in sorted(groups.items())}


def summarise_cpu(results: Sequence[CpuResult]) -> dict[str, Metrics]:
    """Per mode and batch, per mode, and over all rows of that mode."""
    out: dict[str, Metrics] = {}
    for mode in sorted({r.mode for r in results}):
        rows = [r for r in results if r.mode == mode]
        for b in sorted({r.batch for r in rows}):
            picked = [r for r in rows if r.batch == b]
            out[f"{mode} batch {b}"] = metrics([r.ape for r in picked],
                                               [r.covered for r in picked])
        out[f"{mode} all"] = metrics([r.ape for r in rows], [r.covered for r in rows])
    return out


def _table(summary: Mapping[tuple[str, str, str], Metrics], predictors: Sequence[str]) -> str:
    lines = ["| device | mode | rows | " + " | ".join(
        f"{p} MAPE % | {p} P90 % | {p} in P10–P90 %" for p in predictors) + " |",
        "|---|---|--:|" + "--:|" * (3 * len(predictors))]
    keys = sorted({(d, m) for (_, d, m) in summary}, key=lambda k: (k[0] == "all", k))
    for d, m in keys:
        cells, rows = [], 0
        for p in predictors:
            s = summary.get((p, d, m))
            rows = rows or (s.rows if s else 0)
            cells += ([f"{s.mape_pct:.1f}", f"{s.p90_ape_pct:.1f}", f"{s.coverage_pct:.0f}"]
                      if s else ["–", "–", "–"])
        lines.append(f"| {d} | {m} | {rows} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _rows_table(results: Sequence[RowResult], predictors: Sequence[str]) -> str:
    by_row: dict[Any, dict[str, RowResult]] = {}
    for r in results:
        by_row.setdefault(r.row, {})[r.predictor] = r
    lines = ["| device | model | mode | seq | batch | measured ms | " +
             " | ".join(f"{p} ms (err %)" for p in predictors) + " |",
             "|---|---|---|--:|--:|--:|" + "--:|" * len(predictors)]
    for row, preds in by_row.items():
        first = next(iter(preds.values()))
        cells = [_cell(preds[p].predicted_ms, row.measured_ms) if p in preds else "–"
                 for p in predictors]
        mode = row.mode + ("/compiled" if row.fused else "")
        lines.append(f"| {first.device} | {row.model} | {mode} | {row.seq_len} | {row.batch} | "
                     f"{row.measured_ms:.1f} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _cell(predicted_ms: float, measured_ms: float) -> str:
    return f"{predicted_ms:.1f} ({100 * (predicted_ms / measured_ms - 1):+.1f})"


def _cpu_table(results: Sequence[CpuResult]) -> str:
    lines = ["| model | mode | batch | predictor | predicted ms | P10–P90 ms | measured ms | "
             "APE % |", "|---|---|--:|---|--:|--:|--:|--:|"]
    for r in results:
        lines.append(f"| {r.model} | {r.mode} | {r.batch} | {r.predictor} | "
                     f"{r.predicted_ms:.1f} | "
                     f"{r.p10_ms:.1f}–{r.p90_ms:.1f} | {r.measured_ms:.1f} | {100 * r.ape:.1f} |")
    return "\n".join(lines)


def _metric_lines(summary: Mapping[str, Metrics]) -> str:
    return "\n".join(f"- {k}: MAPE {m.mape_pct:.1f} %, P90 APE {m.p90_ape_pct:.1f} %, "
                     f"in P10–P90 {m.coverage_pct:.0f} % ({m.rows} rows)"
                     for k, m in summary.items())


@dataclass(frozen=True)
class Report:
    """Everything `gpuplan eval` measured, ready to render."""

    commit: str
    command: str
    created: str
    bundle: str
    gpu: tuple[RowResult, ...]
    skipped: tuple[Skipped, ...]
    logo: tuple[RowResult, ...]
    cpu: tuple[CpuResult, ...]
    notes: tuple[str, ...]
    host: str = ""


def to_json(rep: Report) -> dict[str, Any]:
    """The report as the JSON document written to ``accuracy.json``."""
    def flat(s: Mapping[tuple[str, str, str], Metrics]) -> list[dict[str, Any]]:
        return [{"predictor": p, "device": d, "mode": m, **v.as_dict()}
                for (p, d, m), v in s.items()]

    def rows(results: Sequence[RowResult]) -> list[dict[str, Any]]:
        return [{"device": r.device, "model": r.row.model, "mode": r.row.mode,
                 "compiled": r.row.fused, "seq_len": r.row.seq_len, "batch": r.row.batch,
                 "predictor": r.predictor, "predicted_ms": round(r.predicted_ms, 3),
                 "p10_ms": round(r.p10_ms, 3), "p90_ms": round(r.p90_ms, 3),
                 "forward_ms": round(r.forward_ms, 3), "measured_ms": r.row.measured_ms}
                for r in results]

    return {
        "commit": rep.commit, "command": rep.command, "created": rep.created,
        "bundle": rep.bundle, "host": rep.host, "notes": list(rep.notes),
        "gpu_labels": {"summary": flat(summarise(rep.gpu)), "rows": rows(rep.gpu)},
        "skipped": [{"model": s.row.model, "device": s.row.gpu, "reason": s.reason}
                    for s in rep.skipped],
        "leave_one_gpu_out": {"summary": flat(summarise(rep.logo)), "rows": rows(rep.logo)},
        "cpu_closed_loop": {
            "summary": {k: v.as_dict() for k, v in summarise_cpu(rep.cpu).items()},
            "rows": [{"model": r.model, "mode": r.mode, "batch": r.batch,
                      "predictor": r.predictor,
                      "predicted_ms": round(r.predicted_ms, 3), "p10_ms": round(r.p10_ms, 3),
                      "p90_ms": round(r.p90_ms, 3), "measured_ms": round(r.measured_ms, 3),
                      "runs": r.runs} for r in rep.cpu],
        },
    }


def to_markdown(rep: Report, plot_name: str = "accuracy.png") -> str:
    """The report as the Markdown page ``accuracy.md``, linking the plot `plot_name`."""
    gpu_preds = sorted({r.predictor for r in rep.gpu}, key=_predictor_order)
    logo_preds = sorted({r.predictor for r in rep.logo}, key=_predictor_order)
    skipped = sorted({(s.row.model, s.reason) for s in rep.skipped})
    parts = [
        "# gpuplan accuracy",
        "",
        f"Generated by `{rep.command}` at commit `{rep.commit or 'unknown'}` on {rep.created}. "
        f"Latency models: {rep.bundle}. Regenerate with `make eval`; machine-readable: "
        "`accuracy.json`.",
        "",
        f"![predicted vs measured]({plot_name})",
        "",
        "## Notes",
        "",
        *[f"- {n}" for n in rep.notes],
        *[f"- Skipped {m}: {why} ({sum(s.row.model == m for s in rep.skipped)} rows)."
          for m, why in skipped],
        "",
        "## GPU, whole model (development labels)",
        "",
        _table(summarise(rep.gpu), gpu_preds) if rep.gpu else "(not run)",
        "",
        "## GPU, leave one GPU out (latency models trained without that GPU's op rows)",
        "",
        _table(summarise(rep.logo), logo_preds) if rep.logo else "(not run)",
        "",
        "## CPU closed loop (this machine: inference with onnxruntime CPUExecutionProvider, "
        "training step with PyTorch eager on the light models onnx2torch converts)",
        "",
        rep.host,
        "",
        _metric_lines(summarise_cpu(rep.cpu)) if rep.cpu else "(not run)",
        "",
        _cpu_table(rep.cpu) if rep.cpu else "",
        "",
        "## Every GPU row",
        "",
        _rows_table(rep.gpu, gpu_preds) if rep.gpu else "",
        "",
    ]
    return "\n".join(parts)


def _predictor_order(name: str) -> tuple[int, str]:
    order = {"roofline": 0, "lightgbm": 1, "lightgbm+calibration": 2, "lightgbm+probe": 3}
    return order.get(name, 9), name


def plot(rep: Report, path: Path) -> None:
    """Log-log predicted vs measured, one marker per predictor, GPU and CPU rows."""
    import matplotlib

    matplotlib.use("Agg")  # no display: render straight to the file
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 6.0))
    series: dict[str, tuple[list[float], list[float]]] = {}
    for r in rep.gpu:
        xs, ys = series.setdefault(f"GPU {r.predictor}", ([], []))
        xs.append(r.row.measured_ms)
        ys.append(r.predicted_ms)
    for r in rep.logo:
        xs, ys = series.setdefault(f"GPU LOGO {r.predictor}", ([], []))
        xs.append(r.row.measured_ms)
        ys.append(r.predicted_ms)
    for c in rep.cpu:
        xs, ys = series.setdefault(f"CPU {c.mode}", ([], []))
        xs.append(c.measured_ms)
        ys.append(c.predicted_ms)
    lo, hi = np.inf, 0.0
    for label, (xs, ys) in series.items():
        ax.scatter(xs, ys, s=14, label=label, alpha=0.75)
        lo, hi = min(lo, *xs, *ys), max(hi, *xs, *ys)
    if hi > 0:
        line = np.array([lo * 0.8, hi * 1.25])
        ax.plot(line, line, "k-", lw=0.8)
        ax.plot(line, line * 1.1, "k:", lw=0.6)
        ax.plot(line, line / 1.1, "k:", lw=0.6)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("measured ms")
    ax.set_ylabel("predicted ms")
    ax.set_title(f"gpuplan predicted vs measured ({rep.commit or 'unknown'}); dotted ±10 %")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write(rep: Report, out_dir: Path) -> tuple[Path, Path, Path]:
    """Write accuracy.md, accuracy.json and accuracy.png into `out_dir`; return paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    md, js, png = out_dir / "accuracy.md", out_dir / "accuracy.json", out_dir / "accuracy.png"
    plot(rep, png)
    js.write_text(json.dumps(to_json(rep), indent=1) + "\n", encoding="utf-8")
    md.write_text(to_markdown(rep, png.name), encoding="utf-8")
    return md, js, png
