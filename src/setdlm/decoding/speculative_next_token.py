"""Self-speculative SetDLM decoding verified by the clean stream's next-token head: the window drafts, the
model read as an AR model verifies, in one forward of about ``2w`` positions (docs/decoding.md, "Verifying
with the next-token head"; docs/method.md §2.10).

The clean stream of a SetDLM is a causal LM over the tokens in cache order (docs/method.md §2.4); in position
order it is an AR model over the same network, and a model trained with ``ar_weight > 0`` (a next-token loss
on that stream) predicts the next token from it. ``speculate="next_token"`` decodes that AR model's output, token for
token (the AR decoder of :mod:`setdlm.decoding.ar` on the same weights), with the SetDLM's window as the
drafter. Per row, with ``m_0 = f, m_1, ..`` the masked positions in order and a draft ``d_0 .. d_{k-1}`` at
``m_0 .. m_{k-1}`` (``k <= w − 1``), one forward takes

    [ pending | d_0 .. d_{k-1} (clean) | masks at m_{k+1} .. m_{k+w-1} ]

*pending* (the token committed last, at ``m_0 − 1``, not cached yet) and the draft are causal by position; the
output of the clean slot before ``m_i`` is the next-token prediction at ``m_i`` given the committed prefix and
``d_0 .. d_{i-1}``: the verifier of ``d_i`` (``i < k``) and the token after the whole draft (``i = k``). The
masks see the cache, every clean slot and themselves (the two-stream mask with horizon ``m_k``,
:func:`setdlm.masks.speculative_step_mask`): the window's guesses past ``m_k``, made before ``m_k`` is known.

The rule is that of :mod:`setdlm.decoding.speculative`: the verifier's token at ``m_0`` is committed, then the one
at ``m_i`` while ``d_{i-1}`` equals the verifier's token at ``m_{i-1}``; the pending token and the accepted drafts
stay in the cache (their keys and values were computed over exactly the tokens the AR decode has cached before
them), so the cache after every step is the AR decode's. The next draft: after a whole draft is accepted, the
window's masks (drafted before the verifier's token at ``m_k`` was known); after a rejection, the drafts past the
rejected one (guessed without it: a guess made after it, conditioned on a wrong token, is accepted far less often:
2.8 against 3.6 tokens per forward at ``w = 6`` on word problems, docs/decoding.md). Any draft keeps the output
exact. One forward feeds ``k + 1`` clean slots and ``w − 1`` masks, ``2w − 1`` positions at a full draft, where the
``window=1``-verified decode (:mod:`speculative`) feeds ``3w − 1``: the clean slot that writes a token into the
cache is its verifier too.

Sampling: one U[0, 1) per generated position, in position order, from the row's generator, drawn up front, as
the AR decode draws them; a draft is accepted iff it equals the verifier's sample. Constraints, penalties, stop
strings, EOS and ``max_new_tokens`` act on the same tokens as in the AR decode.

Generation only: every masked position of a row follows its clean tokens (no suffix: the next-token head sees
the tokens before a position, docs/method.md §4.6), prompt + new tokens within the context length (the AR
decode evicts entries past L, §4.5), and at least one token before the first MASK.
"""

from __future__ import annotations

import functools
from typing import cast

import torch
from torch import Tensor

from ..errors import UserError
from ..masks import speculative_step_mask, with_cache
from .speculative import DraftRows, position_uniforms, predict, verify
from .state import DecodeState, prefill as prefill_positions


def init(backbone, st: DecodeState) -> None:
    """Check the rows (docstring, "Generation only"), draw each generated position's uniform, cache every token
    before the last one preceding the first MASK, causally; that last token is pending."""
    start(backbone, st, 2 * st.cfg.window)  # + one step's inputs


def start(backbone, st: DecodeState, room: int) -> None:
    """:func:`init` with a cache of ``room`` entries beyond the rows for one step's inputs (shared with the
    drafter's decode, :mod:`setdlm.decoding.speculative_drafter`)."""
    check_rows(st)
    st.cache = backbone.new_cache(st.batch, capacity=min(st.canvas, st.cfg.context_length) + room)
    last = st.first_masked - 1  # (B,) the last clean token, fed by the first step (pending: always at f − 1)
    st.extra = DraftRows(drafted=torch.zeros_like(st.masked), draft=torch.zeros_like(st.tokens),
                         u=position_uniforms(st))
    prefill_positions(backbone, st, st.pos < last[:, None])


def check_rows(st: DecodeState) -> None:
    """The rows' contract (docstring, "Generation only"): a UserError naming speculate otherwise."""
    L = st.cfg.context_length
    if bool((st.length > L).any()):
        raise UserError(f"speculate='next_token' needs prompt + max_new_tokens <= the context length L={L}: the AR "
                        f"decode "
                        f"it reproduces evicts cache entries past L (docs/method.md §4.5)", fields=("speculate",))
    if bool((st.first_masked < 1).any()):
        raise UserError("speculate='next_token' needs at least one token before the first MASK position (the "
                        "next-token "
                        "head predicts a position from the one before it)", fields=("speculate",))
    inside = st.pos < st.length[:, None]  # (B, N+1)
    after = st.pos >= st.first_masked[:, None]
    if bool((inside & after & ~st.masked).any()):
        raise UserError("speculate='next_token' decodes left to right with the next-token head, which sees only the "
                        "tokens "
                        "before a position: a sequence with tokens after a MASK (infilling) needs speculate=True",
                        fields=("speculate",))


def step(backbone, st: DecodeState) -> None:
    """One forward: cache the pending token and the draft, verify the draft with the next-token head, commit the
    verified prefix plus the head's next token, keep the accepted drafts cached, take the next draft."""
    w, N, pos = st.cfg.window, st.canvas, st.pos
    rows = cast(DraftRows, st.extra)
    drafted, draft = rows.drafted, rows.draft  # (B, N+1) each
    # a row's masked positions are f, f+1, .. up to its end (init checked it; commits extend the prefix), the
    # pending token (the last committed, one per row) sits at f − 1 and the draft at f .. f+k−1: every slot's
    # position is arithmetic
    f, end = st.first_masked[:, None], st.length[:, None]  # (B, 1) each
    k = drafted.sum(-1)  # (B,) draft lengths
    K = int(k.max())
    h = torch.arange(K + 1, device=st.device)  # (K+1,) clean slot i (pending, d_0, ..) predicts m_i = f + i
    clean_ok = h <= k[:, None]  # (B, K+1)
    clean_pos = torch.where(clean_ok, f - 1 + h, N)
    v_ok = clean_ok & (f + h < end)  # (B, K+1) the verifiers (the next-token head at m_i)
    v_pos = torch.where(v_ok, f + h, N)
    w_rank = k[:, None] + 1 + torch.arange(w - 1, device=st.device)  # (B, w−1) ranks k+1 .. k+w−1
    q_ok = f + w_rank < end  # (B, w−1) the window's masks
    q_pos = torch.where(q_ok, f + w_rank, N)
    m_k = f + k[:, None]  # (B, 1) the horizon: the masks see every clean slot before m_k
    slot_pos, valid = torch.cat([clean_pos, q_pos], 1), torch.cat([clean_ok, q_ok], 1)  # (B, T)
    ids = torch.cat([torch.where(drafted, draft, st.tokens).gather(1, clean_pos), st.tokens.gather(1, q_pos)], 1)
    mask = with_cache(_step_mask(K + 1, w - 1, st.device) & valid[:, None, :] | eye(K + w, st.device), st.kv.width)
    start = st.kv.lengths.clone()  # (B,) then the pending token
    logits = backbone(ids, slot_pos, mask, st.kv, keep=clean_ok.sum(-1), logits_start=0)  # (B, K+1 + w−1, V)

    # every prediction, as (position predicted, horizon = the drafts it takes as committed): verifiers then masks
    p_pos, p_ok = torch.cat([v_pos, q_pos], 1), torch.cat([v_ok, q_ok], 1)  # (B, P)
    p_hor = torch.cat([v_pos, m_k.expand_as(q_pos)], 1)  # (B, P)
    tok, conf = predict(st, logits, p_pos, p_ok, p_hor)  # (B, P) each
    acc, commit = verify(st, start + 1, v_pos, v_ok, tok[:, : K + 1], conf[:, : K + 1], slot_pos, valid)

    m_acc = v_pos.gather(1, acc[:, None])  # (B, 1) the verifier's own token, the last committed (N: none)
    whole = (acc == k)[:, None]  # (B, 1) the whole draft accepted: the window's masks are the next draft
    nxt = torch.where(whole & q_ok, q_pos, N)  # (B, w−1)
    rows.drafted = torch.where(whole, (pos > m_acc) & (pos < end) & (pos < m_acc + w), drafted & (pos > m_acc))
    rows.draft = draft.scatter(1, nxt, tok[:, K + 1:])  # else the drafts past the rejected one stay


@functools.lru_cache(maxsize=64)
def _step_mask(n_clean: int, n_masks: int, device) -> Tensor:
    """(n_clean + n_masks, n_clean + n_masks) bool: the step's mask among its slots when every slot is valid
    (:func:`setdlm.masks.speculative_step_mask` with every mask's horizon past the whole draft): clean slots
    causal, each mask sees every clean slot and itself. A step ANDs its rows' valid columns in and ORs the
    diagonal back (a slot always sees itself)."""
    pos = torch.arange(n_clean, device=device)
    horizon = torch.full((1, n_masks), n_clean, device=device)
    ok = torch.ones(1, n_clean, dtype=torch.bool, device=device)
    return speculative_step_mask(pos[None], ok, horizon, torch.ones(1, n_masks, dtype=torch.bool, device=device))[0]


@functools.lru_cache(maxsize=64)
def eye(n: int, device) -> Tensor:
    """(n, n) bool identity: every slot sees itself."""
    return torch.eye(n, dtype=torch.bool, device=device)


@functools.lru_cache(maxsize=64)
def causal_mask(n: int, device) -> Tensor:
    """(n, n) bool: slot i sees slots 0..i (clean slots in position order)."""
    return torch.ones(n, n, dtype=torch.bool, device=device).tril()
