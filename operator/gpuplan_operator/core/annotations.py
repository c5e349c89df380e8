"""Plan annotations the operator writes on TrainingJobs, Jobs and pods; the extender reads them."""

from __future__ import annotations

GPU_TYPE = "gpuplan.io/gpu-type"
"""Planned GPU type: a GFD `nvidia.com/gpu.product` value or a canonical catalog key."""

GPU_COUNT = "gpuplan.io/gpu-count"
"""Planned GPUs per pod, a positive integer as a string."""

ESTIMATED_SECONDS = "gpuplan.io/estimated-seconds"
"""Predicted wall-clock training time in seconds, a decimal string."""

PLAN_KEYS = (GPU_TYPE, GPU_COUNT, ESTIMATED_SECONDS)
