"""`gpuplan models list|show|add|activate|promote`: the model bundles stored in the performance
database (issue #17). The estimator service serves the active one and reloads within its
bundle poll; activating an older version is the rollback; `promote` activates a candidate only
when the promotion gate (`training.gating`) finds it no worse than the active one."""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from gpuplan_estimator.core import errors
from gpuplan_estimator.core.exit_codes import ExitCode
from gpuplan_estimator.interfaces.cli import arguments, output
from gpuplan_estimator.perfdb import PerfStore
from gpuplan_estimator.perfdb.store import MAX_REASON_CHARS, StoredBundle
from gpuplan_estimator.training import gating, outcome_scoring

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

    promote = actions.add_parser(
        "promote", help="activate VERSION only if the promotion gate passes (exit 3: refused)",
        description="Compare candidate VERSION with the active bundle (random-split and "
        "leave-one-GPU-out held-out MAPE per kernel, from their manifests; job-outcome MAPE of "
        "both bundles' re-estimates of the newest 200 finished jobs with a stored plan "
        "workload) and activate it "
        "only if it is no worse on every measure. Exit 0: promoted; 3: refused, the reason "
        "names the failing measure.")
    promote.add_argument("version", type=arguments.count_up_to(MAX_VERSION), metavar="VERSION",
                         help="candidate bundle version (gpuplan models list)")
    promote.add_argument("--force", action="store_true",
                         help="activate without running the gate")
    common(promote)
    promote.set_defaults(func=run_promote)


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


def gate(store: PerfStore, version: int) -> gating.Decision:
    """The promotion gate's decision for candidate `version` against the active bundle: the
    manifests' held-out metrics, and the newest finished jobs with a stored plan workload
    re-estimated by both bundles (`training.outcome_scoring`)."""
    from gpuplan_estimator.latency import bundles  # LightGBM-free, but only promote needs it

    _, data = store.bundle(version)
    candidate = bundles.packed_manifest(data)
    active = store.active_bundle()
    if active is not None and active[0] == version:
        return gating.Decision(False, f"version {version} is already the active bundle", ())
    if active is None:
        return gating.decide(candidate, None)
    scored = outcome_scoring.from_store(store, data, active[1])
    return gating.decide(candidate, bundles.packed_manifest(active[1]), outcomes=scored.scores,
                         outcomes_skipped=scored.skipped)


def promote(store: PerfStore, version: int, *, force: bool) -> tuple[gating.Decision, bool]:
    """Run the gate (unless `force`) and activate `version` on a pass; (decision, activated).

    The activation stores the gate's reason; a refused candidate stays a candidate and its
    reason becomes the refusal, so `gpuplan models list|show` say why (the active bundle's own
    reason is left alone when it is the one "promoted" again).
    """
    decision = (gating.Decision(True, "forced: the gate was skipped", ()) if force
                else gate(store, version))
    # The skipped measures go with the reason, so `gpuplan models show` says what was not
    # compared (e.g. no finished job with a stored workload yet).
    skipped = "".join(f"; skipped {line}" for line in decision.skipped)
    reason = f"promotion gate: {decision.reason}{skipped}"[:MAX_REASON_CHARS]
    if decision.promote:
        store.activate(version, reason)
    elif store.active_version() != version:
        store.set_bundle_reason(version, f"refused by the {reason}"[:MAX_REASON_CHARS])
    return decision, decision.promote


def emit_decision(args: argparse.Namespace, version: int, decision: gating.Decision) -> None:
    """Print the gate's decision (a table of checks, or a GateDecision document)."""
    if output.is_document(args.output):
        output.emit_document(output.document("GateDecision", {
            "version": version, **decision.as_dict()}), args.output)
        return
    verdict = "promoted" if decision.promote else "refused"
    output.print_lines([f"version {version}: {verdict}: {decision.reason}"])
    if decision.checks:
        output.render_table(
            (output.Column("MEASURE"), output.Column("SCOPE"),
             output.Column("CANDIDATE %", numeric=True), output.Column("ACTIVE %", numeric=True),
             output.Column("OK")),
            [[c.measure, c.scope, "-" if c.candidate_pct is None else f"{c.candidate_pct:.2f}",
              f"{c.active_pct:.2f}", "yes" if c.passed else "NO"] for c in decision.checks],
            wide=args.output == "wide")
    for line in decision.skipped:
        output.print_lines([f"skipped: {line}"])


def run_promote(args: argparse.Namespace) -> int:
    """`gpuplan models promote VERSION [--force]`; 0 promoted, 3 refused."""
    with PerfStore.open(args.db) as store:
        decision, promoted = promote(store, args.version, force=args.force)
    emit_decision(args, args.version, decision)
    return int(ExitCode.OK if promoted else ExitCode.INFEASIBLE)
