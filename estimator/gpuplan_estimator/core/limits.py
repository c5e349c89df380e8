"""Caps on what one request may ask for: the one source of these bounds.

The HTTP service's validation and the CLI's argument types read them from here; the CRD's
bounds are tested to fit inside them (`tests/unit/operator/test_crd_options.py`). Each cap is far
above any real training run and far below what makes the estimator's arithmetic or memory blow
up, so a typo or a hostile request is refused by name instead of running for minutes.
"""

from __future__ import annotations

MAX_BATCH_SIZE = 1 << 24
"""Global batch in samples (16.8 M): the largest LLM recipes use a few million tokens, i.e.
thousands of sequences."""
MAX_DATASET_SIZE = 10**13
"""Samples per epoch (10 T): more than any public corpus counted in tokens."""
MAX_EPOCHS = 100_000
MAX_DIM = 1 << 24
"""One symbolic dimension (sequence, image side): 16.8 M."""
MAX_SAMPLE_ELEMENTS = 1 << 40
"""Batch times every bound dimension: an input tensor beyond 2^40 elements cannot exist on any
GPU, and products past 2^63 would overflow the graph's int64 shapes."""
MAX_GPUS_PER_NODE = 64
"""GPUs one node of an inventory pool may have (the largest servers have 16)."""
MAX_NODES_PER_POOL = 100_000
MAX_DIMS = 64
"""Named dimensions per request."""
MAX_DIM_NAME_CHARS = 128
MAX_WORKLOAD_BYTES = 2 * 2**20
"""A plan's compressed workload (`planning.workloads`, stored by `perfdb`). A 2-layer Llama
config compresses to a few KB; distinct items grow with distinct shapes, not with depth, so only
an unusually varied graph comes near this."""


def sample_elements_error(batch_size: int, dims: dict[str, int]) -> str | None:
    """Why batch × dims is out of range, or None when it is within `MAX_SAMPLE_ELEMENTS`."""
    product = batch_size
    for value in dims.values():
        product *= value
        if product > MAX_SAMPLE_ELEMENTS:
            return (f"batch_size x dims is more than {MAX_SAMPLE_ELEMENTS} elements "
                    f"(batch {batch_size}, dims {dict(dims)})")
    return None
