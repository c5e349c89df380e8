"""Command-line parsing of the extender and its `register(subparsers)` hook."""

from __future__ import annotations

import argparse
import pathlib
import subprocess
import sys
from importlib import metadata

import pytest

from gpuplan_operator.extender import cli


def parse(argv: list[str]) -> cli.ServeSettings:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers()
    cli.register(sub)
    args = parser.parse_args(["extender", *argv])
    assert args.func is cli.main_from_args
    return cli.settings_from_args(args)


def test_register_and_settings() -> None:
    settings = parse(["--kubeconfig", "/k", "--port", "9999", "--stale-after-seconds", "30",
                      "--resync-seconds", "300", "--watch-timeout-seconds", "10"])
    assert (settings.kubeconfig, settings.port, settings.host) == ("/k", 9999, "127.0.0.1")
    assert settings.app.stale_after_s == settings.watch.stale_after_s == 30.0
    assert settings.watch.resync_every_s == 300.0 and settings.watch.watch_timeout_s == 10
    assert settings.app.max_body_bytes == 8 * 1024 * 1024


@pytest.mark.parametrize(
    ("argv", "message"),
    [(["--port", "0"], "--port"), (["--stale-after-seconds", "0"], "--stale-after-seconds"),
     (["--max-body-bytes", "-1"], "--max-body-bytes")],
)
def test_bad_arguments_name_the_flag(argv: list[str], message: str) -> None:
    with pytest.raises(SystemExit, match=message):
        parse(argv)


def test_gc_freeze_is_on_from_the_command_line_and_off_when_embedded() -> None:
    assert parse([]).freeze_gc is True
    assert parse(["--no-gc-freeze"]).freeze_gc is False
    assert cli.ServeSettings().freeze_gc is False


def test_gc_is_frozen_once_the_inventory_synced() -> None:
    import asyncio
    import gc

    from gpuplan_operator.extender.store import NODES, PODS, InventoryStore

    inventory = InventoryStore(lambda: 0.0)

    async def go() -> int:
        task = asyncio.create_task(cli._freeze_gc_after_sync(inventory, poll_s=0.01))
        await asyncio.sleep(0.05)
        assert not task.done()  # still waiting for the first sync
        inventory.replace(NODES, [])
        inventory.replace(PODS, [])
        await asyncio.wait_for(task, 5)
        return gc.get_freeze_count()

    try:
        assert asyncio.run(go()) > 0
    finally:
        gc.unfreeze()


SCRIPT = pathlib.Path(sys.executable).with_name("gpuplan-extender")


def test_the_command_line_parser_gives_the_same_settings() -> None:
    args = cli.build_parser().parse_args(["--port", "9999", "--max-body-bytes", "1024"])
    settings = cli.settings_from_args(args)
    assert (settings.port, settings.app.max_body_bytes, settings.freeze_gc) == (9999, 1024, True)


def test_installed_script_help_names_it_and_explains_every_option() -> None:
    assert SCRIPT.is_file(), f"{SCRIPT} missing: pip install -e . into this venv"
    done = subprocess.run([str(SCRIPT), "--help"], capture_output=True, text=True, timeout=60,
                          check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: gpuplan-extender ")
    actions = [a for a in cli.build_parser()._actions if not isinstance(a, argparse._HelpAction)]
    assert [a.dest for a in actions if not (a.help or "").strip()] == []
    text = " ".join(done.stdout.split())  # argparse wraps lines at any space
    for action in actions:
        assert action.option_strings[0] in text
    for words in ("(default 8888)", "(default 127.0.0.1)", "BYTES", "(default 8388608 = 8 MiB)",
                  "--stale-after-seconds SECONDS", "(default 120)", "(default INFO)"):
        assert words in text


def test_installed_script_version_and_usage_error() -> None:
    version = subprocess.run([str(SCRIPT), "--version"], capture_output=True, text=True,
                             timeout=60, check=False)
    assert (version.returncode, version.stdout.strip()) == (
        0, f"gpuplan-extender {metadata.version('gpuplan')}")
    bad = subprocess.run([str(SCRIPT), "--bogus"], capture_output=True, text=True, timeout=60,
                         check=False)
    assert bad.returncode == 2 and "gpuplan-extender: error: unrecognized arguments" in bad.stderr


def test_python_m_names_the_same_program() -> None:
    done = subprocess.run([sys.executable, "-m", "gpuplan_operator.extender", "--help"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0 and done.stdout.startswith("usage: gpuplan-extender ")
