#!/usr/bin/env python3
"""Point the old citations of the internal specification and design notes at docs/method.md.

Usage: ``python scripts/fix_citations.py [ROOT] [--check]`` (ROOT defaults to the repository holding this
script). Rewrites, in ``src/``, ``tests/``, ``benchmarks/``, ``docs/``, ``scripts/`` and ``README.md``:

* the specification's sections -> the same section of docs/method.md:
  ``(SPEC.md §3.1, §3.3; DESIGN.md §3)`` -> ``(docs/method.md §3.1, §3.3, §9.3)``;
* its numbered list of subtle details -> §7.n: ``pitfall 20``, ``SPEC pitfall 20``, ``§7 pitfall 18``,
  ``pitfalls 9–11`` -> ``§7.20``, ``§7.18``, ``§7.9–7.11``;
* the design notes' sections -> §9.n (docs/method.md §9 "How setdlm is organised" keeps their numbers).

Source files get plain text (``docs/method.md §4.10``); Markdown files get links with a path relative to
the file and GitHub's heading anchor (``[method.md §4.10](method.md#410-nfe-parallelism-throughput),
[§5](method.md#5-evaluation-protocol)``), plain text inside fenced code blocks. Every target section must
be a heading of docs/method.md, else the script stops before writing anything. Idempotent: rewritten
text holds none of the old forms. ``--check`` writes nothing and exits 1 when something would change.
At the end it lists any line that still mentions the old documents.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path

TARGETS = ("src", "tests", "benchmarks", "docs", "scripts", "README.md")
SUFFIXES = {".py", ".md", ".txt", ".rst", ".toml", ".cfg", ".yaml", ".yml", ".sh"}
SKIP_DIRS = {".git", ".venv", "venv", "__pycache__", ".pytest_cache", "build", "dist", "node_modules", "fixtures"}
METHOD = "docs/method.md"

# the old documents' names, spelled so that this file does not cite them itself
_S, _D, _P = "SP" + "EC", "DES" + "IGN", "it" + "falls?"
NUM = r"\d+(?:\.\d+)?"
RANGE = rf"{NUM}(?:–{NUM})?"
REF = re.compile(
    rf"(?P<pit>(?:{_S}(?:\.md)?[ ]+)?(?:§7[ ]+)?[Pp]{_P}[ ]+(?P<pn>{RANGE}))"
    rf"|(?P<src>{_S}|{_D})(?:\.md)?[ ]+§(?P<sn>{RANGE})"
    rf"|§(?P<cn>{RANGE})")
SEP = re.compile(r"[,;][ ]+")
# wording that only made sense in the old document
FIXUPS = (("docs/method.md §4.2 loop 1–6", "docs/method.md §4.2, steps 1–4"),)
LEFTOVER = re.compile(rf"{_S}|{_D}|[Pp]{_P[:-2]}")


def _shift(prefix: str, rng: str) -> str:
    """'9–11' with prefix '7.' -> '7.9–7.11'."""
    return "–".join(prefix + part for part in rng.split("–"))


def _target(m: re.Match, source: str) -> tuple[str, str]:
    """(section in docs/method.md, the source that a following bare §N inherits)."""
    if m.group("pit"):
        return _shift("7.", m.group("pn")), "S"
    if m.group("src"):
        source = "D" if m.group("src") == _D else "S"
        rng = m.group("sn")
    else:
        rng = m.group("cn")
    return (_shift("9.", rng) if source == "D" else rng), source


def find_runs(text: str):
    """Yield (start, end, [sections]) for every citation run: a cited ref (old document name or the
    numbered-detail word) followed by refs separated by ',' or ';'."""
    pos = 0
    while True:
        m = REF.search(text, pos)
        if m is None:
            return
        if m.group("cn") is not None:  # a bare § not preceded by a cited ref: not ours
            pos = m.end()
            continue
        start, source, sections = m.start(), "S", []
        sec, source = _target(m, source)
        sections.append(sec)
        end = m.end()
        while True:
            s = SEP.match(text, end)
            if s is None:
                break
            n = REF.match(text, s.end())
            if n is None:
                break
            sec, source = _target(n, source)
            sections.append(sec)
            end = n.end()
        yield start, end, list(dict.fromkeys(sections))
        pos = end


def github_slug(heading: str) -> str:
    s = heading.strip().lower()
    s = re.sub(r"[^\w\- ]", "", s)
    return s.replace(" ", "-")


def method_sections(root: Path) -> dict[str, str]:
    """Section number -> GitHub anchor of every numbered heading of docs/method.md."""
    out = {}
    for line in (root / METHOD).read_text(encoding="utf-8").splitlines():
        m = re.match(rf"^#{{2,4}} ({NUM})\.? ", line)
        if m:
            out[m.group(1)] = github_slug(line.lstrip("#"))
    return out


def render(sections: list[str], *, link: str | None, anchors: dict[str, str]) -> str:
    if link is None:
        return "docs/method.md " + ", ".join("§" + s for s in sections)
    parts = []
    for i, s in enumerate(sections):
        text = ("method.md §" if i == 0 else "§") + s
        parts.append(f"[{text}]({link}#{anchors[s.split('–')[0]]})")
    return ", ".join(parts)


def rewrite(text: str, path: Path, root: Path, anchors: dict[str, str], missing: list[str]) -> str:
    markdown = path.suffix == ".md"
    link = os.path.relpath(root / METHOD, path.parent).replace(os.sep, "/") if markdown else None
    out, fenced = [], False
    for line in text.splitlines(keepends=True):
        if markdown and line.lstrip().startswith("```"):
            fenced = not fenced
        pieces, last = [], 0
        for start, end, sections in find_runs(line):
            for s in sections:
                for part in s.split("–"):
                    if part not in anchors:
                        missing.append(f"{path.relative_to(root)}: §{part} ({line.strip()[:80]})")
            pieces += [line[last:start], render(sections, link=None if fenced else link, anchors=anchors)]
            last = end
        out.append("".join(pieces) + line[last:] if pieces else line)
    text = "".join(out)
    for old, new in FIXUPS:
        text = text.replace(old, new)
    return text


def files(root: Path):
    me = Path(__file__).resolve()
    for name in TARGETS:
        top = root / name
        if top.is_file():
            yield top
            continue
        if not top.is_dir():
            continue
        for dirpath, dirnames, filenames in os.walk(top):
            dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS and not d.endswith(".egg-info"))
            for f in sorted(filenames):
                p = Path(dirpath) / f
                if p.suffix in SUFFIXES and p.resolve() != me:
                    yield p


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("root", nargs="?", default=Path(__file__).resolve().parents[1], type=Path)
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 if anything would change")
    args = ap.parse_args(argv)
    root = args.root.resolve()
    if not (root / METHOD).is_file():
        sys.exit(f"{root / METHOD} not found: the citations' target must exist first")
    anchors = method_sections(root)
    changes, missing = {}, []
    for p in files(root):
        try:
            old = p.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        new = rewrite(old, p, root, anchors, missing)
        if new != old:
            changes[p] = new
    if missing:
        print("sections missing from docs/method.md:\n  " + "\n  ".join(missing), file=sys.stderr)
        return 2
    for p, new in changes.items():
        n = sum(a != b for a, b in zip(p.read_text(encoding="utf-8").splitlines(), new.splitlines()))
        print(f"{'would rewrite' if args.check else 'rewrote'} {p.relative_to(root)} ({n} lines)")
        if not args.check:
            p.write_text(new, encoding="utf-8")
    left = []
    for p in files(root):
        try:
            text = changes.get(p) or p.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        left += [f"{p.relative_to(root)}:{i}: {line.strip()}" for i, line in enumerate(text.splitlines(), 1)
                 if LEFTOVER.search(line)]
    if left:
        print("still mentioning the old documents (check by hand):\n  " + "\n  ".join(left))
    print(f"{len(changes)} files {'to rewrite' if args.check else 'rewritten'}, {len(left)} lines left")
    return 1 if (args.check and changes) else 0


if __name__ == "__main__":
    sys.exit(main())
