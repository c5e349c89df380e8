"""Which domain errors kopf retries, how soon, and which end the handler."""

from __future__ import annotations

import kopf
import pytest
from prometheus_client import CollectorRegistry

from gpuplan_operator import handlers, metrics, modelsource, reconcile
from gpuplan_operator.core import errors, settings

CTX = reconcile.Context(
    kube=None,  # type: ignore[arg-type]
    settings=settings.Settings(retry_base_delay_seconds=5, retry_max_delay_seconds=300,
                               capacity_check_interval_seconds=30),
    metrics=metrics.OperatorMetrics(CollectorRegistry()), clock=lambda: None,  # type: ignore[arg-type,return-value]
    guard=modelsource.UrlGuard())


@pytest.mark.parametrize("exc", [
    errors.JobRejectedError(422, "invalid"), errors.InvalidModelSourceError("bad gzip"),
    errors.BlockedUrlError("loopback"), errors.InvalidSpecError(["spec.x: bad"]),
    errors.EstimatorRejectedError("InvalidModel", "not onnx")])
def test_permanent(exc: errors.OperatorError) -> None:
    out = handlers._kopf_error(CTX, exc, retry=0)
    assert isinstance(out, kopf.PermanentError) and exc.reason in str(out)


@pytest.mark.parametrize("exc", [
    errors.KubeApiUnavailableError("503"), errors.ServiceAccountNotFoundError("sa"),
    errors.ModelSourceUnavailableError("timeout"), errors.EstimatorUnavailableError("down"),
    errors.JobNameConflictError("old job")])
def test_temporary_with_backoff(exc: errors.OperatorError) -> None:
    first, later = (handlers._kopf_error(CTX, exc, retry=r) for r in (0, 10))
    assert isinstance(first, kopf.TemporaryError) and isinstance(later, kopf.TemporaryError)
    assert (first.delay, later.delay) == (5, 300)


@pytest.mark.parametrize("exc", [
    errors.EstimatorRejectedError("NoFeasiblePlan", "nothing fits"),
    errors.AwaitingCapacityError("unchanged"), errors.QuotaExceededError("exceeded quota")])
def test_no_feasible_plan_is_checked_again_at_the_capacity_interval(
        exc: errors.OperatorError) -> None:
    out = handlers._kopf_error(CTX, exc, retry=7)
    assert isinstance(out, kopf.TemporaryError) and out.delay == 30

