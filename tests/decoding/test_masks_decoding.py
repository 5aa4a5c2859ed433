"""Decoding masks (docs/method.md §4.2, §4.9) checked entry by entry against a literal slot-by-slot
construction, and against the training masks they must agree with."""

import torch

from setdlm.masks import (bd3lm_two_stream_mask, causal_mask, decode_block_mask, decode_causal_mask,
                          decode_full_mask, setdlm_step_mask, setdlm_two_stream_mask, with_cache)

T = 6
N = torch.tensor([6, 4, 1])  # valid slots per row: a prefix of each row
VALID = torch.arange(T)[None, :] < N[:, None]  # (3, T)


def _literal(rule) -> torch.Tensor:
    """(B, T, T) with entry [b, q, k] = rule(b, q, k) or q == k (every slot sees itself)."""
    return torch.tensor([[[bool(rule(b, q, k)) or q == k for k in range(T)] for q in range(T)]
                         for b in range(len(N))])


def test_decode_causal_mask_is_causal_over_valid_keys():
    expected = _literal(lambda b, q, k: k <= q and k < N[b])
    assert torch.equal(decode_causal_mask(VALID), expected)


def test_decode_block_mask_is_block_causal_among_valid_slots():
    blocks = torch.tensor([[0, 0, 1, 1, 2, 2], [3, 3, 3, 4, 4, 4], [0, 1, 2, 3, 4, 5]])
    expected = _literal(lambda b, q, k: q < N[b] and k < N[b] and blocks[b, k] <= blocks[b, q])
    assert torch.equal(decode_block_mask(blocks, VALID), expected)


def test_decode_full_mask_is_bidirectional_among_valid_slots():
    expected = _literal(lambda b, q, k: q < N[b] and k < N[b])
    assert torch.equal(decode_full_mask(VALID), expected)


def test_setdlm_step_mask_clean_causal_masks_see_clean():
    c = torch.tensor([0, 2, 4])
    def rule(b, q, k):
        clean_q, clean_k = q < c[b], k < c[b]
        return clean_k and (k <= q or not clean_q)  # clean: causal among clean; mask: every clean token
    assert torch.equal(setdlm_step_mask(c, T), _literal(rule))


def test_with_cache_prepends_visible_cache_columns():
    new = decode_full_mask(VALID)
    m = with_cache(new, 3)
    assert m.shape == (3, 1, T, 3 + T)
    assert bool(m[:, 0, :, :3].all()) and torch.equal(m[:, 0, :, 3:], new)


def test_decoding_masks_agree_with_the_training_masks():
    """With every slot valid: the prefill / AR mask is the training causal mask, the BD3LM step mask is the
    x0→x0 quadrant of the BD3LM training mask, and the SetDLM step mask (c clean, then masks) is the
    training mask restricted to the clean slots' x0 stream and one noisy slot per query rank >= c."""
    full = torch.ones(1, T, dtype=torch.bool)
    pos = torch.arange(T)[None]
    assert torch.equal(decode_causal_mask(full), causal_mask(full)[:, 0])
    assert torch.equal(decode_block_mask(pos, full), causal_mask(full)[:, 0])
    assert torch.equal(decode_block_mask(pos // 2, full), bd3lm_two_stream_mask(full, 2)[:, 0, :T, :T])
    c = 3
    train = setdlm_two_stream_mask(full)[0, 0]  # (2T, 2T): [x0 | xt] by reveal rank
    step = setdlm_step_mask(torch.tensor([c]), T)[0]  # (T, T)
    assert torch.equal(step[:c, :c], train[:c, :c])  # clean ↔ clean: causal
    assert not bool(step[:c, c:].any())  # clean never sees a mask
    for q in range(c, T):  # a mask query ranked after every clean token: sees them all (x_t → earlier x_0)
        assert torch.equal(step[q, :c], train[T + c, :c])
        assert [int(v) for v in step[q, c:]] == [int(k == q) for k in range(c, T)]  # and itself (x_t → own set)
