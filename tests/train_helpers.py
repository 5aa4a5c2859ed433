"""Shared pieces of the training, CLI and checkpoint tests."""

import os
from pathlib import Path

import pytest
import torch

from setdlm.data import shakespeare_works

SRC = str(Path(__file__).resolve().parents[1] / "src")


def subprocess_env() -> dict:
    """Environment of a `python -m setdlm...` child: this checkout's sources, one thread."""
    return {**os.environ, "PYTHONPATH": SRC, "OMP_NUM_THREADS": "1"}


def write_hamlet(path: Path, chars: int) -> str:
    """The first ``chars`` characters of Hamlet (built-in corpus) as a text file; returns its path."""
    path.write_text(next(w for w in shakespeare_works() if w["title"] == "Hamlet")["text"][:chars], encoding="utf-8")
    return str(path)


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny models gain nothing from a second thread, and lose a lot when other work shares the cores."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
