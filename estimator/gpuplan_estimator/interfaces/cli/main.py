"""The `gpuplan` command line: estimate, strip, devices, demo, plus plugged-in subcommands.

The built-in commands live in `estimating` and `demo`; other modules add subcommands by
defining ``register(subparsers)`` (each parser sets ``func``: args → exit code) and being listed
in `COMMAND_MODULES`. Every `GpuplanError` and usage error becomes one ``gpuplan: error: ...``
line on stderr and exit code 2; ``--debug`` shows the traceback instead.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import traceback
from collections.abc import Callable, Sequence
from typing import NoReturn

from gpuplan_estimator.core.errors import GpuplanError
from gpuplan_estimator.interfaces.cli import demo, estimating

# Modules whose `register(subparsers)` adds subcommands (bench, import, train, eval, serve, plan).
COMMAND_MODULES: tuple[str, ...] = (
    "gpuplan_estimator.interfaces.cli.bench",
    "gpuplan_estimator.interfaces.cli.training",
    "gpuplan_estimator.interfaces.cli.serving",
    "gpuplan_estimator.interfaces.cli.evaluation",
)
BUILTIN_COMMANDS = frozenset({"estimate", "strip", "devices", "demo"})
EXIT_USAGE = 2


class UsageError(GpuplanError):
    """A command-line usage error (argparse's), reported like any other bad input."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: {message}")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code (the console script exits with it)."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args_list
    try:
        parser = build_parser(plugins=_wants_plugins(args_list))
        args = parser.parse_args(args_list)
        func: Callable[[argparse.Namespace], int] | None = getattr(args, "func", None)
        if func is None:
            parser.print_help(sys.stderr)
            return EXIT_USAGE
        return func(args)
    except GpuplanError as exc:
        if debug:
            traceback.print_exc()
        print(f"gpuplan: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:  # `gpuplan ... | head`: the reader left, nothing to report
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - silences the flush at exit
        return 0
    except OSError as exc:  # files the user named: unreadable input, unwritable output
        if debug:
            traceback.print_exc()
        name = f"{exc.filename}: " if exc.filename else ""
        print(f"gpuplan: error: {name}{exc.strerror or exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("gpuplan: interrupted", file=sys.stderr)
        return 130


def _wants_plugins(argv: Sequence[str]) -> bool:
    """Plugged-in modules import SQLAlchemy, SciPy, ...: skip them for the built-in commands."""
    command = next((a for a in argv if not a.startswith("-")), None)
    return command not in BUILTIN_COMMANDS


def build_parser(*, plugins: bool = True) -> argparse.ArgumentParser:
    """The whole parser; `plugins=False` leaves out the subcommands that need heavy imports."""
    parser = _Parser(prog="gpuplan", description="GPU right-sizing for deep-learning training.")
    parser.add_argument("--debug", action="store_true", help="show tracebacks of errors")
    sub = parser.add_subparsers(title="commands", metavar="COMMAND", parser_class=_Parser)
    estimating.register(sub)
    demo.register(sub)
    for module_name in COMMAND_MODULES if plugins else ():
        importlib.import_module(module_name).register(sub)
    return parser


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
