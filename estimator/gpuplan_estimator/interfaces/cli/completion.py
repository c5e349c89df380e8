"""`gpuplan completion SHELL`: a shell completion script, generated from the parser itself
(shtab), so it knows every command and flag without a hand-kept list."""

from __future__ import annotations

import argparse
import functools
import sys
from collections.abc import Callable
from typing import Any

from gpuplan_estimator import devices

SHELLS: tuple[str, ...] = ("bash", "zsh", "tcsh")


def register(sub: Any, whole_parser: Callable[[], argparse.ArgumentParser]) -> None:
    """Add the `completion` subcommand; `whole_parser` builds the parser it completes."""
    p = sub.add_parser(
        "completion", help="print a shell completion script",
        description="Print a completion script for SHELL. bash: "
        "`gpuplan completion bash > ~/.local/share/bash-completion/completions/gpuplan`; "
        "zsh: `gpuplan completion zsh > \"${fpath[1]}/_gpuplan\"`.")
    p.add_argument("shell", choices=SHELLS, help="the shell to complete for")
    p.set_defaults(func=functools.partial(run_completion, whole_parser))


def run_completion(whole_parser: Callable[[], argparse.ArgumentParser],
                   args: argparse.Namespace) -> int:
    """Print the completion script of the whole parser for `args.shell`."""
    import shtab

    parser = whole_parser()
    names = " ".join(d.key for d in devices.load_catalog().devices)
    for action in device_actions(parser):  # completed from the catalog as it is now
        action.complete = shtab.cmd(f"echo {names}")  # type: ignore[attr-defined]
    sys.stdout.write(shtab.complete(parser, shell=args.shell))
    return 0


def device_actions(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """Every `--device` taking catalog GPU names (repeatable), in every subcommand."""
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in dict.fromkeys(action.choices.values()):
                found += device_actions(sub)
        elif "--device" in action.option_strings and isinstance(action, argparse._AppendAction):
            found.append(action)
    return found
