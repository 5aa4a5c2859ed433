"""SetDLM sliding-window decoding with a KV cache updated after every step (docs/method.md §4.2, §4.3, §4.5, §4.6).

Per row: ``f`` = first still-masked position; the window holds the masked positions in ``[f, f + w)``
(positional, so never more than ``w`` masks). One forward per step, with input

    [tokens committed last step (clean, not yet cached) | masked positions of the window]

at their own position ids. Clean tokens see the whole cache and the clean tokens before them (causal);
each mask sees the cache, every new clean token and itself; no clean token sees a mask. This is the
training mask with cache + new clean tokens as the x0 stream and the masks as queries ranked after them.
``keep = #clean`` persists the clean tokens' K/V and drops the masks', so the tokens committed at step
``i`` enter the cache inside the forward of step ``i + 1``, with no extra forward (docs/method.md §7.10). Step 0 has
no clean tokens and persists nothing. The commit rule is :func:`setdlm.decoding.sampling.commit_rule`.

Newly cached tokens go in ascending position (``cache_order="position"``, the paper's default and the
infilling rule) or by decreasing sampled reveal time (``"reveal"``, ``setdlm_fht_cache_order``: slot ``j`` of
the ``N`` generated positions uses offset ``loc[L − N + j]`` of the length-``L`` schedule), or by decreasing
explicit reveal times (``reveal_times=``, to replay a given decode).

Prefill caches every non-MASK token in ascending position, causally (the prompt; for infilling the prefix
and the suffix: ``cache_full_infill_context``). On overflow (cache + new tokens > L) the entries with the
smallest positions are evicted (docs/method.md §4.5); remaining cached tokens stay visible to every query.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import torch
from torch import Tensor

from ..errors import UserError
from ..masks import setdlm_step_mask
from .state import DecodeState, RowTensors, forward, prefill as prefill_positions


@dataclass
class SetDLMRows(RowTensors):
    pending: Tensor  # (B, N+1) bool: committed last step, cached by the next forward
    pend_key: Tensor  # (B, N+1) the order in which pending tokens enter the cache (position, or reveal rank)


def init(backbone, st: DecodeState) -> None:
    """Cache every non-MASK token (prompt, or infilling context) in ascending position, causally."""
    st.cache = backbone.new_cache(st.batch, capacity=min(st.canvas, st.cfg.context_length) + 2 * st.cfg.window)
    pending = torch.zeros_like(st.masked)  # (B, N+1) committed last step, not yet cached
    # sort keys of the step input: clean tokens by pend_key (position, or reveal rank), then the window's
    # masks by position, then everything else
    st.extra = SetDLMRows(pending=pending, pend_key=st.pos.expand(st.batch, -1).clone())  # (B, N+1) each
    st.shared["win_key"] = st.pos + (st.canvas + 1)  # (N+1,)
    st.shared["rest_key"] = st.pos + 2 * (st.canvas + 1)
    w = st.cfg.window
    if w <= 32:  # the input mask for every count of clean tokens, precomputed: (w+1, 2w, 2w)
        st.shared["mask_table"] = setdlm_step_mask(torch.arange(w + 1, device=st.device), 2 * w)
    prefill_positions(backbone, st, ~st.target & (st.pos < st.length[:, None]))


def reveal_rank(st: DecodeState, schedule, times: list[torch.Tensor] | None = None) -> None:
    """Order newly cached tokens by decreasing reveal time (docs/method.md §4.5): ``times`` per row (n_b,) for its
    generated positions left to right, or one draw per generated position from each row's generator."""
    n = st.target.sum(-1).tolist()
    if times is None and max(n) > schedule.L:
        raise UserError(f"cache_order='reveal' needs max_new_tokens <= L={schedule.L}, got {max(n)}")
    key = torch.zeros(st.batch, st.canvas + 1, dtype=torch.float64, device=st.device)
    for b in range(st.batch):
        if times is not None:
            t = times[b].to(st.device)
        else:
            assert st.generators is not None, "cache_order='reveal' without times: the state has generators"
            t = schedule.sample_reveal_times(1, n[b], generator=st.generators[b], device=st.device)[0]  # (n_b,)
        key[b, st.target[b]] = -t  # ascending key = decreasing reveal time
    cast(SetDLMRows, st.extra).pend_key = key.argsort(dim=-1, stable=True).argsort(dim=-1)  # (B, N+1) ranks


def step(backbone, st: DecodeState) -> None:
    """One forward: cache last step's tokens, predict the window's masks, commit (docs/method.md §4.2, steps 1–4)."""
    w, N = st.cfg.window, st.canvas
    rows = cast(SetDLMRows, st.extra)
    pending, pos = rows.pending, st.pos
    win = st.masked & (pos < (st.first_masked + w)[:, None])  # (B, N+1) masks in [f, f + w)
    c = pending.sum(-1)  # (B,) clean inputs
    n = c + win.sum(-1)  # (B,) all inputs
    T, ls = torch.stack([n.max(), c.min()]).tolist()
    key = torch.where(pending, rows.pend_key, torch.where(win, st.shared["win_key"], st.shared["rest_key"]))
    slot = torch.arange(T, device=st.device)  # (T,)
    valid = slot < n[:, None]  # (B, T)
    slot_pos = torch.where(valid, key.topk(T, dim=-1, largest=False, sorted=True).indices, N)  # (B, T)
    table = st.shared.get("mask_table")
    new = table[c, :T, :T] if table is not None else setdlm_step_mask(c, T)  # (B, T, T)
    logits = forward(backbone, st, slot_pos, new, keep=c, logits_start=ls, n_new=n)  # (B, T − ls, V)
    qvalid = (valid & (slot >= c[:, None]))[:, ls:]  # (B, T − ls) the mask slots
    write = st.commit(logits, slot_pos[:, ls:], qvalid, slot_pos, valid)
    rows.pending = torch.zeros_like(pending).scatter_(1, write, True)
    rows.pending[:, N] = False
