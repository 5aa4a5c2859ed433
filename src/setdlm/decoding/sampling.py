"""Logits processors, candidate selection and the shared commit rule (docs/method.md §4.3, §5.3).

Every decoder predicts a set of masked *query* positions per row and calls :func:`propose` and
:func:`commit_rule` on their logits:

1. processors on the raw logits, in this order: repetition penalty (HF's multiplicative rule: a positive
   logit is divided by the penalty, a negative one multiplied), the EOS-boosting exponential length
   penalty (HF's ``ExponentialDecayLengthPenalty``: after ``start`` generated tokens the EOS logit grows by
   ``|logit|·(factor^(n − start) − 1)``, ``n`` = generated tokens visible before the query's position),
   MASK → −∞ (it is never predicted, docs/method.md §7.16), tokens outside a constraint's allowed set → −∞
   (docs/decoding.md "Constrained decoding"), temperature, top-k, top-p (keep the most probable
   tokens up to and including the one whose cumulative probability crosses ``p``, renormalise);
2. candidate ``x̂`` = argmax (``temperature = 0``) or a sample; confidence ``c = p(x̂)`` under the processed
   distribution;
3. commit the most confident query plus every query with ``c ≥ τ`` (``τ`` off: exactly one). The
   reference's ``num_to_decode = 0`` slice bug cannot occur: the top-1 is always committed.

Sampling draws come from one ``torch.Generator`` per row, and a row draws exactly one number per query,
so a row's samples do not depend on which other rows share its batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class Sampling:
    """How a distribution over the vocabulary is formed and sampled, and the commit threshold. Built by
    :meth:`setdlm.decoding.settings.DecodeSettings.sampling`, which checks every value."""

    mask_token_id: int
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    repetition_penalty: float = 1.0
    length_penalty: tuple[int, float] | None = None  # (start, factor), boosts EOS
    threshold: float | None = None  # τ; None = off (exactly one token per step)
    eos_token_ids: tuple[int, ...] = ()

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def plain_greedy(self) -> bool:
        """Greedy with no processor besides MASK removal."""
        return (self.greedy and self.top_p == 1.0 and self.top_k == 0 and self.repetition_penalty == 1.0
                and self.length_penalty is None)


def process_logits(logits: Tensor, s: Sampling, seen: Tensor | None = None, gen_len: Tensor | None = None,
                   allowed: Tensor | None = None) -> Tensor:
    """Processed log-probabilities (B, Q, V) from raw logits (B, Q, V), in at least float32.

    ``seen`` (B, V), or (B, Q, V) per query: count of each token in the penalised context; ``gen_len`` (B, Q):
    generated tokens visible before each query (length penalty); ``allowed`` (B, Q, V) bool: a constraint's allowed
    tokens."""
    x = logits.to(torch.promote_types(logits.dtype, torch.float32))
    if s.repetition_penalty != 1.0 and seen is not None:
        hit = (seen > 0) if seen.dim() == 3 else (seen > 0)[:, None, :]  # (B, Q|1, V)
        x = torch.where(hit, torch.where(x > 0, x / s.repetition_penalty, x * s.repetition_penalty), x)
    if s.length_penalty is not None and gen_len is not None:
        start, factor = s.length_penalty
        over = (gen_len - start).clamp(min=0).to(x.dtype)  # (B, Q)
        boost = torch.pow(torch.as_tensor(float(factor), dtype=x.dtype), over) - 1.0  # 0 until past start
        eos = torch.tensor(s.eos_token_ids, device=x.device)
        e = x.index_select(-1, eos)  # (B, Q, n_eos)
        x = x.index_copy(-1, eos, e + e.abs() * boost[..., None])
    x = x.index_fill(-1, torch.tensor([s.mask_token_id], device=x.device), float("-inf"))
    if allowed is not None:
        x = x.masked_fill(~allowed, float("-inf"))
    if not s.greedy:
        x = x / s.temperature
    if s.top_k and s.top_k < x.shape[-1]:
        kth = x.topk(s.top_k, dim=-1).values[..., -1:]  # (B, Q, 1)
        x = x.masked_fill(x < kth, float("-inf"))
    logp = torch.log_softmax(x, dim=-1)
    if s.top_p < 1.0:
        sp, si = logp.sort(dim=-1, descending=True)
        p = sp.exp()
        drop = (p.cumsum(-1) - p) >= s.top_p  # mass strictly before the token already reaches top_p
        logp = logp.masked_fill(torch.zeros_like(drop).scatter(-1, si, drop), float("-inf"))
        logp = logp - logp.logsumexp(-1, keepdim=True)
    return logp


def uniforms(valid: Tensor, generators: list[torch.Generator]) -> Tensor:
    """U[0, 1) draws (B, Q) float64: row b draws one number per valid query from its own generator."""
    u = torch.zeros(valid.shape, dtype=torch.float64, device=valid.device)
    counts = valid.sum(-1).tolist()
    draws = [torch.rand(n, generator=g, dtype=torch.float64, device=valid.device) for g, n in zip(generators, counts)]
    u[valid] = torch.cat(draws)
    return u


def propose(logits: Tensor, valid: Tensor, s: Sampling, generators: list[torch.Generator] | None,
            seen: Tensor | None = None, gen_len: Tensor | None = None, allowed: Tensor | None = None,
            u: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Candidate token and its confidence for every query: (B, Q) long, (B, Q) float. ``allowed``
    (B, Q, V) bool: only these tokens may be proposed (a constraint); the confidence is then the
    probability among them. When sampling, ``u`` (B, Q) float64 gives each query's U[0, 1) draw (default:
    drawn from the rows' generators)."""
    if s.plain_greedy:  # the common case, in fewer ops: argmax and its softmax probability
        x = logits.to(torch.promote_types(logits.dtype, torch.float32))
        x = x.index_fill(-1, torch.tensor([s.mask_token_id], device=x.device), float("-inf"))
        if allowed is not None:
            x = x.masked_fill(~allowed, float("-inf"))
        conf, tok = torch.softmax(x, dim=-1).max(-1)
        return tok, conf
    logp = process_logits(logits, s, seen, gen_len, allowed)  # (B, Q, V)
    if s.greedy:
        lp, tok = logp.max(-1)
        return tok, lp.exp()
    cdf = logp.exp().to(torch.float64).cumsum(-1)  # (B, Q, V)
    if u is None:
        assert generators is not None, "a sampling decode has one generator per row (built with its state)"
        u = uniforms(valid, generators)
    u = u * cdf[..., -1]  # (B, Q)
    tok = torch.searchsorted(cdf, u[..., None], right=True)[..., 0].clamp(max=cdf.shape[-1] - 1)
    return tok, logp.gather(-1, tok[..., None])[..., 0].exp()


def commit_rule(conf: Tensor, valid: Tensor, threshold: float | None) -> Tensor:
    """Which queries to commit (B, Q) bool: the most confident valid query of each row (first on ties),
    plus every valid query with ``conf >= threshold``."""
    best = conf.masked_fill(~valid, -1.0).argmax(-1, keepdim=True)  # (B, 1)
    commit = torch.zeros_like(valid).scatter_(-1, best, True) & valid
    if threshold is not None:
        commit |= valid & (conf >= threshold)
    return commit
