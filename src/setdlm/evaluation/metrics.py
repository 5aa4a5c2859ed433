"""Scores and summaries used by evaluation and benchmarks (docs/method.md §4.10, §5.1, §5.2, §5.4).

* ``extract_answer`` (:mod:`setdlm.data.tasks`, the answer format) / ``exact_match`` — GSM8K-style scoring: the integer
after the first ``####`` in a
  completion must equal the reference (docs/method.md §5.2; lm-eval's strict match reads the same line).
* ``rouge`` — ROUGE-1/2/L F-measure of predictions against references through the ``rouge-score`` package
  (optional extra ``eval``), as HF ``evaluate``'s ``rouge`` metric does for the paper's infilling table
  (docs/method.md §5.4), but averaged exactly instead of by bootstrap.
* ``LikelihoodSummary`` — nats/token, perplexity and bits/token from summed nats and token counts (docs/method.md §5.1:
  ``nll = Σ nll / Σ tokens`` over the whole split, never a mean of per-batch means).
* ``throughput_stats`` — decoding speed the paper's way (docs/method.md §4.10, §7.20): tokens/s of each call after
  the warm-up calls, their mean and standard deviation, plus the aggregate tokens/s; only *generated*
  tokens count (the prompt does not), while the latency includes the prompt prefill.
* ``aup`` / ``aup_scores`` — d3LLM's accuracy under parallelism of a τ sweep's curves (docs/evaluation.md,
  "TPF and AUP").
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from collections.abc import Sequence

from ..data.tasks import extract_answer
from ..errors import UserError

# ---------------------------------------------------------------------------------------------------------
# exact match of the final answer (GSM8K)
# ---------------------------------------------------------------------------------------------------------


def answer_matches(prediction: str, reference: str | int) -> bool:
    """True when the prediction's ``####`` integer equals the reference (an int or a text with ``####``)."""
    ref = reference if isinstance(reference, int) else extract_answer(reference)
    if ref is None:
        raise UserError(f"reference has no '#### <integer>' line: {str(reference)[-60:]!r}")
    return extract_answer(prediction) == ref


def exact_match(predictions: Sequence[str], references: Sequence[str | int]) -> float:
    """Fraction of predictions whose ``####`` integer equals the reference's (GSM8K pass@1)."""
    _check_pairs(predictions, references)
    return sum(answer_matches(p, r) for p, r in zip(predictions, references)) / len(predictions)


def _check_pairs(predictions: Sequence, references: Sequence) -> None:
    if len(predictions) != len(references):
        raise UserError(f"{len(predictions)} predictions but {len(references)} references")
    if not predictions:
        raise UserError("no predictions to score")


# ---------------------------------------------------------------------------------------------------------
# ROUGE (infilling)
# ---------------------------------------------------------------------------------------------------------

ROUGE_TYPES = ("rouge1", "rouge2", "rougeL")


def rouge_scores(predictions: Sequence[str], references: Sequence[str], *, use_stemmer: bool = False
                 ) -> list[dict[str, float]]:
    """Per-pair ROUGE-1/2/L F-measures in [0, 1] (``rouge_score.RougeScorer`` with its default tokenizer:
    lower-cased, every run of characters other than ``a-z0-9`` is a separator)."""
    _check_pairs(predictions, references)
    try:
        from rouge_score import rouge_scorer
    except ImportError as e:
        raise ImportError("ROUGE needs the 'rouge-score' package: pip install 'setdlm[eval]'") from e
    scorer = rouge_scorer.RougeScorer(list(ROUGE_TYPES), use_stemmer=use_stemmer)
    out = []
    for pred, ref in zip(predictions, references):
        s = scorer.score(ref, pred)  # (target, prediction): precision is over the prediction's n-grams
        out.append({k: s[k].fmeasure for k in ROUGE_TYPES})
    return out


def rouge(predictions: Sequence[str], references: Sequence[str], *, use_stemmer: bool = False) -> dict[str, float]:
    """Mean ROUGE-1/2/L F-measure over the pairs, in [0, 1] (the paper's tables print ×100).

    HF ``evaluate`` reports the median of 1000 bootstrap means instead, which differs from this exact mean
    only by the bootstrap noise.
    """
    per = rouge_scores(predictions, references, use_stemmer=use_stemmer)
    return {k: sum(s[k] for s in per) / len(per) for k in ROUGE_TYPES}


# ---------------------------------------------------------------------------------------------------------
# likelihood
# ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LikelihoodSummary:
    """A likelihood bound over a split: ``nats`` summed over its ``tokens`` scored tokens (docs/method.md §5.1)."""

    nats: float  # summed NLL of the split (averaged over the samples when there are several)
    tokens: int  # scored tokens in the split
    samples: int = 1  # order samples (passes over the split) behind the estimate
    batch_mean: float | None = None  # mean of the per-batch bounds (the reference's ``loss``; not the estimate)

    def __post_init__(self):
        if self.tokens < 1:
            raise UserError(f"a likelihood summary needs at least one scored token, got tokens={self.tokens}")
        if not math.isfinite(self.nats):
            raise UserError(f"summed NLL is not finite: nats={self.nats}")
        if self.batch_mean is not None and not math.isfinite(self.batch_mean):
            raise UserError(f"mean of the batch bounds is not finite: {self.batch_mean}")

    @property
    def nats_per_token(self) -> float:
        return self.nats / self.tokens

    @property
    def ppl(self) -> float:
        return math.exp(self.nats_per_token)

    @property
    def bits_per_token(self) -> float:
        return self.nats_per_token / math.log(2)

    def to_dict(self) -> dict:
        return {**asdict(self), "nats_per_token": self.nats_per_token, "ppl": self.ppl,
                "bits_per_token": self.bits_per_token}

    def bound_row(self) -> dict:
        """The fields of the trainer's held-out metrics row and of ``setdlm eval``'s likelihood line: ``nelbo``
        (nats per token), ``ppl``, ``bpd`` (bits per token), ``tokens``, and ``loss`` (the mean of the
        per-batch bounds, the reference's ``loss``)."""
        nelbo = self.nats_per_token
        return {"nelbo": nelbo, "ppl": math.exp(min(nelbo, 700)), "bpd": nelbo / math.log(2), "tokens": self.tokens,
                "loss": self.batch_mean}


# ---------------------------------------------------------------------------------------------------------
# throughput
# ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ThroughputStats:
    """Decoding speed over the measured calls (warm-up excluded)."""

    mean: float  # mean over calls of (generated tokens / seconds): the paper's number
    std: float  # population standard deviation of the same (numpy's default, ddof=0)
    aggregate: float  # Σ generated tokens / Σ seconds: the rate of the whole run, meaningful at batch > 1
    calls: int  # measured calls (generate() invocations; one example each at batch 1)
    tokens: int  # generated tokens in the measured calls
    seconds: float  # wall seconds of the measured calls
    warmup: int  # calls excluded at the start
    nfe: int | None = None  # forward passes in the measured calls, when given (a batched forward counts once)
    committed: int | None = None  # tokens the decoder committed in the measured calls, when given
    row_nfe: int | None = None  # Σ over rows of the forwards each row took part in, when given

    @property
    def tokens_per_step(self) -> float | None:
        """Tokens per forward pass of one row, the paper's "parallelism factor": ``committed / row_nfe`` when
        both are given (the decoder's own figure, ``GenerationOutput.tokens_per_step``, pooled over the
        measured calls; valid at any batch size), else generated tokens / ``nfe`` (batch 1)."""
        if self.committed is not None and self.row_nfe:
            return self.committed / self.row_nfe
        return None if not self.nfe else self.tokens / self.nfe

    def to_dict(self) -> dict:
        return {**asdict(self), "tokens_per_step": self.tokens_per_step}


def throughput_stats(generated_tokens: Sequence[int], seconds: Sequence[float], *, warmup: int = 50,
                     nfe: Sequence[int] | None = None, committed: Sequence[int] | None = None,
                     row_nfe: Sequence[int] | None = None) -> ThroughputStats:
    """Tokens/s statistics of a run of decoding calls, the first ``warmup`` of which are excluded.

    ``generated_tokens[i]`` counts only the tokens call ``i`` generated (output minus prompt, all rows of a
    batched call together); ``seconds[i]`` is its wall time including the prompt prefill; ``nfe[i]`` its
    forward passes (prefill not counted), optional; ``committed[i]`` and ``row_nfe[i]`` (optional, both or
    neither) the sums over its rows of ``GenerationOutput.row_committed`` and ``row_nfe``.
    """
    n = len(generated_tokens)
    lengths = [len(x) for x in (seconds, nfe, committed, row_nfe) if x is not None]
    if any(m != n for m in lengths):
        raise UserError(f"generated_tokens, seconds, nfe, committed and row_nfe differ in length: {n}, "
                        f"{', '.join(str(None if x is None else len(x)) for x in (seconds, nfe, committed, row_nfe))}")
    if (committed is None) != (row_nfe is None):
        raise UserError("give committed and row_nfe together, or neither")
    if warmup < 0:
        raise UserError(f"warmup must be >= 0, got {warmup}")
    if n <= warmup:
        raise UserError(f"need more calls than the {warmup} warm-up calls, got {n}")
    toks, secs = list(generated_tokens[warmup:]), list(seconds[warmup:])
    if any(t < 0 for t in toks):
        raise UserError(f"generated token counts must be >= 0, got {min(toks)}")
    if any(not s > 0 for s in secs):
        raise UserError(f"every call must take a positive time, got {min(secs)} s")
    rates = [t / s for t, s in zip(toks, secs)]
    mean = sum(rates) / len(rates)
    std = math.sqrt(sum((r - mean) ** 2 for r in rates) / len(rates))
    return ThroughputStats(mean=mean, std=std, aggregate=sum(toks) / sum(secs), calls=len(rates),
                           tokens=sum(toks), seconds=sum(secs), warmup=warmup, nfe=_tail_sum(nfe, warmup),
                           committed=_tail_sum(committed, warmup), row_nfe=_tail_sum(row_nfe, warmup))


def _tail_sum(xs: Sequence[int] | None, start: int) -> int | None:
    return None if xs is None else int(sum(xs[start:]))


# ---------------------------------------------------------------------------------------------------------
# AUP: accuracy under parallelism (d3LLM)
# ---------------------------------------------------------------------------------------------------------

AUP_ALPHA = 3.0  # d3LLM's penalty factor α
AUP_DROP = 5.0  # points more than this many percentage points below y_1 do not count


def aup_weight(y: float, y_max: float, alpha: float = AUP_ALPHA) -> float:
    """d3LLM's quality weight ``W(y) = min(exp(-α (1 - y / y_max)), 1)`` (1 when ``y_max`` is 0: then every
    y is 0 and the weight multiplies nothing)."""
    return 1.0 if y_max <= 0 else min(math.exp(-alpha * (1 - y / y_max)), 1.0)


def aup(rho: Sequence[float], y: Sequence[float], y_max: float | None = None, *, alpha: float = AUP_ALPHA,
        drop: float = AUP_DROP) -> float:
    """Accuracy Under Parallelism of parallelism/accuracy pairs, as d3LLM defines it (Qian et al., "AUP:
    when Accuracy Meets Parallelism in Diffusion Language Models", hao-ai-lab blog 2025, and the d3LLM
    repository's ``AUP_leaderboard``)::

        AUP = ρ_1 y_1 + 1/2 Σ_{i=2..m} (ρ_i - ρ_{i-1}) (y_i W(y_i) + y_{i-1} W(y_{i-1}))

    ``rho``: tokens per forward (TPF, > 0) of each point; ``y``: its accuracy in percent. The points are
    sorted by ρ ascending (equal ρ: the higher accuracy first), so ``y_1`` is the accuracy of the least
    parallel point; only points with ``y_i >= y_1 - drop`` count (5 points), and the sum runs over those in
    that order. ``W`` is :func:`aup_weight` with ``y_max`` the highest accuracy reached on the task, by any
    method (default the highest of ``y``); the first term is not weighted. One point gives ``ρ_1 y_1``
    (an AR model: its accuracy)."""
    rho, y = [float(r) for r in rho], [float(v) for v in y]
    if len(rho) != len(y) or not rho:
        raise UserError(f"aup needs as many accuracies as TPF values, at least one: got {len(rho)} and {len(y)}")
    if not all(r > 0 for r in rho):
        raise UserError(f"tokens per forward must be positive, got {rho}")
    if not all(0 <= v <= 100 for v in y):
        raise UserError(f"accuracies must be percentages in [0, 100], got {y}")
    y_max = max(y) if y_max is None else float(y_max)
    if y_max < max(y) or y_max > 100:
        raise UserError(f"y_max must be the highest accuracy on the task (>= {max(y)}, <= 100), got {y_max}")
    kept = aup_points(rho, y, drop)
    total = kept[0][0] * kept[0][1]
    for (r0, y0), (r1, y1) in zip(kept, kept[1:]):
        total += 0.5 * (r1 - r0) * (y1 * aup_weight(y1, y_max, alpha) + y0 * aup_weight(y0, y_max, alpha))
    return total


def aup_points(rho: Sequence[float], y: Sequence[float], drop: float = AUP_DROP) -> list[tuple[float, float]]:
    """The ``(ρ, y)`` pairs that :func:`aup` counts, in its order: sorted by ρ (equal ρ: higher y first),
    those with ``y >= y_1 - drop``."""
    pts = sorted(zip(rho, y), key=lambda p: (p[0], -p[1]))
    return [p for p in pts if p[1] >= pts[0][1] - drop]


@dataclass(frozen=True)
class AupScore:
    """The AUP of one curve of a sweep: a model at one window, block size and batch size, over τ."""

    model: str
    family: str
    window: int | None
    block_size: int | None
    batch_size: int
    aup: float
    y_max: float  # the highest quality (×100) of the whole sweep: the same for every curve
    counted: int  # points within AUP_DROP of y_1
    points: int
    max_tpf: float  # the highest TPF among the counted points
    speculate: bool | str = False  # a self-speculative decode (True or "next_token"): a curve of its own (one point)

    def to_dict(self) -> dict:
        return asdict(self)


def aup_scores(points: Sequence) -> list[AupScore]:
    """One :class:`AupScore` per curve of a decoding sweep's points (:class:`~setdlm.evaluation.sweeps.BenchPoint`:
    model, w, block size, batch), over its τ points; y is the quality ×100 (accuracy in %, or ROUGE-L ×100 for
    infilling), ρ the TPF, and ``y_max`` the best
    quality of every point given, so that the curves' AUPs compare. Empty for the likelihood task."""
    points = [p for p in points if p.tokens_per_step is not None]
    if not points:
        return []
    y_max = 100 * max(p.quality for p in points)
    curves: dict[tuple, list] = {}
    for p in points:
        key = (p.model, p.setting.window, p.setting.block_size, p.setting.batch_size, p.setting.speculate)
        curves.setdefault(key, []).append(p)
    out = []
    for (model, w, block, batch, spec), pts in curves.items():
        rho, y = [p.tokens_per_step for p in pts], [100 * p.quality for p in pts]
        kept = aup_points(rho, y)
        out.append(AupScore(model, pts[0].family, w, block, batch, aup(rho, y, y_max), y_max, len(kept), len(pts),
                            kept[-1][0], speculate=spec))
    return out
