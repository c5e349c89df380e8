"""Many kernels per timed launch: the batched timing protocol of ``gpuplan bench --batch-size``.

The per-row protocol (`timing`) synchronises the device around every run, so on a GPU a
kernel of 10 µs costs a row ~0.3 s of Python, launches and syncs: 125 rows/min on an H200.
Here a batch of items of one family is built at once and:

1. each item's forward runs once (warm-up: allocations, cuBLAS/cuDNN heuristics), then once
   more between two events to estimate its duration, with one synchronisation for the batch
   (on a CPU the timed first call is both);
2. each item gets K repetitions per timed launch, K = target_launch_ms / estimate within
   [1, max_reps]; with ``graph`` timing the K calls are captured in one CUDA graph
   (`torch.cuda.CUDAGraph`), so launch overhead and Python are not in the number; an item whose
   capture fails falls back to ``events`` (K eager calls between two events);
3. `repeats` launches of every item, round-robin over the batch, all queued before one final
   synchronisation; a row keeps the median over launches of (launch time / K).

Forward+backward is timed on every `backward_every`-th item, eagerly between events (autograd
is not captured). CPU runs the same steps with perf_counter and no graphs, so tests and a
rehearsal exercise the batching here.
"""

from __future__ import annotations

import contextlib
import math
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from gpuplan_estimator.bench import timing
from gpuplan_estimator.bench.torch_units import TorchUnit
from gpuplan_estimator.core import errors

TIMING_MODES = ("graph", "events")
MAX_BATCH_SIZE = 256
Clock = Callable[[], float]


@dataclass(frozen=True)
class BatchSettings:
    """How a batch of kernels is timed."""

    batch_size: int = 16
    """Items built and timed together (one family, one precision)."""
    mode: str = "graph"
    """``graph`` (CUDA graph of K calls per launch) or ``events``; CPU always times eagerly."""
    repeats: int = 5
    """Timed launches per item; the row keeps their median."""
    target_launch_ms: float = 1.0
    """K is chosen so one launch takes about this long."""
    max_reps: int = 256
    """Upper bound of K."""
    max_item_bytes: float = 2.0 * 2**30
    """Items that move more bytes than this (`shapes.cost`) are skipped: device memory cap."""
    max_batch_bytes: float = 8.0 * 2**30
    """A batch closes before its items' bytes would pass this."""
    backward_every: int = 4
    """Forward+backward is timed on every n-th item of a batch (0: never)."""

    def validate(self) -> None:
        """Raise InvalidRequestError naming the field that is out of range."""
        if not 1 <= self.batch_size <= MAX_BATCH_SIZE:
            raise errors.InvalidRequestError(
                "batch_size", f"must be in [1, {MAX_BATCH_SIZE}], got {self.batch_size}")
        if self.mode not in TIMING_MODES:
            raise errors.InvalidRequestError(
                "timing", f"expected one of {', '.join(TIMING_MODES)}, got {self.mode!r}")
        for name in ("repeats", "max_reps"):
            if getattr(self, name) < 1:
                raise errors.InvalidRequestError(name, f"must be >= 1, got {getattr(self, name)}")
        if not self.target_launch_ms > 0:
            raise errors.InvalidRequestError("target_launch_ms", "must be > 0")
        if not (self.max_item_bytes > 0 and self.max_batch_bytes >= self.max_item_bytes):
            raise errors.InvalidRequestError(
                "max_batch_bytes", "must be >= max_item_bytes > 0")
        if self.backward_every < 0:
            raise errors.InvalidRequestError("backward_every", "must be >= 0")


def reps_per_launch(estimate_ms: float, settings: BatchSettings) -> int:
    """K: calls per timed launch so a launch lasts about `target_launch_ms`."""
    if not (estimate_ms > 0 and math.isfinite(estimate_ms)):
        return settings.max_reps
    return max(1, min(settings.max_reps, int(settings.target_launch_ms / estimate_ms)))


def take_batch(
    queue: Sequence[Any], sizes_bytes: Sequence[float], settings: BatchSettings
) -> tuple[list[int], list[int]]:
    """(indices to time now, indices to skip as too big) from the head of `queue`.

    Takes up to `batch_size` items in order; stops before the bytes of the batch would pass
    `max_batch_bytes`. Items over `max_item_bytes` are skipped (reported, never built). Always
    makes progress: the first item that fits is taken even if alone it fills the batch.
    """
    take: list[int] = []
    skip: list[int] = []
    total = 0.0
    for i, nbytes in enumerate(sizes_bytes[: len(queue)]):
        if len(take) >= settings.batch_size:
            break
        if nbytes > settings.max_item_bytes:
            skip.append(i)
            continue
        if take and total + nbytes > settings.max_batch_bytes:
            break
        take.append(i)
        total += nbytes
    return take, skip


@dataclass(frozen=True)
class ItemTiming:
    """Timing of one item of a batch: forward, optional forward+backward, how it was timed."""

    forward: timing.TimingResult
    forward_backward: timing.TimingResult | None
    method: str  # graph | events | perf_counter


def summarize_launches(launch_ms: Sequence[float], reps: int) -> timing.TimingResult:
    """Per-call latency from `repeats` launches of `reps` calls each (median, std, min)."""
    if not launch_ms or reps < 1:
        raise errors.GpuplanError("no timed launches to summarize")
    per_call = [ms / reps for ms in launch_ms]
    return timing.TimingResult(
        latency_ms=statistics.median(per_call),
        latency_std_ms=statistics.stdev(per_call) if len(per_call) > 1 else 0.0,
        latency_min_ms=min(per_call),
        repeats=len(per_call),
        runs_per_repeat=reps,
    )


def fitting_prefix(costs_ms: Sequence[float], budget_ms: float) -> int:
    """How many leading items' timing costs fit in `budget_ms` (at least 0, at most all)."""
    total, n = 0.0, 0
    for cost in costs_ms:
        total += cost
        if total > budget_ms:
            break
        n += 1
    return n


def time_batch(
    units: Sequence[TorchUnit], *, torch: Any, device: str, settings: BatchSettings,
    budget_s: float = math.inf, clock: Clock = time.perf_counter,
) -> list[ItemTiming]:
    """Time the units of a batch with the protocol of this module's docstring.

    Returns timings for a prefix of `units`: the items whose timed launches, as estimated,
    fit in what is left of `budget_s` after warm-up and estimates (the run's budget is a limit,
    not a target).
    """
    settings.validate()
    if device.startswith("cuda"):
        return _CudaBatch(torch, units, settings, clock() + budget_s, clock).run()
    return _time_batch_cpu(units, settings, clock() + budget_s, clock)


def _launch_cost_ms(fwd_ms: float, fwd_k: int, bwd_ms: float, bwd_k: int, repeats: int) -> float:
    return repeats * (fwd_ms * fwd_k + bwd_ms * bwd_k)


def _backward_wanted(index: int, settings: BatchSettings) -> bool:
    return settings.backward_every > 0 and index % settings.backward_every == 0


def _time_batch_cpu(
    units: Sequence[TorchUnit], settings: BatchSettings, deadline: float, clock: Clock
) -> list[ItemTiming]:
    def launch(fn: Callable[[], Any], reps: int) -> float:
        start = clock()
        for _ in range(reps):
            fn()
        return (clock() - start) * 1000.0

    fwd_est: list[float] = []
    bwd_est: list[float] = []
    for i, u in enumerate(units):
        if clock() >= deadline:
            break
        # On a CPU the first call is as fast as the next (no heuristics, no lazy init worth
        # a separate run): it is both the warm-up and the estimate.
        fwd_est.append(launch(u.forward, 1))
        back = _backward_wanted(i, settings) and clock() < deadline
        bwd_est.append(launch(u.forward_backward, 1) if back else 0.0)
    fwd_k = [reps_per_launch(ms, settings) for ms in fwd_est]
    bwd_k = [reps_per_launch(ms, settings) if ms else 0 for ms in bwd_est]
    costs = [_launch_cost_ms(*c, settings.repeats)
             for c in zip(fwd_est, fwd_k, bwd_est, bwd_k, strict=True)]
    units = units[: fitting_prefix(costs, 1000.0 * (deadline - clock()))]
    fwd_ms: list[list[float]] = [[] for _ in units]
    bwd_ms: list[list[float]] = [[] for _ in units]
    for _ in range(settings.repeats):
        for i, u in enumerate(units):
            fwd_ms[i].append(launch(u.forward, fwd_k[i]))
            if bwd_k[i]:
                bwd_ms[i].append(launch(u.forward_backward, bwd_k[i]))
    return [ItemTiming(summarize_launches(fwd_ms[i], fwd_k[i]),
                       summarize_launches(bwd_ms[i], bwd_k[i]) if bwd_k[i] else None,
                       "perf_counter") for i in range(len(units))]


class _CudaBatch:
    """One batch on a CUDA device: events queued for every launch, one final synchronise."""

    def __init__(
        self, torch: Any, units: Sequence[TorchUnit], settings: BatchSettings, deadline: float,
        clock: Clock,
    ) -> None:
        self.torch, self.units, self.settings = torch, units, settings
        self.deadline, self.clock = deadline, clock

    def _event(self) -> Any:
        return self.torch.cuda.Event(enable_timing=True)

    def run(self) -> list[ItemTiming]:
        torch, s = self.torch, self.settings
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        # Warm-up on a side stream, as torch.cuda.graph asks before a capture: cuBLAS and
        # cuDNN set up their per-stream state and workspaces outside the capture.
        with torch.cuda.stream(side):
            for u in self.units:
                u.forward()
        torch.cuda.current_stream().wait_stream(side)
        estimates = self._estimate([u.forward for u in self.units])
        fwd_k = [reps_per_launch(ms, s) for ms in estimates]
        back = [i for i in range(len(self.units)) if _backward_wanted(i, s)]
        bwd_est = self._estimate([self.units[i].forward_backward for i in back])
        bwd_k = dict(zip(back, (reps_per_launch(ms, s) for ms in bwd_est), strict=True))
        bwd_ms = dict(zip(back, bwd_est, strict=True))
        costs = [_launch_cost_ms(ms, k, bwd_ms.get(i, 0.0), bwd_k.get(i, 0), s.repeats)
                 for i, (ms, k) in enumerate(zip(estimates, fwd_k, strict=True))]
        keep = fitting_prefix(costs, 1000.0 * (self.deadline - self.clock()))
        self.units = self.units[:keep]
        back = [i for i in back if i < keep]
        launches: list[Callable[[], None]] = []
        methods: list[str] = []
        graphs: list[Any] = []
        for u, k in zip(self.units, fwd_k, strict=False):
            graph = self._capture(u.forward, k) if s.mode == "graph" else None
            graphs.append(graph)
            launches.append(graph.replay if graph is not None else _eager(u.forward, k))
            methods.append("graph" if graph is not None else "events")
        fwd_ev = [[self._pair() for _ in range(s.repeats)] for _ in self.units]
        bwd_ev = {i: [self._pair() for _ in range(s.repeats)] for i in back}
        for r in range(s.repeats):
            for i, fn in enumerate(launches):
                with _timed(fwd_ev[i][r]):
                    fn()
                if i in bwd_ev:
                    with _timed(bwd_ev[i][r]):
                        _eager(self.units[i].forward_backward, bwd_k[i])()
        torch.cuda.synchronize()
        out = []
        for i in range(len(self.units)):
            fwd = summarize_launches([a.elapsed_time(b) for a, b in fwd_ev[i]], fwd_k[i])
            bwd = (summarize_launches([a.elapsed_time(b) for a, b in bwd_ev[i]], bwd_k[i])
                   if i in bwd_ev else None)
            out.append(ItemTiming(fwd, bwd, methods[i]))
        del graphs  # frees the graphs' private memory pools with the batch
        return out

    def _pair(self) -> tuple[Any, Any]:
        return self._event(), self._event()

    def _estimate(self, fns: Sequence[Callable[[], Any]]) -> list[float]:
        pairs = [self._pair() for _ in fns]
        for fn, pair in zip(fns, pairs, strict=True):
            with _timed(pair):
                fn()
        self.torch.cuda.synchronize()
        return [a.elapsed_time(b) for a, b in pairs]

    def _capture(self, fn: Callable[[], Any], reps: int) -> Any:
        torch = self.torch
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph):
                for _ in range(reps):
                    fn()
        except RuntimeError:
            # Not capturable (an op that synchronises or allocates host memory): time it
            # eagerly. The failed capture has been ended by torch.cuda.graph's exit.
            torch.cuda.synchronize()
            return None
        return graph


@contextlib.contextmanager
def _timed(pair: tuple[Any, Any]) -> Iterator[None]:
    pair[0].record()
    yield
    pair[1].record()


def _eager(fn: Callable[[], Any], reps: int) -> Callable[[], None]:
    def run() -> None:
        for _ in range(reps):
            fn()

    return run
