"""Logits processors, sampling and the commit rule (docs/method.md §4.3, §5.3): each processor against its formula,
samples against their distribution, the commit rule, and the penalties' effect on decoding."""

import math

import pytest
import torch

from setdlm.decoding import Sampling, commit_rule, fill, generate, process_logits, propose

from support import EOS, MASK, PROMPTS, tiny_model


def _logits(*rows):
    return torch.tensor([rows], dtype=torch.float64)  # (1, Q, V)


def test_mask_is_never_predicted_and_greedy_confidence():
    x = _logits([1.0, 2.0, 9.0])  # V = 3, MASK = 2 has the largest logit
    s = Sampling(mask_token_id=2)
    lp = process_logits(x, s)
    assert lp[0, 0, 2] == -math.inf
    tok, conf = propose(x, torch.ones(1, 1, dtype=torch.bool), s, None)
    assert tok.tolist() == [[1]] and conf.item() == pytest.approx(math.e / (1 + math.e), abs=1e-12)


def test_repetition_penalty_is_hf_multiplicative():
    x = _logits([2.0, -2.0, 1.0, 0.5, 0.0])
    seen = torch.tensor([[1, 1, 0, 0, 0]])
    lp = process_logits(x, Sampling(mask_token_id=4, repetition_penalty=2.0), seen=seen)
    expect = torch.log_softmax(torch.tensor([1.0, -4.0, 1.0, 0.5], dtype=torch.float64), -1)
    assert torch.allclose(lp[0, 0, :4], expect, atol=1e-12)


def test_length_penalty_is_hf_exponential_decay_on_eos():
    x = _logits([0.3, -1.5, 1.0, 0.0], [0.3, -1.5, 1.0, 0.0], [0.3, 2.0, 1.0, 0.0])
    gen_len = torch.tensor([[3, 6, 6]])  # start 4: no boost, then factor^2 − 1
    s = Sampling(mask_token_id=3, length_penalty=(4, 1.5), eos_token_ids=(1,))
    lp = process_logits(x, s, gen_len=gen_len)
    for q, e in enumerate([-1.5, -1.5 + 1.5 * (1.5 ** 2 - 1), 2.0 + 2.0 * (1.5 ** 2 - 1)]):
        expect = torch.log_softmax(torch.tensor([0.3, e, 1.0], dtype=torch.float64), -1)
        assert torch.allclose(lp[0, q, :3], expect, atol=1e-12), q


def test_temperature_top_k_and_top_p():
    p = torch.tensor([0.5, 0.3, 0.15, 0.05], dtype=torch.float64)
    x = torch.cat([p.log(), torch.tensor([0.0], dtype=torch.float64)])[None, None]  # MASK = 4
    lp = process_logits(x, Sampling(mask_token_id=4, temperature=2.0))
    assert torch.allclose(lp[0, 0, :4].exp(), p.sqrt() / p.sqrt().sum(), atol=1e-12)
    lp = process_logits(x, Sampling(mask_token_id=4, top_k=2))
    assert torch.allclose(lp[0, 0].exp(), torch.tensor([0.625, 0.375, 0, 0, 0], dtype=torch.float64), atol=1e-12)
    # top-p 0.7: keep up to and including the token that crosses 0.7 (0.5 + 0.3), renormalise
    lp = process_logits(x, Sampling(mask_token_id=4, top_p=0.7))
    assert torch.allclose(lp[0, 0].exp(), torch.tensor([0.625, 0.375, 0, 0, 0], dtype=torch.float64), atol=1e-12)
    lp = process_logits(x, Sampling(mask_token_id=4, top_p=0.5))
    assert torch.allclose(lp[0, 0].exp(), torch.tensor([1.0, 0, 0, 0, 0], dtype=torch.float64), atol=1e-12)


def test_samples_follow_the_distribution():
    p = torch.tensor([0.4, 0.3, 0.2, 0.1, 0.0], dtype=torch.float64)
    n = 20000
    x = p.clamp(min=1e-300).log().expand(1, n, 5).clone()
    x[..., 4] = 5.0  # MASK, never sampled
    valid = torch.ones(1, n, dtype=torch.bool)
    tok, conf = propose(x, valid, Sampling(mask_token_id=4, temperature=1.0), [torch.Generator().manual_seed(0)])
    counts = torch.bincount(tok[0], minlength=5).double()
    assert counts[4] == 0
    chi2 = (((counts[:4] - n * p[:4]) ** 2) / (n * p[:4])).sum().item()
    assert chi2 < 16.3  # 3 degrees of freedom, p = 0.001
    assert torch.allclose(conf[0], p[tok[0]], atol=1e-12)


def test_commit_rule():
    conf = torch.tensor([[0.2, 0.5, 0.5, 0.95], [0.9, 0.1, 0.3, 0.2], [0.3, 0.3, 0.3, 0.3]])
    valid = torch.tensor([[True, True, True, False], [True, True, True, True], [False] * 4])
    assert commit_rule(conf, valid, None).tolist() == [[False, True, False, False],  # first of tied maxima
                                                        [True, False, False, False], [False] * 4]
    assert commit_rule(conf, valid, 0.25).tolist() == [[False, True, True, False],  # invalid never commits
                                                        [True, False, True, False], [False] * 4]


def test_greedy_filters_keep_each_argmax_but_renormalise_confidences():
    ar = tiny_model("ar")
    assert (generate(ar, PROMPTS, max_new_tokens=8, ignore_eos=True).tokens
            == generate(ar, PROMPTS, max_new_tokens=8, ignore_eos=True, top_k=3, top_p=0.5).tokens)
    model = tiny_model("setdlm")  # first step: same candidates, larger confidences (which may change the commit)
    plain = generate(model, PROMPTS, max_new_tokens=4, ignore_eos=True, trace=True).trace
    filt = generate(model, PROMPTS, max_new_tokens=4, ignore_eos=True, top_k=3, top_p=0.5, trace=True).trace
    for a, b in zip(plain, filt):
        assert a[0].candidates == b[0].candidates and len(a[0].candidates) == 2
        assert all(cb > ca for ca, cb in zip(a[0].confidences, b[0].confidences))


def test_repetition_penalty_counts_generated_tokens_and_infill_context():
    model = tiny_model("setdlm", seed=2)
    out = generate(model, PROMPTS, max_new_tokens=10, repetition_penalty=1e6, ignore_eos=True)
    free = generate(model, PROMPTS, max_new_tokens=10, ignore_eos=True)
    assert any(len(set(t)) < 10 for t in free.tokens)  # without the penalty this model repeats itself
    assert all(len(set(t)) == 10 for t in out.tokens)  # with it, no generated token repeats
    rows = [[1, 5, 7, 9, 11] + [MASK] * 6 + [13, 2], [1, 20, 21] + [MASK] * 4 + [22, 23, 2]]
    filled = fill(model, rows, repetition_penalty=1e6)
    for row, mid in zip(rows, filled.tokens):
        context = {t for t in row if t != MASK}
        assert not context & set(mid) and len(set(mid)) == len(mid)


@pytest.mark.parametrize("family", ["ar", "setdlm"])
def test_length_penalty_makes_rows_end_early(family):
    model = tiny_model(family)
    free = generate(model, PROMPTS, max_new_tokens=10, eos_token_id=EOS)
    assert free.finish_reason == ["length"] * 3
    out = generate(model, PROMPTS, max_new_tokens=10, eos_token_id=EOS, length_penalty=(2, 1e3))
    assert out.finish_reason == ["eos"] * 3
    if family == "ar":  # the query at generated index 3 is the first with a boost (3 > start)
        assert [len(t) for t in out.tokens] == [4, 4, 4]
    assert all(len(t) < 10 for t in out.tokens)
