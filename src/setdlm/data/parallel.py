"""Where parallel decoding breaks: tasks whose answer positions depend hard on each other (docs/evaluation.md,
"The parallel-dependency suite"; ParallelBench, Kang et al., arXiv 2510.04767).

A decoder that commits several tokens in one step samples them from their marginals given what is already
committed, as if they were independent. That is harmless when every answer token is a function of the
prompt alone and the model knows it, and breaks when the answer has several valid completions whose tokens
must agree with each other. Four generated tasks span that range, each a prompt and an exact answer::

    copy: 3 1 4 1 5        ->  3 1 4 1 5         (every token is the prompt's token at one position)
    reverse: 3 1 4 1 5     ->  5 1 4 1 3         (the same, mirrored)
    sort: 3 1 4 1 5        ->  1 1 3 4 5         (each token depends on the whole list: counting)
    latin: B D A C         ->  B D A C           (a 4x4 Latin square with that first row: 24 valid
                               A C B D            answers, every cell constrained by its row and column)
                               C A D B
                               D B C A

``copy``, ``reverse`` and ``sort`` have one right answer, checked by exact match. ``latin`` has 24: an
answer is right when it is a Latin square over the four given symbols (each row and each column holds each
symbol once) whose first row is the given one, written in the layout above. Training completions of
``latin`` are drawn uniformly from the 24, so a model learns a distribution with real dependencies between
cells, the case where committing cells independently fails.

Splits as for the word problems (:mod:`setdlm.data.tasks`): an example belongs to ``train``, ``validation``
or ``test`` by a keyed hash of its prompt, so no test prompt is in any train set; ``seed`` only picks which
examples of a split are drawn, and a smaller draw is a prefix of a larger one. The built-in sources
``parallel`` (all four tasks) and ``parallel-copy`` ... ``parallel-latin`` (:mod:`setdlm.data.builtin`)
train on the train split; ``setdlm eval/bench --task parallel`` scores the test split.
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass
from functools import cache

from ..errors import UserError
from .tasks import _check_split, split_of

PARALLEL_TASKS = ("copy", "reverse", "sort", "latin")
LIST_LENGTHS = (4, 8)  # copy/reverse/sort: fewest and most items of a list (inclusive)
DIGITS = "0123456789"  # the items of copy/reverse/sort
SYMBOLS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"  # latin: the four symbols are distinct capitals
SIDE = 4  # latin: the square's side


@cache
def _latin_squares() -> tuple[tuple[tuple[int, ...], ...], ...]:
    """Every 4x4 Latin square over 0..3 whose first row is 0 1 2 3 (there are 24), in a fixed order."""
    first = tuple(range(SIDE))
    perms = list(itertools.permutations(range(SIDE)))
    out = []
    for rest in itertools.product(perms, repeat=SIDE - 1):
        rows = (first, *rest)
        if all(len({r[c] for r in rows}) == SIDE for c in range(SIDE)):
            out.append(rows)
    return tuple(out)


@dataclass(frozen=True)
class ParallelExample:
    """One example: the task, its items (the list, or the square's first row) and a completion (for ``latin``
    one of the valid squares; every one of them scores as right)."""

    task: str
    items: tuple[str, ...]
    completion: str  # what a model is trained to write

    @property
    def prompt(self) -> str:
        """What the model is given: ``"<task>: <items>\\n"``."""
        return f"{self.task}: {' '.join(self.items)}\n"

    @property
    def question(self) -> str:
        """The prompt without its newline (the split key, as a word problem's question)."""
        return self.prompt[:-1]

    def correct(self, prediction: str) -> bool:
        """Whether ``prediction`` (the completion, cut at EOS) answers the example exactly; surrounding
        whitespace is ignored."""
        text = prediction.strip()
        if self.task != "latin":
            return text == self.completion
        rows = [line.split(" ") for line in text.split("\n")]
        if len(rows) != SIDE or any(sorted(r) != sorted(self.items) for r in rows) or tuple(rows[0]) != self.items:
            return False
        return all(sorted(r[c] for r in rows) == sorted(self.items) for c in range(SIDE))

    def to_prompt_completion(self) -> dict:
        """The ``prompt`` / ``completion`` record that ``setdlm train`` reads (the prompt is never masked)."""
        return {"prompt": self.prompt, "completion": self.completion}

    def to_dict(self) -> dict:
        return {"task": self.task, **self.to_prompt_completion()}


def _answer(task: str, items: list[str], rng: random.Random) -> str:
    if task == "copy":
        return " ".join(items)
    if task == "reverse":
        return " ".join(reversed(items))
    if task == "sort":
        return " ".join(sorted(items))
    square = rng.choice(_latin_squares())  # the symbols of the first row relabel 0..3
    return "\n".join(" ".join(items[v] for v in row) for row in square)


def _draw(task: str, rng: random.Random) -> ParallelExample:
    if task == "latin":
        items = rng.sample(SYMBOLS, SIDE)
    else:
        items = [rng.choice(DIGITS) for _ in range(rng.randint(*LIST_LENGTHS))]
    return ParallelExample(task, tuple(items), _answer(task, items, rng))


def _check_tasks(tasks) -> tuple[str, ...]:
    tasks = (tasks,) if isinstance(tasks, str) else tuple(tasks)
    bad = [t for t in tasks if t not in PARALLEL_TASKS]
    if bad or not tasks or len(set(tasks)) != len(tasks):
        raise UserError(f"tasks must be distinct members of {', '.join(PARALLEL_TASKS)}, got {tasks}")
    return tasks


def parallel_split(split: str, n: int, *, tasks: str | tuple[str, ...] = PARALLEL_TASKS, seed: int = 0
                   ) -> list[ParallelExample]:
    """``n`` distinct examples of ``split``, the ``tasks`` in turn (example ``i`` is of task
    ``tasks[i % len(tasks)]``), deterministic in ``seed``; a smaller draw is a prefix of a larger one."""
    _check_split(split)
    tasks = _check_tasks(tasks)
    if not (isinstance(n, int) and n >= 0):
        raise UserError(f"n must be a non-negative integer, got {n!r}")
    rngs = {t: random.Random(f"setdlm-parallel:{seed}:{split}:{t}") for t in tasks}
    seen: set[str] = set()
    out: list[ParallelExample] = []
    for i in range(n):
        task = tasks[i % len(tasks)]
        for _ in range(1000 + 100 * n):
            ex = _draw(task, rngs[task])
            if ex.question not in seen and split_of(ex.question) == split:
                break
        else:
            raise UserError(f"only {len(out)} distinct {split} examples of {task!r} found; ask for fewer than n={n}")
        seen.add(ex.question)
        out.append(ex)
    return out
