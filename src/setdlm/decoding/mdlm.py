"""MDLM decoding: no cache, semi-autoregressive sub-blocks (docs/method.md §4.9).

Every step is one forward over the whole canvas (prompt or context, committed tokens and every remaining
MASK), bidirectional. The masked positions are split, left to right, into sub-blocks of ``block_size``
(for ``generate``: ``[P + j·bs, P + (j+1)·bs)``); each step predicts the masks of the row's current
sub-block and commits top-1 plus every one above the threshold, so at most ``block_size`` steps per
sub-block. The input is reordered so that the current sub-block comes last (positions travel as position
ids and the mask is bidirectional, so the order does not change the result) and only its logits are
computed. Requires prompt + generation <= L.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import torch
from torch import Tensor

from ..errors import UserError
from ..masks import decode_full_mask
from .state import DecodeState, RowTensors, forward


@dataclass
class MDLMRows(RowTensors):
    sub_block: Tensor  # (B, N+1) each target's semi-AR sub-block, -1 elsewhere


def init(backbone, st: DecodeState) -> None:
    """No cache: split the masked positions into sub-blocks of ``block_size``, left to right."""
    if int(st.length.max()) > st.cfg.context_length:
        raise UserError(f"MDLM has no cache to slide: prompt + new tokens ({int(st.length.max())}) must be "
                        f"<= L={st.cfg.context_length}")
    rank = st.target.long().cumsum(-1) - 1  # (B, N+1) rank of each target position
    st.extra = MDLMRows(sub_block=torch.where(st.target, rank // st.cfg.block_size, -1))


def step(backbone, st: DecodeState) -> None:
    """One bidirectional forward over the whole canvas; commit in the current sub-block."""
    N, sub = st.canvas, cast(MDLMRows, st.extra).sub_block
    cur = sub.gather(1, st.first_masked[:, None])  # (B, 1)
    inb = st.masked & (sub == cur)  # (B, N+1) queries: the masks of the current sub-block
    q = int(inb.sum(-1).max())
    key = torch.where(inb, st.pos + (N + 1), st.pos)[:, :N]  # (B, N): current sub-block last
    slot_pos = key.argsort(-1)  # (B, N)
    valid = slot_pos < st.length[:, None]
    slot_pos = torch.where(valid, slot_pos, N)
    new = decode_full_mask(valid)  # (B, N, N) bidirectional
    logits = forward(backbone, st, slot_pos, new, keep=None, logits_start=N - q, n_new=valid.sum(-1))
    qpos = slot_pos[:, N - q:]
    st.commit(logits, qpos, inb.gather(1, qpos), slot_pos, valid)
