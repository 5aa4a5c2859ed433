"""Training masks as rules (setdlm.mask_rules): FlexAttention's mask_mod equals the dense masks of setdlm.masks
entry by entry, and flex_attention's output equals the dense SDPA path at float64, for every family."""

import pytest
import torch

from setdlm import FamilyConfig, Transformer, TransformerConfig
from setdlm.batch import Batch
from setdlm.mask_rules import MaskRule, kernel, training_mask
from setdlm.masks import (bd3lm_two_stream_mask, bidirectional_mask, causal_mask, setdlm_two_stream_mask,
                          two_stream_set_mask)
from setdlm.model import attention
from setdlm.objectives import compute_loss

flex = pytest.importorskip("torch.nn.attention.flex_attention")

VALID = torch.tensor([[True] * 7, [True, True, True, True, True, False, False]])  # (2, 7): row 1 padded


def _evaluated(rule: MaskRule) -> torch.Tensor:
    """mask_mod evaluated at every (b, q, k): (B, 1, size, size) bool."""
    B = rule.valid.shape[0]
    return flex.create_mask(rule.mask_mod(), B, 1, rule.size, rule.size, device="cpu")


@pytest.mark.parametrize("family", ["ar", "mdlm", "bd3lm", "setdlm", "sets"])
def test_mask_mod_equals_the_dense_mask(family):
    n = VALID.shape[1]
    ranks = torch.arange(n).expand(2, n)
    rule, expected = {
        "ar": (MaskRule("causal", VALID), causal_mask(VALID)),
        "mdlm": (MaskRule("full", VALID), bidirectional_mask(VALID)),
        "bd3lm": (MaskRule("sets", VALID, ranks // 3), bd3lm_two_stream_mask(VALID, 3)),
        "setdlm": (MaskRule("sets", VALID, ranks), setdlm_two_stream_mask(VALID)),
        "sets": (MaskRule("sets", VALID, torch.tensor([[0, 0, 1, 2, 2, 2, 3], [0, 1, 1, 1, 2, 3, 3]])),
                 two_stream_set_mask(torch.tensor([[0, 0, 1, 2, 2, 2, 3], [0, 1, 1, 1, 2, 3, 3]]), VALID)),
    }[family]
    assert torch.equal(rule.dense(), expected)
    assert torch.equal(_evaluated(rule), expected)


def test_flex_attention_equals_dense_sdpa_at_float64():
    """The rule's kernel (flex here) against SDPA with the dense mask; padding queries come out as zeros under
    flex (which shows flex ran: the dense path makes them see every key)."""
    g = torch.Generator().manual_seed(0)
    B, H, n, hd = 2, 3, VALID.shape[1], 8
    rule = MaskRule("sets", VALID, torch.arange(n).expand(B, n))
    q, k, v = (torch.randn(B, H, 2 * n, hd, generator=g, dtype=torch.float64) for _ in range(3))
    ours = attention(q, k, v, rule)  # (B, H, 2n, hd)
    ref = attention(q, k, v, rule.fixed())
    rows = torch.cat([VALID, VALID], 1)  # (B, 2n) valid queries
    torch.testing.assert_close(ours.transpose(1, 2)[rows], ref.transpose(1, 2)[rows], rtol=1e-12, atol=1e-12)
    assert ours.transpose(1, 2)[~rows].abs().max() == 0
    full = MaskRule("causal", torch.ones(B, n, dtype=torch.bool))  # unpadded causal: SDPA's is_causal
    q1, k1, v1 = q[:, :, :n], k[:, :, :n], v[:, :, :n]
    torch.testing.assert_close(attention(q1, k1, v1, full), attention(q1, k1, v1, full.dense()), rtol=1e-12, atol=1e-12)


def _batch(L: int, V: int, padded: bool = True) -> Batch:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, V - 1, (3, L), generator=g)
    valid = torch.ones(3, L, dtype=torch.bool)
    if padded:
        valid[1, L - 3:] = False
        valid[2, L - 5:] = False
    ctx = torch.zeros(3, L, dtype=torch.bool)
    ctx[:, 0] = True
    return Batch(ids, valid, ctx)


@pytest.mark.parametrize("padded", [True, False])
@pytest.mark.parametrize("family", ["ar", "mdlm", "bd3lm", "setdlm"])
def test_loss_equal_under_flex_and_dense(family, padded):
    """Forward only: flex_attention has no backward on the CPU (torch 2.13); gradients are checked on CUDA by
    benchmarks/gpu_check.py."""
    V, L = 32, 12
    model = Transformer(TransformerConfig(vocab_size=V, hidden_size=32, n_heads=4, n_layers=2)).double()
    model.init_weights(zero_head=False, generator=torch.Generator().manual_seed(2))
    fam = FamilyConfig(family, L, V - 1, **{"bd3lm": {"block_size": 4}, "setdlm": {"D": 2}}.get(family, {}))
    batch = _batch(L, V, padded).to("cpu")  # leaving the CPU records whether it has padding (unpadded AR: is_causal)
    assert batch.unpadded is (not padded)
    outs = []
    for policy in ("dense", "flex"):
        with kernel(policy), torch.no_grad():
            outs.append(compute_loss(model, fam, batch, generator=torch.Generator().manual_seed(3)))
    d, f = outs
    assert d.tokens > 0 and torch.equal(f.mask, d.mask)
    torch.testing.assert_close(f.loss, d.loss, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(f.nll, d.nll, rtol=1e-12, atol=1e-12)


def test_rules_reach_only_backbones_that_accept_them():
    rule = MaskRule("causal", VALID)

    class Plain(torch.nn.Module):  # a Backbone of its own: no accepts_mask_rules
        pass

    model = Transformer(TransformerConfig(vocab_size=8, hidden_size=8, n_heads=2, n_layers=1))
    with kernel("flex"):
        assert training_mask(model, rule) is rule
        assert torch.equal(training_mask(Plain(), rule), causal_mask(VALID))
    with kernel("auto"):  # the CPU keeps the dense mask
        assert torch.equal(training_mask(model, rule), causal_mask(VALID))
    with pytest.raises(ValueError, match="policy"):
        with kernel("fast"):
            pass


def test_flex_under_bf16_autocast_matches_dense():
    """Under autocast (q and k leave RoPE in float32, v is bf16; the rule path casts them to one dtype, which
    CUDA's flex kernel needs and the CPU's eager one does not) the loss stays within bf16 rounding of the
    dense path's."""
    V, L = 32, 12
    model = Transformer(TransformerConfig(vocab_size=V, hidden_size=64, n_heads=4, n_layers=2))
    model.init_weights(zero_head=False, generator=torch.Generator().manual_seed(2))
    fam = FamilyConfig("setdlm", L, V - 1, D=2)
    losses = []
    for policy in ("dense", "flex"):
        with kernel(policy), torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            losses.append(compute_loss(model, fam, _batch(L, V), generator=torch.Generator().manual_seed(3)).loss)
    torch.testing.assert_close(losses[1], losses[0], rtol=2e-2, atol=2e-2)


def test_mask_rule_arguments():
    with pytest.raises(ValueError, match="set ids"):
        MaskRule("sets", VALID)
    with pytest.raises(ValueError, match="kind"):
        MaskRule("diagonal", VALID)
