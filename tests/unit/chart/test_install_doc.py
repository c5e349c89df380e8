"""docs/install.md stays true to the chart: its --set keys and values table name real values, its
alert table lists every alert with its runbook, its links resolve."""

from __future__ import annotations

import re
from typing import Any

import yaml

from gpuplan_testing.helm_render import CHART, ROOT

DOC = ROOT / "docs" / "install.md"
VALUES: dict[str, Any] = yaml.safe_load((CHART / "values.yaml").read_text())


def has_value(dotted: str) -> bool:
    """Whether values.yaml has the key path (a map's own keys, like labels.release, count as
    its entries)."""
    node: Any = VALUES
    for part in dotted.split("."):
        if not isinstance(node, dict):
            return False
        if part not in node:
            return node == {}  # a free-form map (labels: {}) takes any key
        node = node[part]
    return True


def test_set_flags_name_real_values() -> None:
    keys = re.findall(r"--set ([\w.\-]+)=", DOC.read_text())
    assert len(keys) >= 8
    assert [k for k in keys if not has_value(k)] == []


def test_values_table_names_real_values() -> None:
    rows = [line for line in DOC.read_text().splitlines() if line.startswith("| `")]
    for row in rows:
        first = row.split("|")[1]
        names = re.findall(r"`([\w.\-*]+)`", first)
        base = ""
        for name in names:
            full = name if not name.startswith(".") else base + name
            base = full.rsplit(".", 1)[0]
            if "*" not in full:
                assert has_value(full), f"{full} (in {row.strip()[:60]}) is not in values.yaml"


def test_alert_table_lists_every_alert_with_its_runbook() -> None:
    text = DOC.read_text()
    rules = yaml.safe_load((CHART / "files" / "alerts.yaml").read_text())
    names = [r["alert"] for g in rules["groups"] for r in g["rules"] if "alert" in r]
    for name in names:
        assert f"| [{name}](runbooks.md#{name.lower()}) |" in text, name


def test_relative_links_resolve() -> None:
    for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", DOC.read_text()):
        assert (DOC.parent / target).exists(), target
