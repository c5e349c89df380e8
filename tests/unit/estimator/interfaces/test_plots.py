"""`--plot` pictures (issue #20): the pure reading and Pareto front, then real matplotlib figures
of plan and estimate documents made by the real planner and estimator, saved as PNG/SVG/HTML."""

from __future__ import annotations

import base64
import copy
import json
import math
import struct
import sys
import xml.etree.ElementTree as ET
from collections.abc import Callable
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from matplotlib.collections import PathCollection

from gpuplan_estimator import devices
from gpuplan_estimator.core import extras
from gpuplan_estimator.core.errors import GpuplanError, InvalidRequestError
from gpuplan_estimator.cost import roofline
from gpuplan_estimator.graph import examples
from gpuplan_estimator.interfaces import json_documents
from gpuplan_estimator.interfaces.cli import plotting
from gpuplan_estimator.interfaces.cli.plotting import documents, figures
from gpuplan_estimator.interfaces.http import wire
from gpuplan_estimator.planning import estimates
from gpuplan_estimator.step.decomposition import TrainingSettings
from gpuplan_testing.contexts import roofline_context

# Inventory labels as a cluster reports them; mi250 has no price in the catalog.
PRICED = ("NVIDIA-L4", "NVIDIA-H100-80GB-HBM3")
UNPRICED = "mi250"
GIB = 1024**3


# --- pure: the Pareto front ------------------------------------------------------------------

@pytest.mark.parametrize(("points", "front"), [
    ([], ()),
    ([(1.0, 1.0)], (0,)),
    # (3, 4) is slower and dearer than (2, 3); the rest trade time for cost.
    ([(1.0, 5.0), (2.0, 3.0), (3.0, 4.0), (4.0, 1.0)], (0, 1, 3)),
    ([(1.0, 2.0), (1.0, 1.0)], (1,)),  # same time: only the cheaper
    ([(2.0, 1.0), (1.0, 1.0)], (1,)),  # same cost: only the faster
    ([(1.0, 1.0), (2.0, 2.0), (1.0, 1.0)], (0, 2)),  # identical points: neither beats the other
    ([(5.0, 5.0), (1.0, 9.0), (9.0, 1.0), (6.0, 6.0)], (1, 0, 2)),  # fastest first
])
def test_pareto_front_keeps_exactly_the_points_nothing_beats(
        points: list[tuple[float, float]], front: tuple[int, ...]) -> None:
    assert plotting.pareto_front(points) == front


def _beats(a: tuple[float, float], b: tuple[float, float]) -> bool:
    return a[0] <= b[0] and a[1] <= b[1] and a != b


@given(st.lists(st.tuples(st.integers(1, 6), st.integers(1, 6)), max_size=12))
def test_pareto_front_matches_the_definition(raw: list[tuple[int, int]]) -> None:
    points = [(float(t), float(c)) for t, c in raw]
    front = plotting.pareto_front(points)
    expected = {i for i, p in enumerate(points) if not any(_beats(q, p) for q in points)}
    assert set(front) == expected and len(front) == len(set(front))
    assert [points[i] for i in front] == sorted(points[i] for i in front)


@pytest.mark.parametrize(("candidate", "cost"), [
    ({"cost_usd": 3.5}, 3.5),
    ({"cost_usd": 2}, 2.0),
    ({"cost_usd": None}, None),
    ({}, None),
    ({"cost_usd": math.nan}, None),
    ({"cost_usd": 0.0}, None),  # the planner's $0 for a GPU without a known price
    ({"cost_usd": 3.5, "price_known": False}, None),
    ({"cost_usd": True}, None),
])
def test_known_cost_never_reads_an_unknown_price_as_free(
        candidate: dict[str, Any], cost: float | None) -> None:
    assert documents.known_cost_usd(candidate) == cost


@pytest.mark.parametrize(("values", "wide"), [
    ([1.0, 9.9], False), ([1.0, 10.0], True), ([0.01, 5.0], True), ([3.0], False),
    ([0.0, 100.0], False),  # a log axis cannot show 0
])
def test_wide_spread(values: list[float], wide: bool) -> None:
    assert documents.wide_spread(values) is wide


# --- real documents --------------------------------------------------------------------------

def _plan_doc(**objective: Any) -> dict[str, Any]:
    """`gpuplan plan --json` of ResNet-50 over two priced GPU types and one without a price."""
    pools = [{"gpu_type": t, "gpus_per_node": 4, "nodes": 1, "free_gpus": 4}
             for t in (*PRICED, UNPRICED)]
    body = {
        "model_onnx_b64": base64.b64encode(
            examples.light_resnet50_path().read_bytes()).decode(),
        "training": {"batch_size": 64, "dataset_size": 100_000, "epochs": 1},
        "objective": {"prefer": "fastest", "max_gpus": 4, **objective},
        "inventory": pools,
    }
    doc = json_documents.plan_request_json(wire.parse_plan_request(body), roofline_context())
    return json.loads(json.dumps(doc))  # what the CLI prints and a user feeds back


def _estimate_doc(mode: str, batch: int, keys: tuple[str, ...]) -> dict[str, Any]:
    """`gpuplan estimate --json` of ResNet-50 on `keys` (roofline: fast, same document)."""
    catalog = devices.load_catalog()
    g = examples.resnet50(batch)
    settings = TrainingSettings(batch_size=batch, mode=mode, optimizer="adam")
    results = estimates.estimate(g, [catalog.resolve(k) for k in keys], settings,
                                 predictor=roofline.RooflinePredictor())
    doc = json_documents.estimate_json(g, results, settings, predictor_source="roofline")
    return json.loads(json.dumps(doc))


@pytest.fixture(scope="module")
def plan_doc() -> dict[str, Any]:
    assert not devices.load_catalog().resolve(UNPRICED).has_price  # else the test proves nothing
    return _plan_doc()


@pytest.fixture(scope="module")
def train_doc() -> dict[str, Any]:
    # At batch 192 ResNet-50 needs ~18 GiB: it fits the H100, not the T4.
    return _estimate_doc("train", 192, ("t4", "h100-sxm-80gb", "l4"))


@pytest.fixture(scope="module")
def inference_doc() -> dict[str, Any]:
    return _estimate_doc("inference", 8, ("t4", "h100-sxm-80gb"))


def _offsets(ax: Any) -> set[tuple[float, float]]:
    """Every scatter point drawn on `ax`, rounded (the chosen plan's ring repeats its point)."""
    return {(round(float(x), 9), round(float(y), 9))
            for c in ax.collections if isinstance(c, PathCollection) for x, y in c.get_offsets()}


def _legend(ax: Any) -> list[str]:
    return [t.get_text() for t in ax.get_legend().get_texts()]


# --- the plan picture -----------------------------------------------------------------------

def test_unknown_prices_get_their_own_row_and_are_never_drawn_at_zero(
        plan_doc: dict[str, Any]) -> None:
    candidates = plan_doc["candidates"]
    priced = [c for c in candidates if c["gpu_type"] in PRICED]
    unpriced = [c for c in candidates if c["gpu_type"] == UNPRICED]
    assert priced and unpriced and all(c["cost_usd"] is None for c in unpriced)
    picture = plotting.plan_figure(plan_doc)
    cost_ax, unknown_ax = picture.figure.axes
    assert cost_ax.get_ylabel() == "cost (USD)"
    drawn = _offsets(cost_ax)
    assert all(y > 0 for _, y in drawn)
    assert {(round(c["estimated_seconds"] / 3600, 9), round(c["cost_usd"], 9))
            for c in priced} <= drawn
    assert [t.get_text() for t in unknown_ax.get_yticklabels()] == ["price unknown"]
    assert {x for x, _ in _offsets(unknown_ax)} == {
        round(c["estimated_seconds"] / 3600, 9) for c in unpriced}
    assert f"{UNPRICED} (price unknown)" in _legend(cost_ax)
    unknown_rows = [r for r in picture.table.rows if r[0] == UNPRICED]
    assert len(unknown_rows) == len(unpriced)
    assert all(r[4] == "price unknown" for r in unknown_rows)


def test_a_plan_with_no_known_price_draws_only_the_price_unknown_row(
        plan_doc: dict[str, Any]) -> None:
    unpriced = [c for c in plan_doc["candidates"] if c["gpu_type"] == UNPRICED]
    doc = {**plan_doc, "plan": unpriced[-1], "candidates": unpriced}
    picture = plotting.plan_figure(doc)
    (ax,) = picture.figure.axes
    assert [t.get_text() for t in ax.get_yticklabels()] == ["price unknown"]
    assert ax.get_ylabel() == ""
    (ring,) = [c for c in ax.collections if c.get_label() == "chosen plan"]
    assert ring.get_offsets()[0][0] == pytest.approx(unpriced[-1]["estimated_seconds"] / 3600)
    assert any("price unknown" in t.get_text() for t in ax.texts if t.get_text().startswith("ch"))


def test_the_chosen_plan_is_ringed_and_labelled(plan_doc: dict[str, Any]) -> None:
    chosen = plan_doc["plan"]
    picture = plotting.plan_figure(plan_doc)
    texts = [t.get_text() for ax in picture.figure.axes for t in ax.texts]
    assert any(t.startswith(f"chosen: {chosen['gpu_count']} × {chosen['gpu_type']}")
               for t in texts)
    rings = [c for ax in picture.figure.axes for c in ax.collections
             if c.get_label() == "chosen plan"]
    assert len(rings) == 1
    (x, _), = rings[0].get_offsets()
    assert x == pytest.approx(chosen["estimated_seconds"] / 3600)
    assert [r[6] for r in picture.table.rows].count("yes") == 1


def test_the_pareto_front_is_a_step_line_through_the_non_dominated_candidates(
        plan_doc: dict[str, Any]) -> None:
    picture = plotting.plan_figure(plan_doc)
    cost_ax = picture.figure.axes[0]
    (step,) = [ln for ln in cost_ax.lines if ln.get_label().startswith("Pareto front")]
    priced = [c for c in plan_doc["candidates"] if c["gpu_type"] in PRICED]
    points = [(c["estimated_seconds"] / 3600, c["cost_usd"]) for c in priced]
    front = plotting.pareto_front(points)
    assert 1 <= len(front) < len(priced)  # some candidates are dominated: the test can fail
    assert list(step.get_xdata()) == pytest.approx([points[i][0] for i in front])
    assert list(step.get_ydata()) == pytest.approx([points[i][1] for i in front])
    assert step.get_drawstyle() == "steps-post"
    assert sum(r[5] == "yes" for r in picture.table.rows) == len(front)


def _limit_lines(picture: figures.Picture) -> dict[str, list[Any]]:
    lines: dict[str, list[Any]] = {}
    for ax in picture.figure.axes:
        for ln in ax.lines:
            lines.setdefault(ln.get_label(), []).append(ln)
    return lines


def test_deadline_and_budget_come_from_the_arguments_or_the_documents_objective(
        plan_doc: dict[str, Any]) -> None:
    plain = _limit_lines(plotting.plan_figure(plan_doc))
    assert "deadline" not in plain and "budget" not in plain
    lines = _limit_lines(plotting.plan_figure(plan_doc, deadline_seconds=7200, budget_usd=30))
    assert list(lines["deadline"][0].get_xdata()) == [2.0, 2.0]
    assert list(lines["budget"][0].get_ydata()) == [30.0, 30.0]
    with_objective = {**plan_doc, "objective": {"deadline_seconds": 3600, "budget_usd": None}}
    lines = _limit_lines(plotting.plan_figure(with_objective))
    assert list(lines["deadline"][0].get_xdata()) == [1.0, 1.0] and "budget" not in lines
    with pytest.raises(InvalidRequestError) as err:
        plotting.plan_figure(plan_doc, deadline_seconds=-1)
    assert err.value.field == "objective.deadline_seconds"


def test_a_plan_doc_with_added_fields_draws_and_one_missing_a_needed_key_says_which(
        plan_doc: dict[str, Any]) -> None:
    richer = copy.deepcopy(plan_doc)
    richer["schema_version"] = 2
    for c in richer["candidates"]:
        c["throughput_samples_per_s"] = 1.0
    assert len(plotting.plan_figure(richer).table.rows) == len(plan_doc["candidates"])
    broken = copy.deepcopy(plan_doc)
    del broken["candidates"][1]["estimated_seconds"]
    with pytest.raises(InvalidRequestError) as err:
        plotting.plan_figure(broken)
    assert err.value.field == "candidates[1].estimated_seconds"
    assert "missing" in str(err.value)
    with pytest.raises(InvalidRequestError, match="candidates"):
        plotting.plan_figure({"plan": None, "candidates": []})


# --- the estimate picture -------------------------------------------------------------------

def _bars(ax: Any) -> list[Any]:
    return [p for p in ax.patches if p.get_width() > 0]


def test_estimate_bars_split_the_step_fastest_first_and_mark_what_does_not_fit(
        train_doc: dict[str, Any]) -> None:
    picture = plotting.estimate_figure(train_doc)
    times_ax, memory_ax = picture.figure.axes
    by_speed = sorted(train_doc["devices"], key=lambda d: d["step_time_ms"])
    labels = [t.get_text() for t in times_ax.get_yticklabels()]
    fits = {d["device"]: d["fits"] for d in by_speed}
    assert fits == {"h100-sxm-80gb": True, "l4": True, "t4": False}
    assert labels == [d["device"] + ("" if d["fits"] else " (does not fit)") for d in by_speed]
    assert _legend(times_ax) == ["forward", "backward", "optimizer", "P10–P90"]
    assert len(_bars(times_ax)) == 3 * len(by_speed)
    ends = {round(p.get_y() + p.get_height() / 2): p.get_x() + p.get_width()
            for p in _bars(times_ax)}
    assert [ends[i] for i in range(3)] == pytest.approx([d["step_time_ms"] for d in by_speed])
    capacity = [c for c in memory_ax.collections if c.get_label() == "device memory"]
    xs = sorted({round(float(s[0][0]), 6) for s in capacity[0].get_segments()})
    assert xs == sorted({round(d["memory_available_bytes"] / GIB, 6) for d in by_speed})
    assert [t.get_text() for t in memory_ax.texts] == ["does not fit"]
    assert [r[-1] for r in picture.table.rows] == ["yes" if d["fits"] else "no"
                                                   for d in by_speed]


def test_an_inference_estimate_draws_no_backward_or_optimizer_segments(
        inference_doc: dict[str, Any]) -> None:
    assert all(d["backward_ms"] == 0 and d["optimizer_ms"] == 0 for d in inference_doc["devices"])
    picture = plotting.estimate_figure(inference_doc)
    times_ax, memory_ax = picture.figure.axes
    assert _legend(times_ax) == ["forward", "P10–P90"]
    assert len(_bars(times_ax)) == len(inference_doc["devices"])
    assert "gradients" not in _legend(memory_ax)
    assert "optimizer state" not in _legend(memory_ax)
    assert "backward ms" not in picture.table.columns
    assert "inference" in picture.title


def test_an_estimate_missing_a_memory_part_names_its_path(train_doc: dict[str, Any]) -> None:
    broken = copy.deepcopy(train_doc)
    del broken["devices"][2]["memory"]["activations_bytes"]
    with pytest.raises(InvalidRequestError) as err:
        plotting.estimate_figure(broken)
    assert err.value.field == "devices[2].memory.activations_bytes"


# --- files ----------------------------------------------------------------------------------

class _Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.links: list[str] = []
        self.cells: list[str] = []
        self._in_cell = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        self.links += [v or "" for k, v in attrs if k in ("src", "href", "xlink:href")]
        self._in_cell = tag == "td"

    def handle_data(self, data: str) -> None:
        if self._in_cell:
            self.cells.append(data)
            self._in_cell = False


def test_png_has_the_signature_and_the_figure_size_at_150_dpi(
        plan_doc: dict[str, Any], tmp_path: Path) -> None:
    picture = plotting.plan_figure(plan_doc)
    path = plotting.save(picture, tmp_path / "plan.PNG")  # the extension's case does not matter
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    w_in, h_in = picture.figure.get_size_inches()
    assert (width, height) == (round(w_in * 150), round(h_in * 150))
    assert 10_000 < len(data) < 2_000_000


def test_svg_parses_as_xml(train_doc: dict[str, Any], tmp_path: Path) -> None:
    path = plotting.save(plotting.estimate_figure(train_doc), tmp_path / "estimate.svg")
    root = ET.parse(path).getroot()
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    assert len(list(root.iter())) > 100


def test_html_is_one_self_contained_page_with_the_figure_and_its_numbers(
        plan_doc: dict[str, Any], tmp_path: Path) -> None:
    path = plotting.save(plotting.plan_figure(plan_doc), tmp_path / "plan.html")
    text = path.read_text(encoding="utf-8")
    assert 'src="http' not in text and "<script" not in text and "<link" not in text
    parser = _Tags()
    parser.feed(text)
    assert "script" not in parser.tags and "svg" in parser.tags and "table" in parser.tags
    assert all(not link.startswith(("http", "//")) for link in parser.links)
    assert parser.tags.count("tr") == 1 + len(plan_doc["candidates"])  # header + one each
    for c in plan_doc["candidates"]:
        assert c["gpu_type"] in parser.cells
    assert "<title>gpuplan plan: cost vs time to train</title>" in text


@pytest.mark.parametrize("name", ["plan.jpg", "plan.pdf", "plan", "plan.html.txt"])
def test_another_extension_is_refused_naming_the_flag_and_the_formats(
        plan_doc: dict[str, Any], tmp_path: Path, name: str) -> None:
    with pytest.raises(InvalidRequestError) as err:
        plotting.save(plotting.plan_figure(plan_doc), tmp_path / name)
    assert err.value.field == "--plot"
    assert ".png, .svg, .html" in err.value.message
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("suffix", plotting.FORMATS)
def test_an_unwritable_path_raises_the_oserror(
        inference_doc: dict[str, Any], tmp_path: Path, suffix: str) -> None:
    with pytest.raises(FileNotFoundError):
        plotting.save(plotting.estimate_figure(inference_doc), tmp_path / "no" / f"x{suffix}")


@pytest.mark.parametrize("draw", [
    lambda: plotting.plan_figure({"plan": None, "candidates": [{}]}),
    lambda: plotting.estimate_figure({"devices": [{}]}),
])
def test_without_matplotlib_the_error_names_the_plot_extra(
        monkeypatch: pytest.MonkeyPatch, draw: Callable[[], object]) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)  # as if not installed
    for check in (plotting.check_available, draw):  # before reading the (here empty) document
        with pytest.raises(extras.MissingExtraError) as err:
            check()
        assert isinstance(err.value, GpuplanError)
        assert "gpuplan[plot]" in str(err.value)


def test_every_plan_picture_lists_each_gpu_type_once_in_its_legend(
        plan_doc: dict[str, Any]) -> None:
    legend = _legend(plotting.plan_figure(plan_doc).figure.axes[0])
    names = [e.removesuffix(" (price unknown)") for e in legend]
    types = {c["gpu_type"] for c in plan_doc["candidates"]}
    assert sorted(n for n in names if n in types) == sorted(types)  # each once


def test_every_catalog_gpu_type_gets_its_own_colour() -> None:
    """#35: with the whole catalog (22 types) tab20 alone repeated colours."""
    keys = [d.key for d in devices.load_catalog().devices]
    assert len(keys) > 20
    colours = figures._type_colours(keys)
    assert len(set(colours.values())) == len(keys)


def test_the_chosen_callout_stays_inside_its_axes_clear_of_the_legend(
        plan_doc: dict[str, Any]) -> None:
    picture = plotting.plan_figure(plan_doc)
    figure = picture.figure
    renderer = figure.canvas.get_renderer()  # type: ignore[attr-defined]
    figure.draw(renderer)  # lays out the constrained figure: boxes are final
    legend = figure.axes[0].get_legend().get_window_extent(renderer)
    [callout] = [t for ax in figure.axes for t in ax.texts if t.get_text().startswith("chosen")]
    box = callout.get_bbox_patch().get_window_extent(renderer)
    assert not box.overlaps(legend)
    assert callout.axes is not None
    assert callout.axes.get_window_extent(renderer).contains(box.x0 + 1, box.y0 + 1)
