"""GPU/CPU device specs (data in `data/gpus.yaml`) and name resolution.

Placeholder contract: the catalog loader and resolver are filled in by the catalog work.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class DeviceSpec:
    """Spec-sheet facts of one device type; units in the names."""

    key: str  # canonical catalog key, e.g. "h100-sxm-80gb"
    name: str  # marketing name
    vendor: str  # nvidia | amd | cpu
    memory_bytes: int
    mem_bandwidth_gbps: float  # GB/s, 1e9 bytes per second
    peak_tflops: Mapping[str, float]  # dense, per dtype: fp32, tf32, fp16, bf16, fp8 (tensor cores where present)
    sm_count: int  # SMs (NVIDIA), CUs (AMD), physical cores (CPU)
    boost_clock_mhz: float
    l2_cache_mb: float
    tdp_watts: float = 0.0
    price_per_hour_usd: float = 0.0  # indicative, overridable
    interconnect: str = ""  # e.g. "nvlink4", "pcie4"
    interconnect_gbps: float = 0.0  # per-GPU bidirectional GB/s used for all-reduce
    nvml_names: tuple[str, ...] = ()
    gfd_products: tuple[str, ...] = ()  # nvidia.com/gpu.product label values
    cores_per_sm: int = 0
    base_clock_mhz: float = 0.0
    source: str = ""  # where the numbers come from
    extra: Mapping[str, float] = field(default_factory=dict)
