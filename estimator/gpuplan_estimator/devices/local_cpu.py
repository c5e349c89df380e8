"""The local CPU as a device: facts from /proc, FP32 peak and bandwidth calibrated by measuring.

Spec sheets do not say what numpy/onnxruntime reach on this machine (SIMD width, turbo, cgroup
CPU limits, memory channels), so a short measurement is the CPU's "datasheet". It runs once per
CPU model and core count and is cached as JSON with the date and the command that produced it.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from gpuplan_estimator.core import errors
from gpuplan_estimator.devices.catalog import CPU_KEY, DeviceSpec

CACHE_SCHEMA_VERSION = 1
MAX_CACHE_BYTES = 64 * 1024
COMMAND = "gpuplan_estimator.devices.local_cpu.local_cpu_device(measure=True)"


@dataclass(frozen=True)
class CalibrationSizes:
    """Problem sizes of the calibration; the defaults take ~1-2 s on a 2-core machine."""

    matmul_sizes: tuple[int, ...] = (256, 512, 1024)
    """Square float32 matmul sizes; the best GFLOP/s over all of them is the peak."""
    matmul_repeats: int = 3
    copy_bytes: int = 128 * 2**20
    """Size of the copied array: far above any L3 so the copy streams from DRAM."""
    copy_repeats: int = 3


@dataclass(frozen=True)
class HostPeaks:
    """Measured peak float32 GFLOP/s and memory bandwidth (GB/s) of this host."""
    peak_gflops_fp32: float
    mem_bandwidth_gbps: float  # bytes read + bytes written per second, GB/s


@dataclass(frozen=True)
class HostFacts:
    """Facts about this host's CPU read from /proc and /sys."""
    model_name: str
    cores: int
    memory_bytes: int
    max_clock_mhz: float  # 0.0 when /proc does not say
    l2_cache_mb: float  # per core, 0.0 when sysfs does not say


def measure(
    sizes: CalibrationSizes, *, timer: Callable[[], float] = time.perf_counter
) -> HostPeaks:
    """Best float32 matmul GFLOP/s and best array-copy GB/s (read + write counted)."""
    rng = np.random.default_rng(0)
    best_gflops = 0.0
    for n in sizes.matmul_sizes:
        a = rng.standard_normal((n, n), dtype=np.float32)
        b = rng.standard_normal((n, n), dtype=np.float32)
        a @ b  # warm-up: BLAS thread pool start and page faults are not the steady state
        for _ in range(sizes.matmul_repeats):
            start = timer()
            a @ b
            best_gflops = max(best_gflops, 2.0 * n**3 / max(timer() - start, 1e-9) / 1e9)
    src = np.ones(sizes.copy_bytes // 4, dtype=np.float32)
    dst = np.empty_like(src)
    np.copyto(dst, src)
    best_gbps = 0.0
    for _ in range(sizes.copy_repeats):
        start = timer()
        np.copyto(dst, src)
        best_gbps = max(best_gbps, 2.0 * src.nbytes / max(timer() - start, 1e-9) / 1e9)
    return HostPeaks(peak_gflops_fp32=best_gflops, mem_bandwidth_gbps=best_gbps)


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def host_facts(proc_root: Path = Path("/proc"), sys_root: Path = Path("/sys")) -> HostFacts:
    """CPU model, usable cores (affinity, so containers count right), memory, clock, L2."""
    cpuinfo = _read(proc_root / "cpuinfo")
    model = next(
        (m.group(1).strip() for m in re.finditer(r"^(?:model name|Model|Processor)\s*:\s*(.+)$",
                                                  cpuinfo, re.MULTILINE)),
        "unknown cpu",
    )
    mhz = [float(x) for x in re.findall(r"^cpu MHz\s*:\s*([\d.]+)", cpuinfo, re.MULTILINE)]
    meminfo = re.search(r"^MemTotal:\s*(\d+)\s*kB", _read(proc_root / "meminfo"), re.MULTILINE)
    if meminfo is None:
        raise errors.CalibrationError(f"{proc_root / 'meminfo'}: no MemTotal line")
    return HostFacts(
        model_name=model, cores=len(os.sched_getaffinity(0)),
        memory_bytes=int(meminfo.group(1)) * 1024, max_clock_mhz=max(mhz, default=0.0),
        l2_cache_mb=_l2_mb(sys_root / "devices/system/cpu/cpu0/cache"),
    )


def _l2_mb(cache_dir: Path) -> float:
    for index in sorted(cache_dir.glob("index*")):
        if _read(index / "level").strip() == "2":
            size = re.match(r"(\d+)([KM]?)", _read(index / "size").strip())
            if size:
                return int(size.group(1)) / {"K": 1024.0, "M": 1.0, "": 2.0**20}[size.group(2)]
    return 0.0


def default_cache_dir() -> Path:
    """Directory for cached calibrations: ``$XDG_CACHE_HOME/gpuplan`` or ~/.cache."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "gpuplan"


def cache_path(cache_dir: Path, facts: HostFacts) -> Path:
    """The host-peaks cache file for this CPU model and core count inside `cache_dir`."""
    slug = re.sub(r"[^a-z0-9]+", "-", facts.model_name.lower()).strip("-") or "cpu"
    return cache_dir / f"cpu-{slug[:80]}-{facts.cores}c.json"


def _read_cache(path: Path) -> HostPeaks | None:
    """The cached calibration, or None when absent or unusable (a corrupt file is re-measured)."""
    if not path.is_file() or path.stat().st_size > MAX_CACHE_BYTES:
        return None
    try:
        doc: Any = json.loads(path.read_text(encoding="utf-8"))
        if doc.get("schema_version") != CACHE_SCHEMA_VERSION:
            return None
        cal = HostPeaks(float(doc["peak_gflops_fp32"]), float(doc["mem_bandwidth_gbps"]))
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
    return cal if cal.peak_gflops_fp32 > 0 and cal.mem_bandwidth_gbps > 0 else None


def _write_cache(path: Path, facts: HostFacts, cal: HostPeaks, sizes: CalibrationSizes,
                 measured_at: float) -> None:
    doc = {
        "schema_version": CACHE_SCHEMA_VERSION,
        "cpu_model": facts.model_name, "cores": facts.cores,
        **asdict(cal),
        "measured_at": datetime.fromtimestamp(measured_at, UTC).isoformat(),
        "measured_at_unix": measured_at,
        "command": COMMAND, "python": sys.version.split()[0], "numpy": np.__version__,
        # A busy machine calibrates low and the cache keeps it; the load says whether to re-run.
        "loadavg_1m": os.getloadavg()[0],
        "sizes": asdict(sizes),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    tmp.replace(path)  # atomic: a concurrent reader never sees half a file


def to_device(facts: HostFacts, cal: HostPeaks, source: str) -> DeviceSpec:
    """Host facts + calibration → the `cpu` DeviceSpec (pure)."""
    return DeviceSpec(
        key=CPU_KEY, name=facts.model_name, vendor="cpu", memory_bytes=facts.memory_bytes,
        mem_bandwidth_gbps=cal.mem_bandwidth_gbps,
        peak_tflops={"fp32": cal.peak_gflops_fp32 / 1000.0},
        sm_count=facts.cores, boost_clock_mhz=facts.max_clock_mhz, l2_cache_mb=facts.l2_cache_mb,
        interconnect="none", nvml_names=(), gfd_products=(), cores_per_sm=1, source=source,
        notes="peak fp32 and bandwidth measured on this machine; other dtypes use the fp32 peak",
    )


def local_cpu_device(
    *,
    cache_dir: Path | None = None,
    measure: bool = True,
    clock: Callable[[], float] = time.time,
    sizes: CalibrationSizes = CalibrationSizes(),
    measure_fn: Callable[[CalibrationSizes], HostPeaks] | None = None,
    facts: HostFacts | None = None,
) -> DeviceSpec:
    """The local CPU as a `DeviceSpec` keyed ``cpu``; measures once, then reads the JSON cache.

    ``measure=False`` without a usable cache raises `CalibrationError` instead of measuring.
    """
    facts = facts if facts is not None else host_facts()
    path = cache_path(cache_dir if cache_dir is not None else default_cache_dir(), facts)
    cal = _read_cache(path)
    if cal is None:
        if not measure:
            raise errors.CalibrationError(
                f"no CPU calibration at {path}; run `gpuplan bench --device cpu` or allow measuring"
            )
        cal = (measure_fn or _measure_default)(sizes)
        if not (cal.peak_gflops_fp32 > 0 and cal.mem_bandwidth_gbps > 0):
            raise errors.CalibrationError(f"CPU calibration measured nothing: {cal}")
        _write_cache(path, facts, cal, sizes, clock())
    return to_device(facts, cal, source=f"measured, cached in {path}")


def _measure_default(sizes: CalibrationSizes) -> HostPeaks:
    return measure(sizes)
