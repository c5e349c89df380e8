"""The real extender app over loopback HTTP, fed malformed pods and malformed request bodies.

Two rules (issue #21):

* a Pod object whose gpuplan plan cannot be read is answered 200 with every candidate FILTERED
  OUT, each with a reason naming the bad annotation or field. kube-scheduler's extender is
  `ignorable: true`, so an error answer (4xx/5xx, timeout) would let the pod schedule unfiltered;
* a body that is not a pod request at all gets the JSON error envelope
  `{"error": {"reason", "message", "details"}}`: 400 (not JSON / not UTF-8), 422 (wrong shape),
  413, 404, 405. Never a 500, never plain text.
"""

from __future__ import annotations

import asyncio
import gzip
import json
from collections.abc import Callable
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from gpuplan_estimator import devices
from gpuplan_operator.extender.app import AppSettings, make_app
from gpuplan_operator.extender.core import plans
from gpuplan_operator.extender.core.snapshot import Snapshot, build_snapshot
from gpuplan_testing import extender_builders as builders

H100 = "NVIDIA-H100-80GB-HBM3"
L4 = "NVIDIA-L4"
NODES = ["h100-0", "h100-1", "l4-0", "cpu-0", "ghost"]
ENVELOPE_KEYS = {"reason", "message", "details"}


class StaticSource:
    def __init__(self, snapshot: Snapshot | None) -> None:
        self._snapshot = snapshot

    def snapshot(self) -> Snapshot | None:
        return self._snapshot

    def age_s(self) -> float | None:
        return None if self._snapshot is None else 1.0


def cluster() -> StaticSource:
    nodes = [builders.make_node("h100-0", H100, 8), builders.make_node("h100-1", H100, 8),
             builders.make_node("l4-0", L4, 4), builders.make_node("cpu-0")]
    return StaticSource(build_snapshot(nodes, [], fresh_at_s=0.0))


Request = tuple[str, str, bytes | None, dict[str, str]]  # method, path, body, headers


def exchange(requests: list[Request], settings: AppSettings | None = None,
             source: StaticSource | None = None) -> list[tuple[int, str, bytes, Any]]:
    """Send each request to one real app on a loopback port: (status, content type, raw body,
    headers) per request."""
    resolve = plans.catalog_resolver(devices.load_catalog())
    app = make_app(source or cluster(), CollectorRegistry(), settings=settings,
                   resolve_type=resolve)

    async def go() -> list[tuple[int, str, bytes, Any]]:
        out = []
        async with TestClient(TestServer(app)) as client:
            for method, path, body, headers in requests:
                resp = await client.request(method, path, data=body,
                                            headers={"Content-Type": "application/json",
                                                     **headers})
                out.append((resp.status, resp.headers.get("Content-Type", ""),
                            await resp.read(), resp.headers))
        return out

    return asyncio.run(go())


def post(verb: str, body: bytes | str | dict[str, Any], **kw: Any) -> tuple[int, Any]:
    raw = body if isinstance(body, bytes) else (
        body.encode() if isinstance(body, str) else json.dumps(body).encode())
    ((status, ctype, data, _),) = exchange([("POST", f"/extender/{verb}", raw, {})], **kw)
    assert ctype.startswith("application/json"), (status, ctype, data[:200])
    return status, json.loads(data)


def assert_envelope(body: Any, reason: str) -> dict[str, Any]:
    assert isinstance(body, dict) and set(body["error"]) == ENVELOPE_KEYS
    error: dict[str, Any] = body["error"]
    assert error["reason"] == reason
    assert isinstance(error["message"], str) and error["message"]
    assert isinstance(error["details"], list)
    assert body["Error"] == error["message"]  # the ExtenderFilterResult view of the same error
    return error


def args_for(pod: dict[str, Any], names: list[str] = NODES) -> dict[str, Any]:
    return builders.extender_args(pod, names)


def assert_filtered_out(body: Any, field: str, names: list[str] = NODES) -> None:
    assert body["NodeNames"] == [] and body["FailedNodes"] == {} and body["Error"] == ""
    reasons = body["FailedAndUnresolvableNodes"]
    assert set(reasons) == set(names)
    (reason,) = set(reasons.values())
    assert reason.startswith(f"invalid gpuplan plan: {field}: "), reason
    assert len(reason) < 300  # sent once per candidate node


# -- malformed pod content: 200, filtered out with a reason ---------------------------------------


def _managed() -> dict[str, Any]:
    return builders.make_pod("p", gpus=1, gpu_type=H100)


def _limits(value: Any) -> Callable[[dict[str, Any]], None]:
    def mutate(pod: dict[str, Any]) -> None:
        pod["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": value}}
    return mutate


def _note(key: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def mutate(pod: dict[str, Any]) -> None:
        pod["metadata"]["annotations"][key] = value
    return mutate


def _spec(key: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def mutate(pod: dict[str, Any]) -> None:
        pod["spec"][key] = value
    return mutate


def _deep(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = {"a": [value]}
    return value


LIMIT = "spec.containers[0].resources.limits[nvidia.com/gpu]"
MALFORMED_PODS: list[tuple[str, Callable[[dict[str, Any]], None], str]] = [
    ("annotations as a list",
     lambda p: p["metadata"].__setitem__("annotations", ["gpuplan.io/gpu-type"]),
     "metadata.annotations"),
    ("annotations as a string",
     lambda p: p["metadata"].__setitem__("annotations", "gpuplan.io/gpu-type=x"),
     "metadata.annotations"),
    ("metadata as a number", lambda p: p.__setitem__("metadata", 7), "metadata"),
    ("spec as a string", lambda p: p.__setitem__("spec", "x"), "spec"),
    ("containers as a string", _spec("containers", "trainer"), "spec.containers"),
    ("initContainers [null]", _spec("initContainers", [None]), "spec.initContainers[0]"),
    ("a container as a list", _spec("containers", [["trainer"]]), "spec.containers[0]"),
    ("resources as a list",
     lambda p: p["spec"]["containers"][0].__setitem__("resources", [1]),
     "spec.containers[0].resources"),
    ("requests as a string",
     lambda p: p["spec"]["containers"][0].__setitem__("resources", {"requests": "gpu=1"}),
     "spec.containers[0].resources.requests"),
    ("overhead as a list", _spec("overhead", ["nvidia.com/gpu"]), "spec.overhead"),
    ("gpu quantity '²' (isdigit, not int)", _limits("²"), LIMIT),
    ("gpu quantity in Arabic-Indic digits", _limits("٣"), LIMIT),
    ("gpu quantity of 5,000 digits", _limits("9" * 5000), LIMIT),
    ("gpu quantity 10**30", _limits(10**30), LIMIT),
    ("gpu quantity fractional", _limits("1500m"), LIMIT),
    ("gpu quantity a float", _limits(1.5), LIMIT),
    ("gpu quantity a boolean", _limits(True), LIMIT),
    ("gpu quantity negative", _limits(-2), LIMIT),
    ("gpu quantity an object", _limits({"value": 1}), LIMIT),
    ("gpu quantity nested 400 deep", _limits(_deep(400)), LIMIT),
    ("gpu-count '²'", _note("gpuplan.io/gpu-count", "²"), "gpuplan.io/gpu-count"),
    ("gpu-count of 5,000 digits", _note("gpuplan.io/gpu-count", "9" * 5000),
     "gpuplan.io/gpu-count"),
    ("gpu-count 10**7", _note("gpuplan.io/gpu-count", str(10**7)), "gpuplan.io/gpu-count"),
    ("gpu-count a number", _note("gpuplan.io/gpu-count", 4), "gpuplan.io/gpu-count"),
    ("gpu-count a list", _note("gpuplan.io/gpu-count", ["4"]), "gpuplan.io/gpu-count"),
    ("gpu-type a number", _note("gpuplan.io/gpu-type", 100), "gpuplan.io/gpu-type"),
    ("gpu-type of 256 KiB", _note("gpuplan.io/gpu-type", "H" * 262144), "gpuplan.io/gpu-type"),
    ("gpu-type blank", _note("gpuplan.io/gpu-type", " \t"), "gpuplan.io/gpu-type"),
]


@pytest.mark.parametrize(("mutate", "field"), [(m, f) for _, m, f in MALFORMED_PODS],
                         ids=[case for case, _, _ in MALFORMED_PODS])
def test_malformed_managed_pod_is_filtered_out_naming_the_field(
    mutate: Callable[[dict[str, Any]], None], field: str
) -> None:
    pod = _managed()
    mutate(pod)
    status, body = post("filter", args_for(pod))
    assert status == 200
    assert_filtered_out(body, field)
    status, scores = post("prioritize", args_for(pod))
    assert status == 200
    assert scores == [{"Host": n, "Score": 0} for n in NODES]  # as unmanaged: no influence


def test_malformed_pod_is_filtered_in_full_nodes_mode_too() -> None:
    pod = _managed()
    pod["spec"]["initContainers"] = [None]
    nodes = [builders.make_node("h100-0", H100, 8), builders.make_node("l4-0", L4, 4)]
    status, body = post("filter", builders.extender_args_full(pod, nodes))
    assert status == 200
    assert body["Nodes"] == {"items": []} and body["NodeNames"] is None
    assert set(body["FailedAndUnresolvableNodes"]) == {"h100-0", "l4-0"}


def test_malformed_pod_filtered_even_before_the_inventory_synced() -> None:
    pod = _managed()
    pod["metadata"]["annotations"]["gpuplan.io/gpu-count"] = "²"
    status, body = post("filter", args_for(pod), source=StaticSource(None))
    assert status == 200
    assert_filtered_out(body, "gpuplan.io/gpu-count")


def test_huge_annotation_keeps_the_answer_small() -> None:
    """A 256 KiB annotation value is not echoed once per node (5,000 × 256 KiB = 1.3 GB)."""
    pod = _managed()
    pod["metadata"]["annotations"]["gpuplan.io/gpu-type"] = "Z" * 262144
    names = [f"n{i}" for i in range(5000)]
    ((status, _, data, _),) = exchange([("POST", "/extender/filter",
                                         json.dumps(args_for(pod, names)).encode(), {})])
    assert status == 200
    assert len(data) < 500 * len(names)


def test_unmanaged_pod_with_odd_spec_passes_untouched() -> None:
    """No gpuplan annotation: the extender has no opinion, whatever the spec holds (the
    scheduler's own plugins judge the pod)."""
    pod = builders.make_pod("plain", gpus=1)
    pod["spec"]["containers"] = "x"
    status, body = post("filter", args_for(pod))
    assert (status, body["NodeNames"], body["FailedAndUnresolvableNodes"]) == (200, NODES, {})


def test_numbers_python_cannot_read_inside_the_pod_do_not_fail_the_request() -> None:
    """A 5,000-digit JSON number (int() refuses > 4,300 digits) where the plan is read: filtered;
    anywhere else: ignored."""
    pod = _managed()
    pod["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "HUGE"}}
    pod["spec"]["priority"] = "HUGE"
    raw = json.dumps(args_for(pod)).replace('"HUGE"', "9" * 5000).encode()
    status, body = post("filter", raw)
    assert status == 200
    assert_filtered_out(body, "spec.containers[0].resources.limits[nvidia.com/gpu]")
    plain = builders.make_pod("plain", gpus=1)
    plain["spec"]["priority"] = "HUGE"
    raw = json.dumps(args_for(plain)).replace('"HUGE"', "1" + "0" * 5000).encode()
    assert post("filter", raw)[0] == 200


# -- malformed request bodies: the JSON error envelope, 400 / 422 ------------------------------


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"{not json", "request body is not JSON"),
        (b"", "request body is not JSON"),
        (b"\xff\xfe{}", "not UTF-8"),
        (b'{"Pod": {"metadata": {"name": "\xc3\x28"}}, "NodeNames": []}', "not UTF-8"),
        (b'{"Pod": {}, "NodeNames": [], "x": NaN}', "NaN is not JSON"),
        (b'{"Pod": {}, "NodeNames": [], "x": -Infinity}', "-Infinity is not JSON"),
        (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
        (b'{"Pod": ' + b'{"a": ' * 50_000 + b"1" + b"}" * 50_001, "nested too deeply"),
        (b"\xef\xbb\xbf{}", "request body is not JSON"),
    ],
    ids=["truncated", "empty", "not-utf8", "bad-utf8-in-string", "nan", "infinity",
         "deep-arrays", "deep-pod", "bom"],
)
def test_bodies_that_are_not_json_get_400(raw: bytes, message: str) -> None:
    for verb in ("filter", "prioritize"):
        status, body = post(verb, raw)
        assert status == 400
        assert message in assert_envelope(body, "InvalidJSON")["message"]


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ([1, 2], "$"),
        ("just a string", "$"),
        (None, "$"),
        ({}, "Pod"),
        ({"Pod": None, "NodeNames": []}, "Pod"),
        ({"Pod": [], "NodeNames": []}, "Pod"),
        ({"Pod": "pod", "NodeNames": []}, "Pod"),
        ({"Pod": {}, "NodeNames": None, "Nodes": None}, "NodeNames"),
        ({"Pod": {}, "NodeNames": "n1"}, "NodeNames"),
        ({"Pod": {}, "NodeNames": {"n1": True}}, "NodeNames"),
        ({"Pod": {}, "NodeNames": ["n1", 2]}, "NodeNames[1]"),
        ({"Pod": {}, "NodeNames": None, "Nodes": []}, "Nodes"),
        ({"Pod": {}, "NodeNames": None, "Nodes": {"items": "x"}}, "Nodes.items"),
        ({"Pod": {}, "NodeNames": None, "Nodes": {"items": [None]}}, "Nodes.items[0]"),
        ({"Pod": {}, "NodeNames": None, "Nodes": {"items": [{"metadata": []}]}},
         "Nodes.items[0].metadata.name"),
    ],
)
def test_bodies_of_the_wrong_shape_get_422_naming_the_field(data: Any, field: str) -> None:
    for verb in ("filter", "prioritize"):
        status, body = post(verb, json.dumps(data))
        assert status == 422
        error = assert_envelope(body, "InvalidRequest")
        assert error["message"].startswith(f"{field}: ")
        assert error["details"][0] == error["message"]


def test_every_bad_name_is_a_detail() -> None:
    status, body = post("filter", {"Pod": {}, "NodeNames": ["ok", 1, None, [], "ok2"]})
    assert status == 422
    assert assert_envelope(body, "InvalidRequest")["details"] == [
        "NodeNames[1]: expected a string, got number", "NodeNames[2]: expected a string, got null",
        "NodeNames[3]: expected a string, got array"]


def test_oversized_body_gets_413_envelope() -> None:
    big = args_for(_managed(), ["n" * 100] * 200)
    status, body = post("filter", big, settings=AppSettings(max_body_bytes=10_000))
    assert status == 413
    assert assert_envelope(body, "RequestTooLarge")["message"] == (
        "request body larger than 10000 bytes")


def test_body_size_is_capped_after_decompression() -> None:
    raw = gzip.compress(json.dumps(args_for(_managed(), ["n" * 100] * 2000)).encode())
    assert len(raw) < 10_000
    ((status, _, data, _),) = exchange(
        [("POST", "/extender/filter", raw, {"Content-Encoding": "gzip"})],
        settings=AppSettings(max_body_bytes=10_000))
    assert status == 413
    assert_envelope(json.loads(data), "RequestTooLarge")


def test_undecodable_content_encoding_gets_400_envelope() -> None:
    ((status, ctype, data, _),) = exchange(
        [("POST", "/extender/filter", b"not gzip at all", {"Content-Encoding": "gzip"})])
    assert status == 400 and ctype.startswith("application/json")
    assert_envelope(json.loads(data), "InvalidBody")


def test_unknown_path_and_wrong_method_get_json_404_and_405() -> None:
    (missing, wrong_method, get_filter) = exchange([
        ("GET", "/extender/nope", None, {}),
        ("PUT", "/extender/filter", b"{}", {}),
        ("GET", "/extender/prioritize", None, {}),
    ])
    assert missing[0] == 404 and missing[1].startswith("application/json")
    assert_envelope(json.loads(missing[2]), "NotFound")
    for status, ctype, data, headers in (wrong_method, get_filter):
        assert status == 405 and ctype.startswith("application/json")
        assert_envelope(json.loads(data), "MethodNotAllowed")
        assert headers["Allow"] == "POST"


# -- no input yields a 500 ----------------------------------------------------------------------

# Finite numbers only: json.dumps writes inf as `Infinity`, which is not JSON and is refused
# with a 400 (`decode_body`), as it should be; Go's encoder never sends it.
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=6) | st.sampled_from(["²", "٣", "8", "1500m", "-1", H100]),
    lambda children: st.lists(children, max_size=3)
    | st.dictionaries(st.sampled_from(["nvidia.com/gpu", "limits", "requests", "resources",
                                       "gpuplan.io/gpu-type", "gpuplan.io/gpu-count", "x"]),
                      children, max_size=3),
    max_leaves=12,
)
POD_KEYS = st.sampled_from(["metadata", "spec", "status"])
SPEC_KEYS = st.sampled_from(["containers", "initContainers", "overhead", "nodeName"])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(POD_KEYS, SPEC_KEYS, JSON_VALUES), min_size=1, max_size=3),
       st.sampled_from([True, False]))
def test_no_pod_content_gets_a_500(
    edits: list[tuple[str, str, Any]], annotate: bool
) -> None:
    pod = _managed() if annotate else builders.make_pod("p", gpus=1)
    for key, sub, value in edits:
        if key == "spec" and isinstance(pod.get("spec"), dict):
            pod["spec"][sub] = value
        elif key == "metadata" and isinstance(pod.get("metadata"), dict):
            pod["metadata"]["annotations"] = value
        else:
            pod[key] = value
    raw = json.dumps(args_for(pod)).encode()
    answers = exchange([("POST", "/extender/filter", raw, {}),
                        ("POST", "/extender/prioritize", raw, {})])
    for status, ctype, _, _ in answers:
        assert status == 200 and ctype.startswith("application/json")
    result = json.loads(answers[0][2])
    decided = len(result["NodeNames"]) + len(result["FailedNodes"]) + len(
        result["FailedAndUnresolvableNodes"])
    assert decided == len(NODES)
