"""The small trained models shipped inside the package (the embedded default).

They come from the reproduction study (``benchmarks/study``; ``benchmarks/RESULTS.md`` lists the command
that trained each) and are stored in bf16 under ``setdlm/pretrained/<name>/`` in the ordinary checkpoint
layout, so ``setdlm.load`` (:func:`setdlm.loading.load`) reads them by name like any other checkpoint:

======================================  ========================================================
``shakespeare-setdlm-smax8``            SetDLM S≤8 (D=4, M=8) on the built-in Shakespeare (BPE)
``shakespeare-bd3lm-s4``                BD3LM S=4, same data and budget
``shakespeare-ar``                      AR, same data and budget
``arith-setdlm-smax8``                  SetDLM S≤8 on the medium arithmetic word problems (characters)
``arith-bd3lm-s4`` / ``arith-ar``       the baselines of the same task
======================================  ========================================================

``setdlm generate`` and ``setdlm infill`` use ``shakespeare-setdlm-smax8`` when no checkpoint is given.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from .errors import UserError

DEFAULT = "shakespeare-setdlm-smax8"


def root() -> Path:
    return Path(str(resources.files("setdlm"))) / "pretrained"


def available() -> list[str]:
    r = root()
    return sorted(p.name for p in r.iterdir() if (p / "config.json").is_file()) if r.is_dir() else []


def path(name: str = DEFAULT) -> Path:
    """The folder of a shipped model; a clear error naming the choices when it is not there."""
    p = root() / name
    if not (p / "config.json").is_file():
        have = ", ".join(available()) or "none in this installation"
        raise UserError(f"no shipped model {name!r}; shipped models: {have}")
    return p

