"""The accuracy page for users (``docs/accuracy.md``): headline numbers first, then details.

Pure: a `report.Report` in, Markdown out. Paths of the machine that measured are rewritten
(`portable`), so the page reads the same wherever it was generated.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from gpuplan_estimator.evaluation import report
from gpuplan_estimator.evaluation.cpu_loop import CpuResult
from gpuplan_estimator.evaluation.gpu_labels import RowResult
from gpuplan_estimator.evaluation.report import AccuracyMetrics, Report

LEARNED = "lightgbm"
CALIBRATED = "lightgbm+calibration"
NOMINAL_COVERAGE_PCT = 80  # P10–P90 holds 80 % of outcomes if the quantiles are right
RESIDUALS_PNG = "accuracy-residuals.png"
COVERAGE_PNG = "accuracy-coverage.png"
# An absolute path (optionally inside a sqlite:/// URL) that no root rewrote: keep its last part.
_ABSOLUTE_PATH = re.compile(r"(sqlite:///)?(?<![\w.])/(?:[\w.+-]+/)+([\w.+-]+)")


def portable(text: str, roots: Mapping[str, str]) -> str:
    """`text` with each root prefix replaced, then any other absolute path cut to its name."""
    for prefix, replacement in roots.items():
        text = text.replace(prefix, replacement)
    return _ABSOLUTE_PATH.sub(lambda m: (m.group(1) or "") + m.group(2), text)


def gpu_names(results: Sequence[RowResult]) -> dict[str, str]:
    """Catalog key → the GPU's name as the labels spell it (underscores read as spaces)."""
    return {r.device: r.row.gpu.replace("_", " ") for r in results}


def _pct(m: AccuracyMetrics | None, field: str, digits: int = 1) -> str:
    return "–" if m is None else f"{getattr(m, field):.{digits}f}"


def headline_table(rep: Report) -> str:
    """Per GPU: MAPE, P90 APE and P10–P90 coverage of the shipped models and left out."""
    dev = report.summarise_by_device([r for r in rep.gpu if r.predictor == LEARNED])
    logo = report.summarise_by_device([r for r in rep.logo if r.predictor == LEARNED])
    names = {**gpu_names(rep.gpu), "all": "all GPUs"}
    lines = ["| GPU | rows | MAPE % | P90 APE % | in P10–P90 % | MAPE %, GPU left out | "
             "P90 APE %, GPU left out | in P10–P90 %, GPU left out |",
             "|---|--:|--:|--:|--:|--:|--:|--:|"]
    keys = sorted({d for _, d in dev}, key=lambda d: (d == "all", d))
    for d in keys:
        m, o = dev[(LEARNED, d)], logo.get((LEARNED, d))
        lines.append(f"| {names.get(d, d)} | {m.rows} | {_pct(m, 'mape_pct')} | "
                     f"{_pct(m, 'p90_ape_pct')} | {_pct(m, 'coverage_pct', 0)} | "
                     f"{_pct(o, 'mape_pct')} | {_pct(o, 'p90_ape_pct')} | "
                     f"{_pct(o, 'coverage_pct', 0)} |")
    return "\n".join(lines)


def _headline(rep: Report) -> list[str]:
    if not any(r.predictor == LEARNED for r in rep.gpu):
        return ["GPU rows were not evaluated with the learned models in this run."]
    all_dev = report.summarise_by_device(rep.gpu)
    learned = all_dev[(LEARNED, "all")]
    cal = all_dev.get((CALIBRATED, "all"))
    out = [
        "Whole-model step time on GPUs, predicted by the shipped latency models (LightGBM) and "
        "compared with measured iterations. *MAPE* is the mean absolute percentage error, *P90 "
        "APE* the error 90 % of rows stay under, *in P10–P90* the share of rows whose "
        f"measurement fell inside the predicted interval (nominal {NOMINAL_COVERAGE_PCT} %). "
        "*GPU left out*: the latency models refitted without any op measurement of that GPU, "
        "i.e. what to expect on a GPU type gpuplan has only the spec sheet of.",
        "",
        headline_table(rep),
        "",
        f"- Over all {learned.rows} GPU rows: MAPE {learned.mape_pct:.1f} %, P90 APE "
        f"{learned.p90_ape_pct:.1f} %, {learned.coverage_pct:.0f} % inside P10–P90.",
    ]
    if cal is not None:
        out.append(f"- Corrected from the measured outcomes of *other* models (what the service "
                   f"does once jobs report back, `{CALIBRATED}`): MAPE {cal.mape_pct:.1f} %, "
                   f"P90 APE {cal.p90_ape_pct:.1f} %, {cal.coverage_pct:.0f} % inside P10–P90.")
    for mode, m in _cpu_overall(rep.cpu).items():
        out.append(f"- CPU closed loop, {mode} ({m.rows} rows on the host below): MAPE "
                   f"{m.mape_pct:.1f} %, P90 APE {m.p90_ape_pct:.1f} %, {m.coverage_pct:.0f} % "
                   "inside P10–P90.")
    return out


def _cpu_overall(results: Sequence[CpuResult]) -> dict[str, AccuracyMetrics]:
    summary = report.summarise_cpu(results)
    return {k.removesuffix(" all"): v for k, v in summary.items() if k.endswith(" all")}


def _measured(rep: Report, roots: Mapping[str, str]) -> list[str]:
    rows = [*rep.gpu, *rep.logo]
    names = gpu_names(rows)
    gpus = ", ".join(f"{names[d]} ({sum(r.device == d for r in rep.gpu if r.predictor == LEARNED)}"
                     " rows)" for d in sorted(names))
    models: dict[str, set[tuple[int, int]]] = {}
    for r in rep.gpu:
        models.setdefault(r.row.model, set()).add((r.row.seq_len, r.row.batch))
    model_text = "; ".join(
        f"{m} (sequence {', '.join(sorted({str(s) for s, _ in v}))}, batch "
        f"{', '.join(str(b) for b in sorted({b for _, b in v}))})"
        for m, v in sorted(models.items()))
    modes = sorted({report.group_key(r)[2] for r in rep.gpu})
    out = [
        f"- **GPUs**: {gpus}.",
        f"- **Models** (Hugging Face transformers, rebuilt structure-only from their public "
        f"configs): {model_text}.",
        f"- **Modes**: {', '.join(modes)}. Inference rows compare the forward time; training rows "
        "forward + backward (the labels exclude the optimizer step). `/compiled` rows are "
        "`torch.compile` runs.",
        "- **Labels** (the measured side): the *model-labels* data set in the shared data "
        "directory: whole-model iteration times of eager PyTorch 2.1 at fp32 on one GPU, from "
        "the NeuSight artifact (Lee, Phanishayee, Mahajan, ASPLOS 2025; MIT licence). These "
        "GPUs are also in the op data the models learn from, so this is a development set; "
        "leave-one-GPU-out is the held-out view.",
        f"- **Latency models**: {portable(rep.bundle, roots)}. They learn from the *gpu-ops* data "
        "set (single-operator latencies on the same GPUs, same source) and the CPU op "
        "measurements shipped in the package.",
    ]
    if rep.host is not None:
        out.append(f"- **CPU closed loop**: {rep.host.name}, {rep.host.cores} cores "
                   f"(calibrated {rep.host.fp32_gflops:.0f} GFLOP/s fp32, "
                   f"{rep.host.mem_bandwidth_gbps:.1f} GB/s): the ONNX light models timed with "
                   "onnxruntime (inference) and, converted to PyTorch, one SGD training step.")
    for m, why in sorted({(s.row.model, s.reason) for s in rep.skipped}):
        count = sum(s.row.model == m for s in rep.skipped)
        out.append(f"- **Not evaluated**: {m}, {count} label rows ({why}).")
    return out


def _noise(rep: Report) -> list[str]:
    if not rep.cpu_models:
        return []
    drift = " and ".join(f"{m.speed_ratio:.3f}x ({m.backend}, {m.reference_rows} op rows)"
                         for m in rep.cpu_models if m.reference_rows)
    if not drift:
        return []
    return ["## Noise", "",
            "CPU timings drift on a shared host: just before the CPU loop, re-timed stored op "
            f"rows ran at {drift} their stored latency; CPU predictions were scaled by that. "
            "Read CPU differences of 10–20 % between two runs as noise. GPU labels are fixed "
            "measurements: GPU numbers change only with the code or the models.", ""]


def _reproduce(rep: Report, roots: Mapping[str, str], json_name: str) -> list[str]:
    lines = ["## How to reproduce", "",
             "From a source checkout with the shared data beside it (`make install`):", "",
             "```sh",
             *([f"{portable(rep.measured.command, roots)}   # measure the GPU views, keep "
                "the saved CPU loop",
                f"{portable(rep.cpu_measured.command, roots)}   # measure everything, CPU "
                "loop included (its bench is resumable)"] if rep.cpu_measured is not None else
               [f"{portable(rep.measured.command, roots)}   # measure (the CPU bench is "
                "resumable)"]),
             "gpuplan eval --no-cpu   # GPU rows and leave-one-GPU-out only: no CPU timing",
             f"gpuplan eval --from-json docs/{json_name}   # re-render this page and its "
             "pictures without measuring",
             "```", "",
             "## Provenance", "",
             f"- Numbers measured {rep.measured.created} at commit "
             f"`{rep.measured.commit or 'unknown'}` by `{portable(rep.measured.command, roots)}`."]
    if rep.cpu_measured is not None:
        lines.append(f"- CPU closed loop measured {rep.cpu_measured.created} at commit "
                     f"`{rep.cpu_measured.commit or 'unknown'}` by "
                     f"`{portable(rep.cpu_measured.command, roots)}`, carried over unchanged "
                     "(`--cpu-from`).")
    if rep.rendered is not None:
        lines.append(f"- Page rendered {rep.rendered.created} at commit "
                     f"`{rep.rendered.commit or 'unknown'}` by "
                     f"`{portable(rep.rendered.command, roots)}`.")
    lines.append(f"- Every row, predicted and measured, is in [`{json_name}`]({json_name}).")
    return [*lines, ""]


def _table(summary: Mapping[tuple[str, str, str], AccuracyMetrics], predictors: Sequence[str],
           names: Mapping[str, str]) -> str:
    lines = ["| GPU | mode | rows | " + " | ".join(
        f"{p} MAPE % | {p} P90 % | {p} in P10–P90 %" for p in predictors) + " |",
        "|---|---|--:|" + "--:|" * (3 * len(predictors))]
    keys = sorted({(d, m) for (_, d, m) in summary}, key=lambda k: (k[0] == "all", k))
    for d, m in keys:
        cells, rows = [], 0
        for p in predictors:
            s = summary.get((p, d, m))
            rows = rows or (s.rows if s else 0)
            cells += [_pct(s, "mape_pct"), _pct(s, "p90_ape_pct"), _pct(s, "coverage_pct", 0)]
        lines.append(f"| {names.get(d, d)} | {m} | {rows} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _rows_table(results: Sequence[RowResult], predictors: Sequence[str],
                names: Mapping[str, str]) -> str:
    by_row: dict[Any, dict[str, RowResult]] = {}
    for r in results:
        by_row.setdefault(r.row, {})[r.predictor] = r
    lines = ["| GPU | model | mode | seq | batch | measured ms | " +
             " | ".join(f"{p} ms (err %)" for p in predictors) + " |",
             "|---|---|---|--:|--:|--:|" + "--:|" * len(predictors)]
    for row, preds in by_row.items():
        first = next(iter(preds.values()))
        cells = [f"{preds[p].predicted_ms:.1f} "
                 f"({report.signed_error_pct(preds[p].predicted_ms, row.measured_ms):+.1f})"
                 if p in preds else "–" for p in predictors]
        lines.append(f"| {names.get(first.device, first.device)} | {row.model} | "
                     f"{report.group_key(first)[2]} | {row.seq_len} | {row.batch} | "
                     f"{row.measured_ms:.1f} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _cpu_table(results: Sequence[CpuResult]) -> str:
    lines = ["| model | mode | batch | main predictor | predicted ms | P10–P90 ms | measured ms "
             "| err % |", "|---|---|--:|---|--:|--:|--:|--:|"]
    for r in results:
        error_pct = report.signed_error_pct(r.predicted_ms, r.measured_ms)
        lines.append(f"| {r.model} | {r.mode} | {r.batch} | {r.predictor} | "
                     f"{r.predicted_ms:.1f} | {r.p10_ms:.1f}–{r.p90_ms:.1f} | "
                     f"{r.measured_ms:.1f} | {error_pct:+.1f} |")
    return "\n".join(lines)


def predictor_order(name: str) -> tuple[int, str]:
    """Sort key: roofline, lightgbm, calibrated, probed, then anything else by name."""
    order = {"roofline": 0, LEARNED: 1, CALIBRATED: 2, "lightgbm+probe": 3}
    return order.get(name, 9), name


PUBLISHED_RUNS_HEADING = "## Published multi-GPU runs"
PUBLISHED_RUNS_INTRO = (
    "Throughput of published multi-GPU training runs (MosaicML LLM Foundry's MPT benchmarks "
    "on 8 A100-80GB or H100; Megatron-LM's Table 1, Narayanan et al. 2021, on 32 to 1536 "
    "A100-80GB), each estimated by its named layout exactly as `gpuplan estimate --gpus` "
    "estimates a user's (`planning.named_layouts`), against the published tokens/s per GPU "
    "(and Megatron's TFLOP/s per GPU). Sources, setup and caveats: "
    "[published-runs.md](published-runs.md); both are written by `python -m "
    "gpuplan_estimator.evaluation.published_runs --write docs/published-runs.md "
    "--accuracy-page docs/accuracy.md`, which `gpuplan eval` does not run (the table is kept "
    "when it rewrites this page).")
PUBLISHED_TABLE_PENDING = "(not computed yet: run the command above)"


def published_runs_section(table: str | None) -> tuple[str, ...]:
    """The section with the published-run comparison (`evaluation.published_runs`)."""
    return (PUBLISHED_RUNS_HEADING, "", PUBLISHED_RUNS_INTRO, "",
            table or PUBLISHED_TABLE_PENDING, "")


def _published_span(page: str) -> tuple[int, int] | None:
    """Where the published-runs section starts and the next section starts, in `page`."""
    start = page.find(PUBLISHED_RUNS_HEADING + "\n")
    if start < 0:
        return None
    end = page.find("\n## ", start + len(PUBLISHED_RUNS_HEADING))
    return start, (len(page) if end < 0 else end + 1)


def published_table_of(page: str) -> str | None:
    """The comparison table `page`'s published-runs section carries, if any: what a rewrite
    of the page keeps."""
    span = _published_span(page)
    if span is None:
        return None
    body = page[span[0]:span[1]].split("\n\n", 2)
    table = body[2].strip() if len(body) == 3 else ""
    return None if table in ("", PUBLISHED_TABLE_PENDING) else table


def with_published_table(page: str, table: str) -> str:
    """`page` with its published-runs section carrying `table`."""
    span = _published_span(page)
    if span is None:
        raise ValueError(f"no {PUBLISHED_RUNS_HEADING!r} section in the page")
    return page[:span[0]] + "\n".join(published_runs_section(table)) + "\n" + page[span[1]:]


def to_markdown(rep: Report, *, roots: Mapping[str, str], json_name: str = "accuracy.json",
                residuals_png: str = RESIDUALS_PNG, coverage_png: str = COVERAGE_PNG,
                published_table: str | None = None) -> str:
    """The accuracy page: headline, pictures, what was measured, noise, how to reproduce,
    provenance, then the detailed tables and method notes."""
    names = gpu_names([*rep.gpu, *rep.logo])
    gpu_preds = sorted({r.predictor for r in rep.gpu}, key=predictor_order)
    logo_preds = sorted({r.predictor for r in rep.logo}, key=predictor_order)
    cpu_lines = [f"- {k}: MAPE {m.mape_pct:.1f} %, P90 APE {m.p90_ape_pct:.1f} %, in P10–P90 "
                 f"{m.coverage_pct:.0f} % ({m.rows} rows)"
                 for k, m in report.summarise_cpu(rep.cpu).items()]
    parts = [
        "# How accurate are gpuplan's estimates?", "",
        *_headline(rep), "",
        f"![Signed error per model and GPU, with ±10 % and ±30 % bands]({residuals_png})", "",
        "*Signed error* = predicted / measured − 1 for every label row: above zero the estimate "
        "is too slow, below too fast. Each dot is one (model, sequence, batch) row.", "",
        f"![Share of rows inside the predicted P10–P90 interval per GPU]({coverage_png})", "",
        "## What was measured", "", *_measured(rep, roots), "",
        *_noise(rep),
        *_reproduce(rep, roots, json_name),
        *published_runs_section(published_table),
        "## Details", "",
        "### GPU, by mode", "",
        _table(report.summarise(rep.gpu), gpu_preds, names) if rep.gpu else "(not run)", "",
        "`roofline` is the spec-sheet bound without learned models (it has no interval); "
        f"`{CALIBRATED}` corrects each row only from the outcomes of other models.", "",
        "### Leave one GPU out, by mode", "",
        _table(report.summarise(rep.logo), logo_preds, names) if rep.logo else "(not run)", "",
        "### CPU closed loop", "",
        *(cpu_lines or ["(not run)"]), "",
        _cpu_table(rep.cpu) if rep.cpu else "", "",
        "### Every GPU row", "",
        _rows_table(rep.gpu, gpu_preds, names) if rep.gpu else "(not run)", "",
        "### Method notes", "",
        *[f"- {portable(n, roots)}" for n in rep.notes], "",
    ]
    return "\n".join(parts)
