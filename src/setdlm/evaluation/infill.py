"""The infill task: ROUGE-1/2/L F-measure of the filled middle (docs/method.md §5.4).

Rows are ``[BOS] prefix [MASK]×m suffix`` with the oracle length ``m`` (the hidden middle's token count), the
three parts tokenized separately (:func:`setdlm.evaluation.passes.fill_steps`); AR models get the prefix only,
as the paper's AR baseline. The examples: windows of 5 sentences of a text source (default the built-in
``shakespeare``) with ``hidden`` (1 or 3) of them hidden.
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from dataclasses import dataclass, field

from ..data.sources import infill_from_source
from ..data.tasks import InfillExample
from ..decoding.settings import DecodeSettings
from ..lm import Model
from .examples import from_pool
from .metrics import rouge
from .passes import DecodingRun, EvalRun, check_examples, drain, fill_steps
from .registry import Task, register


@dataclass(frozen=True)
class InfillResult:
    """Mean ROUGE-1/2/L F-measure (in [0, 1]) of the filled middles, and what decoding them cost."""

    rouge1: float
    rouge2: float
    rougeL: float
    run: DecodingRun
    predictions: tuple[str, ...] = field(default=(), repr=False)  # the filled middles

    def to_dict(self) -> dict:
        """The numbers (predictions left out), JSON-ready."""
        return {"rouge1": self.rouge1, "rouge2": self.rouge2, "rougeL": self.rougeL, **self.run.to_dict()}


def infill(model: Model, examples: Sequence[InfillExample], settings: DecodeSettings | None = None,
           run: EvalRun | None = None, *, eos: bool = False, **knobs) -> InfillResult:
    """ROUGE-1/2/L of ``model``'s infilling of the hidden middles (``setdlm.data.tasks.infill_examples``).

    Rows are ``[BOS] prefix [MASK]×m suffix`` with ``m`` the middle's token count (the oracle length), the
    parts tokenized separately; ``eos=True`` appends EOS after the suffix, right when every window is a
    whole document (ROCStories), wrong for windows cut out of a longer text. AR models see the prefix
    only. Decoded by :func:`setdlm.decoding.infill` with ``settings`` (or its fields as keywords:
    ``window``, ``threshold``, ``block_size``, ``repetition_penalty``, ...; the generate-only ones are a
    ``ValueError``). ``run`` as in :func:`setdlm.evaluation.reasoning.reasoning`. Needs the
    ``rouge-score`` package (extra ``eval``).
    """
    return drain(infill_steps(model, examples, settings, run, eos=eos, **knobs))


def infill_steps(model: Model, examples: Sequence[InfillExample], settings: DecodeSettings | None = None,
                 run: EvalRun | None = None, *, eos: bool = False,
                 **knobs) -> Generator[None, None, InfillResult]:
    """:func:`infill` as a generator that yields after every decoding call and returns the result
    (:func:`~setdlm.evaluation.passes.interleave`)."""
    run = EvalRun.of(run, knobs, "infill")
    settings = DecodeSettings.of(settings, knobs, "infill")
    examples = check_examples(examples, InfillExample)
    outs, decoded = yield from fill_steps(model, examples, settings, seed=run.seed, eos=eos,
                                          desc=f"{model.family.family} infill", **run.options(batch_size=32, warmup=0))
    predictions = [t for o in outs for t in o.texts]
    scores = rouge(predictions, [e.middle for e in examples])
    return InfillResult(**scores, run=decoded, predictions=tuple(predictions))


def infill_examples(spec, models: Sequence[Model]) -> tuple[list[InfillExample], int]:
    """Windows of 5 sentences with the middle ``hidden`` (1 or 3) hidden, from ``data`` (a text source; default
    the built-in ``shakespeare``), ``split``, shuffled by ``seed``: the first ``n`` that fit (all when None)."""

    pool = infill_from_source(spec.data or "shakespeare", spec.split or "test", None, sentences=5,
                              hidden=spec.hidden or 1, seed=spec.seed or 0)
    return from_pool(pool, models, spec)


def _prediction(example: InfillExample, prediction: str) -> dict:
    return {"prefix": example.prefix, "suffix": example.suffix, "reference": example.middle,
            "prediction": prediction}


INFILL = register(Task(
    name="infill", title="ROUGE of infilled sentences", quality="rougeL", header="ROUGE-L (×100)",
    source=lambda spec: "shakespeare", fields=("split", "n", "hidden", "eos"), options=("clock", "predictions"),
    mode="fill", examples=infill_examples, steps=infill_steps, args=lambda spec: {"eos": spec.eos},
    prediction=_prediction, example=InfillExample,
    notes={"data": "a text file, folder or built-in corpus (default: shakespeare)"}))
