"""`gpuplan completion SHELL`: a shell completion script, generated from the parser itself
(shtab), so it knows every command and flag without a hand-kept list."""

from __future__ import annotations

import argparse
import sys
from typing import Any

SHELLS: tuple[str, ...] = ("bash", "zsh", "tcsh")


def register(sub: Any) -> None:
    """Add the `completion` subcommand."""
    p = sub.add_parser(
        "completion", help="print a shell completion script",
        description="Print a completion script for SHELL. bash: "
        "`gpuplan completion bash > ~/.local/share/bash-completion/completions/gpuplan`; "
        "zsh: `gpuplan completion zsh > \"${fpath[1]}/_gpuplan\"`.")
    p.add_argument("shell", choices=SHELLS, help="the shell to complete for")
    p.set_defaults(func=run_completion)


def run_completion(args: argparse.Namespace) -> int:
    """Print the completion script of the whole parser for `args.shell`."""
    import shtab

    from gpuplan_estimator.interfaces.cli import main  # the parser that main runs

    sys.stdout.write(shtab.complete(main.build_parser(plugins=True), shell=args.shell))
    return 0
