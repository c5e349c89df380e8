"""docs/models.md's lists of supported and refused `model_type`s are the code's registries."""

from __future__ import annotations

import re

from gpuplan_estimator.graph import exporting
from gpuplan_testing.paths import REPO_ROOT

DOC = REPO_ROOT / "docs" / "models.md"


def _table_types(heading: str) -> set[str]:
    """The backquoted model_types in the first column of the table after `heading`."""
    text = DOC.read_text(encoding="utf-8")
    section = text[text.index(heading):]
    table = section[section.index("\n|"):]
    rows = []
    for line in table.splitlines()[1:]:
        if not line.startswith("|"):
            break
        rows.append(line)
    return {name for row in rows[2:] for name in re.findall(r"`([a-z0-9_]+)`",
                                                            row.split("|")[1])}


def test_written_architectures_are_the_documented_ones() -> None:
    assert _table_types("**Written from the config") == set(exporting.WRITTEN_MODEL_TYPES)


def test_refused_architectures_are_the_documented_ones() -> None:
    assert _table_types("**Refused at once, by name:**") == set(
        exporting.UNSUPPORTED_MODEL_TYPES)
