"""What a training request may ask for: modes, optimizers, precisions, frameworks and defaults.

The one source of these facts. The estimator's CLI and HTTP validation read them from here, the
operator's spec validation too, and the CRD's enums and defaults are tested against them.
"""

from __future__ import annotations

from gpuplan_estimator.core.precisions import PRECISION_TABLE

MODES: tuple[str, ...] = ("train", "inference")
OPTIMIZERS: tuple[str, ...] = ("sgd", "momentum", "adam", "adamw", "adagrad", "rmsprop")
PRECISIONS: tuple[str, ...] = tuple(PRECISION_TABLE)
"""fp32, tf32, fp16, bf16: what each means is `core.precisions`."""

PYTORCH_EAGER = "pytorch-eager"
ONNXRUNTIME = "onnxruntime"
PYTORCH_COMPILED = "pytorch-compiled"
FRAMEWORKS: tuple[str, ...] = (PYTORCH_EAGER, ONNXRUNTIME, PYTORCH_COMPILED)
INFERENCE_ONLY_FRAMEWORKS = frozenset({ONNXRUNTIME, PYTORCH_COMPILED})
"""Frameworks priced for inference only: their folded kernels have no backward here."""

EAGER_ATTENTION = "eager"
FUSED_ATTENTION = "fused"
ATTENTIONS: tuple[str, ...] = (EAGER_ATTENTION, FUSED_ATTENTION)
"""How the attention core (scores, scale, mask, softmax, ·V) runs: "eager", one kernel per op
with the score matrix in memory (PyTorch's math path, `attn_implementation="eager"`), or
"fused", one kernel that never stores it (`torch.nn.functional.scaled_dot_product_attention`
with a flash or memory-efficient backend, Hugging Face's default "sdpa")."""
FUSED_ATTENTION_FRAMEWORKS = frozenset({PYTORCH_EAGER, PYTORCH_COMPILED})
"""Frameworks that run a fused attention kernel (onnxruntime's needs its transformers
optimizer, which the estimator does not model)."""

OBJECTIVES: tuple[str, ...] = ("cheapest", "fastest", "balanced")
"""What a plan optimises: cost meeting the deadline, time within the budget, or both."""

DEFAULT_MODE = "train"
DEFAULT_OPTIMIZER = "adamw"
"""AdamW: what transformer and most CNN recipes train with today (and the CRD's default)."""
DEFAULT_PRECISION = "fp32"
DEFAULT_FRAMEWORK = PYTORCH_EAGER
"""One kernel per node, as the GPU rows were measured."""
DEFAULT_ATTENTION = EAGER_ATTENTION
"""The attention as the graph spells it out: its score matrix is what an eager step stores,
so memory is never understated. Say "fused" for SDPA/FlashAttention runs."""
DEFAULT_OBJECTIVE = "cheapest"
DEFAULT_MAX_GPUS = 8
"""GPU cap of a plan when the request names none."""
MAX_GPUS_CAP = 4096
"""Largest GPU cap a request may give (the CRD's `maxGpus` maximum)."""
