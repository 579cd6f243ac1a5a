"""Every relative link in the committed write-ups (README.md, docs/*.md, experiments/**/*.md) points to a file or
folder that exists, so moving or deleting a file cannot silently break a report that cites it."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINK = re.compile(r"\[[^\]]*\]\(\s*([^)\s]+)(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^\s*(```|~~~)")
CODE_SPAN = re.compile(r"`[^`]*`")
EXTERNAL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")  # http:, https:, mailto:, ...


def write_ups() -> list[Path]:
    return sorted(
        [ROOT / "README.md", *(ROOT / "docs").glob("*.md"), *(ROOT / "experiments").glob("**/*.md")]
    )


def relative_links(text: str) -> list[tuple[int, str]]:
    """(line number, target) of each relative link outside code blocks and code spans, its #anchor dropped."""
    found, fenced = [], False
    for number, line in enumerate(text.splitlines(), start=1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if fenced:
            continue
        for target in LINK.findall(CODE_SPAN.sub("", line)):
            path = target.split("#", 1)[0]
            if path and not EXTERNAL.match(path):
                found.append((number, path))
    return found


def test_relative_links_are_found():
    text = "[a](b.md#x) `[c](d.md)` [e](https://x.org) [f](#g)\n```\n[k](l.md)\n```\n[m](../n/)"
    assert relative_links(text) == [(1, "b.md"), (5, "../n/")]


@pytest.mark.parametrize("path", write_ups(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(path):
    broken = [
        f"{path.relative_to(ROOT)}:{number}: {target}"
        for number, target in relative_links(path.read_text())
        if not (path.parent / target).exists()
    ]
    assert not broken, "links to missing files:\n" + "\n".join(broken)
