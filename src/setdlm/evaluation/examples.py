"""The examples of a :class:`~setdlm.evaluation.spec.TaskSpec` that fit the models, and the
``--predictions`` file of a decoding evaluation (docs/evaluation.md)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from ..errors import UserError
from ..lm import Model
from .spec import TaskSpec


def task_examples(spec: TaskSpec, models: Sequence[Model]) -> tuple[list, int]:
    """The examples of a decoding task that fit the context of every model, and how many were skipped.

    reasoning: ``spec.data`` a GSM8K-format JSONL (all of it, or its first ``n`` that fit), else ``n``
    (default 200) generated problems of ``split`` at ``level`` drawn with ``seed``. parallel: ``n`` (default
    200) examples of the parallel-dependency suite, its four tasks in turn
    (:func:`setdlm.data.parallel.parallel_split`). infill: windows of 5 sentences with the middle ``hidden``
    (1 or 3) hidden from ``data`` (a text source; default the built-in ``shakespeare``), ``split``, shuffled
    by ``seed``: the first ``n`` that fit (all when None).
    """
    from ..data.parallel import parallel_split
    from ..data.sources import infill_from_source
    from ..data.tasks import load_gsm8k_jsonl, reasoning_split
    from ..evaluate import fits

    if not spec.decoding:
        raise UserError(f"task {spec.task} has no examples to decode", fields=("task",))
    level, split, seed, n = spec.level or "medium", spec.split or "test", spec.seed or 0, spec.n

    def select(pool, limit):
        chosen, skipped = [], 0
        for e in pool:
            if all(fits(m, e, eos=spec.eos) for m in models):
                chosen.append(e)
                if len(chosen) == limit:
                    break
            else:
                skipped += 1
        return chosen, skipped

    lengths = "/".join(sorted({str(m.family.length) for m in models}))
    if spec.task in ("reasoning", "parallel") and spec.data is None:
        want = size = n or 200
        what = f"{level} problems" if spec.task == "reasoning" else "parallel-suite examples"
        while True:
            pool = (reasoning_split(split, size, level=level, seed=seed) if spec.task == "reasoning"
                    else parallel_split(split, size, seed=seed))
            chosen, skipped = select(pool, want)
            if len(chosen) == want:
                return chosen, skipped
            if size >= 8 * want:
                raise UserError(f"only {len(chosen)} of {size} {what} fit the context length L={lengths}; "
                                + ("use a lower level or " if spec.task == "reasoning" else "use ")
                                + "a model with a longer context")
            size *= 2
    if spec.task == "reasoning":
        pool = load_gsm8k_jsonl(spec.data)
    else:
        pool = infill_from_source(spec.data or "shakespeare", split, None, sentences=5, hidden=spec.hidden or 1,
                                  seed=seed)
    chosen, skipped = select(pool, n)
    if not chosen or (n is not None and len(chosen) < n):
        raise UserError(f"only {len(chosen)} of {len(pool)} {spec.task} examples fit the context length "
                        f"L={lengths}" + (f"; ask for n <= {len(chosen)}" if chosen else ""), fields=("n",))
    return chosen, skipped


def write_predictions(path: str | Path, examples: Sequence, result) -> Path:
    """One JSONL row per example: the question, answer, prediction and correctness (reasoning; the parallel
    suite with its task), or the prefix, suffix, reference middle and prediction (infilling)."""
    from ..data.parallel import ParallelExample
    from ..data.tasks import ReasoningExample
    from ..metrics import extract_answer
    from ..outputs import write_text

    rows = []
    for e, pred in zip(examples, result.predictions):
        if isinstance(e, ParallelExample):
            rows.append({"task": e.task, "prompt": e.prompt, "reference": e.completion, "prediction": pred,
                         "correct": e.correct(pred)})
        elif isinstance(e, ReasoningExample):
            rows.append({"question": e.question, "answer": e.answer, "prediction": pred,
                         "correct": extract_answer(pred) == e.answer})
        else:
            rows.append({"prefix": e.prefix, "suffix": e.suffix, "reference": e.middle, "prediction": pred})
    return write_text(path, "".join(json.dumps(r) + "\n" for r in rows), "predictions")
