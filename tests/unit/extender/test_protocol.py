"""ExtenderArgs parsing and ExtenderFilterResult / HostPriorityList encoding."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gpuplan_operator.extender.core import protocol
from gpuplan_testing import extender_builders as builders


def test_parse_cache_capable_args() -> None:
    body = builders.extender_args(builders.make_pod("p", gpus=1), ["n1", "n2"])
    args = protocol.parse_args(body)
    assert args.node_names == ("n1", "n2")
    assert args.node_items is None
    assert args.pod_key == "default/p"


def test_parse_full_node_args() -> None:
    nodes = [builders.make_node("n1", "NVIDIA-L4", 4), builders.make_node("n2")]
    args = protocol.parse_args(builders.extender_args_full(builders.make_pod("p"), nodes))
    assert args.node_names == ("n1", "n2")
    assert args.node_items is not None and len(args.node_items) == 2


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ([], "$"),
        ("x", "$"),
        ({"Nodes": None, "NodeNames": []}, "Pod"),
        ({"Pod": [], "NodeNames": []}, "Pod"),
        ({"Pod": {}, "NodeNames": None, "Nodes": None}, "NodeNames"),
        ({"Pod": {}, "NodeNames": "n1"}, "NodeNames"),
        ({"Pod": {}, "NodeNames": ["n1", 2]}, "NodeNames[1]"),
        ({"Pod": {}, "NodeNames": None, "Nodes": []}, "Nodes"),
        ({"Pod": {}, "NodeNames": None, "Nodes": {"items": {}}}, "Nodes.items"),
        ({"Pod": {}, "NodeNames": None, "Nodes": {"items": [1]}}, "Nodes.items[0]"),
        ({"Pod": {}, "NodeNames": None, "Nodes": {"items": [{"metadata": {}}]}},
         "Nodes.items[0].metadata.name"),
    ],
)
def test_parse_rejects_wrong_shapes_naming_the_field(body: Any, field: str) -> None:
    with pytest.raises(protocol.ProtocolError) as info:
        protocol.parse_args(body)
    assert info.value.field == field
    assert str(info.value).startswith(f"{field}: ")


def test_parse_lists_every_bad_name_up_to_a_bound() -> None:
    with pytest.raises(protocol.ProtocolError) as info:
        protocol.parse_args({"Pod": {}, "NodeNames": ["a", 1, None, "b", *([2.5] * 30)]})
    assert info.value.field == "NodeNames[1]"
    assert info.value.details[:2] == ("NodeNames[1]: expected a string, got number",
                                      "NodeNames[2]: expected a string, got null")
    assert len(info.value.details) == protocol.MAX_REPORTED_ERRORS


@pytest.mark.parametrize(
    "pod",
    [{"metadata": "x"}, {"spec": 3}, {"metadata": {"annotations": []}}, {"metadata": None}],
)
def test_pod_content_is_not_the_protocols_business(pod: dict[str, Any]) -> None:
    """A Pod object of any content parses; `plans` judges what it holds (and never errors)."""
    args = protocol.parse_args({"Pod": pod, "NodeNames": ["n"]})
    assert args.pod is pod and args.node_names == ("n",)
    assert isinstance(args.pod_key, str)


@pytest.mark.parametrize(
    ("names", "plain"),
    [(["a", "b.example.com", "gke-x-1"], True), ([], True), (['we"ird'], False),
     (["back\\slash"], False), (["ünïcode"], False), (["new\nline"], False),
     (["tab\there"], False), (["\ud800"], False)],
)
def test_plain_names_flag(names: list[str], plain: bool) -> None:
    assert protocol.parse_args({"Pod": {}, "NodeNames": names}).plain_names is plain


def test_error_envelope_keeps_the_filter_result_keys() -> None:
    body = protocol.encode_error("InvalidRequest", "NodeNames: bad", ["NodeNames: bad"])
    assert body["error"] == {"reason": "InvalidRequest", "message": "NodeNames: bad",
                             "details": ["NodeNames: bad"]}
    assert body["Error"] == "NodeNames: bad" and body["NodeNames"] is None


def test_encode_filter_result_cache_capable_uses_names_and_go_keys() -> None:
    args = protocol.parse_args(builders.extender_args(builders.make_pod("p"), ["a", "b", "c"]))
    result = protocol.FilterResult(passed=("a",), failed={"b": "why"},
                                   failed_unresolvable={"c": "never"})
    assert protocol.encode_filter_result(result, args) == {
        "Nodes": None,
        "NodeNames": ["a"],
        "FailedNodes": {"b": "why"},
        "FailedAndUnresolvableNodes": {"c": "never"},
        "Error": "",
    }


def test_encode_filter_result_full_nodes_echoes_passing_items() -> None:
    nodes = [builders.make_node("a"), builders.make_node("b")]
    args = protocol.parse_args(builders.extender_args_full(builders.make_pod("p"), nodes))
    result = protocol.FilterResult(passed=("b",), failed={"a": "why"}, failed_unresolvable={})
    encoded = protocol.encode_filter_result(result, args)
    assert encoded["NodeNames"] is None
    assert encoded["Nodes"] == {"items": [nodes[1]]}


def test_encode_priorities_is_a_bare_array() -> None:
    assert protocol.encode_priorities([("a", 10), ("b", 0)]) == [
        {"Host": "a", "Score": 10}, {"Host": "b", "Score": 0}]


def test_encode_filter_error() -> None:
    encoded = protocol.encode_filter_error("boom")
    assert encoded["Error"] == "boom" and encoded["NodeNames"] is None


@pytest.mark.parametrize(
    "names",
    [["a", "b.example.com", "c-1"], ['we"ird', "back\\slash", "ünïcode", "new\nline"], [],
     ["tab\there", "\ud800", "ok"]],
)
def test_fast_serialisers_equal_json_dumps(names: list[str]) -> None:
    args = protocol.parse_args(builders.extender_args(builders.make_pod("p"), names))
    half = len(names) // 2
    result = protocol.FilterResult(
        passed=tuple(names[:half]),
        failed={n: 'free "GPUs"' for n in names[half:half + 1]},
        failed_unresolvable={n: "type X != planned Y" for n in names[half + 1:]},
    )
    assert json.loads(protocol.dumps_filter_result(result, args)) == (
        protocol.encode_filter_result(result, args))
    scores = [(n, i % 11) for i, n in enumerate(names)]
    assert json.loads(protocol.dumps_priorities(scores)) == protocol.encode_priorities(scores)


def test_fast_serialiser_falls_back_for_full_node_objects() -> None:
    nodes = [builders.make_node("a")]
    args = protocol.parse_args(builders.extender_args_full(builders.make_pod("p"), nodes))
    result = protocol.FilterResult(passed=("a",), failed={}, failed_unresolvable={})
    assert json.loads(protocol.dumps_filter_result(result, args))["Nodes"] == {"items": nodes}
