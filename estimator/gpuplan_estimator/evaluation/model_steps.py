"""Whole-model PyTorch steps of real architectures, timed on one device (issue #18 part 4).

The labels a lent GPU should bring back: GPT-2 small/medium, BERT-base/large, OPT-350M,
ResNet-50 and ViT-B/16, built from their public configurations with random weights (no
download: the device machine has no network), at two or three batch sizes, in fp32, tf32 and
bf16 (autocast over fp32 weights, the usual mixed precision). Each row holds the median and
P10/P90 over repeats of the inference forward, and of the training step's forward, backward
and AdamW step timed apart, with peak memory for each, and the device's identity and clocks.

    python -m gpuplan_estimator.evaluation.model_steps --device cuda --out steps.jsonl

Only torch, transformers, torchvision and nvidia-ml-py are imported (all on the device image;
the estimator's LightGBM and database stack are not), so the command runs from a bare checkout
with `PYTHONPATH=estimator`. A run stops starting new configurations once `--budget-s` has
passed and writes them as skipped, so it ends inside a device lease.

Timing: `warmup` untimed steps, then `repeats` timed ones; on CUDA each phase is bracketed by
CUDA events on the current stream and read after one synchronize per step.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import itertools
import json
import shlex
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gpuplan_estimator.bench import nvml
from gpuplan_estimator.bench.targets import parse_device
from gpuplan_estimator.core import errors, provenance

MODULE = "gpuplan_estimator.evaluation.model_steps"
PRECISIONS = ("fp32", "tf32", "bf16")
FRAMEWORKS = ("eager", "compiled")
IMAGE_CLASSES = 1000


@dataclasses.dataclass(frozen=True)
class ModelCase:
    """One architecture: how to build it and the shapes to run it at."""

    name: str
    source: str  # "causal-lm" / "masked-lm" (transformers) or "torchvision"
    arch: str  # transformers model_type, or torchvision's builder name
    config: Mapping[str, Any]
    batches: tuple[int, ...]
    sequence: int | None = None  # tokens per sample (text models)
    image_size: int | None = None  # pixels per side (vision models)


_GPT2_SMALL = {"n_layer": 12, "n_embd": 768, "n_head": 12, "n_positions": 1024,
               "vocab_size": 50257}
# Published architecture sizes of each model's public config (facts, no weights).
FULL_CASES = (
    ModelCase("gpt2-small", "causal-lm", "gpt2", _GPT2_SMALL, (4, 8, 16), sequence=512),
    ModelCase("gpt2-medium", "causal-lm", "gpt2",
              {**_GPT2_SMALL, "n_layer": 24, "n_embd": 1024, "n_head": 16}, (4, 8), sequence=512),
    ModelCase("bert-base", "masked-lm", "bert",
              {"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12,
               "intermediate_size": 3072, "vocab_size": 30522}, (16, 32, 64), sequence=128),
    ModelCase("bert-large", "masked-lm", "bert",
              {"hidden_size": 1024, "num_hidden_layers": 24, "num_attention_heads": 16,
               "intermediate_size": 4096, "vocab_size": 30522}, (4, 8), sequence=512),
    ModelCase("opt-350m", "causal-lm", "opt",
              {"hidden_size": 1024, "num_hidden_layers": 24, "num_attention_heads": 16,
               "ffn_dim": 4096, "word_embed_proj_dim": 512, "vocab_size": 50272,
               "max_position_embeddings": 2048, "do_layer_norm_before": False},
              (4, 8), sequence=512),
    ModelCase("resnet50", "torchvision", "resnet50", {}, (32, 64, 128), image_size=224),
    ModelCase("vit-b16", "torchvision", "vit_b_16", {}, (32, 64), image_size=224),
)
SMOKE_CASES = (  # seconds on a CPU: what the tests run
    ModelCase("gpt2-tiny", "causal-lm", "gpt2",
              {"n_layer": 2, "n_embd": 64, "n_head": 2, "n_positions": 64, "vocab_size": 128,
               "bos_token_id": 0, "eos_token_id": 0},
              (2,), sequence=16),
    ModelCase("bert-tiny", "masked-lm", "bert",
              {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
               "intermediate_size": 128, "vocab_size": 128}, (2,), sequence=16),
)
LARGE_CASES = (  # issue #30 part 7: the sizes people train beyond the 51 first cases
    ModelCase("gpt2-large", "causal-lm", "gpt2",
              {**_GPT2_SMALL, "n_layer": 36, "n_embd": 1280, "n_head": 20}, (1, 4),
              sequence=1024),
    ModelCase("llama-1b", "causal-lm", "llama",  # Llama 3.2 1B's published shape
              {"hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
               "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
               "max_position_embeddings": 2048, "tie_word_embeddings": True},
              (1, 2), sequence=2048),
)
CASE_SETS = {"full": FULL_CASES, "smoke": SMOKE_CASES, "large": LARGE_CASES}


def select_cases(cases: Sequence[ModelCase], names: Sequence[str]) -> tuple[ModelCase, ...]:
    """The cases `names` names (all of them when empty); ValueError names any unknown one."""
    if not names:
        return tuple(cases)
    known = {c.name for c in cases}
    if missing := [n for n in names if n not in known]:
        raise ValueError(f"{missing} not in {sorted(known)}")
    return tuple(c for c in cases if c.name in names)


@dataclasses.dataclass(frozen=True)
class RunSettings:
    """What one campaign runs and how long it may take."""

    device: str  # "cpu" or "cuda[:N]"
    precisions: tuple[str, ...]
    warmup: int
    repeats: int
    budget_s: float
    framework: str = "eager"
    """"eager", or "compiled": the model wrapped in torch.compile (Inductor, default mode)."""
    instrument: bool = True
    """After the timed steps, one more step with each phase synchronised apart: its kernels'
    GPU time (torch.profiler) and its memory per phase."""

    @property
    def gpu_index(self) -> int | None:
        """The CUDA device's index; None on a CPU."""
        kind, index = parse_device(self.device)
        return index if kind == "cuda" else None


def hf_config(case: ModelCase) -> Any:
    """The transformers config of a text case: the fields it gives over transformers' defaults
    (the estimator's `model_step_scoring` prices the same config)."""
    import transformers

    return transformers.AutoConfig.for_model(case.arch, **case.config)


TORCHVISION_ATTENTION = {"vit_b_16": "sdpa"}
"""torchvision models with attention: ViT's nn.MultiheadAttention is called with
need_weights=False, which runs torch's scaled_dot_product_attention."""


def attention_implementation(case: ModelCase, model: Any) -> str | None:
    """How the case's attention ran: transformers' choice (it picks "sdpa", fused, where torch
    has it), torchvision's fixed one, or None for a model without attention. Part of the label:
    the estimator prices the eager and the fused core differently."""
    if case.source == "torchvision":
        return TORCHVISION_ATTENTION.get(case.arch)
    config = getattr(model, "config", None)
    return getattr(config, "_attn_implementation", None) if config is not None else None


def build_model(case: ModelCase) -> Any:
    """The case's model with random weights, built offline."""
    if case.source == "torchvision":
        import torchvision

        return getattr(torchvision.models, case.arch)(weights=None, num_classes=IMAGE_CLASSES)
    import transformers

    auto = (transformers.AutoModelForCausalLM if case.source == "causal-lm"
            else transformers.AutoModelForMaskedLM)
    return auto.from_config(hf_config(case))


def make_batch(case: ModelCase, batch: int, device: str) -> tuple[dict[str, Any], Any]:
    """(model inputs, training targets) of random data on `device`."""
    import torch

    if case.image_size is not None:
        images = torch.randn(batch, 3, case.image_size, case.image_size, device=device)
        return {"x": images}, torch.randint(0, IMAGE_CLASSES, (batch,), device=device)
    vocab = int(case.config["vocab_size"])
    assert case.sequence is not None
    tokens = torch.randint(0, vocab, (batch, case.sequence), device=device)
    return {"input_ids": tokens}, tokens


def loss_of(case: ModelCase, model: Any, inputs: Mapping[str, Any], targets: Any) -> Any:
    """The training loss: cross entropy over classes (vision) or tokens (the LM's own loss)."""
    import torch

    if case.source == "torchvision":
        return torch.nn.functional.cross_entropy(model(**inputs), targets)
    return model(**inputs, labels=targets).loss


class _Timer:
    """Phase durations of one step: CUDA events on a GPU, the wall clock on a CPU."""

    def __init__(self, device: str) -> None:
        import torch

        self._torch = torch
        self._cuda = device.startswith("cuda")
        self._marks: list[Any] = []

    def mark(self) -> None:
        if self._cuda:
            event = self._torch.cuda.Event(enable_timing=True)
            event.record()
            self._marks.append(event)
        else:
            self._marks.append(time.perf_counter())

    def durations_ms(self) -> list[float]:
        """Milliseconds between successive marks; clears them."""
        marks, self._marks = self._marks, []
        if self._cuda:
            self._torch.cuda.synchronize()
            return [float(a.elapsed_time(b)) for a, b in itertools.pairwise(marks)]
        return [(b - a) * 1000.0 for a, b in itertools.pairwise(marks)]


TF32_SWITCHES = {"fp32": (False, True), "tf32": (True, True), "bf16": (False, True)}
"""(matmul, cuDNN) TF32 per precision: "fp32" and "bf16" keep PyTorch's defaults (matmul TF32
off, cuDNN convolutions in TF32 on Ampere and later), "tf32" turns matmul TF32 on too, which is
what the estimator's precisions mean (`core.precisions`)."""


def _precision_context(precision: str, device: str) -> Any:
    """Set TF32 for this precision and return the autocast context of its forward passes."""
    import torch

    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = \
        TF32_SWITCHES[precision]
    if precision == "bf16":
        return torch.autocast(device_type=device.split(":")[0], dtype=torch.bfloat16)
    return contextlib.nullcontext()


def _peak_reset(device: str) -> Callable[[], int | None]:
    """Reset the device's peak-memory counter; the returned call reads it (None on a CPU)."""
    import torch

    if not device.startswith("cuda"):
        return lambda: None
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    return lambda: int(torch.cuda.max_memory_allocated())


def _summary(samples_ms: Sequence[float]) -> dict[str, float]:
    ordered = sorted(samples_ms)
    if len(ordered) < 2:
        return {"median_ms": ordered[0], "p10_ms": ordered[0], "p90_ms": ordered[0]}
    deciles = statistics.quantiles(ordered, n=10, method="inclusive")
    return {"median_ms": statistics.median(ordered), "p10_ms": deciles[0],
            "p90_ms": deciles[-1]}


def build_on(case: ModelCase, device: str) -> Any:
    """The case's model, its weights initialised on `device` (seconds less than on the host
    for the larger models)."""
    import torch

    with torch.device(device):
        return build_model(case)


def measure(case: ModelCase, model: Any, batch: int, precision: str, settings: RunSettings
            ) -> dict[str, Any]:
    """Inference forward and the three training phases of one configuration of `model`
    (on `settings.device`; its optimizer is made here and dropped after).

    Beside each phase's device time (events), the host's: the wall time the Python call took
    to return, which is the time to issue its kernels unless the host waited on the GPU (a
    full launch queue, a synchronising call). Where host time ~ device time the phase was
    host-bound."""
    import torch

    device = settings.device
    inputs, targets = make_batch(case, batch, device)
    autocast = _precision_context(precision, device)
    timer = _Timer(device)
    runner = torch.compile(model) if settings.framework == "compiled" else model
    out: dict[str, Any] = {}

    model.eval()
    peak = _peak_reset(device)
    forward: list[float] = []
    forward_host: list[float] = []
    with torch.no_grad():
        for i in range(settings.warmup + settings.repeats):
            timer.mark()
            started = time.perf_counter()
            with autocast:
                runner(**inputs)
            issued = time.perf_counter()
            timer.mark()
            (ms,) = timer.durations_ms()
            if i >= settings.warmup:
                forward.append(ms)
                forward_host.append((issued - started) * 1000.0)
    out["inference"] = {"forward": _summary(forward), "forward_host": _summary(forward_host),
                        "peak_memory_bytes": peak()}

    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    peak = _peak_reset(device)
    phases: dict[str, list[float]] = {"forward": [], "backward": [], "optimizer": []}
    host: dict[str, list[float]] = {name: [] for name in phases}
    for i in range(settings.warmup + settings.repeats):
        clocks = [time.perf_counter()]
        timer.mark()
        with autocast:
            loss = loss_of(case, runner, inputs, targets)
        clocks.append(time.perf_counter())
        timer.mark()
        loss.backward()
        clocks.append(time.perf_counter())
        timer.mark()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        clocks.append(time.perf_counter())
        timer.mark()
        if i >= settings.warmup:
            for name, ms in zip(phases, timer.durations_ms(), strict=True):
                phases[name].append(ms)
            for name, (a, b) in zip(host, itertools.pairwise(clocks), strict=True):
                host[name].append((b - a) * 1000.0)
        else:
            timer.durations_ms()
    steps = [sum(parts) for parts in zip(*phases.values(), strict=True)]
    host_steps = [sum(parts) for parts in zip(*host.values(), strict=True)]
    out["train"] = {**{k: _summary(v) for k, v in phases.items()}, "step": _summary(steps),
                    "host": {**{k: _summary(v) for k, v in host.items()},
                             "step": _summary(host_steps)},
                    "peak_memory_bytes": peak()}
    if settings.instrument:
        out["instrumented"] = instrumented_step(
            case, runner, optimizer, inputs, targets, autocast, device)
    out["parameters"] = sum(int(p.numel()) for p in model.parameters())
    out["attention"] = attention_implementation(case, model)
    out["framework"] = settings.framework
    out["tf32"] = dict(zip(("matmul", "cudnn"), TF32_SWITCHES[precision], strict=True))
    return out


def instrumented_step(case: ModelCase, model: Any, optimizer: Any, inputs: Mapping[str, Any],
                      targets: Any, autocast: Any, device: str) -> dict[str, Any]:
    """One training step with a synchronise between phases: per phase, the kernels it ran
    (torch.profiler: count and summed GPU time, by kernel name) and memory (allocated after,
    peak during). The profiler slows the host, so no wall time is read here."""
    import torch

    cuda = device.startswith("cuda")
    activity = (torch.profiler.ProfilerActivity.CUDA if cuda
                else torch.profiler.ProfilerActivity.CPU)
    state: dict[str, Any] = {}

    def forward() -> None:
        with autocast:
            state["loss"] = loss_of(case, model, inputs, targets)

    def backward() -> None:
        state.pop("loss").backward()

    def step() -> None:
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    out: dict[str, Any] = {}
    for name, phase in (("forward", forward), ("backward", backward), ("optimizer", step)):
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        with torch.profiler.profile(activities=[activity]) as prof:
            phase()
            if cuda:
                torch.cuda.synchronize()
        out[name] = {"kernels": kernel_table(prof.key_averages())}
        if cuda:
            out[name]["allocated_after_bytes"] = int(torch.cuda.memory_allocated())
            out[name]["peak_allocated_bytes"] = int(torch.cuda.max_memory_allocated())
            out[name]["peak_reserved_bytes"] = int(torch.cuda.max_memory_reserved())
    return out


_TIME_FIELDS = ("self_device_time_total", "self_cuda_time_total", "device_time_total",
                "cuda_time_total", "self_cpu_time_total")


def kernel_table(averages: Iterable[Any], limit: int = 60) -> dict[str, Any]:
    """Profiler averages as plain data: total count and microseconds, and the `limit` longest
    kernels by name (the rest summed), whichever of torch's time fields this version has."""
    rows = []
    for entry in averages:
        field = next((f for f in _TIME_FIELDS if getattr(entry, f, 0)), None)
        us = float(getattr(entry, field)) if field else 0.0
        rows.append((str(entry.key), int(entry.count), us))
    rows.sort(key=lambda r: -r[2])
    top = [{"name": n[:200], "count": c, "us": round(us, 2)} for n, c, us in rows[:limit]]
    rest = rows[limit:]
    return {"count": sum(r[1] for r in rows), "total_us": round(sum(r[2] for r in rows), 2),
            "top": top, "rest": {"count": sum(r[1] for r in rest),
                                 "us": round(sum(r[2] for r in rest), 2)}}


def configurations(cases: Sequence[ModelCase], precisions: Sequence[str]
                   ) -> Iterator[tuple[ModelCase, int, str]]:
    """Every (case, batch, precision), smallest batch first so a short budget covers models."""
    for batch_index in range(max(len(c.batches) for c in cases)):
        for case in cases:
            if batch_index < len(case.batches):
                for precision in precisions:
                    yield case, case.batches[batch_index], precision


def run(cases: Sequence[ModelCase], settings: RunSettings, write: Callable[[dict[str, Any]], None],
        clock: Callable[[], float] = time.monotonic) -> dict[str, int]:
    """Measure every configuration, writing one row each (`write`); counts by status."""
    import torch

    deadline = clock() + settings.budget_s
    counts: dict[str, int] = {}
    index = settings.gpu_index
    built: dict[str, Any] = {}  # the last case's model: its precisions come one after another
    for case, batch, precision in configurations(cases, settings.precisions):
        row: dict[str, Any] = {"kind": "model_step", "model": case.name, "batch": batch,
                               "sequence": case.sequence, "image_size": case.image_size,
                               "precision": precision, "framework": settings.framework}
        if clock() >= deadline:
            row["status"] = "skipped: the run's budget was spent"
        else:
            sampler = nvml.PowerSampler(index) if index is not None else None
            with sampler or contextlib.nullcontext():
                try:
                    if case.name not in built:
                        built.clear()  # frees the previous case's weights first
                        built[case.name] = build_on(case, settings.device)
                    row.update(measure(case, built[case.name], batch, precision, settings),
                               status="ok")
                except torch.cuda.OutOfMemoryError:
                    row["status"] = "out of memory"
                except Exception as exc:  # one broken configuration must not lose the rest
                    row["status"] = f"error: {type(exc).__name__}: {str(exc)[:300]}"
            if sampler is not None:
                row["mean_sm_clock_mhz"] = sampler.mean_sm_clock_mhz
                row["mean_power_watts"] = sampler.mean_watts
                torch.cuda.empty_cache()  # an out-of-memory case leaves none for the next
        key = row["status"].split(":")[0]
        counts[key] = counts.get(key, 0) + 1
        write(row)
    return counts


def provenance_row(settings: RunSettings, argv: Sequence[str], commit: str,
                   now: Callable[[], datetime] = lambda: datetime.now(UTC)) -> dict[str, Any]:
    """Where the rows come from: device identity, driver, clocks, versions, date, command."""
    import torch

    row: dict[str, Any] = {
        "kind": "provenance", "date": now().isoformat(timespec="seconds"),
        "command": shlex.join(["python", "-m", MODULE, *argv]),
        "commit": commit, "torch": torch.__version__,
        "device": settings.device, **dataclasses.asdict(settings)}
    try:
        import transformers

        row["transformers"] = transformers.__version__
    except ImportError:
        row["transformers"] = None
    index = settings.gpu_index
    if index is not None:
        identity = nvml.device_identity(index)
        row["nvml"] = dataclasses.asdict(identity) if identity is not None else None
        row["device_name"] = torch.cuda.get_device_name(index)
        row["cuda"] = torch.version.cuda
        row["cudnn"] = torch.backends.cudnn.version()
    return row


def main(argv: list[str] | None = None) -> int:
    """Run a campaign and write JSON lines: a provenance row, then one row per configuration."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", help="cpu, cuda or cuda:N")
    parser.add_argument("--out", type=Path, required=True, help="JSON lines file to write")
    parser.add_argument("--cases", choices=sorted(CASE_SETS), default="full")
    parser.add_argument("--models", default="", help="comma-separated case names (default all)")
    parser.add_argument("--precisions", default=",".join(PRECISIONS))
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--budget-s", type=float, default=420.0,
                        help="start no configuration after this many seconds")
    parser.add_argument("--commit", default="",
                        help="the commit measured (default: git's HEAD; a device copy has no .git)")
    parser.add_argument("--framework", choices=FRAMEWORKS, default="eager",
                        help="eager PyTorch, or the model wrapped in torch.compile")
    parser.add_argument("--no-instrument", dest="instrument", action="store_false",
                        help="skip the profiled step (kernels and memory per phase)")
    args = parser.parse_args(argv)
    precisions = tuple(p for p in args.precisions.split(",") if p)
    unknown = set(precisions) - set(PRECISIONS)
    if unknown:
        parser.error(f"--precisions: {sorted(unknown)} not in {list(PRECISIONS)}")
    if args.warmup < 0 or args.repeats < 1 or args.budget_s <= 0:
        parser.error("--warmup must be >= 0, --repeats >= 1 and --budget-s > 0")
    try:
        cases = select_cases(CASE_SETS[args.cases], [m for m in args.models.split(",") if m])
        parse_device(args.device)
    except ValueError as exc:
        parser.error(f"--models: {exc}")
    except errors.InvalidRequestError as exc:
        parser.error(f"--device: {exc.message}")
    settings = RunSettings(args.device, precisions, args.warmup, args.repeats, args.budget_s,
                           args.framework, args.instrument)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w", encoding="utf-8") as f:
        def write(row: dict[str, Any]) -> None:
            f.write(json.dumps(row) + "\n")
            f.flush()  # rows measured before a kill still come back
            print(f"{row.get('model', 'provenance'):12s} {row.get('batch', ''):>4} "
                  f"{row.get('precision', ''):5s} {row.get('framework', ''):8s} "
                  f"{row.get('status', '')}", flush=True)

        write(provenance_row(settings, argv, args.commit or provenance.git_commit()))
        counts = run(cases, settings, write)
    print(f"wrote {args.out}: {counts}")
    return 0 if counts.get("ok") else 1


if __name__ == "__main__":
    raise SystemExit(main())
