"""Attention masks checked entry by entry (docs/method.md §2.4, §2.8)."""

import json
from pathlib import Path

import torch

from setdlm.masks import (bd3lm_two_stream_mask, bidirectional_mask, causal_mask, describe,
                          setdlm_two_stream_mask, two_stream_set_mask)

FIXTURE = Path(__file__).parent / "fixtures" / "reference-dit-tiny" / "expected.json"


def _expected_setdlm(n, valid):
    """The docs/method.md §2.4 table written out literally, slot by slot."""
    m = torch.zeros(2 * n, 2 * n, dtype=torch.bool)
    for q in range(2 * n):
        for kv in range(2 * n):
            rq, rk = q % n, kv % n
            q_noisy, k_noisy = q >= n, kv >= n
            if not q_noisy and not k_noisy:
                ok = rk <= rq
            elif q_noisy and not k_noisy:
                ok = rk < rq
            elif q_noisy and k_noisy:
                ok = rk == rq
            else:
                ok = False
            m[q, kv] = ok and bool(valid[rq]) and bool(valid[rk])
    return m


def test_setdlm_mask_table_with_padding():
    n = 6
    valid = torch.tensor([[True] * 6, [True, True, True, True, False, False]])
    mask = setdlm_two_stream_mask(valid)
    assert mask.shape == (2, 1, 12, 12) and mask.dtype == torch.bool
    for b in range(2):
        assert torch.equal(mask[b, 0], _expected_setdlm(n, valid[b]))
    # a query never sees the clean copy of its own token; clean never sees noisy
    for j in range(n):
        assert not mask[0, 0, n + j, j]
        assert mask[0, 0, n + j, n + j]
    assert not mask[:, 0, :n, n:].any()
    # padding rows and columns are blocked in both streams
    for s in (4, 5, 10, 11):
        assert not mask[1, 0, s].any() and not mask[1, 0, :, s].any()


def test_setdlm_mask_matches_reference_rows():
    exp = json.loads(FIXTURE.read_text())["setdlm_loss_A_full"]["allowed_mask_rows"]
    mask = setdlm_two_stream_mask(torch.ones(2, 16, dtype=torch.bool))
    for b in range(2):
        assert describe(mask[b, 0]) == exp[b]


def test_bd3lm_mask_table():
    n, S = 8, 4
    valid = torch.tensor([[True] * 7 + [False]])
    mask = bd3lm_two_stream_mask(valid, S)[0, 0]
    for q in range(2 * n):
        for kv in range(2 * n):
            bq, bk = (q % n) // S, (kv % n) // S
            if q < n and kv < n:
                ok = bk <= bq
            elif q >= n and kv < n:
                ok = bk < bq
            elif q >= n and kv >= n:
                ok = bk == bq
            else:
                ok = False
            ok = ok and (q % n) != 7 and (kv % n) != 7
            assert bool(mask[q, kv]) == ok, (q, kv)
    # noisy block 1 sees clean block 0 and itself, not clean block 1
    assert mask[n + 5, :4].all() and not mask[n + 5, 4:n].any() and mask[n + 5, n + 4:n + 7].all()


def test_general_sets_reduce_and_group():
    valid = torch.ones(1, 5, dtype=torch.bool)
    sets = torch.tensor([[0, 1, 1, 2, 2]])
    m = two_stream_set_mask(sets, valid)[0, 0]
    # noisy tokens see their own set and clean tokens of earlier sets
    assert describe(m[5:]) == ["0000010000", "1000001100", "1000001100", "1110000011", "1110000011"]
    # clean tokens see clean tokens of the same or earlier sets
    assert describe(m[:5, :5]) == ["10000", "11100", "11100", "11111", "11111"]
    ranks = torch.arange(5)[None]
    assert torch.equal(two_stream_set_mask(ranks, valid), setdlm_two_stream_mask(valid))


def test_single_stream_masks():
    valid = torch.tensor([[True, True, True, False]])
    assert describe(causal_mask(valid)[0, 0]) == ["1000", "1100", "1110", "0000"]
    assert describe(bidirectional_mask(valid)[0, 0]) == ["1110", "1110", "1110", "0000"]
