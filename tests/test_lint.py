"""src/ passes ruff with the repository's configuration (pyproject.toml, [tool.ruff]: pycodestyle, pyflakes,
bugbear and pyupgrade, lines of at most 120 characters)."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_src_passes_ruff():
    pytest.importorskip("ruff", reason="ruff is part of the test extra: pip install -e '.[test]'")
    done = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "src"], cwd=ROOT, capture_output=True,
                          text=True)
    assert done.returncode == 0, done.stdout + done.stderr
