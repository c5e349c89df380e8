"""Give the shipped bundle its shared interval log-sigma without retraining its models.

    .venv/bin/python hack/bundle_interval_sigma.py [--max-rows 60000] [--bundle DIR] [--dry-run]

`gpuplan train` now writes ``interval_log_sigma`` (`training.fitting.train_bundle`); a bundle
trained before it has none, so its extrapolated and probed GPUs still sum per-layer quantiles.
This computes the same figure as `train_bundle` would from the shipped recipe's GPU rows
(``$GPUPLAN_SHARED_DATA/gpu-ops``): per kernel with a transfer model, the leave-one-GPU-out
refits of only that transfer model (`fitting.leave_one_device_out`, the recipe's transfer
parameters and seed), whose held-out predictions are drawn into synthetic models
(`fitting.shared_log_sigma`). Only op rows enter, never whole-model labels. It then writes
``interval_log_sigma`` and its provenance into the bundle's ``manifest.json`` and touches
no model file. ``make interval-sigma`` runs it on the shipped bundle.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pandas as pd

from gpuplan_estimator import devices
from gpuplan_estimator.core import provenance
from gpuplan_estimator.interfaces.cli import training
from gpuplan_estimator.latency import basis, bundles
from gpuplan_estimator.planning import intervals
from gpuplan_estimator.training import fitting, recipe

PROVENANCE_KEY = "interval_log_sigma_provenance"


def gpu_rows(manifest: dict[str, Any], settings: fitting.TrainSettings) -> pd.DataFrame:
    """The GPU rows `train_bundle` fits from under the recipe: probe rows split off, then the
    per-kernel cap (the same stratified subsample, so the same rows at the bundle's cap)."""
    frame = training.load_sources([str(recipe.shared_data_dir() / "gpu-ops")])
    kinds = {d: devices.resolve_device(d).platform for d in frame["device"].unique()}
    if set(kinds.values()) != {"gpu"}:
        raise SystemExit(f"gpu-ops holds non-GPU devices: {sorted(kinds)}")
    fitted, _ = fitting.split_probe_rows(frame, kinds, settings)
    return fitting.subsample(fitted, settings.max_rows_per_kernel, settings.seed)


def kernel_sigmas(manifest: dict[str, Any], frame: pd.DataFrame,
                  settings: fitting.TrainSettings) -> dict[str, intervals.SharedSigma]:
    """Shared log-sigma (all sizes and per duration band) per kernel the bundle has a transfer
    model of."""
    out: dict[str, intervals.SharedSigma] = {}
    for kernel in sorted(manifest.get("transfer_files", {})):
        start_s = time.perf_counter()
        # The bundle's own backend list: the backend feature is an index into it.
        data = fitting.kernel_data(frame, kernel, devices.resolve_device, manifest["backends"],
                                   settings.transfer_kind)
        held_out = fitting.leave_one_device_out(kernel, data, settings)
        out[kernel] = fitting.shared_log_sigma(data, held_out, settings.seed)
        bands = " ".join("-" if b is None else f"{b:.3f}" for b in out[kernel].by_band)
        print(f"  {kernel:12s} sigma {out[kernel].all_sizes:.4f} by band {bands}  "
              f"rows {len(data.y):6d}  "
              f"GPUs left out {len(held_out)}  {time.perf_counter() - start_s:6.1f} s",
              flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    """Compute the sigma and write it into the bundle's manifest (not with --dry-run)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bundle", type=Path, default=bundles.SHIPPED_BUNDLE)
    parser.add_argument("--max-rows", type=int, default=None,
                        help="rows per kernel (default: the bundle's own max_rows_per_kernel)")
    parser.add_argument("--dry-run", action="store_true", help="print, write nothing")
    args = parser.parse_args(argv)
    path = args.bundle / bundles.MANIFEST
    bundles.read_manifest(args.bundle)  # checked: a bundle this version can read
    manifest = json.loads(path.read_text(encoding="utf-8"))
    shipped = manifest["settings"]
    max_rows = args.max_rows if args.max_rows is not None else shipped["max_rows_per_kernel"]
    settings = fitting.TrainSettings(
        seed=shipped["seed"], max_rows_per_kernel=max_rows,
        kernel_params=recipe.KERNEL_PARAMS, transfer_params=recipe.TRANSFER_PARAMS,
        cpu_params=recipe.CPU_PARAMS, transfer_kind=fitting.transfer_kind_of(manifest))
    start_s = time.perf_counter()
    frame = gpu_rows(manifest, settings)
    sigmas = kernel_sigmas(manifest, frame, settings)
    elapsed_s = round(time.perf_counter() - start_s, 1)
    # A measured GPU's figure comes from training's random split; it is kept as trained.
    kept = manifest.get(intervals.MANIFEST_KEY, {}).get(basis.MEASURED)
    table = fitting.interval_sigma_table(sigmas)
    if kept:
        table[basis.MEASURED] = kept
    record = {
        "command": shlex.join(["hack/bundle_interval_sigma.py", *(argv or sys.argv[1:])]),
        "created": datetime.now().astimezone().isoformat(timespec="seconds"),
        "commit": provenance.git_commit(short=True),
        "max_rows_per_kernel": max_rows, "seed": settings.seed,
        "transfer_kind": settings.transfer_kind,
        "gpu_rows": len(frame), "gpu_data_digest": fitting.data_digest(frame),
        "seconds": elapsed_s,
        "method": "leave-one-GPU-out refits of the transfer models only (recipe parameters); "
                  "the bundle's models were not retrained",
    }
    print(json.dumps({intervals.MANIFEST_KEY: table, PROVENANCE_KEY: record}, indent=2))
    if args.dry_run:
        return 0
    bundles.update_manifest(args.bundle, {intervals.MANIFEST_KEY: table, PROVENANCE_KEY: record})
    print(f"wrote {intervals.MANIFEST_KEY} into {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
