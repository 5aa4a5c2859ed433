"""Every command and code block of README.md and docs/*.md runs as written.

The blocks of one file run top to bottom in a fresh folder: ```python blocks in one shared namespace,
```bash blocks line by line (``setdlm ...`` in-process, any other line in bash), ```console blocks line by
line too, each ``$ `` line's output compared with the lines under it. A block that is slow, downloads or
needs a GPU carries the marker ``<!-- docs-test: skip (why) -->`` on the line above its fence and is left
out; the marker must say why. Blocks of other languages (```text, plain ```) are listings, not code.
"""

import os
import re
import shlex
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from support import SRC, run

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", flags=re.S | re.M)
SKIP = re.compile(r"<!-- docs-test: skip \((.+?)\) -->\s*$")


def blocks(doc: Path) -> list[tuple[str, str, int, str | None]]:
    """(language, code, line number, skip reason or None) of every fenced block of ``doc``."""
    text = doc.read_text(encoding="utf-8")
    out = []
    for m in FENCE.finditer(text):
        before = text[: m.start()].rstrip("\n").rsplit("\n", 1)[-1]
        skip = SKIP.search(before)
        out.append((m.group(1), m.group(2), text.count("\n", 0, m.start()) + 1, skip.group(1) if skip else None))
    return out


def commands(code: str) -> list[str]:
    """The command lines of a shell block: continuations joined, comments and blank lines dropped."""
    lines = code.replace("\\\n", " ").splitlines()
    return [line for line in lines if line.strip() and not line.lstrip().startswith("#")]


def run_line(line: str, shim: Path, capsys) -> tuple[int, str]:
    """``setdlm ARGS`` in-process when the line is nothing else; otherwise bash, with ``setdlm`` on PATH."""
    argv = shlex.split(line, comments=True)
    if argv and argv[0] == "setdlm" and not set(argv) & {"|", ">", "<", "&&", ";"} and "|" not in line:
        code, out, err = run(argv[1:], capsys)
        return code, out + err
    env = {**os.environ, "PATH": f"{shim}:{os.environ['PATH']}", "PYTHONPATH": SRC}
    proc = subprocess.run(["bash", "-c", line], env=env, capture_output=True, text=True)
    return proc.returncode, proc.stdout + proc.stderr


def runnable() -> list:
    return [pytest.param(doc, id=str(doc.relative_to(ROOT))) for doc in DOCS
            if any(skip is None and lang in ("python", "bash", "console") for lang, _, _, skip in blocks(doc))]


def test_every_skip_marker_sits_on_a_code_block():
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        marked = sum(skip is not None for _, _, _, skip in blocks(doc))
        assert marked == len(re.findall(r"<!-- docs-test: skip", text)), doc


@pytest.mark.parametrize("doc", runnable())
def test_doc_blocks_run_as_written(doc, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    shim = tmp_path / ".bin"
    shim.mkdir()
    (shim / "setdlm").write_text(f"#!/bin/sh\nexec {sys.executable} -m setdlm \"$@\"\n")
    (shim / "setdlm").chmod(stat.S_IRWXU)
    namespace: dict = {}
    for lang, code, line, skip in blocks(doc):
        where = f"{doc.name}:{line}"
        if skip is not None:
            continue
        if lang == "python":
            exec(compile(code, where, "exec"), namespace)
        elif lang == "bash":
            for cmd in commands(code):
                rc, output = run_line(cmd, shim, capsys)
                assert rc == 0, f"{where}: {cmd}\n{output}"
        elif lang == "console":
            parts = re.split(r"^\$ ", code, flags=re.M)[1:]
            for part in parts:
                cmd, _, expected = part.partition("\n")
                rc, output = run_line(cmd, shim, capsys)
                assert output.strip() == expected.strip(), f"{where}: {cmd}"
