"""Argument types shared by the subcommands: argparse `type=` callables with clear errors."""

from __future__ import annotations

import argparse

MAX_COUNT = 10**12
"""Largest count any flag takes (the CRD's dataset-size bound); beyond it, a batch or a dim
would overflow the int64 of an ONNX shape."""


def positive_int(text: str) -> int:
    """A positive integer up to `MAX_COUNT` from the command line (argparse `type=`)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if not 0 < value <= MAX_COUNT:
        shown = text if len(text) < 30 else text[:27] + "..."
        raise argparse.ArgumentTypeError(f"must be between 1 and {MAX_COUNT}, got {shown}")
    return value


def dim_binding(text: str) -> tuple[str, int]:
    """``NAME=VALUE`` binding of a symbolic dim to a positive integer."""
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    return name, positive_int(value)
