"""Boolean attention masks (SPEC.md §2.4, §2.8). ``True`` = may attend.

All masks here are built in the coordinates of the tensor they are applied to: two-stream masks are
built in **permuted** (reveal-order) coordinates, padding included, never by multiplying a permuted mask
with an original-order padding mask (SPEC pitfall 8).

The two-stream layout is ``[x0 slots (n) | xt slots (n)]``. With a *set id* per slot (nondecreasing along
the reveal order) the general set-causal rule is:

============  ==========  =====================================
query stream  key stream  allowed iff
============  ==========  =====================================
x0 (clean)    x0          ``set_kv <= set_q`` (same or earlier)
xt (noisy)    x0          ``set_kv <  set_q`` (strictly earlier)
xt            xt          ``set_kv == set_q`` (own set)
x0            xt          never
============  ==========  =====================================

Singleton sets (``set = rank``) give the SetDLM mask of SPEC §2.4; blocks in natural order
(``set = position // S``) give the BD3LM mask of SPEC §2.8.
"""

from __future__ import annotations

import torch
from torch import Tensor


def two_stream_set_mask(set_ids: Tensor, valid: Tensor) -> Tensor:
    """General two-stream set mask. ``set_ids``, ``valid``: (B, n) → (B, 1, 2n, 2n) bool.

    ``valid`` is False on padding slots; such slots neither attend nor are attended to.
    """
    s_q = set_ids[:, :, None]  # (B, n, 1)
    s_k = set_ids[:, None, :]  # (B, 1, n)
    clean_clean = s_k <= s_q  # (B, n, n)
    noisy_clean = s_k < s_q
    noisy_noisy = s_k == s_q
    top = torch.cat([clean_clean, torch.zeros_like(clean_clean)], dim=-1)  # (B, n, 2n)
    bottom = torch.cat([noisy_clean, noisy_noisy], dim=-1)  # (B, n, 2n)
    mask = torch.cat([top, bottom], dim=-2)  # (B, 2n, 2n)
    v2 = torch.cat([valid, valid], dim=-1).bool()  # (B, 2n)
    mask = mask & v2[:, :, None] & v2[:, None, :]
    return mask[:, None]  # (B, 1, 2n, 2n)


def setdlm_two_stream_mask(valid_perm: Tensor) -> Tensor:
    """SetDLM mask (SPEC §2.4): singleton sets, one per reveal rank. ``valid_perm``: (B, n) bool in permuted
    order (False = padding) → (B, 1, 2n, 2n)."""
    B, n = valid_perm.shape
    ranks = torch.arange(n, device=valid_perm.device).expand(B, n)
    return two_stream_set_mask(ranks, valid_perm)


def bd3lm_two_stream_mask(valid: Tensor, block_size: int) -> Tensor:
    """BD3LM mask (SPEC §2.8) in natural order: block-causal x0→x0, strictly-earlier-block xt→x0,
    block-diagonal xt→xt. ``valid``: (B, n) bool → (B, 1, 2n, 2n)."""
    B, n = valid.shape
    blocks = (torch.arange(n, device=valid.device) // block_size).expand(B, n)
    return two_stream_set_mask(blocks, valid)


def causal_mask(valid: Tensor) -> Tensor:
    """Single-stream causal mask with padding: (B, n) → (B, 1, n, n)."""
    n = valid.shape[-1]
    tril = torch.ones(n, n, dtype=torch.bool, device=valid.device).tril()
    return (tril & valid[:, :, None] & valid[:, None, :])[:, None]


def bidirectional_mask(valid: Tensor) -> Tensor:
    """Single-stream full attention among valid tokens (MDLM): (B, n) → (B, 1, n, n)."""
    return (valid[:, :, None] & valid[:, None, :])[:, None]


def describe(mask: Tensor) -> list[str]:
    """Rows of a (n, n) boolean mask as '0'/'1' strings: handy for tests and debugging."""
    return ["".join("1" if v else "0" for v in row) for row in mask.tolist()]
