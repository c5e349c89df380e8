"""Command-line parsing of the extender and its `register(subparsers)` hook."""

from __future__ import annotations

import argparse

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
