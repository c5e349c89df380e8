"""NVML (nvidia-ml-py) device identity and power sampling; absent on CPU-only hosts.

Every call degrades to "unknown" (None) when NVML cannot be initialised: a CPU benchmark or a
host without the driver is normal, not an error.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

try:  # nvidia-ml-py is a declared dependency, but keep CPU hosts working if it is missing
    import pynvml
except ImportError:  # pragma: no cover - depends on the environment
    pynvml = None


@dataclass(frozen=True)
class NvmlIdentity:
    """NVML's identity, memory, clocks and power limit of one GPU."""
    index: int
    name: str  # e.g. "NVIDIA A100-SXM4-80GB", what the catalog resolves
    uuid: str
    memory_bytes: int
    driver_version: str
    max_sm_clock_mhz: int
    max_mem_clock_mhz: int
    power_limit_watts: float


def _init() -> bool:
    if pynvml is None:
        return False
    try:
        pynvml.nvmlInit()
    except Exception:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
        return False
    return True


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def device_identity(index: int) -> NvmlIdentity | None:
    """Identity and clocks of GPU `index`, or None when NVML is unavailable."""
    if not _init():
        return None
    assert pynvml is not None
    try:
        h = pynvml.nvmlDeviceGetHandleByIndex(index)
        return NvmlIdentity(
            index=index,
            name=_text(pynvml.nvmlDeviceGetName(h)),
            uuid=_text(pynvml.nvmlDeviceGetUUID(h)),
            memory_bytes=int(pynvml.nvmlDeviceGetMemoryInfo(h).total),
            driver_version=_text(pynvml.nvmlSystemGetDriverVersion()),
            max_sm_clock_mhz=int(pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_SM)),
            max_mem_clock_mhz=int(pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_MEM)),
            power_limit_watts=pynvml.nvmlDeviceGetPowerManagementLimit(h) / 1000.0,
        )
    finally:
        pynvml.nvmlShutdown()


@dataclass
class PowerSampler:
    """Samples board power (W) and SM clock (MHz) of one GPU in a background thread.

    Use as a context manager around a kernel's timing; `mean_watts` / `mean_sm_clock_mhz` are
    None when NVML is unavailable or nothing was sampled.
    """

    index: int
    interval_s: float = 0.02
    clock: Callable[[], float] = time.monotonic
    samples_watts: list[float] = field(default_factory=list)
    samples_sm_clock_mhz: list[float] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _handle: Any = None

    def __enter__(self) -> PowerSampler:
        self.samples_watts.clear()
        self.samples_sm_clock_mhz.clear()
        self._stop.clear()
        if _init():
            assert pynvml is not None
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(self.index)
            self._thread = threading.Thread(target=self._loop, daemon=True)
            self._thread.start()
        return self

    def _loop(self) -> None:
        assert pynvml is not None
        while not self._stop.is_set():
            try:
                watts = pynvml.nvmlDeviceGetPowerUsage(self._handle) / 1000.0
                clock = pynvml.nvmlDeviceGetClockInfo(self._handle, pynvml.NVML_CLOCK_SM)
            except Exception:  # a board without power readout: stop sampling quietly
                return
            self.samples_watts.append(watts)
            self.samples_sm_clock_mhz.append(float(clock))
            self._stop.wait(self.interval_s)

    def __exit__(
        self,
        _t: type[BaseException] | None,
        _e: BaseException | None,
        _tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2.0)
            assert pynvml is not None
            pynvml.nvmlShutdown()
            self._thread = None

    @property
    def mean_watts(self) -> float | None:
        """Mean sampled board power in watts, or None when nothing was sampled."""
        return _mean(self.samples_watts)

    @property
    def mean_sm_clock_mhz(self) -> float | None:
        """Mean sampled SM clock in MHz, or None when nothing was sampled."""
        return _mean(self.samples_sm_clock_mhz)


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None
