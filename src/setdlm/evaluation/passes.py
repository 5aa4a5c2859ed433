"""The decoding passes every decoding task shares (docs/method.md §4.10, §5): rows from examples, one timed
pass over them in batches, passes run side by side, and decoding speed the paper's way.

A task (:mod:`setdlm.evaluation.reasoning`, :mod:`~setdlm.evaluation.parallel`, :mod:`~setdlm.evaluation.infill`)
decodes its examples with :func:`completion_steps` (``[BOS] prompt`` continued: reasoning, the parallel suite)
or :func:`fill_steps` (``[BOS] prefix [MASK]×m suffix`` filled at the oracle length: infilling) and scores
what they return. Every pass is a generator that yields after each decoding call, so that :func:`interleave`
can alternate passes call by call; :func:`drain` runs one to its end.

How a pass runs (rows per call, warm-up calls, clock, seed, a progress bar) is one :class:`EvalRun`, which
every task's evaluation and :func:`setdlm.evaluation.throughput.throughput` take (docs/evaluation.md).

Every pass times its calls: ``DecodingRun.speed`` holds the same statistics over the calls after ``warmup``,
so one pass gives quality and speed (``setdlm bench`` sweeps settings this way). NFE and tokens/step are always
the decoder's own counts (``GenerationOutput.nfe``, ``row_nfe``, ``row_committed``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Sequence
from dataclasses import asdict, dataclass, fields, replace
from typing import Any, Literal, TypeVar

from tqdm.auto import tqdm

from .. import decoding  # decoding.generate / decoding.infill looked up per call (a test or a profiler may wrap them)
from ..data.parallel import ParallelExample
from ..data.prompt import check_prompt_fits, encode_prompt, start_ids
from ..data.tasks import InfillExample, ReasoningExample, encode_infill
from ..decoding.api import eos_ids
from ..decoding.output import GenerationOutput
from ..decoding.settings import DecodeSettings, default_max_new_tokens, drafts
from ..errors import UserError
from ..lm import Model
from .metrics import ThroughputStats, throughput_stats

R = TypeVar("R")

# ---------------------------------------------------------------------------------------------------------
# rows
# ---------------------------------------------------------------------------------------------------------


def tokenizer(model: Model):
    """The model's tokenizer (a task evaluation needs one)."""
    if model.tokenizer is None:
        raise UserError("task evaluation needs the model's tokenizer, and model.tokenizer is None")
    return model.tokenizer


def _eos(tok) -> list[int]:
    eos = getattr(tok, "eos_token_id", None)
    return [] if eos is None else [int(eos)]


def prompt_ids(model: Model, example: ReasoningExample | ParallelExample) -> list[int]:
    """The tokens a reasoning problem (a parallel-suite example, any example with a ``prompt``) is decoded from:
    ``[BOS] + prompt``, the
    prompt ending in ``"\\n"``, as ``setdlm train`` lays out a prompt/completion pair (``[BOS] prompt
    completion [EOS]``)."""
    tok = tokenizer(model)
    return encode_prompt(tok, example.prompt)


def infill_row(model: Model, example: InfillExample, *, eos: bool = False) -> tuple[list[int], int, list[int]]:
    """``(prefix ids, oracle length, suffix ids)`` of an infilling example: ``[BOS] + prefix``, the token count
    of the hidden middle, ``suffix (+ [EOS] with eos=True)``, each part tokenized on its own (docs/method.md §5.4). The
    suffix is empty for AR models, which condition on the prefix only."""
    tok = tokenizer(model)
    pre, mid, suf = encode_infill(example, tok)
    if model.family.spec.left_to_right:  # AR infilling conditions on the prefix only (docs/method.md §4.6)
        return start_ids(tok) + pre, len(mid), []
    return start_ids(tok) + pre, len(mid), suf + (_eos(tok) if eos else [])


def fits(model: Model, example: ReasoningExample | ParallelExample | InfillExample, *, eos: bool = False) -> bool:
    """True when the whole example fits in the model's context length L: a problem's (or a parallel-suite
    example's, or any example with a ``prompt`` and a ``completion``) prompt, completion and EOS; an infilling
    window's prefix, middle and suffix (+ EOS with ``eos``), whatever the family."""
    tok = tokenizer(model)
    if isinstance(example, InfillExample):
        pre, mid, suf = encode_infill(example, tok)
        n = len(start_ids(tok)) + len(pre) + len(mid) + len(suf) + (len(_eos(tok)) if eos else 0)
    elif isinstance(getattr(example, "prompt", None), str) and isinstance(getattr(example, "completion", None), str):
        n = len(prompt_ids(model, example)) + len(tok.encode(example.completion)) + len(_eos(tok))
    else:
        raise UserError(f"expected a ReasoningExample, ParallelExample or InfillExample, got {type(example).__name__}")
    return n <= model.family.length


def check_examples(examples: Sequence, kind: type) -> list:
    """``examples`` as a list, refused when empty or when one is not a ``kind``."""
    examples = list(examples)
    if not examples:
        raise UserError("no examples to evaluate")
    bad = next((e for e in examples if not isinstance(e, kind)), None)
    if bad is not None:
        raise UserError(f"expected {kind.__name__} examples, got {type(bad).__name__}")
    return examples


def _budget(model: Model, prompts: list[list[int]], max_new_tokens: int | None) -> int:
    """``max_new_tokens``, by default min(256, what the longest prompt leaves of the context) (the same for
    every row, so that no row's result depends on the others)."""
    L = model.family.length
    i = max(range(len(prompts)), key=lambda j: len(prompts[j]))
    check_prompt_fits(len(prompts[i]), L, f"prompt {i}")
    if max_new_tokens is not None:  # checked by DecodeSettings
        return max_new_tokens
    return default_max_new_tokens("evaluate", room=L - len(prompts[i]))


# ---------------------------------------------------------------------------------------------------------
# one timed pass over the examples
# ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DecodingRun:
    """What one decoding pass over ``n`` examples cost, from the decoder's own counts."""

    n: int  # examples decoded
    batch_size: int  # rows per decoding call
    nfe: int  # backbone forwards of the whole pass (prefill excluded; a batched forward counts once)
    nfe_per_example: float  # mean over examples of the forwards each took part in (its NFE at batch 1)
    tokens_per_step: float  # Σ committed / Σ row forwards over the pass: the decoder's parallelism factor
    generated_tokens: int  # tokens generated over the pass (prompt and context excluded)
    seconds: float  # time of all calls, prefill included, tokenization excluded
    speed: ThroughputStats  # tokens/s over the calls after the warm-up ones
    clock: str = "wall"  # what the seconds measure: "wall" clock or this process's "cpu" time

    def to_dict(self) -> dict:
        return {**{k: v for k, v in asdict(self).items() if k != "speed"}, "speed": self.speed.to_dict()}


CLOCKS = ("wall", "cpu")
Clock = Literal["wall", "cpu"]  # what a decoding call's seconds measure


def _whole(value: object, least: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= least


@dataclass(frozen=True)
class EvalRun:
    """How a decoding pass runs, the same for every task (docs/evaluation.md, "From Python"): ``batch_size``
    rows per decoding call, the first ``warmup`` calls left out of the speed statistics, each call timed by
    the decoder's ``"wall"`` clock or this process's ``"cpu"`` time (steady on a shared CPU; with several torch
    threads it adds up their time), ``seed`` of the sampling, a progress bar or not. Unset (None): the call's
    default, 32 rows and no warm-up for a task's evaluation (``reasoning``, ``infill``, ...), 1 row and 50
    calls for ``throughput``, the wall clock. Checked when built: a bad value is a ``UserError`` naming it."""

    batch_size: int | None = None
    warmup: int | None = None
    clock: Clock | None = None
    seed: int | None = None
    progress: bool = True

    def __post_init__(self):
        if self.batch_size is not None and not _whole(self.batch_size, 1):
            raise UserError(f"batch_size must be a positive integer, got {self.batch_size!r}", fields=("batch_size",))
        if self.warmup is not None and not _whole(self.warmup, 0):
            raise UserError(f"warmup must be a non-negative integer, got {self.warmup!r}", fields=("warmup",))
        if self.clock is not None and self.clock not in CLOCKS:
            raise UserError(f"clock must be one of {', '.join(CLOCKS)}, got {self.clock!r}", fields=("clock",))
        if self.seed is not None and (not isinstance(self.seed, int) or isinstance(self.seed, bool)):
            raise UserError(f"seed must be an integer, got {self.seed!r}", fields=("seed",))
        if not isinstance(self.progress, bool):
            raise UserError(f"progress must be True or False, got {self.progress!r}", fields=("progress",))

    @staticmethod
    def of(run: EvalRun | None, knobs: dict, what: str) -> EvalRun:
        """``run`` (None: ``EvalRun()``); an EvalRun field among the decoding settings' keywords ``knobs`` of
        ``what`` is a ``TypeError`` that says where it goes now."""
        named = [f.name for f in fields(EvalRun) if f.name in knobs]
        if named:
            raise TypeError(f"{what}() takes {named[0]} in run=EvalRun({named[0]}=...), not as a keyword")
        if run is not None and not isinstance(run, EvalRun):
            raise TypeError(f"run must be an EvalRun, got {type(run).__name__}")
        return EvalRun() if run is None else run

    def options(self, batch_size: int, warmup: int) -> dict[str, Any]:
        """The keywords of :func:`decode_steps` (``batch_size``, ``warmup``, ``clock``, ``progress``), the given
        defaults (and the wall clock) for the unset ones."""
        return {"batch_size": batch_size if self.batch_size is None else self.batch_size,
                "warmup": warmup if self.warmup is None else self.warmup, "clock": self.clock or "wall",
                "progress": self.progress}


def drain(steps: Generator[Any, None, R]) -> R:
    """Run a ``*_steps`` generator to the end and return what it returns."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value


def decode_steps(n: int, call: Callable[[int, int], GenerationOutput], *, batch_size: int, warmup: int,
                 progress: bool, desc: str, clock: Clock
                 ) -> Generator[None, None, tuple[list[GenerationOutput], DecodingRun]]:
    """Decode examples ``[0, n)`` in consecutive calls of ``batch_size`` (``call(lo, hi)`` returns the
    ``GenerationOutput`` of examples lo..hi-1); speed statistics skip the first ``warmup`` calls. A call's
    time is the decoder's wall time (``clock="wall"``) or the CPU time of this process during the call.
    A generator that yields after every call (so that :func:`interleave` can alternate passes) and returns
    ``(outputs, run)``; the arguments are checked (as :class:`EvalRun`'s) before the first call."""
    EvalRun(batch_size=batch_size, warmup=warmup, clock=clock)  # checked as an EvalRun's
    calls = -(-n // batch_size)
    if warmup >= calls:
        raise UserError(f"warmup={warmup} leaves none of the {calls} decoding calls ({n} examples at batch size "
                        f"{batch_size}) to measure")
    outs: list[GenerationOutput] = []
    seconds: list[float] = []
    with tqdm(total=n, desc=desc, unit="ex", disable=None if progress else True) as bar:
        for lo in range(0, n, batch_size):
            hi = min(lo + batch_size, n)
            cpu = time.process_time()
            outs.append(call(lo, hi))
            seconds.append(outs[-1].seconds if clock == "wall" else time.process_time() - cpu)
            bar.update(hi - lo)
            yield
    row_nfe = [sum(o.row_nfe) for o in outs]
    committed = [sum(o.row_committed) for o in outs]
    speed = throughput_stats([o.num_tokens for o in outs], seconds, warmup=warmup, nfe=[o.nfe for o in outs],
                             committed=committed, row_nfe=row_nfe)
    run = DecodingRun(n=n, batch_size=batch_size, nfe=sum(o.nfe for o in outs), nfe_per_example=sum(row_nfe) / n,
                      tokens_per_step=sum(committed) / max(sum(row_nfe), 1),
                      generated_tokens=sum(o.num_tokens for o in outs), seconds=sum(seconds), speed=speed,
                      clock=clock)
    return outs, run


def _check_clock(model: Model, clock: str) -> None:
    device = next(model.backbone.parameters()).device
    if clock == "cpu" and device.type != "cpu":
        raise UserError(f"clock='cpu' times CPU work, but the model runs on {device}; use clock='wall'")


def generate_steps(model: Model, prompts: list[list[int]], settings: DecodeSettings, *, seed: int | None, **opts):
    """Decode ``prompts`` with ``settings``; every row's budget is ``settings.max_new_tokens`` or, when that is
    None, min(256, what the longest prompt leaves of the context) (:func:`_budget`); with ``progress`` each
    call shows its tokens on a terminal, so a long call is not silent."""

    settings.check_for(model.family.family, drafts=drafts(model))
    _check_clock(model, opts["clock"])
    budget = _budget(model, prompts, settings.max_new_tokens)
    settings = replace(settings, max_new_tokens=budget)
    outs, run = yield from decode_steps(len(prompts), lambda lo, hi: decoding.generate(
        model, prompts[lo:hi], settings, seed=seed, progress=opts["progress"]), **opts)  # a call's tokens: a bar
    return outs, run, budget


def fill_steps(model: Model, examples: list[InfillExample], settings: DecodeSettings, *, seed: int | None,
                  eos: bool, **opts):
    """Fill each example's middle at its oracle length with ``settings`` (fill's: no budget, EOS stop or
    cache order)."""

    settings.check_for(model.family.family, mode="fill", drafts=drafts(model))
    _check_clock(model, opts["clock"])
    rows = [infill_row(model, e, eos=eos) for e in examples]
    L = model.family.length
    for i, (prefix, m, suffix) in enumerate(rows):
        if len(prefix) + m + len(suffix) > L:
            raise UserError(f"infill example {i} needs {len(prefix) + m + len(suffix)} tokens, more than the context "
                            f"length L={L} (select examples with setdlm.evaluation.passes.fits)")
    pre, lens, suf = zip(*rows)
    return (yield from decode_steps(len(rows), lambda lo, hi: decoding.infill(
        model, list(pre[lo:hi]), list(suf[lo:hi]), list(lens[lo:hi]), settings=settings, seed=seed), **opts))


def _texts(outs: list, tok, eos_ids: Sequence[int]) -> list[str]:
    """Each row's text, cut at its first EOS (rows decoded with ``ignore_eos`` may run past one)."""
    texts = []
    for o in outs:
        for text, ids, reason in zip(o.texts, o.tokens, o.finish_reason):
            cut = next((j for j, t in enumerate(ids) if t in eos_ids), None)
            texts.append(tok.decode(ids[:cut]) if reason == "length" and cut is not None else text)
    return texts



def completion_steps(model: Model, examples: list, settings: DecodeSettings, what: str, run: EvalRun | None = None):
    """Decode each example's completion from its prompt (:func:`prompt_ids`) as ``run`` says (unset: 32 rows
    a call, no warm-up); returns ``(predictions, decoding run, budget)``, every prediction cut at its first EOS."""

    tok = tokenizer(model)
    prompts = [prompt_ids(model, e) for e in examples]
    run = EvalRun.of(run, {}, what)
    outs, decoded, budget = yield from generate_steps(model, prompts, settings, seed=run.seed,
                                                      desc=f"{model.family.family} {what}",
                                                      **run.options(batch_size=32, warmup=0))
    return _texts(outs, tok, eos_ids(model, settings.eos_token_id)), decoded, budget


def interleave(passes: Sequence[Generator[Any, None, Any]], *, progress: Callable[[], None] | None = None) -> list:
    """Run evaluation passes (a task's ``*_steps``, e.g. :func:`setdlm.evaluation.reasoning.reasoning_steps`,
    or :func:`setdlm.evaluation.throughput.throughput_steps`) side by side: one decoding call of each in turn, the
    order rotated by one every round, until all are done;
    returns their results in the order given. Timing them this way makes a drift of the machine's speed (a
    shared host, thermal throttling) hit every pass alike, so that their speed ratios are fair.
    ``progress`` is called after every call."""
    passes = list(passes)
    results: list = [None] * len(passes)
    live = list(range(len(passes)))
    r = 0
    while live:
        order = live[r % len(live):] + live[: r % len(live)]
        for i in order:
            try:
                next(passes[i])
            except StopIteration as done:
                results[i] = done.value
                live.remove(i)
                continue
            if progress is not None:
                progress()
        r += 1
    return results
