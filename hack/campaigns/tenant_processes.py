"""The processes and servers of the three-tenant testbed campaign (`campaigns.tenants_testbed`):
the estimator and the operator as the chart runs them, a model server and an RSS sampler.

The estimator and operator take their limits from the chart's `values.yaml` (one source: a
changed default is what the campaign runs), except the estimator's worker count, which the
campaign may lower for a small machine.
"""

from __future__ import annotations

import http.server
import os
import pathlib
import struct
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import yaml
from onnx import TensorProto, helper, numpy_helper

from campaigns import chaos
from gpuplan_testing import processes

ROOT = chaos.ROOT
VALUES = ROOT / "charts" / "gpuplan" / "values.yaml"
AUDIENCE = "gpuplan-estimator"
LIMIT_BYTES = {"estimator": 4 * 2**30, "operator": 1 * 2**30}
"""The chart's memory limits (values.yaml `resources.limits.memory`; `chart_limits` checks)."""
_HTTP_TIMEOUT_S = 30


def chart_values() -> dict[str, Any]:
    values: dict[str, Any] = yaml.safe_load(VALUES.read_text())
    return values


def chart_limits(values: Mapping[str, Any]) -> dict[str, str]:
    """The chart's memory limits, as written (the campaign compares RSS with LIMIT_BYTES)."""
    return {name: str(values[name]["resources"]["limits"]["memory"])
            for name in ("estimator", "operator")}


def estimator_argv(values: Mapping[str, Any], port: int, metrics_port: int, db_url: str,
                   kubeconfig: pathlib.Path,
                   operator_subject: str, workers: int | None) -> list[str]:
    """`gpuplan serve` with the chart's limits and write auth (estimator.yaml's args/env)."""
    e = values["estimator"]
    return [str(pathlib.Path(sys.executable).with_name("gpuplan")), "serve",
            "--host", "127.0.0.1", "--port", str(port), "--db", db_url,
            "--request-timeout", str(e["requestTimeoutSeconds"]),
            "--max-body-bytes", str(e["maxBodyBytes"]),
            "--workers", str(workers if workers is not None else e["workers"]),
            "--running-per-client", str(e["runningPerClient"]),
            "--queued-per-client", str(e["queuedPerClient"]),
            "--worker-memory-gib", str(e["workerMemoryGiB"]),
            "--max-namespace-share", str(e["maxNamespaceShare"]),
            "--body-bytes-per-client", str(e["bodyBytesPerClient"]),
            "--body-bytes-total", str(e["bodyBytesTotal"]),
            "--metrics-port", str(metrics_port),
            "--write-auth", "tokenreview", "--write-auth-kubeconfig", str(kubeconfig),
            "--write-allowed-subjects", operator_subject, "--write-auth-audiences", AUDIENCE]


def pinned(cpus: str | None) -> list[str]:
    """An argv prefix running the command on `cpus` only (`taskset -c`), as a pod with its
    own CPU would; empty for None."""
    return [] if cpus is None else ["taskset", "-c", cpus]


class GuardedEstimator(chaos.ServingChild):
    """`gpuplan serve` as the chart runs it: tokenreview writes for the operator's account."""

    def __init__(self, workdir: pathlib.Path, argv: list[str], port: int,
                 source: pathlib.Path = ROOT) -> None:
        env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
        env["PYTHONPATH"] = str(source / "estimator")
        super().__init__("estimator", argv, env, workdir / "estimator.log")
        self.port = port


def operator_env(values: Mapping[str, Any], kubeconfig: pathlib.Path, estimator_url: str,
                 token_file: pathlib.Path, source: pathlib.Path = ROOT) -> dict[str, str]:
    """The operator's GPUPLAN_* settings from the chart's values (operator.yaml's env), the
    model server on loopback allowed."""
    o = values["operator"]
    return dict(os.environ, KUBECONFIG=str(kubeconfig), GPUPLAN_ESTIMATOR_URL=estimator_url,
                GPUPLAN_ESTIMATOR_TOKEN_FILE=str(token_file), GPUPLAN_METRICS_PORT="0",
                GPUPLAN_MODEL_FETCHES=str(o["modelFetches"]["concurrent"]),
                GPUPLAN_MODEL_FETCHES_PER_NAMESPACE=str(o["modelFetches"]["perNamespace"]),
                GPUPLAN_WORKER_LIMIT=str(o["workerLimit"]),
                GPUPLAN_MODEL_MAX_BYTES=str(o["modelUrl"]["maxBytes"]),
                GPUPLAN_MODEL_FETCH_TIMEOUT_SECONDS=str(o["modelUrl"]["timeoutSeconds"]),
                GPUPLAN_MODEL_URL_ALLOWED_NETWORKS="127.0.0.1/32",
                GPUPLAN_RETRY_BASE_DELAY_SECONDS="1", GPUPLAN_RETRY_MAX_DELAY_SECONDS="10",
                PYTHONPATH=os.pathsep.join([str(source / "operator"),
                                            str(source / "estimator")]))


class TenantOperator(chaos.Child):
    """`python -m gpuplan_operator --standalone -n NS...` (the chart's command, namespaced)."""

    def __init__(self, workdir: pathlib.Path, namespaces: list[str], env: dict[str, str],
                 cpus: str | None = None) -> None:
        argv = [*pinned(cpus), sys.executable, "-m", "gpuplan_operator", "--standalone",
                *(f"--namespace={ns}" for ns in namespaces)]
        super().__init__("operator", argv, env, workdir / "operator.log")

    def started(self) -> bool:
        text = self.log_text()
        return chaos.Operator.STARTED in text[text.rfind("=== start"):]


def large_model(max_bytes: int) -> bytes:
    """A valid ONNX model of at most `max_bytes` (almost all of it one Gemm weight): what a
    tenant may point a TrainingJob at under the operator's size cap."""
    rows = 4096
    cols = (max_bytes - 4096) // (4 * rows)  # the header and graph take well under 4 KiB
    w = numpy_helper.from_array(np.zeros((rows, cols), np.float32), "w")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", rows])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", cols])
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "large",
                              [x], [y], [w])
    blob = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]
                             ).SerializeToString()
    assert len(blob) <= max_bytes, (len(blob), max_bytes)
    return blob


class ModelServer:
    """Serves `GET /model/<n>.onnx`: the large model with `n` written into its last weight, so
    no two TrainingJobs share a model (no answer cache helps the operator or the estimator)."""

    def __init__(self, blob: bytes) -> None:
        self.blob = blob
        self.weight_at = blob.index(b"\0" * 4096)  # inside the zero weight's raw bytes
        self.served = 0
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                try:
                    n = int(self.path.rsplit("/", 1)[-1].split(".")[0])
                except ValueError:
                    self.send_error(404)
                    return
                at = outer.weight_at
                body = outer.blob[:at] + struct.pack("<f", float(n)) + outer.blob[at + 4:]
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                outer.served += 1

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def url(self, n: int) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/model/{n}.onnx"

    def __enter__(self) -> ModelServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


@dataclass
class Watched:
    """What the sampler saw of one process (tree): its peak RSS and its unexpected exits."""

    peak_mib: float = 0.0
    exits: list[str] = field(default_factory=list)


class RssSampler:
    """Samples the resident memory of the estimator's and the operator's process trees (the
    estimator's worker processes count, as in its container) every `interval_s`, and notes a
    process that exited while the campaign did not stop it (a crash, an OOM kill)."""

    def __init__(self, children: Mapping[str, chaos.Child], interval_s: float = 0.5) -> None:
        self.children = dict(children)
        self.interval_s = interval_s
        self.seen = {name: Watched() for name in children}
        self.expected_down: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            for name, child in self.children.items():
                proc = child.proc
                if proc is None or name in self.expected_down:
                    continue
                code = proc.poll()
                if code is not None:
                    self.seen[name].exits.append(f"exit {code} at {time.strftime('%T')}")
                    self.expected_down.add(name)
                    continue
                mib = processes.tree_rss_mib(proc.pid)
                self.seen[name].peak_mib = max(self.seen[name].peak_mib, mib)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def wait_ready(child: chaos.Child, ready: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not ready():
        if not child.alive:
            raise RuntimeError(f"{what}: exited; see {child.log}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout_s} s; see {child.log}")
        time.sleep(0.5)
