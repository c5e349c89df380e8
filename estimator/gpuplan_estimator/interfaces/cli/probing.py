"""`gpuplan bench`'s host probe (issue #30): before the kernels, the bench measures how fast
this node's CPU issues PyTorch work on the benchmarked device (`bench.host_probe`, seconds),
stores it in the performance database per node type (GPU key and CPU model) with the run, and
the export's sidecar carries it (`host_probes.SIDECAR_KEY`), so `gpuplan import` stores it too.
Estimates on that GPU type then price the host timeline with it (`perfdb.probe_context`).
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from gpuplan_estimator.bench import host_probe, targets
from gpuplan_estimator.core import errors, provenance
from gpuplan_estimator.step import host

if TYPE_CHECKING:  # `gpuplan estimate` imports this module: no SQLAlchemy at its start
    from gpuplan_estimator.perfdb.store import PerfStore

DEFAULT_OPS = host_probe.ProbeSettings("cpu").ops


def add_flags(bench: argparse.ArgumentParser) -> None:
    """`--no-host-probe` and `--host-probe-ops` on the bench parser."""
    bench.add_argument("--no-host-probe", dest="host_probe", action="store_false",
                       help="skip the host probe (how fast this node's CPU issues PyTorch "
                       "work; a few seconds, needs torch) that runs before the kernels with "
                       "--backend torch")
    bench.add_argument("--host-probe-ops", type=int, default=DEFAULT_OPS, metavar="N",
                       help="calls per timed loop of the host probe (default: %(default)s)")


PROBED_BACKENDS = frozenset({"torch"})
"""Backends whose benchmark runs the probe by default: it times PyTorch's host, and only the
torch backend's image is sure to have torch (onnxruntime images need not)."""


def measure(args: argparse.Namespace, command: str) -> dict[str, Any] | None:
    """The probe document on `args.device`; None with --no-host-probe or a backend other than
    torch (said on stderr). A clear error when torch is missing or the settings are out of
    range."""
    if not args.host_probe:
        return None
    if args.backend not in PROBED_BACKENDS:
        print(f"host probe: skipped (it times PyTorch's host; --backend {args.backend})",
              file=sys.stderr)
        return None
    targets.parse_device(args.device)  # a bad name is the bench's own error, not torch's
    try:
        settings = host_probe.ProbeSettings(args.device, ops=args.host_probe_ops)
    except ValueError as exc:
        raise errors.InvalidRequestError("host_probe_ops", str(exc)) from exc
    try:
        return host_probe.measure(settings, command=command,
                                  commit=provenance.code_commit(args.commit) or "")
    except ImportError as exc:
        raise errors.GpuplanError(f"the host probe needs torch (pip install 'gpuplan[torch]'), "
                                  f"or pass --no-host-probe: {exc}") from exc
    except (RuntimeError, AssertionError) as exc:  # torch's way to say the device is missing
        raise errors.GpuplanError(f"the host probe on {args.device} failed (pass "
                                  f"--no-host-probe to skip it): {exc}") from exc


def store(db: PerfStore, doc: dict[str, Any] | None, device: str, run_id: int) -> bool:
    """Store the probe of `device` (the catalog key) with benchmark run `run_id`; False when
    none was measured or the same one is stored already."""
    if doc is None:
        return False
    from gpuplan_estimator.perfdb import host_probes  # the bench's extra: pandas, SQLAlchemy

    return db.add_host_probe(host_probes.row_from_document(doc, device), run_id=run_id)


def add_db_flag(parser: argparse.ArgumentParser) -> None:
    """`--host-probes-db` on `gpuplan estimate` and `gpuplan plan`."""
    parser.add_argument("--host-probes-db", default=None, metavar="URL",
                        help="price each device's host with the newest host probe this "
                        "performance database holds for it (`gpuplan bench` stores them; "
                        "default: none read, the bundle's host model prices every device)")


def stored_probes(args: argparse.Namespace) -> dict[str, host.HostProbe]:
    """The probes of `--host-probes-db` per device key; {} without the flag."""
    if args.host_probes_db is None:
        return {}
    from gpuplan_estimator.perfdb import probe_context

    return probe_context.read_probes(args.host_probes_db)
