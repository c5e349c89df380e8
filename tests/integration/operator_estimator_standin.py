"""TEST FIXTURE ONLY — a small stand-in for the estimator's `POST /v1/plans` contract.

Used by the operator integration tests until `gpuplan_estimator.service` lands. It parses the
model with the real `onnx` (bad bytes → 422 InvalidModel) and plans with a deliberately crude
cost model: one fixed time per graph node and sample, divided by a per-type speed factor and the
GPU count. It is not an estimator; it only exercises the operator's side of the contract.
"""

from __future__ import annotations

import asyncio
import base64
import math
import threading
from typing import Any

import onnx
from aiohttp import web

SPEED = {"NVIDIA-H100-80GB-HBM3": 3.0, "NVIDIA-A100-SXM4-80GB": 2.0, "NVIDIA-L4": 0.7}
USD_PER_GPU_HOUR = {"NVIDIA-H100-80GB-HBM3": 4.0, "NVIDIA-A100-SXM4-80GB": 2.0, "NVIDIA-L4": 0.5}
NODE_SAMPLE_MS = 0.001


def _reject(reason: str, message: str, details: list[Any] | None = None) -> web.Response:
    return web.json_response({"error": {"reason": reason, "message": message,
                                        "details": details or []}}, status=422)


def plan(req: dict[str, Any]) -> web.Response:
    try:
        model = onnx.load_from_string(base64.b64decode(req["model_onnx_b64"]))
        onnx.checker.check_model(model)
    except Exception as exc:
        return _reject("InvalidModel", f"not an ONNX model: {type(exc).__name__}")
    t, o = req["training"], req["objective"]
    steps = math.ceil(t["dataset_size"] / t["batch_size"]) * t["epochs"]
    single_s = steps * t["batch_size"] * len(model.graph.node) * NODE_SAMPLE_MS / 1000
    deadline = o.get("deadline_seconds") or math.inf
    candidates, rejected = [], []
    for pool in req["inventory"]:
        gtype = pool["gpu_type"]
        if req["gpu_types"] and gtype not in req["gpu_types"]:
            rejected.append({"gpu_type": gtype, "gpu_count": None, "reason": "not in gpuTypes"})
            continue
        base = single_s / SPEED.get(gtype, 1.0)
        count = max(1, math.ceil(base / deadline))
        per_node = pool["gpus_per_node"]
        nodes = math.ceil(count / per_node)
        count = count if nodes == 1 else nodes * per_node
        if count > min(o["max_gpus"], pool["free_gpus"]):
            rejected.append({"gpu_type": gtype, "gpu_count": count,
                             "reason": f"needs {count} GPUs to meet the deadline, "
                                       f"maxGpus {o['max_gpus']}, free {pool['free_gpus']}"})
            continue
        seconds = base / count
        candidates.append({"gpu_type": gtype, "device": gtype.lower(), "gpu_count": count,
                           "gpus_per_node": count if nodes == 1 else per_node, "nodes": nodes,
                           "estimated_seconds": seconds, "step_time_ms": 1000 * seconds / steps,
                           "memory_bytes_per_gpu": 8 * 2**30,
                           "cost_usd": seconds / 3600 * count * USD_PER_GPU_HOUR.get(gtype, 1.0),
                           "predictor": "test-standin"})
    if not candidates:
        return _reject("NoFeasiblePlan", "no GPU type meets the objective", rejected)
    key = "estimated_seconds" if o["prefer"] == "fastest" else "cost_usd"
    candidates.sort(key=lambda c: c[key])
    return web.json_response({"plan": candidates[0], "candidates": candidates[1:],
                              "rejected": rejected})


class StandinEstimator:
    """Serves the stand-in on 127.0.0.1:`port` from a background thread; records requests."""

    def __init__(self, port: int = 0) -> None:
        self.port = port
        self.requests: list[dict[str, Any]] = []
        self._loop = asyncio.new_event_loop()
        self._runner: web.AppRunner | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def _handle(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.requests.append(body)
        return plan(body)

    async def _start(self) -> None:
        app = web.Application(client_max_size=64 * 2**20)
        app.router.add_post("/v1/plans", self._handle)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", self.port)
        await site.start()
        self.port = self._runner.addresses[0][1]

    def start(self) -> StandinEstimator:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(timeout=10)
        return self

    def stop(self) -> None:
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
