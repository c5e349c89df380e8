"""Re-time a sample of stored CPU measurement rows on this host: the measurement noise floor.

    .venv/bin/python hack/cpu_remeasure.py [--per-kernel 25] [--sessions 1] PARQUET...

Prints, per kernel, the absolute percentage difference and the ratio between the new timing and
the stored one. No model is involved: when two timings of the same configuration differ by X %,
no latency model trained on such rows can be judged below about X % on held-out rows.
"""

from __future__ import annotations

import argparse

import pandas as pd

from gpuplan_estimator.bench import timing
from gpuplan_estimator.evaluation import host_bench


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("parquet", nargs="+")
    parser.add_argument("--per-kernel", type=int, default=25)
    parser.add_argument("--sessions", type=int, default=1)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    frame = pd.concat([pd.read_parquet(p) for p in args.parquet], ignore_index=True)
    d = host_bench.retime(frame, args.per_kernel, args.seed,
                          timing.TimingSettings(sessions=args.sessions))
    d["ape"] = (d["ratio"] - 1.0).abs()
    print(d.groupby("kernel").agg(rows=("ape", "size"), mean_ape=("ape", "mean"),
                                  median_ratio=("ratio", "median"), std_ratio=("ratio", "std"))
          .round(3).to_string())
    print(f"all: {len(d)} rows, mean APE {d['ape'].mean():.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
