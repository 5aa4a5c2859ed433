"""Requests read from files or stdin: prompts for :func:`setdlm.decoding.generate` and (prefix, suffix,
length) rows for :func:`setdlm.decoding.infill`, as ``setdlm generate --input`` / ``setdlm infill --input``
take them (docs/decoding.md). Bad input is a :class:`setdlm.errors.UserError` naming the file and line."""

from __future__ import annotations

import sys
from pathlib import Path

from ..errors import UserError
from .sources import iter_jsonl


def read_text(path: str, what: str = "input file", fields: tuple[str, ...] = ()) -> str:
    """A file's text, or stdin's for ``-``; a missing file, a folder or non-UTF-8 input is a ``UserError``
    naming the source (``what``; ``fields``: the argument names it uses, as :class:`UserError`'s)."""
    if path == "-":
        data, name = sys.stdin.buffer.read(), "<stdin>"
    else:
        p = Path(path)
        if p.is_dir():
            raise UserError(f"{what} {path!r} is a folder, not a file", fields=fields)
        if not p.is_file():
            raise UserError(f"{what} {path!r} does not exist", fields=fields)
        data, name = p.read_bytes(), path
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UserError(f"{name}: not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start})") from None


def read_prompts(prompts: list[str] | None = None, input: str | None = None) -> list[str]:
    """``prompts`` followed by those of the file ``input`` (``-``: stdin): one per non-blank line, or from a
    ``.jsonl`` file the string ``prompt`` of each object. At least one prompt (``""`` is unconditional)."""
    out = list(prompts or [])
    if input:
        text = read_text(input)
        if input.endswith(".jsonl"):
            for n, rec in iter_jsonl(text, input):
                if not isinstance(rec.get("prompt"), str):
                    raise UserError(f"{input}:{n}: expected an object with a string 'prompt'")
                out.append(rec["prompt"])
        else:
            out += [line for line in text.splitlines() if line.strip()]
    if not out:
        raise UserError("no prompts: pass prompt TEXT (\"\" for unconditional) or an input file; to read them from "
                        "stdin, one a line, pass input - (e.g. cat prompts.txt | setdlm generate --input -)",
                        fields=("prompt", "input"))
    return out


def read_infill_rows(prefix: str | None = None, suffix: str | None = None, length: int | None = None,
                     input: str | None = None) -> list[tuple[str, str, int]]:
    """``(prefix, suffix, length)`` rows: the one of ``prefix``/``suffix``/``length`` (``length`` required
    with either), then those of the JSONL file ``input`` (``-``: stdin), objects ``{prefix, suffix,
    length}``. At least one row; every length a positive integer."""
    rows = []
    if prefix is not None or suffix is not None or length is not None:
        if length is None:
            raise UserError("length is required with prefix/suffix", fields=("length", "prefix", "suffix"))
        rows.append((prefix or "", suffix or "", length))
    if input:
        for n, rec in iter_jsonl(read_text(input), input):
            if not (isinstance(rec.get("prefix", ""), str) and isinstance(rec.get("suffix", ""), str)
                    and isinstance(rec.get("length"), int)):
                raise UserError(f"{input}:{n}: expected {{\"prefix\": str, \"suffix\": str, \"length\": int}}")
            rows.append((rec.get("prefix", ""), rec.get("suffix", ""), rec["length"]))
    if not rows:
        raise UserError("nothing to infill: pass prefix/suffix/length or an input file.jsonl",
                        fields=("prefix", "suffix", "length", "input"))
    for i, (_, _, n) in enumerate(rows):
        if n < 1:
            raise UserError(f"infill length must be a positive integer, got {n} (row {i})")
    return rows
