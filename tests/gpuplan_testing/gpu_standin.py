"""Run a `gpuplan` command with this machine's CPU standing in for a GPU (tests only).

    python -m gpuplan_testing.gpu_standin --as NVIDIA-L40S -- bench --device cpu ...

The benchmark Job of the operator runs ``gpuplan bench --device cuda`` on a node of one GPU
type; NVML names the GPU and the rows are stored under its catalog key. No GPU here, so the
loop test (tests/integration/test_retraining_loop.py) runs the Job's command with
``--device cpu`` and this wrapper makes the CPU target carry the GPU's catalog identity, as NVML
would have: the layers are timed on the CPU, the rows land under the GPU type. Nothing outside
tests uses it.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Sequence

from gpuplan_estimator import devices
from gpuplan_estimator.bench import runner
from gpuplan_estimator.interfaces.cli import main as cli_main


def standin_target(gpu_product: str) -> runner.Target:
    """A CPU target (torch/onnxruntime run on the CPU) that stores rows as `gpu_product`."""
    spec = devices.load_catalog().resolve(gpu_product)
    return runner.Target("cpu", 0, spec.key, spec, None, "CPUExecutionProvider")


def main(argv: Sequence[str] | None = None) -> int:
    """Patch the bench's target resolution, then run the gpuplan CLI with the rest of argv."""
    parser = argparse.ArgumentParser(prog="gpu_standin")
    parser.add_argument("--as", dest="gpu_product", required=True,
                        help="GFD product or catalog key the CPU stands in for")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else list(args.command)
    target = standin_target(args.gpu_product)
    real_resolve = runner.resolve_target

    def resolve_target(device: str) -> runner.Target:
        return dataclasses.replace(target) if device == "cpu" else real_resolve(device)

    runner.resolve_target = resolve_target
    return cli_main.main(command)


if __name__ == "__main__":
    sys.exit(main())
