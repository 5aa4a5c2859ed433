"""Evaluation of a model on data (docs/method.md §4.10, §5).

``likelihood`` — the family's likelihood bound over a split (docs/method.md §5.1): the model in eval mode, the
training-time inputs (for SetDLM every target masked, one reveal order sampled per sequence), per-token NLLs
summed over the whole split and divided by the number of scored tokens (``Σ nll / Σ tokens``, not a mean of
batch means). AR gives its exact NLL; MDLM and BD3LM their 1/t-weighted NELBO; SetDLM the any-order NLL in
the sampled order, an upper bound on the NLL. ``samples = k`` passes over the data k times with fresh orders
(the reference's ``num_importance_samples``): the estimate's variance falls, its expectation does not move.

``reasoning`` — exact-match accuracy on GSM8K-shaped problems (docs/method.md §5.2): each prompt is
``[BOS] question "\n"``, the layout ``setdlm train`` gives prompt/completion pairs, decoded by the family's
decoder (greedy by default) in batches of ``batch_size`` rows until EOS or ``max_new_tokens``; the completion
is cut at its first EOS and scored by the integer after its first ``####``.

``parallel`` — exact accuracy on the parallel-dependency suite (copy, reverse, sort, a 4x4 Latin square;
:mod:`setdlm.data.parallel`), overall and per task: each prompt decoded as a reasoning problem's, the
completion cut at its first EOS and checked by the example's own rule (exact match, or a valid Latin square).

``infill`` — ROUGE-1/2/L F-measure of the filled middle (docs/method.md §5.4): ``[BOS] prefix [MASK]×m suffix`` with the
oracle length ``m`` (the hidden middle's token count), the three parts tokenized separately; AR models get
the prefix only, as the paper's AR baseline.

``throughput`` — decoding speed the paper's way (docs/method.md §4.10, §7.20): one example per call at batch 1,
the first ``warmup`` calls excluded, mean ± std of per-call generated tokens / second (prompt tokens never
count; the latency includes the prefill), plus the aggregate rate, the number to compare at batch > 1.

``reasoning`` and ``infill`` time their calls too: ``result.run.speed`` holds the same statistics over the
calls after ``warmup``, so one pass gives quality and speed (``setdlm bench`` sweeps settings this way).
NFE and tokens/step are always the decoder's own counts (``GenerationOutput.nfe``, ``row_nfe``,
``row_committed``). Every result has ``to_dict()`` for JSON.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field, replace

import torch
from tqdm.auto import tqdm

from .batch import Batch
from .data.prompt import check_prompt_fits, encode_prompt, start_ids
from .data.parallel import PARALLEL_TASKS, ParallelExample
from .data.tasks import InfillExample, ReasoningExample, encode_infill
from .decoding.settings import DecodeSettings, default_max_new_tokens
from .decoding.settings import DecodeSettings
from .errors import UserError
from .lm import Model
from .metrics import LikelihoodSummary, ThroughputStats, extract_answer, rouge, throughput_stats
from .objectives import compute_loss
from .seeds import derive_seed


def _as_batch(b) -> Batch:
    """A ``Batch``, or a (B, L) tensor of token ids that are all scored (no padding, no context)."""
    if isinstance(b, Batch):
        return b
    if isinstance(b, torch.Tensor) and b.dim() == 2 and not b.is_floating_point():
        return Batch(b, torch.ones_like(b, dtype=torch.bool))
    raise UserError(f"a batch must be a setdlm.objectives.Batch or a (B, L) integer tensor, got {type(b).__name__}")


def bound_generator(seed: int, sample: int, index: int, device=None) -> torch.Generator:
    """The generator of batch ``index`` in pass ``sample`` of :func:`likelihood`: seeded by ``(seed, index)``
    in the first pass (the trainer's held-out seeds) and by ``(seed, sample, index)`` in later ones, so that
    a batch's orders and masks depend neither on the batches before it nor on the number of processes."""
    parts = (seed, "eval", index) if sample == 0 else (seed, "eval", sample, index)
    return torch.Generator(device=device).manual_seed(derive_seed(*parts))


def _indexed(batches, rank: int, world: int) -> Iterator[tuple[int, object]]:
    """``(index, batch)`` of the batches this process scores: every ``world``-th from ``rank``."""
    if isinstance(batches, Sequence):
        return ((i, batches[i]) for i in range(rank, len(batches), world))
    return ((i, b) for i, b in enumerate(batches) if i % world == rank)


@torch.no_grad()
def likelihood(model: Model, batches: Iterable, *, samples: int = 1, seed: int = 1, bf16: bool = False,
               dist=None, progress: bool = True) -> LikelihoodSummary:
    """Likelihood bound of ``model`` over ``batches`` (``Batch`` objects or (B, L) token-id tensors): the
    one estimator behind ``setdlm eval``, the trainer's held-out bound (:meth:`setdlm.training.state.TrainState.evaluate`)
    and the lm-eval adapter's scores.

    ``samples``: passes over the data, each with freshly sampled orders / masks (``batches`` must then be
    re-iterable, e.g. a list or a DataLoader). Batch ``i`` of pass ``s`` draws them from
    :func:`bound_generator` ``(seed, s, i)``, so the result is reproducible (docs/method.md §5.1: seed 1) and
    does not depend on the batches before it. ``bf16``: autocast. ``dist`` (a :class:`setdlm.training.distributed.Dist`):
    under DDP each process scores every ``world``-th batch and the sums are all-reduced.
    """
    if samples < 1:
        raise UserError(f"samples must be >= 1, got {samples}")
    if samples > 1 and isinstance(batches, Iterator):
        raise UserError("samples > 1 passes over the data several times: give a list or a DataLoader, "
                        "not a one-shot iterator")
    rank, world = (dist.rank, dist.world) if dist is not None else (0, 1)
    was_training = model.backbone.training
    model.backbone.eval()
    device = next(model.backbone.parameters()).device
    sums = torch.zeros(samples, 4, dtype=torch.float64, device=device)  # per pass: nats, tokens, Σ bounds, batches
    total = samples * -(-(len(batches) - rank) // world) if hasattr(batches, "__len__") else None
    amp = torch.autocast(device.type, dtype=torch.bfloat16) if bf16 else nullcontext()
    try:
        with tqdm(total=total, desc="likelihood", unit="batch", disable=None if progress else True) as bar, amp:
            for s in range(samples):
                for i, b in _indexed(batches, rank, world):
                    out = compute_loss(model.backbone, model.family, _as_batch(b).to(device), train=False,
                                       generator=bound_generator(seed, s, i, device))
                    sums[s] += torch.stack([out.nll.double().sum(), out.mask.sum().double(), out.loss.double(),
                                            torch.ones((), dtype=torch.float64, device=device)])
                    bar.update(1)
                    if not bar.disable and sums[:, 1].sum() > 0:  # reading the sums waits for the device
                        bar.set_postfix(nats_per_token=f"{float(sums[:, 0].sum() / sums[:, 1].sum()):.4f}")
    finally:
        model.backbone.train(was_training)
    if dist is not None and dist.active:
        torch.distributed.all_reduce(sums)
    nats, tokens, bounds, count = sums.cpu().unbind(-1)  # (samples,) each
    if tokens[0] == 0:
        raise UserError("no scored tokens in the data (empty batches, or every token padding or context)")
    if len(set(tokens.tolist())) > 1:
        raise UserError(f"the data changed between passes: scored tokens per pass {[int(t) for t in tokens]}")
    return LikelihoodSummary(nats=float(nats.sum()) / samples, tokens=int(tokens[0]), samples=samples,
                             batch_mean=float(bounds.sum() / count.sum()))


# ---------------------------------------------------------------------------------------------------------
# decoding tasks: rows
# ---------------------------------------------------------------------------------------------------------


def _tokenizer(model: Model):
    if model.tokenizer is None:
        raise UserError("task evaluation needs the model's tokenizer, and model.tokenizer is None")
    return model.tokenizer


def _eos(tok) -> list[int]:
    eos = getattr(tok, "eos_token_id", None)
    return [] if eos is None else [int(eos)]


def prompt_ids(model: Model, example: ReasoningExample | ParallelExample) -> list[int]:
    """The tokens a reasoning problem (or a parallel-suite example) is decoded from: ``[BOS] + prompt``, the
    prompt ending in ``"\\n"``, as ``setdlm train`` lays out a prompt/completion pair (``[BOS] prompt
    completion [EOS]``)."""
    tok = _tokenizer(model)
    return encode_prompt(tok, example.prompt)


def infill_row(model: Model, example: InfillExample, *, eos: bool = False) -> tuple[list[int], int, list[int]]:
    """``(prefix ids, oracle length, suffix ids)`` of an infilling example: ``[BOS] + prefix``, the token count
    of the hidden middle, ``suffix (+ [EOS] with eos=True)``, each part tokenized on its own (docs/method.md §5.4). The
    suffix is empty for AR models, which condition on the prefix only."""
    tok = _tokenizer(model)
    pre, mid, suf = encode_infill(example, tok)
    if model.family.spec.left_to_right:  # AR infilling conditions on the prefix only (docs/method.md §4.6)
        return start_ids(tok) + pre, len(mid), []
    return start_ids(tok) + pre, len(mid), suf + (_eos(tok) if eos else [])


def fits(model: Model, example: ReasoningExample | ParallelExample | InfillExample, *, eos: bool = False) -> bool:
    """True when the whole example fits in the model's context length L: a problem's (or a parallel-suite
    example's) prompt, completion and EOS; an infilling window's prefix, middle and suffix (+ EOS with
    ``eos``), whatever the family."""
    tok = _tokenizer(model)
    if isinstance(example, (ReasoningExample, ParallelExample)):
        n = len(prompt_ids(model, example)) + len(tok.encode(example.completion)) + len(_eos(tok))
    elif isinstance(example, InfillExample):
        pre, mid, suf = encode_infill(example, tok)
        n = len(start_ids(tok)) + len(pre) + len(mid) + len(suf) + (len(_eos(tok)) if eos else 0)
    else:
        raise UserError(f"expected a ReasoningExample, ParallelExample or InfillExample, got {type(example).__name__}")
    return n <= model.family.length


def _check_examples(examples: Sequence, kind: type) -> list:
    examples = list(examples)
    if not examples:
        raise UserError("no examples to evaluate")
    bad = next((e for e in examples if not isinstance(e, kind)), None)
    if bad is not None:
        raise UserError(f"expected {kind.__name__} examples, got {type(bad).__name__}")
    return examples


def _budget(model: Model, prompts: list[list[int]], max_new_tokens: int | None) -> int:
    """``max_new_tokens``, by default what the longest prompt leaves of the context (the same for every row,
    so that no row's result depends on the others)."""
    L = model.family.length
    i = max(range(len(prompts)), key=lambda j: len(prompts[j]))
    check_prompt_fits(len(prompts[i]), L, f"prompt {i}")
    if max_new_tokens is not None:  # checked by DecodeSettings
        return max_new_tokens
    return default_max_new_tokens("evaluate", room=L - len(prompts[i]))


# ---------------------------------------------------------------------------------------------------------
# decoding tasks: one timed pass over the examples
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


def _drain(steps: Generator):
    """Run a ``*_steps`` generator to the end and return what it returns."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value


def _decode_steps(n: int, call: Callable[[int, int], object], *, batch_size: int, warmup: int, progress: bool,
                  desc: str, clock: str) -> Generator[None, None, tuple[list, DecodingRun]]:
    """Decode examples ``[0, n)`` in consecutive calls of ``batch_size`` (``call(lo, hi)`` returns the
    ``GenerationOutput`` of examples lo..hi-1); speed statistics skip the first ``warmup`` calls. A call's
    time is the decoder's wall time (``clock="wall"``) or the CPU time of this process during the call.
    A generator that yields after every call (so that :func:`interleave` can alternate passes) and returns
    ``(outputs, run)``; the arguments are checked before the first call."""
    if not (isinstance(batch_size, int) and batch_size >= 1):
        raise UserError(f"batch_size must be a positive integer, got {batch_size!r}")
    if not (isinstance(warmup, int) and warmup >= 0):
        raise UserError(f"warmup must be a non-negative integer, got {warmup!r}")
    if clock not in CLOCKS:
        raise UserError(f"clock must be one of {', '.join(CLOCKS)}, got {clock!r}")
    calls = -(-n // batch_size)
    if warmup >= calls:
        raise UserError(f"warmup={warmup} leaves none of the {calls} decoding calls ({n} examples at batch size "
                        f"{batch_size}) to measure")
    outs, seconds = [], []
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


def _generate_steps(model: Model, prompts: list[list[int]], settings: DecodeSettings, *, seed: int | None, **opts):
    """Decode ``prompts`` with ``settings``; every row's budget is ``settings.max_new_tokens`` or, when that is
    None, what the longest prompt leaves of the context (:func:`_budget`)."""
    from .decoding import generate

    settings.check_for(model.family.family)
    _check_clock(model, opts["clock"])
    budget = _budget(model, prompts, settings.max_new_tokens)
    settings = replace(settings, max_new_tokens=budget)
    outs, run = yield from _decode_steps(len(prompts), lambda lo, hi: generate(
        model, prompts[lo:hi], settings, seed=seed), **opts)
    return outs, run, budget


def _infill_steps(model: Model, examples: list[InfillExample], settings: DecodeSettings, *, seed: int | None,
                  eos: bool, **opts):
    """Fill each example's middle at its oracle length with ``settings`` (fill's: no budget, EOS stop or
    cache order)."""
    from .decoding import infill as decode_infill

    settings.check_for(model.family.family, mode="fill")
    _check_clock(model, opts["clock"])
    rows = [infill_row(model, e, eos=eos) for e in examples]
    L = model.family.length
    for i, (pre, m, suf) in enumerate(rows):
        if len(pre) + m + len(suf) > L:
            raise UserError(f"infill example {i} needs {len(pre) + m + len(suf)} tokens, more than the context "
                            f"length L={L} (select examples with setdlm.evaluate.fits)")
    pre, lens, suf = zip(*rows)
    return (yield from _decode_steps(len(rows), lambda lo, hi: decode_infill(
        model, list(pre[lo:hi]), list(suf[lo:hi]), list(lens[lo:hi]), settings=settings, seed=seed), **opts))


def _texts(outs: list, tok, eos_ids: Sequence[int]) -> list[str]:
    """Each row's text, cut at its first EOS (rows decoded with ``ignore_eos`` may run past one)."""
    texts = []
    for o in outs:
        for text, ids, reason in zip(o.texts, o.tokens, o.finish_reason):
            cut = next((j for j, t in enumerate(ids) if t in eos_ids), None)
            texts.append(tok.decode(ids[:cut]) if reason == "length" and cut is not None else text)
    return texts


# ---------------------------------------------------------------------------------------------------------
# decoding tasks: public functions
# ---------------------------------------------------------------------------------------------------------


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


def reasoning(model: Model, examples: Sequence[ReasoningExample], settings: DecodeSettings | None = None, *,
              batch_size: int = 32, warmup: int = 0, clock: str = "wall", seed: int | None = None,
              progress: bool = True, **knobs) -> ReasoningResult:
    """Exact-match accuracy of ``model`` on reasoning problems (``setdlm.data.tasks``), decoded in batches.

    Each prompt is ``[BOS] question "\\n"``, decoded by :func:`setdlm.decoding.generate` with ``settings`` (a
    :class:`~setdlm.decoding.settings.DecodeSettings`, or its fields as keywords: ``window``,
    ``threshold``, ``block_size``, ``temperature``, ``cache_order``, ``stop``, ...) and ``seed``. Every row
    gets ``max_new_tokens`` (default: what the longest prompt leaves of the context L). A completion is cut
    at its first EOS and is correct when the integer after its first ``####`` equals the answer. Speed
    statistics (``result.run.speed``) skip the first ``warmup`` calls; accuracy counts every example.
    ``clock``: time calls by wall clock (``"wall"``, the paper's) or by this process's CPU time (``"cpu"``:
    steady on a CPU shared with other jobs; with several torch threads it adds up their time).
    """
    return _drain(reasoning_steps(model, examples, settings, batch_size=batch_size, warmup=warmup, clock=clock,
                                  seed=seed, progress=progress, **knobs))


def reasoning_steps(model: Model, examples: Sequence[ReasoningExample], settings: DecodeSettings | None = None, *,
                    batch_size: int = 32, warmup: int = 0, clock: str = "wall", seed: int | None = None,
                    progress: bool = True, **knobs) -> Generator[None, None, ReasoningResult]:
    """:func:`reasoning` as a generator that yields after every decoding call and returns the result, so
    that several evaluations can be alternated call by call (:func:`interleave`)."""
    settings = DecodeSettings.of(settings, knobs, "reasoning")
    examples = _check_examples(examples, ReasoningExample)
    predictions, run, budget = yield from _completion_steps(model, examples, settings, "reasoning", seed=seed,
                                                            batch_size=batch_size, warmup=warmup, progress=progress,
                                                            clock=clock)
    correct = sum(extract_answer(p) == e.answer for p, e in zip(predictions, examples))
    return ReasoningResult(accuracy=correct / len(examples), correct=correct, max_new_tokens=budget, run=run,
                           predictions=tuple(predictions))


def _completion_steps(model: Model, examples: list, settings: DecodeSettings, what: str, *, seed: int | None, **opts):
    """Decode each example's completion from its prompt (:func:`prompt_ids`); returns ``(predictions, run,
    budget)``, every prediction cut at its first EOS."""
    from .decoding.api import eos_ids

    tok = _tokenizer(model)
    prompts = [prompt_ids(model, e) for e in examples]
    outs, run, budget = yield from _generate_steps(model, prompts, settings, seed=seed,
                                                   desc=f"{model.family.family} {what}", **opts)
    return _texts(outs, tok, eos_ids(model, settings.eos_token_id)), run, budget


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


def parallel(model: Model, examples: Sequence[ParallelExample], settings: DecodeSettings | None = None, *,
             batch_size: int = 32, warmup: int = 0, clock: str = "wall", seed: int | None = None,
             progress: bool = True, **knobs) -> ParallelResult:
    """Exact accuracy of ``model`` on parallel-dependency examples (:func:`setdlm.data.parallel.parallel_split`):
    each decoded as :func:`reasoning` decodes a problem (``[BOS] prompt``, the same ``settings``, budget,
    ``warmup``, ``clock`` and ``seed``), the completion cut at its first EOS and checked by
    :meth:`~setdlm.data.parallel.ParallelExample.correct`; ``per_task`` splits the accuracy by task."""
    return _drain(parallel_steps(model, examples, settings, batch_size=batch_size, warmup=warmup, clock=clock,
                                 seed=seed, progress=progress, **knobs))


def parallel_steps(model: Model, examples: Sequence[ParallelExample], settings: DecodeSettings | None = None, *,
                   batch_size: int = 32, warmup: int = 0, clock: str = "wall", seed: int | None = None,
                   progress: bool = True, **knobs) -> Generator[None, None, ParallelResult]:
    """:func:`parallel` as a generator that yields after every decoding call (:func:`interleave`)."""
    settings = DecodeSettings.of(settings, knobs, "parallel")
    examples = _check_examples(examples, ParallelExample)
    predictions, run, budget = yield from _completion_steps(model, examples, settings, "parallel", seed=seed,
                                                            batch_size=batch_size, warmup=warmup, progress=progress,
                                                            clock=clock)
    right = [e.correct(p) for p, e in zip(predictions, examples)]
    per_task = {t: sum(r for r, e in zip(right, examples) if e.task == t) / sum(e.task == t for e in examples)
                for t in PARALLEL_TASKS if any(e.task == t for e in examples)}
    return ParallelResult(accuracy=sum(right) / len(examples), correct=sum(right), per_task=per_task,
                          max_new_tokens=budget, run=run, predictions=tuple(predictions))


def infill(model: Model, examples: Sequence[InfillExample], settings: DecodeSettings | None = None, *,
           batch_size: int = 32, eos: bool = False, warmup: int = 0, clock: str = "wall", seed: int | None = None,
           progress: bool = True, **knobs) -> InfillResult:
    """ROUGE-1/2/L of ``model``'s infilling of the hidden middles (``setdlm.data.tasks.infill_examples``).

    Rows are ``[BOS] prefix [MASK]×m suffix`` with ``m`` the middle's token count (the oracle length), the
    parts tokenized separately; ``eos=True`` appends EOS after the suffix, right when every window is a
    whole document (ROCStories), wrong for windows cut out of a longer text. AR models see the prefix
    only. Decoded by :func:`setdlm.decoding.infill` with ``settings`` (or its fields as keywords:
    ``window``, ``threshold``, ``block_size``, ``repetition_penalty``, ...; the generate-only ones are a
    ``ValueError``) and ``seed``. ``warmup`` and ``clock`` as in :func:`reasoning`. Needs the
    ``rouge-score`` package (extra ``eval``).
    """
    return _drain(infill_steps(model, examples, settings, batch_size=batch_size, eos=eos, warmup=warmup,
                               clock=clock, seed=seed, progress=progress, **knobs))


def infill_steps(model: Model, examples: Sequence[InfillExample], settings: DecodeSettings | None = None, *,
                 batch_size: int = 32, eos: bool = False, warmup: int = 0, clock: str = "wall",
                 seed: int | None = None, progress: bool = True, **knobs) -> Generator[None, None, InfillResult]:
    """:func:`infill` as a generator that yields after every decoding call and returns the result
    (:func:`interleave`)."""
    settings = DecodeSettings.of(settings, knobs, "infill")
    examples = _check_examples(examples, InfillExample)
    outs, run = yield from _infill_steps(model, examples, settings, seed=seed, eos=eos, batch_size=batch_size,
                                         warmup=warmup, progress=progress, clock=clock,
                                         desc=f"{model.family.family} infill")
    predictions = [t for o in outs for t in o.texts]
    scores = rouge(predictions, [e.middle for e in examples])
    return InfillResult(**scores, run=run, predictions=tuple(predictions))


def interleave(passes: Sequence[Generator], *, progress: Callable[[], None] | None = None) -> list:
    """Run evaluation passes (:func:`reasoning_steps`, :func:`infill_steps`, :func:`throughput_steps`) side by
    side: one decoding call of each in turn, the order rotated by one every round, until all are done;
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


def throughput(model: Model, items: Sequence, settings: DecodeSettings | None = None, *, warmup: int = 50,
               batch_size: int = 1, eos: bool = False, clock: str = "wall", seed: int | None = None,
               progress: bool = True, **knobs) -> ThroughputStats:
    """Decoding speed the paper's way: ``batch_size`` items per call (1 for the paper's numbers), the first
    ``warmup`` calls excluded; ``mean ± std`` of per-call tokens/s and the ``aggregate`` rate (compare that
    one at batch > 1). Only generated tokens count (an EOS that ends a row included, the prompt never);
    the latency of a call includes its prefill. NFE and tokens/step are the decoder's counts.

    ``items``: reasoning problems or parallel-suite examples (decoded as :func:`reasoning` does), infilling
    examples (as :func:`infill`), or prompts: strings (encoded as ``[BOS] + text``) or token-id lists (as given).
    ``settings`` (or its fields as keywords) go to the decoder (``ignore_eos=True`` makes every row generate
    ``max_new_tokens``; default what the longest prompt leaves of the context). ``clock="cpu"`` times by CPU
    time instead of wall time (see :func:`reasoning`).
    """
    return _drain(throughput_steps(model, items, settings, warmup=warmup, batch_size=batch_size, eos=eos,
                                   clock=clock, seed=seed, progress=progress, **knobs))


def throughput_steps(model: Model, items: Sequence, settings: DecodeSettings | None = None, *, warmup: int = 50,
                     batch_size: int = 1, eos: bool = False, clock: str = "wall", seed: int | None = None,
                     progress: bool = True, **knobs) -> Generator[None, None, ThroughputStats]:
    """:func:`throughput` as a generator that yields after every decoding call and returns the statistics
    (:func:`interleave`)."""
    settings = DecodeSettings.of(settings, knobs, "throughput")
    items = list(items)
    if not items:
        raise UserError("no prompts or examples to time")
    opts = dict(seed=seed, batch_size=batch_size, warmup=warmup, progress=progress, clock=clock,
                desc=f"{model.family.family} throughput")
    if isinstance(items[0], InfillExample):
        if settings.max_new_tokens is not None:
            raise UserError("max_new_tokens does not apply to infilling: the oracle length of each middle is used")
        examples = _check_examples(items, InfillExample)
        return (yield from _infill_steps(model, examples, settings, eos=eos, **opts))[1].speed
    if isinstance(items[0], (ReasoningExample, ParallelExample)):
        prompts = [prompt_ids(model, e) for e in _check_examples(items, type(items[0]))]
    else:
        prompts = [_prompt(model, p, i) for i, p in enumerate(items)]
    return (yield from _generate_steps(model, prompts, settings, **opts))[1].speed


def _prompt(model: Model, p, i: int) -> list[int]:
    if isinstance(p, str):
        tok = _tokenizer(model)
        return encode_prompt(tok, p)
    if isinstance(p, torch.Tensor):
        p = p.tolist()
    if not (isinstance(p, (list, tuple)) and all(isinstance(t, int) and t >= 0 for t in p)):
        raise UserError(f"item {i} is neither an example, a string nor a list of token ids: {str(p)[:40]!r}")
    return list(p)
