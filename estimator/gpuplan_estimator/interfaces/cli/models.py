"""`gpuplan models list|show|add|activate`: the model bundles stored in the performance
database (issue #17). The estimator service serves the active one and reloads within its
bundle poll; activating an older version is the rollback."""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from gpuplan_estimator.core import errors
from gpuplan_estimator.interfaces.cli import arguments, output
from gpuplan_estimator.perfdb import PerfStore
from gpuplan_estimator.perfdb.store import StoredBundle

MAX_VERSION = 2**31 - 1
"""Versions are the database's INTEGER keys."""
LIST_COLUMNS = (
    output.Column("VERSION", numeric=True), output.Column("STATE"),
    output.Column("CREATED"), output.Column("ROWS", numeric=True), output.Column("COMMIT"),
    output.Column("SIZE MB", numeric=True), output.Column("REASON"),
    output.Column("DATA DIGEST", wide_only=True), output.Column("SHA256", wide_only=True),
)


def register(sub: Any) -> None:
    """Add the ``models`` subcommand and its ``list``, ``show``, ``add`` and ``activate``."""
    m = sub.add_parser("models", help="model bundles stored in the performance database",
                       description="List, inspect, store and activate the model bundles of the "
                       "performance database. The estimator service serves the active one "
                       "(reloading within its --bundle-poll); `activate` of an older version "
                       "is the rollback.")
    actions = m.add_subparsers(dest="models_action", metavar="ACTION", required=True)

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--db", default=None, metavar="URL",
                       help="database URL (default as for bench)")
        output.add_output_argument(p)

    ls = actions.add_parser("list", help="every stored bundle, oldest first")
    common(ls)
    ls.set_defaults(func=run_list)

    show = actions.add_parser("show", help="one bundle's provenance, state and metrics")
    show.add_argument("version", type=arguments.count_up_to(MAX_VERSION), metavar="VERSION",
                      help="bundle version (gpuplan models list)")
    common(show)
    show.set_defaults(func=run_show)

    add = actions.add_parser("add", help="store a bundle directory as a new version")
    add.add_argument("directory", metavar="DIR", help="bundle directory (gpuplan train --out)")
    add.add_argument("--activate", action="store_true",
                     help="make it the active bundle at once (the active one is retired)")
    add.add_argument("--reason", default="", help="why, stored with the bundle")
    common(add)
    add.set_defaults(func=run_add)

    act = actions.add_parser("activate", help="make VERSION the active bundle (rollback: an "
                             "older version)")
    act.add_argument("version", type=arguments.count_up_to(MAX_VERSION), metavar="VERSION",
                     help="bundle version to serve (gpuplan models list)")
    act.add_argument("--reason", default="", help="why, stored with the activation")
    common(act)
    act.set_defaults(func=run_activate)


def bundle_row(b: StoredBundle) -> list[str]:
    """One bundle as a table row (`LIST_COLUMNS`)."""
    return [str(b.version), b.state, b.created_at.strftime("%Y-%m-%d %H:%M:%S"),
            "" if b.rows is None else str(b.rows), b.git_commit,
            f"{b.size_bytes / 1e6:.1f}", b.reason, b.data_digest, b.bundle_sha256[:16]]


def metric_summary(metrics: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """(kernel, random-split MAPE %, leave-one-device-out MAPE %) per kernel, as text."""
    def mape(entry: Any) -> str:
        value = entry.get("mape_pct") if isinstance(entry, Mapping) else None
        return f"{value:.1f}" if isinstance(value, int | float) else "-"

    return [(str(k), mape(v.get("random_split")), mape(v.get("leave_one_device_out")))
            for k, v in sorted(metrics.items()) if isinstance(v, Mapping)]


def _emit_bundles(args: argparse.Namespace, kind: str, found: Sequence[StoredBundle]) -> None:
    if output.is_document(args.output):
        output.emit_document(output.document(kind, {
            "bundles": [{k: v for k, v in b.as_dict().items() if k != "metrics"}
                        for b in found]}), args.output)
        return
    output.render_table(LIST_COLUMNS, [bundle_row(b) for b in found],
                        wide=args.output == "wide")


def run_list(args: argparse.Namespace) -> int:
    """`gpuplan models list`; returns 0."""
    with PerfStore.open(args.db) as store:
        found = store.bundles()
    if not found and not output.is_document(args.output):
        print(f"no model bundles in {store.url}; store one with `gpuplan models add DIR`")
        return 0
    _emit_bundles(args, "ModelBundleList", found)
    return 0


def run_show(args: argparse.Namespace) -> int:
    """`gpuplan models show VERSION`; returns 0 (an unknown version is an error naming it)."""
    with PerfStore.open(args.db) as store:
        info, _ = store.bundle(args.version)
    if output.is_document(args.output):
        output.emit_document(output.document("ModelBundle", info.as_dict()), args.output)
        return 0
    output.print_lines([
        f"version:      {info.version}", f"state:        {info.state}",
        f"reason:       {info.reason}", f"created:      {info.created_at.isoformat()}",
        f"state since:  {info.state_changed_at.isoformat()}",
        f"rows:         {'' if info.rows is None else info.rows}",
        f"commit:       {info.git_commit}", f"data digest:  {info.data_digest}",
        f"size:         {info.size_bytes} bytes", f"sha256:       {info.bundle_sha256}", ""])
    output.render_table(
        (output.Column("KERNEL"), output.Column("RANDOM-SPLIT MAPE %", numeric=True),
         output.Column("LEAVE-ONE-GPU-OUT MAPE %", numeric=True)),
        [list(r) for r in metric_summary(info.metrics)], wide=args.output == "wide")
    return 0


def run_add(args: argparse.Namespace) -> int:
    """`gpuplan models add DIR [--activate]`; returns 0."""
    directory = Path(args.directory)
    if not directory.is_dir():
        raise errors.InvalidRequestError("DIR", f"{directory} is not a directory")
    with PerfStore.open(args.db) as store:
        version = store.add_bundle(directory, state="active" if args.activate else "candidate",
                                   reason=args.reason)
        info, _ = store.bundle(version)
    _emit_bundles(args, "ModelBundleList", [info])
    return 0


def run_activate(args: argparse.Namespace) -> int:
    """`gpuplan models activate VERSION`; returns 0 (an unknown version is an error)."""
    with PerfStore.open(args.db) as store:
        store.activate(args.version, args.reason)
        found = store.bundles()
    _emit_bundles(args, "ModelBundleList", [b for b in found if b.state == "active"])
    if not output.is_document(args.output):
        output.note(args.output, "estimator services with this database serve it within "
                    "their bundle poll (gpuplan serve --bundle-poll)")
    return 0
