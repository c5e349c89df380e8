"""Per-layer predictions rolled up by op type and by block, for `estimate --explain`.

A thousand layers are read as a dozen groups: where the step's time goes by kind of operation,
and by the model's repeated blocks (transformer layers, ResNet stages). Blocks are recognised
in the layer names exporters write (`/model/layers.3/...`, `transformer.h.6....`,
`/layer2/layer2.1/...`, `blocks.4...`); layers outside any block are grouped as such.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gpuplan_estimator.planning.estimates import LayerTimeEstimate

OUTSIDE_BLOCKS = "(outside blocks)"
_BLOCK = re.compile(
    r"^(.*?(?:^|[/._])(?:layers?|h|blocks?|stages?|encoder_layers?|decoder_layers?)[._]?\d+)"
    r"(?=$|[/._])")


@dataclass(frozen=True)
class Group:
    """Layers sharing an op type or block: how many, their time, and share of the layers'."""

    name: str
    layers: int
    forward_ms: float
    backward_ms: float
    share: float  # of all layers' forward+backward time

    @property
    def total_ms(self) -> float:
        """Forward plus backward time of the group in ms."""
        return self.forward_ms + self.backward_ms


def block_of(layer_name: str) -> str:
    """The block a layer belongs to (its name up to the block index), or `OUTSIDE_BLOCKS`."""
    match = _BLOCK.match(layer_name)
    return match.group(1).lstrip("/") if match else OUTSIDE_BLOCKS


def by_op_type(layers: Sequence[LayerTimeEstimate]) -> tuple[Group, ...]:
    """Groups by ONNX op type, most time first."""
    return _groups(layers, lambda layer: layer.op_type)


def by_block(layers: Sequence[LayerTimeEstimate]) -> tuple[Group, ...]:
    """Groups by block, most time first; one `OUTSIDE_BLOCKS` group when names carry none."""
    return _groups(layers, lambda layer: block_of(layer.name))


def _groups(layers: Sequence[LayerTimeEstimate], key: Callable[[LayerTimeEstimate], str]
            ) -> tuple[Group, ...]:
    sums: dict[str, list[float]] = {}
    for layer in layers:
        acc = sums.setdefault(key(layer), [0.0, 0.0, 0.0])
        acc[0] += 1
        acc[1] += layer.forward_ms
        acc[2] += layer.backward_ms
    total = sum(fwd + bwd for _, fwd, bwd in sums.values())
    groups = [Group(name, int(n), fwd, bwd, (fwd + bwd) / total if total > 0 else 0.0)
              for name, (n, fwd, bwd) in sums.items()]
    return tuple(sorted(groups, key=lambda g: (-g.total_ms, natural_key(g.name))))


def natural_key(name: str) -> tuple[tuple[int, str], ...]:
    """Sort key reading digit runs as numbers: h.2 before h.10 (equal blocks tie on time)."""
    return tuple((int(part), "") if part.isdigit() else (-1, part)
                 for part in re.split(r"(\d+)", name))
