"""The parallel task: exact accuracy on the parallel-dependency suite (copy, reverse, sort, a 4x4 Latin square;
:mod:`setdlm.data.parallel`), overall and per task (docs/evaluation.md, "The parallel-dependency suite").

Each prompt is decoded as a reasoning problem's (:func:`setdlm.evaluation.passes.completion_steps`), the
completion cut at its first EOS and checked by the example's own rule (exact match, or a valid Latin square).
The examples are generated: ``n`` (default 200) of the suite, its four tasks in turn.
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from dataclasses import dataclass, field

from ..data.parallel import PARALLEL_TASKS, ParallelExample, parallel_split
from ..decoding.settings import DecodeSettings
from ..errors import UserError
from ..lm import Model
from .examples import generated
from .passes import DecodingRun, EvalRun, check_examples, completion_steps, drain
from .registry import Task, register


@dataclass(frozen=True)
class ParallelResult:
    """Exact accuracy on the parallel-dependency suite, overall and per task, and what decoding cost."""

    accuracy: float  # correct / n
    correct: int
    per_task: dict[str, float]  # task -> accuracy over that task's examples (the tasks present, suite order)
    max_new_tokens: int
    run: DecodingRun
    predictions: tuple[str, ...] = field(default=(), repr=False)  # completions, cut at EOS

    def to_dict(self) -> dict:
        """The numbers (predictions left out), JSON-ready."""
        return {"accuracy": self.accuracy, "correct": self.correct, "per_task": dict(self.per_task),
                "max_new_tokens": self.max_new_tokens, **self.run.to_dict()}


def parallel(model: Model, examples: Sequence[ParallelExample], settings: DecodeSettings | None = None,
             run: EvalRun | None = None, **knobs) -> ParallelResult:
    """Exact accuracy of ``model`` on parallel-dependency examples (:func:`setdlm.data.parallel.parallel_split`):
    each decoded as :func:`reasoning` decodes a problem (``[BOS] prompt``, the same ``settings``, budget and
    ``run``), the completion cut at its first EOS and checked by
    :meth:`~setdlm.data.parallel.ParallelExample.correct`; ``per_task`` splits the accuracy by task."""
    return drain(parallel_steps(model, examples, settings, run, **knobs))


def parallel_steps(model: Model, examples: Sequence[ParallelExample], settings: DecodeSettings | None = None,
                   run: EvalRun | None = None, **knobs) -> Generator[None, None, ParallelResult]:
    """:func:`parallel` as a generator that yields after every decoding call
    (:func:`~setdlm.evaluation.passes.interleave`)."""
    run = EvalRun.of(run, knobs, "parallel")
    settings = DecodeSettings.of(settings, knobs, "parallel")
    examples = check_examples(examples, ParallelExample)
    predictions, decoded, budget = yield from completion_steps(model, examples, settings, "parallel", run)
    right = [e.correct(p) for p, e in zip(predictions, examples)]
    per_task = {t: sum(r for r, e in zip(right, examples) if e.task == t) / sum(e.task == t for e in examples)
                for t in PARALLEL_TASKS if any(e.task == t for e in examples)}
    return ParallelResult(accuracy=sum(right) / len(examples), correct=sum(right), per_task=per_task,
                          max_new_tokens=budget, run=decoded, predictions=tuple(predictions))


def parallel_examples(spec, models: Sequence[Model]) -> tuple[list[ParallelExample], int]:
    """``n`` (default 200) examples of the suite's ``split`` drawn with ``seed``
    (:func:`setdlm.data.parallel.parallel_split`), the first that fit every model."""
    split, seed = spec.split or "test", spec.seed or 0
    return generated(lambda size: parallel_split(split, size, seed=seed), models, spec.n or 200,
                     "parallel-suite examples", "use a model with a longer context")


def _check(spec) -> None:
    if spec.data is not None:
        raise UserError("data does not apply to task parallel: its examples are generated (train on them "
                        "with data parallel)", fields=("data", "task"))


def _prediction(example: ParallelExample, prediction: str) -> dict:
    return {"task": example.task, "prompt": example.prompt, "reference": example.completion,
            "prediction": prediction, "correct": example.correct(prediction)}


PARALLEL = register(Task(
    name="parallel", title="exact accuracy on the parallel-dependency suite", quality="accuracy",
    header="accuracy (%)", source=lambda spec: "generated:parallel", fields=("split", "n"),
    options=("clock", "predictions"), mode="generate", check=_check, examples=parallel_examples,
    steps=parallel_steps, prediction=_prediction, example=ParallelExample))
