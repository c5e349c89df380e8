"""Speed of `estimate` itself (`make bench`): reported, not asserted.

Times GPT-2 large (zoo, sequence 1024, batch 1..8) and the light ResNet-50 on every catalog GPU;
graph loading is timed separately from `estimate` (the median of a few runs of each).
``gpuplan eval speed [--json] [--repeats N]``.
"""

from __future__ import annotations

import functools
import json
import statistics
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


def time_cases(
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


@dataclass(frozen=True)
class SpeedSettings:
    """`gpuplan eval speed`'s flags."""
    json: bool
    """Print the rows as JSON instead of a table."""
    repeats: int
    """Timed `estimate` calls per case (the median is kept); at least 1."""
    gpt2_config: Path
    """The Hugging Face config of the GPT-2 large case."""


def run(settings: SpeedSettings) -> int:
    """Time the cases and print a table or JSON; returns 0."""
    specs = devices.load_catalog().devices
    cases: list[tuple[str, Callable[[int], ModelGraph], Sequence[int]]] = [
        ("resnet50", examples.resnet50, (1, 32)),
        ("gpt2-large", gpt2_large_loader(settings.gpt2_config), (1, 2, 4, 8)),
    ]
    rows = time_cases(cases, specs, max(1, settings.repeats))
    if settings.json:
        print(json.dumps([asdict(r) for r in rows], indent=2))
        return 0
    print(f"{'model':<12} {'batch':>5} {'layers':>6} {'devices':>7} {'load s':>8} "
          f"{'estimate s':>10}")
    for r in rows:
        print(f"{r.model:<12} {r.batch:>5} {r.layers:>6} {r.devices:>7} {r.load_seconds:>8.3f} "
              f"{r.estimate_seconds:>10.3f}")
    return 0
