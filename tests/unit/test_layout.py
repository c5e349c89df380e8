"""Guards the repository layout: the top-level folders must never become packages."""

import operator
import pathlib

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
