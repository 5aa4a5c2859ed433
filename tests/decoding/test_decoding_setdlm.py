"""SetDLM decoder semantics (docs/method.md §4.2–4.5, §7.9–7.11): one token per NFE with the threshold off, the
threshold only adds parallelism, the positional window [f, f + w), the D = M = w = 1 reduction to AR
decoding of the two-stream model, and the reveal-time cache order."""

import pytest
import torch

from setdlm.decoding import generate

from support import PROMPTS, left_to_right_setdlm, tiny_model

N = 12


@pytest.mark.parametrize("family", ["setdlm", "ar", "bd3lm", "mdlm"])
def test_threshold_off_one_token_per_forward(family):
    out = generate(tiny_model(family), PROMPTS, max_new_tokens=N, ignore_eos=True, trace=True)
    assert out.nfe == N and out.row_nfe == [N] * 3
    assert out.tokens_per_step == 1.0 and [len(t) for t in out.tokens] == [N] * 3
    assert all(len(s.committed_positions) == 1 for row in out.trace for s in row)


def test_lower_threshold_never_costs_more_forwards():
    model = tiny_model("setdlm", D=4)
    nfes = []
    for tau in [None, 0.95, 0.8, 0.6, 0.4, 0.2, 0.05]:
        out = generate(model, PROMPTS, max_new_tokens=N, threshold=tau, ignore_eos=True, trace=True)
        assert all(len(s.committed_positions) >= 1 for row in out.trace for s in row)
        assert [len(t) for t in out.tokens] == [N] * 3
        assert sum(out.row_committed) == 3 * N
        nfes.append(out.row_nfe)
    for row in range(3):
        per_tau = [n[row] for n in nfes]
        assert per_tau == sorted(per_tau, reverse=True), per_tau
    assert sum(nfes[-1]) < sum(nfes[0])  # and the threshold does add parallelism here


@pytest.mark.parametrize("w", [1, 3, 5])
def test_window_is_positional_and_never_holds_more_than_w_masks(w):
    out = generate(tiny_model("setdlm", D=4), PROMPTS, max_new_tokens=N, window=w, threshold=0.3,
                   ignore_eos=True, trace=True)
    for r, prompt in enumerate(PROMPTS):
        length = len(prompt) + N
        unresolved = set(range(len(prompt), length))
        for step in out.trace[r]:
            f = min(unresolved)
            assert step.query_positions == sorted(p for p in unresolved if p < f + w)  # all masks in [f, f+w)
            assert len(step.query_positions) <= w
            assert set(step.committed_positions) <= set(step.query_positions)
            unresolved -= set(step.committed_positions)
        assert not unresolved


def test_d1_setdlm_equals_ar_decoding_of_the_two_stream_model():
    """D = M = w = 1: the cached SetDLM decoder gives exactly the tokens of greedy left-to-right decoding
    that reruns the full two-stream training forward (identity order) for every token."""
    model = tiny_model("setdlm", D=1, M=1)
    out = generate(model, PROMPTS, max_new_tokens=N, ignore_eos=True)
    assert out.row_nfe == [N] * 3
    for r, prompt in enumerate(PROMPTS):
        assert out.tokens[r] == left_to_right_setdlm(model.backbone, prompt, N)


def test_reveal_cache_order_follows_sampled_reveal_times():
    model = tiny_model("setdlm", D=3)
    seeds = [11, 12, 13]
    out = generate(model, PROMPTS, max_new_tokens=N, threshold=0.2, cache_order="reveal", seed=seeds,
                   ignore_eos=True, trace=True)
    sched = model.family.schedule()
    multi = 0
    for r, prompt in enumerate(PROMPTS):
        times = sched.sample_reveal_times(1, N, generator=torch.Generator().manual_seed(seeds[r]))[0]
        for step in out.trace[r]:
            clean = step.input_positions[: len(step.input_positions) - len(step.query_positions)]
            t = [float(times[p - len(prompt)]) for p in clean]
            assert t == sorted(t, reverse=True)  # decreasing reveal time
            multi += len(clean) > 1
    assert multi > 0  # some steps cached several tokens, so the order was exercised
    with pytest.raises(ValueError, match="cache_order='reveal' needs max_new_tokens <= L"):
        generate(model, PROMPTS[:1], max_new_tokens=model.family.length + 1, cache_order="reveal")


def test_precomputed_and_computed_step_masks_agree():
    """Windows up to 32 use a precomputed table of step masks, wider ones compute them: with both windows
    covering all 12 new positions the decodes must coincide."""
    model = tiny_model("setdlm", D=2)
    a = generate(model, PROMPTS, max_new_tokens=N, window=N, threshold=0.3, ignore_eos=True, trace=True)
    b = generate(model, PROMPTS, max_new_tokens=N, window=40, threshold=0.3, ignore_eos=True, trace=True)
    assert a.tokens == b.tokens and a.trace == b.trace
