"""The accuracy page's pictures: signed error per model and GPU, and P10–P90 coverage per GPU.

matplotlib (the ``[plot]`` extra) is imported inside each function with the Agg backend, so
importing this module costs nothing and needs no display. The data preparation is pure and
tested apart (`residual_points`, `coverage_bars`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuplan_estimator.evaluation import pages, report
from gpuplan_estimator.evaluation.gpu_labels import RowResult
from gpuplan_estimator.evaluation.report import Report

PANELS = (("shipped models", "gpu", pages.LEARNED),
          ("GPU left out of training", "logo", pages.LEARNED),
          ("corrected from other models' outcomes", "gpu", pages.CALIBRATED))
"""(title, report part, predictor) of the residual panels, left to right."""
BANDS_PCT = (10.0, 30.0)


@dataclass(frozen=True)
class Point:
    """One row's signed error (percent) in a residual panel."""

    group: str  # x category: a GPU name, or "CPU <mode>"
    model: str
    error_pct: float


def residual_points(results: Sequence[RowResult], predictor: str) -> tuple[Point, ...]:
    """Signed error of every row `predictor` priced, grouped by GPU name."""
    names = pages.gpu_names(results)
    return tuple(Point(names[r.device], r.row.model + ("/compiled" if r.row.fused else ""),
                       report.signed_error_pct(r.predicted_ms, r.row.measured_ms))
                 for r in results if r.predictor == predictor)


def coverage_bars(rep: Report) -> dict[str, dict[str, tuple[float, int]]]:
    """Series → group → (percent of rows inside P10–P90, rows), for the coverage plot."""
    out: dict[str, dict[str, tuple[float, int]]] = {}
    for title, part, predictor in PANELS:
        results = [r for r in (rep.gpu if part == "gpu" else rep.logo) if r.predictor == predictor]
        names = pages.gpu_names(results)
        for (_, device), m in report.summarise_by_device(results).items():
            if device != "all":
                out.setdefault(title, {})[names[device]] = (m.coverage_pct, m.rows)
    for key, m in report.summarise_cpu(rep.cpu).items():
        if key.endswith(" all"):
            out.setdefault("CPU closed loop", {})[f"CPU {key.removesuffix(' all')}"] = (
                m.coverage_pct, m.rows)
    return out


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")  # no display: render straight to the file
    import matplotlib.pyplot as plt

    return plt


def plot_residuals(rep: Report, path: Path) -> None:
    """One panel per predictor view: a box and the dots of each GPU, with ±10/±30 % bands."""
    plt = _pyplot()
    panels = [(title, residual_points(rep.gpu if part == "gpu" else rep.logo, predictor))
              for title, part, predictor in PANELS]
    panels = [(t, pts) for t, pts in panels if pts]
    cpu = tuple(Point(f"CPU {c.mode}", c.model,
                      report.signed_error_pct(c.predicted_ms, c.measured_ms)) for c in rep.cpu)
    if cpu:
        panels.append(("CPU closed loop (host)", cpu))
    if not panels:
        panels = [("no rows", ())]
    models = sorted({p.model for _, pts in panels for p in pts})
    colours = {m: plt.get_cmap("tab20")(i % 20) for i, m in enumerate(models)}
    widths = [max(2, len({p.group for p in pts})) for _, pts in panels]
    fig, axes = plt.subplots(1, len(panels), figsize=(3.0 + 0.9 * sum(widths), 5.2), sharey=True,
                             gridspec_kw={"width_ratios": widths}, squeeze=False)
    limit = max([35.0, *(min(abs(p.error_pct), 100.0) + 5 for _, pts in panels for p in pts)])
    for ax, (title, pts) in zip(axes[0], panels, strict=True):
        groups = sorted({p.group for p in pts})
        ax.axhspan(-BANDS_PCT[1], BANDS_PCT[1], color="0.93", zorder=0)
        ax.axhspan(-BANDS_PCT[0], BANDS_PCT[0], color="0.82", zorder=0)
        ax.axhline(0.0, color="k", lw=0.8, zorder=1)
        if groups:
            ax.boxplot([[p.error_pct for p in pts if p.group == g] for g in groups],
                       positions=range(len(groups)), widths=0.5, showfliers=False,
                       medianprops={"color": "k"}, zorder=2)
        for i, g in enumerate(groups):
            mine = [p for p in pts if p.group == g]
            for j, p in enumerate(mine):
                jitter = (j / max(1, len(mine) - 1) - 0.5) * 0.4 if len(mine) > 1 else 0.0
                ax.scatter(i + jitter, max(-limit, min(limit, p.error_pct)), s=16,
                           color=colours[p.model], edgecolors="k", linewidths=0.3, zorder=3)
        ax.set_xticks(range(len(groups)), groups, rotation=35, ha="right", fontsize=8)
        ax.set_title(title, fontsize=9)
        ax.set_ylim(-limit, limit)
    axes[0][0].set_ylabel("signed error, % (predicted / measured − 1)")
    handles = [plt.Line2D([], [], marker="o", ls="", color=colours[m], label=m) for m in models]
    fig.legend(handles=handles, loc="upper center", ncol=min(6, max(1, len(models))),
               fontsize=7, frameon=False)
    fig.text(0.01, 0.01, f"bands: ±{BANDS_PCT[0]:.0f} % (dark), ±{BANDS_PCT[1]:.0f} % (light); "
             f"measured at {rep.measured.commit or 'unknown'}", fontsize=7)
    fig.tight_layout(rect=(0, 0.03, 1, 0.9))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_coverage(rep: Report, path: Path) -> None:
    """Grouped bars: share of rows inside P10–P90 per GPU and view, against the nominal 80 %."""
    plt = _pyplot()
    series = coverage_bars(rep)
    groups = sorted({g for bars in series.values() for g in bars}, key=lambda g: (
        g.startswith("CPU"), g))
    fig, ax = plt.subplots(figsize=(max(6.0, 1.1 * len(groups) + 2), 4.6))
    colours = {title: plt.get_cmap("tab10")(k) for k, title in enumerate(series)}
    labelled: set[str] = set()
    for i, g in enumerate(groups):
        present = [t for t in series if g in series[t]]  # bars centred on the views a group has
        width = 0.8 / len(present)
        for k, title in enumerate(present):
            x, pct = i + (k - (len(present) - 1) / 2) * width, series[title][g][0]
            ax.bar(x, pct, width, color=colours[title], label=None if title in labelled else title)
            ax.text(x, pct + 1, f"{pct:.0f}", ha="center", fontsize=6)  # 0 % has no visible bar
            labelled.add(title)
    rows = {g: next(series[t][g][1] for t in series if g in series[t]) for g in groups}
    ax.axhline(pages.NOMINAL_COVERAGE_PCT, color="k", ls="--", lw=1,
               label=f"nominal {pages.NOMINAL_COVERAGE_PCT} %")
    ticks = [f"{g.replace(' ', chr(10), 1)}\n{rows[g]} rows" for g in groups]  # name on 2 lines
    ax.set_xticks(range(len(groups)), ticks, fontsize=7)
    ax.set_ylim(0, 105)
    ax.set_ylabel("rows with the measurement inside P10–P90, %")
    ax.set_title("Interval coverage per GPU", fontsize=10)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=5, frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
