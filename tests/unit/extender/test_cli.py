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

    from gpuplan_operator.extender.core.store import NODES, PODS, InventoryStore

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


def test_metrics_port_is_off_by_default_and_checked() -> None:
    assert (parse([]).metrics_port, parse([]).metrics_host) == (None, "0.0.0.0")
    settings = parse(["--metrics-port", "9101", "--metrics-host", "10.0.0.1"])
    assert (settings.metrics_port, settings.metrics_host) == (9101, "10.0.0.1")
    with pytest.raises(SystemExit, match="--metrics-port"):
        parse(["--metrics-port", "70000"])
    with pytest.raises(SystemExit, match="--metrics-port: must differ"):
        parse(["--port", "9101", "--metrics-port", "9101"])


class _UnreachableApi:
    """A CoreV1Api whose lists fail: the watcher backs off, the inventory never syncs."""

    def list_node(self, **_: object) -> object:
        raise ConnectionError("no API server in this test")

    list_pod_for_all_namespaces = list_node


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_metrics_port_serves_metrics_and_probes_but_not_the_verbs() -> None:
    """A real serve(): Prometheus and the kubelet get their paths on --metrics-port, while
    filter/prioritize answer only on the loopback --port."""
    import asyncio

    import aiohttp
    from prometheus_client import CollectorRegistry

    port, metrics_port = _free_port(), _free_port()
    settings = cli.ServeSettings(host="127.0.0.1", port=port, metrics_host="127.0.0.1",
                                 metrics_port=metrics_port)

    async def go() -> dict[str, int]:
        stop = asyncio.Event()
        server = asyncio.create_task(cli.serve(settings, _UnreachableApi(), CollectorRegistry(),
                                               stop))
        statuses: dict[str, int] = {}
        try:
            async with aiohttp.ClientSession() as http:
                for _ in range(100):  # until both listeners are up
                    try:
                        async with http.get(f"http://127.0.0.1:{metrics_port}/healthz") as r:
                            statuses["healthz"] = r.status
                            break
                    except aiohttp.ClientConnectionError:
                        await asyncio.sleep(0.05)
                async with http.get(f"http://127.0.0.1:{metrics_port}/metrics") as r:
                    statuses["metrics"] = r.status
                    assert "gpuplan_extender_request_duration_seconds" in await r.text()
                async with http.get(f"http://127.0.0.1:{metrics_port}/readyz") as r:
                    statuses["readyz"] = r.status  # never synced: 503, as on --port
                async with http.post(f"http://127.0.0.1:{metrics_port}/extender/filter",
                                     json={}) as r:
                    statuses["filter on metrics port"] = r.status
                async with http.post(f"http://127.0.0.1:{port}/extender/filter", json={}) as r:
                    statuses["filter on port"] = r.status
        finally:
            stop.set()
            await asyncio.wait_for(server, 10)
        return statuses

    assert asyncio.run(go()) == {"healthz": 200, "metrics": 200, "readyz": 503,
                                 "filter on metrics port": 404, "filter on port": 422}
