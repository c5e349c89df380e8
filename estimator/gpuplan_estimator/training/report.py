"""The accuracy report of a bundle's latency models (`docs/latency-models.md`) from its manifest."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import numpy as np

TARGETS = {"random_mape_pct": 8.0, "random_p90_pct": 20.0, "loo_mape_pct": 15.0,
           "cpu_mape_pct": 10.0}


def report_markdown(manifest: Mapping[str, Any], *, today: str, command: str) -> str:
    """Tables of held-out accuracy per kernel and device from a bundle manifest (pure)."""
    lines = [
        "# Latency model accuracy", "",
        f"Date {today}; bundle commit `{manifest.get('commit', '')}`, created "
        f"{manifest.get('created', '')}; trained by `{manifest.get('command', '')}`; "
        f"report by `{command}`.", "",
        f"Data digest `{manifest.get('data_digest', '')}`, {manifest.get('rows', 0)} rows after "
        f"subsampling (settings {json.dumps(manifest.get('settings', {}), sort_keys=True)}).",
        "All numbers are on held-out rows only. Targets: random split MAPE ≤ "
        f"{TARGETS['random_mape_pct']} % and P90 APE ≤ {TARGETS['random_p90_pct']} %; "
        f"leave-one-GPU-out MAPE ≤ {TARGETS['loo_mape_pct']} %; CPU MAPE ≤ "
        f"{TARGETS['cpu_mape_pct']} %.", "",
        "## Summary", "",
        "| kernel | GPU random MAPE % | GPU random P90 APE % | GPU left out: mean / worst MAPE % "
        "| left out + probe: mean / worst MAPE % | CPU random MAPE / P90 % | targets met |",
        "|---|--:|--:|--:|--:|--:|---|",
        *summary_rows(manifest), "",
        "## Random split (20 % held out)", "",
        "| kernel | device | rows | MAPE % | P90 APE % | RMSE log |", "|---|---|--:|--:|--:|--:|",
    ]
    metrics: Mapping[str, Any] = manifest.get("metrics", {})
    for kernel, m in sorted(metrics.items()):
        platforms = m.get("random_split_by_platform", {})
        lines += [_row(kernel, f"**{kind}**", v) for kind, v in sorted(platforms.items())]
        # The one CPU device is its platform's total already (bold row above).
        lines += [_row(kernel, d, v) for d, v in sorted(m["random_split_by_device"].items())
                  if d not in platforms]
        cpu_backends = {b: v for b, v in m.get("random_split_by_backend", {}).items()
                        if b.endswith("-cpu")}
        if len(cpu_backends) > 1:  # one CPU measured with several backends: each on its own
            lines += [_row(kernel, f"cpu, {b}", v) for b, v in sorted(cpu_backends.items())]
    lines += ["", "## Leave one device out (trained on the others)", "",
              "| kernel | held-out device | rows | MAPE % | P90 APE % | RMSE log |",
              "|---|---|--:|--:|--:|--:|"]
    for kernel, m in sorted(metrics.items()):
        lines += [_row(kernel, d, v) for d, v in sorted(m.get("leave_one_device_out", {}).items())]
    lines += ["", "## Leave one device out, with a probe of the left-out device", "",
              "The transfer model of the table above, corrected per device and kernel by a log "
              "offset plus a bounded slope on log base_ms, fitted to measured / predicted over a "
              "few random rows of the left-out device (`TrainSettings.probe_rows`, its probe; "
              "scored on its other rows). This is what `gpuplan train` does for a GPU with fewer "
              "than `probe_max_rows` rows of a kernel, e.g. after a short `gpuplan bench` on a new"
              " GPU type. Not a spec-sheet-only number: the target above stays the table before "
              "this one.", "",
              "| kernel | held-out device | rows | MAPE % | P90 APE % | RMSE log |",
              "|---|---|--:|--:|--:|--:|"]
    for kernel, m in sorted(metrics.items()):
        lines += [_row(kernel, d, v)
                  for d, v in sorted(m.get("leave_one_device_out_probe", {}).items())]
    for backend, factors in sorted(manifest.get("backward_factors", {}).items()):
        lines += ["", f"## Backward factors, {backend} (`backward_factors`)", "",
                  "Measured backward (forward+backward minus forward, autograd) over the "
                  "backward the estimator derives in forward-kernel passes; median per family. "
                  "On a GPU priced by this backend, the convolution, batch-norm and pooling "
                  "factors scale the derived backward (`KernelFamily.backward_measured`); the "
                  "others, and every CPU backend's, are a check of the derivation only (see "
                  "`backward_factors`).", "",
                  "| family | factor |", "|---|--:|",
                  *[f"| {f} | {v:.3f} |" for f, v in sorted(factors.items())]]
    return "\n".join([*lines, "", METHOD_POINTER]) + "\n"


METHOD_DOC = "latency-method.md"
"""The hand-written method and findings, with their measured figures and commands, in docs/
beside the generated report (which links to it): the figures are facts of experiments, not of a
manifest, so they have one home there and none in code."""

METHOD_POINTER = (
    "## Method\n\nHow the models are fitted, and what was tried and not kept, with the measured "
    f"figures and their commands: [{METHOD_DOC}]({METHOD_DOC}).")


def summary_rows(manifest: Mapping[str, Any]) -> list[str]:
    """One line per kernel: headline numbers against `TARGETS` (GPU and CPU apart)."""
    rows = []
    for kernel, m in sorted(manifest.get("metrics", {}).items()):
        by_platform = m.get("random_split_by_platform", {})
        gpu, cpu = by_platform.get("gpu"), by_platform.get("cpu")
        loo = [v["mape_pct"] for v in m.get("leave_one_device_out", {}).values()]
        checks = []
        if gpu:
            checks.append(gpu["mape_pct"] <= TARGETS["random_mape_pct"]
                          and gpu["p90_ape_pct"] <= TARGETS["random_p90_pct"])
        if loo:
            checks.append(max(loo) <= TARGETS["loo_mape_pct"])
        if cpu:
            checks.append(cpu["mape_pct"] <= TARGETS["cpu_mape_pct"])
        g = f"{gpu['mape_pct']:.2f} | {gpu['p90_ape_pct']:.2f}" if gpu else "– | –"
        c = f"{cpu['mape_pct']:.1f} / {cpu['p90_ape_pct']:.1f}" if cpu else "–"
        probed = [v["mape_pct"] for v in m.get("leave_one_device_out_probe", {}).values()]
        loo_text = f"{np.mean(loo):.1f} / {max(loo):.1f}" if loo else "–"
        probe_text = f"{np.mean(probed):.1f} / {max(probed):.1f}" if probed else "–"
        rows.append(f"| {kernel} | {g} | {loo_text} | {probe_text} | {c} | "
                    f"{'yes' if all(checks) else 'no'} |")
    return rows


def _row(kernel: str, device: str, m: Mapping[str, float]) -> str:
    return (f"| {kernel} | {device} | {int(m['rows'])} | {m['mape_pct']:.2f} | "
            f"{m['p90_ape_pct']:.2f} | {m['rmse_log']:.4f} |")
