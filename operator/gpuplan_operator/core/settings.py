"""Operator settings: a dataclass with defaults, `from_env()` and `validate()`."""

from __future__ import annotations

import dataclasses
import ipaddress
import json
import os
import re
from collections.abc import Mapping
from urllib.parse import urlsplit

from gpuplan_operator.core import errors

ENV_PREFIX = "GPUPLAN_"
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
BENCHMARK_BACKENDS = ("torch", "onnxruntime")  # `gpuplan bench --backend`
# GPUPLAN_* variables other gpuplan programs own, which may share a process environment with the
# operator (the test runner and testbed, the estimator's database and prices); every other
# GPUPLAN_* name must be a setting, so a misspelt one fails instead of being ignored (#16).
OTHER_PROGRAMS_VARIABLES = frozenset({
    "GPUPLAN_DB_URL", "GPUPLAN_PRICES_JSON", "GPUPLAN_SHARED_DATA", "GPUPLAN_KUBECONFIG",
    "GPUPLAN_EXTENDER_PORT"})
OTHER_PROGRAMS_PREFIXES = ("GPUPLAN_TESTBED_",)
# Read by gpuplan-operator's command line before kopf starts (__main__.py), not by Settings,
# and by the handlers' start-up for the pods a namespaced operator lists.
NAMESPACES_ENV = "GPUPLAN_NAMESPACES"
ENTRYPOINT_VARIABLES = frozenset({NAMESPACES_ENV})


def env_namespaces(environ: Mapping[str, str]) -> list[str]:
    """Namespaces named by GPUPLAN_NAMESPACES (comma-separated, blanks dropped)."""
    return [ns.strip() for ns in environ.get(NAMESPACES_ENV, "").split(",") if ns.strip()]


@dataclasses.dataclass(frozen=True)
class Settings:
    """Operator settings: defaults here, `from_env()` reads GPUPLAN_*, `validate()` checks."""

    estimator_url: str = ""
    """Base URL of the estimator service, e.g. http://gpuplan-estimator:8080 (required)."""

    estimator_timeout_seconds: float = 30.0
    """Total time allowed for one `POST /v1/plans`."""

    outcome_report_seconds: float = 120.0
    """Total time for reporting one finished job's outcome (`POST /v1/outcomes`), retries of
    transient failures (429/502/503/504, timeouts, refused connections) included."""

    estimator_token_file: str = "/var/run/secrets/kubernetes.io/serviceaccount/token"
    """The operator's ServiceAccount token, sent as `Authorization: Bearer` with every outcome
    post (the estimator verifies it with a TokenReview, issue #16); re-read on each post, since
    the kubelet rotates projected tokens. Empty, or a missing file (outside a pod): no header,
    which only an estimator with `--write-auth none` accepts."""

    estimator_ca_file: str = ""
    """PEM CA bundle that an https `estimator_url`'s certificate must chain to (the chart mounts
    the estimator's ca.crt when `estimator.tls.enabled`); read again when it changes. Empty: the
    system's trust store."""

    scheduler_name: str = ""
    """schedulerName for launched pods (e.g. gpuplan-scheduler) that opted in
    (`scheduler_scope`); empty keeps the default one. A schedulerName the TrainingJob's
    template sets is always kept."""

    scheduler_scope: str = "opt-in"
    """Which pods get `scheduler_name`: "opt-in" only those of namespaces labelled
    `gpuplan.io/scheduler=enabled` or of TrainingJobs with `spec.scheduling.gpuplanScheduler:
    true` (others keep the default scheduler: node affinity alone places them), "all" every
    pod whose template names no scheduler."""

    gang_scheduling: str = "auto"
    """How a multi-node plan is admitted as a gang outside Kueue: "auto" through the PodGroup
    of the first of KAI Scheduler, Volcano or scheduler-plugins coscheduling whose API the
    cluster serves (found by API discovery), "off" never."""

    max_exec_time_margin: float = 0.0
    """Write the plan's P90 runtime x this margin as the Job's Kueue maximum execution time
    (label `kueue.x-k8s.io/max-exec-time-seconds`); 0 writes none. Kueue stops the Job past it,
    so keep it >= 1 (1.5: half again the P90)."""

    model_max_bytes: int = 32 * 1024 * 1024
    """Largest model file accepted from a ConfigMap or URL (bytes as stored, compressed or not)."""

    model_fetch_timeout_seconds: float = 30.0
    """Total time allowed for downloading a model URL."""

    model_fetches: int = 2
    """TrainingJob plans that may hold a model in memory at once (fetch, encode, post); the
    others wait holding nothing. Each holds ~4x its model (`core.throttling`), so with 64 MiB
    models two cost ~512 MiB of the chart's 1 GiB limit (issue #33)."""

    model_fetches_per_namespace: int = 4
    """Plans one namespace may have fetching or waiting at once; its other TrainingJobs are
    retried later (ModelFetchesBusy), so one tenant's thousand TrainingJobs wait in kopf's
    retries rather than ahead of every other tenant."""

    worker_limit: int = 64
    """kopf's `settings.batching.worker_limit`: objects handled at once (each a coroutine;
    unset, kopf starts one per object, so a flood of TrainingJobs is a flood of workers)."""

    leader_lease_name: str = ""
    """coordination.k8s.io Lease whose holder alone runs the benchmark and retraining loop
    (issue #33: every replica ran it); empty: this replica always runs it (one replica, a
    test). The chart sets <release>-operator."""

    leader_lease_namespace: str = ""
    """Namespace of the Lease (the chart: the release's, where the operator runs)."""

    leader_lease_seconds: float = 30.0
    """A Lease not renewed for this long is taken over by another replica; the holder renews
    three times per period."""

    model_url_block_private: bool = True
    """Refuse model URLs resolving to RFC 1918 / unique-local addresses (in-cluster services)."""

    model_url_allowed_networks: tuple[str, ...] = ()
    """CIDRs exempt from the URL guard (e.g. 127.0.0.1/32 in tests, an in-cluster model store)."""

    retry_base_delay_seconds: float = 5.0
    """First delay before re-asking an unavailable estimator; doubles per retry."""

    retry_max_delay_seconds: float = 300.0
    """Cap on the retry delay."""

    capacity_check_interval_seconds: float = 30.0
    """How often the GPU inventory is re-read for TrainingJobs at NoFeasiblePlan: when GPU
    types or node counts changed since their plan failed, they are re-planned. One node list
    per interval however many TrainingJobs wait."""

    finished_job_metrics_seconds: float = 3600.0
    """How long a finished job's per-job gauges (estimate, actual seconds) stay exported:
    several scrapes' worth, without keeping a label set for every job ever run."""

    master_port: int = 29500
    """torchrun rendezvous port for multi-node jobs."""

    metrics_port: int = 9090
    """Port of the /metrics endpoint; 0 disables it."""

    benchmarks_enabled: bool = False
    """Run benchmark Jobs for cluster GPU types whose data is missing or stale (DESIGN §1.7)."""

    benchmark_max_age_days: float = 30.0
    """Data older than this (newest finished run) counts as stale."""

    benchmark_image: str = ""
    """Image of the benchmark Job (runs `gpuplan bench --device cuda`); required when enabled."""

    benchmark_db_secret: str = ""
    """Secret (key `url`) with the performance database URL; required when enabled."""

    benchmark_namespace: str = ""
    """Namespace of the benchmark Jobs; required when enabled."""

    benchmark_interval_seconds: float = 3600.0
    """How often coverage is checked, the gauges refreshed and missing Jobs created."""

    benchmark_budget_minutes: int = 90
    """`gpuplan bench --budget-minutes`; the Job's activeDeadlineSeconds adds a margin to it."""

    benchmark_backend: str = "torch"
    """`gpuplan bench --backend` of the Jobs: torch (PyTorch eager forward+backward, what the
    training jobs run and the shipped GPU models are for) or onnxruntime."""

    benchmark_priority_class_name: str = ""
    """priorityClassName of the benchmark pods; empty leaves the cluster's default."""

    job_image_pull_secrets: tuple[str, ...] = ()
    """Names of the Secrets the benchmark and training Jobs' pods pull their images with (the
    chart passes its imagePullSecrets, so a private registry serves every pod it causes)."""

    benchmark_tolerations_json: str = "[]"
    """JSON list of pod tolerations for the benchmark pods (GPU pools are usually tainted)."""

    benchmark_node_selector_json: str = "{}"
    """JSON object of node labels the benchmark pods also select (beside the GPU product)."""

    benchmark_resources_json: str = "{}"
    """JSON object of container resources (requests/limits) of the benchmark pods; the one GPU
    limit is always added."""

    retraining_enabled: bool = False
    """Start a training Job (`gpuplan train --db --candidate --promote`) after a benchmark Job
    succeeded with new rows, or on `retraining_interval`; needs the benchmark database Secret,
    namespace and `retraining_image`."""

    retraining_interval: str = "0"
    """Scheduled retraining, a duration such as 24h, 7d or 1h30m; "0" schedules none (only new
    benchmark rows trigger it)."""

    retraining_image: str = ""
    """Image of the training Job: the estimator image (its entrypoint is `gpuplan`)."""

    retraining_max_rows: int = 60000
    """`gpuplan train --max-rows` of the training Job: per-kernel row cap (the shipped recipe's),
    bounding its minutes and memory."""

    retraining_resources_json: str = "{}"
    """JSON object of container resources (requests/limits) of the training Job."""

    def retraining_interval_seconds(self) -> float:
        """`retraining_interval` in seconds, 0 for none (call after `validate()`)."""
        return duration_seconds(self.retraining_interval)

    def retraining_resources(self) -> dict[str, dict[str, object]]:
        """`retraining_resources_json` decoded (call after `validate()`)."""
        value = json.loads(self.retraining_resources_json)
        assert isinstance(value, dict)
        return value

    def benchmark_tolerations(self) -> list[dict[str, object]]:
        """`benchmark_tolerations_json` decoded (call after `validate()`)."""
        value = json.loads(self.benchmark_tolerations_json)
        assert isinstance(value, list)
        return value

    def benchmark_node_selector(self) -> dict[str, str]:
        """`benchmark_node_selector_json` decoded (call after `validate()`)."""
        value = json.loads(self.benchmark_node_selector_json)
        assert isinstance(value, dict)
        return value

    def benchmark_resources(self) -> dict[str, dict[str, object]]:
        """`benchmark_resources_json` decoded (call after `validate()`)."""
        value = json.loads(self.benchmark_resources_json)
        assert isinstance(value, dict)
        return value

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """Read GPUPLAN_<FIELD> variables; an unknown GPUPLAN_* name raises SettingsError."""
        env = os.environ if environ is None else environ
        unknown = sorted(name for name in env if is_unknown_variable(name))
        if unknown:
            raise errors.SettingsError(
                f"unknown operator setting(s) {', '.join(unknown)}: known are "
                f"{', '.join(sorted(variable_names()))} (see gpuplan-operator --help)")
        values: dict[str, object] = {}
        for field in dataclasses.fields(cls):
            raw = env.get(ENV_PREFIX + field.name.upper())
            if raw is None:
                continue
            values[field.name] = _parse(field.name, field.type, raw)
        return cls(**values)  # type: ignore[arg-type]

    def validate(self) -> Settings:
        """Raise SettingsError naming every invalid field; return self when valid."""
        problems = list(_problems(self))
        if problems:
            raise errors.SettingsError("; ".join(problems))
        return self

    def retry_delay_seconds(self, retry: int) -> float:
        """Exponential backoff for the `retry`-th retry (0-based), capped."""
        exponent = min(max(retry, 0), 30)
        delay = self.retry_base_delay_seconds * (2**exponent)
        return float(min(delay, self.retry_max_delay_seconds))


def variable_names() -> frozenset[str]:
    """The GPUPLAN_* environment variable of every setting."""
    return frozenset(ENV_PREFIX + f.name.upper() for f in dataclasses.fields(Settings))


def is_unknown_variable(name: str) -> bool:
    """A GPUPLAN_* name that is neither a setting nor another gpuplan program's variable."""
    return (name.startswith(ENV_PREFIX) and name not in variable_names()
            and name not in ENTRYPOINT_VARIABLES and name not in OTHER_PROGRAMS_VARIABLES
            and not name.startswith(OTHER_PROGRAMS_PREFIXES))


_DURATION_PART = re.compile(r"(\d+)([smhd])")
_DURATION = re.compile(r"^(0|(\d+[smhd])+)$")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def duration_seconds(text: str) -> float:
    """Seconds of a duration such as 90s, 24h, 7d or 1h30m ("0" is 0); ValueError otherwise."""
    if not _DURATION.match(text):
        raise ValueError(f"need a duration such as 24h, 7d or 1h30m (or 0), got {text!r}")
    return float(sum(int(n) * _UNIT_SECONDS[unit] for n, unit in _DURATION_PART.findall(text)))


def _parse(name: str, type_name: object, raw: str) -> object:
    env_name = ENV_PREFIX + name.upper()
    try:
        if type_name == "bool":
            if raw.lower() not in {"true", "false", "1", "0", "yes", "no"}:
                raise ValueError(raw)
            return raw.lower() in {"true", "1", "yes"}
        if type_name == "int":
            return int(raw)
        if type_name == "float":
            return float(raw)
        if type_name == "tuple[str, ...]":
            return tuple(p.strip() for p in raw.split(",") if p.strip())
    except ValueError as exc:
        raise errors.SettingsError(f"{env_name}: cannot parse {raw!r} as {type_name}") from exc
    return raw


def _problems(s: Settings) -> list[str]:
    out: list[str] = []
    url = urlsplit(s.estimator_url)
    if url.scheme not in {"http", "https"} or not url.netloc:
        out.append(f"estimator_url: need an http(s) URL, got {s.estimator_url!r}")
    for name in ("estimator_timeout_seconds", "outcome_report_seconds",
                 "model_fetch_timeout_seconds",
                 "retry_base_delay_seconds", "retry_max_delay_seconds"):
        if not getattr(s, name) > 0:
            out.append(f"{name}: must be > 0, got {getattr(s, name)}")
    if not s.capacity_check_interval_seconds >= 1:
        out.append("capacity_check_interval_seconds: must be >= 1, "
                   f"got {s.capacity_check_interval_seconds}")
    if not s.finished_job_metrics_seconds >= 60:
        out.append("finished_job_metrics_seconds: must be >= 60 (a few scrapes), "
                   f"got {s.finished_job_metrics_seconds}")
    if s.retry_max_delay_seconds < s.retry_base_delay_seconds:
        out.append("retry_max_delay_seconds: must be >= retry_base_delay_seconds")
    if not 1 <= s.model_max_bytes <= 1024**3:
        out.append(f"model_max_bytes: must be in 1..1 GiB, got {s.model_max_bytes}")
    for name in ("model_fetches", "model_fetches_per_namespace", "worker_limit"):
        if not 1 <= getattr(s, name) <= 10_000:
            out.append(f"{name}: must be in 1..10000, got {getattr(s, name)}")
    if s.worker_limit <= s.model_fetches:
        out.append(f"worker_limit: must exceed model_fetches ({s.model_fetches}), so plans "
                   f"waiting for a fetch leave workers for Job events, got {s.worker_limit}")
    if s.leader_lease_name and not (DNS_SUBDOMAIN.match(s.leader_lease_name)
                                    and DNS_LABEL.match(s.leader_lease_namespace)):
        out.append("leader_lease_name/leader_lease_namespace: need a DNS name and the "
                   f"namespace it lives in, got {s.leader_lease_name!r} in "
                   f"{s.leader_lease_namespace!r}")
    if not 3 <= s.leader_lease_seconds <= 3600:
        out.append(f"leader_lease_seconds: must be in 3..3600, got {s.leader_lease_seconds}")
    if not 1 <= s.master_port <= 65535:
        out.append(f"master_port: must be in 1..65535, got {s.master_port}")
    if not 0 <= s.metrics_port <= 65535:
        out.append(f"metrics_port: must be in 0..65535, got {s.metrics_port}")
    out.extend(_benchmark_problems(s))
    out.extend(_retraining_problems(s))
    out.extend(_placement_problems(s))
    for secret in s.job_image_pull_secrets:
        if not DNS_SUBDOMAIN.match(secret):
            out.append(f"job_image_pull_secrets: {secret!r} is not a Secret name")
    for cidr in s.model_url_allowed_networks:
        try:
            ipaddress.ip_network(cidr, strict=False)
        except ValueError:
            out.append(f"model_url_allowed_networks: {cidr!r} is not a CIDR")
    return out


SCHEDULER_SCOPES = ("opt-in", "all")
GANG_SCHEDULING = ("auto", "off")


def _placement_problems(s: Settings) -> list[str]:
    out = []
    if s.scheduler_scope not in SCHEDULER_SCOPES:
        out.append(f"scheduler_scope: must be one of {', '.join(SCHEDULER_SCOPES)}, "
                   f"got {s.scheduler_scope!r}")
    if s.gang_scheduling not in GANG_SCHEDULING:
        out.append(f"gang_scheduling: must be one of {', '.join(GANG_SCHEDULING)}, "
                   f"got {s.gang_scheduling!r}")
    if not (s.max_exec_time_margin == 0 or 1 <= s.max_exec_time_margin <= 100):
        out.append("max_exec_time_margin: must be 0 (off) or in [1, 100], "
                   f"got {s.max_exec_time_margin}")
    return out


def _json_problems(s: Settings) -> list[str]:
    out: list[str] = []
    decoded: dict[str, object] = {}
    for name in ("benchmark_tolerations_json", "benchmark_node_selector_json",
                 "benchmark_resources_json"):
        try:
            decoded[name] = json.loads(getattr(s, name))
        except ValueError as exc:
            out.append(f"{name}: not JSON ({exc})")
    tolerations = decoded.get("benchmark_tolerations_json", [])
    if not (isinstance(tolerations, list) and all(isinstance(t, dict) for t in tolerations)):
        out.append("benchmark_tolerations_json: need a JSON list of toleration objects")
    selector = decoded.get("benchmark_node_selector_json", {})
    if not (isinstance(selector, dict) and all(isinstance(v, str) for v in selector.values())):
        out.append("benchmark_node_selector_json: need a JSON object of string labels")
    resources = decoded.get("benchmark_resources_json", {})
    if not (isinstance(resources, dict) and set(resources) <= {"requests", "limits"}
            and all(isinstance(v, dict) for v in resources.values())):
        out.append("benchmark_resources_json: need a JSON object with requests and/or limits")
    return out


def _resources_problem(name: str, raw: str) -> str | None:
    try:
        value = json.loads(raw)
    except ValueError as exc:
        return f"{name}: not JSON ({exc})"
    if not (isinstance(value, dict) and set(value) <= {"requests", "limits"}
            and all(isinstance(v, dict) for v in value.values())):
        return f"{name}: need a JSON object with requests and/or limits"
    return None


def _retraining_problems(s: Settings) -> list[str]:
    out: list[str] = []
    try:
        duration_seconds(s.retraining_interval)
    except ValueError as exc:
        out.append(f"retraining_interval: {exc}")
    if not 100 <= s.retraining_max_rows <= 10_000_000:  # `gpuplan train` refuses < 100
        out.append(f"retraining_max_rows: must be in 100..10000000, got {s.retraining_max_rows}")
    problem = _resources_problem("retraining_resources_json", s.retraining_resources_json)
    if problem is not None:
        out.append(problem)
    if not s.retraining_enabled:
        return out
    if not s.retraining_image or any(c.isspace() for c in s.retraining_image):
        out.append(f"retraining_image: need an image reference, got {s.retraining_image!r}")
    # The training Job reads the rows and stores its candidate in the benchmark database.
    if not DNS_SUBDOMAIN.match(s.benchmark_db_secret):
        out.append("retraining_enabled: needs benchmark_db_secret (the database Secret), "
                   f"got {s.benchmark_db_secret!r}")
    if not DNS_LABEL.match(s.benchmark_namespace):
        out.append("retraining_enabled: needs benchmark_namespace (where the Job runs), "
                   f"got {s.benchmark_namespace!r}")
    return out


def _benchmark_problems(s: Settings) -> list[str]:
    out: list[str] = []
    if not s.benchmark_max_age_days > 0:
        out.append(f"benchmark_max_age_days: must be > 0, got {s.benchmark_max_age_days}")
    if not s.benchmark_interval_seconds >= 1:
        out.append(f"benchmark_interval_seconds: must be >= 1, got {s.benchmark_interval_seconds}")
    if not 1 <= s.benchmark_budget_minutes <= 24 * 60:
        out.append("benchmark_budget_minutes: must be in 1..1440, "
                   f"got {s.benchmark_budget_minutes}")
    if s.benchmark_backend not in BENCHMARK_BACKENDS:
        out.append(f"benchmark_backend: need one of {', '.join(BENCHMARK_BACKENDS)}, "
                   f"got {s.benchmark_backend!r}")
    if s.benchmark_priority_class_name and not DNS_SUBDOMAIN.match(
            s.benchmark_priority_class_name):
        out.append("benchmark_priority_class_name: need a PriorityClass name, "
                   f"got {s.benchmark_priority_class_name!r}")
    out.extend(_json_problems(s))
    if not s.benchmarks_enabled:
        return out
    if not s.benchmark_image or any(c.isspace() for c in s.benchmark_image):
        out.append(f"benchmark_image: need an image reference, got {s.benchmark_image!r}")
    if not DNS_SUBDOMAIN.match(s.benchmark_db_secret):
        out.append(f"benchmark_db_secret: need a Secret name, got {s.benchmark_db_secret!r}")
    if not DNS_LABEL.match(s.benchmark_namespace):
        out.append(f"benchmark_namespace: need a namespace name, got {s.benchmark_namespace!r}")
    return out
