"""ONNX in, layers out: the only package that reads ONNX models.

`loading` parses, shape-infers and binds a model into a `ModelGraph`; `records` turns graph
records into `Layer`s priced by `opcost`; `fusion` finds the kernels frameworks fuse; `batching`
re-batches fixed-batch exports; `zoo` and `examples` build models. The facade below is lazy
(PEP 562) so that importing, say, `graph.opcost` does not load onnx.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpuplan_estimator.core.lazy_exports import lazy_exports

_EXPORTS: dict[str, str] = {
    "COMPRESSIONS": "gpuplan_estimator.graph.loading",
    "DEFAULT_MAX_DECOMPRESSED_BYTES": "gpuplan_estimator.graph.loading",
    "compression_of": "gpuplan_estimator.graph.loading",
    "load_model": "gpuplan_estimator.graph.loading",
    "read_model_bytes": "gpuplan_estimator.graph.loading",
    "strip_weights": "gpuplan_estimator.graph.loading",
    "graph_batch": "gpuplan_estimator.graph.batching",
    "load_at_batch": "gpuplan_estimator.graph.batching",
    "model_batch": "gpuplan_estimator.graph.batching",
    "symbolic_batch": "gpuplan_estimator.graph.batching",
}
__all__ = [
    "COMPRESSIONS",
    "DEFAULT_MAX_DECOMPRESSED_BYTES",
    "compression_of",
    "graph_batch",
    "load_at_batch",
    "load_model",
    "model_batch",
    "read_model_bytes",
    "strip_weights",
    "symbolic_batch",
]

if TYPE_CHECKING:
    from gpuplan_estimator.graph.batching import (
        graph_batch,
        load_at_batch,
        model_batch,
        symbolic_batch,
    )
    from gpuplan_estimator.graph.loading import (
        COMPRESSIONS,
        DEFAULT_MAX_DECOMPRESSED_BYTES,
        compression_of,
        load_model,
        read_model_bytes,
        strip_weights,
    )


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, lambda: list(globals()))
