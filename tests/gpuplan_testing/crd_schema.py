"""What the API server would do with an object under a CRD's structural schema, without one:
the fields it prunes and the values it refuses (type, required, bounds, enum)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import yaml

from gpuplan_testing.paths import REPO_ROOT

TRAININGJOB_CRD = REPO_ROOT / "crds" / "trainingjobs.gpuplan.io.yaml"
_TYPES: dict[str, tuple[type, ...]] = {
    "object": (dict,), "array": (list,), "string": (str,), "boolean": (bool,),
    "integer": (int,), "number": (int, float)}


def trainingjob_schema(version: str = "v1alpha1") -> dict[str, Any]:
    """The TrainingJob CRD's openAPIV3Schema of `version`."""
    doc = yaml.safe_load(TRAININGJOB_CRD.read_text(encoding="utf-8"))
    (found,) = [v for v in doc["spec"]["versions"] if v["name"] == version]
    schema: dict[str, Any] = found["schema"]["openAPIV3Schema"]
    return schema


def status_plan_schema() -> dict[str, Any]:
    """`status.plan`'s schema."""
    plan: dict[str, Any] = trainingjob_schema()["properties"]["status"]["properties"]["plan"]
    return plan


def problems(value: Any, schema: Mapping[str, Any], path: str = "") -> list[str]:
    """Every field the API server would prune ("pruned") or refuse, with its path; empty when
    the object is stored as given."""
    kind = schema.get("type")
    if kind is not None and (not isinstance(value, _TYPES[kind])
                             or (kind in {"integer", "number"} and isinstance(value, bool))):
        return [f"{path}: {value!r} is not {kind}"]
    out = _bounds(value, schema, path)
    if isinstance(value, dict):
        out += _object_problems(value, schema, path)
    elif isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            out += problems(item, schema["items"], f"{path}[{i}]")
    return out


def _object_problems(value: dict[str, Any], schema: Mapping[str, Any], path: str) -> list[str]:
    out = [f"{path}.{key}: required" for key in schema.get("required", ()) if key not in value]
    props = schema.get("properties", {})
    extra = schema.get("additionalProperties")
    for key, item in value.items():
        if key in props:
            out += problems(item, props[key], f"{path}.{key}")
        elif isinstance(extra, Mapping):
            out += problems(item, extra, f"{path}.{key}")
        elif not schema.get("x-kubernetes-preserve-unknown-fields"):
            out.append(f"{path}.{key}: pruned")
    return out


def _bounds(value: Any, schema: Mapping[str, Any], path: str) -> list[str]:
    checks = [
        ("minimum", lambda v, b: v >= b, (int, float)),
        ("maximum", lambda v, b: v <= b, (int, float)),
        ("maxLength", lambda v, b: len(v) <= b, (str,)),
        ("minLength", lambda v, b: len(v) >= b, (str,)),
        ("maxItems", lambda v, b: len(v) <= b, (list,)),
        ("maxProperties", lambda v, b: len(v) <= b, (dict,)),
    ]
    out = [f"{path}: {value!r} breaks {name} {schema[name]}" for name, ok, kinds in checks
           if name in schema and isinstance(value, kinds) and not ok(value, schema[name])]
    if "enum" in schema and value not in schema["enum"]:
        out.append(f"{path}: {value!r} not in {schema['enum']}")
    return out


SCHEMA_KEYWORDS = frozenset({
    "type", "format", "description", "properties", "required", "items", "enum", "default",
    "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "minLength", "maxLength",
    "pattern", "minItems", "maxItems", "minProperties", "maxProperties", "additionalProperties",
    "nullable", "oneOf", "anyOf", "allOf", "not", "x-kubernetes-validations",
    "x-kubernetes-preserve-unknown-fields", "x-kubernetes-int-or-string",
    "x-kubernetes-list-type", "x-kubernetes-list-map-keys", "x-kubernetes-map-type",
    "x-kubernetes-embedded-resource"})


def unknown_keywords(schema: Mapping[str, Any], path: str = "") -> list[str]:
    """Keys of schema nodes that are no OpenAPI keyword (the API server refuses the CRD), e.g.
    a YAML flow mapping whose unquoted description held a comma."""
    out = [f"{path}.{key}" for key in schema if key not in SCHEMA_KEYWORDS]
    for key, sub in schema.get("properties", {}).items():
        out += unknown_keywords(sub, f"{path}.properties.{key}")
    for key in ("items", "additionalProperties", "not"):
        if isinstance(schema.get(key), Mapping):
            out += unknown_keywords(schema[key], f"{path}.{key}")
    return out
