"""The operator package's console scripts: without the `[operator]` extra they say which extra
to install in one line (exit 4, unavailable) instead of a ModuleNotFoundError traceback."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from gpuplan_estimator.core import extras
from gpuplan_estimator.core.exit_codes import ExitCode

OPERATOR_EXTRA = "operator"


def require_operator_extra(program: str) -> None:
    """Exit with one line naming the extra when a module of `[operator]` is missing."""
    try:
        for module in sorted(extras.extra_modules(OPERATOR_EXTRA)):
            extras.require(module, OPERATOR_EXTRA, needed_by=program)
    except extras.MissingExtraError as exc:
        print(f"{program}: error: {exc}", file=sys.stderr)
        sys.exit(ExitCode.UNAVAILABLE)


def operator(argv: Sequence[str] | None = None) -> None:
    """`gpuplan-operator`."""
    from gpuplan_operator import __main__ as operator_main

    args = operator_main.build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    require_operator_extra(operator_main.PROG)  # after parsing: --help works without it
    operator_main.run(args)


def extender(argv: Sequence[str] | None = None) -> int:
    """`gpuplan-extender`."""
    require_operator_extra("gpuplan-extender")
    from gpuplan_operator.extender import cli

    return cli.main(None if argv is None else list(argv))
