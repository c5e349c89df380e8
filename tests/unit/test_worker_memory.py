"""#35: docs/install.md's memory per estimation worker is what an estimate takes.

One estimate of the shipped ResNet-50 and one of the GPT-2 medium config (built without torch),
each in a fresh Python whose peak resident set is read back: the page's "~N MiB each" must cover
both within 15%, and not overstate them by more than half (a stale, too-generous figure sizes
pods wrongly too)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from gpuplan_estimator.graph import examples

ROOT = Path(__file__).resolve().parents[2]
PEAK = ("import resource, subprocess, sys; subprocess.run(sys.argv[1:], check=True, "
        "capture_output=True); print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")
CLI = [sys.executable, "-m", "gpuplan_estimator.interfaces.cli"]


def _peak_mib(args: list[str]) -> float:
    done = subprocess.run([sys.executable, "-c", PEAK, *CLI, *args], capture_output=True,
                          text=True, check=True, timeout=300)
    return int(done.stdout.strip()) / 1024  # Linux reports KiB


@pytest.mark.slow
def test_the_documented_memory_per_worker_covers_an_estimate() -> None:
    doc = (ROOT / "docs" / "install.md").read_text()
    row = next(line for line in doc.splitlines() if line.startswith("| `estimator.workers`"))
    match = re.search(r"~(\d+) MiB each", row)
    assert match, row
    stated = int(match.group(1))
    peaks = [
        _peak_mib(["estimate", str(examples.light_resnet50_path()), "--batch", "64",
                   "--device", "t4"]),
        _peak_mib(["estimate", "--hf-config", str(examples.GPT2_CONFIG), "--batch", "8",
                   "--dim", "sequence=1024", "--device", "a100-sxm4-80gb"]),
    ]
    assert max(peaks) <= stated * 1.15, peaks
    assert max(peaks) >= stated * 0.5, peaks
