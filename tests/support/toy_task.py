"""A task added the way docs/evaluation.md ("Adding a task") says: this one file, nothing else.

``toy``: reverse a short lowercase word. Its examples are generated from the seed; each is decoded as a
prompt continued (:func:`setdlm.evaluation.passes.completion_steps`) and scored by ``agreement``, the share
of the reference's characters the completion has at the same place. Importing the file registers the task;
``setdlm eval --task toy`` and ``setdlm bench --task toy`` then run it like a shipped one.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from setdlm.decoding.settings import DecodeSettings
from setdlm.evaluation.examples import generated
from setdlm.evaluation.passes import DecodingRun, EvalRun, check_examples, completion_steps
from setdlm.evaluation.registry import Task, register


@dataclass(frozen=True)
class ToyExample:
    prompt: str  # "abc ": the word and a space
    completion: str  # "cba"


@dataclass(frozen=True)
class ToyResult:
    agreement: float  # mean over examples of the share of reference characters matched in place
    max_new_tokens: int
    run: DecodingRun
    predictions: tuple[str, ...] = field(default=(), repr=False)

    def to_dict(self) -> dict:
        return {"agreement": self.agreement, "max_new_tokens": self.max_new_tokens, **self.run.to_dict()}


def agreement(prediction: str, reference: str) -> float:
    """The share of ``reference``'s characters that ``prediction`` has at the same place."""
    return sum(a == b for a, b in zip(prediction, reference)) / len(reference)


def draw(size: int, seed: int) -> list[ToyExample]:
    """``size`` words of 2 to 4 letters, drawn with ``seed``."""
    rng = random.Random(seed)
    words = ["".join(rng.choice("abcdefgh") for _ in range(rng.randint(2, 4))) for _ in range(size)]
    return [ToyExample(w + " ", w[::-1]) for w in words]


def toy_examples(spec, models):
    return generated(lambda size: draw(size, spec.seed or 0), models, spec.n or 8, "toy words",
                     "use a model with a longer context")


def toy_steps(model, examples, settings: DecodeSettings | None = None, run: EvalRun | None = None, **knobs):
    settings = DecodeSettings.of(settings, knobs, "toy")
    examples = check_examples(examples, ToyExample)
    predictions, decoded, budget = yield from completion_steps(model, examples, settings, "toy", run)
    score = sum(agreement(p, e.completion) for p, e in zip(predictions, examples)) / len(examples)
    return ToyResult(score, budget, decoded, tuple(predictions))


TOY = register(Task(
    name="toy", title="reversed words", quality="agreement", header="agreement (%)",
    source=lambda spec: "generated:toy", fields=("n",), options=("clock", "predictions"), mode="generate",
    examples=toy_examples, steps=toy_steps, example=ToyExample,
    prediction=lambda e, p: {"prompt": e.prompt, "reference": e.completion, "prediction": p,
                             "agreement": agreement(p, e.completion)}))
