"""Fuzzing the model reader and the estimate behind it with mutated ONNX graphs.

Every input must end in an estimate or a `GpuplanError` (the one-line error the CLI and the
service show): any other exception is a crash (a traceback for the user), and so is an input
that takes longer than `per_input_s` or that hits the address-space cap. Mutations, from
seeds built in memory (a CNN head, a transformer from `zoo`, sequence ops):

- bytes: truncation, flipped bytes, inserted garbage;
- dims: 0, negative, huge and int64-overflowing products, on inputs, value_info and outputs;
- attributes: huge, negative or emptied ints and lists (kernel, stride, pads, axis, perm...);
- wiring: cycles (a node reads a later node's output), dangling inputs, duplicated outputs,
  removed nodes and inputs, unknown and foreign op types, absurd opsets;
- size: long chains of nodes (one input past the node cap).

`make fuzz` runs 10^5 inputs; `tests/unit/estimator/graph/test_fuzz.py` runs a slice.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import multiprocessing
import resource
import signal
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection
from types import FrameType

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from gpuplan_estimator import RooflinePredictor, TrainingSettings, estimate, graph, load_catalog
from gpuplan_estimator.core.errors import GpuplanError
from gpuplan_estimator.graph import zoo

HUGE_DIMS = (0, -1, -7, 2**31, 2**40, 2**62, 2**63 - 1, -(2**63))
OPS = ("Relu", "Conv", "MatMul", "Gemm", "Reshape", "Concat", "Softmax", "Split", "If",
       "Loop", "SplitToSequence", "SequenceAt", "NoSuchOp", "Attention", "LayerNormalization")


class InputTimeout(Exception):
    """An input ran past its time budget."""


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What one input did: estimated, refused with a clear error, or crashed."""

    kind: str  # "ok", "error" or "crash"
    seconds: float
    detail: str = ""
    peak_rss_mib: float = 0.0  # of the worker, after this input


def seeds() -> list[bytes]:
    """The graphs the mutations start from."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, 8, 8])
    w = numpy_helper.from_array(np.zeros((4, 3, 3, 3), np.float32), "w")
    shape = numpy_helper.from_array(np.array([0, -1], np.int64), "shape")
    cnn = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], strides=[1, 1]),
         helper.make_node("Relu", ["c"], ["r"]),
         helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
         helper.make_node("Reshape", ["p", "shape"], ["f"]),
         helper.make_node("Softmax", ["f"], ["y"], axis=1)],
        "cnn", [x], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w, shape])
    seq_in = helper.make_tensor_value_info("s", TensorProto.FLOAT, ["batch", 6, 12])
    split = numpy_helper.from_array(np.array([4, 4, 4], np.int64), "split")
    positions = [numpy_helper.from_array(np.array(i, np.int64), f"p{i}") for i in range(3)]
    seq = helper.make_graph(
        [helper.make_node("SplitToSequence", ["s", "split"], ["q"], axis=2),
         *[helper.make_node("SequenceAt", ["q", f"p{i}"], [f"t{i}"]) for i in range(3)],
         helper.make_node("MatMul", ["t0", "t1"], ["m"]),
         helper.make_node("SequenceConstruct", ["m", "t2"], ["pair"]),
         helper.make_node("ConcatFromSequence", ["pair"], ["y"], axis=2)],
        "seq", [seq_in], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [split, *positions])
    tiny_gpt = {"model_type": "gpt2", "n_embd": 32, "n_head": 2, "n_layer": 1,
                "vocab_size": 64, "n_positions": 16, "n_inner": None}
    models = [helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
              for g in (cnn, seq)]
    models.append(zoo.build_transformer(tiny_gpt, name="tiny-gpt"))
    return [m.SerializeToString() for m in models]


def chain(nodes: int) -> bytes:
    """A chain of `nodes` Relus: the size mutation."""
    body = [helper.make_node("Relu", [f"t{i}"], [f"t{i + 1}"]) for i in range(nodes)]
    g = helper.make_graph(body, "chain",
                          [helper.make_tensor_value_info("t0", TensorProto.FLOAT, [2, 8])],
                          [helper.make_tensor_value_info(f"t{nodes}", TensorProto.FLOAT, None)])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)],
                             ir_version=8).SerializeToString()


def _mutate_bytes(data: bytes, rng: np.random.Generator) -> bytes:
    kind = rng.integers(3)
    if kind == 0:
        return data[: int(rng.integers(len(data)))]
    buf = bytearray(data)
    if kind == 1:
        for _ in range(int(rng.integers(1, 9))):
            buf[int(rng.integers(len(buf)))] = int(rng.integers(256))
        return bytes(buf)
    at = int(rng.integers(len(buf)))
    return bytes(buf[:at] + rng.bytes(int(rng.integers(1, 64))) + buf[at:])


def _dims(model: onnx.ModelProto) -> list[onnx.TensorShapeProto.Dimension]:
    values = (*model.graph.input, *model.graph.value_info, *model.graph.output)
    return [d for v in values if v.type.HasField("tensor_type")
            for d in v.type.tensor_type.shape.dim]


def _mutate_model(model: onnx.ModelProto, rng: np.random.Generator) -> None:
    g = model.graph
    kind = int(rng.integers(9))
    node = g.node[int(rng.integers(len(g.node)))] if g.node else None
    if kind == 0 and _dims(model):
        dims = _dims(model)
        dims[int(rng.integers(len(dims)))].dim_value = int(rng.choice(HUGE_DIMS))
    elif kind == 1 and node is not None and node.attribute:
        attr = node.attribute[int(rng.integers(len(node.attribute)))]
        if attr.type == onnx.AttributeProto.INT:
            attr.i = int(rng.choice(HUGE_DIMS))
        elif attr.type == onnx.AttributeProto.INTS:
            del attr.ints[:]
            attr.ints.extend(int(rng.choice(HUGE_DIMS)) for _ in range(int(rng.integers(4))))
    elif kind == 2 and len(g.node) > 1 and node is not None and node.input:
        later = g.node[len(g.node) - 1]  # a cycle: an early node reads the last node's output
        node.input[int(rng.integers(len(node.input)))] = later.output[0]
    elif kind == 3 and node is not None and node.input:
        node.input[int(rng.integers(len(node.input)))] = "dangling"
    elif kind == 4 and node is not None:
        node.op_type = str(rng.choice(OPS))
        if rng.integers(2):
            node.domain = "com.microsoft"
    elif kind == 5 and len(g.node) > 1:
        del g.node[int(rng.integers(len(g.node)))]
    elif kind == 6 and node is not None and node.output:
        g.node[0].output[0] = node.output[0]  # two producers of one tensor
    elif kind == 7:
        model.opset_import[0].version = int(rng.choice((1, 6, 7, 11, 22, 23, 99, -1)))
    elif kind == 8 and g.initializer:
        t = g.initializer[int(rng.integers(len(g.initializer)))]
        t.dims[:] = [int(rng.choice(HUGE_DIMS)) for _ in range(int(rng.integers(1, 4)))]


def inputs(count: int, random_state: int, *, huge_chain: int = 0) -> Iterator[bytes]:
    """`count` fuzz inputs, deterministic for a `random_state`."""
    rng = np.random.default_rng(random_state)
    base = seeds()
    if huge_chain:
        yield chain(huge_chain)
    for _ in range(count - (1 if huge_chain else 0)):
        data = base[int(rng.integers(len(base)))]
        if rng.integers(3) == 0:
            yield _mutate_bytes(data, rng)
            continue
        model = onnx.load_from_string(data)
        for _ in range(int(rng.integers(1, 4))):
            _mutate_model(model, rng)
        yield model.SerializeToString()


def _on_alarm(signum: int, frame: FrameType | None) -> None:
    raise InputTimeout


def _rebatch(data: bytes) -> None:
    """Re-batching and re-sequencing rewrite the graph's constants: a graph that loads must
    also re-batch, or fail with a clear error."""
    with contextlib.suppress(GpuplanError):
        graph.load_at_batch(data, 3, {"sequence": 5})


def run_one(data: bytes, per_input_s: int) -> Outcome:
    """Load and estimate one input under a time budget; classify the result."""
    device = load_catalog().resolve("t4")
    start = time.perf_counter()
    previous = signal.signal(signal.SIGALRM, _on_alarm)
    signal.alarm(per_input_s)
    try:
        g = graph.load_model(data, batch=2, dim_bindings={"sequence": 8})
        estimate(g, [device], TrainingSettings(batch_size=2), predictor=RooflinePredictor())
        _rebatch(data)
        kind, detail = "ok", ""
    except GpuplanError as exc:
        kind, detail = "error", str(exc).splitlines()[0][:200] if str(exc) else ""
    except InputTimeout:
        kind, detail = "crash", f"ran past {per_input_s} s"
    except Exception:  # the point: anything else is a traceback the user would see
        kind, detail = "crash", traceback.format_exc(limit=6)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return Outcome(kind, time.perf_counter() - start, detail, peak_mib)


class Worker:
    """A forked process that runs inputs one after another under an address-space cap.

    A native crash (SIGFPE or SIGSEGV in onnx's C++) or the cap ends the worker, not the
    campaign: the input in flight counts as a crash and a fresh worker takes the next one.
    """

    def __init__(self, per_input_s: int, memory_bytes: int) -> None:
        self.per_input_s, self.memory_bytes = per_input_s, memory_bytes
        self._start()

    def _start(self) -> None:
        ctx = multiprocessing.get_context("fork")
        self._conn, child = ctx.Pipe()
        self._process = ctx.Process(target=_serve, args=(child, self.per_input_s,
                                                         self.memory_bytes), daemon=True)
        self._process.start()
        child.close()

    def run(self, data: bytes) -> Outcome:
        """One input's outcome; restarts the worker when the input killed it."""
        start = time.perf_counter()
        try:
            self._conn.send_bytes(data)
            if self._conn.poll(self.per_input_s + 10):
                return Outcome(**json.loads(self._conn.recv_bytes()))
            detail = f"no answer in {self.per_input_s + 10} s"
        except (EOFError, BrokenPipeError, ConnectionResetError):
            detail = ""
        self._process.kill()
        self._process.join()
        code = self._process.exitcode
        self._start()
        return Outcome("crash", time.perf_counter() - start,
                       detail or f"worker died (exit code {code}: a negative one is a signal)")

    def close(self) -> None:
        """Stop the worker."""
        self._conn.close()
        self._process.join(5)
        if self._process.is_alive():
            self._process.kill()


def _serve(conn: Connection, per_input_s: int, memory_bytes: int) -> None:
    resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    while True:
        try:
            data = conn.recv_bytes()
        except EOFError:
            return
        conn.send_bytes(json.dumps(dataclasses.asdict(run_one(data, per_input_s))).encode())


def campaign(count: int, random_state: int, *, per_input_s: int = 20,
             memory_bytes: int = 4 * 2**30, huge_chain: int = 0,
             progress: Callable[[int], None] | None = None
             ) -> tuple[dict[str, int], list[tuple[bytes, Outcome]], float, float]:
    """Run `count` inputs: counts per outcome, the crashers, the slowest input (s) and the
    workers' peak RSS (MiB)."""
    counts = {"ok": 0, "error": 0, "crash": 0}
    crashers: list[tuple[bytes, Outcome]] = []
    slowest = peak_mib = 0.0
    worker = Worker(per_input_s, memory_bytes)
    for i, data in enumerate(inputs(count, random_state, huge_chain=huge_chain)):
        outcome = worker.run(data)
        counts[outcome.kind] += 1
        slowest = max(slowest, outcome.seconds)
        peak_mib = max(peak_mib, outcome.peak_rss_mib)
        if outcome.kind == "crash":
            crashers.append((data, outcome))
        if progress is not None and (i + 1) % 1000 == 0:
            progress(i + 1)
    worker.close()
    return counts, crashers, slowest, peak_mib


def main(argv: list[str] | None = None) -> int:
    """`make fuzz`: a campaign with a memory cap; crashers are written to --crash-dir."""
    parser = argparse.ArgumentParser(prog="python -m campaigns.fuzz_graphs")
    parser.add_argument("--inputs", type=int, default=100_000)
    parser.add_argument("--random-state", type=int, default=0)
    parser.add_argument("--per-input-seconds", type=int, default=20)
    parser.add_argument("--memory-gib", type=float, default=4.0)
    parser.add_argument("--huge-chain", type=int, default=1_000_000,
                        help="nodes of the one oversized graph (0: none)")
    parser.add_argument("--crash-dir", default="fuzz-crashers")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    counts, crashers, slowest, peak_mib = campaign(
        args.inputs, args.random_state, per_input_s=args.per_input_seconds,
        memory_bytes=int(args.memory_gib * 2**30), huge_chain=args.huge_chain,
        progress=lambda n: print(f"  {n} inputs, {time.perf_counter() - start:.0f} s",
                                 file=sys.stderr, flush=True))
    elapsed = time.perf_counter() - start
    print(f"fuzz: {args.inputs} inputs (random_state {args.random_state}) in {elapsed:.0f} s: "
          f"{counts['ok']} estimated, {counts['error']} clear errors, {counts['crash']} "
          f"crashes; slowest input {slowest:.2f} s; worker peak RSS {peak_mib:.0f} MiB "
          f"(cap {args.memory_gib} GiB)")
    if crashers:
        import pathlib

        out = pathlib.Path(args.crash_dir)
        out.mkdir(parents=True, exist_ok=True)
        for i, (data, outcome) in enumerate(crashers[:50]):
            (out / f"crash-{i}.onnx").write_bytes(data)
            (out / f"crash-{i}.txt").write_text(outcome.detail)
        print(f"fuzz: first crashers in {out}/", file=sys.stderr)
    return 1 if crashers else 0


if __name__ == "__main__":
    sys.exit(main())
