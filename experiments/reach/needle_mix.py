"""What the FullKV-solved needles of pooled folders are made of: per place (1K, near, far; far_kinds.py's
split), how many sit in each haystack, how many documents of each haystack their windows draw on, how many are
in a trained fact format, in prompts of each length and in a window that includes a given document, and the
range of their measured distance from the end of the prompt.

    python experiments/reach/needle_mix.py FOLDER[=NAME] [...] [--doc paul-graham-essays/worked] [--out FILE]

Places follow the nominal split (``meta["distance"]`` where the task placed needles by distance, else the
depth), so a needle's measured distance (``meta["needle_distance"]``, tokens before the question) can fall
outside its place's nominal range; the table shows the range to make that visible.
"""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path
from typing import Any

from analyze import solved_outcomes
from far_kinds import place
from strongest import merged


def mix_table(rows: list[dict[str, Any]], doc: str) -> list[str]:
    """Markdown: one line per place with the counts and the measured-distance range of its needles."""
    rows = [r for r in rows if r["setting"] == "aware" and "family" in r.get("meta", {})]
    solved, _, meta = solved_outcomes(rows)
    by_place: dict[str, list[dict[str, Any]]] = {}
    for key in solved:
        where = place(meta[key])
        if where:
            by_place.setdefault(where, []).append(meta[key])
    lines = [
        f"| place | n | haystacks | documents | trained formats | prompt lengths | windows with {doc} "
        "| tokens before the end |",
        "|---|---:|---|---|---:|---|---:|---|",
    ]
    for where, metas in sorted(by_place.items()):
        haystacks = Counter(m["haystack"] for m in metas)
        lengths = Counter(m["length"] for m in metas)
        trained = sum(m["distribution"] == "in-distribution" for m in metas)
        with_doc = sum(doc in m.get("docs", []) for m in metas)
        documents = {
            h: len({d for m in metas if m["haystack"] == h for d in m.get("docs", [])}) for h in haystacks
        }
        distances = [m["needle_distance"] for m in metas if "needle_distance" in m]
        span = f"{min(distances)}–{max(distances)}" if distances else "–"
        lines.append(
            f"| {where} | {len(metas)} | {', '.join(f'{h} {n}' for h, n in sorted(haystacks.items()))} | "
            f"{', '.join(f'{h} {n}' for h, n in sorted(documents.items()))} | {trained} | {', '.join(f'{k} ({n})' for k, n in sorted(lengths.items()))} | {with_doc} | {span} |"
        )
    return lines + [""]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("folders", nargs="+", help="lkv eval folders, FOLDER or FOLDER=NAME")
    parser.add_argument("--doc", default="paul-graham-essays/worked", help="a haystack document to count")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    text = "\n".join(mix_table(merged(args.folders), args.doc))
    if args.out:
        args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
