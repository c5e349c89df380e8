"""Give a bundle trained before issue #30 part 5 its one-wave GEMM scale, without retraining.

    .venv/bin/python hack/bundle_sub_wave.py --bundle DIR [--data SOURCE ...] [--dry-run]

`gpuplan train` now writes ``sub_wave_gemm`` (`training.fitting.fit_sub_wave`) into the
manifest; a bundle trained before it has none, so its unmeasured GPUs price sub-wave GEMMs with
the transfer model. This computes the same record as `train_bundle` would from the same rows:
the shipped recipe's GPU rows (``$GPUPLAN_SHARED_DATA/gpu-ops``) plus each ``--data`` source
(a database URL or measurement parquet, as `gpuplan train --db`), probe rows split off, the
bundle's per-kernel cap and seed. Only op rows enter, never whole-model labels. It writes the
record and its provenance into ``DIR/manifest.json`` and touches no model file.
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
from gpuplan_estimator.interfaces.cli import training
from gpuplan_estimator.latency import bundles
from gpuplan_estimator.training import fitting, recipe

PROVENANCE_KEY = f"{bundles.SUB_WAVE_KEY}_provenance"


def main(argv: list[str] | None = None) -> int:
    """Fit and write the record; 0, or 1 when too few sub-wave rows fit none."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--bundle", type=Path, required=True, help="bundle directory to update")
    p.add_argument("--data", action="append", default=[], metavar="SOURCE",
                   help="further measurement source the bundle was trained on (repeatable)")
    p.add_argument("--dry-run", action="store_true", help="print the record, write nothing")
    args = p.parse_args(argv)
    path = args.bundle / bundles.MANIFEST
    manifest = json.loads(path.read_text(encoding="utf-8"))
    settings = fitting.TrainSettings(
        seed=int(manifest["settings"]["seed"]),
        max_rows_per_kernel=int(manifest["settings"]["max_rows_per_kernel"]))
    frame = training.load_sources([str(recipe.shared_data_dir() / "gpu-ops"), *args.data])
    kinds = {d: devices.resolve_device(d).platform for d in frame["device"].unique()}
    fitted, _ = fitting.split_probe_rows(frame, kinds, settings)
    gpu = fitted[fitted["device"].map(kinds) == "gpu"]
    rows = fitting.subsample(gpu, settings.max_rows_per_kernel, settings.seed)
    record = fitting.fit_sub_wave(rows[rows["kernel"] == "gemm"], devices.resolve_device,
                                  manifest["backends"])
    if record is None:
        print("too few sub-wave gemm rows: nothing written", file=sys.stderr)
        return 1
    print(json.dumps(record))
    if args.dry_run:
        return 0
    bundles.update_manifest(args.bundle, {bundles.SUB_WAVE_KEY: record, PROVENANCE_KEY: {
        "command": shlex.join(["hack/bundle_sub_wave.py", *(argv or sys.argv[1:])]),
        "commit": provenance.code_commit(), "created": datetime.now().astimezone().isoformat(),
        "method": "median log(measured / one-wave time) over the bundle's training GPUs' "
                  "sub-wave gemm rows; the bundle's models were not retrained"}})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
