"""The backbone contract that decoders and objectives rely on, written once and run on every backbone (our
``Transformer`` in tests/test_model.py, the Hugging Face adapter in tests/test_hf.py): the cached forward equals
a from-scratch forward as rows grow ragged, append and crop; cache storage order is irrelevant; rows can be
selected and ``keep=0`` persists nothing; bad masks and batches are clear errors (docs/concepts.md, "The
backbone and its cache"). Ids stay below 32."""

import pytest
import torch

from setdlm.masks import causal_mask


def _full_logits(model, ids, pos, kept_mask):
    return model(ids[None], pos[None], kept_mask[None, None])[0]


def cache_exact_ragged_append_crop(model):
    """Rows grow at different speeds; each step appends clean tokens and masks, then crops the masks
    (and once, crops back further). At every step the cached forward equals a from-scratch forward."""
    m = model
    V, MASK = 32, 31
    g = torch.Generator().manual_seed(0)
    B = 3
    cache = m.new_cache(B, capacity=2)  # small capacity: exercises growth
    hist = [([], []) for _ in range(B)]  # per row: kept tokens and positions, in insertion order
    plans = [  # per step, per row: (n_clean, n_mask)
        [(4, 0), (2, 0), (5, 0)],
        [(1, 2), (3, 1), (0, 2)],
        [(2, 1), (1, 0), (2, 3)],
        [(0, 3), (2, 2), (1, 1)],
        [(3, 1), (0, 1), (2, 0)],
    ]
    for step, plan in enumerate(plans):
        T = max(c + k for c, k in plan)
        ids = torch.full((B, T), MASK)
        pos = torch.zeros(B, T, dtype=torch.long)
        C = cache.width
        mask = torch.zeros(B, 1, T, C + T, dtype=torch.bool)
        for b, (nc, nm) in enumerate(plan):
            n_hist = len(hist[b][0])
            ids[b, :nc] = torch.randint(0, V - 1, (nc,), generator=g)
            pos[b, :nc + nm] = torch.randperm(40, generator=g)[:nc + nm] + 10 * step
            mask[b, 0, :, :n_hist] = True  # everyone sees the row's cache
            for i in range(nc):
                mask[b, 0, i, C:C + i + 1] = True  # clean: causal among new clean
            for j in range(nc, nc + nm):
                mask[b, 0, j, C:C + nc] = True  # masks see all new clean
                mask[b, 0, j, C + j] = True  # and themselves
            for j in range(nc + nm, T):
                mask[b, 0, j, C + j] = True  # row padding
        keep = torch.tensor([nc for nc, _ in plan])
        out = m(ids, pos, mask, cache, keep=keep)
        for b, (nc, nm) in enumerate(plan):
            toks, poss = hist[b]
            n_hist = len(toks)
            full_ids = torch.tensor(toks + ids[b, :nc + nm].tolist(), dtype=torch.long)
            full_pos = torch.tensor(poss + pos[b, :nc + nm].tolist(), dtype=torch.long)
            n = n_hist + nc + nm
            fm = torch.zeros(n, n, dtype=torch.bool)
            fm[:n_hist + nc, :n_hist + nc] = causal_mask(torch.ones(1, n_hist + nc, dtype=torch.bool))[0, 0]
            for j in range(n_hist + nc, n):
                fm[j, :n_hist + nc] = True
                fm[j, j] = True
            ref = _full_logits(m, full_ids, full_pos, fm)[n_hist:]
            assert torch.allclose(out[b, :nc + nm], ref, atol=1e-9, rtol=0), (step, b)
            toks += ids[b, :nc].tolist()
            poss += pos[b, :nc].tolist()
        assert cache.lengths.tolist() == [len(h[0]) for h in hist]
        assert all(cache.pos[b, :len(hist[b][1])].tolist() == hist[b][1] for b in range(B))
        if step == 2:  # crop back to a shorter length: row 0 loses 2 entries, row 2 loses 1
            new_len = cache.lengths - torch.tensor([2, 0, 1])
            cache.crop(new_len)
            for b in range(B):
                del hist[b][0][new_len[b]:], hist[b][1][new_len[b]:]


def cache_storage_order_irrelevant(model):
    m = model
    g = torch.Generator().manual_seed(1)
    L = 10
    ids = torch.randint(0, 31, (1, L), generator=g)
    pos = torch.randperm(L, generator=g)[None]
    cache = m.new_cache(1)
    m(ids, pos, causal_mask(torch.ones(1, L, dtype=torch.bool)), cache)
    q = torch.tensor([[31, 31]])
    qpos = torch.tensor([[10, 11]])
    qmask = torch.cat([torch.ones(1, 1, 2, L, dtype=torch.bool), torch.eye(2, dtype=torch.bool)[None, None]], -1)
    a = m(q, qpos, qmask, cache.clone(), keep=0)
    perm = torch.randperm(L, generator=g)[None]
    shuffled = cache.clone()
    shuffled.keep_entries(perm, torch.tensor([L]))
    b = m(q, qpos, qmask, shuffled, keep=0)
    assert torch.allclose(a, b, atol=1e-12, rtol=0)
    assert sorted(shuffled.positions()[0].tolist()) == sorted(pos[0].tolist())


def select_rows_and_keep_zero(model):
    m = model
    ids = torch.randint(0, 31, (3, 5), generator=torch.Generator().manual_seed(2))
    cache = m.new_cache(3)
    m(ids, None, causal_mask(torch.ones(3, 5, dtype=torch.bool)), cache)
    before = m(ids[:, :1], torch.full((3, 1), 5), None, cache.clone(), keep=0)
    cache.select_rows(torch.tensor([2, 0]))
    after = m(ids[[2, 0], :1], torch.full((2, 1), 5), None, cache, keep=0)
    assert torch.allclose(before[[2, 0]], after, atol=1e-12)
    assert cache.lengths.tolist() == [5, 5]  # keep=0 persisted nothing


def bad_mask_width_and_batch(model):
    cache = model.new_cache(2)
    with pytest.raises(ValueError, match="key columns"):
        model(torch.zeros(2, 3, dtype=torch.long), None, torch.ones(2, 1, 3, 5, dtype=torch.bool), cache)
    with pytest.raises(ValueError, match="cache holds 2 rows"):
        model(torch.zeros(1, 3, dtype=torch.long), None, None, cache)
