"""README's usage lines say what the parser does: every `[--flag VALUE]` it shows for `generate`,
`serve` and `audit` is the flag's default (for `a|b|c`, the first choice), and every flag exists; the
--drafter help names every registered drafter kind."""

import re
from pathlib import Path

import pytest

from specdecode.cli import parser
from specdecode.drafters import KINDS

ROOT = Path(__file__).resolve().parents[1]


def usage(command: str) -> str:
    """The first usage entry of `specdecode COMMAND` in README's Usage block, continuation lines included."""
    block = re.search(r"## Usage\n\n```bash\n(.*?)```", (ROOT / "README.md").read_text(), re.S).group(1)
    lines = block.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"specdecode {command} "))
    entry = [lines[start]]
    for line in lines[start + 1 :]:
        if not line.startswith(" ") or line.lstrip().startswith("#"):
            break
        entry.append(line)
    return " ".join(entry)


def subparser(command: str):
    actions = parser()._subparsers._group_actions[0].choices  # noqa: SLF001 (argparse keeps them here)
    return actions[command]


def shown_defaults(command: str) -> list[tuple[str, str]]:
    """(flag, value) for each `[--flag VALUE]` of the entry whose value is not a placeholder."""
    pairs = re.findall(r"\[(--[a-z-]+) ([^\]\s]+)\]", usage(command))
    return [
        (flag, value) for flag, value in pairs if not re.fullmatch(r"[A-Z_]+|[A-Za-z]*\.json|F|P|M", value)
    ]


def same(shown: str, default) -> bool:
    if isinstance(default, bool):
        return False
    if isinstance(default, (int, float)):
        return float(shown) == float(default)
    return shown == str(default)


@pytest.mark.parametrize("command", ["generate", "serve", "audit"])
def test_readme_usage_defaults_are_the_parser_defaults(command):
    actions = {a.option_strings[0]: a for a in subparser(command)._actions if a.option_strings}  # noqa: SLF001
    shown = shown_defaults(command)
    assert len(shown) >= 5, usage(command)
    for flag, value in shown:
        assert flag in actions, f"README shows {flag} for {command}, the parser has no such flag"
        first = value.split("|")[0]
        first = first.split("[")[0]  # draft[:<model>] -> draft
        default = actions[flag].default
        if default is None:  # chosen at run time (--device: cuda when available)
            continue
        assert same(first, default), f"README: {command} {flag} {first}; parser default: {default!r}"


@pytest.mark.parametrize("command", ["generate", "serve", "bench"])
def test_drafter_help_names_every_kind(command):
    (action,) = [a for a in subparser(command)._actions if "--drafter" in a.option_strings]  # noqa: SLF001
    for kind in KINDS:
        assert re.search(rf"\b{kind}\b", action.help), f"{command} --drafter help lacks {kind}"
