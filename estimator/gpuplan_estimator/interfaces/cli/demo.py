"""`gpuplan demo` (what `make demo` runs): two shipped models (`graph.examples`) estimated on
every catalog GPU."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

from gpuplan_estimator import devices
from gpuplan_estimator.graph import examples
from gpuplan_estimator.interfaces.cli import estimating
from gpuplan_estimator.latency import selection
from gpuplan_estimator.planning import estimates, ranking
from gpuplan_estimator.step.decomposition import TrainingSettings


@dataclass(frozen=True)
class DemoCase:
    """One demo model: its title, what is run and how long."""

    title: str
    settings: TrainingSettings
    epochs: int
    dataset_size: int


# ImageNet-1k has 1,281,167 training images; 90 epochs is the classic ResNet-50 schedule.
RESNET = DemoCase("ResNet-50 (ImageNet, 90 epochs)",
                  TrainingSettings(batch_size=32, optimizer="momentum", precision="fp32"),
                  epochs=90, dataset_size=1_281_167)
# OpenWebText is ~9 B tokens ≈ 8.8 M sequences of 1024; one epoch.
GPT2 = DemoCase("GPT-2 medium (seq 1024, 1 epoch of OpenWebText-sized data)",
                TrainingSettings(batch_size=8, optimizer="adamw", precision="bf16"),
                epochs=1, dataset_size=8_800_000)


DEMO_OBJECTIVE = "fastest"
"""The demo ranks by speed: it compares GPUs, and several catalog prices are unknown."""


def register(sub: Any) -> None:
    """Add the `demo` subcommand."""
    p = sub.add_parser("demo", help="estimate ResNet-50 and GPT-2 medium on every catalog GPU")
    p.add_argument("--device", action="append", default=[], metavar="D",
                   help="limit to these devices (default: every catalog GPU)")
    p.set_defaults(func=run_demo)


def run_demo(args: argparse.Namespace) -> int:
    """Estimate both demo models on every (or the named) device and print the tables."""
    specs = estimating.resolve_devices(args.device)
    predictor, source = selection.select_predictor(None)
    for case, build in ((RESNET, examples.resnet50), (GPT2, examples.gpt2_medium)):
        g = build(case.settings.batch_size)
        precision = case.settings.precision
        able = [s for s in specs if devices.supports_precision(s, precision)]
        results = ranking.rank(
            estimates.estimate(g, able, case.settings, predictor=predictor, epochs=case.epochs,
                               dataset_size=case.dataset_size), DEMO_OBJECTIVE)
        print(f"== {case.title}")
        if lacking := [s.key for s in specs if s not in able]:
            print(f"(left out, no {precision} math units: {', '.join(lacking)})")
        estimating.print_estimate(g, results, case.settings, source,
                                  ranking.recommend(results, DEMO_OBJECTIVE),
                                  estimating.View(prefer=DEMO_OBJECTIVE))
        print()
    print(f"{len(specs)} devices from {devices.DEFAULT_CATALOG_PATH.name}; times are for one GPU."
          " Try: gpuplan estimate MODEL.onnx --batch N --device h100-sxm-80gb")
    return 0
