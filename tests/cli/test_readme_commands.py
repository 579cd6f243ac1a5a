"""Every `lkv ...` command that README.md shows parses with its verb's parser (`--print_config`): a
renamed option, verb or class path in the README fails here, not in a newcomer's shell."""

import contextlib
import io
import re
import shlex
from pathlib import Path

import pytest

from lkv.cli import main as lkv_main

README = Path(__file__).resolve().parents[2] / "README.md"
# `...` and ALL-CAPS words are placeholders the reader fills in; such lines are prose, not commands.
PLACEHOLDER = re.compile(r"\.\.\.|…|(?<![\w/.-])[A-Z]+(?:\.\w+)?(?![\w/.-])")


def readme_commands() -> list[str]:
    """`lkv` commands of the README's bash blocks (continuations joined) and inline code spans."""
    text = README.read_text()
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split(" #", 1)[0].strip()
            start = line.find("lkv ")
            if start >= 0 and (start == 0 or line[:start].split()[0] in ("srun", "torchrun")):
                commands.append(line[start:])
    commands += re.findall(r"`(lkv [a-z]+ --[^`]+)`", text)
    return sorted({c for c in commands if not PLACEHOLDER.search(c.replace("lkv ", "", 1))})


COMMANDS = readme_commands()


def test_the_readme_shows_commands_of_every_main_verb():
    verbs = {shlex.split(c)[1] for c in COMMANDS}
    assert {"label", "fit", "export", "generate"} <= verbs, verbs


@pytest.mark.parametrize("command", COMMANDS)
def test_each_readme_command_parses(command, monkeypatch, tmp_path):
    monkeypatch.chdir(README.parent)  # config paths in the README are relative to the checkout
    args = shlex.split(command)[1:]
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as exited:
        lkv_main([*args, "--print_config"])
    assert exited.value.code in (0, None), f"`{command}` did not parse:\n{out.getvalue()}"
