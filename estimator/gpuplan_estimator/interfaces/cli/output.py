"""How commands print results: ``-o table|wide|json|yaml``, versioned documents, tables.

Machine-readable output is a document ``{"schema_version": 1, "kind": ..., ...}`` in JSON or
YAML, the same for every command. Tables are rich tables in kubectl's style (no box, a header
row): as wide as the terminal allows, no colour unless stdout is a terminal (and ``NO_COLOR``
unset), and never truncated when piped.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import IO, Any

from gpuplan_estimator.interfaces import json_documents

FORMATS: tuple[str, ...] = ("table", "wide", "json", "yaml")
DEFAULT_FORMAT = "table"
SCHEMA_VERSION = json_documents.SCHEMA_VERSION
"""Version of every JSON/YAML document the CLI prints (the service's estimate and plan
answers carry the same); bumped when a field changes meaning or goes away (new fields do not
bump it)."""
PIPE_WIDTH_CHARS = 1000
"""Table width when stdout is not a terminal: wide enough that nothing is cut for a script."""


def add_output_argument(parser: argparse.ArgumentParser) -> None:
    """``-o/--output`` with the four formats, and ``--json`` kept as its short form."""
    parser.add_argument("-o", "--output", choices=FORMATS, default=DEFAULT_FORMAT,
                        help="table (default), wide (more columns), json or yaml (documents "
                        f"with schema_version {SCHEMA_VERSION})")
    parser.add_argument("--json", action="store_const", const="json", dest="output",
                        help="same as -o json")


def is_document(fmt: str) -> bool:
    """Whether `fmt` prints a document (json, yaml) rather than a table."""
    return fmt in ("json", "yaml")


def document(kind: str, body: Mapping[str, Any]) -> dict[str, Any]:
    """`body` as a versioned document of `kind` (e.g. ``Estimate``, ``Plan``)."""
    return {"schema_version": SCHEMA_VERSION, "kind": kind, **body}


def emit_document(doc: Mapping[str, Any], fmt: str, stream: IO[str] | None = None) -> None:
    """Print `doc` as JSON (indented) or YAML (block style, keys in order)."""
    out = stream or sys.stdout
    if fmt == "json":
        out.write(json.dumps(doc, indent=2) + "\n")
    elif fmt == "yaml":
        import yaml

        out.write(yaml.safe_dump(_plain(doc), sort_keys=False, allow_unicode=True))
    else:
        raise ValueError(f"not a document format: {fmt!r}")


def _plain(value: Any) -> Any:
    """Tuples to lists, so YAML prints plain sequences (no Python tags)."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


@dataclass(frozen=True)
class Column:
    """A table column: its header, right-aligned when numeric, shown only in `wide` when
    `wide_only`."""

    header: str
    numeric: bool = False
    wide_only: bool = False


def console(stream: IO[str] | None = None) -> Any:
    """A rich console on `stream` (stdout): terminal width and colour on a TTY, plain and
    unbounded when piped."""
    from rich.console import Console

    out = stream or sys.stdout
    tty = out.isatty()
    return Console(file=out, width=None if tty else PIPE_WIDTH_CHARS, soft_wrap=not tty,
                   highlight=False, emoji=False)


def render_table(columns: Sequence[Column], rows: Sequence[Sequence[str]], *, wide: bool,
                 marked_row: int | None = None, stream: IO[str] | None = None) -> None:
    """Print `rows` under `columns` (the wide-only ones only when `wide`); `marked_row` is
    printed bold (the recommendation), which stays visible without colour through its text."""
    from rich.table import Table

    shown = [i for i, c in enumerate(columns) if wide or not c.wide_only]
    table = Table(box=None, show_edge=False, pad_edge=False,
                  header_style="bold", show_header=True)
    for i in shown:
        table.add_column(columns[i].header, justify="right" if columns[i].numeric else "left",
                         no_wrap=True, overflow="ellipsis" if not columns[i].numeric else "fold")
    for n, row in enumerate(rows):
        table.add_row(*(row[i] for i in shown), style="bold" if n == marked_row else None)
    out = stream or sys.stdout
    if out.isatty():
        console(out).print(table)
        return
    buffer = io.StringIO()  # piped: no colour, no padding after the last column
    console(buffer).print(table)
    out.writelines(line.rstrip() + "\n" for line in buffer.getvalue().splitlines())


def note(args_output: str, message: str) -> None:
    """A side remark (``wrote FILE``): on stdout under a table, on stderr when stdout carries a
    document, so `-o json` output always parses."""
    print(message, file=sys.stderr if is_document(args_output) else sys.stdout)


def warn(warnings: Sequence[str]) -> None:
    """A document's `warnings` on stderr, whatever the output format (the figures stand)."""
    for message in warnings:
        print(f"gpuplan: warning: {message}", file=sys.stderr)


def print_lines(lines: Sequence[str], stream: IO[str] | None = None) -> None:
    """Plain lines around a table (headers, notes): written as they are, no markup."""
    out = stream or sys.stdout
    for line in lines:
        out.write(line + "\n")
