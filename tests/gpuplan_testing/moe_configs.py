"""A small Mixtral-shaped config (issue #34: expert parallelism): 4 blocks of width 256 with
8 experts, top-2, so a plan or an estimate of it takes about a second."""

from __future__ import annotations

from typing import Any

MIXTRAL_TINY: dict[str, Any] = {
    "model_type": "mixtral", "hidden_size": 256, "intermediate_size": 512,
    "num_attention_heads": 8, "num_key_value_heads": 4, "num_hidden_layers": 4,
    "num_local_experts": 8, "num_experts_per_tok": 2, "vocab_size": 4096,
    "max_position_embeddings": 256}
MIXTRAL_WIDE: dict[str, Any] = {**MIXTRAL_TINY, "hidden_size": 1024, "intermediate_size": 4096}
"""Experts big enough that their fp16 weights crowd a 16 GB T4: where EP pays on 8 GPUs."""
