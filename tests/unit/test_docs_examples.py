"""`make docs` / `make verify` (#35): README.md's marked examples are run and kept current."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import docs_examples

ROOT = Path(__file__).resolve().parents[2]

STALE = """intro
<!-- make docs: greet lines=2 -->
```
$ printf 'one\\ntwo\\nthree\\n' > f.txt
$ cat f.txt | \\
    tr a-z A-Z
old output
```
after
"""


def test_marked_blocks_are_parsed_with_their_continuations() -> None:
    [example] = docs_examples.examples(STALE)
    assert example.name == "greet" and example.lines == 2
    assert example.commands == ("$ printf 'one\\ntwo\\nthree\\n' > f.txt",
                                "$ cat f.txt | \\\n    tr a-z A-Z")


def test_a_stale_block_is_rewritten_cut_and_then_checks_clean(tmp_path: Path) -> None:
    doc = tmp_path / "doc.md"
    doc.write_text(STALE)
    assert docs_examples.main(["--file", str(doc), "--check"]) == 1
    assert doc.read_text() == STALE  # --check writes nothing
    assert docs_examples.main(["--file", str(doc)]) == 0
    assert doc.read_text() == STALE.replace("old output\n", "ONE\nTWO\n…\n")
    assert docs_examples.main(["--file", str(doc), "--check"]) == 0


def test_the_readme_runs_its_examples_from_a_model_it_says_how_to_get() -> None:
    readme = docs_examples.examples(docs_examples.README.read_text())
    assert {e.name for e in readme} == {"estimate", "plan"}
    for example in readme:
        assert "resnet50.onnx'" in example.commands[0]  # written by the first command
        assert example.commands[1].startswith("$ gpuplan ")


def test_the_readme_install_line_installs_the_wheel_make_dist_builds() -> None:
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    text = docs_examples.README.read_text()
    block = re.search(r"## Install\n\n```\n(.*?)```", text, re.S)
    assert block is not None
    lines = [line.split("#")[0].strip() for line in block.group(1).splitlines()]
    assert lines[0] == "make dist"
    assert f"pip install dist/gpuplan-{version}-py3-none-any.whl" in lines
    assert lines[-1] == "gpuplan demo"
