"""Objectives: loss identities against explicit per-order forward passes (float64, 1e-9 relative),
MASK never predicted, padding and context invisible to the loss (docs/method.md §2.5, §2.8)."""

import pytest
import torch

from setdlm.family import FamilyConfig
from setdlm.masks import causal_mask
from setdlm.objectives import (Batch, ar_loss, compute_loss, log_probs, masked_diffusion_loss,
                               setdlm_loss)
from setdlm.schedules import LinearSchedule, StaggeredSchedule

from support import make_model

V, MASK = 32, 31


def _batch(B=2, L=10, seed=0, pad=None, ctx=None):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, V - 1, (B, L), generator=g)
    att = torch.ones(B, L, dtype=torch.bool)
    cm = torch.zeros(B, L, dtype=torch.bool)
    if pad:
        for b, n in pad.items():
            att[b, L - n:] = False
    if ctx:
        for b, n in ctx.items():
            cm[b, :n] = True
    return Batch(ids, att, cm)


def test_setdlm_loss_equals_separate_forwards(model64):
    """For a fixed order, the two-stream loss is the sum of L separate passes where each query sees only
    the tokens earlier in the order (docs/method.md §8.5)."""
    batch = _batch(B=2, L=10, pad={1: 3}, ctx={0: 2})
    sch = StaggeredSchedule.from_dm(10, 2, 4)
    order = sch.sample_order(batch.targets, generator=torch.Generator().manual_seed(3))
    out = setdlm_loss(model64, batch, MASK, order=order)
    for b in range(2):
        x0p = batch.input_ids[b, order[b]]
        tgt = batch.targets[b, order[b]]
        for r in range(10):
            if not tgt[r]:
                assert out.nll[b, order[b, r]] == 0
                continue
            ids = torch.cat([x0p[:r], torch.tensor([MASK])])[None]
            pos = torch.cat([order[b, :r], order[b, r:r + 1]])[None]
            logits = model64(ids, pos, causal_mask(torch.ones(1, r + 1, dtype=torch.bool)))
            ref = -log_probs(logits[0, -1], MASK)[x0p[r]]
            assert out.nll[b, order[b, r]].item() == pytest.approx(ref.item(), rel=1e-9)
    per_row = [out.nll[b].sum() / batch.targets[b].sum() for b in range(2)]
    assert out.loss.item() == pytest.approx(sum(per_row).item() / 2, rel=1e-12)


def test_bd3lm_loss_equals_separate_block_forwards(model64):
    L, S = 12, 4
    batch = _batch(B=2, L=L, pad={1: 2}, seed=1)
    sch = LinearSchedule(L, S)
    t = sch.sample_t(2, generator=torch.Generator().manual_seed(0))
    masked = sch.sample_masked(batch.targets, t, generator=torch.Generator().manual_seed(1), at_least_one=True)
    out = masked_diffusion_loss(model64, batch, MASK, sch, two_stream=True, train=False, t=t, masked=masked)
    for b in range(2):
        x = batch.input_ids[b]
        n_valid = int(batch.attention_mask[b].sum())
        for blk in range(L // S):
            lo, hi = blk * S, min((blk + 1) * S, n_valid)
            if lo >= hi:
                continue
            xt = torch.where(masked[b, lo:hi], MASK, x[lo:hi])
            ids = torch.cat([x[:lo], xt])[None]
            pos = torch.arange(hi)[None]
            fm = torch.zeros(hi, hi, dtype=torch.bool)
            blocks = torch.arange(hi) // S
            fm[:lo, :lo] = blocks[:lo, None] >= blocks[None, :lo]  # clean: block-causal
            fm[lo:, :] = True  # the noisy block sees all earlier clean blocks and itself
            logits = model64(ids, pos, fm[None, None])[0, lo:]
            ce = -log_probs(logits, MASK).gather(-1, x[lo:hi, None])[:, 0]
            ref = ce * masked[b, lo:hi] / t[b, blk]
            assert torch.allclose(out.nll[b, lo:hi], ref, rtol=1e-9, atol=1e-12)
    assert out.loss.item() == pytest.approx((out.nll.sum() / batch.targets.sum()).item(), rel=1e-12)


def test_setdlm_D1_reduces_to_left_to_right(model64):
    """D = 1: every sampled order is the identity, so the loss is the left-to-right factorisation."""
    batch = _batch(B=2, L=8, seed=2)
    sch = StaggeredSchedule.from_dm(8, 1, 2)
    a = setdlm_loss(model64, batch, MASK, sch, generator=torch.Generator().manual_seed(0))
    b = setdlm_loss(model64, batch, MASK, sch, generator=torch.Generator().manual_seed(99))
    ident = setdlm_loss(model64, batch, MASK, order=torch.arange(8).expand(2, 8))
    assert torch.equal(a.nll, b.nll) and torch.equal(a.nll, ident.nll)


def test_mask_never_predicted():
    m = make_model()
    with torch.no_grad():
        m.head.bias[MASK] = 1e3  # the network wants MASK above all
    batch = _batch(seed=3)
    lp = log_probs(m(batch.input_ids), MASK)
    assert torch.all(lp[..., MASK] == float("-inf"))
    assert torch.allclose(lp.exp().sum(-1), torch.ones(lp.shape[:-1], dtype=lp.dtype))
    fam = dict(length=10, mask_token_id=MASK)
    for f in (FamilyConfig("ar", **fam), FamilyConfig("mdlm", **fam, block_size=10),
              FamilyConfig("bd3lm", **fam, block_size=5), FamilyConfig("setdlm", **fam, D=2)):
        out = compute_loss(m, f, batch, generator=torch.Generator().manual_seed(0))
        assert torch.isfinite(out.loss) and torch.isfinite(out.nll).all()


@pytest.mark.parametrize("family", ["ar", "mdlm", "bd3lm", "setdlm"])
def test_padding_and_context_contribute_nothing(model64, family):
    fam = FamilyConfig(family, length=10, mask_token_id=MASK, block_size=5 if family != "setdlm" else None,
                       D=2 if family == "setdlm" else None)
    batch = _batch(B=2, L=10, pad={0: 3, 1: 1}, ctx={0: 2, 1: 4}, seed=4)
    other = Batch(batch.input_ids.clone(), batch.attention_mask, batch.context_mask)
    other.input_ids[~batch.attention_mask] = 7  # change what sits under the padding
    for train in (True, False):
        a = compute_loss(model64, fam, batch, train=train, generator=torch.Generator().manual_seed(5))
        b = compute_loss(model64, fam, other, train=train, generator=torch.Generator().manual_seed(5))
        assert torch.allclose(a.nll, b.nll, atol=1e-12) and a.loss.item() == pytest.approx(b.loss.item(), abs=1e-12)
        assert torch.all(a.nll[~batch.targets] == 0) and not a.mask[~batch.targets].any()


@pytest.mark.parametrize("family", ["ar", "mdlm", "bd3lm", "setdlm"])
def test_row_without_targets_gives_zero_not_nan(model64, family):
    fam = FamilyConfig(family, length=8, mask_token_id=MASK, block_size=4 if family != "setdlm" else None,
                       D=2 if family == "setdlm" else None)
    batch = _batch(B=2, L=8, seed=5)
    batch.context_mask[0] = True  # row 0: all context
    only = Batch(batch.input_ids[:1], batch.attention_mask[:1], batch.context_mask[:1])
    out = compute_loss(model64, fam, only, generator=torch.Generator().manual_seed(0))
    assert out.loss.item() == 0.0 and torch.all(out.nll == 0)
    both = compute_loss(model64, fam, batch, generator=torch.Generator().manual_seed(0))
    assert torch.isfinite(both.loss) and both.loss > 0


def test_ar_loss_is_next_token_nll(model64):
    batch = _batch(B=1, L=6, seed=6)
    out = ar_loss(model64, batch, MASK)
    x = batch.input_ids[0]
    for i in range(1, 6):
        logits = model64(x[:i][None], None, causal_mask(torch.ones(1, i, dtype=torch.bool)))
        ref = -log_probs(logits[0, -1], MASK)[x[i]]
        assert out.nll[0, i].item() == pytest.approx(ref.item(), rel=1e-9)
    assert out.nll[0, 0] == 0 and not out.mask[0, 0]


def test_mdlm_weights_and_train_loss(model64):
    L = 8
    batch = _batch(B=2, L=L, seed=7)
    sch = LinearSchedule(L, L)
    t = torch.tensor([[0.25], [0.5]], dtype=torch.float64)
    masked = torch.zeros(2, L, dtype=torch.bool)
    masked[0, [1, 4]] = True
    masked[1, [0, 2, 3, 7]] = True
    ev = masked_diffusion_loss(model64, batch, MASK, sch, two_stream=False, train=False, t=t, masked=masked)
    tr = masked_diffusion_loss(model64, batch, MASK, sch, two_stream=False, train=True, t=t, masked=masked)
    xt = torch.where(masked, MASK, batch.input_ids)
    ce = -log_probs(model64(xt), MASK).gather(-1, batch.input_ids[..., None])[..., 0] * masked
    assert torch.allclose(ev.nll, ce / t, rtol=1e-12)
    # training loss: per-row mean over masked tokens (2 in row 0, 4 in row 1), then the mean over rows
    assert tr.loss.item() == pytest.approx(((ce[0].sum() / 2 + ce[1].sum() / 4) / 2).item(), rel=1e-12)
    assert ev.loss.item() == pytest.approx(((ce / t).sum() / 16).item(), rel=1e-12)


def test_general_sets_in_objective(model64):
    """Sets larger than one token: a set's queries see only earlier sets, so NLLs inside a set are those
    of separate queries that share one visible prefix."""
    batch = _batch(B=1, L=6, seed=8)
    order = torch.tensor([[2, 0, 1, 3, 5, 4]])
    sets = torch.tensor([[0, 1, 1, 2, 2, 2]])
    out = setdlm_loss(model64, batch, MASK, order=order, set_ids=sets)
    x = batch.input_ids[0]
    # ranks 1 and 2 (positions 0 and 1) form one set: both queries see the clean position 2 and the two
    # MASK slots of their own set, nothing else
    ids = torch.tensor([[x[2], MASK, MASK]])
    fm = torch.tensor([[[[1, 0, 0], [1, 1, 1], [1, 1, 1]]]], dtype=torch.bool)
    logits = model64(ids, torch.tensor([[2, 0, 1]]), fm)
    for slot, p in ((1, 0), (2, 1)):
        assert out.nll[0, p].item() == pytest.approx(-log_probs(logits[0, slot], MASK)[x[p]].item(), rel=1e-9)


def test_bd3lm_bound_does_not_force_masks(model64):
    """Training forces one mask per block; the bound must not (x_t ~ q(x_t|x_0) exactly): with t = 1e-3 in
    every block almost nothing is masked at evaluation, so the bound's terms are almost all zero."""
    L, S = 16, 4
    batch = _batch(B=64, L=L, seed=9)
    sch = LinearSchedule(L, S)
    t = torch.full((64, L // S), 1e-3, dtype=torch.float64)
    g = torch.Generator().manual_seed(0)
    ev = masked_diffusion_loss(model64, batch, MASK, sch, two_stream=True, train=False, t=t, generator=g)
    tr = masked_diffusion_loss(model64, batch, MASK, sch, two_stream=True, train=True, t=t, generator=g)
    assert (ev.nll > 0).sum() <= 5  # Binomial(64·16, 1e-3): a handful at most
    assert (tr.nll > 0).sum() == 64 * (L // S)  # one forced mask in every block


def test_bd3lm_train_loss_is_per_row_mean(model64):
    """Issue 13 item 1: the BD3LM/MDLM training loss is the mean over each row's masked tokens, then the
    mean over rows (docs/method.md §2.8, as the reference); rows with 8 and 9 masked tokens weigh the same, which a
    single mean over the batch's 17 masked tokens would not."""
    from setdlm.masks import bd3lm_two_stream_mask

    L, S = 16, 4
    batch = _batch(B=2, L=L, seed=11)
    sch = LinearSchedule(L, S)
    masked = torch.zeros(2, L, dtype=torch.bool)
    masked[0, [0, 2, 5, 6, 9, 10, 13, 15]] = True  # 8, at least one per block
    masked[1, [1, 3, 4, 7, 8, 11, 12, 14, 15]] = True  # 9
    t = torch.full((2, L // S), 0.5, dtype=torch.float64)
    tr = masked_diffusion_loss(model64, batch, MASK, sch, two_stream=True, train=True, t=t, masked=masked)
    x = batch.input_ids
    xt = torch.where(masked, MASK, x)
    pos = torch.arange(L).expand(2, L)
    logits = model64(torch.cat([x, xt], 1), torch.cat([pos, pos], 1),
                     bd3lm_two_stream_mask(batch.attention_mask, S))[:, L:]  # (2, L, V) the x_t half
    ce = -log_probs(logits, MASK).gather(-1, x[..., None])[..., 0]  # (2, L) per-token CE
    row0, row1 = ce[0, masked[0]].mean(), ce[1, masked[1]].mean()
    assert tr.loss.item() == pytest.approx(((row0 + row1) / 2).item(), rel=1e-12)
    token_mean = ce[masked].mean()  # the reduction this replaced: differs when the mask counts differ
    assert abs(tr.loss.item() - token_mean.item()) > 1e-6
    ev = masked_diffusion_loss(model64, batch, MASK, sch, two_stream=True, train=False, t=t, masked=masked)
    assert ev.loss.item() == pytest.approx((ce[masked] / 0.5).sum().item() / (2 * L), rel=1e-12)  # token-weighted
