"""Argument types shared by the subcommands: argparse `type=` callables with clear errors."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

from gpuplan_estimator import devices
from gpuplan_estimator.core import durations, limits, options
from gpuplan_estimator.core.errors import InvalidRequestError

MAX_COUNT = 10**12
"""Largest count any flag takes (the CRD's dataset-size bound); beyond it, a batch or a dim
would overflow the int64 of an ONNX shape."""


def positive_int(text: str) -> int:
    """A positive integer up to `MAX_COUNT` from the command line (argparse `type=`)."""
    return _bounded(text, MAX_COUNT)


def count_up_to(maximum: int) -> Callable[[str], int]:
    """An argparse `type=` for a positive integer up to `maximum` (a cap of `core.limits`)."""
    def parse(text: str) -> int:
        return _bounded(text, maximum)

    parse.__name__ = f"integer in 1..{maximum}"  # what argparse names in its error
    return parse


def _bounded(text: str, maximum: int) -> int:
    shown = text if len(text) < 30 else text[:27] + "..."
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {shown!r}") from None
    if not 0 < value <= maximum:
        raise argparse.ArgumentTypeError(f"must be between 1 and {maximum}, got {shown}")
    return value


def positive_float(text: str) -> float:
    """A finite number > 0 (argparse `type=`): `inf`, `nan` and `1e999` are refused."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text[:30]!r}"
                                         ) from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text[:30]}")
    return value


def share(text: str) -> float:
    """A fraction in (0, 1] (argparse `type=`)."""
    value = positive_float(text)
    if value > 1:
        raise argparse.ArgumentTypeError(f"must be a fraction in (0, 1], got {text[:30]}")
    return value

def dim_binding(text: str) -> tuple[str, int]:
    """``NAME=VALUE`` binding of a symbolic dim to a positive integer."""
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    if len(name) > limits.MAX_DIM_NAME_CHARS:
        raise argparse.ArgumentTypeError(
            f"dim name longer than {limits.MAX_DIM_NAME_CHARS} characters")
    return name, _bounded(value, limits.MAX_DIM)


def duration_seconds(text: str) -> float:
    """A duration (argparse `type=`): ``2h``, ``90m``, ``1h30m``, ``45s`` as the CRD writes
    them, or a plain number of seconds."""
    try:
        seconds = float(durations.parse_duration_seconds(text))
    except ValueError:
        try:
            seconds = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected a duration like 2h, 90m, 1h30m or seconds, got {text[:30]!r}"
            ) from None
    if not (math.isfinite(seconds) and seconds > 0):
        raise argparse.ArgumentTypeError(f"must be a duration longer than 0s, got {text[:30]}")
    return seconds


def duration_minutes(text: str) -> float:
    """A time budget in minutes (argparse `type=`): a plain number of minutes (0 allowed: no
    budget to spend), or a duration like ``90m``, ``2h``, ``1h30m``."""
    try:
        minutes = durations.parse_duration_seconds(text) / 60.0
    except ValueError:
        try:
            minutes = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected minutes or a duration like 90m, 2h, 1h30m, got {text[:30]!r}"
            ) from None
    if not (math.isfinite(minutes) and minutes >= 0):
        raise argparse.ArgumentTypeError(f"must be 0 or more minutes, got {text[:30]}")
    return minutes


PRICES_HELP = ("PROVIDER of the shipped price book (aws, lambda: published on-demand prices, "
               "dated; a plan then compares within that provider), or a YAML/JSON file: a "
               "one-provider book ('providers:', see docs/catalog.md) or a 'prices:' mapping "
               "of GPU type to USD per GPU hour overriding the catalog's indicative prices")


def add_optimizer_impl(parser: argparse.ArgumentParser) -> None:
    """`--optimizer-impl`: how torch.optim runs the update (`options.OPTIMIZER_IMPLS`)."""
    parser.add_argument("--optimizer-impl", choices=options.OPTIMIZER_IMPLS,
                        default=options.DEFAULT_OPTIMIZER_IMPL,
                        help=f"how torch.optim runs the update (default "
                        f"{options.DEFAULT_OPTIMIZER_IMPL}, PyTorch's on CUDA): fused "
                        "(fused=True), or for-loop (foreach=False, one launch per tensor)")


def check_optimizer_impl(args: argparse.Namespace) -> None:
    """Refuse `--optimizer-impl` for an `--optimizer` torch.optim cannot run that way."""
    problem = options.optimizer_impl_problem(args.optimizer, args.optimizer_impl)
    if problem is not None:
        raise InvalidRequestError("--optimizer-impl", problem)


def add_prices_flag(parser: argparse.ArgumentParser) -> None:
    """``--prices FILE``, the same on every command that prices GPUs."""
    parser.add_argument("--prices", default=None, metavar="PROVIDER|FILE", help=PRICES_HELP)


CATALOG_HELP = ("YAML/JSON file of your own GPUs by spec (memory, bandwidth, SMs, clocks, "
                "peaks, power, interconnect, price, product labels): adds to or overrides the "
                "shipped catalog; see docs/catalog.md")


def add_catalog_flag(parser: argparse.ArgumentParser) -> None:
    """``--catalog FILE``, the same on every command that lists or prices devices."""
    parser.add_argument("--catalog", default=None, metavar="FILE", help=CATALOG_HELP)


def catalog(prices_file: str | None, catalog_file: str | None = None) -> devices.Catalog:
    """The device catalog with ``--catalog``'s devices and ``--prices``' prices applied."""
    return devices.apply_prices(devices.load_catalog(user_file=catalog_file), prices_file)
