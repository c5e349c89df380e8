"""Tiny sweep specs, fast timing and a CPU target for the bench tests (fixtures: conftest)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpuplan_estimator.bench import runner, timing
from gpuplan_estimator.devices.catalog import DeviceSpec

TINY = {
    "gemm.yaml": """
kernel: gemm
ops: [matmul]
dims: {batch: {choice: [1, 2]}, m: {log: [1, 32]}, k: {log: [1, 32]}, n: {log: [1, 32]},
       bias: {choice: [0, 1]}}
limits: {cpu: {max_flops: 1.0e6, max_bytes: 1.0e6}}
""",
    "softmax.yaml": """
kernel: softmax
ops: [softmax]
dims: {rows: {log: [1, 64]}, cols: {log: [1, 64]}}
limits: {cpu: {max_flops: 1.0e6, max_bytes: 1.0e6}}
""",
}
FAST = timing.TimingSettings(warmup_runs=1, repeats=2, min_runs=2, max_runs=3)
CPU_SPEC = DeviceSpec(key="cpu", name="Test CPU", vendor="cpu", memory_bytes=1 << 30,
                      mem_bandwidth_gbps=10.0, peak_tflops={"fp32": 0.1}, sm_count=2,
                      boost_clock_mhz=2000.0, l2_cache_mb=1.0)
TARGET = runner.Target("cpu", 0, "cpu", CPU_SPEC, None, "CPUExecutionProvider")


def settings(sweep_dir: Path, **kw: Any) -> runner.BenchSettings:
    base: dict[str, Any] = {"samples": 8, "seed": 5, "sweep_paths": (str(sweep_dir),),
                            "timing": FAST, "budget_minutes": 5.0}
    return runner.BenchSettings(**{**base, **kw})
