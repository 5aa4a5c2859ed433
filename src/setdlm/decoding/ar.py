"""Autoregressive decoding with a KV cache, one token per forward (docs/method.md §4.9).

Prefill caches the tokens before the last one preceding the first MASK, so that every generated token costs
exactly one forward: step ``i`` feeds the not-yet-cached clean tokens up to the first masked position
``f`` (usually just the token at ``f − 1``), causally, keeps them all in the cache and predicts ``f`` from the
last one. With several gaps (infilling) the clean tokens between gaps are fed, and cached, the same way;
a suffix after the last gap is never seen (AR infilling conditions on the prefix only, docs/method.md §4.6).
The threshold and window do not apply: one token per step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import torch
from torch import Tensor

from ..errors import UserError
from ..masks import decode_causal_mask
from .state import DecodeState, RowTensors, forward, prefill as prefill_positions


@dataclass
class ARRows(RowTensors):
    cache_end: Tensor  # (B,) the positions before it are cached


def init(backbone, st: DecodeState) -> None:
    """Cache every token before the last one preceding the first MASK, causally."""
    if bool((st.first_masked < 1).any()):
        raise UserError("AR decoding needs at least one token before the first MASK position")
    st.cache = backbone.new_cache(st.batch, capacity=min(st.canvas, st.cfg.context_length) + 1)
    end = st.first_masked - 1  # (B,) cache everything before the last clean token
    prefill_positions(backbone, st, st.pos < end[:, None])
    st.extra = ARRows(cache_end=end)


def step(backbone, st: DecodeState) -> None:
    """Feed (and cache) the clean tokens up to the first MASK; commit the prediction for it."""
    rows = cast(ARRows, st.extra)
    f, ce = st.first_masked, rows.cache_end
    n = f - ce  # (B,) clean tokens to feed, >= 1
    T, ls = torch.stack([n.max(), n.min() - 1]).tolist()
    slot = torch.arange(T, device=st.device)
    valid = slot < n[:, None]  # (B, T)
    slot_pos = torch.where(valid, ce[:, None] + slot, st.canvas)  # (B, T)
    new = decode_causal_mask(valid)  # (B, T, T)
    logits = forward(backbone, st, slot_pos, new, keep=n, logits_start=ls, n_new=n)  # (B, T − ls, V)
    last = (n - 1 - ls)[:, None, None].expand(-1, 1, logits.shape[-1])  # (B, 1, V)
    qvalid = torch.ones(st.batch, 1, dtype=torch.bool, device=st.device)
    st.commit(logits.gather(1, last), f[:, None], qvalid, slot_pos, valid)
    rows.cache_end = f
