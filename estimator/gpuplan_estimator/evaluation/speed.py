"""Speed of `estimate` itself (`make bench`): reported, not asserted.

Times GPT-2 large (zoo, sequence 1024, batch 1..8) and the light ResNet-50 on every catalog GPU;
graph loading is timed separately from `estimate` (the median of a few runs of each).
``python -m gpuplan_estimator.evaluation.speed [--json] [--repeats N]``.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TypeVar

from gpuplan_estimator import devices, graph
from gpuplan_estimator.core import paths
from gpuplan_estimator.core.layers import ModelGraph
from gpuplan_estimator.core.vocabulary import SEQUENCE_DIM
from gpuplan_estimator.cost import roofline
from gpuplan_estimator.graph import examples
from gpuplan_estimator.planning import estimates
from gpuplan_estimator.step.decomposition import TrainingSettings

GPT2_LARGE_CONFIG = paths.PACKAGE_DATA_DIR / "model_configs" / "gpt2_large.json"
T = TypeVar("T")


@dataclass(frozen=True)
class BenchRow:
    """Timing of graph loading and `estimate` for one model at one batch (seconds)."""
    model: str
    batch: int
    layers: int
    devices: int
    load_seconds: float
    estimate_seconds: float  # median wall time of one `estimate` call over all devices


def timed(fn: Callable[[], T], repeats: int, clock: Callable[[], float]) -> tuple[T, float]:
    """The last result and the median wall time over `repeats` runs."""
    times = []
    result: T | None = None
    for _ in range(repeats):
        start = clock()
        result = fn()
        times.append(clock() - start)
    assert result is not None
    return result, statistics.median(times)


def gpt2_large_loader(config_path: Path) -> Callable[[int], ModelGraph]:
    """Batch size → GPT-2 large graph at sequence 1024, built from `config_path`."""
    from gpuplan_estimator.graph import zoo

    data = zoo.build_transformer(zoo.load_hf_config(config_path), name="gpt2-large")
    blob = data.SerializeToString()
    return lambda batch: graph.load_model(blob, batch=batch, dim_bindings={SEQUENCE_DIM: 1024},
                                          name="gpt2-large")


def run(
    cases: Sequence[tuple[str, Callable[[int], ModelGraph], Sequence[int]]],
    specs: Sequence[devices.DeviceSpec], repeats: int,
    clock: Callable[[], float] = time.perf_counter,
) -> list[BenchRow]:
    """Load each case at each batch once and time `estimate` over `specs`, roofline-priced."""
    predictor = roofline.RooflinePredictor()
    rows = []
    for name, load, batches in cases:
        for batch in batches:
            g, load_s = timed(functools.partial(load, batch), 1, clock)
            run_once = functools.partial(estimates.estimate, g, specs,
                                         TrainingSettings(batch_size=batch), predictor=predictor)
            _, est_s = timed(run_once, repeats, clock)
            rows.append(BenchRow(name, batch, len(g.layers), len(specs), load_s, est_s))
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point: time the cases and print a table or JSON; returns 0."""
    parser = argparse.ArgumentParser(prog="python -m gpuplan_estimator.evaluation.speed")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--gpt2-config", type=Path, default=GPT2_LARGE_CONFIG)
    args = parser.parse_args(argv)
    specs = devices.load_catalog().devices
    cases: list[tuple[str, Callable[[int], ModelGraph], Sequence[int]]] = [
        ("resnet50", examples.resnet50, (1, 32)),
        ("gpt2-large", gpt2_large_loader(args.gpt2_config), (1, 2, 4, 8)),
    ]
    rows = run(cases, specs, max(1, args.repeats))
    if args.json:
        print(json.dumps([asdict(r) for r in rows], indent=2))
        return 0
    print(f"{'model':<12} {'batch':>5} {'layers':>6} {'devices':>7} {'load s':>8} "
          f"{'estimate s':>10}")
    for r in rows:
        print(f"{r.model:<12} {r.batch:>5} {r.layers:>6} {r.devices:>7} {r.load_seconds:>8.3f} "
              f"{r.estimate_seconds:>10.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
