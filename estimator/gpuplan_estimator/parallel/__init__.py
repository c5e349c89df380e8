"""Parallel layouts and memory strategies: data, tensor and pipeline parallelism, ZeRO/FSDP,
checkpointing and accumulation, priced in time and per-rank memory from a single-GPU step."""
