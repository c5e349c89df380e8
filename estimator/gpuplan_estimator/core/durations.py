"""Durations as people write them (``4h``, ``90m``, ``1h30m``) and as they read them.

The one grammar for a duration: the TrainingJob CRD's CEL rule, the operator's spec parser and
the CLI's ``--deadline`` all accept exactly these strings (the CRD rule is tested against it).
"""

from __future__ import annotations

import math
import re

DURATION_PATTERN = r"^(?:[0-9]+[dhms])+$"
"""Digits and a unit, repeated: ``2h``, ``90m``, ``1d12h``, ``45s``."""
_DURATION = re.compile(DURATION_PATTERN)
_DURATION_PART = re.compile(r"([0-9]+)([dhms])")
_UNIT_SECONDS = {"d": 86400, "h": 3600, "m": 60, "s": 1}
MAX_DURATION_CHARS = 64
"""Longest duration text read (``99999d`` is far past any deadline; more is not a duration)."""


def parse_duration_seconds(text: str) -> int:
    """``1h30m`` → 5400. Raises ValueError for anything else (same grammar as the CRD)."""
    if len(text) > MAX_DURATION_CHARS or not _DURATION.match(text):
        raise ValueError(f"not a duration like 4h, 90m or 1h30m: {text[:MAX_DURATION_CHARS]!r}")
    return sum(int(n) * _UNIT_SECONDS[u] for n, u in _DURATION_PART.findall(text))


def format_duration(seconds: float | None) -> str:
    """Seconds for a reader: ``850 ms``, ``42 s``, ``12m 30s``, ``3h 05m``, ``4d 02h``; ``-``
    for None. Two units at most: enough to compare plans, never a decimal hour."""
    if seconds is None or not math.isfinite(seconds):
        return "-"
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.1f} s" if seconds < 10 else f"{seconds:.0f} s"
    whole = round(seconds)
    for big, small, big_unit, small_unit in ((86400, 3600, "d", "h"), (3600, 60, "h", "m"),
                                             (60, 1, "m", "s")):
        if whole >= big:
            high, rest = divmod(whole, big)
            return f"{high}{big_unit} {rest // small:02d}{small_unit}"
    raise AssertionError("unreachable: whole >= 60 here")  # pragma: no cover
