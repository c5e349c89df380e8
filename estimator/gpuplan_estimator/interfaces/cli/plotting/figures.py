"""The `--plot` pictures: plan candidates as cost vs time, an estimate's step time and memory per
device. Pure data → figure; matplotlib (the optional `gpuplan[plot]` extra) is imported lazily,
on the Agg canvas, so the CLI starts without it and never needs a display."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gpuplan_estimator.core import extras
from gpuplan_estimator.interfaces.cli.plotting import documents

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

GIB = 1024**3
PHASE_COLOURS = {"forward": "#4c72b0", "backward": "#dd8452", "optimizer": "#55a868"}
UNKNOWN_PRICE = "price unknown"
NEEDED_BY = "--plot"  # what the missing-matplotlib message says needs it


@dataclass(frozen=True)
class Table:
    """The numbers a picture shows, as text: the HTML page lists them under the figure."""

    columns: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]


@dataclass(frozen=True)
class Picture:
    """A figure with its title and the table of its numbers."""

    figure: Figure
    title: str
    table: Table


def check_available() -> None:
    """Raise `extras.MissingExtraError` naming `gpuplan[plot]` when matplotlib is missing (the
    CLI can call it before a slow plan, not only after)."""
    extras.require("matplotlib.figure", "plot", needed_by=NEEDED_BY)


def new_figure(width_in: float, height_in: float) -> Figure:
    """An empty figure on the Agg canvas (no pyplot: no global figure list, no display)."""
    figures = extras.require("matplotlib.figure", "plot", needed_by=NEEDED_BY)
    agg = extras.require("matplotlib.backends.backend_agg", "plot", needed_by=NEEDED_BY)
    figure: Figure = figures.Figure(figsize=(width_in, height_in), layout="constrained")
    agg.FigureCanvasAgg(figure)
    return figure


def _type_colours(types: Sequence[str]) -> dict[str, Any]:
    from matplotlib import colormaps

    names = sorted(set(types))
    # One colour per GPU type: tab10, else tab20, else the three 20-colour tables together
    # (the whole catalog is 22 types; tab20 alone gave a10 and v100-sxm2-16gb the same one).
    tables = ["tab10"] if len(names) <= 10 else ["tab20", "tab20b", "tab20c"]
    palette = [c for t in tables for c in colormaps[t].colors]  # type: ignore[attr-defined]
    return {name: palette[i % len(palette)] for i, name in enumerate(names)}


def _hours(h: float) -> str:
    return f"{h:.3g} h"


def _cost(cost: float | None) -> str:
    return UNKNOWN_PRICE if cost is None else f"${cost:,.2f}"


def _usd(p: documents.PlanPoint) -> float:
    """The cost of a point on the cost axis; only priced points are ever drawn there."""
    if p.cost_usd is None:
        raise ValueError(f"{p.gpu_type} x{p.gpu_count} has no known price: not on the cost axis")
    return p.cost_usd


def _draw_priced(ax: Axes, points: Sequence[documents.PlanPoint], colours: Mapping[str, Any],
                 front: Sequence[int]) -> None:
    for gpu_type, colour in colours.items():
        mine = [p for p in points if p.gpu_type == gpu_type]
        if not mine:
            continue
        ax.hlines([_usd(p) for p in mine], [p.hours_p10 for p in mine],
                  [p.hours_p90 for p in mine], colors=[colour], alpha=0.3, lw=1)
        ax.scatter([p.hours for p in mine], [_usd(p) for p in mine], color=colour, s=28,
                   label=gpu_type, zorder=3)
    for p in points:
        ax.annotate(f"×{p.gpu_count}", (p.hours, _usd(p)), fontsize=6,
                    xytext=(3, 3), textcoords="offset points")
    if front:
        xs = [points[i].hours for i in front]
        ys = [_usd(points[i]) for i in front]
        ax.step(xs, ys, where="post", color="k", lw=1, ls="--", zorder=2,
                label="Pareto front (none cheaper and faster)")


def _draw_cost_axes(ax: Axes, priced: Sequence[documents.PlanPoint], colours: Mapping[str, Any],
                    front: Sequence[int], budget_usd: float | None) -> None:
    _draw_priced(ax, priced, colours, front)
    ax.set_ylabel("cost (USD)")
    budget = [budget_usd] if budget_usd is not None else []
    # The budget counts in the spread: a far budget on a linear axis squeezes the points.
    if documents.wide_spread([_usd(p) for p in priced] + budget):
        _log_axis(ax.yaxis, ax.set_yscale)
    ax.grid(True, alpha=0.3)


def _draw_unknown(ax: Axes, points: Sequence[documents.PlanPoint],
                  colours: Mapping[str, Any]) -> None:
    for gpu_type, colour in colours.items():
        mine = [p for p in points if p.gpu_type == gpu_type]
        if mine:
            ax.hlines([0.0] * len(mine), [p.hours_p10 for p in mine],
                      [p.hours_p90 for p in mine], colors=[colour], alpha=0.3, lw=1)
            ax.scatter([p.hours for p in mine], [0.0] * len(mine), color=colour, marker="x",
                       s=28, zorder=3)
    for p in points:
        ax.annotate(f"×{p.gpu_count}", (p.hours, 0.0), fontsize=6, xytext=(3, 3),
                    textcoords="offset points")
    ax.set_yticks([0.0], [UNKNOWN_PRICE])
    ax.set_ylim(-1.0, 1.0)


def _mark_chosen(ax: Axes, p: documents.PlanPoint, y: float) -> None:
    ax.scatter([p.hours], [y], s=220, facecolors="none", edgecolors="k", lw=1.5, zorder=4,
               label="chosen plan")
    # Pinned inside the axes' top right corner (slow and dear, where few candidates are), with a
    # line to the ring: the legend sits outside on the right, so the callout never covers it.
    ax.annotate(f"chosen: {p.gpu_count} × {p.gpu_type}\n{_hours(p.hours)}, {_cost(p.cost_usd)}",
                (p.hours, y), xytext=(0.98, 0.96), textcoords="axes fraction", ha="right",
                va="top", fontsize=8, bbox={"boxstyle": "round", "fc": "white", "alpha": 0.85},
                arrowprops={"arrowstyle": "-", "lw": 0.6}, zorder=5)


def _draw_limits(axes: Sequence[Axes], limits: documents.PlanLimits, priced: Axes | None) -> None:
    if limits.deadline_hours is not None:
        for ax in axes:
            ax.axvline(limits.deadline_hours, color="tab:red", ls=":", lw=1.2,
                       label="deadline" if ax is axes[0] else None)
    if limits.budget_usd is not None and priced is not None:
        priced.axhline(limits.budget_usd, color="tab:purple", ls=":", lw=1.2, label="budget")


def _plan_axes(figure: Figure, has_priced: bool, has_unknown: bool
               ) -> tuple[Axes | None, Axes | None]:
    if has_priced and has_unknown:
        top, bottom = figure.subplots(2, 1, sharex=True, height_ratios=(5, 1))
        return top, bottom
    ax = figure.subplots()
    return (ax, None) if has_priced else (None, ax)


def _plan_table(points: Sequence[documents.PlanPoint], front: set[int]) -> Table:
    rows = tuple(
        (p.gpu_type, str(p.gpu_count), str(p.nodes), f"{p.hours:.4g}",
         _cost(p.cost_usd), "yes" if i in front else "", "yes" if p.chosen else "")
        for i, p in enumerate(points))
    return Table(("GPU type", "GPUs", "nodes", "hours", "cost USD", "Pareto front", "chosen"),
                 rows)


def plan_figure(plan_doc: Mapping[str, Any], *, deadline_seconds: float | None = None,
                budget_usd: float | None = None) -> Picture:
    """Cost vs time to train of every candidate of a `gpuplan plan --json` document.

    Coloured by GPU type, the Pareto front as a step line, the chosen plan ringed and labelled;
    candidates without a known price on their own "price unknown" row, never at $0. Deadline
    and budget are drawn from the arguments, else from the document's `objective` if it has one.
    """
    check_available()
    points = documents.plan_points(plan_doc)
    limits = documents.plan_limits(plan_doc, deadline_seconds=deadline_seconds,
                                   budget_usd=budget_usd)
    priced_at = [i for i, p in enumerate(points) if p.cost_usd is not None]
    priced = [points[i] for i in priced_at]
    unknown = [p for p in points if p.cost_usd is None]
    front = documents.pareto_front([(p.hours, _usd(p)) for p in priced])
    figure = new_figure(8.0, 5.5 if priced else 2.5)
    top, bottom = _plan_axes(figure, bool(priced), bool(unknown))
    colours = _type_colours([p.gpu_type for p in points])
    if top is not None:
        _draw_cost_axes(top, priced, colours, front, limits.budget_usd)
    if bottom is not None:
        _draw_unknown(bottom, unknown, colours)
    chosen = next((p for p in points if p.chosen), None)
    if chosen is not None and chosen.cost_usd is not None and top is not None:
        _mark_chosen(top, chosen, chosen.cost_usd)
    elif chosen is not None and bottom is not None:
        _mark_chosen(bottom, chosen, 0.0)  # the "price unknown" row's height, not a cost
    axes = [a for a in (top, bottom) if a is not None]
    _draw_limits(axes, limits, top)
    _finish_plan_axes(axes, points, colours, limits)
    title = "gpuplan plan: cost vs time to train"
    figure.suptitle(title)
    return Picture(figure, title, _plan_table(points, {priced_at[i] for i in front}))


def _finish_plan_axes(axes: Sequence[Axes], points: Sequence[documents.PlanPoint],
                      colours: Mapping[str, Any], limits: documents.PlanLimits) -> None:
    deadline = [limits.deadline_hours] if limits.deadline_hours is not None else []
    if documents.wide_spread([p.hours for p in points] + deadline):
        _log_axis(axes[0].xaxis, axes[0].set_xscale)
    axes[-1].set_xlabel("time to train (hours; whiskers P10–P90)")
    priced_types = {p.gpu_type for p in points if p.cost_usd is not None}
    for gpu_type, colour in colours.items():
        if gpu_type not in priced_types:  # its colour appears only on the "price unknown" row
            axes[0].scatter([], [], color=colour, marker="x", label=f"{gpu_type} ({UNKNOWN_PRICE})")
    # Outside the axes: inside, it covers the cheap-and-fast corner people look at.
    axes[0].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)


def _log_axis(axis: Any, set_scale: Any) -> None:
    """A log scale labelled in plain numbers (2, 5, 10, 20), not powers of ten."""
    from matplotlib.ticker import FuncFormatter, LogLocator

    set_scale("log")
    axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    axis.set_minor_formatter(FuncFormatter(lambda *_: ""))


def _draw_phases(ax: Axes, rows: Sequence[documents.DeviceRow]) -> None:
    ys = range(len(rows))
    left = [0.0] * len(rows)
    for phase, colour in PHASE_COLOURS.items():
        widths = [dict(r.phases_ms)[phase] for r in rows]
        drawn = [(y, w, x) for y, w, x in zip(ys, widths, left, strict=True) if w > 0]
        if drawn:  # inference has no backward or optimizer: no empty segments, no legend entry
            ax.barh([d[0] for d in drawn], [d[1] for d in drawn], left=[d[2] for d in drawn],
                    color=colour, label=phase, height=0.7)
        left = [x + w for x, w in zip(left, widths, strict=True)]
    lo = [max(r.step_time_ms - r.p10_ms, 0.0) for r in rows]
    hi = [max(r.p90_ms - r.step_time_ms, 0.0) for r in rows]
    ax.errorbar([r.step_time_ms for r in rows], list(ys), xerr=[lo, hi], fmt="none", ecolor="k",
                elinewidth=0.8, capsize=2, label="P10–P90")
    ax.set_xlabel("step time on one GPU (ms)")
    _legend_above(ax)


def _draw_memory(ax: Axes, rows: Sequence[documents.DeviceRow]) -> None:
    from matplotlib import colormaps

    labels = list(dict.fromkeys(label for r in rows for label, _ in r.memory_parts_bytes))
    cmap = colormaps["Set2"]
    left = [0.0] * len(rows)
    for i, label in enumerate(labels):
        gib = [dict(r.memory_parts_bytes).get(label, 0) / GIB for r in rows]
        drawn = [(y, w, x) for y, (w, x) in enumerate(zip(gib, left, strict=True)) if w > 0]
        if drawn:
            ax.barh([d[0] for d in drawn], [d[1] for d in drawn], left=[d[2] for d in drawn],
                    color=cmap(i % cmap.N), label=label, height=0.7)
        left = [x + w for x, w in zip(left, gib, strict=True)]
    ys = range(len(rows))
    ax.barh(list(ys), [r.memory_available_bytes / GIB for r in rows], height=0.9,
            color="0.93", zorder=0)  # the device's memory as a pale background: the headroom
    ax.vlines([r.memory_available_bytes / GIB for r in rows], [y - 0.45 for y in ys],
              [y + 0.45 for y in ys], colors="k", lw=2, label="device memory")
    for y, r in enumerate(rows):
        if not r.fits:
            ax.annotate("does not fit", (r.memory_total_bytes / GIB, y), xytext=(4, -3),
                        textcoords="offset points", fontsize=7, color="tab:red")
    ax.set_xlabel("memory on one GPU (GiB)")
    _legend_above(ax)


def _legend_above(ax: Axes) -> None:
    # Above the axes, not inside: the longest bars and whiskers end where a legend would sit.
    ax.legend(fontsize=7, loc="lower left", bbox_to_anchor=(0.0, 1.0), ncols=4, frameon=False)


def _estimate_table(rows: Sequence[documents.DeviceRow]) -> Table:
    phases = [p for p in PHASE_COLOURS if any(dict(r.phases_ms)[p] > 0 for r in rows)]
    body = tuple(
        (r.device, *(f"{dict(r.phases_ms)[p]:.4g}" for p in phases), f"{r.step_time_ms:.4g}",
         f"{r.p10_ms:.4g}", f"{r.p90_ms:.4g}", f"{r.memory_total_bytes / GIB:.2f}",
         f"{r.memory_available_bytes / GIB:.2f}", "yes" if r.fits else "no")
        for r in rows)
    return Table(("device", *(f"{p} ms" for p in phases), "step ms", "P10 ms", "P90 ms",
                  "memory GiB", "device memory GiB", "fits"), body)


def estimate_figure(estimate_doc: Mapping[str, Any]) -> Picture:
    """Step time (forward/backward/optimizer, P10–P90) and memory parts against the device's
    memory, one bar per device of a `gpuplan estimate --json` document, fastest first."""
    check_available()
    rows = documents.device_rows(estimate_doc)
    figure = new_figure(12.0, 1.5 + 0.3 * len(rows))
    times, memory = figure.subplots(1, 2, sharey=True)
    _draw_phases(times, rows)
    _draw_memory(memory, rows)
    times.set_yticks(range(len(rows)),
                     [r.device if r.fits else f"{r.device} (does not fit)" for r in rows])
    times.invert_yaxis()  # fastest on top
    for ax in (times, memory):
        ax.grid(True, axis="x", alpha=0.3)
    title = f"gpuplan estimate: {documents.estimate_title(estimate_doc)}"
    figure.suptitle(title)
    return Picture(figure, title, _estimate_table(rows))
