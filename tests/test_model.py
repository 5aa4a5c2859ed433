"""Backbone and KV cache: config round trip, RoPE, cache exactness (float64, 1e-9)."""

import pytest
import torch

from setdlm.masks import causal_mask
from setdlm.model import TransformerConfig, Transformer, apply_rope, rope_cos_sin

from support import make_model
from support.backbone_contract import (bad_mask_width_and_batch, cache_exact_ragged_append_crop,
                                      cache_storage_order_irrelevant, select_rows_and_keep_zero)


def test_config_roundtrip_and_validation():
    c = TransformerConfig(vocab_size=100, hidden_size=64, n_heads=4, n_layers=3, dropout=0.1)
    assert TransformerConfig.from_json(c.to_json()) == c
    with pytest.raises(ValueError, match="not divisible"):
        TransformerConfig(vocab_size=10, hidden_size=30, n_heads=4)
    with pytest.raises(ValueError, match="n_layers"):
        TransformerConfig(vocab_size=10, n_layers=0)
    with pytest.raises(ValueError, match="unknown TransformerConfig fields"):
        TransformerConfig.from_dict({"vocab_size": 10, "hiden_size": 3})


def test_reference_architecture_shapes():
    m = Transformer(TransformerConfig(vocab_size=64, hidden_size=32, n_heads=2, n_layers=2))
    shapes = {k: tuple(v.shape) for k, v in m.state_dict().items()}
    assert shapes["blocks.0.attn_qkv.weight"] == (96, 32)
    assert shapes["blocks.0.mlp.0.weight"] == (128, 32) and shapes["blocks.0.mlp.0.bias"] == (128,)
    assert shapes["head.bias"] == (64,)
    assert "blocks.0.attn_qkv.bias" not in shapes and "blocks.0.attn_out.bias" not in shapes
    assert "blocks.0.norm1.bias" not in shapes
    assert torch.all(m.head.weight == 0) and torch.all(m.head.bias == 0)  # zero-initialised head
    assert m.embed.weight is not m.head.weight  # untied


def test_rope_relative_and_rotate_half():
    # scores depend on relative positions only, with rotate-half layout
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 1, 1, 8, generator=g, dtype=torch.float64)
    k = torch.randn(1, 1, 1, 8, generator=g, dtype=torch.float64)

    def score(pq, pk):
        cq, sq = rope_cos_sin(torch.tensor([[pq]]), 8, 10000.0, torch.float64)
        ck, sk = rope_cos_sin(torch.tensor([[pk]]), 8, 10000.0, torch.float64)
        return (apply_rope(q, cq, sq) * apply_rope(k, ck, sk)).sum()

    assert score(7, 3) == pytest.approx(score(104, 100).item(), abs=1e-12)
    assert score(7, 3) != pytest.approx(score(7, 4).item(), abs=1e-6)
    c, s = rope_cos_sin(torch.tensor([[1]]), 4, 10000.0, torch.float64)
    x = torch.tensor([[[[1.0, 2.0, 3.0, 4.0]]]], dtype=torch.float64)
    # rotate-half: pairs (x0, x2) and (x1, x3) rotate by angles 1 and 1e-2
    y = apply_rope(x, c, s)[0, 0, 0]
    a, b = 1.0, 1e-2
    expect = [1 * torch.cos(torch.tensor(a)) - 3 * torch.sin(torch.tensor(a)),
              2 * torch.cos(torch.tensor(b)) - 4 * torch.sin(torch.tensor(b)),
              3 * torch.cos(torch.tensor(a)) + 1 * torch.sin(torch.tensor(a)),
              4 * torch.cos(torch.tensor(b)) + 2 * torch.sin(torch.tensor(b))]
    assert torch.allclose(y, torch.tensor([float(e) for e in expect], dtype=torch.float64), atol=1e-12)


def test_cache_exactness_ragged_append_crop(model64):
    cache_exact_ragged_append_crop(model64)


def test_cache_storage_order_does_not_matter(model64):
    cache_storage_order_irrelevant(model64)


def test_select_rows_and_keep_zero(model64):
    select_rows_and_keep_zero(model64)


def test_bad_mask_width_and_batch(model64):
    bad_mask_width_and_batch(model64)


def test_bf16_autocast_runs():
    m = make_model(dtype=torch.float32)
    ids = torch.randint(0, 31, (2, 8))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = m(ids, None, causal_mask(torch.ones(2, 8, dtype=torch.bool)))
    ref = m(ids, None, causal_mask(torch.ones(2, 8, dtype=torch.bool)))
    assert torch.isfinite(out).all() and (out.float() - ref).abs().max() < 0.2


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_forward_without_logits_caches_what_a_full_one_caches(dtype):
    """A prefill (``logits_start`` = T: no logits) stops its last block once its keys and values are cached: the
    cache is bit for bit the one a forward asking for every logit leaves, and the logits are empty."""
    m = make_model(dtype=dtype)
    B, T = 3, 11
    ids = torch.randint(0, 31, (B, T))
    pos = torch.arange(T).expand(B, T)
    mask = causal_mask(torch.ones(B, T, dtype=torch.bool))  # (B, 1, T, T)
    full, short = m.new_cache(B, capacity=16), m.new_cache(B, capacity=16)
    logits = m(ids, pos, mask, full, logits_start=0)
    none = m(ids, pos, mask, short, logits_start=T)
    assert none.shape == (B, 0, logits.shape[-1])
    for a, b in zip([*full.k, *full.v], [*short.k, *short.v]):
        assert torch.equal(a, b)
    assert torch.equal(full.lengths, short.lengths) and torch.equal(full.pos, short.pos)
    nxt = torch.randint(0, 31, (B, 1))  # and the next step reads it alike
    step_mask = torch.ones(B, 1, 1, T + 1, dtype=torch.bool)
    assert torch.equal(m(nxt, torch.full((B, 1), T), step_mask, full), m(nxt, torch.full((B, 1), T), step_mask, short))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cache_write_puts_each_new_key_at_its_rows_offset(dtype):
    """``KVCache.update`` writes a step's keys and values (B, H, T, hd) at each row's own offset, leaving every
    other entry as it was: the flat row copy (a contiguous cache) and the scatter it replaces (any other layout)
    write the same bits, and both equal the entries placed one by one."""
    from setdlm.model import CacheStep, KVCache

    g = torch.Generator().manual_seed(0)
    B, H, T, hd, cap = 3, 2, 4, 8, 12
    start = torch.tensor([0, 5, 2])
    step = CacheStep(None, start, start[:, None] + torch.arange(T), width=int(start.max()) + T, T=T)
    k, v = (torch.randn(B, H, T, hd, generator=g).to(dtype) for _ in range(2))
    old = torch.randn(B, H, cap, hd, generator=g).to(dtype)
    want = old.clone()
    for b in range(B):
        want[b, :, start[b]:start[b] + T] = k[b]
    flat = KVCache(1, B, H, hd, dtype=dtype, capacity=cap)
    flat.k[0].copy_(old)
    strided = KVCache(1, B, H, hd, dtype=dtype, capacity=cap)
    strided.k = [old.transpose(0, 1).contiguous().transpose(0, 1)]  # same values, not contiguous: the scatter path
    strided.v = [strided.v[0].transpose(0, 1).contiguous().transpose(0, 1)]
    assert not strided.k[0].is_contiguous()
    for cache in (flat, strided):
        ck, cv = cache.update(0, k, v, step)
        assert torch.equal(cache.k[0], want)
        assert ck.shape == (B, H, step.width, hd) and torch.equal(ck, want[:, :, : step.width])
        assert torch.equal(cv[1, :, 5:9], v[1]) and torch.equal(cv[2, :, 2:6], v[2])
