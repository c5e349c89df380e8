"""`gpuplan-operator`: run the kopf operator with the handlers module loaded by file path."""

from __future__ import annotations

import pathlib
import sys
from collections.abc import Sequence

HANDLERS = pathlib.Path(__file__).with_name("handlers.py")


def kopf_argv(extra: Sequence[str]) -> list[str]:
    """`kopf run` arguments; without -n/-A the operator watches all namespaces."""
    flags = {"-n", "--namespace", "-A", "--all-namespaces"}
    scoped = any(a in flags or a.startswith("--namespace=") for a in extra)
    return ["run", *([] if scoped else ["--all-namespaces"]), *extra, str(HANDLERS)]


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of `gpuplan-operator`: `kopf run` over the handlers module."""
    from kopf import cli  # imported late: `--help` of a broken install still prints usage

    args = list(sys.argv[1:] if argv is None else argv)
    cli.main(args=kopf_argv(args), prog_name="gpuplan-operator")


if __name__ == "__main__":
    main()
