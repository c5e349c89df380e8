"""Guards the repository layout: the top-level folders must never become packages."""

import operator
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_top_level_folders_are_not_packages() -> None:
    for folder in ("operator", "estimator"):
        assert (ROOT / folder).is_dir()
        assert not (ROOT / folder / "__init__.py").exists(), f"{folder}/__init__.py must not exist"


def test_stdlib_operator_is_not_shadowed() -> None:
    assert operator.__file__ is not None
    assert "site-packages" not in operator.__file__
    assert pathlib.Path(operator.__file__).parent != ROOT / "operator"
    assert operator.add(2, 3) == 5


ESTIMATOR_SUBPACKAGES = ("core", "devices", "graph", "step", "cost", "models", "planning",
                         "perfdb", "bench", "training", "evaluation", "interfaces")


def test_estimator_modules_live_in_subpackages() -> None:
    """The folder tree is the architecture: no module beside the facade at the top level."""
    top = ROOT / "estimator" / "gpuplan_estimator"
    assert sorted(p.name for p in top.glob("*.py")) == ["__init__.py"]
    assert {p.name for p in top.iterdir() if (p / "__init__.py").is_file()} == set(
        ESTIMATOR_SUBPACKAGES)


def _import_cycles(*packages: str) -> list[list[str]]:
    """Strongly connected components (size > 1) of the module import graph (Tarjan)."""
    import grimp  # import-linter's graph builder: real imports, including function-level ones

    graph = grimp.build_graph(*packages)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for imported in graph.find_modules_directly_imported_by(module):
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in on_stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == module:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for module in sorted(graph.modules):
        if module not in index:
            visit(module)
    return cycles


def test_no_import_cycles() -> None:
    """import-linter's layers catch imports between subpackages; this catches circles inside."""
    assert _import_cycles("gpuplan_estimator", "gpuplan_operator") == []


def test_cycle_finder_sees_a_cycle(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pkg = tmp_path / "cyclic_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from cyclic_pkg import b\n")
    (pkg / "b.py").write_text("def f():\n    from cyclic_pkg import a\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert _import_cycles("cyclic_pkg") == [["cyclic_pkg.a", "cyclic_pkg.b"]]
