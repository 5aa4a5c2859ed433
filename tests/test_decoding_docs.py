"""The examples in docs/decoding.md run as written (one shared namespace, top to bottom)."""

import re
from pathlib import Path

DOC = Path(__file__).parent.parent / "docs" / "decoding.md"


def test_decoding_guide_examples_run():
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
    assert len(blocks) >= 6
    namespace: dict = {}
    for i, code in enumerate(blocks):
        exec(compile(code, f"{DOC.name} block {i}", "exec"), namespace)
