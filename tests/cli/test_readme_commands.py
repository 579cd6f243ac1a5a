"""Every `lkv ...` command that README.md and the docs pages show parses with its verb's parser
(`--print_config`): a renamed option, verb or class path in the docs fails here, not in a newcomer's shell."""

import contextlib
import io
import re
import shlex
from pathlib import Path

import pytest

from lkv.cli import main as lkv_main

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = [README, *sorted((ROOT / "docs").glob("*.md"))]
# `...`, ALL-CAPS words and shell variables are placeholders the reader fills in; such lines are prose, not
# commands. So is an inline span that ends in an option's name (`lkv eval --batch_size`): it names the option.
PLACEHOLDER = re.compile(
    r"\.\.\.|…|\$\w|(?<![\w/.-])[A-Z]+(?:\.\w+)?(?![\w/.-])|\s--(?!print_config\b)[\w.]+$"
)


def doc_commands(path: Path) -> list[str]:
    """`lkv` commands of a markdown file's bash blocks (continuations joined) and inline code spans."""
    text = path.read_text()
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split(" #", 1)[0].strip()
            start = line.find("lkv ")
            if start >= 0 and (start == 0 or line[:start].split()[0] in ("srun", "torchrun")):
                commands.append(line[start:])
    commands += re.findall(r"`(lkv [a-z]+ --[^`]+)`", text)
    return sorted({c for c in commands if not PLACEHOLDER.search(c.replace("lkv ", "", 1))})


COMMANDS = [(path.relative_to(ROOT).as_posix(), command) for path in DOCS for command in doc_commands(path)]


def test_the_readme_shows_commands_of_every_main_verb():
    verbs = {shlex.split(c)[1] for c in doc_commands(README)}
    assert {"label", "fit", "export", "eval", "generate"} <= verbs, verbs


@pytest.mark.parametrize(("doc", "command"), COMMANDS, ids=[f"{d}: {c}" for d, c in COMMANDS])
def test_each_documented_command_parses(doc, command, monkeypatch):
    monkeypatch.chdir(ROOT)  # config paths in the docs are relative to the checkout
    args = shlex.split(command)[1:]
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as exited:
        lkv_main([*args, "--print_config"])
    assert exited.value.code in (0, None), f"{doc}: `{command}` did not parse:\n{out.getvalue()}"
