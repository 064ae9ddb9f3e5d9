"""Every ``modelyard`` subcommand's --help (issue 27, point 8): a description, examples of the command
itself, a usage line with no repeated positional (``[status] STUDY [[status] STUDY ...]``), and one flag
per setting (no ``--wait`` beside a ``--no-wait``)."""
from __future__ import annotations

import argparse
import re

import pytest

from modelyard.cli import build_parser, main


def _leaves(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """(command path, parser) of every parser under ``parser``, groups (``models``) and their actions."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if path:
        yield path, parser
    for action in subs:
        for name, sub in action.choices.items():
            yield from _leaves(sub, path + (name,))


COMMANDS = sorted(" ".join(path) for path, _ in _leaves(build_parser()))


def test_the_walk_covers_every_area():
    for command in ("serve", "inspect", "train", "launch", "convert", "platform", "models upload",
                    "endpoints predict", "jobs submit", "batch-predict", "tune", "web"):
        assert command in COMMANDS, COMMANDS


@pytest.mark.parametrize("command", COMMANDS)
def test_every_subcommand_has_a_description_examples_and_a_plain_usage(command, capsys):
    with pytest.raises(SystemExit) as done:
        main([*command.split(), "--help"])
    assert done.value.code == 0
    text = capsys.readouterr().out
    usage, _, rest = text.partition("\n\n")
    assert usage.startswith(f"usage: modelyard {command}"), usage
    assert not re.search(r"\[\[|\.\.\. \]\]|\]\s+\[\[", usage), f"a positional repeats in: {usage}"
    description = rest.split("\n\n")[0].strip()
    assert description and not description.startswith(("positional arguments", "options")), \
        f"`modelyard {command} --help` has no description"
    examples = text[text.index("\nexamples:\n"):] if "\nexamples:\n" in text else ""
    assert f"modelyard {command}" in examples, f"`modelyard {command} --help` shows no example of itself"


@pytest.mark.parametrize("command", COMMANDS)
def test_one_flag_per_setting(command):
    parser = dict((" ".join(path), p) for path, p in _leaves(build_parser()))[command]
    flags = {s for a in parser._actions for s in a.option_strings}
    for action in parser._actions:
        if isinstance(action, argparse.BooleanOptionalAction):
            continue  # --x / --no-x of one setting, as one action
        for flag in action.option_strings:
            if flag.startswith("--no-") and "--" + flag[len("--no-"):] in flags:
                raise AssertionError(f"`modelyard {command}` has both --{flag[5:]} and {flag}: keep one")


def _typo(flag: str) -> str:
    return flag[:-2] + flag[-1] + flag[-2]  # the last two letters swapped: --modle for --model


@pytest.mark.parametrize("command", COMMANDS)
def test_every_subcommand_names_the_flag_a_typo_meant(command, capsys):
    """`modelyard endpoints deploy 1 --modle x`: argparse stops at the missing --model; the typo is the reason."""
    parser = dict((" ".join(path), p) for path, p in _leaves(build_parser()))[command]
    flags = [s for a in parser._actions for s in a.option_strings
             if s.startswith("--") and s not in ("--help", "--verbose") and len(s) > 5]
    if not flags:
        return  # a group (`models`): its subcommands are walked
    flag = max(flags, key=len)
    with pytest.raises(SystemExit) as done:
        main([*command.split(), _typo(flag), "x"])
    assert done.value.code == 2
    assert f"{_typo(flag)}: did you mean {flag}?" in capsys.readouterr().err
