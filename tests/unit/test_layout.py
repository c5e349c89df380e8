"""Guards the repository layout: the top-level folders must never become packages."""

import configparser
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


ESTIMATOR_SUBPACKAGES = ("core", "devices", "graph", "step", "cost", "latency", "parallel",
                         "perfdb", "planning", "bench", "training", "evaluation", "interfaces")


def test_estimator_modules_live_in_subpackages() -> None:
    """The folder tree is the architecture: no module beside the facade at the top level."""
    top = ROOT / "estimator" / "gpuplan_estimator"
    assert sorted(p.name for p in top.glob("*.py")) == ["__init__.py"]
    assert {p.name for p in top.iterdir() if (p / "__init__.py").is_file()} == set(
        ESTIMATOR_SUBPACKAGES)


def _contract(name: str) -> configparser.SectionProxy:
    parser = configparser.ConfigParser()
    parser.read(ROOT / ".importlinter")
    return parser[f"importlinter:contract:{name}"]


def _layer_names(contract: configparser.SectionProxy) -> set[str]:
    return {name.strip() for line in contract["layers"].split("\n") if line.strip()
            for name in line.split("|")}


def _children(package: pathlib.Path) -> set[str]:
    """Modules and subpackages directly in `package` (what an exhaustive layers contract
    must name)."""
    return ({p.stem for p in package.glob("*.py") if p.name != "__init__.py"}
            | {p.name for p in package.iterdir() if (p / "__init__.py").is_file()})


def test_layers_contracts_are_exhaustive_and_name_the_tree() -> None:
    """The layers contracts name every subpackage or module of their container, and say
    `exhaustive` so lint-imports fails a new one that is not given its floor."""
    operator_root = ROOT / "operator" / "gpuplan_operator"
    expected = {"estimator-layers": set(ESTIMATOR_SUBPACKAGES),
                "operator-layers": _children(operator_root),
                "extender-layers": _children(operator_root / "extender")}
    for name, children in expected.items():
        contract = _contract(name)
        assert contract["exhaustive"] == "true", name
        assert _layer_names(contract) == children, name


def test_operator_purity_is_a_rule_over_packages() -> None:
    """"Pure" is every module under the `core` packages, not a list that a new module misses."""
    contract = _contract("operator-pure-core")
    sources = {s.strip() for s in contract["source_modules"].split("\n") if s.strip()}
    assert sources == {"gpuplan_operator.core", "gpuplan_operator.extender.core"}
    for source in sources:
        assert (ROOT / "operator" / source.replace(".", "/") / "__init__.py").is_file()
    assert {"kopf", "kubernetes", "aiohttp"} <= set(contract["forbidden_modules"].split())


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


def test_campaign_tools_sit_outside_the_test_helpers() -> None:
    """Campaigns (hack/campaigns) use the test helpers, never the other way round, and every
    `make` target that runs one names a module that is there."""
    import ast
    import re

    for path in sorted((ROOT / "tests" / "gpuplan_testing").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            assert not [n for n in names if n.split(".")[0] == "campaigns"], path.name
    run = re.findall(r"-m campaigns\.(\w+)", (ROOT / "Makefile").read_text(encoding="utf-8"))
    assert len(run) >= 6
    for name in run:
        assert (ROOT / "hack" / "campaigns" / f"{name}.py").is_file(), name


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
