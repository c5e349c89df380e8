"""What a training request may ask for: modes, optimizers, precisions, frameworks and defaults.

The one source of these facts. The estimator's CLI and HTTP validation read them from here, the
operator's spec validation too, and the CRD's enums and defaults are tested against them.
"""

from __future__ import annotations

from gpuplan_estimator.core.precisions import PRECISION_TABLE

MODES: tuple[str, ...] = ("train", "inference")
OPTIMIZERS: tuple[str, ...] = ("sgd", "momentum", "adam", "adamw", "adagrad", "rmsprop")

FOREACH_OPTIMIZER = "foreach"
FUSED_OPTIMIZER = "fused"
FOR_LOOP_OPTIMIZER = "for-loop"
OPTIMIZER_IMPLS: tuple[str, ...] = (FOREACH_OPTIMIZER, FUSED_OPTIMIZER, FOR_LOOP_OPTIMIZER)
"""How `torch.optim` runs the update: "foreach" (`_foreach_*` kernels over chunks of all
tensors, PyTorch 2's default on CUDA), "fused" (`fused=True`: one kernel per chunk doing the
whole update) or "for-loop" (`foreach=False`: every op launched per parameter tensor)."""
FUSED_IMPL_OPTIMIZERS = frozenset({"sgd", "momentum", "adam", "adamw", "adagrad"})
"""Optimizers `torch.optim` has a fused CUDA implementation of (RMSprop has none)."""


def optimizer_impl_problem(optimizer: str, optimizer_impl: str) -> str | None:
    """Why `optimizer` cannot run as `optimizer_impl`, or None when it can."""
    if optimizer_impl == FUSED_OPTIMIZER and optimizer not in FUSED_IMPL_OPTIMIZERS:
        return (f"torch.optim has no fused {optimizer} (fused exists for "
                f"{', '.join(sorted(FUSED_IMPL_OPTIMIZERS))})")
    return None
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
DEFAULT_OPTIMIZER_IMPL = FOREACH_OPTIMIZER
"""What `torch.optim` picks on CUDA when the trainer names none."""
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
