"""Does a reference kernel timed next to each row track this host's drift? (CPU noise study)

    .venv/bin/python hack/cpu_drift.py [--minutes 9] [--threads 0] [--per-kernel 3] PARQUET...

Cycles over `--per-kernel` stored rows of every kernel (0.05-5 ms) for `--minutes`, timing each
with the bench protocol (fresh session per timing, 3 repeats), then prints the mean absolute
percentage deviation of a timing from its row's median: raw, and after dividing by a speed index
from reference rows (one per kernel) timed in the same cycle, or smoothed over 9 cycles. When
the index does not shrink the deviation, the noise is per-timing, not a slow drift of the host.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import pandas as pd

from gpuplan_estimator.bench import runner, sweep, timing


def measure(items: list[sweep.PlanItem], minutes: float, threads: int) -> pd.DataFrame:
    target = runner.resolve_target("cpu")
    settings = timing.TimingSettings(repeats=3, intra_op_threads=threads)
    rows = []
    start = time.monotonic()
    cycle = 0
    while time.monotonic() - start < minutes * 60:
        for i, item in enumerate(items):
            ms = runner.measure_item(item, target, settings, 0)["latency_ms"]
            rows.append((cycle, i, item.kernel, ms))
        cycle += 1
    return pd.DataFrame(rows, columns=["cycle", "item", "kernel", "ms"])


def mean_ape(log_dev: pd.Series) -> float:
    return float((np.exp(log_dev.abs()) - 1).mean() * 100)


def report(timed: pd.DataFrame, reference_items: list[int]) -> None:
    log_ms = np.log(timed["ms"])
    dev = log_ms - log_ms.groupby(timed["item"]).transform("median")
    is_ref = timed["item"].isin(reference_items)
    index = dev[is_ref].groupby(timed["cycle"][is_ref]).mean()
    smoothed = index.rolling(9, center=True, min_periods=1).mean()
    test = ~is_ref
    cycles = timed["cycle"][test]
    print(f"cycles {timed['cycle'].max() + 1}, rows per cycle {timed['item'].nunique()}")
    print("per kernel, raw:", (np.exp(dev[test].abs()) - 1).groupby(timed["kernel"][test])
          .mean().mul(100).round(1).to_dict())
    for label, idx in (("raw", None), ("same-cycle index", index), ("smoothed index", smoothed)):
        d = dev[test] if idx is None else dev[test] - cycles.map(idx)
        d = d - d.groupby(timed["item"][test]).transform("median")
        print(f"{label:18s} mean APE vs the row's median {mean_ape(d):5.1f} %")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("parquet", nargs="+")
    parser.add_argument("--minutes", type=float, default=9.0)
    parser.add_argument("--threads", type=int, default=0, help="intra-op threads (0 = all)")
    parser.add_argument("--per-kernel", type=int, default=3)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    frame = pd.concat([pd.read_parquet(p) for p in args.parquet], ignore_index=True)
    frame = frame[frame["latency_ms"].between(0.05, 5.0)]
    picked = pd.concat([g.sample(n=min(args.per_kernel, len(g)), random_state=args.seed)
                        for _, g in frame.groupby("kernel")])
    items = [sweep.PlanItem(str(r.kernel), str(r.op), str(r.dtype), json.loads(str(r.dims)))
             for r in picked.itertuples()]
    timed = measure(items, args.minutes, args.threads)
    # The first picked row of each kernel is its reference; the others are tested against them.
    reference = [i for i in range(len(items)) if i % args.per_kernel == 0]
    report(timed, reference)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
