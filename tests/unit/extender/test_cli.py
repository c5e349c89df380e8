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
