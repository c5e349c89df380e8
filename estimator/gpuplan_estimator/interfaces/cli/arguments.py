"""Argument types shared by the subcommands: argparse `type=` callables with clear errors."""

from __future__ import annotations

import argparse


def positive_int(text: str) -> int:
    """A positive integer from the command line (argparse `type=`)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {value}")
    return value


def dim_binding(text: str) -> tuple[str, int]:
    """``NAME=VALUE`` binding of a symbolic dim to a positive integer."""
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    return name, positive_int(value)
