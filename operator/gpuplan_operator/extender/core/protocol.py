"""kube-scheduler extender wire types (`k8s.io/kube-scheduler/extender/v1`), parsed and encoded.

The Go types carry no json tags, so the keys are the Go field names and nil pointers are `null`.
Parsing is strict about shape (every error names the field) and lenient about content: a Pod is
kept as the plain dict the scheduler sent, since only a few of its fields matter here.
"""

from __future__ import annotations

import json
import operator
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

MIN_SCORE = 0
MAX_SCORE = 10  # MaxExtenderPriority; the scheduler multiplies by weight × 10


MAX_REPORTED_ERRORS = 20
"""At most this many field errors are listed in one error response."""


class ProtocolError(ValueError):
    """A request body does not have the ExtenderArgs shape; `field` is a JSON path.

    `details` lists every bad field found ("field: message", at most MAX_REPORTED_ERRORS), the
    first of which is also the exception's message."""

    def __init__(self, field: str, message: str, details: Sequence[str] = ()) -> None:
        self.field = field
        super().__init__(f"{field}: {message}")
        self.details: tuple[str, ...] = tuple(details) or (str(self),)


@dataclass(frozen=True)
class ExtenderArgs:
    """One filter or prioritize request.

    `node_names` is the candidate list in either mode; `node_items` holds the full v1.Node dicts
    only when the scheduler is not node-cache-capable (then the filter must echo them back).
    `plain_names` is True when no node name needs escaping in JSON (set by `parse_args`; the
    encoders then write names without `json.dumps`).
    """

    pod: Mapping[str, Any]
    node_names: tuple[str, ...]
    node_items: tuple[Mapping[str, Any], ...] | None
    plain_names: bool = False

    @property
    def pod_key(self) -> str:
        """`namespace/name` of the pod, for logs; never raises, whatever the metadata holds."""
        meta = self.pod.get("metadata")
        if not isinstance(meta, dict):
            return "?/?"
        return f"{_short(meta.get('namespace', ''))}/{_short(meta.get('name', ''))}"


@dataclass(frozen=True)
class FilterResult:
    """ExtenderFilterResult: names that pass, plus a reason for every node that does not."""

    passed: tuple[str, ...]
    failed: Mapping[str, str]
    failed_unresolvable: Mapping[str, str]


def parse_args(body: object) -> ExtenderArgs:
    """Validate a decoded JSON body as ExtenderArgs; raises ProtocolError naming the field.

    Only the envelope is checked here: `Pod` must be an object, the candidates a list of names
    (or of Node objects with names). What the Pod holds is read by `plans.plan_for_pod`, which
    turns anything unreadable in a managed pod into a rejection with a reason, never an error,
    because an erroring `ignorable` extender lets the pod schedule unfiltered.
    """
    if not isinstance(body, dict):
        raise ProtocolError("$", f"expected a JSON object, got {type_name(body)}")
    pod = body.get("Pod")
    if not isinstance(pod, dict):
        raise ProtocolError("Pod", f"expected an object, got {type_name(pod)}")
    names_raw = body.get("NodeNames")
    nodes_raw = body.get("Nodes")
    if names_raw is not None:
        names, plain = _parse_names(names_raw)
        return ExtenderArgs(pod=pod, node_names=names, node_items=None, plain_names=plain)
    if nodes_raw is None:
        raise ProtocolError("NodeNames", "both NodeNames and Nodes are null")
    items = _parse_node_items(nodes_raw)
    names = tuple(_node_item_name(item, i) for i, item in enumerate(items))
    return ExtenderArgs(pod=pod, node_names=names, node_items=items,
                        plain_names=_plain(",".join(names)))


def _parse_names(raw: object) -> tuple[tuple[str, ...], bool]:
    if not isinstance(raw, list):
        raise ProtocolError("NodeNames", f"expected an array or null, got {type_name(raw)}")
    try:
        joined = ",".join(raw)  # validates every entry at C speed: TypeError on a non-string
    except TypeError:
        raise _bad_fields([(f"NodeNames[{i}]", f"expected a string, got {type_name(name)}")
                           for i, name in enumerate(raw) if not isinstance(name, str)]) from None
    return tuple(raw), _plain(joined)


# Bytes that may stand unescaped inside a JSON string: printable ASCII except '"' and '\'.
_JSON_SAFE = bytes(b for b in range(0x20, 0x7F) if b not in b'"\\')


def _plain(text: str) -> bool:
    """True when `text` can be written inside a JSON string as it is (no escaping needed)."""
    if not text.isascii():
        return False
    return not text.encode("ascii").translate(None, _JSON_SAFE)


def _parse_node_items(raw: object) -> tuple[Mapping[str, Any], ...]:
    if not isinstance(raw, dict):
        raise ProtocolError("Nodes", f"expected an object or null, got {type_name(raw)}")
    items = raw.get("items")
    if items is None:
        return ()
    if not isinstance(items, list):
        raise ProtocolError("Nodes.items", f"expected an array, got {type_name(items)}")
    bad = [(f"Nodes.items[{i}]", f"expected an object, got {type_name(item)}")
           for i, item in enumerate(items) if not isinstance(item, dict)]
    if bad:
        raise _bad_fields(bad)
    return tuple(items)


def _bad_fields(bad: Sequence[tuple[str, str]]) -> ProtocolError:
    """One ProtocolError for the bad (field, message) pairs: the first, and all as details."""
    return ProtocolError(*bad[0], details=[f"{f}: {m}" for f, m in bad[:MAX_REPORTED_ERRORS]])


def _node_item_name(item: Mapping[str, Any], index: int) -> str:
    meta = item.get("metadata")
    name = meta.get("name") if isinstance(meta, dict) else None
    if not isinstance(name, str) or not name:
        raise ProtocolError(f"Nodes.items[{index}].metadata.name", "missing or not a string")
    return name


def _short(value: object, limit: int = 80) -> str:
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= limit else text[:limit] + "…"


def type_name(value: object) -> str:
    """The JSON name of a decoded value's type ("object", "array", "string", "number", …)."""
    if value is None:
        return "null"
    return {dict: "object", list: "array", str: "string", bool: "boolean"}.get(
        type(value), "number" if isinstance(value, int | float) else type(value).__name__
    )


def encode_filter_result(result: FilterResult, args: ExtenderArgs) -> dict[str, Any]:
    """ExtenderFilterResult JSON: NodeNames when cache-capable, else the passing Node objects."""
    if args.node_items is None:
        nodes: dict[str, Any] | None = None
        names: list[str] | None = list(result.passed)
    else:
        keep = set(result.passed)
        items = [item for item, name in zip(args.node_items, args.node_names, strict=True)
                 if name in keep]
        nodes, names = {"items": items}, None
    return {
        "Nodes": nodes,
        "NodeNames": names,
        "FailedNodes": dict(result.failed),
        "FailedAndUnresolvableNodes": dict(result.failed_unresolvable),
        "Error": "",
    }


def encode_filter_error(message: str) -> dict[str, Any]:
    """A filter response that fails the scheduling attempt with `message`."""
    return {
        "Nodes": None,
        "NodeNames": None,
        "FailedNodes": None,
        "FailedAndUnresolvableNodes": None,
        "Error": message,
    }


def encode_error(reason: str, message: str, details: Sequence[str] = ()) -> dict[str, Any]:
    """The JSON body of every non-200 answer: `{"error": {"reason", "message", "details"}}`.

    The ExtenderFilterResult keys (with `Error` = message) ride along: kube-scheduler reads no
    body of a non-200 answer, but whoever reads it as a filter result sees the error too."""
    return {"error": {"reason": reason, "message": message, "details": list(details)},
            **encode_filter_error(message)}


def encode_priorities(scores: Sequence[tuple[str, int]]) -> list[dict[str, Any]]:
    """HostPriorityList: a bare JSON array of {"Host", "Score"}."""
    return [{"Host": host, "Score": score} for host, score in scores]


def _dumps(data: Any) -> bytes:
    return json.dumps(data, separators=(",", ":")).encode()


def _dumps_reasons(reasons: Mapping[str, str]) -> str:
    """`{"node":"reason",…}` for plain node names; few distinct reasons, each escaped once."""
    if not reasons:
        return "{}"
    tails = {r: '":' + json.dumps(r) for r in set(reasons.values())}
    return '{"' + ',"'.join(map(operator.add, reasons.keys(),
                                map(tails.__getitem__, reasons.values()))) + "}"


def dumps_filter_result(result: FilterResult, args: ExtenderArgs) -> bytes:
    """`encode_filter_result` serialised to JSON bytes, written by hand for plain node names.

    Several times faster than json.dumps for plain names (`args.plain_names`), which matters at
    thousands of candidate nodes per request; `Nodes` items and other names go through
    json.dumps.
    """
    if args.node_items is not None or not args.plain_names:
        return _dumps(encode_filter_result(result, args))
    names = '"' + '","'.join(result.passed) + '"' if result.passed else ""
    return (
        f'{{"Nodes":null,"NodeNames":[{names}],'
        f'"FailedNodes":{_dumps_reasons(result.failed)},'
        f'"FailedAndUnresolvableNodes":{_dumps_reasons(result.failed_unresolvable)},'
        f'"Error":""}}'
    ).encode()


def dumps_priorities(scores: Sequence[tuple[str, int]]) -> bytes:
    """`encode_priorities` serialised, with the same fast path for plain names."""
    if not scores:
        return b"[]"
    hosts, values = zip(*scores, strict=True)
    return dumps_scores(hosts, values)


def dumps_scores(hosts: Sequence[str], scores: Sequence[int], plain: bool | None = None) -> bytes:
    """HostPriorityList JSON of `hosts` and their `scores` (same order), written by hand.

    `plain` says whether the hosts need no JSON escaping (`ExtenderArgs.plain_names`); None
    checks them here. Other hosts go through json.dumps."""
    if not hosts:
        return b"[]"
    if not (_plain(",".join(hosts)) if plain is None else plain):
        return _dumps(encode_priorities(list(zip(hosts, scores, strict=True))))
    tails = {s: f'","Score":{int(s)}}}' for s in set(scores)}
    return ('[{"Host":"' + ',{"Host":"'.join(map(operator.add, hosts,
                                                  map(tails.__getitem__, scores))) + "]"
            ).encode()
