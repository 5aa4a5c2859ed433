"""The examples of a :class:`~setdlm.evaluation.spec.TaskSpec` that fit the models, and the
``--predictions`` file of a decoding evaluation (docs/evaluation.md).

Each task picks its own examples (``Task.examples``, in the task's file) with the helpers here: the first
``n`` of a pool that fit every model (:func:`fitting`), or generated examples drawn until ``n`` fit
(:func:`generated`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from ..errors import UserError
from ..lm import Model
from ..outputs import write_text
from .passes import fits
from .registry import get_task
from .spec import TaskSpec


def task_examples(spec: TaskSpec, models: Sequence[Model]) -> tuple[list, int]:
    """The examples of a decoding task that fit the context of every model, and how many were skipped:
    what the task's ``examples`` picks from ``spec`` (reasoning: ``spec.data`` a GSM8K-format JSONL, else
    ``n`` (default 200) generated problems of ``split`` at ``level`` drawn with ``seed``; parallel: ``n``
    (default 200) examples of the parallel-dependency suite; infill: windows of 5 sentences of ``data``
    (default ``shakespeare``) with ``hidden`` of them hidden, the first ``n`` that fit, all when None)."""
    examples = spec.entry.examples  # None exactly for the tasks that do not decode (registry.register)
    if examples is None:
        raise UserError(f"task {spec.task} has no examples to decode", fields=("task",))
    return examples(spec, models)


def _lengths(models: Sequence[Model]) -> str:
    return "/".join(sorted({str(m.family.length) for m in models}))


def fitting(pool: Iterable, models: Sequence[Model], limit: int | None, *, eos: bool = False,
            fit: Callable = fits) -> tuple[list, int]:
    """The first ``limit`` examples of ``pool`` (all when None) that ``fit`` every model, and how many were
    skipped on the way."""
    chosen, skipped = [], 0
    for e in pool:
        if all(fit(m, e, eos=eos) for m in models):
            chosen.append(e)
            if len(chosen) == limit:
                break
        else:
            skipped += 1
    return chosen, skipped


def generated(draw: Callable[[int], list], models: Sequence[Model], want: int, what: str, advice: str,
              fit: Callable = fits) -> tuple[list, int]:
    """``want`` generated examples that fit every model: ``draw(size)`` examples, the first ``want`` that fit,
    the draw doubled while too few fit (up to 8 × ``want``, then a ``UserError`` naming ``what`` was drawn
    and ``advice``)."""
    size = want
    while True:
        pool = draw(size)
        chosen, skipped = fitting(pool, models, want, fit=fit)
        if len(chosen) == want:
            return chosen, skipped
        if size >= 8 * want:
            raise UserError(f"only {len(chosen)} of {size} {what} fit the context length L={_lengths(models)}; "
                            f"{advice}")
        size *= 2


def from_pool(pool: Sequence, models: Sequence[Model], spec: TaskSpec, fit: Callable = fits) -> tuple[list, int]:
    """The first ``spec.n`` examples of ``pool`` (all when None) that fit every model; fewer than asked, or
    none, is a ``UserError`` naming ``n``."""
    n = spec.n
    chosen, skipped = fitting(pool, models, n, eos=spec.eos, fit=fit)
    if not chosen or (n is not None and len(chosen) < n):
        raise UserError(f"only {len(chosen)} of {len(pool)} {spec.task} examples fit the context length "
                        f"L={_lengths(models)}" + (f"; ask for n <= {len(chosen)}" if chosen else ""), fields=("n",))
    return chosen, skipped


def write_predictions(path: str | Path, examples: Sequence, result, task: str) -> Path:
    """One JSONL row per example, as ``task``'s ``prediction`` writes it: the question, answer, prediction and
    correctness (reasoning; the parallel suite with its task), or the prefix, suffix, reference middle and
    prediction (infilling)."""

    row = get_task(task).prediction
    if row is None:  # a task that does not decode
        raise UserError(f"task {task} decodes nothing: it has no predictions to write", fields=("task",))
    rows = [row(e, pred) for e, pred in zip(examples, result.predictions)]
    return write_text(path, "".join(json.dumps(r) + "\n" for r in rows), "predictions")
