"""BD3LM block-by-block decoding with a KV cache (docs/method.md §4.9).

Blocks are aligned to absolute positions ``[kS, (k+1)S)``, as in training. Prefill caches the full blocks
before the first block holding a MASK (the prompt truncated to a multiple of ``S``), with the clean-stream
mask: block-causal, bidirectional inside a block. Then, per step, the block ``k`` of the first masked
position is run whole (its clean tokens, e.g. leftover prompt tokens, and its masks; bidirectional inside
the block, every cache entry visible) and the commit rule decides which masks to commit: top-1 plus every
one above the threshold, so at most ``S`` steps per block.

The cache write of a completed block is fused into the first forward of the next block: the input is
``[completed, uncached blocks (clean, block-causal) | the new block]``, the new block sees all of them, and
``keep`` persists only the clean part. With several gaps the clean blocks between them travel the same way.
On overflow the cache entries with the smallest positions are evicted (docs/method.md §4.5).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import torch
from torch import Tensor

from ..masks import decode_block_mask
from .state import DecodeState, RowTensors, forward, prefill as prefill_positions


@dataclass
class BD3LMRows(RowTensors):
    cache_end: Tensor  # (B,) the positions before it are cached (the blocks done)


def init(backbone, st: DecodeState) -> None:
    """Cache the full blocks before the first block holding a MASK, block-causally."""
    S_b = st.cfg.block_size
    st.cache = backbone.new_cache(st.batch, capacity=min(st.canvas, st.cfg.context_length) + 2 * S_b)
    end = st.first_masked // S_b * S_b  # (B,) start of the first block with a MASK
    prefill_positions(backbone, st, st.pos < end[:, None], block_size=S_b)
    st.extra = BD3LMRows(cache_end=end)


def step(backbone, st: DecodeState) -> None:
    """Run the current block whole (after any completed, uncached blocks, which this forward caches)."""
    rows = cast(BD3LMRows, st.extra)
    S_b, ce = st.cfg.block_size, rows.cache_end
    start = st.first_masked // S_b * S_b  # (B,) current block
    end = torch.minimum(start + S_b, st.length)
    c, n = start - ce, end - ce  # (B,) clean uncached tokens, all inputs
    T, ls = torch.stack([n.max(), c.min()]).tolist()
    slot = torch.arange(T, device=st.device)
    valid = slot < n[:, None]  # (B, T)
    slot_pos = torch.where(valid, ce[:, None] + slot, st.canvas)  # (B, T) contiguous positions [ce, end)
    new = decode_block_mask(slot_pos // S_b, valid)  # (B, T, T) block-causal; the current block sees everything
    logits = forward(backbone, st, slot_pos, new, keep=c, logits_start=ls, n_new=n)  # (B, T − ls, V)
    qpos = slot_pos[:, ls:]
    st.commit(logits, qpos, st.masked.gather(1, qpos), slot_pos, valid)
    rows.cache_end = start
