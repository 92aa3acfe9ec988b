"""Every flag of every command says what it does and, where it has one, its default
(``serve``'s flags belong to the server's owner and are left out)."""

from __future__ import annotations

import argparse

import pytest

from runtime.cli import build_parser

SKIP = {"serve"}


def _parsers(parser: argparse.ArgumentParser, name: str = "minivllm"):
    """(command name, parser) of every command and sub-command under ``parser``."""
    yield name, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub_name, sub in action.choices.items():
                if sub_name not in SKIP:
                    yield from _parsers(sub, f"{name} {sub_name}")


def _flags():
    for name, parser in _parsers(build_parser()):
        formatter = parser._get_formatter()
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction | argparse._SubParsersAction):
                continue
            if action.help == argparse.SUPPRESS:  # a hidden spelling (--no-x) of a documented flag
                continue
            label = max(action.option_strings, key=len) if action.option_strings else action.dest
            yield pytest.param(action, formatter, id=f"{name} {label}")


def _shown(default) -> str | None:
    """How the help should spell the default; None where there is none to show."""
    if default is None or default is False or default == []:
        return None
    if isinstance(default, list):
        return " ".join(map(str, default))
    return str(default)


@pytest.mark.parametrize(("action", "formatter"), list(_flags()))
def test_every_flag_has_help_with_its_default(action, formatter):
    assert action.help and action.help.strip()
    text = " ".join(formatter._expand_help(action).split())
    shown = _shown(action.default)
    if shown is not None:
        assert "default" in text and shown in text, text


def test_the_walk_sees_every_command():
    names = {name for name, _ in _parsers(build_parser())}
    assert {"minivllm simulate", "minivllm workload generate", "minivllm bench throughput",
            "minivllm cost-model eval", "minivllm demo"} <= names
    assert not any("serve" in n for n in names)
