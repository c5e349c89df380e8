"""MIG profiles (`1g.10gb`, ...) as devices of their own, derived from their parent GPU's spec.

A MIG GPU instance owns whole compute slices (a GPU has 7) and memory slices (8): its SMs, and
so its peak rates, are its compute slices' share of the parent's, while its memory, memory
bandwidth and L2 cache are its memory slices' share (each memory slice carries its memory
controllers and L2 banks). The profiles each GPU supports and their slice counts come from
NVIDIA's table, "Supported MIG Profiles", Multi-Instance GPU User Guide
(https://docs.nvidia.com/datacenter/tesla/mig-user-guide/supported-mig-profiles.html, read
2026-11-28): the columns "Fraction of Memory" and "Fraction of SMs".

`catalog` derives the profile's spec from its parent's by these slice counts. A profile is
named as GPU Feature Discovery names it: the parent's product label, `-MIG-`,
then the profile (`NVIDIA-A100-SXM4-80GB-MIG-1g.10gb`); its catalog key is the parent's key
with `-mig-<profile>` appended.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping

COMPUTE_SLICES = 7
MEMORY_SLICES = 8
MIG_SOURCE = ("NVIDIA Multi-Instance GPU User Guide, Supported MIG Profiles "
              "(https://docs.nvidia.com/datacenter/tesla/mig-user-guide/"
              "supported-mig-profiles.html)")


@dataclasses.dataclass(frozen=True)
class MigProfile:
    """One GPU instance profile: its compute slices (of 7) and memory slices (of 8)."""

    name: str  # e.g. "1g.10gb"
    compute_slices: int
    memory_slices: int


def _profiles(*rows: tuple[str, int, int]) -> Mapping[str, MigProfile]:
    return {name: MigProfile(name, c, m) for name, c, m in rows}


# The "+me" (media extension) variants differ only in decoders, which training does not use.
_A100_40GB = _profiles(("1g.5gb", 1, 1), ("1g.10gb", 1, 2), ("2g.10gb", 2, 2),
                       ("3g.20gb", 3, 4), ("4g.20gb", 4, 4), ("7g.40gb", 7, 8))
_80GB = _profiles(("1g.10gb", 1, 1), ("1g.20gb", 1, 2), ("2g.20gb", 2, 2),
                  ("3g.40gb", 3, 4), ("4g.40gb", 4, 4), ("7g.80gb", 7, 8))
PROFILES_BY_PARENT: Mapping[str, Mapping[str, MigProfile]] = {
    "a100-sxm4-40gb": _A100_40GB, "a100-pcie-40gb": _A100_40GB,
    "a100-sxm4-80gb": _80GB, "a100-pcie-80gb": _80GB,
    "h100-sxm-80gb": _80GB, "h100-pcie-80gb": _80GB,
}
"""Catalog key of a MIG-capable GPU → the profiles it supports, by name."""

_MIG_NAME = re.compile(r"^(?P<parent>.+?)[-_ ]?mig[-_ ]?(?P<profile>\d+g\.\d+gb)(\+me)?$",
                       re.IGNORECASE)


def split_name(name: str) -> tuple[str, str] | None:
    """(parent name, profile) of a MIG device name (`NVIDIA-A100-SXM4-80GB-MIG-1g.10gb`, or a
    catalog key `a100-sxm4-80gb-mig-1g.10gb`); None when `name` names no MIG profile."""
    match = _MIG_NAME.match(name.strip())
    if match is None:
        return None
    return match["parent"], match["profile"].lower()


def profile_of(parent_key: str, profile: str) -> MigProfile | None:
    """Profile `profile` of the GPU with catalog key `parent_key`, None when NVIDIA's table
    has no such profile."""
    return PROFILES_BY_PARENT.get(parent_key, {}).get(profile)
