"""Timing protocol for one single-kernel unit (an ONNX graph on onnxruntime, or a torch layer).

Per repeat: N+1 timed runs, the first dropped (it pays allocation and first-touch costs), the mean
of runs 2..N+1 kept — the "mean of steps 2..N+1" protocol of the Dell EMC benchmark database.
R repeats give the kept statistic (median) and its dispersion (std, min). N adapts to the
kernel's duration so each repeat lasts about `target_repeat_ms` within [min_runs, max_runs].
"""

from __future__ import annotations

import math
import os
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import onnxruntime as ort

from gpuplan_estimator.bench.units import Unit
from gpuplan_estimator.core import errors

Clock = Callable[[], float]  # seconds, monotonic


@dataclass(frozen=True)
class TimingSettings:
    """How long and how often each kernel is timed."""

    warmup_runs: int = 2
    """Untimed runs right after session creation."""
    repeats: int = 5
    """R: independent repeats; the median of their means is the kept latency."""
    min_runs: int = 2
    """Lower bound of N, timed runs kept per repeat."""
    max_runs: int = 50
    """Upper bound of N."""
    target_repeat_ms: float = 40.0
    """N is chosen so a repeat takes about this long."""
    intra_op_threads: int = 0
    """onnxruntime intra-op threads; 0 means all cores available to this process."""
    sessions: int = 1
    """Repeats are spread round-robin over this many fresh sessions (each warmed up), so the
    median is also taken across sessions: on a 2-core VM a session's speed can differ from the
    next one's by 15-20 % while its repeats agree within ~5 %."""

    def validate(self) -> None:
        """Raise InvalidRequestError when a count is below its minimum or min_runs > max_runs."""
        for name in ("warmup_runs", "repeats", "min_runs", "max_runs", "sessions"):
            if getattr(self, name) < (0 if name == "warmup_runs" else 1):
                raise errors.InvalidRequestError(name, f"too small: {getattr(self, name)}")
        if self.min_runs > self.max_runs:
            raise errors.InvalidRequestError("min_runs", "must be <= max_runs")


@dataclass(frozen=True)
class TimingResult:
    """Timed latency of one unit in ms: median, std and min over repeats, and run counts."""
    latency_ms: float  # median over repeats of the per-repeat mean of runs 2..N+1
    latency_std_ms: float
    latency_min_ms: float
    repeats: int
    runs_per_repeat: int


def available_cores() -> int:
    """CPU cores this process may run on (its affinity mask where the OS has one)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def resolved_threads(settings: TimingSettings) -> int:
    """Intra-op thread count to use: the setting, or every available core when 0."""
    return settings.intra_op_threads or available_cores()


def summarize(per_repeat_runs_ms: Sequence[Sequence[float]]) -> TimingResult:
    """Reduce raw run times (ms) per repeat to the kept statistic; first run of each dropped."""
    if not per_repeat_runs_ms:
        raise errors.GpuplanError("no timing repeats to summarize")
    means = []
    for runs in per_repeat_runs_ms:
        if len(runs) < 2:
            raise errors.GpuplanError("each repeat needs at least 2 runs (the first is dropped)")
        kept = runs[1:]
        means.append(sum(kept) / len(kept))
    std = statistics.stdev(means) if len(means) > 1 else 0.0
    return TimingResult(
        latency_ms=statistics.median(means),
        latency_std_ms=std,
        latency_min_ms=min(means),
        repeats=len(means),
        runs_per_repeat=len(per_repeat_runs_ms[0]) - 1,
    )


def choose_runs(estimate_ms: float, settings: TimingSettings) -> int:
    """N, the timed runs per repeat, so a repeat lasts about target_repeat_ms."""
    if estimate_ms <= 0 or not math.isfinite(estimate_ms):
        return settings.max_runs
    n = int(settings.target_repeat_ms / estimate_ms)
    return max(settings.min_runs, min(settings.max_runs, n))


def make_session(
    unit: Unit, *, provider: str, settings: TimingSettings, device_id: int = 0
) -> ort.InferenceSession:
    """An onnxruntime session for `unit` on `provider`; raises if it is unavailable."""
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = resolved_threads(settings)
    opts.inter_op_num_threads = 1
    opts.log_severity_level = 3
    provider_options: list[dict[str, Any]] = [{}]
    if provider == "CUDAExecutionProvider":
        provider_options = [{"device_id": device_id}]
    if provider not in ort.get_available_providers():
        raise errors.GpuplanError(
            f"onnxruntime {ort.__version__} has no {provider} "
            f"(available: {', '.join(ort.get_available_providers())})"
        )
    return ort.InferenceSession(
        unit.model.SerializeToString(), opts, providers=[provider],
        provider_options=provider_options,
    )


def time_unit(
    unit: Unit,
    *,
    provider: str,
    settings: TimingSettings,
    device_id: int = 0,
    clock: Clock = time.perf_counter,
) -> TimingResult:
    """Time `unit` with the protocol of this module's docstring."""
    settings.validate()
    timers: list[Callable[[], float]] = []
    for _ in range(min(settings.sessions, settings.repeats)):
        session = make_session(unit, provider=provider, settings=settings, device_id=device_id)
        run = _runner(session, unit.feeds, provider=provider, device_id=device_id)
        timers.append(timer(run, clock))
    return time_runs(timers, settings)


def time_runs(timers: Sequence[Callable[[], float]], settings: TimingSettings) -> TimingResult:
    """Run the timing protocol over already built timers (each returns one run's ms).

    Repeats are spread round-robin over the timers; shared by the onnxruntime sessions and the
    torch backend.
    """
    settings.validate()
    warm = [[one() for _ in range(settings.warmup_runs)] for one in timers]
    first = warm[0]
    n = choose_runs(min(first) if first else timers[0](), settings)
    per_repeat = [[timers[r % len(timers)]() for _ in range(n + 1)]
                  for r in range(settings.repeats)]
    return summarize(per_repeat)


def timer(run: Callable[[], object], clock: Clock = time.perf_counter) -> Callable[[], float]:
    """A no-argument callable timing one call of `run` in ms."""

    def one() -> float:
        start = clock()
        run()
        return (clock() - start) * 1000.0

    return one


def _runner(
    session: ort.InferenceSession, feeds: Mapping[str, Any], *, provider: str, device_id: int
) -> Callable[[], None]:
    """A no-argument callable running the session once.

    On CUDA, inputs and outputs stay on the device (IO binding) so host<->device copies are not
    timed as part of the kernel; the run synchronises before returning.
    """
    if provider != "CUDAExecutionProvider":
        run_options = ort.RunOptions()
        return lambda: (session.run(None, dict(feeds), run_options), None)[1]
    binding = session.io_binding()
    for name, value in feeds.items():
        binding.bind_ortvalue_input(
            name, ort.OrtValue.ortvalue_from_numpy(value, "cuda", device_id)
        )
    for out in session.get_outputs():
        binding.bind_output(out.name, "cuda", device_id)

    def run() -> None:
        session.run_with_iobinding(binding)
        binding.synchronize_outputs()

    return run
