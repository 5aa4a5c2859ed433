"""Lossless self-speculative SetDLM decoding: the window drafts, the left-to-right decode verifies, in the
same forward (docs/decoding.md, "Self-speculative decoding"; docs/method.md §2.4, §4.2).

A SetDLM holds two decoders in one network. Its window (``w > 1``) proposes several tokens per forward; its
left-to-right limit (``window=1``, threshold off: position ``f`` decoded given every position before it) is
its most careful decode. This decoder produces exactly the ``window=1`` output, token for token, in fewer
forwards. Per row, with ``f`` the first position not committed, ``m_0 = f, m_1, ..`` the masked positions in
order and a draft ``d_0 .. d_{k-1}`` at ``m_0 .. m_{k-1}`` (``k <= w − 1`` tokens the previous forward
proposed), one forward takes

    [ pending | d_0 .. d_{k-1} (clean) | for each horizon i = 0..k: masks at m_i .. m_{i+w-1} ]

where *pending* is the token committed last step and not cached yet. Clean slots are causal among themselves
(by position); a mask of horizon ``i`` sees the whole cache, the clean slots at positions ``< m_i`` and
itself (:func:`setdlm.masks.speculative_step_mask`): the two-stream training mask of docs/method.md §2.4 with
the draft in the clean stream. So the first mask of horizon ``i`` (the *verifier* at ``m_i``) holds the
left-to-right conditional at ``m_i`` given the committed prefix followed by ``d_0 .. d_{i-1}``, and the other
``w − 1`` masks of horizon ``i`` are the window's draft of the positions after ``m_i`` given that prefix.

The rule: the verifier's token at ``m_0`` is committed; for ``i = 1, 2, ..`` the verifier's token at ``m_i`` is
committed while ``d_{i-1}`` equals the verifier's token at ``m_{i-1}`` (that draft is *accepted*). The first
mismatch, or ``m_k`` once every draft is accepted, ends the step with the verifier's own token. By induction
over the committed positions every token is the one the ``window=1`` decode commits, so stop strings, EOS
and ``max_new_tokens`` act on the same tokens. The accepted drafts' keys and values were computed over exactly
the tokens the ``window=1`` decode has cached before them, so they stay in the cache (the forward keeps the
pending token and the accepted prefix of the draft, nothing else): the cache after every step is the
``window=1`` cache. The next draft is the window of the horizon the step ended on: its ``w − 1`` masks after
the last committed position, drafted from the now committed prefix. ``window=1`` drafts nothing and is the
plain left-to-right decode. One forward costs ``k + 1`` clean tokens and ``(k + 1)·w`` masks (``<= w²``).

Cheaper verification: only one horizon's window becomes the next draft, known after the forward. The
``"last"`` query layout (the setting ``verify_layout``) gives a window only to horizon ``k`` (the whole draft accepted)
and its verifier alone to every other horizon: ``2k + w + 1`` positions instead of ``k + 1 + (k + 1)·w``.
After a rejection at ``m_i`` the next draft is what this forward guessed at ``m_{i+1} .. m_{i+w-1}`` (later
verifiers and the last window, conditioned on the rejected token): stale, but any draft keeps the output
exact, since verification alone decides what is committed (docs/decoding.md, "Two query layouts").

Sampling: the ``window=1`` decode draws one U[0, 1) per generated position, in position order, from the row's
generator. Here each position gets its draw up front; every query at that position samples with it (inverse
CDF), and a draft is accepted iff it equals the verifier's sample, so a seeded row gives the ``window=1``
tokens of that seed (and hence their distribution).

Not supported: prompt + new tokens beyond the context length (the ``window=1`` decode evicts cache entries
there, docs/method.md §4.5, and the verifiers would each need their own eviction), and the reveal cache
order (the ``window=1`` cache is in position order).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, cast

import torch
from torch import Tensor

from ..errors import UserError
from ..masks import speculative_step_mask, with_cache
from .sampling import process_logits, propose
from .state import DecodeState, RowTensors, prefill as prefill_positions
from .structured.enforce import allowed_given_drafts, vet_verified

if TYPE_CHECKING:
    from .settings import VerifyLayout


@dataclass
class DraftRows(RowTensors):
    """Per row: where a draft waits to be verified, its tokens, and each generated position's uniform."""

    drafted: Tensor  # (B, N+1) bool: positions holding a draft to verify
    draft: Tensor  # (B, N+1) the draft tokens (where drafted)
    u: Tensor  # (B, N+1) float64: each generated position's U[0, 1) draw (position_uniforms)


@dataclass
class SpeculativeRows(DraftRows):
    pending: Tensor  # (B, N+1) bool: committed last step, cached by the next forward


def init(backbone, st: DecodeState) -> None:
    """Check the rows fit the context, draw each generated position's uniform (when sampling), cache every
    non-MASK token in ascending position, causally."""
    L = st.cfg.context_length
    if bool((st.length > L).any()):
        raise UserError(f"speculate needs prompt + max_new_tokens <= the context length L={L}: the left-to-right "
                        f"decode it reproduces evicts cache entries past L (docs/method.md §4.5)")
    w = st.cfg.window
    st.cache = backbone.new_cache(st.batch, capacity=min(st.canvas, L) + w * (w + 1))  # + one step's inputs
    st.extra = SpeculativeRows(drafted=torch.zeros_like(st.masked), draft=torch.zeros_like(st.tokens),
                               u=position_uniforms(st), pending=torch.zeros_like(st.masked))
    prefill_positions(backbone, st, ~st.target & (st.pos < st.length[:, None]))


def position_uniforms(st: DecodeState) -> Tensor:
    """(B, N+1) float64: the U[0, 1) draw of each generated position, taken from the row's generator one at a
    time in position order, as the ``window=1`` decode draws them (zeros when greedy)."""
    u = torch.zeros(st.batch, st.canvas + 1, dtype=torch.float64, device=st.device)
    if st.cfg.sampling.greedy:
        return u
    if st.generators is None:
        raise RuntimeError("a sampled decode needs a generator per row (the decode state makes one per row)")
    for b, g in enumerate(st.generators):
        n = int(st.target[b].sum())
        draws = [torch.rand(1, generator=g, dtype=torch.float64, device=st.device) for _ in range(n)]
        u[b, st.target[b]] = torch.cat(draws) if draws else u.new_zeros(0)
    return u


def _ascending(select: Tensor, pos: Tensor, N: int) -> tuple[Tensor, Tensor]:
    """The selected canvas positions of each row, ascending, padded with the trash column ``N``:
    positions (B, T) and valid (B, T), ``T`` = the largest count. ``select``: (B, N+1)."""
    counts = select.sum(-1)  # (B,)
    T = int(counts.max()) if select.shape[0] else 0
    key = torch.where(select, pos, pos + N + 1)  # (B, N+1)
    idx = key.topk(T, dim=-1, largest=False, sorted=True).indices  # (B, T)
    valid = torch.arange(T, device=pos.device) < counts[:, None]
    return torch.where(valid, idx, N), valid


# Which horizons carry a whole window of masks (module docstring, "Cheaper verification"; the setting
# ``verify_layout``): "all" (every horizon: the next draft is ready wherever the step ends; (K+1)·w masks), "last"
# (only the horizon a row's whole draft leads to, the others their verifier alone: K+w masks; a step that rejects a
# draft leaves no draft for the next one, which then drafts afresh), or "auto": :func:`windowed_horizons` picks by
# batch size.
ALL_HORIZONS_UP_TO = 0  # "auto": batches up to this many rows take "all". 0: on a CPU "last" was faster at batch 1
# too (word problems, w = 4/5/6: 1.65/1.77/1.79x AR against 1.56/1.61/1.66x; benchmarks/RESULTS.md, "Faster than
# AR at AR's accuracy"); where a forward of tens of positions costs what one does (a GPU at batch 1), "all"
# commits more per forward: pass verify_layout="all"
ALL_HORIZONS_MASKS = 64  # "auto" never feeds more than this many masks per row for "all" (w² <= 64: w <= 8), so
# a wide window costs about 3w positions a forward, not w + w² (a server's window=128 would be 16,512)


def windowed_horizons(batch: int, window: int = 1, layout: VerifyLayout = "auto",
                      all_up_to: int = ALL_HORIZONS_UP_TO) -> Literal["all", "last"]:
    """"all" or "last" for a step of ``batch`` rows at window ``window`` under the setting ``layout``
    ("auto" picks "all" for batches of up to ``all_up_to`` rows whose window squared stays within
    :data:`ALL_HORIZONS_MASKS`)."""
    if layout != "auto":
        return layout
    return "all" if batch <= all_up_to and window * window <= ALL_HORIZONS_MASKS else "last"


def _queries(k: Tensor, h: Tensor, w: int, layout: str) -> tuple[Tensor, Tensor, Tensor]:
    """The step's mask queries as (horizon, offset) pairs, per row: ``hq``, ``oq`` (B, Q) and the columns of
    the verifiers (offset 0 of horizons 0..K, in order) ``vcols`` (K+1,). ``k``: (B,) draft lengths;
    ``h``: the horizons 0..K (K+1,)."""
    B, dev, K = k.shape[0], k.device, h.shape[0] - 1
    if layout == "all":  # horizon i = 0..K, offset o = 0..w-1
        hq = h.repeat_interleave(w).expand(B, -1)  # (B, (K+1)·w)
        oq = torch.arange(w, device=dev).repeat(K + 1).expand(B, -1)
        return hq, oq, h * w
    # "last": the K+1 verifiers, then offsets 1..w-1 of horizon k (the row's whole draft accepted)
    hq = torch.cat([h.expand(B, -1), k[:, None].expand(B, w - 1)], 1)  # (B, K+w)
    oq = torch.cat([torch.zeros(K + 1, dtype=torch.long, device=dev), torch.arange(1, w, device=dev)])
    return hq, oq.expand(B, -1), h


def step(backbone, st: DecodeState) -> None:
    """One forward: cache the pending token, verify the draft, commit the verified prefix plus the verifier's
    next token, keep the accepted drafts in the cache and take the next draft (module docstring)."""
    w, N, pos = st.cfg.window, st.canvas, st.pos
    rows = cast(SpeculativeRows, st.extra)
    pending, drafted, draft = rows.pending, rows.drafted, rows.draft  # (B, N+1) each
    k = drafted.sum(-1)  # (B,) draft lengths: the drafts sit at the first k masked positions
    K = int(k.max())
    rank = st.masked.cumsum(-1) - 1  # (B, N+1) rank of each masked position
    m_pos, m_ok = _ascending(st.masked & (rank < K + w), pos, N)  # (B, R) masked positions m_0, m_1, ..
    clean_pos, clean_ok = _ascending(pending | drafted, pos, N)  # (B, Tc) pending token, then the draft
    layout = windowed_horizons(st.batch, w, st.cfg.verify_layout)
    h = torch.arange(K + 1, device=st.device)  # (K+1,) the horizons
    hq, oq, vcols = _queries(k, h, w, layout)  # (B, Q), (B, Q), (K+1,)
    R = m_pos.shape[1]
    rank_q = hq + oq  # (B, Q) rank of each query's position among the masked ones
    r = rank_q.clamp(max=R - 1)  # (B, Q)
    q_ok = (hq <= k[:, None]) & (rank_q < R) & m_ok.gather(1, r)  # (B, Q)
    q_pos = torch.where(q_ok, m_pos.gather(1, r), N)  # (B, Q)
    horizon = m_pos.gather(1, hq.clamp(max=R - 1))  # (B, Q) the position m_i of each query's horizon
    Tc = clean_pos.shape[1]
    slot_pos, valid = torch.cat([clean_pos, q_pos], 1), torch.cat([clean_ok, q_ok], 1)  # (B, T)
    ids = torch.cat([torch.where(drafted, draft, st.tokens).gather(1, clean_pos), st.tokens.gather(1, q_pos)], 1)
    mask = with_cache(speculative_step_mask(clean_pos, clean_ok, horizon, q_ok), st.kv.width)  # (B, 1, T, C+T)
    start = st.kv.lengths.clone()  # (B,)
    logits = backbone(ids, slot_pos, mask, st.kv, keep=clean_ok.sum(-1), logits_start=Tc)  # (B, Q, V)
    tok, conf = predict(st, logits, q_pos, q_ok, horizon)  # (B, Q) each
    v_pos, v_ok, v_tok, v_conf = (x[:, vcols] for x in (q_pos, q_ok, tok, conf))  # (B, K+1) the verifiers
    acc, commit = verify(st, start + pending.sum(-1), v_pos, v_ok, v_tok, v_conf, slot_pos, valid)  # (B,), (B, K+1)

    last = torch.where(commit & (h == acc[:, None]), v_pos, N)  # (B, K+1) the verifier's own token
    if layout == "all":  # the window of the horizon the step ended on, past its verifier
        take = (hq == acc[:, None]) & (oq > 0)  # (B, Q)
    else:  # every guess this forward made at the w − 1 positions after the last committed one
        take = (rank_q > acc[:, None]) & (rank_q < acc[:, None] + w)  # (B, Q)
    nxt = torch.where(q_ok & take, q_pos, N)  # (B, Q) the next draft
    rows.pending = _flags(pending, last)
    rows.drafted = _flags(drafted, nxt)
    rows.draft = draft.scatter(1, nxt, tok)


def predict(st: DecodeState, logits: Tensor, q_pos: Tensor, q_ok: Tensor, horizon: Tensor) -> tuple[Tensor, Tensor]:
    """Token and confidence (B, Q) of each prediction of a step: ``logits`` (B, Q, V) for the positions ``q_pos``,
    each taking the drafts before its ``horizon`` as committed (constraints and penalties see them so), sampled
    with its position's uniform."""
    rows = cast(DraftRows, st.extra)
    drafted, draft, V = rows.drafted, rows.draft, logits.shape[-1]
    allowed = None if st.constraints is None else allowed_given_drafts(  # (B, Q, V) docs/decoding.md
        st.constraints, st.tokens, st.masked, drafted, draft, q_pos, q_ok, horizon, V)
    seen, gen_len = _seen(st, drafted, draft, horizon, V), _gen_len(st, drafted, q_pos)
    if st.cfg.top_logprobs and st.traces is not None:  # each prediction's alternatives, for verify's trace
        top = process_logits(logits, st.cfg.sampling, seen, gen_len, allowed).topk(st.cfg.top_logprobs, dim=-1)
        st.step_top = (top.values, top.indices, q_pos, horizon, q_ok)
    return propose(logits, q_ok, st.cfg.sampling, st.generators, seen, gen_len, allowed=allowed,
                   u=rows.u.gather(1, q_pos))


def verify(st: DecodeState, kept: Tensor, v_pos: Tensor, v_ok: Tensor, v_tok: Tensor, v_conf: Tensor,
           slot_pos: Tensor, valid: Tensor) -> tuple[Tensor, Tensor]:
    """The rule (module docstring): the verifiers' tokens ``v_tok`` (B, K+1) at ``v_pos`` against the draft, the
    accepted prefix and the verifier's next token committed, the cache cropped to ``kept`` (B,) entries (what it
    held before the forward and the pending token) plus the accepted drafts, the trace's draft fields. Returns the
    accepted drafts (B,) and what was committed (B, K+1)."""
    rows = cast(DraftRows, st.extra)
    drafted, draft = rows.drafted, rows.draft  # (B, N+1) each
    h = torch.arange(v_pos.shape[1], device=v_pos.device)  # (K+1,)
    is_draft = drafted.gather(1, v_pos) & v_ok  # (B, K+1) verifiers whose position holds a draft
    d_tok = draft.gather(1, v_pos)
    acc = (is_draft & (v_tok == d_tok)).long().cumprod(-1).sum(-1)  # (B,) accepted drafts, a prefix
    if st.constraints is not None:  # a CFG row's tokens vetted in order, as the left-to-right decode commits them
        acc = vet_verified(st.constraints, v_ok, v_tok, is_draft, d_tok, acc)
    commit = v_ok & (h <= acc[:, None])  # (B, K+1) the accepted drafts and the verifier's next token
    st.kv.crop(kept + acc)  # keep the pending token and the accepted drafts
    st.write(v_tok, v_conf, commit, v_pos, v_ok, slot_pos, valid)
    if st.step_top is not None:
        st.trace_top(_verifiers_top(st.step_top, v_pos), v_pos, v_ok)
        st.step_top = None
    if st.traces is not None:
        for b, trace in enumerate(st.traces):
            trace[-1].draft_positions = v_pos[b][is_draft[b]].tolist()
            trace[-1].draft_tokens = d_tok[b][is_draft[b]].tolist()
            trace[-1].accepted = int(acc[b])
    return acc, commit


def _verifiers_top(top, v_pos: Tensor) -> tuple[Tensor, Tensor]:
    """The alternatives (values, indices) (B, K+1, k) of the verifiers at ``v_pos`` (B, K+1) among a step's
    predictions: a verifier is the one prediction of its position whose horizon is that position itself."""
    values, indices, q_pos, horizon, q_ok = top
    hit = (q_pos[:, None, :] == v_pos[:, :, None]) & (horizon[:, None, :] == v_pos[:, :, None]) & q_ok[:, None, :]
    col = hit.int().argmax(-1)[..., None].expand(-1, -1, values.shape[-1])  # (B, K+1, k)
    return values.gather(1, col), indices.gather(1, col)


def _flags(like: Tensor, index: Tensor) -> Tensor:
    """(B, N+1) bool, True at the columns ``index`` (B, Q) holds (the trash column stays False)."""
    out = torch.zeros_like(like).scatter_(1, index, True)
    out[:, -1] = False
    return out


def _seen(st: DecodeState, drafted: Tensor, draft: Tensor, horizon: Tensor, V: int) -> Tensor | None:
    """Repetition-penalty counts per query (B, Q, V): the committed ones plus the draft tokens before the
    query's horizon (what the ``window=1`` decode has committed there, if those drafts are accepted)."""
    if st.cfg.sampling.repetition_penalty == 1.0:
        return None
    if st.seen is None:
        st.seen = st._initial_seen(V)
    before = (drafted[:, None, :] & (st.pos < horizon[:, :, None])).long()  # (B, Q, N+1)
    seen = st.seen[:, None, :].repeat(1, horizon.shape[1], 1)  # (B, Q, V)
    return seen.scatter_add_(2, draft[:, None, :].expand_as(before), before)


def _gen_len(st: DecodeState, drafted: Tensor, q_pos: Tensor) -> Tensor | None:
    """Length-penalty counts per query (B, Q): generated tokens committed or drafted before its position."""
    if st.cfg.sampling.length_penalty is None:
        return None
    done = (st.target & (~st.masked | drafted)).long()  # (B, N+1)
    return (done.cumsum(-1) - done).gather(1, q_pos)
