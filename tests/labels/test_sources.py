"""Text sources: the three-way document split, the held-out group that training refuses, and each loader's
cleaning on small trees built here (plus the real folders of this machine, where present)."""

import random
from pathlib import Path

import pytest

from lkv.labels import sources
from lkv.labels.prompts import DEFAULT_HELDOUT_FRACTION, split_by_document
from lkv.labels.sources import (
    BUILTIN_SOURCES,
    HELDOUT_SOURCES,
    IN_SOURCES,
    SOURCES,
    SPLITS,
    USER_SOURCES,
    document_split,
    make_source,
    pod_text,
    training_source,
)

IDS = [f"src/doc-{i}" for i in range(5000)]


def test_the_split_is_deterministic_disjoint_and_refines_the_training_prompts_split():
    sides = {doc: document_split(doc) for doc in IDS}
    assert sides == {doc: document_split(doc) for doc in reversed(IDS)}  # depends on the id alone
    counts = {split: sum(side == split for side in sides.values()) for split in SPLITS}
    assert sum(counts.values()) == len(IDS)  # each document on exactly one side
    assert 0.08 < counts["dev"] / len(IDS) < 0.12 and 0.08 < counts["heldout"] / len(IDS) < 0.12
    # what the training prompts hold out is exactly dev ∪ heldout: no trained-on document is evaluated
    _, held = split_by_document(IDS, DEFAULT_HELDOUT_FRACTION)
    assert held == {doc for doc, side in sides.items() if side != "train"}


def test_there_are_many_sources_of_several_kinds_and_a_heldout_group():
    assert len(SOURCES) >= 8 and len(HELDOUT_SOURCES) >= 3
    assert len({cls.kind for cls in SOURCES.values()}) >= 6
    assert set(BUILTIN_SOURCES) | set(USER_SOURCES) == set(SOURCES) and USER_SOURCES == ("text-folder",)
    assert BUILTIN_SOURCES == IN_SOURCES + HELDOUT_SOURCES and not set(IN_SOURCES) & set(HELDOUT_SOURCES)


@pytest.mark.parametrize("name", HELDOUT_SOURCES)
def test_training_refuses_every_heldout_source(name):
    with pytest.raises(ValueError, match=rf"'{name}' is in the held-out group.*no training prompt"):
        training_source(name)


@pytest.mark.parametrize("name", IN_SOURCES)
def test_training_takes_the_in_group_sources(name):
    assert training_source(name).name == name


def test_unknown_source_is_named():
    with pytest.raises(ValueError, match=r"unknown text source 'nope'; choose one of paul-graham-essays"):
        make_source("nope")


def test_a_missing_root_names_the_source_and_path(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"text source c-headers: no such folder .*absent"):
        make_source("c-headers", tmp_path / "absent").doc_ids()


def test_text_folder_reads_your_documents_and_names_its_missing_folder(tmp_path):
    root = tmp_path / "mine"
    (root / "notes").mkdir(parents=True)
    prose = "The harbour gate opens at dawn and closes at dusk. " * 8
    (root / "a.txt").write_text("    Indented and <kept> as written.\n" + prose)
    (root / "notes" / "b.md").write_text(
        "# Gate\n\nSee [the guide](https://x).\n\n```sh\nrm -rf /tmp/x\n```\n\n    code = 1\n" + prose
    )
    (root / "c.py").write_text("value = 1\n" * 40)  # not a text file
    (root / "tiny.txt").write_text("Too short to hold a needle.")  # under 200 bytes
    source = training_source("text-folder", root)  # the user's documents may train
    assert source.doc_ids() == ["text-folder/a.txt", "text-folder/notes/b.md"]
    assert source.document("text-folder/a.txt").text.startswith("    Indented and <kept>")
    assert source.document("text-folder/notes/b.md").text == "# Gate\nSee the guide.\n" + prose
    with pytest.raises(ValueError, match=r"text-folder reads your own documents .*roots: \{text-folder: <"):
        make_source("text-folder").doc_ids()
    # a table or list holds no sentence end: its words come in units of at most 64, so no unit overshoots a
    # haystack's length by thousands of tokens
    table = "| key | value |\n" + "".join(f"| row{i} | {i} |\n" for i in range(300))
    units = source.units(table)
    assert max(len(u.split()) for u in units) == 64 and " ".join(units) == " ".join(table.split())
    assert source.units(prose) == make_source("debian-copyright", root).units(prose)  # sentences as before


def dialogue_tree(root: Path, conversations: int) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    body = "".join(
        f"- - Hello number {i}, how is the weather today?\n  - It is   sunny and warm.\n  - {i}\n"
        for i in range(conversations)
    )
    (root / "small.yml").write_text(f"categories:\n- small\nconversations:\n{body}")
    return root


def test_dialogue_documents_are_conversations_with_alternating_speakers(tmp_path):
    source = make_source("chatterbot-dialogue", dialogue_tree(tmp_path / "d", 40))
    ids = source.doc_ids()
    assert len(ids) == 40 and ids[0] == "chatterbot-dialogue/small/0000"
    assert source.document(ids[3]).text == (
        "A: Hello number 3, how is the weather today?\nB: It is sunny and warm.\nA: 3\n"
    )
    assert sorted(d for split in SPLITS for d in source.doc_ids(split)) == ids
    dev = list(source.documents("dev"))
    assert [d.id for d in dev] == source.doc_ids("dev") and all(d.text.startswith("A: Hello") for d in dev)
    (tmp_path / "d" / "bad.yml").write_text("conversations: {a: 1}\n")
    with pytest.raises(ValueError, match=r"bad.yml: expected a list under 'conversations'"):
        make_source("chatterbot-dialogue", tmp_path / "d").doc_ids()


def test_pod_text_keeps_headings_and_prose_and_drops_code():
    pod = (
        "package Foo;\nsub bar { 1 }\n\n=head1 NAME\n\nFoo - does B<bold> things with C<< $x->y >>\n\n"
        "    my $code = 1;\n\n=item E<lt>tagE<gt>\n\nSee L<the manual|perlfunc> and L<perlop/Ops>.\n\n"
        "=cut\n\nsub baz { 2 }\n"
    )
    assert pod_text(pod) == (
        "NAME.\n\nFoo - does bold things with $x->y\n\n<tag>.\n\nSee the manual and perlop."
    )


def test_package_readmes_drop_code_badges_and_markup(tmp_path):
    info = tmp_path / "demo_pkg-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: Demo_Pkg\nVersion: 1.0\n\n"
        "[![build](https://x/badge.svg)](https://x)\n# Demo\n\nDemo does <b>useful</b> work, see "
        "[the docs](https://docs).\n\n```python\nimport demo\n```\n\n    indented = code\n   :alt: badge\n"
        "https://example.org\n"
    )
    source = make_source("package-readmes", tmp_path)
    assert source.doc_ids() == ["package-readmes/demo-pkg"]
    assert source.document("package-readmes/demo-pkg").text == (
        "# Demo\nDemo does  useful  work, see the docs."
    )


def test_file_sources_skip_small_files_and_read_gzip(tmp_path):
    import gzip

    docs = tmp_path / "doc"
    rng = random.Random(0)
    for name, entries in (("big", 100), ("tiny", 2)):
        (docs / name).mkdir(parents=True)
        (docs / name / "copyright").write_text("Copyright notice. " * entries)
        log = "".join(f"pkg (1.{i})\n\n\n\n  * fixed {rng.getrandbits(64):x}  \n" for i in range(entries))
        (docs / name / "changelog.Debian.gz").write_bytes(gzip.compress(log.encode()))
    assert make_source("debian-copyright", docs).doc_ids() == ["debian-copyright/big/copyright"]
    changelogs = make_source("debian-changelogs", docs)
    assert changelogs.doc_ids() == ["debian-changelogs/big/changelog.Debian.gz"]
    text = changelogs.document(changelogs.doc_ids()[0]).text
    assert text.startswith("pkg (1.0)\n\n  * fixed ") and "  \n" not in text and "\n\n\n" not in text


def test_man_pages_render_to_plain_text_and_skip_includes(tmp_path):
    import gzip
    import shutil

    if shutil.which("groff") is None:
        pytest.skip("groff is not installed")
    man1 = tmp_path / "man1"
    man1.mkdir()
    page = ".TH DEMO 1\n.SH NAME\ndemo \\- shows \\fBbold\\fR text\n.SH DESCRIPTION\nIt works.\n"
    (man1 / "demo.1.gz").write_bytes(gzip.compress(page.encode()))
    (man1 / "alias.1.gz").write_bytes(gzip.compress(b".so man1/demo.1\n"))
    (man1 / "gcloud_x.1.gz").write_bytes(gzip.compress(page.encode()))
    source = make_source("man-pages", tmp_path)
    assert source.doc_ids() == ["man-pages/man1/alias.1.gz", "man-pages/man1/demo.1.gz"]
    text = source.document("man-pages/man1/demo.1.gz").text
    assert " ".join(text.split()) == "NAME demo - shows bold text DESCRIPTION It works."
    assert source.document("man-pages/man1/alias.1.gz").text == ""


@pytest.mark.parametrize(
    "name", ["man-pages", "debian-copyright", "perl-pod", "c-headers", "debian-changelogs"]
)
def test_the_machine_sources_hold_dev_and_heldout_documents_with_text(name):
    source = make_source(name)
    if not source._default_root().exists():
        pytest.skip(f"{name}: this machine has no {source._default_root()}")
    for split in ("dev", "heldout"):
        ids = source.doc_ids(split)
        assert len(ids) >= 20, (split, len(ids))
        texts = [source.document(d).text for d in random.Random(0).sample(ids, 5)]
        assert sum(len(t.split()) for t in texts) > 500


def test_pydoc_topics_are_the_language_reference_prose():
    source = make_source(sources.PYDOC_SOURCE)
    assert source.group == "out" and len(source.doc_ids()) > 50
    assert "slicing" in source.document(f"{sources.PYDOC_SOURCE}/slicings").text
