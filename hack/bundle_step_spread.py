"""Give a bundle the step-level spread of its intervals (issue #30) without retraining.

    .venv/bin/python hack/bundle_step_spread.py --predicted RAW.json --steps RUN/steps.jsonl \
        [--steps ...] [--folds OUT.json] [--bundle DIR] [--dry-run]

`RAW.json` is `gpuplan eval model-step-scoring predict --no-step-spread` of the runs' cases,
each case priced by folds that never saw its model (`--host-folds`, `--aligned-folds`): the
held-out predictions the spread is sized on (`training.step_spread`). The fit on every model
goes into the bundle's ``manifest.json`` under ``step_log_sigma`` (provenance under
``step_log_sigma_provenance``); `--folds` writes each model's leave-one-out fit, for
`predict --step-folds`, and the coverage those folds reach on the models they left out is
printed and recorded. ``make step-spread`` runs the whole chain on the shipped bundle.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from datetime import datetime
from pathlib import Path

from gpuplan_estimator import devices
from gpuplan_estimator.core import provenance
from gpuplan_estimator.evaluation import model_step_scoring
from gpuplan_estimator.latency import bundles
from gpuplan_estimator.planning import intervals
from gpuplan_estimator.training import step_spread


def main(argv: list[str] | None = None) -> int:
    """Fit and write (not with --dry-run)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bundle", type=Path, default=bundles.SHIPPED_BUNDLE)
    parser.add_argument("--predicted", type=Path, required=True,
                        help="predict --no-step-spread output, held-out folds")
    parser.add_argument("--steps", type=Path, action="append", required=True,
                        help="model_steps JSON lines measured on a GPU (repeat)")
    parser.add_argument("--folds", type=Path, default=None,
                        help="write each model's leave-one-out spread here")
    parser.add_argument("--dry-run", action="store_true", help="print, write nothing")
    args = parser.parse_args(argv)
    bundles.read_manifest(args.bundle)  # checked: a bundle this version can read
    predicted = json.loads(model_step_scoring.read_capped(args.predicted))
    if predicted.get("step_spread") != "none":
        parser.error(f"{args.predicted}: was predicted with a step spread "
                     f"({predicted.get('step_spread', 'bundle')!r}); predict --no-step-spread")
    rows = [r for path in args.steps
            for r in model_step_scoring.step_residuals(model_step_scoring.score(
                predicted, model_step_scoring.read_json_lines(path),
                lambda name: devices.resolve_device(name).key))]
    fitted = step_spread.fit(rows)
    folds = step_spread.leave_one_group_out(rows)
    coverage = step_spread.held_out_coverage(rows, folds)
    before = step_spread.held_out_coverage(rows, {g: intervals.no_step_sigma() for g in folds})
    record = {
        "command": shlex.join(["hack/bundle_step_spread.py", *(argv or sys.argv[1:])]),
        "created": datetime.now().astimezone().isoformat(timespec="seconds"),
        "commit": provenance.git_commit(short=True), "rows": len(rows),
        "models": sorted(folds), "predicted": predicted.get("provenance", {}).get("command"),
        "held_out_coverage": {k: round(v, 3) for k, v in coverage.items()},
        "coverage_without": {k: round(v, 3) for k, v in before.items()},
        "method": f"split-conformal: the {step_spread.COVERAGE:.0%} quantile (n + 1 "
                  "corrected) of the spread each measured step needs to fall inside its "
                  "held-out interval (>= 0: an extra log-sigma in quadrature; < 0: the log of "
                  "the factor its log half-widths shrink by); coverage from "
                  "leave-one-model-out folds"}
    entries = {intervals.STEP_SIGMA_KEY: fitted, intervals.STEP_SIGMA_PROVENANCE_KEY: record}
    print(json.dumps(entries, indent=2))
    for cell, share in coverage.items():
        steps = sum(cell in (r.kind, f"{r.kind}/{r.math}") for r in rows)
        print(f"{cell}: held-out P10-P90 coverage {100 * before[cell]:.0f} % -> "
              f"{100 * share:.0f} % ({steps} steps)")
    if args.dry_run:
        return 0
    if args.folds is not None:
        args.folds.write_text(json.dumps(folds, indent=1, sort_keys=True) + "\n",
                              encoding="utf-8")
    path = bundles.update_manifest(args.bundle, entries)
    print(f"wrote {intervals.STEP_SIGMA_KEY} into {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
