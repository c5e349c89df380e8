"""The CLI's conventions: --version, -o formats, exit codes, completion, durations, pictures."""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gpuplan_estimator import devices
from gpuplan_estimator.core import durations
from gpuplan_estimator.core.errors import DatabaseError, InvalidModelError
from gpuplan_estimator.core.extras import MissingExtraError
from gpuplan_estimator.cost import roofline
from gpuplan_estimator.graph import examples
from gpuplan_estimator.interfaces.cli import exits, main, output
from gpuplan_estimator.planning import estimates, ranking, rollup
from gpuplan_estimator.planning.planner import NoFeasiblePlanError
from gpuplan_estimator.step.decomposition import TrainingSettings

RESNET = examples.light_resnet50_path()
CRD = Path(__file__).parents[4] / "crds" / "trainingjobs.gpuplan.io.yaml"
ANSI_ESCAPE = re.compile(r"\x1b\[")


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main.main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_version_names_the_installed_distribution(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main.main(["--version"])
    from importlib import metadata

    assert exit_info.value.code == 0
    assert capsys.readouterr().out.strip() == f"gpuplan {metadata.version('gpuplan')}"


@pytest.mark.parametrize("fmt", ["json", "yaml"])
def test_documents_carry_schema_version_and_kind(fmt: str, capsys: pytest.CaptureFixture[str]
                                                 ) -> None:
    code, out, err = run(["estimate", str(RESNET), "--device", "t4", "--batch", "8", "-o", fmt],
                         capsys)
    assert code == 0, err
    doc = json.loads(out) if fmt == "json" else yaml.safe_load(out)
    assert doc["schema_version"] == output.SCHEMA_VERSION and doc["kind"] == "Estimate"
    assert doc["devices"][0]["device"] == "t4"
    code, out, _ = run(["strip", str(RESNET), "/dev/null", "-o", fmt], capsys)
    doc = json.loads(out) if fmt == "json" else yaml.safe_load(out)
    assert code == 0 and doc["kind"] == "Strip" and doc["source_bytes"] > 0


def test_a_piped_table_has_no_colour_no_padding_and_wide_adds_columns() -> None:
    columns = [output.Column("NAME"), output.Column("MS", numeric=True),
               output.Column("EXTRA", wide_only=True)]
    rows = [["a-very-long-device-name-" * 4, "1.5", "x"], ["b", "22.0", "y"]]
    narrow, wide = io.StringIO(), io.StringIO()
    output.render_table(columns, rows, wide=False, marked_row=0, stream=narrow)
    output.render_table(columns, rows, wide=True, stream=wide)
    for text in (narrow.getvalue(), wide.getvalue()):
        assert not ANSI_ESCAPE.search(text)  # not a terminal: no colour, not even bold
        assert all(line == line.rstrip() for line in text.splitlines())
        assert rows[0][0] in text  # never cut when piped
    assert "EXTRA" not in narrow.getvalue() and "EXTRA" in wide.getvalue()
    header, first, second = narrow.getvalue().splitlines()
    assert first.endswith("1.5") and second.endswith("22.0")  # numbers right-aligned
    assert header.index("MS") > header.index("NAME")


@pytest.mark.parametrize(("error", "code"), [
    (InvalidModelError("m.onnx: not ONNX"), exits.ExitCode.USAGE),
    (FileNotFoundError(2, "No such file", "m.onnx"), exits.ExitCode.USAGE),
    (NoFeasiblePlanError("no plan", [("t4", "too slow")]), exits.ExitCode.INFEASIBLE),
    (exits.InfeasibleError("fits nothing"), exits.ExitCode.INFEASIBLE),
    (DatabaseError("database unreachable"), exits.ExitCode.UNAVAILABLE),
    (MissingExtraError("pip install 'gpuplan[bench]'"), exits.ExitCode.UNAVAILABLE),
    (ConnectionRefusedError(111, "refused"), exits.ExitCode.UNAVAILABLE),
    (KeyError("bug"), exits.ExitCode.INTERNAL),
    (ImportError("a bug of ours, not a missing extra"), exits.ExitCode.INTERNAL),
])
def test_each_kind_of_failure_has_its_exit_code(error: BaseException, code: int) -> None:
    assert exits.for_error(error) == code


def test_the_exit_codes_are_the_documented_ones() -> None:
    documented = {int(n) for n in re.findall(r"^- (\d+):", exits.__doc__ or "", re.M)}
    assert documented == {int(c) for c in exits.ExitCode}
    assert all(str(int(c)) in main.EPILOG for c in exits.ExitCode)


def test_a_model_that_fits_no_device_prints_the_table_and_exits_3(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "gpuplan_estimator.interfaces.cli", "estimate", str(RESNET),
         "--device", "p4", "--batch", "4096", "--no-progress"],
        capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == exits.ExitCode.INFEASIBLE
    assert "p4" in proc.stdout and " NO " in proc.stdout  # the table says why
    assert proc.stderr.startswith("gpuplan: error: resnet50: the model fits none of the 1")


def test_an_internal_error_is_one_line_that_asks_for_a_report(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    def broken(_: object) -> int:
        raise ZeroDivisionError("boom")

    parser = main.build_parser(plugins=False)
    args = parser.parse_args(["strip", "a", "b"])
    args.func = broken
    monkeypatch.setattr(main, "build_parser", lambda **_: _FixedParser(args))
    code, _, err = run(["strip", "a", "b"], capsys)
    assert code == exits.ExitCode.INTERNAL
    assert err.strip() == ("gpuplan: error: internal error: ZeroDivisionError: boom (run again "
                           "with --debug for the traceback, and report it)")


class _FixedParser:
    def __init__(self, args: object) -> None:
        self.args = args

    def parse_args(self, _: object) -> object:
        return self.args


def test_bash_completion_knows_every_command_and_flag(capsys: pytest.CaptureFixture[str]
                                                      ) -> None:
    code, out, _ = run(["completion", "bash"], capsys)
    assert code == 0 and "complete" in out
    for word in ("estimate", "plan", "devices", "--prefer", "--deadline", "--output", "serve"):
        assert word in out


def test_bash_completes_device_names_from_the_catalog(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """#35: `gpuplan estimate m.onnx --device a10<TAB>` offers the catalog's a10* GPUs."""
    code, out, _ = run(["completion", "bash"], capsys)
    assert code == 0
    script = tmp_path / "gpuplan.bash"
    script.write_text(out)
    line = "gpuplan estimate m.onnx --device a10"
    shell = (f'source {script}; COMP_WORDS=({line}); COMP_CWORD=4; COMP_LINE="{line}"; '
             'COMP_POINT=${#COMP_LINE}; _shtab_gpuplan gpuplan a10 --device; '
             'printf "%s\\n" "${COMPREPLY[@]}"')
    done = subprocess.run(["bash", "-c", shell], capture_output=True, text=True, timeout=60)
    offered = set(done.stdout.split())
    expected = {d.key for d in devices.load_catalog().devices if d.key.startswith("a10")}
    assert offered == expected and "a100-sxm4-80gb" in offered


def test_durations_read_like_the_crd_rule_and_print_for_people() -> None:
    crd = CRD.read_text()
    rule = re.search(r"self\.matches\('(.+?)'\)", crd)
    assert rule is not None
    assert rule.group(1).replace("(", "(?:", 1) == durations.DURATION_PATTERN
    assert durations.parse_duration_seconds("1h30m") == 5400
    assert durations.parse_duration_seconds("2d") == 172800
    for bad in ("2 h", "1.5h", "h", "", "90", "1" * 100 + "s"):
        with pytest.raises(ValueError):
            durations.parse_duration_seconds(bad)
    shown = [durations.format_duration(s) for s in (0.25, 4.2, 42, 750, 12944.8, 90061, None)]
    assert shown == ["250 ms", "4.2 s", "42 s", "12m 30s", "3h 35m", "1d 01h", "-"]


def _estimates(keys: list[str]) -> tuple[estimates.DeviceStepEstimate, ...]:
    catalog = devices.load_catalog()
    from gpuplan_estimator import graph

    g = graph.load_at_batch(str(RESNET), 8, {})
    return estimates.estimate(g, [catalog.resolve(k) for k in keys], TrainingSettings(batch_size=8),
                              predictor=roofline.RooflinePredictor())


def test_unknown_prices_are_never_ranked_as_free() -> None:
    results = _estimates(["mi250x", "t4", "h100-sxm-80gb"])  # the mi250x has no catalog price
    cheapest = ranking.rank(results, "cheapest")
    assert cheapest[-1].device == "mi250x" and cheapest[-1].price_per_hour_usd is None
    rec = ranking.recommend(results, "cheapest")
    assert rec.device is not None and rec.device.device != "mi250x"
    assert "priced devices" in rec.reason
    fastest = ranking.rank(results, "fastest")
    assert [r.step_time_ms for r in fastest] == sorted(r.step_time_ms for r in results)
    only_unpriced = ranking.recommend(_estimates(["mi250x"]), "balanced")
    assert only_unpriced.device is not None and "none has a known price" in only_unpriced.reason


def test_layers_roll_up_by_exported_block_names() -> None:
    names = {"/layer1/layer1.0/conv1/Conv": "layer1",
             "transformer.h.6.mlp.act.pow": "transformer.h.6",
             "/bert/encoder/layer.3/attention/self/query/MatMul": "bert/encoder/layer.3",
             "/model/layers.11/self_attn/q_proj/MatMul": "model/layers.11",
             "blocks.4.attn.qkv": "blocks.4",
             "layer_norm_3": rollup.OUTSIDE_BLOCKS, "Conv_123": rollup.OUTSIDE_BLOCKS}
    assert {n: rollup.block_of(n) for n in names} == names
    layers = [estimates.LayerTimeEstimate(n, op, "x", fwd, bwd, 0.0, 0.0, "p")
              for n, op, fwd, bwd in (("h.0.a", "MatMul", 1.0, 2.0), ("h.0.b", "Add", 0.5, 0.5),
                                      ("h.1.a", "MatMul", 1.0, 2.0), ("head", "MatMul", 1.0, 0.0))]
    by_block = rollup.by_block(layers)
    assert [(g.name, g.layers, g.total_ms) for g in by_block] == [
        ("h.0", 2, 4.0), ("h.1", 1, 3.0), (rollup.OUTSIDE_BLOCKS, 1, 1.0)]
    assert sum(g.share for g in by_block) == pytest.approx(1.0)
    assert rollup.by_op_type(layers)[0].name == "MatMul"


def test_equal_blocks_are_listed_in_natural_order() -> None:
    """#35: twelve identical transformer layers read h.0, h.1, h.2, ..., h.10, h.11."""
    layers = [estimates.LayerTimeEstimate(f"/transformer/h.{i}/mlp/MatMul", "MatMul", "x", 1.0, 2.0,
                                      0.0, 0.0, "p") for i in (11, 2, 10, 0, 1, 3)]
    assert [g.name for g in rollup.by_block(layers)] == [
        "transformer/h.0", "transformer/h.1", "transformer/h.2", "transformer/h.3",
        "transformer/h.10", "transformer/h.11"]


def test_plot_writes_the_picture_the_extension_names(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    svg = tmp_path / "estimate.svg"
    code, _, err = run(["estimate", str(RESNET), "--device", "t4", "--device", "l4",
                        "--batch", "8", "--plot", str(svg), "-o", "json"], capsys)
    assert code == 0, err
    assert svg.read_text().lstrip().startswith(("<?xml", "<svg")) and "t4" in svg.read_text()
    html = tmp_path / "plan.html"
    code, _, err = run(["plan", str(RESNET), "--batch", "64", "--dataset-size", "64000",
                        "--pool", "t4=1x4", "--plot", str(html)], capsys)
    assert code == 0, err
    assert "<svg" in html.read_text() and "src=\"http" not in html.read_text()
    code, _, err = run(["estimate", str(RESNET), "--device", "t4", "--batch", "8", "--plot",
                        str(tmp_path / "x.gif")], capsys)
    assert code == exits.ExitCode.USAGE and "--plot" in err


def test_every_time_flag_takes_durations() -> None:
    parser = main.build_parser(plugins=True)
    serve = parser.parse_args(["serve", "--request-timeout", "2m", "--bundle-poll", "45"])
    assert (serve.request_timeout, serve.bundle_poll) == (120.0, 45.0)
    bench = parser.parse_args(["bench", "--budget-minutes", "1h30m"])
    assert bench.budget_minutes == 90.0
    evaluation = parser.parse_args(["eval", "--cpu-bench-minutes", "0", "--torch-bench-minutes",
                                    "2h"])
    assert (evaluation.cpu_bench_minutes, evaluation.torch_bench_minutes) == (0.0, 120.0)
    with pytest.raises(main.UsageError, match="duration like 90m"):
        parser.parse_args(["bench", "--budget-minutes", "soon"])


def test_the_readme_lists_every_exit_code() -> None:
    readme = (Path(__file__).parents[4] / "README.md").read_text()
    scripting = readme[readme.index("## Scripting"):]
    for code in exits.ExitCode:
        word = "success" if code == exits.ExitCode.OK else code.name.lower()
        assert re.search(rf"\b{int(code)} {word}", scripting), code
