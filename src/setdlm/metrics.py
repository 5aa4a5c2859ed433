"""Scores and summaries used by evaluation and benchmarks (docs/method.md §4.10, §5.1, §5.2, §5.4).

* ``extract_answer`` / ``exact_match`` — GSM8K-style scoring: the integer after the first ``####`` in a
  completion must equal the reference (docs/method.md §5.2; lm-eval's strict match reads the same line).
* ``rouge`` — ROUGE-1/2/L F-measure of predictions against references through the ``rouge-score`` package
  (optional extra ``eval``), as HF ``evaluate``'s ``rouge`` metric does for the paper's infilling table
  (docs/method.md §5.4), but averaged exactly instead of by bootstrap.
* ``LikelihoodSummary`` — nats/token, perplexity and bits/token from summed nats and token counts (docs/method.md §5.1:
  ``nll = Σ nll / Σ tokens`` over the whole split, never a mean of per-batch means).
* ``throughput_stats`` — decoding speed the paper's way (docs/method.md §4.10, §7.20): tokens/s of each call after
  the warm-up calls, their mean and standard deviation, plus the aggregate tokens/s; only *generated*
  tokens count (the prompt does not), while the latency includes the prompt prefill.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass
from typing import Sequence

from .errors import UserError

# ---------------------------------------------------------------------------------------------------------
# exact match of the final answer (GSM8K)
# ---------------------------------------------------------------------------------------------------------

# "#### 1,234", "####-5", "#### − 7", "#### $12", "#### 12.00"
_ANSWER = re.compile(r"####[ \t]*\$?[ \t]*([-−–]?)[ \t]*(\d[\d,]*)(\.\d+)?")


def extract_answer(text: str) -> int | None:
    """The integer after the first ``####`` in ``text``, or None when there is none.

    Robust to spaces around the number and the sign, thousands separators (``1,234``), a leading ``$``,
    Unicode minus signs and a zero fraction (``12.00``). A non-zero fraction (``2.5``) is not an integer
    and gives None, as does a missing ``####`` line: both score as wrong.
    """
    m = _ANSWER.search(text)
    if m is None:
        return None
    sign, digits, frac = m.groups()
    if frac is not None and frac.strip(".0"):
        return None
    value = int(digits.replace(",", ""))
    return -value if sign else value


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
