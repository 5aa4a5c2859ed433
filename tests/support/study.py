"""The reproduction study's scripts (benchmarks/study/, not a package) loaded as modules for their tests."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

STUDY = Path(__file__).resolve().parents[2] / "benchmarks" / "study"


def load(name: str):
    """``benchmarks/study/<name>.py`` as a fresh module (the folder on ``sys.path`` while it imports its
    siblings, such as ``protocol``)."""
    sys.path.insert(0, str(STUDY))
    try:
        spec = importlib.util.spec_from_file_location(name, STUDY / f"{name}.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod
    finally:
        sys.path.remove(str(STUDY))


def flags(cmd: list[str]) -> dict[str, str]:
    """``--flag value`` pairs of a command line (a bare flag maps to the next word or ``""``)."""
    return {a: b for a, b in zip(cmd, cmd[1:] + [""]) if a.startswith("--")}
