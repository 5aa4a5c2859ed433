"""The reasoning task: exact-match accuracy on GSM8K-shaped problems (docs/method.md §5.2).

Each prompt is ``[BOS] question "\\n"``, the layout ``setdlm train`` gives prompt/completion pairs, decoded by
the family's decoder (greedy by default) in batches of ``batch_size`` rows until EOS or ``max_new_tokens``
(:func:`setdlm.evaluation.passes.completion_steps`); the completion is cut at its first EOS and scored by the
integer after its first ``####``. The examples: a GSM8K-format JSONL (``data``), else generated problems of
``level`` (:func:`setdlm.data.tasks.reasoning_split`).
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..data.tasks import ReasoningExample, extract_answer, load_gsm8k_jsonl, reasoning_split
from ..decoding.settings import DecodeSettings
from ..errors import UserError
from ..lm import Model
from .examples import from_pool, generated
from .passes import DecodingRun, EvalRun, check_examples, completion_steps, drain
from .registry import Task, register


@dataclass(frozen=True)
class ReasoningResult:
    """Exact-match accuracy over ``run.n`` problems, and what decoding them cost."""

    accuracy: float  # correct / n
    correct: int
    max_new_tokens: int  # generation budget of every row
    run: DecodingRun
    predictions: tuple[str, ...] = field(default=(), repr=False)  # completions, cut at EOS

    def to_dict(self) -> dict:
        """The numbers (predictions left out), JSON-ready."""
        return {"accuracy": self.accuracy, "correct": self.correct, "max_new_tokens": self.max_new_tokens,
                **self.run.to_dict()}


def reasoning(model: Model, examples: Sequence[ReasoningExample], settings: DecodeSettings | None = None,
              run: EvalRun | None = None, **knobs) -> ReasoningResult:
    """Exact-match accuracy of ``model`` on reasoning problems (``setdlm.data.tasks``), decoded in batches.

    Each prompt is ``[BOS] question "\\n"``, decoded by :func:`setdlm.decoding.generate` with ``settings`` (a
    :class:`~setdlm.decoding.settings.DecodeSettings`, or its fields as keywords: ``window``,
    ``threshold``, ``block_size``, ``temperature``, ``cache_order``, ``stop``, ...). Every row
    gets ``max_new_tokens`` (default: min(256, what the longest prompt leaves of the context L)). A completion is cut
    at its first EOS and is correct when the integer after its first ``####`` equals the answer. ``run``
    (:class:`~setdlm.evaluation.passes.EvalRun`; default 32 rows a call, no warm-up, the wall clock): the batch
    size, the warm-up calls that speed statistics (``result.run.speed``) skip (accuracy counts every example),
    the clock that times the calls, the sampling ``seed`` and the progress bar.
    """
    return drain(reasoning_steps(model, examples, settings, run, **knobs))


def reasoning_steps(model: Model, examples: Sequence[ReasoningExample], settings: DecodeSettings | None = None,
                    run: EvalRun | None = None, **knobs) -> Generator[None, None, ReasoningResult]:
    """:func:`reasoning` as a generator that yields after every decoding call and returns the result, so
    that several evaluations can be alternated call by call (:func:`~setdlm.evaluation.passes.interleave`)."""
    run = EvalRun.of(run, knobs, "reasoning")
    settings = DecodeSettings.of(settings, knobs, "reasoning")
    examples = check_examples(examples, ReasoningExample)
    predictions, decoded, budget = yield from completion_steps(model, examples, settings, "reasoning", run)
    correct = sum(extract_answer(p) == e.answer for p, e in zip(predictions, examples))
    return ReasoningResult(accuracy=correct / len(examples), correct=correct, max_new_tokens=budget, run=decoded,
                           predictions=tuple(predictions))


def reasoning_examples(spec, models: Sequence[Model]) -> tuple[list[ReasoningExample], int]:
    """``spec.data``'s problems (a GSM8K-format JSONL; its first ``n`` that fit, all when None), else ``n``
    (default 200) generated problems of ``split`` at ``level`` drawn with ``seed``, the first that fit."""
    if spec.data is not None:
        return from_pool(load_gsm8k_jsonl(spec.data), models, spec)
    level, split, seed = spec.level or "medium", spec.split or "test", spec.seed or 0
    return generated(lambda size: reasoning_split(split, size, level=level, seed=seed), models, spec.n or 200,
                     f"{level} problems", "use a lower level or a model with a longer context")


def _check(spec) -> None:
    """A GSM8K file exists and takes no level or split (those pick generated problems)."""
    if spec.data is None:
        return
    for name in ("level", "split"):
        if getattr(spec, name) is not None:
            raise UserError(f"{name} applies to generated problems; data {spec.data} is a GSM8K file",
                            fields=(name, "data"))
    if not Path(spec.data).is_file():
        raise UserError(f"GSM8K file {spec.data!r} does not exist (generated problems: level "
                        "easy|medium|hard)", fields=("level",))


def _prediction(example: ReasoningExample, prediction: str) -> dict:
    return {"question": example.question, "answer": example.answer, "prediction": prediction,
            "correct": extract_answer(prediction) == example.answer}


REASONING = register(Task(
    name="reasoning", title="exact-match accuracy on arithmetic word problems", quality="accuracy",
    header="accuracy (%)", source=lambda spec: f"generated:{spec.level or 'medium'}",
    fields=("level", "split", "n"), options=("clock", "predictions"), mode="generate", check=_check,
    examples=reasoning_examples, steps=reasoning_steps, prediction=_prediction, example=ReasoningExample,
    notes={"data": "GSM8K-format JSONL (default: generated problems)"}))
