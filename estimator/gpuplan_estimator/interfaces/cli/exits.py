"""Exit codes of `gpuplan`, one per kind of failure, so scripts can tell them apart.

- 0: success
- 1: internal error, a bug of ours (run again with ``--debug`` and report the traceback)
- 2: usage or invalid input: a flag, a model file, a device name, a request field
- 3: infeasible: no GPU type and count satisfies the plan request, or the model fits none of
  the devices estimated
- 4: unavailable: the performance database (or another service the command needs) cannot be
  reached, or an optional package is not installed
- 5: incomplete: a budgeted run (`gpuplan bench --budget-minutes`) stopped at its budget before
  it finished; the same command resumes it
- 130: interrupted (Ctrl-C); 128 + N: stopped by signal N (`bench` after a clean stop)
"""

from __future__ import annotations

from gpuplan_estimator.core.errors import DatabaseError, GpuplanError
from gpuplan_estimator.core.exit_codes import ExitCode
from gpuplan_estimator.core.extras import MissingExtraError
from gpuplan_estimator.planning.planner import NoFeasiblePlanError


class InfeasibleError(GpuplanError):
    """The command ran, and its answer is that nothing fits (exit 3)."""


def for_error(exc: BaseException) -> ExitCode:
    """The exit code a failure maps to (see the table above)."""
    if isinstance(exc, KeyboardInterrupt):
        return ExitCode.INTERRUPTED
    if isinstance(exc, NoFeasiblePlanError | InfeasibleError):
        return ExitCode.INFEASIBLE
    if isinstance(exc, DatabaseError | MissingExtraError) or _is_unavailable(exc):
        return ExitCode.UNAVAILABLE
    if isinstance(exc, GpuplanError | OSError):
        return ExitCode.USAGE
    return ExitCode.INTERNAL


def _is_unavailable(exc: BaseException) -> bool:
    """Network failures reaching a service (connection refused, timeouts)."""
    return isinstance(exc, ConnectionError | TimeoutError)
