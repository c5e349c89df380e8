"""Every `gpuplan` command and option explains itself in `--help` (#20).

The walk covers the whole parser with every plugged-in command loaded, so an option added
without a help text fails here rather than reaching users as a bare ``--flag FLAG`` line.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator

import pytest

from gpuplan_estimator.interfaces.cli import main


def walk(parser: argparse.ArgumentParser, path: tuple[str, ...] = ("gpuplan",)
         ) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """Every parser under `parser` (itself first), with the command words that reach it."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield from walk(child, (*path, name))


def subcommand_helps(parser: argparse.ArgumentParser) -> dict[str, str | None]:
    """The one-line help of each subcommand `parser` has, by name."""
    return {choice.dest: choice.help for action in parser._actions
            if isinstance(action, argparse._SubParsersAction)
            for choice in action._choices_actions}


def options_without_help(parser: argparse.ArgumentParser) -> list[str]:
    """Arguments of `parser` (not -h/--help, not the subcommand slot) with no help text."""
    return ["/".join(a.option_strings) or a.dest for a in parser._actions
            if not isinstance(a, argparse._HelpAction | argparse._SubParsersAction)
            and (not a.help or not a.help.strip() or a.help == argparse.SUPPRESS)]


PARSERS = dict(walk(main.build_parser(plugins=True)))
COMMANDS = sorted(" ".join(path) for path in PARSERS if len(path) > 1)


def test_the_walk_reaches_every_command() -> None:
    names = {path[1] for path in PARSERS if len(path) > 1}
    assert names >= main.BUILTIN_COMMANDS | set(main.COMMAND_MODULES)


@pytest.mark.parametrize("path", list(PARSERS), ids=" ".join)
def test_every_option_has_help(path: tuple[str, ...]) -> None:
    assert options_without_help(PARSERS[path]) == []


@pytest.mark.parametrize("path", list(PARSERS), ids=" ".join)
def test_every_subcommand_has_a_help_line(path: tuple[str, ...]) -> None:
    helps = subcommand_helps(PARSERS[path])
    assert [name for name, text in helps.items() if not text or not text.strip()] == []


def test_the_check_fails_on_a_bare_option() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--documented", help="says what it does")
    parser.add_argument("--bare")
    parser.add_argument("--blank", help=" ")
    assert options_without_help(parser) == ["--bare", "--blank"]


@pytest.mark.parametrize("command", COMMANDS)
def test_help_of_each_command_exits_0_and_names_it(
        command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stop:
        main.main([*command.split()[1:], "--help"])
    out = capsys.readouterr().out
    assert stop.value.code == 0
    assert out.startswith(f"usage: {command}")
    for option in (o for a in PARSERS[tuple(command.split())]._actions for o in a.option_strings):
        assert option in out


@pytest.mark.parametrize(
    ("command", "option", "words"),
    [("serve", "--port", "(default 8080)"),
     ("serve", "--host", "(default 127.0.0.1)"),
     ("serve", "--max-body-bytes", "BYTES"),
     ("serve", "--bundle-poll", "a duration like 1m"),
     ("bench", "--budget-minutes", "a duration like 90m or 2h"),
     ("train", "--seed", "(default 0)"),
     ("eval", "--out-dir", "docs/")],
)
def test_help_names_defaults_and_units(command: str, option: str, words: str,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main.main([command, "--help"])
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines at any space
    start = text.index(f" {option} ", text.index("options:"))
    end = text.find(" --", start + len(option) + 2)
    assert words in text[start:end if end > 0 else None]
