#!/usr/bin/env python3
"""Run README.md's marked examples and write their output back (`make docs`; `--check`: verify).

A marked block reads

    <!-- make docs: NAME lines=N -->
    ```
    $ command --with args \\
        --continued
    output lines...
    ```

Every `$ ` line (with its backslash continuations) is a command; the block's commands run in
order, with bash, in one fresh temporary directory (so a command that writes the example model
serves the next), `gpuplan` being this checkout's CLI. Their stdout replaces the block's output
lines, cut to the first N lines plus `…` when longer; the package's own path is shown as `…` so
the text does not depend on where gpuplan is installed. `--check` rewrites nothing and exits 1
naming each stale block (`make verify`).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
PACKAGE = REPO / "estimator" / "gpuplan_estimator"
MARK = re.compile(r"^<!-- make docs: (?P<name>[\w-]+) lines=(?P<lines>\d+) -->\n```\n"
                  r"(?P<body>.*?)^```$", re.M | re.S)
ELLIPSIS = "…"


@dataclasses.dataclass(frozen=True)
class Example:
    """One marked block: its commands (continuations kept) and how many output lines it shows."""

    name: str
    commands: tuple[str, ...]
    lines: int
    start: int  # offsets of the block's body in the document
    end: int


def examples(text: str) -> list[Example]:
    """The marked blocks of `text`, in order."""
    found = []
    for match in MARK.finditer(text):
        commands: list[str] = []
        body = match.group("body").splitlines()
        for i, line in enumerate(body):
            if line.startswith("$ ") and (i == 0 or not body[i - 1].endswith("\\")):
                commands.append(line)
            elif commands and commands[-1].endswith("\\"):
                commands[-1] += "\n" + line
        found.append(Example(match.group("name"), tuple(commands), int(match.group("lines")),
                             match.start("body"), match.end("body")))
    return found


def body(example: Example, output: str) -> str:
    """The block's new body: its commands, then `output` cut to its line count."""
    shown = output.rstrip("\n").splitlines()
    if len(shown) > example.lines:
        shown = [*shown[:example.lines], ELLIPSIS]
    return "".join(f"{line}\n" for line in [*example.commands, *shown])


def run_commands(commands: Sequence[str]) -> str:
    """Run `commands` with bash in a fresh directory; their stdout, the package path as `…`."""
    script = "set -eo pipefail\n" + "\n".join(c.removeprefix("$ ") for c in commands)
    with tempfile.TemporaryDirectory() as cwd:
        shim = Path(cwd, ".bin")  # `gpuplan` and `python` are this checkout's, wherever typed
        shim.mkdir()
        python = shlex.quote(sys.executable)
        for name, line in (("gpuplan", f"{python} -m gpuplan_estimator.interfaces.cli"),
                           ("python", python)):
            (shim / name).write_text(f'#!/bin/sh\nexec {line} "$@"\n')
            (shim / name).chmod(0o755)
        env = dict(os.environ, PATH=f"{shim}{os.pathsep}{os.environ['PATH']}",
                   PYTHONPATH=os.pathsep.join([str(REPO / "estimator"),
                                               os.environ.get("PYTHONPATH", "")]))
        done = subprocess.run(["bash", "-c", script], cwd=cwd, env=env, capture_output=True,
                              text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"{commands[-1]!r} failed ({done.returncode}):\n{done.stderr}")
    return done.stdout.replace(str(PACKAGE), ELLIPSIS)


def rewrite(text: str, run: Callable[[Sequence[str]], str]) -> tuple[str, list[str]]:
    """`text` with every marked block's output regenerated, and the names of those that changed."""
    changed, pieces, at = [], [], 0
    for example in examples(text):
        new = body(example, run(example.commands))
        if new != text[example.start:example.end]:
            changed.append(example.name)
        pieces += [text[at:example.start], new]
        at = example.end
    return "".join([*pieces, text[at:]]), changed


def main(argv: Sequence[str] | None = None) -> int:
    """Rewrite README.md's examples, or with --check report the stale ones (exit 1)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when a block is stale")
    parser.add_argument("--file", type=Path, default=README)
    args = parser.parse_args(argv)
    text = args.file.read_text()
    new, changed = rewrite(text, run_commands)
    if args.check:
        for name in changed:
            print(f"{args.file.name}: example {name!r} is stale: run `make docs`", file=sys.stderr)
        return 1 if changed else 0
    args.file.write_text(new)
    print(f"{args.file.name}: {len(changed)} example(s) rewritten: {', '.join(changed) or '-'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
