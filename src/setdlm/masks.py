"""Boolean attention masks (docs/method.md §2.4, §2.8). ``True`` = may attend.

All masks here are built in the coordinates of the tensor they are applied to: two-stream masks are
built in **permuted** (reveal-order) coordinates, padding included, never by multiplying a permuted mask
with an original-order padding mask (docs/method.md §7.8).

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

Singleton sets (``set = rank``) give the SetDLM mask of docs/method.md §2.4; blocks in natural order
(``set = position // S``) give the BD3LM mask of docs/method.md §2.8.

Decoding masks (docs/method.md §4) are built here too, next to the training masks they must agree with.
They are the mask among the ``T`` *new* tokens of one decoder forward, (B, T, T), in slot order; every
padding slot (``valid`` False) still sees itself, so no softmax row is empty. :func:`with_cache` prepends
the cache columns (every query sees its row's whole cache):

==============================  ===========  ==============================================================
function                        decoder      the new tokens' pattern
==============================  ===========  ==============================================================
:func:`decode_causal_mask`      AR step      causal among the fed clean tokens (the x0→x0 causal mask)
:func:`decode_block_mask`       BD3LM step,  block-causal by a block id per slot (the BD3LM x0→x0 mask);
                                prefill      ``blocks = positions`` is causal (AR / SetDLM prefill)
:func:`decode_full_mask`        MDLM step    bidirectional among valid tokens (:func:`bidirectional_mask`)
:func:`setdlm_step_mask`        SetDLM step  ``c`` clean tokens causal, then masks that see every clean
                                             token and themselves (SetDLM x0/xt rule, one set of queries)
:func:`speculative_step_mask`   SetDLM       clean tokens (pending + draft) causal by position, then masks
                                speculative  that see the clean tokens before their horizon and themselves
==============================  ===========  ==============================================================
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
    """SetDLM mask (docs/method.md §2.4): singleton sets, one per reveal rank. ``valid_perm``: (B, n) bool in permuted
    order (False = padding) → (B, 1, 2n, 2n)."""
    B, n = valid_perm.shape
    ranks = torch.arange(n, device=valid_perm.device).expand(B, n)
    return two_stream_set_mask(ranks, valid_perm)


def bd3lm_two_stream_mask(valid: Tensor, block_size: int) -> Tensor:
    """BD3LM mask (docs/method.md §2.8) in natural order: block-causal x0→x0, strictly-earlier-block xt→x0,
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


# --- decoding: the mask among the new tokens of one forward (B, T, T), True = may attend -------------


def decode_causal_mask(valid: Tensor) -> Tensor:
    """AR step (docs/method.md §4.9): slot ``q`` sees the valid slots ``k <= q``, and itself.
    ``valid``: (B, T) bool (a prefix of each row) → (B, T, T)."""
    T = valid.shape[-1]
    slot = torch.arange(T, device=valid.device)
    causal = slot[:, None] >= slot[None, :]  # (T, T)
    return (valid[:, None, :] & causal) | (slot[:, None] == slot[None, :])  # (B, T, T)


def decode_block_mask(blocks: Tensor, valid: Tensor) -> Tensor:
    """Block-causal among valid slots (BD3LM step, and every prefill; docs/method.md §4.9): valid ``q`` sees
    valid ``k`` with ``blocks[k] <= blocks[q]``; every slot sees itself. ``blocks``, ``valid``: (B, T) →
    (B, T, T). ``blocks = positions`` gives the causal mask."""
    T = valid.shape[-1]
    both = valid[:, :, None] & valid[:, None, :]  # (B, T, T)
    earlier = blocks[:, None, :] <= blocks[:, :, None]  # (B, T, T)
    return (both & earlier) | torch.eye(T, dtype=torch.bool, device=valid.device)


def decode_full_mask(valid: Tensor) -> Tensor:
    """MDLM step (docs/method.md §4.9): every valid slot sees every valid slot; every slot sees itself.
    ``valid``: (B, T) → (B, T, T)."""
    T = valid.shape[-1]
    return (valid[:, :, None] & valid[:, None, :]) | torch.eye(T, dtype=torch.bool, device=valid.device)


def setdlm_step_mask(c: Tensor, T: int) -> Tensor:
    """SetDLM step (docs/method.md §4.2): for ``c`` (B,) clean tokens then ``n − c`` masks among ``T`` slots,
    clean tokens are causal among themselves, masks see every clean token and themselves, clean never sees a
    mask: the training mask with the clean tokens as the x0 stream and the masks as one set of queries
    ranked after them (padding slots past a row's inputs are ignored queries). → (B, T, T)."""
    slot = torch.arange(T, device=c.device)
    clean_q = slot[None, :, None] < c[:, None, None]  # (B, T, 1)
    clean_k = slot[None, None, :] < c[:, None, None]  # (B, 1, T)
    causal = slot[:, None] >= slot[None, :]  # (T, T)
    return (clean_k & (causal | ~clean_q)) | (slot[:, None] == slot[None, :])  # (B, T, T)


def speculative_step_mask(clean_pos: Tensor, clean_ok: Tensor, horizon: Tensor, query_ok: Tensor) -> Tensor:
    """Self-speculative SetDLM step (docs/decoding.md, "Self-speculative decoding"): ``Tc`` clean slots at
    canvas positions ``clean_pos`` (B, Tc) (the pending token and the draft) then ``Tq`` mask queries, each with
    a *horizon* position ``horizon`` (B, Tq); ``clean_ok``/``query_ok`` mark the valid slots. A clean slot sees
    the valid clean slots at positions ``<=`` its own, a query those at positions ``<`` its horizon, every slot
    itself; no slot sees a query but itself: the two-stream training mask (docs/method.md §2.4) with the clean
    stream ranked by position and each query ranked right after the clean tokens before its horizon.
    → (B, Tc + Tq, Tc + Tq)."""
    B, Tc = clean_pos.shape
    Tq = horizon.shape[1]
    cc = (clean_pos[:, None, :] <= clean_pos[:, :, None]) & clean_ok[:, None, :] & clean_ok[:, :, None]  # (B, Tc, Tc)
    qc = (clean_pos[:, None, :] < horizon[:, :, None]) & clean_ok[:, None, :] & query_ok[:, :, None]  # (B, Tq, Tc)
    none = torch.zeros(B, Tc + Tq, Tq, dtype=torch.bool, device=clean_pos.device)  # nothing sees a query
    eye = torch.eye(Tc + Tq, dtype=torch.bool, device=clean_pos.device)
    return torch.cat([torch.cat([cc, qc], 1), none], 2) | eye


def with_cache(new: Tensor, cache_width: int) -> Tensor:
    """The forward's mask (B, 1, T, C + T) from the mask among new tokens (B, T, T): every query sees every
    entry of its row's cache (entries past a row's length are ignored by the backbone)."""
    B, T, _ = new.shape
    old = torch.ones(B, T, cache_width, dtype=torch.bool, device=new.device)  # (B, T, C)
    return torch.cat([old, new], dim=-1)[:, None]


def describe(mask: Tensor) -> list[str]:
    """Rows of a (n, n) boolean mask as '0'/'1' strings: handy for tests and debugging."""
    return ["".join("1" if v else "0" for v in row) for row in mask.tolist()]
