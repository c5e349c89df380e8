"""What `gpuplan eval` measured: accuracy summaries, the report record and its JSON form.

Every summary carries MAPE and P90 APE together (the project's rule) and the share of rows
whose measurement fell inside the predicted P10–P90 interval. The JSON document
(``docs/accuracy.json``) holds every row, so the page and its pictures can be rendered again
from it without measuring (`from_json`, ``gpuplan eval --from-json``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from gpuplan_estimator.core import errors
from gpuplan_estimator.evaluation.cpu_loop import CpuResult
from gpuplan_estimator.evaluation.gpu_labels import LabelRow, RowResult, Skipped


@dataclass(frozen=True)
class AccuracyMetrics:
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


def metrics(apes: Sequence[float], covered: Sequence[bool]) -> AccuracyMetrics:
    """MAPE, P90 APE (linear interpolation) and interval coverage, in percent."""
    if not apes:
        raise ValueError("no rows to summarise")
    a = np.asarray(apes, dtype=np.float64)
    return AccuracyMetrics(len(a), float(100 * a.mean()), float(100 * np.quantile(a, 0.9)),
                   float(100 * np.mean(np.asarray(covered, dtype=bool))))


def group_key(r: RowResult) -> tuple[str, str, str]:
    """(predictor, device, mode) with torch.compile rows as their own mode."""
    return r.predictor, r.device, r.row.mode + ("/compiled" if r.row.fused else "")


def summarise(results: Iterable[RowResult]) -> dict[tuple[str, str, str], AccuracyMetrics]:
    """Per (predictor, device, mode) plus (predictor, "all", mode)."""
    groups: dict[tuple[str, str, str], list[RowResult]] = {}
    for r in results:
        p, d, m = group_key(r)
        groups.setdefault((p, d, m), []).append(r)
        groups.setdefault((p, "all", m), []).append(r)
    return {k: metrics([r.ape for r in v], [r.covered for r in v])
            for k, v in sorted(groups.items())}


def summarise_by_device(results: Iterable[RowResult]) -> dict[tuple[str, str], AccuracyMetrics]:
    """Per (predictor, device) over every mode, plus (predictor, "all")."""
    groups: dict[tuple[str, str], list[RowResult]] = {}
    for r in results:
        groups.setdefault((r.predictor, r.device), []).append(r)
        groups.setdefault((r.predictor, "all"), []).append(r)
    return {k: metrics([r.ape for r in v], [r.covered for r in v])
            for k, v in sorted(groups.items())}


def signed_error_pct(predicted_ms: float, measured_ms: float) -> float:
    """(predicted / measured - 1) in percent: positive when the prediction is too slow."""
    return 100.0 * (predicted_ms / measured_ms - 1.0)


def summarise_cpu(results: Sequence[CpuResult]) -> dict[str, AccuracyMetrics]:
    """Per mode and batch, per mode, and over all rows of that mode."""
    out: dict[str, AccuracyMetrics] = {}
    for mode in sorted({r.mode for r in results}):
        rows = [r for r in results if r.mode == mode]
        for b in sorted({r.batch for r in rows}):
            picked = [r for r in rows if r.batch == b]
            out[f"{mode} batch {b}"] = metrics([r.ape for r in picked],
                                               [r.covered for r in picked])
        out[f"{mode} all"] = metrics([r.ape for r in rows], [r.covered for r in rows])
    return out


SCHEMA_VERSION = 2
"""2: label fields on every row, structured host and CPU-model provenance, `rendered`."""


@dataclass(frozen=True)
class Provenance:
    """When, at which commit and by which command a set of numbers was produced."""

    created: str  # ISO 8601 with offset
    commit: str  # short hash; "" outside a git checkout
    command: str  # shell-quoted, without machine-specific paths


@dataclass(frozen=True)
class Host:
    """The CPU the closed loop ran on, as `devices.local_cpu` calibrated it."""

    name: str
    cores: int
    fp32_gflops: float
    mem_bandwidth_gbps: float


@dataclass(frozen=True)
class CpuModels:
    """Which latency models priced one CPU loop, and the host timing drift applied to them."""

    backend: str  # bench backend: onnxruntime (inference loop) or torch (training step)
    source: str  # "host-bench": fitted on this host's bench rows; "bundle": the bundle's rows
    rows: int  # op rows the models were fitted on (0 when taken from the bundle)
    speed_ratio: float  # now / stored latency of re-timed op rows (median); 1.0 when unchecked
    reference_rows: int  # op rows re-timed for `speed_ratio`


@dataclass(frozen=True)
class Report:
    """Everything `gpuplan eval` measured, ready to render."""

    measured: Provenance
    bundle: str  # the latency models: origin and the command that trained them
    gpu: tuple[RowResult, ...]
    skipped: tuple[Skipped, ...]
    logo: tuple[RowResult, ...]
    cpu: tuple[CpuResult, ...]
    notes: tuple[str, ...]
    host: Host | None = None
    cpu_models: tuple[CpuModels, ...] = ()
    rendered: Provenance | None = None  # set when the page was re-rendered from the JSON
    cpu_measured: Provenance | None = None
    """Set when the CPU loop was carried over from an earlier run (``gpuplan eval
    --cpu-from``): that run's provenance, since `measured` is then the GPU views' alone."""


def _label_json(row: LabelRow) -> dict[str, Any]:
    return {"gpu": row.gpu, "model": row.model, "mode": row.mode, "compiled": row.fused,
            "seq_len": row.seq_len, "batch": row.batch, "e2e_latency_ms": row.e2e_ms,
            "fw_ms": row.fw_ms, "bw_ms": row.bw_ms}


def _label_from_json(d: Mapping[str, Any]) -> LabelRow:
    return LabelRow(gpu=str(d["gpu"]), model=str(d["model"]), mode=str(d["mode"]),
                    seq_len=int(d["seq_len"]), batch=int(d["batch"]), fused=bool(d["compiled"]),
                    e2e_ms=float(d["e2e_latency_ms"]), fw_ms=float(d["fw_ms"]),
                    bw_ms=float(d["bw_ms"]))


def _rows_json(results: Sequence[RowResult]) -> list[dict[str, Any]]:
    return [{**_label_json(r.row), "device": r.device, "predictor": r.predictor,
             "predicted_ms": round(r.predicted_ms, 3), "p10_ms": round(r.p10_ms, 3),
             "p90_ms": round(r.p90_ms, 3), "forward_ms": round(r.forward_ms, 3),
             "measured_ms": r.row.measured_ms} for r in results]


def _rows_from_json(rows: Sequence[Mapping[str, Any]]) -> tuple[RowResult, ...]:
    return tuple(RowResult(_label_from_json(d), str(d["device"]), str(d["predictor"]),
                           float(d["predicted_ms"]), float(d["p10_ms"]), float(d["p90_ms"]),
                           float(d["forward_ms"])) for d in rows)


def _flat(s: Mapping[tuple[str, str, str], AccuracyMetrics]) -> list[dict[str, Any]]:
    return [{"predictor": p, "device": d, "mode": m, **v.as_dict()} for (p, d, m), v in s.items()]


def to_json(rep: Report) -> dict[str, Any]:
    """The report as the JSON document written to ``accuracy.json`` (`from_json` reads it)."""
    return {
        "schema_version": SCHEMA_VERSION,
        "measured": asdict(rep.measured),
        "rendered": asdict(rep.rendered) if rep.rendered is not None else None,
        "cpu_measured": asdict(rep.cpu_measured) if rep.cpu_measured is not None else None,
        "bundle": rep.bundle, "notes": list(rep.notes),
        "host": asdict(rep.host) if rep.host is not None else None,
        "cpu_models": [asdict(m) for m in rep.cpu_models],
        "gpu_labels": {"summary": _flat(summarise(rep.gpu)), "rows": _rows_json(rep.gpu)},
        "skipped": [{**_label_json(s.row), "reason": s.reason} for s in rep.skipped],
        "leave_one_gpu_out": {"summary": _flat(summarise(rep.logo)),
                              "rows": _rows_json(rep.logo)},
        "cpu_closed_loop": {
            "summary": {k: v.as_dict() for k, v in summarise_cpu(rep.cpu).items()},
            "rows": [{"model": r.model, "mode": r.mode, "batch": r.batch,
                      "predictor": r.predictor,
                      "predicted_ms": round(r.predicted_ms, 3), "p10_ms": round(r.p10_ms, 3),
                      "p90_ms": round(r.p90_ms, 3), "measured_ms": round(r.measured_ms, 3),
                      "runs": r.runs} for r in rep.cpu],
        },
    }


def from_json(doc: Mapping[str, Any]) -> Report:
    """The report a `to_json` document describes (summaries are recomputed from its rows)."""
    if doc.get("schema_version") != SCHEMA_VERSION:
        raise errors.InvalidRequestError(
            "schema_version", f"accuracy JSON schema {doc.get('schema_version')!r}, this gpuplan "
            f"reads {SCHEMA_VERSION}; run `gpuplan eval` to measure again")
    try:
        return Report(
            measured=Provenance(**doc["measured"]),
            rendered=Provenance(**doc["rendered"]) if doc.get("rendered") else None,
            cpu_measured=(Provenance(**doc["cpu_measured"]) if doc.get("cpu_measured")
                          else None),
            bundle=str(doc["bundle"]), notes=tuple(str(n) for n in doc["notes"]),
            host=Host(**doc["host"]) if doc.get("host") else None,
            cpu_models=tuple(CpuModels(**m) for m in doc["cpu_models"]),
            gpu=_rows_from_json(doc["gpu_labels"]["rows"]),
            skipped=tuple(Skipped(_label_from_json(s), str(s["reason"]))
                          for s in doc["skipped"]),
            logo=_rows_from_json(doc["leave_one_gpu_out"]["rows"]),
            cpu=tuple(CpuResult(str(r["model"]), int(r["batch"]), str(r["predictor"]),
                                float(r["predicted_ms"]), float(r["p10_ms"]),
                                float(r["p90_ms"]), float(r["measured_ms"]), int(r["runs"]),
                                mode=str(r["mode"]))
                      for r in doc["cpu_closed_loop"]["rows"]),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise errors.InvalidRequestError("accuracy JSON", f"malformed: {exc!r}") from None
