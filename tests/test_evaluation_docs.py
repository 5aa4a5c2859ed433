"""The commands and the Python example of docs/evaluation.md run as written, with shorter training and
fewer examples (``--steps 2``, ``--n 3``, ``--warmup 1``): every command exits 0 and writes what it says."""

import json
import re
import shlex
from pathlib import Path

import pytest

from setdlm.cli import main
from support import png_size

DOC = Path(__file__).parent.parent / "docs" / "evaluation.md"
SHORTER = {"--steps": "2", "--n": "3", "--warmup": "1"}


def _commands() -> list[list[str]]:
    text = DOC.read_text(encoding="utf-8")
    text = text[text.index("## Quick start"):text.index("## `setdlm eval`")]
    out = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            argv = shlex.split(line, comments=True)
            if argv and argv[0] == "setdlm":
                out.append([SHORTER.get(prev, a) for prev, a in zip([""] + argv[1:], argv[1:])])
    return out


def _python_blocks() -> list[str]:
    text = DOC.read_text(encoding="utf-8")
    text = text[text.index("## From Python"):text.index("## Splits")]
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


@pytest.mark.slow
def test_evaluation_guide_commands_and_example_run(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    commands = _commands()
    assert len(commands) == 10 and sum(c[0] == "bench" for c in commands) == 2
    for argv in commands:
        assert main(argv) == 0, argv
        out = capsys.readouterr().out
        if argv[0] == "eval":
            assert json.loads(out)["family"] in ("ar", "setdlm")
    for folder in ("bench-easy", "bench-infill"):
        assert (tmp_path / folder / "bench.md").is_file() and json.loads((tmp_path / folder / "bench.json").read_text())
        assert png_size(tmp_path / folder / "bench.png") == (1200, 450)
    assert (tmp_path / "preds.jsonl").is_file()
    (block,) = _python_blocks()
    exec(compile(block, f"{DOC.name} (From Python)", "exec"), {})
    assert png_size(tmp_path / "bench-py" / "bench.png") == (1200, 450)
