"""Explicit reveal times at decoding (issue 13 item 2): ``reveal_times=`` replaces the reveal times sampled
from each row's seed (docs/method.md §1.3, §4.5), so a decode of the reference can be replayed: every step caches
the tokens it committed in order of decreasing reveal time, and the result does not depend on the seed."""

import pytest
import torch

from setdlm.decoding import generate, infill

from support import PROMPTS, assert_cache_clean, recorded, tiny_model

N = 12


def _times(rows: int, n: int, seed: int = 0) -> torch.Tensor:
    return torch.rand(rows, n, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)  # (rows, n)


def test_each_step_caches_its_tokens_by_decreasing_reveal_time():
    model = tiny_model("setdlm", D=3)
    times = _times(len(PROMPTS), N)
    multi = 0
    for r, prompt in enumerate(PROMPTS):
        m, rec = recorded(model)
        out = generate(m, [prompt], max_new_tokens=N, threshold=0.2, reveal_times=times[r:r + 1], ignore_eos=True)
        inserted = []  # the positions appended to the cache, call by call
        prev = len(prompt)  # the prefill caches the prompt
        assert rec.calls[0].cache_pos[0, :prev].tolist() == list(range(prev))
        for call in rec.calls[1:]:
            n = int(call.lengths[0])
            new = call.cache_pos[0, prev:n].tolist()
            t = [float(times[r, p - len(prompt)]) for p in new]
            assert t == sorted(t, reverse=True)  # decreasing reveal time within the step
            multi += len(new) > 1
            inserted += new
            prev = n
        # every generated token but the last step's entered the cache, and the cache holds exactly the K/V
        # of a clean causal prefill in that insertion order
        seq = prompt + out.tokens[0]
        assert sorted(inserted) == sorted(set(inserted)) and set(inserted) < set(range(len(prompt), len(seq)))
        order = list(range(len(prompt))) + inserted
        assert_cache_clean(m.backbone.inner, rec.calls[-1], 0, [seq[p] for p in order], order)
    assert multi > 0  # some steps cached several tokens, so the order was exercised


def test_explicit_times_replace_the_sampled_ones():
    """The times a seed samples, passed explicitly, give the same decode; with explicit times the seed
    no longer matters (greedy); without them it does."""
    model = tiny_model("setdlm", D=3)
    seeds = [11, 12, 13]
    sampled = generate(model, PROMPTS, max_new_tokens=N, threshold=0.2, cache_order="reveal", seed=seeds,
                       ignore_eos=True, trace=True)
    sched = model.family.schedule()
    times = [sched.sample_reveal_times(1, N, generator=torch.Generator().manual_seed(s))[0] for s in seeds]
    replay = generate(model, PROMPTS, max_new_tokens=N, threshold=0.2, reveal_times=times, seed=[1, 2, 3],
                      ignore_eos=True, trace=True)
    assert replay.tokens == sampled.tokens and replay.trace == sampled.trace
    as_lists = generate(model, PROMPTS, max_new_tokens=N, threshold=0.2, reveal_times=[t.tolist() for t in times],
                        seed=99, ignore_eos=True, trace=True)
    assert as_lists.trace == sampled.trace
    other = generate(model, PROMPTS, max_new_tokens=N, threshold=0.2, cache_order="reveal", seed=[4, 5, 6],
                     ignore_eos=True, trace=True)
    assert other.trace != sampled.trace  # sampled times follow the seed


def test_infill_takes_reveal_times_per_mask():
    model = tiny_model("setdlm", D=3)
    pre, suf, m = [[1, 5, 7], [1, 9]], [[20, 21], [30]], [6, 9]
    times = [_times(1, 6, 1)[0], _times(1, 9, 2)[0]]
    out = infill(model, pre, suf, m, threshold=0.2, reveal_times=times, trace=True)
    again = infill(model, pre, suf, m, threshold=0.2, reveal_times=times, seed=5, trace=True)
    assert out.trace == again.trace
    for r in range(2):
        for step in out.trace[r]:
            clean = step.input_positions[: len(step.input_positions) - len(step.query_positions)]
            t = [float(times[r][p - len(pre[r])]) for p in clean]
            assert t == sorted(t, reverse=True)


@pytest.mark.parametrize("times, kw, message", [
    ([[0.5] * N], {}, r"reveal_times has 1 rows, but 3 rows are decoded"),
    ([[0.5] * N, [0.5] * N, [0.5] * (N - 1)], {}, r"reveal_times row 2 has shape \(11,\), but the row generates 12"),
    (torch.zeros(3, N, 1), {}, r"reveal_times must be \(rows, positions\)"),
    ([[0.5] * N, [float("nan")] * N, [0.5] * N], {}, "reveal_times row 1 holds a value that is not finite"),
    ([[0.5] * N, [float("inf")] * N, [0.5] * N], {}, "not finite"),
    (torch.zeros(3, N), dict(cache_order="position"), "contradict cache_order='position'"),
])
def test_bad_reveal_times_are_named(times, kw, message):
    with pytest.raises(ValueError, match=message):
        generate(tiny_model("setdlm"), PROMPTS, max_new_tokens=N, reveal_times=times, **kw)


def test_reveal_times_must_be_numbers():
    with pytest.raises(TypeError, match="reveal_times row 0 must hold numbers"):
        generate(tiny_model("setdlm"), PROMPTS[:1], max_new_tokens=2, reveal_times=[["a", "b"]])
    with pytest.raises(TypeError, match="reveal_times must be one sequence of times per row"):
        generate(tiny_model("setdlm"), PROMPTS[:1], max_new_tokens=2, reveal_times=0.5)
