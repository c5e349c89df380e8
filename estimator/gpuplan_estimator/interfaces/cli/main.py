"""The `gpuplan` command line: estimate, strip, devices, demo, plus plugged-in subcommands.

The built-in commands live in `estimating` and `demo`; other modules add subcommands by
defining ``register(subparsers)`` (each parser sets ``func``: args → exit code) and being listed
in `COMMAND_MODULES`. Every failure becomes one ``gpuplan: error: ...`` line on stderr and the
exit code of its kind (`exits`: 2 usage or invalid input, 3 infeasible, 4 unavailable, 1 a bug
of ours); ``--debug`` shows the traceback too.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import os
import sys
import traceback
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from gpuplan_estimator.core import extras, provenance
from gpuplan_estimator.core.errors import GpuplanError
from gpuplan_estimator.interfaces.cli import completion, demo, estimating, exits, plans

# Subcommands that other modules add with ``register(subparsers)``: command -> (module, the
# extra its imports need, `core.extras`). A command imports only its own module, so a core
# install (no pandas, onnxruntime, ...) runs `gpuplan plan`, and a missing extra is named (#20).
_CLI = "gpuplan_estimator.interfaces.cli"
COMMAND_MODULES: dict[str, tuple[str, str]] = {
    "bench": (f"{_CLI}.bench", "bench"),
    "import": (f"{_CLI}.bench", "bench"),
    "models-report": (f"{_CLI}.training", "bench"),
    "train": (f"{_CLI}.training", "bench"),
    "serve": (f"{_CLI}.serving", "serve"),
    "eval": (f"{_CLI}.evaluation", "bench"),
    "models": (f"{_CLI}.models", "bench"),
}
BUILTIN_COMMANDS = frozenset({"estimate", "strip", "devices", "demo", "plan", "completion"})
EXIT_USAGE = exits.ExitCode.USAGE


class UsageError(GpuplanError):
    """A command-line usage error (argparse's), reported like any other bad input."""


class _Parser(argparse.ArgumentParser):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # No prefix matching: `--dat 9` must not silently become --dataset-size, and a flag
        # added later must not change what an abbreviation in a user's script means.
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

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
    except BrokenPipeError:  # `gpuplan ... | head`: the reader left, nothing to report
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - silences the flush at exit
        return exits.ExitCode.OK
    except KeyboardInterrupt:
        print("gpuplan: interrupted", file=sys.stderr)
        return exits.ExitCode.INTERRUPTED
    except Exception as exc:
        if debug:
            traceback.print_exc()
        print(f"gpuplan: error: {_describe(exc, debug)}", file=sys.stderr)
        return exits.for_error(exc)


def _describe(exc: Exception, debug: bool) -> str:
    """One line for the user: the domain message, the file of an I/O error, or for a bug of
    ours its type and where to look."""
    code = exits.for_error(exc)
    if isinstance(exc, OSError) and not isinstance(exc, ConnectionError | TimeoutError):
        name = f"{exc.filename}: " if exc.filename else ""
        return f"{name}{exc.strerror or exc}"
    if code == exits.ExitCode.INTERNAL:
        hint = "" if debug else " (run again with --debug for the traceback, and report it)"
        return f"internal error: {type(exc).__name__}: {exc}{hint}"
    details = getattr(exc, "details", ())
    if isinstance(details, tuple | list) and len(details) > 1:  # one line per field or type
        head = str(exc).split(": ", 1)[0]
        return "\n  ".join([f"{head}:", *map(str, details)])
    return str(exc)


def _wants_plugins(argv: Sequence[str]) -> bool | str:
    """Plugged-in modules import SQLAlchemy, pandas, ...: none for a built-in command, only its
    own for a plugged-in one (its name), all of them for help or a mistyped command (True)."""
    command = next((a for a in argv if not a.startswith("-")), None)
    if command in BUILTIN_COMMANDS:
        return False
    return command if command in COMMAND_MODULES else True


def _register_plugins(sub: Any, plugins: bool | str) -> None:
    """Add the plugged-in subcommands `plugins` names (see `_wants_plugins`).

    The named command's missing extra is a `MissingExtraError`; loading all of them, a module
    whose extra is missing leaves stubs that say what to install (help and completion list them).
    """
    if plugins is False:
        return
    chosen = [COMMAND_MODULES[plugins]] if isinstance(plugins, str) else COMMAND_MODULES.values()
    for module_name, extra in dict.fromkeys(chosen):
        commands = [plugins] if isinstance(plugins, str) else [
            c for c, (m, _) in COMMAND_MODULES.items() if m == module_name]
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            errors = {c: extras.missing(exc, extra, needed_by=f"gpuplan {c}") for c in commands}
            if any(e is exc for e in errors.values()):
                raise  # not an optional package: a bug of ours
            if isinstance(plugins, str):
                raise errors[plugins] from exc
            for command, error in errors.items():
                stub = sub.add_parser(command, help=f"(not installed: {extras.hint(extra)})")
                stub.set_defaults(func=functools.partial(_raise, error))
            continue
        module.register(sub)


def _raise(error: Exception, _: argparse.Namespace) -> int:
    """A stub command's `func`: the import error its module met."""
    raise error


EPILOG = """exit codes: 0 success, 1 internal error, 2 usage or invalid input,
3 infeasible (no plan; the model fits no device), 4 unavailable (database, service, optional
package), 5 incomplete (a budgeted bench stopped; run it again to resume), 130 interrupted.
Docs: README.md and docs/ in the source distribution."""




def build_parser(*, plugins: bool | str = True) -> argparse.ArgumentParser:
    """The whole parser; `plugins=False` leaves out the plugged-in subcommands, a command's
    name loads only its module (see `_wants_plugins`)."""
    parser = _Parser(prog="gpuplan", description="GPU right-sizing for deep-learning training: "
                     "predict step time and memory per GPU type, then choose type and count.",
                     epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version",
                        version=f"%(prog)s {provenance.installed_version()}",
                        help="print the version and exit")
    parser.add_argument("--debug", action="store_true", help="show tracebacks of errors")
    sub = parser.add_subparsers(title="commands", metavar="COMMAND", parser_class=_Parser)
    estimating.register(sub)
    plans.register(sub)
    demo.register(sub)
    completion.register(sub, functools.partial(build_parser, plugins=True))
    _register_plugins(sub, plugins)
    return parser


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
