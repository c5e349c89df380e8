"""Domain errors of the operator; handlers map them to conditions and kopf errors."""

from __future__ import annotations

from collections.abc import Sequence


class OperatorError(Exception):
    """Base of the operator's domain errors; `reason` is the condition reason it maps to."""

    reason = "Error"


class InvalidSpecError(OperatorError):
    """The TrainingJob spec is invalid; `errors` lists every problem with its field path."""

    reason = "InvalidSpec"

    def __init__(self, errors: Sequence[str]) -> None:
        self.errors = tuple(errors)
        super().__init__("; ".join(self.errors))


class InvalidModelSourceError(OperatorError):
    """The model cannot be fetched or is not an acceptable model file."""

    reason = "InvalidModel"


class ModelSourceUnavailableError(OperatorError):
    """The model source is temporarily unreachable (retry later)."""

    reason = "ModelSourceUnavailable"


class ModelFetchesBusyError(ModelSourceUnavailableError):
    """The TrainingJob's namespace already has its share of model fetches running or waiting
    (`core.throttling`): retried later, without a condition written for every retry."""

    reason = "ModelFetchesBusy"


class BlockedUrlError(InvalidModelSourceError):
    """The model URL points at a refused scheme or address."""


class EstimatorRejectedError(OperatorError):
    """The estimator answered 422; `reason` is its InvalidModel/NoFeasiblePlan/InvalidRequest."""

    def __init__(self, reason: str, message: str, details: Sequence[object] = ()) -> None:
        self.reason = reason
        self.details = tuple(details)
        super().__init__(message)


class EstimatorUnavailableError(OperatorError):
    """The estimator timed out, refused the connection or answered 5xx."""

    reason = "EstimatorUnavailable"


class EstimatorProtocolError(OperatorError):
    """The estimator answered with a body that does not follow the contract."""

    reason = "EstimatorProtocolError"


class SettingsError(OperatorError):
    """Operator settings are invalid; the message names every bad field."""

    reason = "InvalidSettings"


class JobNameConflictError(OperatorError):
    """A Job with the TrainingJob's deterministic name exists but is not owned by it.

    Retry later: it may be the Job of a deleted TrainingJob of the same name, not yet
    garbage-collected.
    """

    reason = "JobNameConflict"


class JobRejectedError(OperatorError):
    """The API server refused to create the Job or Service (a 4xx other than a conflict).

    Retrying the same object gets the same answer (an invalid template, a forbidden field), so
    it is not retried; a spec change re-plans and tries again.
    """

    reason = "JobRejected"

    def __init__(self, status: int, message: str) -> None:
        self.status = status
        super().__init__(message)


class QuotaExceededError(OperatorError):
    """The API server refused the Job or Service under a ResourceQuota (403 "exceeded quota").

    Unlike other refusals this one ends when quota frees up or is raised: tried again at the
    capacity check interval.
    """

    reason = "QuotaExceeded"


class ServiceAccountNotFoundError(OperatorError):
    """The service account named in `spec.template` does not exist in the namespace (yet).

    Retried with backoff: it is often applied in the same file, after the TrainingJob.
    """

    reason = "ServiceAccountNotFound"


class KubeApiUnavailableError(OperatorError):
    """The Kubernetes API timed out, refused the connection, throttled (429) or answered 5xx."""

    reason = "KubernetesApiUnavailable"


class AwaitingCapacityError(OperatorError):
    """No plan was feasible and the cluster's GPU capacity has not changed since: check again
    later, without asking the estimator (the condition still says NoFeasiblePlan)."""

    reason = "NoFeasiblePlan"


class QueueNotFoundError(OperatorError):
    """The Kueue LocalQueue a TrainingJob names, or its ClusterQueue, does not exist (yet), or
    Kueue is not installed. Retried with backoff: queues are often created after the jobs."""

    reason = "QueueNotFound"


class NoQueueQuotaError(OperatorError):
    """The named queue's ClusterQueue has no GPU quota for any GPU type of the cluster: no plan
    is feasible within it (re-checked at the capacity check interval, as quotas change)."""

    reason = "NoFeasiblePlan"
