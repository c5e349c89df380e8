"""One meaning per class name (issue #31): no two classes in the estimator, the operator or the
test helpers share a name, so a name read in a traceback, a log or a review says which one.

The few that still do are listed below, each pinned to the files that define it and with the
reason it stays; a new duplicate, a third definition, or a listed name that is no longer
duplicated fails."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

from gpuplan_testing.paths import REPO_ROOT

PACKAGES = ("estimator/gpuplan_estimator", "operator/gpuplan_operator", "tests/gpuplan_testing")

ALLOWED: dict[str, tuple[frozenset[str], str]] = {}


def class_homes(root: Path, packages: tuple[str, ...]) -> dict[str, set[str]]:
    """Class name -> the files (relative to `root`) under `packages` that define one of it."""
    homes: dict[str, set[str]] = defaultdict(set)
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
            for node in ast.walk(tree):
                if isinstance(node, ast.ClassDef):
                    homes[node.name].add(path.relative_to(root).as_posix())
    return homes


def duplicated(homes: dict[str, set[str]]) -> dict[str, set[str]]:
    """The names defined in more than one file."""
    return {name: files for name, files in homes.items() if len(files) > 1}


def test_no_two_classes_share_a_name_unless_listed_with_a_reason() -> None:
    found = duplicated(class_homes(REPO_ROOT, PACKAGES))
    unlisted = {name: sorted(files) for name, files in found.items() if name not in ALLOWED}
    assert not unlisted, f"give these classes distinct names (or merge them): {unlisted}"
    for name, (files, reason) in ALLOWED.items():
        assert reason.strip(), name
        assert found.get(name) == set(files), (
            f"{name}: defined in {sorted(found.get(name, ()))}, listed for {sorted(files)}; "
            "drop it from ALLOWED once it is unique")


def test_the_check_sees_a_duplicate(tmp_path: Path) -> None:
    # The walk must catch nested classes and names across packages, or the test above is vacuous.
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "one.py").write_text("class Outcome:\n    class Inner: ...\n")
    (tmp_path / "b" / "two.py").write_text("def f():\n    class Inner: ...\n")
    assert duplicated(class_homes(tmp_path, ("a", "b"))) == {"Inner": {"a/one.py", "b/two.py"}}
