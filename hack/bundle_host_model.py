"""Give a bundle its host model (issue #30 part 1) without retraining its latency models.

    .venv/bin/python hack/bundle_host_model.py --steps RUN/steps.jsonl --probe RUN/host-probe.json \
        [--bundle DIR] [--dry-run]

Fits `step.host.HostCoefficients` on the host times of measured whole-model steps
(`evaluation.host_check`: the estimator's own work items of each case as regressors), with the
leave-one-model-out spread as its `log_sigma`, and writes it with the node's probe into the
bundle's ``manifest.json`` under ``host_model`` (provenance under ``host_model_provenance``).
Estimates on GPUs then price the step on two clocks. The same runs' profiled kernels give the
aligned tensor-core GEMM utilisation (`training.stream_fit`, with the leave-one-model-out
spread), written first under ``aligned_gemm`` (provenance under ``aligned_gemm_provenance``).
``make host-model`` runs it on the shipped bundle with the 2026-11-27 H200 run.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from datetime import datetime
from pathlib import Path

from gpuplan_estimator.core import provenance
from gpuplan_estimator.cost import aligned_gemm
from gpuplan_estimator.evaluation import host_check, model_step_scoring, stream_check
from gpuplan_estimator.latency import bundles
from gpuplan_estimator.step import host
from gpuplan_estimator.training import host_fit, stream_fit


def main(argv: list[str] | None = None) -> int:
    """Fit and write (not with --dry-run)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bundle", type=Path, default=bundles.SHIPPED_BUNDLE)
    parser.add_argument("--steps", type=Path, action="append", required=True)
    parser.add_argument("--event-steps", type=Path, action="append", default=[],
                        help="model_steps of a run without host clocks (host-check's flag)")
    parser.add_argument("--probe", type=Path, required=True)
    parser.add_argument("--dry-run", action="store_true", help="print, write nothing")
    args = parser.parse_args(argv)
    bundles.read_manifest(args.bundle)  # checked: a bundle this version can read
    command = shlex.join(["hack/bundle_host_model.py", *(argv or sys.argv[1:])])
    stamp = {"command": command,
             "created": datetime.now().astimezone().isoformat(timespec="seconds"),
             "commit": provenance.git_commit(short=True)}
    entries = _aligned_entries(args.steps, stamp)
    if entries and not args.dry_run:
        # First: the event rows' host times are read through the stream it prices.
        bundles.update_manifest(args.bundle, entries)
    probe, rows = host_check.load_rows(args.steps, args.probe, args.event_steps)
    coefficients = host_fit.fit_for_bundle(rows)
    entries[host.MANIFEST_KEY] = host.model_to_json(host.HostModel(probe, coefficients))
    entries[host.PROVENANCE_KEY] = {
        **stamp, "rows": len(rows), "models": sorted({r.group for r in rows}),
        "method": "bounded least squares on measured host time per phase; log_sigma is the "
                  "leave-one-model-out spread",
    }
    print(json.dumps(entries, indent=2))
    if args.dry_run:
        return 0
    path = bundles.update_manifest(args.bundle, entries)
    print(f"wrote {', '.join(k for k in entries if not k.endswith('provenance'))} into {path}")
    return 0


def _aligned_entries(steps: list[Path], stamp: dict[str, str]) -> dict[str, object]:
    """The aligned-GEMM utilisation fitted on the runs' profiled phases, with provenance
    (nothing when no run was profiled)."""
    aligned = [r for path in steps
               for lines in [model_step_scoring.read_json_lines(path)]
               for r in stream_check.aligned_rows(lines, host_check.run_device(lines, path))]
    if not aligned:
        return {}
    return {aligned_gemm.MANIFEST_KEY: stream_fit.fit_for_bundle(aligned).to_json(),
            aligned_gemm.PROVENANCE_KEY: {
                **stamp, "rows": len(aligned), "models": sorted({r.group for r in aligned}),
                "method": "median log(tile-and-wave plan over the library's tiles / profiled "
                          "aligned tensor-core GEMM kernels) per class over profiled phases, "
                          "and per class and phase (forward, backward); log_sigma is the "
                          "leave-one-model-out spread"}}


if __name__ == "__main__":
    raise SystemExit(main())
