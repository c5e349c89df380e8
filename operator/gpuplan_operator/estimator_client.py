"""HTTP client of the estimator service's `POST /v1/plans`, with a timeout and typed errors."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
import logging
import math
import re
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any

import aiohttp

from gpuplan_estimator.core import streams
from gpuplan_estimator.core.paths import FileStamp, file_stamp
from gpuplan_estimator.core.vocabulary import SEQUENCE_DIM, WORKLOAD_ID_PATTERN
from gpuplan_operator.core import benchmarks, errors, gpu_pools, resources
from gpuplan_operator.core.validation import ATTENTIONS

COVERAGE_PATH = "/v1/coverage"
OUTCOMES_PATH = "/v1/outcomes"
PLANS_PATH = "/v1/plans"
LOG = logging.getLogger(__name__)
CLIENT_HEADER = "X-Gpuplan-Client"
"""The estimator's per-client share key (`interfaces/http/admission.py`)."""
MAX_RESPONSE_BYTES = 8 * 1024 * 1024


_CA_CONTEXTS: dict[str, tuple[FileStamp, ssl.SSLContext]] = {}
"""Per CA file: the (mtime_ns, size, inode) it was read at and the context built from it."""


def server_check(ca_file: str) -> ssl.SSLContext | bool:
    """How an https estimator's certificate is checked (aiohttp's `ssl=`): against the CA in
    `ca_file` (`settings.estimator_ca_file`), else the system's trust store (True). Never
    unchecked. An http URL ignores it. The file is read again only when its (mtime, size,
    inode) changed, so a rotated CA is picked up without building a context per request."""
    if not ca_file:
        return True
    try:
        stamp = file_stamp(ca_file)
        cached = _CA_CONTEXTS.get(ca_file)
        if cached is not None and cached[0] == stamp:
            return cached[1]
        context = ssl.create_default_context(cafile=ca_file)
    except (OSError, ssl.SSLError) as exc:
        raise errors.EstimatorUnavailableError(
            f"cannot load the estimator's CA {ca_file}: {exc}") from exc
    _CA_CONTEXTS[ca_file] = (stamp, context)
    return context


def build_request(
    spec: resources.TrainingJobSpec, model_bytes: bytes, pools: Sequence[gpu_pools.ClusterGpuPool]
) -> dict[str, Any]:
    """The JSON body of `POST /v1/plans` (pure)."""
    t, o = spec.training, spec.objective
    objective: dict[str, Any] = {"prefer": o.prefer, "max_gpus": o.max_gpus}
    if o.deadline_seconds is not None:
        objective["deadline_seconds"] = o.deadline_seconds
    if o.budget_usd is not None:
        objective["budget_usd"] = o.budget_usd
    dims = dict(t.dims)
    if t.sequence_length is not None:
        # The estimator binds symbolic dims by name; `sequence` is its name for the sequence dim.
        dims.setdefault(SEQUENCE_DIM, t.sequence_length)
    training: dict[str, Any] = {
        "batch_size": t.batch_size, "dataset_size": t.dataset_size, "epochs": t.epochs,
        "optimizer": t.optimizer, "optimizer_impl": t.optimizer_impl, "precision": t.precision,
        "attention": t.attention, "dims": dims,
    }
    model: dict[str, Any] = (
        {"model_hf_config": json.loads(model_bytes)} if spec.model.hf_config
        else {"model_onnx_b64": base64.b64encode(model_bytes).decode()})
    pinned = {"layout": dict(spec.layout)} if spec.layout is not None else {}
    return {
        **model,
        "training": training,
        "objective": objective,
        "inventory": [p.to_request() for p in pools],
        "gpu_types": list(spec.gpu_types),
        **pinned,
    }


def parse_plan(body: Mapping[str, Any], *, generation: int) -> resources.StatusPlan:
    """The `plan` of a 200 response; EstimatorProtocolError names the first missing field."""
    try:
        p = body["plan"]
        return resources.StatusPlan(
            gpu_type=str(p["gpu_type"]), device=str(p.get("device", "")),
            gpu_count=int(p["gpu_count"]), gpus_per_node=int(p["gpus_per_node"]),
            nodes=int(p["nodes"]), estimated_seconds=float(p["estimated_seconds"]),
            step_time_ms=float(p["step_time_ms"]),
            memory_bytes_per_gpu=int(p["memory_bytes_per_gpu"]),
            cost_usd=float(p["cost_usd"]) if p.get("cost_usd") is not None else None,
            predictor=str(p.get("predictor", "")), observed_generation=generation,
            alternatives=tuple(_alternative(c) for c in body.get("candidates") or ())[:16],
            rejected=tuple(rejection(r) for r in body.get("rejected") or ()),
            calibration_factor=_calibration_factor(p.get("calibration")),
            scaling_inputs=_scaling_inputs(p),
            parallelism=_parallelism(p.get("parallelism"), gpu_count=int(p["gpu_count"])),
            strategy=_strategy(p.get("strategy")),
            memory_bytes_by_part=_memory_parts(p.get("memory")),
            bundle_version=_bundle_version(body.get("bundle_version")),
            workload_id=_workload_id(body.get("workload_id")),
            data_basis=_data_basis(p.get("data_basis")),
            attention=_attention(body.get("attention")),
            p90_seconds=_p90(p.get("interval_seconds")),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise errors.EstimatorProtocolError(
            f"estimator plan response: bad or missing {exc}") from exc


def _p90(interval: Any) -> float | None:
    """The upper end of `interval_seconds` ([p10, p90]); None from an estimator without it."""
    if interval is None:
        return None
    if not isinstance(interval, list) or len(interval) != 2:
        raise ValueError(f"interval_seconds: need [p10, p90], got {interval!r:.80}")
    p90 = float(interval[1])
    if not p90 > 0:
        raise ValueError(f"interval_seconds: p90 must be > 0, got {p90!r}")
    return p90


def _bundle_version(raw: Any) -> int | None:
    """The answer's top-level `bundle_version`: a positive integer, or null/absent (a file
    bundle, or an estimator that predates database bundles)."""
    if raw is None:
        return None
    if isinstance(raw, bool) or not isinstance(raw, int) or raw < 1:
        raise ValueError(f"bundle_version: need a positive integer or null, got {raw!r}")
    return raw


WORKLOAD_ID_RE = re.compile(WORKLOAD_ID_PATTERN)


def _workload_id(raw: Any) -> str | None:
    """The answer's top-level `workload_id`: 64 hex digits, or null/absent (no database, or
    an estimator that predates stored workloads)."""
    if raw is None:
        return None
    if not isinstance(raw, str) or WORKLOAD_ID_RE.fullmatch(raw) is None:
        raise ValueError(f"workload_id: need 64 lowercase hex digits or null, got {raw!r:.80}")
    return raw


def _calibration_factor(calibration: Any) -> float:
    """`plan.calibration.factor`; an estimator that predates calibration sends none (1.0)."""
    if calibration is None:
        return 1.0
    if not isinstance(calibration, Mapping):
        raise TypeError(f"'calibration' {calibration!r}: must be an object")
    raw = calibration.get("factor")
    if raw is None:
        return 1.0
    if (isinstance(raw, bool) or not isinstance(raw, int | float)
            or not (raw > 0 and math.isfinite(raw))):
        raise ValueError(f"'calibration.factor' {raw!r}: must be a positive number")
    return float(raw)


def _scaling_inputs(p: Mapping[str, Any]) -> resources.ScalingInputs:
    """The plan's per-step figures for the scaling fit, each absent (None) in an estimator that
    does not send it; a present one must be a finite non-negative number (an integer where the
    field counts)."""
    values: dict[str, Any] = {}
    for key in resources.SCALING_INPUT_KEYS:
        raw = p.get(key)
        if raw is None:
            continue
        integer = key in resources.SCALING_INPUT_INTS
        kinds = int if integer else int | float
        if (isinstance(raw, bool) or not isinstance(raw, kinds)
                or not (math.isfinite(raw) and raw >= 0)):
            raise ValueError(f"'{key}' {raw!r}: must be a non-negative "
                             f"{'integer' if integer else 'number'}")
        values[key] = raw if integer else float(raw)
    return resources.ScalingInputs(**values)


# The CRD's bounds on status.plan.memoryStrategy: a value past them would be refused by the
# API server when the plan is stored, so the client refuses it first, naming the field.
MAX_ZERO_STAGE = 3
MAX_LABEL_CHARS = 256
MAX_MODE_CHARS = 64


def _int_at_least(obj: Mapping[str, Any], section: str, key: str, *, minimum: int = 1,
                  maximum: int | None = None) -> int:
    """`obj[key]` as an integer in [minimum, maximum] (never a bool); KeyError when absent."""
    raw = obj[key]
    if (isinstance(raw, bool) or not isinstance(raw, int) or raw < minimum
            or (maximum is not None and raw > maximum)):
        bound = f"from {minimum} to {maximum}" if maximum is not None else f">= {minimum}"
        raise ValueError(f"'{section}.{key}' {raw!r}: must be an integer {bound}")
    return raw


def _text(obj: Mapping[str, Any], section: str, key: str, *, max_chars: int) -> str:
    raw = obj[key]
    if not isinstance(raw, str) or not 0 < len(raw) <= max_chars:
        raise ValueError(f"'{section}.{key}' {raw!r}: must be a string of 1 to {max_chars} "
                         "characters")
    return raw


def _object(raw: Any, section: str) -> Mapping[str, Any]:
    if not isinstance(raw, Mapping):
        raise TypeError(f"'{section}' {raw!r}: must be an object")
    return raw


def _parallelism(raw: Any, *, gpu_count: int) -> resources.PlannedParallelism | None:
    """`plan.parallelism` (issue #19); None from an estimator that does not send it. Present, every
    field must be a positive integer and dp x tp x pp the plan's GPU count: a trainer launched
    with another world size would not run the plan."""
    if raw is None:
        return None
    obj = _object(raw, "parallelism")
    # An estimator before expert parallelism sends no ep: every rank holds every expert.
    par = resources.PlannedParallelism(
        **{key: _int_at_least(obj, "parallelism", key) for key in
           ("dp", "tp", "pp", "micro_batches", "micro_batch")},
        ep=_int_at_least(obj, "parallelism", "ep") if "ep" in obj else 1)
    if par.dp * par.tp * par.pp != gpu_count:
        raise ValueError(f"'parallelism' dp={par.dp} x tp={par.tp} x pp={par.pp}: must make "
                         f"gpu_count {gpu_count}")
    if par.dp % par.ep:
        raise ValueError(f"'parallelism' ep={par.ep}: must divide dp={par.dp}")
    return par


def _strategy(raw: Any) -> resources.PlannedMemoryStrategy | None:
    """`plan.strategy` (issue #19); None from an estimator that does not send it. Present, its
    fields must have the estimator's types (`interfaces/http/responses.py` `Strategy`)."""
    if raw is None:
        return None
    obj = _object(raw, "strategy")
    fraction = obj.get("checkpoint_fraction")
    if fraction is not None and (isinstance(fraction, bool)
                                 or not isinstance(fraction, int | float)
                                 or not 0.0 < fraction <= 1.0):
        raise ValueError(f"'strategy.checkpoint_fraction' {fraction!r}: must be in (0, 1]")
    offload = obj["offload_optimizer"]
    if not isinstance(offload, bool):
        raise ValueError(f"'strategy.offload_optimizer' {offload!r}: must be true or false")
    return resources.PlannedMemoryStrategy(
        label=_text(obj, "strategy", "label", max_chars=MAX_LABEL_CHARS),
        zero_stage=_int_at_least(obj, "strategy", "zero_stage", minimum=0,
                                 maximum=MAX_ZERO_STAGE),
        fsdp=_text(obj, "strategy", "fsdp", max_chars=MAX_MODE_CHARS),
        checkpointing=_text(obj, "strategy", "checkpointing", max_chars=MAX_MODE_CHARS),
        checkpoint_fraction=float(fraction) if fraction is not None else None,
        gradient_accumulation=_int_at_least(obj, "strategy", "gradient_accumulation"),
        offload_optimizer=offload)


def _memory_parts(raw: Any) -> dict[str, int] | None:
    """`plan.memory`: per-GPU bytes by part; None from an estimator that does not send it."""
    if raw is None:
        return None
    obj = _object(raw, "memory")
    if len(obj) > resources.MAX_MEMORY_PARTS:
        raise ValueError(f"'memory': {len(obj)} parts, at most {resources.MAX_MEMORY_PARTS}")
    parts = {}
    for key in obj:
        if not isinstance(key, str) or not re.fullmatch(resources.MEMORY_PART_PATTERN, key):
            raise ValueError(f"'memory' part {key!r}: must be snake case letters")
        parts[key] = _int_at_least(obj, "memory", key, minimum=0)
    return parts


def with_planned_steps(plan: resources.StatusPlan,
                       training: resources.Training) -> resources.StatusPlan:
    """`plan` with the optimizer steps the job runs, when the estimator did not say: every
    epoch takes ceil(dataset / global batch) steps, the last batch partial (the estimator's
    `TrainingRequest.steps_per_epoch`)."""
    if plan.scaling_inputs.steps is not None:
        return plan
    steps = math.ceil(training.dataset_size / training.batch_size) * training.epochs
    inputs = dataclasses.replace(plan.scaling_inputs, steps=steps)
    return dataclasses.replace(plan, scaling_inputs=inputs)


def _data_basis(value: object) -> str | None:
    """The plan's `data_basis`: one of `resources.DATA_BASES`, or None from an older estimator."""
    if value is None:
        return None
    if not isinstance(value, str) or value not in resources.DATA_BASES:
        raise ValueError(f"data_basis: need one of {', '.join(resources.DATA_BASES)} or null, "
                         f"got {value!r:.80}")
    return value


def _attention(raw: object) -> resources.AttentionPricing | None:
    """The answer's top-level `attention` (how the graph's attention was priced), or None from
    an estimator that predates it."""
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise TypeError(f"'attention' {raw!r:.80}: must be an object")
    requested = raw.get("requested")
    if requested not in ATTENTIONS:
        raise ValueError(f"attention.requested: need one of {', '.join(sorted(ATTENTIONS))}, "
                         f"got {requested!r:.80}")
    counts = {key: raw.get(key) for key in ("cores", "fused_cores")}
    for key, value in counts.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"attention.{key}: need a non-negative integer, got {value!r:.80}")
    warning = raw.get("warning")
    if warning is not None and not isinstance(warning, str):
        raise ValueError(f"attention.warning: need a string or null, got {warning!r:.80}")
    return resources.AttentionPricing(
        str(requested), int(counts["cores"] or 0), int(counts["fused_cores"] or 0),
        warning[:resources.ATTENTION_WARNING_MAX_CHARS] if warning is not None else None)


def _alternative(c: Mapping[str, Any]) -> dict[str, Any]:
    keys = {"gpu_type": "gpuType", "gpu_count": "gpuCount", "estimated_seconds": "estimatedSeconds",
            "cost_usd": "costUsd", "memory_bytes_per_gpu": "memoryBytes",
            "data_basis": "dataBasis"}
    return {camel: c[snake] for snake, camel in keys.items() if snake in c}


def rejection(r: Mapping[str, Any]) -> resources.RejectedCandidate:
    """One `rejected` entry of the estimator's answer as a Rejection."""
    count = r.get("gpu_count")
    return resources.RejectedCandidate(str(r.get("gpu_type", "")),
                               int(count) if count is not None else None, str(r.get("reason", "")))


def _rejected_error(status: int, body: Mapping[str, Any]) -> errors.EstimatorRejectedError:
    err = body.get("error") if isinstance(body, Mapping) else None
    if not isinstance(err, Mapping) or "reason" not in err:
        return errors.EstimatorRejectedError(
            resources.Reason.INVALID_REQUEST, f"estimator answered {status} without an error body")
    return errors.EstimatorRejectedError(
        str(err["reason"]), str(err.get("message", "")), list(err.get("details") or []))


async def request_plan(
    base_url: str, body: Mapping[str, Any], *, generation: int, timeout_seconds: float,
    tenant: str, session: aiohttp.ClientSession | None = None, token_file: str = "",
    ca_file: str = "",
) -> resources.StatusPlan:
    """POST the request: 200 → Plan, 4xx → EstimatorRejectedError, 5xx/timeout → Unavailable.

    `tenant` (the TrainingJob's namespace) goes in the estimator's client header, so one
    namespace's models cannot take every estimator worker from the others; the estimator
    believes that header only from a caller whose token (`token_file`, read now) it verified
    as an allowed writer (issue #33), so the operator sends it on plans too. A 504 whose
    envelope says `Timeout` is the model's own estimate running out of time (the estimator
    killed it and answers retries from its cache): rejected, not unavailable. An https URL's
    certificate is checked against `ca_file` (`server_check`).
    """
    url = base_url.rstrip("/") + PLANS_PATH
    check = server_check(ca_file)
    timeout = aiohttp.ClientTimeout(total=timeout_seconds)
    own = session is None
    client = session or aiohttp.ClientSession()
    headers = {CLIENT_HEADER: tenant}
    try:
        headers.update(bearer_headers(token_file))
    except errors.EstimatorUnavailableError as exc:  # plans are open: unverified, still fair
        LOG.warning("plan sent without the operator's token: %s", exc)
    size, chunks = encoded_body(body)
    headers.update({"Content-Type": "application/json", "Content-Length": str(size)})
    try:
        async with client.post(url, data=chunks, timeout=timeout, headers=headers,
                               ssl=check) as resp:
            raw = await streams.read_capped(resp.content, MAX_RESPONSE_BYTES)
            status = resp.status
    except (TimeoutError, aiohttp.ClientError) as exc:
        raise errors.EstimatorUnavailableError(
            f"estimator at {url} unavailable: {type(exc).__name__}: {exc}") from exc
    finally:
        if own:
            await client.close()
    if (status >= 500 or status in {408, 429}) and not _estimate_timed_out(status, raw):
        raise errors.EstimatorUnavailableError(f"estimator at {url} answered {status}")
    if len(raw) > MAX_RESPONSE_BYTES:
        raise errors.EstimatorProtocolError(f"estimator response larger than {MAX_RESPONSE_BYTES}")
    try:
        decoded = json.loads(raw)
    except ValueError as exc:
        raise errors.EstimatorProtocolError(f"estimator answered {status} with non-JSON") from exc
    if status >= 400:
        raise _rejected_error(status, decoded)
    if status != 200:
        raise errors.EstimatorProtocolError(f"estimator answered unexpected status {status}")
    return parse_plan(decoded, generation=generation)


MODEL_FIELD = "model_onnx_b64"
BODY_CHUNK_CHARS = 1024 * 1024
"""A plan body goes out in pieces of at most this many characters of its base64 model."""


def encoded_body(body: Mapping[str, Any]) -> tuple[int, AsyncIterator[bytes]]:
    """`body`'s JSON length in bytes and its bytes in pieces, the model's base64 encoded a piece
    at a time (issue #33's memory bound: `json=` would hold the serialised string and its
    encoding besides the body, and the socket's buffer a fourth copy, for each plan in
    flight). The length goes in Content-Length, so the estimator admits or refuses the body
    before it is sent. Base64 needs no JSON escaping, so the pieces are the JSON text."""
    model = body.get(MODEL_FIELD)
    rest = {k: v for k, v in body.items() if k != MODEL_FIELD}
    if not isinstance(model, str):
        whole = json.dumps(body).encode()
        return len(whole), _pieces(whole, "", b"")
    opening = json.dumps(rest)[:-1].encode() + (b", " if rest else b"") + \
        json.dumps(MODEL_FIELD).encode() + b': "'
    closing = b'"}'
    return len(opening) + len(model) + len(closing), _pieces(opening, model, closing)


async def _pieces(opening: bytes, model: str, closing: bytes) -> AsyncIterator[bytes]:
    yield opening
    for start in range(0, len(model), BODY_CHUNK_CHARS):
        yield model[start:start + BODY_CHUNK_CHARS].encode("ascii")
    yield closing


def _estimate_timed_out(status: int, raw: bytes) -> bool:
    if status != 504 or len(raw) > MAX_RESPONSE_BYTES:
        return False
    try:
        err = json.loads(raw).get("error") or {}
    except (ValueError, AttributeError):
        return False
    return bool(err.get("reason") == "Timeout")


def describe_rejections(details: Sequence[object]) -> str:
    """One line per detail of the estimator's error envelope: a NoFeasiblePlan's rejections
    (`gpu_type`, `gpu_count`, `reason`) or an InvalidRequest's field errors (`field`,
    `message`; `interfaces/http/responses.py` in the estimator)."""
    lines = []
    for d in details:
        if isinstance(d, Mapping) and "field" in d:
            lines.append(f"{d['field']}: {d.get('message', '')}")
        elif isinstance(d, Mapping):
            r = rejection(d)
            count = f" x{r.gpu_count}" if r.gpu_count is not None else ""
            lines.append(f"{r.gpu_type}{count}: {r.reason}")
        else:
            lines.append(str(d))
    return "; ".join(lines)


def build_outcome(*, job_uid: str, plan: resources.StatusPlan,
                  actual_seconds: float, namespace: str = "") -> dict[str, Any]:
    """The calibration sample of a finished job (`POST /v1/outcomes`).

    `estimated_seconds` is what the plan said, already calibrated; the factor goes with it so
    the estimator can divide it out instead of learning its own correction a second time. The
    node shape and the plan's per-step figures it knows (`resources.ScalingInputs`) go too:
    they make a multi-GPU job a sample for the estimator's scaling fit (issue #19). The plan's
    `workload_id` links the outcome to the workload the estimator stored with the plan, which its
    promotion gate re-estimates with each model bundle (issue #17). `namespace` is the
    TrainingJob's: the estimator bounds each namespace's weight in the calibration (issue #33);
    "" (not known) leaves it out.
    """
    return {"job_uid": job_uid, "gpu_type": plan.gpu_type, "gpu_count": plan.gpu_count,
            "estimated_seconds": plan.estimated_seconds, "actual_seconds": actual_seconds,
            "calibration_factor": plan.calibration_factor,
            "gpus_per_node": plan.gpus_per_node, "nodes": plan.nodes,
            **plan.scaling_inputs.present(),
            **({"workload_id": plan.workload_id} if plan.workload_id is not None else {}),
            **({"namespace": namespace} if namespace else {})}


MAX_TOKEN_BYTES = 64 * 1024
"""A ServiceAccount token is about 1 KB; a larger file is not one."""


def bearer_headers(token_file: str) -> dict[str, str]:
    """`Authorization: Bearer` with the token in `token_file`, read now (projected tokens
    rotate); none when the setting is empty or the file is absent (outside a pod)."""
    if not token_file:
        return {}
    try:
        with open(token_file, "rb") as f:
            token = f.read(MAX_TOKEN_BYTES + 1).decode("ascii").strip()
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError) as exc:
        raise errors.EstimatorUnavailableError(
            f"cannot read the ServiceAccount token {token_file}: {exc}") from exc
    if not token or len(token) > MAX_TOKEN_BYTES:
        raise errors.EstimatorUnavailableError(
            f"{token_file} holds no ServiceAccount token ({len(token)} characters)")
    return {"Authorization": f"Bearer {token}"}


RETRIED_OUTCOME_STATUSES = frozenset({429, 502, 503, 504})
"""Answers that say "not now" (busy, database or TokenReview unavailable, a proxy's timeout):
the outcome is sent again. The estimator keys outcomes by job uid, so a resend never counts
twice."""
FIRST_OUTCOME_RETRY_DELAY_S = 1.0
MAX_RETRY_AFTER_S = 30.0


async def report_outcome(base_url: str, body: Mapping[str, Any], *, timeout_seconds: float,
                         deadline_seconds: float | None = None, token_file: str = "",
                         ca_file: str = "",
                         sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
                         clock: Callable[[], float] = time.monotonic) -> None:
    """POST a finished job's outcome; a failure is `EstimatorUnavailableError` naming why.

    201 records it; 200 says the estimator already had this job uid (idempotent), which is
    success too: a resend after a lost answer must not look like a failure. The token in
    `token_file` (`settings.estimator_token_file`) authenticates the post (issue #16); a
    401/403 says why in the error, from the estimator's envelope.

    A transient failure (`RETRIED_OUTCOME_STATUSES`, a timeout, a refused connection) is
    retried with doubling delays (or the answer's Retry-After) until `deadline_seconds` (one
    attempt when None) has passed; every attempt's timeout ends by that deadline too. A lost
    outcome is a calibration sample the estimator never sees, so "the database was busy for a
    second" must not lose it.
    """
    url = base_url.rstrip("/") + OUTCOMES_PATH
    deadline = clock() + (deadline_seconds if deadline_seconds is not None else 0.0)
    delay = FIRST_OUTCOME_RETRY_DELAY_S
    attempt = 1
    while True:
        timeout = (timeout_seconds if deadline_seconds is None
                   else max(min(timeout_seconds, deadline - clock()), 0.001))
        try:
            await _post_outcome(url, body, timeout_seconds=timeout, token_file=token_file,
                                ca_file=ca_file)
            return
        except _TransientOutcomeFailure as exc:
            wait = min(exc.retry_after_s if exc.retry_after_s is not None else delay,
                       MAX_RETRY_AFTER_S)
            if clock() + wait >= deadline:
                tries = f" after {attempt} attempt(s)" if attempt > 1 else ""
                raise errors.EstimatorUnavailableError(f"{exc}{tries}") from exc
            await sleep(wait)
            delay *= 2
            attempt += 1


class _TransientOutcomeFailure(errors.EstimatorUnavailableError):
    """An outcome post worth sending again; `retry_after_s` is the server's hint, if any."""

    def __init__(self, message: str, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


async def _post_outcome(url: str, body: Mapping[str, Any], *, timeout_seconds: float,
                        token_file: str, ca_file: str) -> None:
    headers = bearer_headers(token_file)  # per attempt: projected tokens rotate
    check = server_check(ca_file)
    try:
        async with aiohttp.ClientSession() as client, client.post(
                url, json=body, headers=headers, ssl=check,
                timeout=aiohttp.ClientTimeout(total=timeout_seconds)) as resp:
            status = resp.status
            retry_after = resp.headers.get("Retry-After")
            raw = (await streams.read_capped(resp.content, MAX_RESPONSE_BYTES))[:MAX_RESPONSE_BYTES]
    except (TimeoutError, aiohttp.ClientError) as exc:
        raise _TransientOutcomeFailure(
            f"estimator at {url} unavailable: {type(exc).__name__}: {exc}") from exc
    if status in {200, 201}:
        return
    message = f"estimator at {url} answered {status}: {_error_message(raw)}"
    if status in RETRIED_OUTCOME_STATUSES:
        raise _TransientOutcomeFailure(message, _seconds(retry_after))
    if status in {401, 403}:
        raise errors.EstimatorUnavailableError(
            f"estimator at {url} refused the outcome ({status}): {_error_message(raw)}")
    raise errors.EstimatorUnavailableError(message)


def _seconds(retry_after: str | None) -> float | None:
    """A Retry-After header in seconds (the HTTP-date form is not used by the estimator)."""
    try:
        value = float(retry_after) if retry_after is not None else math.nan
    except ValueError:
        return None
    return value if math.isfinite(value) and value >= 0 else None


def _error_message(raw: bytes) -> str:
    """The message of the estimator's error envelope, else the start of the body."""
    try:
        err = json.loads(raw).get("error") or {}
        return str(err.get("message") or err)[:500]
    except (ValueError, AttributeError):
        return raw[:200].decode(errors="replace")


def parse_coverage(body: Mapping[str, Any]) -> dict[str, benchmarks.CoveredDevice]:
    """`GET /v1/coverage` → per device key; EstimatorProtocolError names the bad device."""
    devices = body.get("devices") if isinstance(body, Mapping) else None
    if not isinstance(devices, Mapping):
        raise errors.EstimatorProtocolError("estimator coverage response: missing 'devices'")
    out = {}
    for key, d in devices.items():
        try:
            newest = d["newest_run_unix"]
            # Per-GPU bundle rows are newer than the rest of the answer (issue #17): optional.
            bundle_rows = d.get("bundle_rows")
            out[str(key)] = benchmarks.CoveredDevice(
                measurements=int(d["measurements"]),
                newest_run_unix=float(newest) if newest is not None else None,
                in_bundle=bool(d["in_bundle"]),
                bundle_rows=int(bundle_rows) if bundle_rows is not None else None)
        except (KeyError, TypeError, ValueError) as exc:
            raise errors.EstimatorProtocolError(
                f"estimator coverage response: devices.{key}: bad or missing {exc}") from exc
    return out


async def fetch_coverage(base_url: str, *, timeout_seconds: float, ca_file: str = ""
                         ) -> dict[str, benchmarks.CoveredDevice]:
    """GET the coverage: 200 → parsed, anything else or a timeout → EstimatorUnavailableError."""
    url = base_url.rstrip("/") + COVERAGE_PATH
    check = server_check(ca_file)
    try:
        async with aiohttp.ClientSession() as client, client.get(
                url, timeout=aiohttp.ClientTimeout(total=timeout_seconds), ssl=check) as resp:
            raw = await streams.read_capped(resp.content, MAX_RESPONSE_BYTES)
            status = resp.status
    except (TimeoutError, aiohttp.ClientError) as exc:
        raise errors.EstimatorUnavailableError(
            f"estimator at {url} unavailable: {type(exc).__name__}: {exc}") from exc
    if status != 200:
        raise errors.EstimatorUnavailableError(f"estimator at {url} answered {status}")
    if len(raw) > MAX_RESPONSE_BYTES:
        raise errors.EstimatorProtocolError(f"estimator response larger than {MAX_RESPONSE_BYTES}")
    try:
        decoded = json.loads(raw)
    except ValueError as exc:
        raise errors.EstimatorProtocolError("estimator coverage answer is not JSON") from exc
    return parse_coverage(decoded)
