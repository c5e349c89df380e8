"""Device names → specs: the local CPU by measuring it (cached), everything else by the catalog.

Kept apart from `catalog` so that reading the catalog never pulls in the CPU measurement.
"""

from __future__ import annotations

import functools
from pathlib import Path

from gpuplan_estimator.devices import local_cpu
from gpuplan_estimator.devices.catalog import (
    CPU_KEY,
    Catalog,
    DeviceSpec,
    load_catalog,
    normalize_name,
)


@functools.lru_cache(maxsize=8)
def _cpu_device(cache_dir: Path | None) -> DeviceSpec:
    return local_cpu.local_cpu_device(cache_dir=cache_dir)


def resolve_device(
    name: str, catalog: Catalog | None = None, *, cpu_cache_dir: Path | None = None
) -> DeviceSpec:
    """``cpu`` → the calibrated local CPU (measured once, then cached); anything else → catalog."""
    if normalize_name(name) == CPU_KEY:
        return _cpu_device(cpu_cache_dir)
    return (catalog if catalog is not None else load_catalog()).resolve(name)
