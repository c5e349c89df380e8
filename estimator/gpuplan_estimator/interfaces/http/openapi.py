"""The service's OpenAPI 3.1 document, generated from the wire and response models.

`python -m gpuplan_estimator.interfaces.http.openapi --output docs/openapi.json` writes it
(`make openapi`); `make verify` and the tests fail when the committed copy is stale, and the
service serves the same document at `GET /openapi.json`.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, RootModel
from pydantic.json_schema import models_json_schema

from gpuplan_estimator.interfaces.http import responses, wire
from gpuplan_estimator.interfaces.http.layout_wire import LayoutEstimateResponse

DOCUMENT_PATH = "/openapi.json"
API_VERSION = "v1"
"""The version in the paths; fields are only added within it."""
REF_TEMPLATE = "#/components/schemas/{model}"
JSON = "application/json"


@dataclass(frozen=True)
class Answer:
    """One documented status of an operation."""

    description: str
    model: type[BaseModel] | None = responses.ErrorEnvelope
    """The body's model; None for a body that is not one of ours (Prometheus text, this
    document)."""
    media_type: str = JSON


@dataclass(frozen=True)
class Operation:
    """One method on one path."""

    method: str
    path: str
    summary: str
    answers: Mapping[int, Answer]
    request: type[BaseModel] | None = None
    tags: Sequence[str] = field(default_factory=lambda: ("estimator",))
    parameters: Sequence[Mapping[str, Any]] = ()
    """Path parameters, as OpenAPI parameter objects."""
    request_required: bool = True
    write: bool = False
    """A write: needs a verified caller when the service runs `--write-auth tokenreview`
    (issue #16), documented as the bearer security scheme with 401 and 403."""


_INVALID_JSON = Answer("InvalidJSON: the body is not JSON (not UTF-8, nested too deeply, an "
                       "integer past 4300 digits).")
_TOO_LARGE = Answer("RequestTooLarge: the body is over the service's cap.")
_BUSY = Answer("TooManyRequests: this client's queue is full.")
_UNAVAILABLE = Answer("NotReady, Busy (no worker free before the deadline), WorkersUnavailable "
                      "or DatabaseUnavailable.")
_TIMEOUT = Answer("Timeout: the estimate ran out of the request's time (its worker was killed).")
_NOT_READY = Answer("NotReady: the model bundle is not loaded yet.")
_WRITE_AUTH = {
    401: Answer("Unauthenticated: no bearer token, or one the Kubernetes API server did not "
                "accept (only with --write-auth tokenreview)."),
    403: Answer("Forbidden: the token's ServiceAccount is not in --write-allowed-subjects."),
}
SECURITY_SCHEME = "serviceAccountToken"
_ESTIMATION_ERRORS = {400: _INVALID_JSON, 413: _TOO_LARGE, 429: _BUSY, 503: _UNAVAILABLE,
                      504: _TIMEOUT}

class EstimateAnswer(RootModel[responses.EstimateResponse | LayoutEstimateResponse]):
    """`POST /v1/estimate` 200: one GPU per device, or per rank under the request's layout."""


OPERATIONS: tuple[Operation, ...] = (
    Operation("post", "/v1/plans", "Choose GPU type and count for a training job",
              {200: Answer("The plan.", responses.PlanResponse),
               422: Answer("InvalidRequest (FieldError details), InvalidModel, or "
                           "NoFeasiblePlan (PlanRejection details)."),
               **_ESTIMATION_ERRORS},
              request=wire.PlanRequestBody),
    Operation("post", "/v1/estimate", "Estimate step time and memory on catalog devices",
              {200: Answer("The estimate document (docs/estimate-json.md); with a `layout`, "
                           "the per-rank LayoutEstimateResponse instead.", EstimateAnswer),
               422: Answer("InvalidRequest (FieldError details) or InvalidModel."),
               **_ESTIMATION_ERRORS},
              request=wire.EstimateRequestBody),
    Operation("post", "/v1/outcomes", "Report a finished job's measured duration",
              {201: Answer("Recorded; the calibration was refitted.", responses.OutcomeResponse),
               200: Answer("This job uid was already recorded; nothing changed.",
                           responses.OutcomeResponse),
               400: _INVALID_JSON, 413: _TOO_LARGE, **_WRITE_AUTH,
               422: Answer("InvalidRequest (FieldError details)."),
               503: Answer("NotReady (no performance database), DatabaseUnavailable, or "
                           "AuthUnavailable (the caller's token cannot be verified now)."),
               504: Answer("Timeout: storing the outcome timed out.")},
              request=wire.OutcomeBody, write=True),
    Operation("get", "/v1/models", "The predictor, bundle manifest, catalog and calibration",
              {200: Answer("In use now.", responses.ModelsResponse), 503: _NOT_READY}),
    Operation("post", "/v1/models/{version}/activate",
              "Activate a stored model bundle version (rollback: activate an older one)",
              {200: Answer("Activated; this replica reloaded, the others follow within their "
                           "bundle poll.", responses.ActivateResponse),
               400: _INVALID_JSON, 413: _TOO_LARGE, **_WRITE_AUTH,
               404: Answer("NotFound: no bundle has this version."),
               422: Answer("InvalidRequest (FieldError details)."),
               503: Answer("NotReady (no performance database), DatabaseUnavailable, or "
                           "AuthUnavailable (the caller's token cannot be verified now)."),
               504: Answer("Timeout: the database did not answer in time.")},
              request=wire.ActivateBody, request_required=False, write=True,
              parameters=({"name": "version", "in": "path", "required": True,
                           "description": "The bundle version (gpuplan models list).",
                           "schema": {"type": "integer", "minimum": 1,
                                      "maximum": wire.MAX_BUNDLE_VERSION}},)),
    Operation("get", "/v1/coverage", "Benchmark rows and bundle coverage per device",
              {200: Answer("Every catalog, bundle or database device.",
                           responses.CoverageResponse),
               503: Answer("NotReady (no performance database) or DatabaseUnavailable."),
               504: Answer("Timeout: the coverage query timed out.")}),
    Operation("get", "/healthz", "Liveness",
              {200: Answer("The process answers.", responses.HealthResponse)}, tags=("probes",)),
    Operation("get", "/readyz", "Readiness",
              {200: Answer("The model bundle is loaded.", responses.ReadyResponse),
               503: _NOT_READY}, tags=("probes",)),
    Operation("get", "/metrics", "Prometheus metrics",
              {200: Answer("Prometheus text exposition format.", None, "text/plain")},
              tags=("probes",)),
    Operation("get", DOCUMENT_PATH, "This OpenAPI document",
              {200: Answer("OpenAPI 3.1.", None)}, tags=("probes",)),
)
"""Every route of `service.make_app` (a test holds them equal)."""


def _models() -> list[type[BaseModel]]:
    found: dict[str, type[BaseModel]] = {}
    for op in OPERATIONS:
        for model in (op.request, *(a.model for a in op.answers.values())):
            if model is not None:
                found.setdefault(model.__name__, model)
    return [found[name] for name in sorted(found)]


def _content(model: type[BaseModel] | None, media_type: str) -> dict[str, Any]:
    if model is not None:
        schema: dict[str, str] = {"$ref": REF_TEMPLATE.format(model=model.__name__)}
    else:
        schema = {"type": "object" if media_type == JSON else "string"}
    return {media_type: {"schema": schema}}


def _operation(op: Operation) -> dict[str, Any]:
    out: dict[str, Any] = {
        "summary": op.summary,
        "operationId": op.method + "".join(c if c.isalnum() else "_" for c in op.path),
        "tags": list(op.tags),
    }
    if op.write:
        out["security"] = [{SECURITY_SCHEME: []}]
    if op.parameters:
        out["parameters"] = [dict(p) for p in op.parameters]
    if op.request is not None:
        out["requestBody"] = {"required": op.request_required,
                              "content": _content(op.request, JSON)}
    answers = {str(status): {"description": a.description,
                             "content": _content(a.model, a.media_type)}
               for status, a in sorted(op.answers.items())}
    answers["default"] = {"description": "Any other failure (404 NotFound, 405 "
                                         "MethodNotAllowed, 500 Internal), same envelope.",
                          "content": _content(responses.ErrorEnvelope, JSON)}
    out["responses"] = answers
    return out


def document() -> dict[str, Any]:
    """The OpenAPI 3.1 document: every operation, its bodies as `components/schemas`."""
    _, schema = models_json_schema([(m, "validation") for m in _models()],
                                   ref_template=REF_TEMPLATE)
    paths: dict[str, dict[str, Any]] = {}
    for op in OPERATIONS:
        paths.setdefault(op.path, {})[op.method] = _operation(op)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "gpuplan estimator service",
            "version": API_VERSION,
            "description": "Estimates training step time and memory of an ONNX model per GPU "
                           "type, and plans GPU type and count for a job (`gpuplan serve`). "
                           "Every non-2xx answer is the ErrorEnvelope; see "
                           "docs/estimator-service.md.",
        },
        "paths": paths,
        "components": {
            "schemas": schema.get("$defs", {}),
            "securitySchemes": {SECURITY_SCHEME: {
                "type": "http", "scheme": "bearer",
                "description": "The caller's Kubernetes ServiceAccount token, verified by a "
                               "TokenReview; required on writes when the service runs "
                               "--write-auth tokenreview (the chart's setting)."}},
        },
    }


def render() -> str:
    """The document as the text committed in docs/openapi.json."""
    return json.dumps(document(), indent=2, ensure_ascii=False) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """Write the document to `--output` (default: standard output)."""
    parser = argparse.ArgumentParser(prog="python -m gpuplan_estimator.interfaces.http.openapi",
                                     description="Write the OpenAPI document.")
    parser.add_argument("--output", type=Path, help="file to write (default: stdout)")
    args = parser.parse_args(argv)
    text = render()
    if args.output is None:
        sys.stdout.write(text)
    else:
        args.output.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
