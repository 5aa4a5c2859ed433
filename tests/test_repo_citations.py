"""Citations in the repository point at docs/method.md, and every cited section exists there (never at
documents outside the repository)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
METHOD = ROOT / "docs" / "method.md"
SCANNED = ("src", "tests", "benchmarks", "docs", "README.md")
SUFFIXES = {".py", ".md", ".txt", ".rst", ".toml", ".cfg", ".yaml", ".yml"}
SKIP_DIRS = {"__pycache__", ".pytest_cache", "fixtures"}

# the old documents' names, spelled so that this file does not match them itself
OLD = re.compile(r"\b" + "SP" + r"EC\b|\b" + "DES" + r"IGN\b|[Pp]it" + "fall")
NUM = r"\d+(?:\.\d+)?"
RANGE = rf"{NUM}(?:–{NUM})?"
PLAIN = re.compile(rf"(?<!\[)(?:docs/)?method\.md (§{RANGE}(?:, §{RANGE})*)")
LINK = re.compile(rf"\[(?:method\.md )?§({RANGE})\]\(([^)#\s]*method\.md)#([^)\s]+)\)")
HEADING = re.compile(rf"^#{{2,4}} ({NUM})\.? ")


def _files():
    for name in SCANNED:
        top = ROOT / name
        if top.is_file():
            yield top
        elif top.is_dir():
            for p in sorted(top.rglob("*")):
                rel = p.relative_to(ROOT).parts
                if (p.is_file() and p.suffix in SUFFIXES and not SKIP_DIRS.intersection(rel)
                        and not any(part.endswith(".egg-info") for part in rel)):
                    yield p


def _slug(heading: str) -> str:
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _sections() -> dict[str, str]:
    out = {}
    for line in METHOD.read_text(encoding="utf-8").splitlines():
        m = HEADING.match(line)
        if m:
            out[m.group(1)] = _slug(line.lstrip("#"))
    return out


def _ends(rng: str) -> list[str]:
    return rng.split("–")


def test_no_citation_of_documents_outside_the_repository():
    hits = [f"{p.relative_to(ROOT)}:{i}: {line.strip()[:100]}"
            for p in _files() for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
            if OLD.search(line)]
    assert not hits, "cite docs/method.md instead:\n" + "\n".join(hits)


def test_method_sections_are_numbered_like_the_citations_expect():
    sections = _sections()
    for top in map(str, range(10)):
        assert top in sections, f"docs/method.md lacks section {top}"
    assert [s for s in sections if s.startswith("7.")] == [f"7.{i}" for i in range(1, 24)]
    assert len(set(sections.values())) == len(sections), "two headings share an anchor"


def test_every_cited_method_section_exists():
    sections = _sections()
    bad, seen = [], 0
    for p in _files():
        for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1):
            where = f"{p.relative_to(ROOT)}:{i}"
            for m in PLAIN.finditer(line):
                for rng in re.findall(rf"§({RANGE})", m.group(1)):
                    seen += 1
                    bad += [f"{where}: §{s}" for s in _ends(rng) if s not in sections]
            for m in LINK.finditer(line):
                seen += 1
                rng, target, anchor = m.groups()
                bad += [f"{where}: §{s}" for s in _ends(rng) if s not in sections]
                if (p.parent / target).resolve() != METHOD:
                    bad.append(f"{where}: link to {target} is not docs/method.md")
                elif _ends(rng)[0] in sections and anchor != sections[_ends(rng)[0]]:
                    bad.append(f"{where}: anchor #{anchor} of §{rng} should be #{sections[_ends(rng)[0]]}")
    assert not bad, "citations of missing sections of docs/method.md:\n" + "\n".join(bad)


def test_method_page_refers_only_to_its_own_sections():
    sections = _sections()
    text = METHOD.read_text(encoding="utf-8")
    refs = {s for rng in re.findall(rf"§({RANGE})", text) for s in _ends(rng)}
    assert refs and not refs - set(sections), sorted(refs - set(sections))
    assert not OLD.search(text)


@pytest.mark.parametrize("page", sorted(p.name for p in (ROOT / "docs").glob("*.md")))
def test_docs_link_to_method_page_anchors_that_exist(page):
    sections = set(_sections().values())
    text = (ROOT / "docs" / page).read_text(encoding="utf-8")
    for anchor in re.findall(r"\(method\.md#([^)\s]+)\)", text):
        assert anchor in sections, f"{page}: method.md#{anchor}"
