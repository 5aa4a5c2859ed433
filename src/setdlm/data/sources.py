"""Where text comes from: files, folders, JSONL, built-in corpora and Hugging Face datasets (docs/method.md §9.5).

A source spec is one string:

* a ``.txt`` (or any non-``.jsonl``) file: one document;
* a ``.jsonl`` file: one JSON object per line with ``text``, or ``prompt`` + ``completion``;
* a folder: every ``*.txt`` / ``*.md`` / ``*.jsonl`` file under it, recursively, in sorted order;
* a built-in corpus by name (``shakespeare``; see :mod:`setdlm.data.builtin`), offline;
* ``hf:NAME[:CONFIG][@SPLIT]``: a Hugging Face dataset (optional extra ``datasets``; downloads).

:func:`read_source` returns a :class:`~setdlm.data.corpus.Corpus`: either documents (language modelling) or
prompt/completion pairs (the prompt becomes context, docs/method.md §2.1–2.2). Files must be UTF-8; errors name the
file, the line and the problem. :func:`infill_from_source` draws sentence-infilling examples
(:mod:`setdlm.data.tasks`) from a source's running text.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import UserError
from .builtin import BUILTIN, load_builtin
from .corpus import Corpus
from .tasks import InfillExample, infill_examples

TEXT_SUFFIXES = (".txt", ".md")


def read_text_file(path: Path) -> str:
    """A whole file as UTF-8 text (line ends normalised); a clear error on bytes that are not UTF-8."""
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise UserError(f"{path}: not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start}, "
                        f"line {line})") from None
    return text.replace("\r\n", "\n")


def iter_jsonl(text: str, name: str):
    """``(line number, object)`` for each non-blank line; errors name ``name:line``."""
    for n, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            raise UserError(f"{name}:{n}: not valid JSON ({e.msg})") from None
        if not isinstance(rec, dict):
            raise UserError(f"{name}:{n}: expected a JSON object, got {type(rec).__name__}")
        yield n, rec


def read_jsonl(path: Path) -> Corpus:
    """One JSON object per line: ``{"text": ...}`` or ``{"prompt": ..., "completion": ...}``."""
    out = Corpus(name=str(path))
    for n, rec in iter_jsonl(read_text_file(path), str(path)):
        if "prompt" in rec or "completion" in rec:
            p, c = rec.get("prompt"), rec.get("completion")
            if not (isinstance(p, str) and isinstance(c, str)):
                raise UserError(f"{path}:{n}: 'prompt' and 'completion' must both be strings")
            out.pairs.append((p, c))
        elif "text" in rec:
            if not isinstance(rec["text"], str):
                raise UserError(f"{path}:{n}: 'text' must be a string, got {type(rec['text']).__name__}")
            out.texts.append(rec["text"])
        else:
            raise UserError(f"{path}:{n}: record has neither 'text' nor 'prompt'/'completion' (keys: {sorted(rec)})")
        if out.texts and out.pairs:
            raise UserError(f"{path}:{n}: mixes 'text' records with 'prompt'/'completion' records")
    return out


def read_path(path: Path) -> Corpus:
    """A file (``.jsonl`` or text) or a folder of them."""
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in TEXT_SUFFIXES + (".jsonl",))
        if not files:
            raise UserError(f"empty corpus: folder {str(path)!r} has no .txt, .md or .jsonl files")
        corpus = Corpus(name=str(path))
        for f in files:
            corpus.extend(read_path(f))
        return corpus
    if path.suffix == ".jsonl":
        return read_jsonl(path)
    return Corpus(texts=[read_text_file(path)], name=str(path))


def read_hf_dataset(spec: str) -> Corpus:
    """``NAME[:CONFIG][@SPLIT]`` from the Hugging Face Hub; uses ``text`` or ``prompt``/``completion``."""
    try:
        import datasets
    except ImportError:
        raise UserError(f"dataset 'hf:{spec}' needs the datasets package (pip install 'setdlm[datasets]')") from None
    name, _, split = spec.partition("@")
    name, _, config = name.partition(":")
    try:
        ds = datasets.load_dataset(name, config or None, split=split or "train")
    except Exception as e:
        raise UserError(f"could not load dataset 'hf:{spec}': {str(e).splitlines()[0]}") from None
    cols = set(ds.column_names)
    if {"prompt", "completion"} <= cols:
        return Corpus(pairs=list(zip(ds["prompt"], ds["completion"])), name=f"hf:{spec}")
    if "text" in cols:
        return Corpus(texts=list(ds["text"]), name=f"hf:{spec}")
    raise UserError(f"dataset 'hf:{spec}' has neither a 'text' nor 'prompt'/'completion' columns: {sorted(cols)}")


def read_source(spec: str) -> Corpus:
    """Resolve a source spec (see the module docstring). Raises ``ValueError`` on an empty corpus."""
    if not isinstance(spec, str) or not spec:
        raise UserError(f"data source must be a path, a built-in name or hf:NAME, got {spec!r}")
    if spec.startswith("hf:"):
        corpus = read_hf_dataset(spec[3:])
    elif Path(spec).exists():
        corpus = read_path(Path(spec))
    elif spec in BUILTIN:
        corpus = load_builtin(spec)
    else:
        raise UserError(f"data source {spec!r} is neither an existing file or folder nor a built-in corpus "
                        f"({', '.join(sorted(BUILTIN))})")
    if corpus.is_pairs:
        if all(not (p or c) for p, c in corpus.pairs):
            raise UserError(f"empty corpus: {spec!r} has only empty prompt/completion pairs")
    elif not any(t.strip() for t in corpus.texts):
        raise UserError(f"empty corpus: {spec!r} has no text")
    return corpus


def infill_from_source(source: str, split: str, n: int | None = None, **kwargs) -> list[InfillExample]:
    """:func:`~setdlm.data.tasks.infill_examples` over any text source of ``setdlm train --data``: a built-in
    corpus (``"shakespeare"``), a text file, a folder or a ``{"text"}`` JSONL; documents are joined by blank
    lines, so no window spans two of them."""
    corpus = read_source(source)
    if corpus.is_pairs:
        raise UserError(f"{source!r} holds prompt/completion pairs; infilling needs running text")
    return infill_examples("\n\n".join(corpus.texts), split, n, **kwargs)
