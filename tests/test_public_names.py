"""The public names (``__all__`` of the package and its subpackages) import, and every ``setdlm.X`` the README
and docs/ name resolves to a module or an attribute of one."""

import importlib
import re
from pathlib import Path

import pytest

import setdlm

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("setdlm", "setdlm.data", "setdlm.decoding", "setdlm.serve")
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
REFERENCE = re.compile(r"(?<![\w/.-])setdlm(?:\.[A-Za-z_]\w*)+")
FILE_SUFFIXES = {"py", "md", "json", "jsonl", "txt", "png", "safetensors"}
MOVED = re.compile(r"<!-- moved-names\b.*?-->(.*?)<!-- /moved-names -->", re.S)


def _import(name: str):
    """The module ``name``; None when it needs an optional dependency that is not installed."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name and not e.name.startswith("setdlm"):
            return None
        raise


def resolve(ref: str) -> bool:
    """Whether ``setdlm.a.b.c`` is a module or an attribute chain below the longest module prefix."""
    parts = ref.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ModuleNotFoundError as e:
            if e.name and not e.name.startswith("setdlm"):
                pytest.skip(f"{ref} needs {e.name}")
            continue
        for attr in parts[i:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


@pytest.mark.parametrize("package", PACKAGES)
def test_every_public_name_imports(package):
    mod = _import(package)
    if mod is None:
        pytest.skip(f"{package} needs an optional dependency")
    assert mod.__all__ and len(set(mod.__all__)) == len(mod.__all__)
    missing = [n for n in mod.__all__ if not hasattr(mod, n)]
    assert not missing, f"{package}.__all__ names what it does not define: {missing}"
    ns: dict = {}
    exec(f"from {package} import *", ns)
    assert set(mod.__all__) <= set(ns)


def test_retired_aliases_are_gone():
    """One name per thing: the old aliases were retired (TransformerConfig, setdlm.decoding.applicable,
    setdlm.formats.loading.load)."""
    import setdlm.decoding
    import setdlm.model
    import setdlm.formats.pretrained

    assert not hasattr(setdlm.model, "ModelConfig") and not hasattr(setdlm, "ModelConfig")
    assert not hasattr(setdlm.decoding, "applicable_knobs") and setdlm.decoding.applicable
    assert not hasattr(setdlm.formats.pretrained, "load") and setdlm.load is setdlm.formats.loading.load


def test_resolver_finds_what_is_missing():
    assert resolve("setdlm.evaluation.evaluate_checkpoint") and resolve("setdlm.decoding.generate")
    assert not resolve("setdlm.schedules.identity_order") and not resolve("setdlm.nothing_here")


def _refs(text: str) -> set[str]:
    return {r for r in REFERENCE.findall(text) if r.rsplit(".", 1)[-1] not in FILE_SUFFIXES}


def moved_names(text: str) -> tuple[str, list[tuple[set[str], set[str]]]]:
    """``text`` without its ``<!-- moved-names -->`` tables, and each of their rows' (before, now) names."""
    rows = []
    for table in MOVED.findall(text):
        for line in table.splitlines():
            cells = line.split("|")
            if line.startswith("| ") and len(cells) >= 4 and (_refs(cells[1]) or _refs(cells[2])):
                rows.append((_refs(cells[1]), _refs(cells[2])))
    return MOVED.sub("", text), rows


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_docs_references_resolve(doc):
    """Every setdlm name resolves, except in a table of moved names, whose first column names what is gone
    (docs/architecture.md, "What moved"): those must not resolve, and what they became must."""
    text, moved = moved_names(doc.read_text(encoding="utf-8"))
    broken = [r for r in sorted(_refs(text) | {r for _, now in moved for r in now}) if not resolve(r)]
    assert not broken, f"{doc.name} names what does not exist: {broken}"
    alive = [r for before, _ in moved for r in sorted(before) if resolve(r)]
    assert not alive, f"{doc.name} says these moved, but they still exist: {alive}"


def test_a_moved_names_table_is_checked_both_ways():
    text = ("<!-- moved-names -->\n| before | now |\n|---|---|\n| `setdlm.evaluate` | `setdlm.evaluation.passes` |\n"
            "<!-- /moved-names -->\nsee `setdlm.load`")
    rest, rows = moved_names(text)
    assert _refs(rest) == {"setdlm.load"} and rows == [({"setdlm.evaluate"}, {"setdlm.evaluation.passes"})]
