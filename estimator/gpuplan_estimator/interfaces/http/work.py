"""Estimation work as it runs in a worker process: request body bytes in, (status, JSON) out.

Everything a client controls is decoded here, never on the service's event loop: the JSON
itself (64 MB of it, invalid UTF-8, 5000-digit integers, 100k-deep nesting), the field
validation, the ONNX graph and the estimate. A worker that runs past the request's deadline is
killed by the pool, which gives its memory back; so the answer is a plain `Reply` rather than
an exception, which would not survive pickling across the process boundary intact.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import logging
import resource
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from gpuplan_estimator.core.errors import GpuplanError, InvalidModelError, InvalidRequestError
from gpuplan_estimator.interfaces import json_documents
from gpuplan_estimator.interfaces.http import layout_wire, responses, wire
from gpuplan_estimator.latency import selection
from gpuplan_estimator.parallel import named, scaling
from gpuplan_estimator.planning import calibrating, named_layouts, planner, requests, workloads

log = logging.getLogger(__name__)

ContextLoader = Callable[[], planner.PlannerContext]
"""Builds the planner context in a worker. It crosses to the worker by pickle, so it must be a
module-level function or a `functools.partial` of one (see `given_context`)."""


@dataclass(frozen=True)
class Reply:
    """An HTTP answer: status and JSON body."""
    status: int
    body: dict[str, Any]


def error_reply(status: int, reason: str, message: str,
                details: list[dict[str, Any]] | None = None) -> Reply:
    """The error envelope shared by every failure of the service (`responses.ErrorEnvelope`)."""
    return Reply(status, responses.error_json(reason, message, details))


def invalid_request_reply(exc: InvalidRequestError) -> Reply:
    """422 `InvalidRequest` with one `FieldError` detail per reported field."""
    problems = (exc.problems if isinstance(exc, wire.InvalidFieldsError)
                else ((exc.field, exc.message),))
    return error_reply(422, "InvalidRequest", str(exc), responses.field_errors(problems))


def no_feasible_plan_reply(exc: planner.NoFeasiblePlanError) -> Reply:
    """422 `NoFeasiblePlan` with one `PlanRejection` detail per GPU type."""
    return error_reply(422, "NoFeasiblePlan", str(exc), [
        {"gpu_type": gpu_type, "gpu_count": None, "reason": why}
        for gpu_type, why in exc.rejections])


def estimate(req: requests.EstimateRequest, ctx: planner.PlannerContext) -> dict[str, Any]:
    """`POST /v1/estimate` (and `gpuplan estimate`): one GPU per device, or per rank under the
    request's named layout, whose problems come back one per `layout.<field>`."""
    if req.layout is None:
        return json_documents.estimate_request_json(req, ctx)
    try:
        results = named_layouts.estimate_layout(req, ctx)
    except InvalidRequestError as exc:
        if exc.field.startswith(named.FIELD_PREFIX) and exc.details:
            raise wire.InvalidFieldsError(
                [tuple(d.split(": ", 1)) for d in exc.details]) from exc  # type: ignore[misc]
        raise
    return layout_wire.layout_estimates_json(results)


WORKLOAD_KEY = "_workload"
"""Where `plan_with_workload` puts the workload: {"id", "zstd_b64", "device", "gpu_count"} or
{"skipped": why}. The service takes it out before answering (it is not part of the plan)."""


def plan_with_workload(req: requests.PlanRequest, ctx: planner.PlannerContext
                       ) -> dict[str, Any]:
    """The plan document, plus the chosen candidate's workload under `WORKLOAD_KEY` for the
    promotion gate (`planning.workloads`). A workload that cannot be kept (over the size cap,
    or an error building it) is a `skipped` reason, never a failed plan."""
    req = planner.with_graph(req, export_batch=1)
    out = json_documents.plan_request_json(req, ctx)
    out[WORKLOAD_KEY] = _workload_entry(req, ctx, out["plan"])
    return out


def _workload_entry(req: requests.PlanRequest, ctx: planner.PlannerContext,
                    plan: Mapping[str, Any]) -> dict[str, Any]:
    # From the plan as the document rounds it: the outcome the operator reports back carries
    # the same figures, so the planning bundle re-predicts the stored seconds exactly.
    try:
        workload = planner.plan_workload(req, ctx, plan)
        workload_id, data = workloads.encode(workload)
    except workloads.WorkloadTooLargeError as exc:
        return {"skipped": str(exc)}
    except Exception as exc:  # the plan stands; only the gate loses this job
        log.exception("keeping the plan's workload failed")
        return {"skipped": f"building the workload failed: "
                           f"{type(exc).__name__}: {str(exc)[:300]}"}
    return {"id": workload_id, "zstd_b64": base64.b64encode(data).decode("ascii"),
            "device": workload.device, "gpu_count": workload.gpu_count}


ENDPOINTS: dict[str, tuple[Callable[[Any], Any], Callable[[Any, planner.PlannerContext], Any]]]
ENDPOINTS = {
    "plans": (wire.parse_plan_request, json_documents.plan_request_json),
    "estimate": (wire.parse_estimate_request, estimate),
    # A plan whose chosen workload the service stores (it has a database): the same plan
    # plus `WORKLOAD_KEY`, which the service takes out before answering.
    "plans_with_workload": (wire.parse_plan_request, plan_with_workload),
}


def decode_json(body: bytes) -> Any:
    """The body as JSON; InvalidRequestError for anything that is not valid JSON text (answered
    400 `InvalidJSON`, where JSON with invalid fields is 422 `InvalidRequest`: the extender's
    rule too)."""
    try:
        return json.loads(body)
    except json.JSONDecodeError as exc:
        raise InvalidRequestError("body", f"invalid JSON: {exc.msg} at {exc.pos}") from None
    except UnicodeDecodeError as exc:
        raise InvalidRequestError("body", f"not UTF-8: {exc.reason} at byte {exc.start}"
                                  ) from None
    except RecursionError:
        raise InvalidRequestError("body", "JSON nested too deeply") from None
    except ValueError as exc:  # integers past Python's 4300-digit conversion limit
        raise InvalidRequestError("body", f"invalid JSON: {str(exc)[:200]}") from None


def answer(endpoint: str, body: bytes, context: planner.PlannerContext) -> Reply:
    """Decode, validate and run one request against `context`; never raises."""
    parse, run = ENDPOINTS[endpoint]
    try:
        data = decode_json(body)
    except InvalidRequestError as exc:
        return error_reply(400, "InvalidJSON", str(exc))
    try:
        return Reply(200, run(parse(data), context))
    except InvalidModelError as exc:
        return error_reply(422, "InvalidModel", str(exc))
    except InvalidRequestError as exc:
        return invalid_request_reply(exc)
    except planner.NoFeasiblePlanError as exc:
        return no_feasible_plan_reply(exc)
    except GpuplanError as exc:
        return error_reply(422, "InvalidRequest", str(exc))
    except MemoryError:
        return error_reply(422, "InvalidModel", "estimating this model needs more memory than "
                           "an estimator worker may use (gpuplan serve --worker-memory-gib)")
    except (RecursionError, OverflowError, ValueError, ArithmeticError,
            IndexError, KeyError, TypeError) as exc:
        # A client's graph drove the estimator somewhere it should have refused earlier:
        # answer as an invalid model (the client can act on it) and keep the traceback for us.
        log.exception("estimating a client's model failed unexpectedly")
        return error_reply(422, "InvalidModel",
                           f"this model could not be estimated ({type(exc).__name__}: "
                           f"{str(exc)[:300]})")


def given_context(context: planner.PlannerContext) -> planner.PlannerContext:
    """A loader for an already-built context: `functools.partial(given_context, ctx)`."""
    return context


_loader: ContextLoader | None = None
_context: planner.PlannerContext | None = None


def init_worker(loader: ContextLoader, memory_bytes: int) -> None:
    """Pool initializer: build this worker's context once (the bundle load is the slow part),
    then cap the worker's data segment, so a graph that needs more memory than that fails
    with MemoryError (answered 422) instead of taking the whole pod to the OOM killer."""
    global _loader, _context
    _loader = loader
    _context = loader()
    selection.read_every_model(_context.predictor)  # models are read lazily otherwise (#34)
    resource.setrlimit(resource.RLIMIT_DATA, (memory_bytes, memory_bytes))


def ready() -> str:
    """A no-op task that returns once this worker's context is built (pool warm-up)."""
    if _context is None:
        raise RuntimeError("worker used before init_worker")
    return _context.predictor_source


def _context_for(source: str) -> planner.PlannerContext:
    """This worker's context, reloaded when the service moved to another bundle (`source`)."""
    global _context
    if _loader is None or _context is None:
        raise RuntimeError("worker used before init_worker")
    if _context.predictor_source != source:
        _context = _loader()
        selection.read_every_model(_context.predictor)
    return _context


def handle(endpoint: str, body: bytes, source: str,
           calibration: calibrating.CalibrationTable,
           scaling_fit: scaling.FittedScaling | None = None) -> Reply:
    """The pool's task: `answer` with this worker's context and the service's calibration and
    scaling fit (None: the context's own)."""
    context = dataclasses.replace(_context_for(source), calibration=calibration)
    if scaling_fit is not None:
        context = dataclasses.replace(context, scaling=scaling_fit.model, scaling_fit=scaling_fit)
    return answer(endpoint, body, context)
