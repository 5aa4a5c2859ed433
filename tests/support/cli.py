"""Running ``setdlm`` as a user does: in-process with its exit code and output, or as a child process on this
checkout's sources; the inputs and outputs those runs share (a text file, a PNG)."""

import importlib.util
import os
import struct
import sys
from pathlib import Path

from setdlm.cli import main
from setdlm.data import shakespeare_works

SRC = str(Path(__file__).resolve().parents[2] / "src")
STUDY = Path(__file__).resolve().parents[2] / "benchmarks" / "study"


def subprocess_env() -> dict:
    """Environment of a `python -m setdlm...` child: this checkout's sources, one thread."""
    return {**os.environ, "PYTHONPATH": SRC, "OMP_NUM_THREADS": "1"}


def run(args, capsys) -> tuple[int, str, str]:
    """``setdlm ARGS`` in-process: (exit code, stdout, stderr)."""
    capsys.readouterr()
    try:
        code = main(args)
    except SystemExit as e:  # argparse usage errors
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line_error(code, err, *needles):
    """Bad input ends the CLI with exit 2 and one ``setdlm ...: error: ...`` line naming the problem."""
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("setdlm") and "error:" in lines[0], err
    for n in needles:
        assert n in lines[0], (n, lines[0])


def write_hamlet(path: Path, chars: int) -> str:
    """The first ``chars`` characters of Hamlet (built-in corpus) as a text file; returns its path."""
    path.write_text(next(w for w in shakespeare_works() if w["title"] == "Hamlet")["text"][:chars], encoding="utf-8")
    return str(path)


def png_size(path) -> tuple[int, int]:
    """(width, height) from a PNG's signature and IHDR chunk; fails on anything that is not a PNG."""
    data = open(path, "rb").read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG signature"
    assert data[12:16] == b"IHDR"
    assert data[-8:-4] == b"IEND"
    return struct.unpack(">II", data[16:24])


def study_script(name: str):
    """The module of ``benchmarks/study/NAME.py`` (a script, not a package), loaded fresh."""
    spec = importlib.util.spec_from_file_location(name, STUDY / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # dataclasses look their module up by name
    spec.loader.exec_module(mod)
    return mod
