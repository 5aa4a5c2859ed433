"""Likelihood evaluation: the bound over a split is the mean of the per-token NLLs over the whole split
(token-weighted across batches, padding and context excluded), with k order samples as an option (docs/method.md §5.1)."""

import math

import pytest
import torch

from setdlm.evaluation.likelihood import bound_generator, likelihood
from setdlm.family import FamilyConfig
from setdlm.lm import Model
from setdlm.masks import causal_mask
from setdlm.objectives import Batch, compute_loss, log_probs

from support import make_model

V, MASK, L = 32, 31, 12


def _sequences(n=7, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, V - 1, (int(torch.randint(4, L + 1, (1,), generator=g)),), generator=g).tolist()
            for _ in range(n)]


def _batches(seqs, batch_size, prompt=0, width=None):
    """Right-padded batches of token ids (to ``width``, else the longest row); the first ``prompt`` tokens of
    each sequence are context."""
    out = []
    for i in range(0, len(seqs), batch_size):
        chunk = seqs[i:i + batch_size]
        w = width or max(map(len, chunk))
        ids = torch.zeros(len(chunk), w, dtype=torch.long)
        att = torch.zeros(len(chunk), w, dtype=torch.bool)
        for r, s in enumerate(chunk):
            ids[r, :len(s)] = torch.tensor(s)
            att[r, :len(s)] = True
        ctx = torch.zeros_like(att)
        ctx[:, :prompt] = True
        out.append(Batch(ids, att, ctx))
    return out


def _model(family, **kw):
    return Model(make_model(vocab=V), FamilyConfig(family, length=L, mask_token_id=MASK, **kw))


def test_ar_bound_is_mean_of_per_token_nlls_over_the_split():
    """Independent reference: each sequence alone, unpadded, one causal forward; every token after the first
    is one NLL term; the bound is their plain mean over all sequences."""
    model = _model("ar")
    seqs = _sequences()
    terms = []
    for s in seqs:
        x = torch.tensor(s)[None]
        pos = torch.arange(len(s))[None]
        lp = log_probs(model.backbone(x, pos, causal_mask(torch.ones_like(x, dtype=torch.bool))), MASK)
        terms += [-lp[0, i - 1, s[i]].item() for i in range(1, len(s))]
    expected = sum(terms) / len(terms)
    for bs in (1, 3, 7):  # batching and padding change nothing; a mean of batch means would
        res = likelihood(model, _batches(seqs, bs), progress=False)
        assert res.tokens == len(terms)
        assert res.nats_per_token == pytest.approx(expected, rel=1e-12)
        assert res.ppl == pytest.approx(math.exp(expected), rel=1e-12)
        assert res.bits_per_token == pytest.approx(expected / math.log(2), rel=1e-12)
    batch_means = [compute_loss(model.backbone, model.family, b, train=False).loss.item() for b in _batches(seqs, 3)]
    assert sum(batch_means) / len(batch_means) != pytest.approx(expected, rel=1e-6)


def test_setdlm_d1_bound_equals_explicit_left_to_right_nlls():
    """With D = M = 1 the reveal order is the identity; token i is predicted from a MASK at position i that
    sees the clean tokens before it (separate forwards). Context tokens are never scored."""
    model = _model("setdlm", D=1, M=1)
    seqs = _sequences(5, seed=1)
    prompt = 2
    terms = []
    for s in seqs:
        for i in range(prompt, len(s)):
            ids = torch.tensor(s[:i] + [MASK])[None]
            pos = torch.arange(i + 1)[None]
            lp = log_probs(model.backbone(ids, pos, causal_mask(torch.ones_like(ids, dtype=torch.bool))), MASK)
            terms.append(-lp[0, -1, s[i]].item())
    expected = sum(terms) / len(terms)
    res = likelihood(model, _batches(seqs, 2, prompt=prompt), progress=False)
    assert res.tokens == len(terms)
    assert res.nats_per_token == pytest.approx(expected, rel=1e-10)
    # the order is deterministic here, so more samples give the same number
    again = likelihood(model, _batches(seqs, 2, prompt=prompt), samples=3, seed=9, progress=False)
    assert again.nats_per_token == pytest.approx(expected, rel=1e-10) and again.tokens == len(terms)


@pytest.mark.parametrize("family, kw", [("setdlm", dict(D=2)), ("mdlm", {}), ("bd3lm", dict(block_size=4))])
def test_sampled_bounds_pool_per_token_nlls_over_passes(family, kw):
    """k samples = k passes over the data, batch i of pass s seeded by bound_generator(seed, s, i); the
    estimate is the mean of every per-token NLL term of every pass (here equal to the mean of the k
    per-pass bounds, as every pass scores the same tokens)."""
    model = _model(family, **kw)
    batches = _batches(_sequences(6, seed=2), 4, width=L)  # BD3LM needs whole blocks
    passes = []
    for s in range(3):
        outs = [compute_loss(model.backbone, model.family, b, train=False, generator=bound_generator(5, s, i))
                for i, b in enumerate(batches)]
        terms = torch.cat([o.nll[o.mask] for o in outs])
        passes.append(terms)
    res = likelihood(model, batches, samples=3, seed=5, progress=False)
    assert res.samples == 3 and res.tokens == passes[0].numel()
    assert res.nats_per_token == pytest.approx(torch.cat(passes).mean().item(), rel=1e-12)
    assert res.nats_per_token == pytest.approx(sum(p.mean().item() for p in passes) / 3, rel=1e-12)
    one = likelihood(model, batches, seed=5, progress=False)
    assert one.nats_per_token == pytest.approx(passes[0].mean().item(), rel=1e-12)
    assert one == likelihood(model, batches, seed=5, progress=False)  # reproducible
    assert likelihood(model, batches, seed=6, progress=False).nats != one.nats  # the seed matters


def test_likelihood_accepts_token_tensors_and_restores_mode():
    model = _model("ar")
    model.backbone.train()
    ids = torch.tensor(_sequences(4, seed=3)[0])[None].repeat(2, 1)
    res = likelihood(model, [ids], progress=False)
    assert res.tokens == 2 * (ids.shape[1] - 1)
    assert model.backbone.training  # the caller's mode is restored


def test_likelihood_rejects_bad_input():
    model = _model("ar")
    batches = _batches(_sequences(2), 2)
    with pytest.raises(ValueError, match="samples must be >= 1"):
        likelihood(model, batches, samples=0, progress=False)
    with pytest.raises(ValueError, match="one-shot iterator"):
        likelihood(model, iter(batches), samples=2, progress=False)
    with pytest.raises(ValueError, match="no scored tokens"):
        likelihood(model, [], progress=False)
    with pytest.raises(ValueError, match="must be a setdlm.objectives.Batch"):
        likelihood(model, [[1, 2, 3]], progress=False)
    with pytest.raises(ValueError, match="exceeds the model's context length"):
        likelihood(model, [torch.zeros(1, L + 1, dtype=torch.long)], progress=False)
