"""The peak of live tensors over one step's schedule, as PyTorch's caching allocator counts it.

`torch.cuda.max_memory_allocated` is the largest sum of live blocks at any instant, not the
sum of every tensor a step makes. This module walks the schedule eager PyTorch runs and keeps
the set of live tensors:

- forward, in graph order: each layer's outputs are allocated; a tensor is freed after its
  last forward consumer unless some layer's backward reads it (`saved.saved_tensors`), in
  which case it lives until that backward ran. View ops (reshape, transpose, split, a select
  `x[i]`, ...) alias their input's storage, also of a weight (a dynamo export reads
  Transpose(W)); Identity (a dynamo export's `aten.clone`) copies; a MatMul whose only reader
  adds a parameter bias is torch's `linear`, one output. Dropout is an eval export's no-op
  (what a graph names in `dropout_tensors` is charged its masks, below).
- a decoder's key/value cache (`ModelGraph.cache_tensors`, Hugging Face's `use_cache`): each
  layer's keys and values are copied into the cache as the layer runs; an inference forward
  holds the copies to its end, training with fused attention until that layer's backward (the
  kernel reads and saves the copies; eager attention's matmuls keep as many bytes anyway).
- dropout in training (`ModelGraph.dropout_tensors`: the graphs leave the Dropout op out, as
  an eval export does): a bool mask per dropped tensor, kept until that layer's backward.
- the loss: cross entropy over the graph's float output, as `F.cross_entropy` and Hugging
  Face's losses run it: an fp32 copy of half-precision logits, the fp32 log-probabilities kept
  for backward; backward allocates the gradient of the log-probabilities and of the logits. An
  export's key/value cache outputs (`present.*`, `training_ops.is_cache_output`) are returned,
  not scored.
- backward, in reverse graph order: each layer allocates the gradients of its inputs that need
  one (parameter gradients become `.grad` and stay; activation gradients are freed once their
  producer's backward consumed them), then frees the saved tensors only it still needed.
- the optimizer (steady state, after the first step created its state): weights, `.grad`,
  state and the temporaries of the foreach implementation (`FOREACH_TEMPORARY_WORDS`).
- autocast (fp16/bf16 over fp32 weights, `torch.autocast`): ops autocast lowers run on
  half-precision copies of their fp32 inputs; a weight's copy is cached for the whole forward
  and, when the op's backward reads the weight, kept until that backward; ops autocast keeps in
  fp32 run on fp32 copies of half inputs; other ops compute in the widest of their inputs.

Every allocation is rounded up to the allocator's 512-byte block (`ALLOCATION_ROUND_BYTES`).
Not in the walk, hence not in the peak: the CUDA context and the allocator's reserved-but-free
memory; `memory` adds them for the fit decision only.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import overload

from gpuplan_estimator.core import options
from gpuplan_estimator.core.layers import DTYPE_BYTES, FLOAT_DTYPES, Layer, ModelGraph, OpFamily
from gpuplan_estimator.core.precisions import (
    AUTOCAST_FP32_OPS,
    AUTOCAST_INPUT_DTYPE_OPS,
    AUTOCAST_LOWER_OPS,
)
from gpuplan_estimator.step import attention, eager, saved, training_ops

# c10/cuda/CUDACachingAllocator.cpp: kMinBlockSize = 512, every request is rounded up to a
# multiple of it and the stat `allocated_bytes` counts the rounded block.
ALLOCATION_ROUND_BYTES = 512
FP32_BYTES = 4
# Ops whose outputs alias their first input's storage in eager PyTorch (views).
# Identity is not one: dynamo exports write `aten.clone` (`.contiguous()`) as Identity, a copy.
VIEW_OPS = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Transpose", "Split",
                      "Slice", "Expand", "Dropout"})
# Full-size temporaries of one optimizer step's foreach path, in fp32 words per parameter:
# torch/optim/adam.py and adamw.py `_multi_tensor_*`: `exp_avg_sq_sqrt = _foreach_sqrt(...)`;
# adagrad `std = _foreach_sqrt(state_sums)`; rmsprop `avg = _foreach_sqrt(square_avg)`; sgd
# and momentum update in place.
FOREACH_TEMPORARY_WORDS = {"sgd": 0, "momentum": 0, "adam": 1, "adamw": 1, "adagrad": 1,
                           "rmsprop": 1}


@dataclass(frozen=True)
class PeakParts:
    """Bytes live at one instant of the step, by kind (each allocation rounded)."""

    phase: str
    """"forward", "backward", "optimizer" or "inference": where the instant is."""
    weights_bytes: int
    """fp32 (or compute-width, inference fp32) weights plus autocast copies live then."""
    gradients_bytes: int
    """Parameter `.grad` tensors live then."""
    optimizer_bytes: int
    """Optimizer state plus the optimizer's temporaries live then."""
    activations_bytes: int
    """Inputs, activations, saved tensors, loss tensors and activation gradients."""

    @property
    def total_bytes(self) -> int:
        """All tensor bytes at the instant (the library workspace is added by the caller)."""
        return (self.weights_bytes + self.gradients_bytes + self.optimizer_bytes
                + self.activations_bytes)


@dataclass(frozen=True)
class WalkSettings:
    """What the walk needs to know about the step."""

    training: bool
    half_bytes: int
    """Bytes per element of autocast's lower precision; 0 without autocast (fp32/tf32)."""
    optimizer: str
    optimizer_state_words: int
    batch_scale: float
    """Per-GPU batch / the batch the graph was built at: activation sizes scale with it."""
    allocation_round_bytes: int = ALLOCATION_ROUND_BYTES
    """The allocator's block: CUDA's 512 bytes; 1 to count requested bytes (a CPU profile)."""
    optimizer_impl: str = options.DEFAULT_OPTIMIZER_IMPL
    """foreach (PyTorch's default on CUDA): one temporary over all parameters; for-loop: the
    per-tensor path, whose temporaries are two of the largest parameter tensor (sqrt, then
    the divide); fused: none (the update runs in registers)."""
    cross_entropy_loss: bool = True
    """Training loss: cross entropy over the float outputs (its log-probabilities are kept);
    False for a loss that keeps nothing (a mean of the outputs)."""


def rounded(size_bytes: float, block_bytes: int = ALLOCATION_ROUND_BYTES) -> int:
    """Bytes an allocator with `block_bytes` blocks charges for a request of `size_bytes`."""
    if size_bytes <= 0:
        return 0
    return math.ceil(size_bytes / block_bytes) * block_bytes


def peak(graph: ModelGraph, settings: WalkSettings,
         fused: attention.FusedAttention = attention.EAGER) -> PeakParts:
    """The largest live set of one steady-state step (training) or forward (inference)."""
    return _Walk(graph, settings, fused).run()


class _Walk:
    """One walk; mutable bookkeeping kept inside, the result is a frozen `PeakParts`."""

    def __init__(self, graph: ModelGraph, settings: WalkSettings,
                 fused: attention.FusedAttention) -> None:
        self.graph, self.s, self.fused = graph, settings, fused
        self.params = eager.parameter_sizes(graph)
        self.layers = [la for la in graph.layers if not _makes_parameter(la, self.params)]
        self.needs_grad = _needs_grad(self.layers, self.params) if settings.training \
            else frozenset()
        # MatMul + Add(bias) as a dynamo export writes torch's linear: one op, one output.
        self.biased = eager.linear_biases(self.layers, self.params)
        self.width = run_widths(self.layers, self.params, settings.half_bytes,
                                frozenset(self.biased))
        self.storage = _storages(self.layers, self.params)  # tensor -> the storage it views
        self.tensors = {t.name: t for la in self.layers for t in (*la.inputs, *la.outputs)}
        produced = {t.name for la in self.layers for t in la.outputs}
        self.inputs = [n for n, t in self.tensors.items()
                       if n not in produced and n not in self.params and t.shape]
        self.outputs = [t.name for t in training_ops.graph_outputs(self.layers)]
        self.loss_outputs = [t.name for t in training_ops.loss_outputs(self.layers)]
        # Training's attention reads the cache's copies. An eager core's matmuls would have
        # kept contiguous copies of the strided keys and values instead (as many bytes, which
        # the walk counts); a fused kernel reads them in place. Measured on CPU, a 2-layer
        # GPT-2 at sequence 256: the cache added 0 bytes eager, its 1,048,576 under SDPA.
        self.cached = frozenset(graph.cache_tensors) \
            if not settings.training or fused.folded else frozenset()
        self.dropped = frozenset(graph.dropout_tensors) if settings.training else frozenset()
        self.size: dict[str, int] = {}  # storage -> bytes
        self.live = _SummedBytes()  # activation storages (and casts, loss tensors)
        self.weight_copies = _SummedBytes()
        self.grads = _SummedBytes()  # parameter .grad
        self.act_grads = _SummedBytes()
        self.optimizer_bytes = 0
        self.best: PeakParts | None = None
        self._weights_bytes: int | None = None

    # --- bookkeeping -----------------------------------------------------------------------

    def rounded(self, size_bytes: float) -> int:
        return rounded(size_bytes, self.s.allocation_round_bytes)

    def base(self, name: str) -> str:
        return self.storage.get(name, name)

    def tensor_bytes(self, elements: int, width: int, *, scaled: bool = True) -> int:
        return self.rounded(elements * width * (self.s.batch_scale if scaled else 1.0))

    def weights_bytes(self) -> int:
        # The module's weights are fp32 in every precision measured: autocast keeps them so.
        # Summed once: `mark` runs per layer, and a 70B graph has thousands of both (#34).
        if self._weights_bytes is None:
            self._weights_bytes = sum(self.rounded(n * FP32_BYTES) for n in self.params.values())
        return self._weights_bytes

    def mark(self, phase: str) -> None:
        parts = PeakParts(
            phase=phase,
            weights_bytes=self.weights_bytes() + self.weight_copies.total,
            gradients_bytes=self.grads.total,
            optimizer_bytes=self.optimizer_bytes,
            activations_bytes=self.live.total + self.act_grads.total)
        if self.best is None or parts.total_bytes > self.best.total_bytes:
            self.best = parts

    # --- the schedule ----------------------------------------------------------------------

    def run(self) -> PeakParts:
        s = self.s
        if s.training:
            self.optimizer_bytes = sum(self.rounded(n * FP32_BYTES) * s.optimizer_state_words
                                       for n in self.params.values())
        release = self.forward()
        if s.training:
            self.backward(release)
            self.optimizer_step()
        assert self.best is not None
        return self.best

    def forward(self) -> dict[str, int]:
        """Walk the forward; returns, per saved storage, the layer index whose backward frees
        it (the earliest saver: backward runs in reverse)."""
        last_use = _last_uses(self.layers, self.storage)
        for name in self.inputs:  # graph inputs (ids, images) exist before the step
            t = self.tensors[name]
            self.size[name] = self.live[name] = self.tensor_bytes(
                t.elements, self.element_width(name, t.dtype))
        release: dict[str, int] = {}
        keep = {self.base(n) for n in (*self.outputs, *self.inputs)}
        phase = "forward" if self.s.training else "inference"
        for i, la in enumerate(self.layers):
            transient = self.forward_layer(i, la, release)
            self.cache_copies(i, la, release)
            self.dropout_masks(i, la, release)
            self.mark(phase)
            for key in transient:
                self.live.pop(key, None)
            for t in la.inputs:
                b = self.base(t.name)
                if last_use.get(b, -1) <= i and b in self.live and b not in release \
                        and b not in keep:
                    del self.live[b]
        if self.s.training:
            self.loss_forward(release)
        for name in list(self.weight_copies):  # autocast's cache is cleared on leaving it
            if name not in release:
                del self.weight_copies[name]
        return release

    def forward_layer(self, i: int, la: Layer, release: dict[str, int]) -> list[str]:
        """Allocate `la`'s outputs and casts; record what its backward keeps. Returns the
        transient allocations to free once the layer ran."""
        transient: list[str] = []
        if la.name in self.fused.folded or la.name in self.fused.recomputed:
            return transient  # inside the fused kernel: its tensors never reach memory
        if _is_view(la, self.params):
            return transient
        casts = self.casts(la)
        for t in la.outputs:
            if t.name in self.fused.internal or t.name in self.biased.values():
                continue
            size = self.tensor_bytes(t.elements, self.element_width(t.name, t.dtype))
            self.size[t.name] = self.live[t.name] = size
        has_backward = self.s.training and any(t.name in self.needs_grad for t in la.inputs)
        kept = {t.name: t for t in saved.saved_tensors(la, self.needs_grad, self.fused)} \
            if has_backward else {}
        for name, (key, size, is_weight) in casts.items():
            if is_weight:
                self.weight_copies.setdefault(key, size)
                if has_backward and la.op_type in AUTOCAST_LOWER_OPS \
                        and any(t.name in self.needs_grad for t in la.inputs
                                if t.name != name):
                    release[key] = min(release.get(key, i), i)
                continue
            self.live[key] = size
            if name in kept:
                del kept[name]  # the copy is what the op keeps
                release[key] = min(release.get(key, i), i)
            else:
                transient.append(key)
        for t in kept.values():
            b = self.base(t.name)
            if b in self.params:
                continue  # a view of a weight: the weight is counted, its copy above
            if b not in self.size:  # made by the kernel for its backward (logsumexp, indices)
                width = FP32_BYTES if t.dtype in FLOAT_DTYPES else DTYPE_BYTES[t.dtype]
                self.size[b] = self.live[b] = self.tensor_bytes(t.elements, width)
            if b in self.live:
                release[b] = min(release.get(b, i), i)
        return transient

    def cache_copies(self, i: int, la: Layer, release: dict[str, int]) -> None:
        """The key/value cache's copies of `la`'s outputs (`ModelGraph.cache_tensors`), made
        as the layer runs: an inference forward returns them, so they live to its end; in
        training a fused attention reads the copies, so they live until this layer's backward
        (`self.cached` is empty for eager training)."""
        for t in la.outputs:
            if t.name in self.cached:
                key = f"{t.name}#cache"
                self.live[key] = self.tensor_bytes(t.elements,
                                                   self.element_width(t.name, t.dtype))
                if self.s.training:
                    release[key] = i

    def dropout_masks(self, i: int, la: Layer, release: dict[str, int]) -> None:
        """The bool mask dropout draws over each of `la`'s outputs that training drops
        (`ModelGraph.dropout_tensors`): one byte an element, kept for this layer's backward."""
        for t in la.outputs:
            if t.name in self.dropped:
                key = f"{t.name}#dropout_mask"
                self.live[key] = self.tensor_bytes(t.elements, 1)
                release[key] = i

    def casts(self, la: Layer) -> dict[str, tuple[str, int, bool]]:
        """Autocast copies `la` makes: input name -> (key, bytes, is a weight)."""
        half = self.s.half_bytes
        if not half:
            return {}
        if la.op_type in AUTOCAST_LOWER_OPS or la.name in self.fused.kept:
            target = half
        elif la.op_type in AUTOCAST_FP32_OPS:
            target = FP32_BYTES
        else:
            return {}
        out: dict[str, tuple[str, int, bool]] = {}
        for t in la.inputs:
            if t.dtype not in FLOAT_DTYPES or not t.shape:
                continue
            weight = self.base(t.name)
            is_weight = weight in self.params
            if is_weight and target == FP32_BYTES:
                continue  # fp32 weights stay as they are
            width = FP32_BYTES if is_weight else self.element_width(t.name, t.dtype)
            if width == target:
                continue
            key = f"{weight}#as{target}" if is_weight else f"{t.name}#as{target}@{la.name}"
            out[t.name] = (key, self.tensor_bytes(t.elements, target, scaled=not is_weight),
                           is_weight)
        return out

    def element_width(self, name: str, dtype: str) -> int:
        if dtype not in FLOAT_DTYPES:
            return DTYPE_BYTES[dtype]
        return self.width.get(name, FP32_BYTES if self.s.half_bytes else
                              DTYPE_BYTES.get(dtype, FP32_BYTES))

    def loss_forward(self, release: Mapping[str, int]) -> None:
        """Cross entropy over each float output: an fp32 copy of half logits (transient) and
        the fp32 log-probabilities (kept for backward). A key/value cache output
        (`training_ops.is_cache_output`) is no logit: the model returns it, and it stays live."""
        for name in self.loss_outputs:
            b = self.base(name)
            if not self.s.cross_entropy_loss:
                if b not in release:  # a mean keeps nothing; the outputs die with the call
                    self.live.pop(b, None)
                continue
            fp32 = self.tensor_bytes(self.tensors[name].elements, FP32_BYTES)
            if self.width.get(name, FP32_BYTES) != FP32_BYTES:
                self.live[f"{name}#fp32"] = fp32
            self.live[f"{name}#logprobs"] = fp32
            self.mark("forward")
            self.live.pop(f"{name}#fp32", None)
            if b not in release:  # the logits die with the model's output object
                self.live.pop(b, None)

    def backward(self, release: Mapping[str, int]) -> None:
        for name in self.loss_outputs:  # nll_loss_backward, then log_softmax_backward_data
            b = self.base(name)
            if not self.s.cross_entropy_loss:  # d(mean)/d(output): one output-sized tensor
                self.act_grads[b] = self.size.get(b, 0)
                continue
            fp32 = self.live.get(f"{name}#logprobs", 0)
            self.act_grads[f"{name}#dlogprobs"] = fp32
            self.act_grads[f"{name}#dfp32"] = fp32
            self.mark("backward")
            self.act_grads.pop(f"{name}#dlogprobs")
            self.live.pop(f"{name}#logprobs", None)
            width = self.width.get(name, FP32_BYTES)
            if width != FP32_BYTES:
                self.act_grads[b] = self.rounded(fp32 * width / FP32_BYTES)
                self.mark("backward")
                self.act_grads.pop(f"{name}#dfp32")
            else:
                self.act_grads[b] = self.act_grads.pop(f"{name}#dfp32")
        by_release: dict[int, list[str]] = {}
        for key, index in release.items():
            by_release.setdefault(index, []).append(key)
        for i in range(len(self.layers) - 1, -1, -1):
            la = self.layers[i]
            self.backward_layer(la)
            self.mark("backward")
            for key in by_release.get(i, ()):
                self.live.pop(key, None)
                self.weight_copies.pop(key, None)
            for t in la.outputs:
                if not _is_view(la, self.params):
                    self.act_grads.pop(self.base(t.name), None)
        self.act_grads.clear()

    def backward_layer(self, la: Layer) -> None:
        if not any(t.name in self.needs_grad for t in la.inputs) or _is_view(la, self.params) \
                or la.name in self.fused.folded or la.name in self.fused.recomputed:
            return
        made = {t.name for t in la.outputs}
        candidates = self.fused.kept.get(la.name, la.inputs)
        inputs = [t for t in candidates if t.name in self.needs_grad and t.name not in made]
        seen: set[str] = set()
        for t in inputs:
            b = self.base(t.name)
            if b in self.params:
                grad = self.rounded(self.params[b] * FP32_BYTES)
                if self.s.half_bytes and la.op_type in AUTOCAST_LOWER_OPS:
                    key = f"{b}#halfgrad"  # the copy's gradient, cast back to fp32
                    self.act_grads[key] = self.rounded(self.params[b] * self.s.half_bytes)
                if b in self.grads:  # a shared weight: the sum is a new tensor
                    self.act_grads[f"{b}#sum"] = grad
                self.grads[b] = grad
                continue
            if b in seen:
                continue  # views of one storage (q, k, v of one projection): one gradient
            seen.add(b)
            size = self.size.get(b, 0)
            if b in self.act_grads:
                self.act_grads[f"{b}#sum"] = size  # accumulated out of place, then freed
            else:
                self.act_grads[b] = size
        self.mark("backward")
        for key in [k for k in self.act_grads if k.endswith(("#sum", "#halfgrad"))]:
            del self.act_grads[key]

    def optimizer_step(self) -> None:
        self.live = _SummedBytes({n: self.size[n] for n in self.inputs})  # the ids/images
        self.weight_copies.clear()
        words = FOREACH_TEMPORARY_WORDS[self.s.optimizer]
        if self.s.optimizer_impl == options.FOREACH_OPTIMIZER:
            self.optimizer_bytes += sum(self.rounded(n * FP32_BYTES) * words
                                        for n in self.params.values())
        elif self.s.optimizer_impl == options.FOR_LOOP_OPTIMIZER:
            largest = max(self.params.values(), default=0)
            self.optimizer_bytes += 2 * words * self.rounded(largest * FP32_BYTES)
        self.mark("optimizer")


class _SummedBytes(dict[str, int]):
    """Byte counts by tensor that keep their sum as they change: `mark` reads the live set's
    total after every layer, and summing it afresh each time made the walk of a 70B graph
    (thousands of layers, thousands live) take most of a second (#34). Integers, so the
    running total is exactly the sum."""

    def __init__(self, items: Mapping[str, int] | None = None) -> None:
        super().__init__(items or {})
        self.total = sum(self.values())

    def __setitem__(self, key: str, size_bytes: int) -> None:
        self.total += size_bytes - self.get(key, 0)
        super().__setitem__(key, size_bytes)

    def __delitem__(self, key: str) -> None:
        self.total -= self[key]
        super().__delitem__(key)

    @overload  # type: ignore[override]  # dict's generic default is not needed here
    def pop(self, key: str, /) -> int: ...

    @overload
    def pop(self, key: str, default: int | None, /) -> int | None: ...

    def pop(self, key: str, *default: int | None) -> int | None:
        if key in self:
            self.total -= self[key]
        return super().pop(key, *default)

    def setdefault(self, key: str, size_bytes: int) -> int:
        if key not in self:
            self[key] = size_bytes
        return self[key]

    def clear(self) -> None:
        super().clear()
        self.total = 0

    def update(self, *args: object, **kwargs: object) -> None:
        raise TypeError("_SummedBytes is changed one key at a time (its total would drift)")


def _makes_parameter(la: Layer, params: Mapping[str, int]) -> bool:
    return bool(la.outputs) and all(t.name in params for t in la.outputs)


def _is_view(la: Layer, params: Mapping[str, int]) -> bool:
    if not la.inputs:
        return False
    if la.op_type in VIEW_OPS:
        return True
    if eager.is_select(la, params):
        return True
    if la.op_type == "CastLike":
        return la.outputs[0].dtype == la.inputs[0].dtype
    return la.family is OpFamily.SHAPE_ONLY and la.inputs[0].dtype == la.outputs[0].dtype \
        and la.outputs[0].elements <= la.inputs[0].elements


def _needs_grad(layers: Iterable[Layer], params: Mapping[str, int]) -> frozenset[str]:
    needs = set(params)
    for la in layers:
        if any(t.name in needs for t in la.inputs):
            needs.update(t.name for t in la.outputs if t.dtype in FLOAT_DTYPES)
    return frozenset(needs)


def _storages(layers: Iterable[Layer], params: Mapping[str, int]) -> dict[str, str]:
    """Tensor -> the tensor owning its memory, for the outputs of view ops."""
    storage: dict[str, str] = {}
    for la in layers:
        if _is_view(la, params):
            base = storage.get(la.inputs[0].name, la.inputs[0].name)
            for t in la.outputs:
                storage[t.name] = base
    return storage


def _last_uses(layers: list[Layer], storage: Mapping[str, str]) -> dict[str, int]:
    """Storage -> index of the last layer reading it through any view."""
    last: dict[str, int] = {}
    for i, la in enumerate(layers):
        for t in la.inputs:
            last[storage.get(t.name, t.name)] = i
    return last




def run_widths(layers: Iterable[Layer], params: Mapping[str, int], half: int,
               biases: frozenset[str] = frozenset()) -> dict[str, int]:
    """Bytes per element of every float tensor as the step runs (autocast's dtype flow)."""
    width: dict[str, int] = {}
    for la in layers:
        def w(name: str, dtype: str) -> int:
            if name in params or not half:
                return FP32_BYTES if half else DTYPE_BYTES.get(dtype, FP32_BYTES)
            return width.get(name, FP32_BYTES)

        floats = [t for t in la.inputs if t.dtype in FLOAT_DTYPES and t.shape]
        if not half:
            out = None
        elif la.op_type in AUTOCAST_LOWER_OPS or la.name in biases:
            out = half
        elif la.op_type in AUTOCAST_FP32_OPS:
            out = FP32_BYTES
        elif la.op_type in AUTOCAST_INPUT_DTYPE_OPS and floats:
            out = w(floats[0].name, floats[0].dtype)
        elif floats:
            out = max(w(t.name, t.dtype) for t in floats)
        else:
            out = FP32_BYTES
        for t in la.outputs:
            if t.dtype in FLOAT_DTYPES:
                width[t.name] = out if out is not None else DTYPE_BYTES[t.dtype]
    return width
