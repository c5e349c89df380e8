"""List the longest functions (by source lines, nested ones counted on their own too).

    .venv/bin/python hack/longest_functions.py [--top 10] DIR...

A function's length is `end_lineno - lineno + 1` of its `def` node (decorators excluded), so a
closure's lines count both for itself and for the function that encloses it: the figure a reader
scrolls through. Used for issue #31's before/after table.
"""

from __future__ import annotations

import argparse
import ast
import pathlib


def function_lengths(root: pathlib.Path) -> list[tuple[int, str]]:
    """(lines, "path:line name") for every def and async def under `root`."""
    found = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                found.append((lines, f"{path}:{node.lineno} {node.name}"))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--top", type=int, default=10)
    parser.add_argument("dirs", nargs="+", type=pathlib.Path)
    args = parser.parse_args()
    for root in args.dirs:
        print(f"# {root}")
        for lines, where in sorted(function_lengths(root), reverse=True)[: args.top]:
            print(f"{lines:5d}  {where}")


if __name__ == "__main__":
    main()
