"""Shapes of ONNX sequence ops, which shape inference leaves open: torch.onnx's dynamo exporter
writes `torch.split`/`chunk` as SplitToSequence + SequenceAt, and `torch.cat` of a list as
ConcatFromSequence.

A sequence is kept as its element tensors, named ``<sequence>[i]``; each op's shapes follow
from those and from the integer constants it reads (`split`, `position`). A length or position
that is not a constant is an error naming the node: it is never guessed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from gpuplan_estimator.core import errors
from gpuplan_estimator.core.layers import TensorInfo

SEQUENCE_OPS = frozenset({"SplitToSequence", "SequenceConstruct", "SequenceAt",
                          "ConcatFromSequence", "SequenceLength", "SequenceInsert",
                          "SequenceEmpty"})

MAX_ELEMENTS = 4096
"""Longest sequence accepted (a split into per-token or per-head pieces stays far below)."""

Constants = Mapping[str, tuple[int, ...]]
Sequences = Mapping[str, tuple[TensorInfo, ...]]


def element_names(sequence: str, count: int) -> list[str]:
    """Names of a sequence's element tensors."""
    return [f"{sequence}[{i}]" for i in range(count)]


def split(x: TensorInfo, out: str, split_sizes: tuple[int, ...] | None, axis: int,
          keepdims: bool, where: str) -> tuple[TensorInfo, ...]:
    """SplitToSequence's elements: chunks of `split_sizes` along `axis` (a scalar size gives
    equal chunks with a smaller last one; none gives size-1 chunks, squeezed unless
    `keepdims`)."""
    axis = _axis(axis, len(x.shape), where)
    length = x.shape[axis]
    pieces_asked = length if split_sizes is None else len(split_sizes)
    if pieces_asked > MAX_ELEMENTS:
        raise errors.InvalidModelError(f"{where}: more than {MAX_ELEMENTS} sequence elements")
    if split_sizes is None:
        sizes, squeeze = [1] * length, not keepdims
    elif len(split_sizes) == 1:  # a scalar: chunks of that size, the last one smaller
        step = split_sizes[0]
        if step <= 0 or length // step > MAX_ELEMENTS:
            raise errors.InvalidModelError(
                f"{where}: split size {step} of a dim of {length}: not positive, or more "
                f"than {MAX_ELEMENTS} pieces")
        sizes, squeeze = [min(step, length - start) for start in range(0, length, step)], False
    else:
        sizes, squeeze = list(split_sizes), False
    if sum(sizes) != length or any(s < 0 for s in sizes):
        raise errors.InvalidModelError(
            f"{where}: split sizes {sizes} do not add up to dim {axis} of {list(x.shape)}")
    pieces = []
    for name, size in zip(element_names(out, len(sizes)), sizes, strict=True):
        shape = list(x.shape)
        if squeeze:
            del shape[axis]
        else:
            shape[axis] = size
        pieces.append(TensorInfo(name, tuple(shape), x.dtype))
    return tuple(pieces)


def at(elements: tuple[TensorInfo, ...], position: int, out: str, where: str) -> TensorInfo:
    """SequenceAt's result: the element at `position` (negative counts from the end)."""
    if not -len(elements) <= position < len(elements):
        raise errors.InvalidModelError(
            f"{where}: position {position} outside a sequence of {len(elements)}")
    chosen = elements[position]
    return TensorInfo(out, chosen.shape, chosen.dtype)


def concat(elements: Sequence[TensorInfo], out: str, axis: int, new_axis: bool,
           where: str) -> TensorInfo:
    """ConcatFromSequence's result: the elements joined along `axis` (stacked if `new_axis`)."""
    if not elements:
        raise errors.InvalidModelError(f"{where}: concatenation of an empty sequence")
    first = elements[0]
    rank = len(first.shape) + (1 if new_axis else 0)
    axis = _axis(axis, rank, where)
    if new_axis:
        shape = list(first.shape)
        shape.insert(axis, len(elements))
        return TensorInfo(out, tuple(shape), first.dtype)
    shape = list(first.shape)
    shape[axis] = sum(e.shape[axis] for e in elements)
    return TensorInfo(out, tuple(shape), first.dtype)


def constant_int(constants: Constants, tensor: str, where: str, what: str) -> tuple[int, ...]:
    """The integer constant a sequence op reads, or an error naming the node and input."""
    if tensor not in constants:
        raise errors.InvalidModelError(
            f"{where}: {what} {tensor!r} is not a constant, so the sequence's shapes are "
            "unknown")
    return constants[tensor]


def constant_scalar(constants: Constants, tensor: str, where: str, what: str) -> int:
    """A one-value integer constant (a position), or an error naming the node and input."""
    values = constant_int(constants, tensor, where, what)
    if len(values) != 1:
        raise errors.InvalidModelError(f"{where}: {what} {tensor!r} holds {len(values)} values")
    return values[0]


def _axis(axis: int, rank: int, where: str) -> int:
    if not -rank <= axis < rank:
        raise errors.InvalidModelError(f"{where}: axis {axis} outside rank {rank}")
    return axis % rank
