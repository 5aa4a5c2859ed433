"""Speculative decoding of a frozen base with a set drafter beside it: the base verifies, the drafter drafts a
window from the base's cached hidden states (docs/drafter.md; the backbone: :mod:`setdlm.formats.drafted`).

``speculate="next_token"`` on a drafted model. Per row, with ``f`` the first position not committed and a draft
``d_0 .. d_{k-1}`` at ``f .. f+k−1`` (``k <= w − 1``), one step is

1. one base forward over ``[ pending | d_0 .. d_{k-1} ]``, causal by position (*pending*: the token committed
   last, at ``f − 1``, not cached yet): the output at the slot before ``f + i`` is the base's next-token
   prediction at ``f + i`` given the committed prefix and ``d_0 .. d_{i-1}``, the verifier of ``d_i`` (and, at
   ``i = k``, the token after the whole draft). The same forward caches the drafter's context for these slots.
2. The rule of :mod:`setdlm.decoding.speculative`: the verifier's token at ``f`` is committed, then the one at
   ``f + i`` while ``d_{i-1}`` equals the verifier's token at ``f + i − 1``; the cache is cropped to the pending
   token and the accepted drafts, computed over exactly what the AR decode has cached before them. So the
   cache after every step, and every committed token, is the base's AR decode's.
3. The drafter's window ``[b, MASK × (w − 1)]`` at ``m .. m+w−1`` (``b`` the token just committed at ``m``) over
   the cache proposes the next draft at ``m+1 .. m+w−1``, greedily (any draft keeps the output exact).

Sampling: one U[0, 1) per generated position, in position order, drawn up front from the row's generator, as
the AR decode draws them; a draft is accepted iff it equals the verifier's sample. Constraints, penalties, stop
strings, EOS and ``max_new_tokens`` act on the same tokens as in the AR decode. Generation only, prompt + new
tokens within the context length, at least one prompt token (as :mod:`speculative_next_token`, whose checks
these are).
"""

from __future__ import annotations

from typing import cast

import torch

from ..masks import with_cache
from . import speculative_next_token
from .speculative import DraftRows, predict, verify
from .state import DecodeState


def init(backbone, st: DecodeState) -> None:
    """Check the rows, draw each generated position's uniform, cache every token before the last one preceding
    the first MASK (with the drafter's context); that last token is pending."""
    speculative_next_token.start(backbone, st, st.cfg.window + 1)


def step(backbone, st: DecodeState) -> None:
    """One base forward (verify, cache), the commit, one drafter pass (the next draft)."""
    N = st.canvas
    rows = cast(DraftRows, st.extra)
    drafted, draft = rows.drafted, rows.draft  # (B, N+1) each
    f, end = st.first_masked[:, None], st.length[:, None]  # (B, 1) each
    k = drafted.sum(-1)  # (B,) draft lengths
    K = int(k.max())
    h = torch.arange(K + 1, device=st.device)  # (K+1,)
    clean_ok = h <= k[:, None]  # (B, K+1)
    clean_pos = torch.where(clean_ok, f - 1 + h, N)  # pending at f − 1, the draft at f ..
    v_ok = clean_ok & (f + h < end)  # (B, K+1) the verifiers
    v_pos = torch.where(v_ok, f + h, N)
    ids = torch.where(drafted, draft, st.tokens).gather(1, clean_pos)  # (B, K+1)
    causal = speculative_next_token.causal_mask(K + 1, st.device)  # (K+1, K+1)
    mask = with_cache(causal & clean_ok[:, None, :] | speculative_next_token.eye(K + 1, st.device), st.kv.width)
    start = st.kv.lengths.clone()  # (B,)
    logits = backbone(ids, clean_pos, mask, st.kv, keep=clean_ok.sum(-1))  # (B, K+1, V)
    tok, conf = predict(st, logits, v_pos, v_ok, v_pos)  # (B, K+1) each
    acc, _ = verify(st, start + 1, v_pos, v_ok, tok, conf, clean_pos, clean_ok)
    _next_draft(backbone, st, v_pos.gather(1, acc[:, None]), end)  # the verifier's token at m: the last committed


def _next_draft(backbone, st: DecodeState, m, end) -> None:
    """The drafter's window after the token just committed at ``m`` (B, 1) (``N``: none): the next draft."""
    w, N, pos = st.cfg.window, st.canvas, st.pos
    live = m < end  # (B, 1) a row with positions left to draft for
    off = torch.arange(w, device=st.device)
    wpos = torch.where(live, m + off, 0)  # (B, w) may run past the canvas: those drafts are dropped
    ids = st.tokens.gather(1, m).expand(-1, w)  # (B, w): the committed token; the drafter reads the rest as MASKs
    logits = backbone.draft(ids, wpos, st.kv)  # (B, w−1, Vd)
    guess = backbone.drafter.vocab_map[logits.argmax(-1)]  # (B, w−1) token ids
    ok = live & (wpos[:, 1:] < end)  # (B, w−1)
    at = torch.where(ok, wpos[:, 1:], N)
    rows = cast(DraftRows, st.extra)
    rows.drafted = (pos > m) & (pos < end) & (pos < m + w) & live
    rows.draft = rows.draft.scatter(1, at, guess)
