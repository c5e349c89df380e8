"""Device names a benchmark runs on (`cpu`, `cuda`, `cuda:N`), parsed without importing the
benchmark's heavy stack, so `evaluation.model_steps` can run where only torch is installed."""

from __future__ import annotations

from gpuplan_estimator.core import errors


def parse_device(device: str) -> tuple[str, int]:
    """``cpu`` → ("cpu", 0); ``cuda`` / ``cuda:N`` → ("cuda", N)."""
    kind, _, index = device.partition(":")
    if kind not in ("cpu", "cuda") or (kind == "cpu" and index):
        raise errors.InvalidRequestError("device", f"expected cpu, cuda or cuda:N, got {device!r}")
    if not index:
        return kind, 0
    if not index.isdigit():
        raise errors.InvalidRequestError("device", f"bad GPU index in {device!r}")
    return kind, int(index)
