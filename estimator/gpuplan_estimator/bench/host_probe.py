"""The host probe: how fast this node's CPU issues PyTorch work (issue #30 part 1).

Eager PyTorch issues every kernel from one CPU thread, so a step whose kernels are short runs
at the speed of the host, not of the GPU: BERT-base at batch 16 trained slower in bf16 than in
fp32 on an H200. The step model (`step.host`) prices that host timeline from per-op costs; this
probe measures them on the node a benchmark Job runs on, in seconds of work, with torch only
(no database, no estimator stack), so it runs from a bare checkout on a lent GPU too:

    python -m gpuplan_estimator.bench.host_probe --device cuda --out host-probe.json

Each figure is the median over `repeats` of a loop of `ops` calls, timed on the wall clock
without synchronising inside the loop: the time the host takes to return from a call is the
time it takes to issue it, as long as the GPU keeps up (every kernel here is tiny).

- `eager_op_us`: one in-place add on a small tensor (the dispatcher plus one launch);
- `module_call_us`: one `nn.Linear` module call (Python `__call__` plus addmm);
- `linear_us` / `autocast_linear_us`: `F.linear` outside and inside `torch.autocast` (the
  second casts its operands first: two more kernels and their dispatch);
- `backward_node_us`: the autograd engine's cost per node of a chain of small ops;
- `optimizer_*_us_per_tensor`: AdamW's step per parameter tensor, per-tensor (for-loop),
  foreach (multi-tensor kernels) and fused (CUDA only);
- `sync_us`: a `synchronize()` with nothing queued; `launch_latency_us`: issue to completion
  of one tiny kernel, with its synchronize;
- `gpu_min_kernel_us`: GPU time per tiny kernel replayed back to back from a CUDA graph (the
  floor a kernel costs the stream, gaps included; CUDA only).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import shlex
import statistics
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

MODULE = "gpuplan_estimator.bench.host_probe"
PROBE_VERSION = 1
"""Bumped when a figure's meaning changes: stored probes of another version are not mixed."""


@dataclasses.dataclass(frozen=True)
class ProbeSettings:
    """How long the probe runs: `ops` calls per timed loop, `repeats` loops per figure."""

    device: str
    ops: int = 2000
    repeats: int = 5

    def __post_init__(self) -> None:
        if self.ops < 10 or self.repeats < 1:
            raise ValueError(f"ops must be >= 10 and repeats >= 1, got {self.ops}, {self.repeats}")


def _median_us(loop: Callable[[], None], count: int, repeats: int,
               sync: Callable[[], None], clock: Callable[[], float]) -> float:
    """Median over `repeats` of the wall time of `loop` (which runs `count` units) per unit,
    synchronised before and after each loop, once warmed up."""
    loop()
    sync()
    samples = []
    for _ in range(repeats):
        sync()
        start = clock()
        loop()
        sync()
        samples.append((clock() - start) * 1e6 / count)
    return statistics.median(samples)


def cpu_model() -> str:
    """The host CPU's model name (/proc/cpuinfo on Linux, else the platform's processor)."""
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def probe(settings: ProbeSettings, clock: Callable[[], float] = time.perf_counter
          ) -> dict[str, Any]:
    """Every figure of the probe on `settings.device`, in microseconds."""
    import torch

    device = torch.device(settings.device)
    cuda = device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    n, repeats = settings.ops, settings.repeats

    def timed(loop: Callable[[], None], count: int = n) -> float:
        return _median_us(loop, count, repeats, sync, clock)

    x = torch.ones(64, device=device)

    def adds() -> None:
        for _ in range(n):
            x.add_(1.0)

    linear = torch.nn.Linear(64, 64, device=device)
    inputs = torch.randn(8, 64, device=device)

    def module_calls() -> None:
        with torch.no_grad():
            for _ in range(n):
                linear(inputs)

    def linears() -> None:
        with torch.no_grad():
            for _ in range(n):
                torch.nn.functional.linear(inputs, linear.weight, linear.bias)

    autocast_dtype = torch.bfloat16

    def syncs() -> None:
        for _ in range(n):
            sync()

    def autocast_linears() -> None:
        with torch.no_grad(), torch.autocast(device_type=device.type, dtype=autocast_dtype):
            for _ in range(n):
                torch.nn.functional.linear(inputs, linear.weight, linear.bias)

    out: dict[str, Any] = {
        "eager_op_us": timed(adds),
        "module_call_us": timed(module_calls),
        "linear_us": timed(linears),
        "autocast_linear_us": timed(autocast_linears),
        "backward_node_us": _backward_node_us(torch, device, n, timed),
        **_optimizer_us(torch, device, timed),
        "sync_us": timed(syncs),
    }
    if cuda:
        def one_round_trip() -> None:
            for _ in range(n // 10):
                x.add_(1.0)
                sync()

        out["launch_latency_us"] = timed(one_round_trip, n // 10)
        out["gpu_min_kernel_us"] = _graph_kernel_us(torch, x)
    else:  # a CPU op runs on the issuing thread itself: nothing waits between issue and start
        out["launch_latency_us"] = 0.0
    return out


def _backward_node_us(torch: Any, device: Any, n: int,
                      timed: Callable[[Callable[[], None], int], float]) -> float:
    """Per autograd node: backward of a chain of `chain` multiply-adds on a small leaf."""
    chain = max(10, n // 10)
    leaf = torch.ones(64, device=device, requires_grad=True)

    def backward() -> None:
        y = leaf
        for _ in range(chain):
            y = y * 1.0001 + 0.5  # two nodes a link
        y.sum().backward()
        leaf.grad = None

    forward_only = timed(lambda: _chain(leaf, chain), 1)
    return max(0.0, (timed(backward, 1) - forward_only) / (2 * chain + 1))


def _chain(leaf: Any, chain: int) -> None:
    y = leaf
    for _ in range(chain):
        y = y * 1.0001 + 0.5
    y.sum()


def _optimizer_us(torch: Any, device: Any,
                  timed: Callable[[Callable[[], None], int], float]) -> dict[str, float]:
    """AdamW's step per parameter tensor, for each implementation the device has."""
    tensors = 200
    params = [torch.nn.Parameter(torch.randn(256, device=device)) for _ in range(tensors)]
    for p in params:
        p.grad = torch.randn_like(p)
    variants: dict[str, dict[str, bool]] = {"for_loop": {"foreach": False},
                                            "foreach": {"foreach": True}}
    if device.type == "cuda":
        variants["fused"] = {"fused": True}
    out = {}
    for name, flags in variants.items():
        optimizer = torch.optim.AdamW(params, lr=1e-4, **flags)
        out[f"optimizer_{name}_us_per_tensor"] = timed(optimizer.step, tensors)
    return out


def _graph_kernel_us(torch: Any, x: Any, kernels: int = 200, replays: int = 20) -> float:
    """GPU microseconds per tiny kernel, replayed from a CUDA graph (no host in the loop)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            x.add_(1.0)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(kernels):
            x.add_(1.0)
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return float(start.elapsed_time(end)) * 1000.0 / (kernels * replays)


def identity(settings: ProbeSettings, argv: list[str], commit: str,
             now: Callable[[], datetime] = lambda: datetime.now(UTC)) -> dict[str, Any]:
    """Where a probe's figures come from: CPU, cores, versions, device, date, command."""
    import os

    import torch

    row: dict[str, Any] = {
        "probe_version": PROBE_VERSION, "date": now().isoformat(timespec="seconds"),
        "command": shlex.join(["python", "-m", MODULE, *argv]), "commit": commit,
        "cpu_model": cpu_model(), "cpu_count": os.cpu_count(),
        "platform": platform.platform(), "python": platform.python_version(),
        "torch": torch.__version__, "device": settings.device,
        "torch_threads": torch.get_num_threads(), **dataclasses.asdict(settings)}
    if settings.device.startswith("cuda"):
        row["device_name"] = torch.cuda.get_device_name(torch.device(settings.device))
        row["cuda"] = torch.version.cuda
    return row


def measure(settings: ProbeSettings, *, command: str, commit: str,
            clock: Callable[[], float] = time.monotonic) -> dict[str, Any]:
    """One probe document: `identity` (with the command that ran it, e.g. `gpuplan bench`),
    the figures and the seconds it took."""
    started = clock()
    doc = {**identity(settings, [], commit), "command": command, "figures_us": probe(settings)}
    doc["wall_s"] = round(clock() - started, 2)
    return doc


def main(argv: list[str] | None = None) -> int:
    """Run the probe and write one JSON object: identity fields plus the figures."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", help="cpu, cuda or cuda:N")
    parser.add_argument("--out", type=Path, required=True, help="JSON file to write")
    parser.add_argument("--ops", type=int, default=2000, help="calls per timed loop")
    parser.add_argument("--repeats", type=int, default=5, help="timed loops per figure")
    parser.add_argument("--commit", default="", help="the commit measured (the device's copy "
                        "has no .git)")
    args = parser.parse_args(argv)
    try:
        settings = ProbeSettings(args.device, args.ops, args.repeats)
    except ValueError as exc:
        parser.error(str(exc))
    doc = measure(settings, command=shlex.join(["python", "-m", MODULE, *argv]),
                  commit=args.commit)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    print(json.dumps(doc["figures_us"], indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
