"""Self-speculative SetDLM decoding verified by the next-token head (``speculate="next_token"``, docs/decoding.md
"Verifying with the next-token head"): the output is token for token the AR decode of the same weights
(greedy, seeded sampling, penalties, EOS, stop strings, ragged batches, sessions, constraints); each verifier's
logits equal a from-scratch causal forward over the committed prefix and the draft before it, and the cache after
every step is the AR decode's (float64, 1e-9); a forward feeds at most ``2w − 1`` positions per row; with a window
that always guesses right every forward commits ``w`` tokens. The objective: ``ar_weight`` adds exactly that
weight times the clean stream's next-token loss in training and leaves the bound alone."""

import dataclasses

import pytest
import torch
from torch import nn

from setdlm import Model
from setdlm.batch import Batch
from setdlm.decoding import fill, generate
from setdlm.decoding.session import Session
from setdlm.family import FamilyConfig
from setdlm.objectives import ar_loss, compute_loss
from setdlm.training import TrainConfig
from setdlm.evaluation.passes import EvalRun

from support import (MASK, PROMPTS, CharTokenizer, active_rows, assert_cache_clean, recorded, session_results, tiny,
                     tiny_model)

TOL = 1e-9
SAMPLED = [dict(temperature=1.0, top_p=0.9), dict(temperature=0.7, top_k=5, repetition_penalty=1.2),
           dict(repetition_penalty=1.3, length_penalty=(3, 1.5), eos_token_id=2)]


def _pair(seed=1, D=4, tokenizer=None):
    """A SetDLM trained (here: declared) with a next-token head, and the AR model on the same weights."""
    m = tiny_model("setdlm", D=D, seed=seed, ar_weight=1.0)
    return (Model(m.backbone, m.family, tokenizer),
            Model(m.backbone, FamilyConfig("ar", m.family.length, MASK), tokenizer))


def _same(a, b):
    assert a.tokens == b.tokens and a.sequences == b.sequences and a.finish_reason == b.finish_reason
    assert a.texts == b.texts


@pytest.mark.parametrize("w", [1, 2, 3, 5])
def test_greedy_output_is_the_ar_decode_of_the_same_weights(w):
    model, ar = _pair()
    ref = generate(ar, PROMPTS, max_new_tokens=20, ignore_eos=True)
    out = generate(model, PROMPTS, max_new_tokens=20, ignore_eos=True, window=w, speculate="next_token", trace=True)
    _same(out, ref)
    for row in out.trace:
        for i, s in enumerate(row):
            assert len(s.input_positions) <= 2 * w - 1  # k + 1 clean slots and w − 1 masks
            # the accepted drafts and the head's next token (none once a whole draft reaches the row's end)
            extra = {1} if i + 1 < len(row) else {0, 1}
            assert len(s.committed_positions) - s.accepted in extra and len(s.committed_positions) <= w
    assert sum(len(row) for row in out.trace) == sum(out.row_nfe)


@pytest.mark.parametrize("knobs", SAMPLED)
@pytest.mark.parametrize("w", [2, 4])
def test_seeded_sampling_and_penalties_are_the_ar_decode(knobs, w):
    model, ar = _pair()
    ref = generate(ar, PROMPTS, max_new_tokens=16, seed=[1, 2, 3], **knobs)
    out = generate(model, PROMPTS, max_new_tokens=16, window=w, speculate="next_token", seed=[1, 2, 3], **knobs)
    _same(out, ref)
    alone = generate(model, PROMPTS[1:2], max_new_tokens=16, window=w, speculate="next_token", seed=[2], **knobs)
    assert alone.tokens[0] == out.tokens[1]  # batched == alone, with the row's seed


def test_every_verifier_is_the_causal_forward_and_the_cache_is_the_ar_decodes():
    """Clean slot ``i`` of a step (the pending token, then the draft) predicts the ``i``-th verified position from
    the committed prefix and the draft before it: its logits equal a from-scratch causal forward over exactly
    those tokens; after every step the cache is a causal prefill of every committed position before the last."""
    plain, _ = _pair(D=3)
    model, rec = recorded(plain)
    out = generate(model, PROMPTS, max_new_tokens=12, ignore_eos=True, window=3, speculate="next_token", trace=True)
    bb = model.backbone.inner
    prefills = 1  # the prompts but their last token, cached causally before the first step
    assert len(rec.calls) == prefills + out.nfe
    assert sum(s.accepted for row in out.trace for s in row) > 0  # some drafts were accepted and kept cached
    for r, prompt in enumerate(PROMPTS):
        seq = out.sequences[r]
        assert_cache_clean(bb, rec.calls[0], r, prompt[:-1], list(range(len(prompt) - 1)))
        for k, step in enumerate(out.trace[r]):
            call, b = rec.calls[prefills + k], active_rows(out.row_nfe, k).index(r)
            drafted = list(seq)  # the sequence as this step's draft has it (a rejected draft too)
            for p, t in zip(step.draft_positions, step.draft_tokens):
                drafted[p] = t
            for i, q in enumerate(step.query_positions):  # verifier i = clean slot i (logits_start = 0)
                assert int(call.pos[b, i]) == q - 1
                ref = bb(torch.tensor([drafted[:q]]), torch.arange(q)[None],
                         torch.ones(q, q, dtype=torch.bool).tril()[None, None])[0, -1]
                assert torch.allclose(call.logits[b, i], ref, atol=TOL, rtol=0), (r, k, q)
            if k + 1 == len(out.trace[r]):
                break
            last = max(step.committed_positions)  # pending: committed, not cached yet
            nxt, b2 = rec.calls[prefills + k + 1], active_rows(out.row_nfe, k + 1).index(r)
            assert int(nxt.lengths[b2]) == last + int(nxt.keep[b2])
            assert_cache_clean(bb, _cropped(nxt, b2, last), b2, seq[:last], list(range(last)))


def _cropped(call, b, n):
    cache = call.cache.clone()
    cache.lengths[b] = n
    return dataclasses.replace(call, cache=cache)


class _Oracle(nn.Module):
    """The real backbone whose logits are replaced by a script: a clean slot at ``p`` predicts ``script[p + 1]``,
    a mask at ``p`` predicts ``script[p]`` (a window that always guesses what the head will verify)."""

    def __init__(self, inner, script):
        super().__init__()
        self.inner, self.script = inner, script

    def forward(self, ids, pos, mask, cache=None, *, keep=None, logits_start=0):
        logits = self.inner(ids, pos, mask, cache, keep=keep, logits_start=logits_start)
        table = torch.tensor(self.script + [self.script[-1]])
        shift = (ids[:, logits_start:] != MASK).long()  # (B, T')
        target = table[(pos[:, logits_start:] + shift).clamp(max=len(self.script))]
        return 30.0 * nn.functional.one_hot(target, logits.shape[-1]).to(logits.dtype)

    def new_cache(self, batch, capacity=64):
        return self.inner.new_cache(batch, capacity)


@pytest.mark.parametrize("w", [2, 4, 5])
def test_a_window_that_guesses_right_commits_w_tokens_a_forward(w):
    model, _ = _pair()
    prompt = [1, 5, 7]
    script = prompt + [(3 * i) % 40 + 4 for i in range(17)]
    oracle = Model(_Oracle(model.backbone, script), model.family)
    out = generate(oracle, [prompt], max_new_tokens=17, ignore_eos=True, window=w, speculate="next_token", trace=True)
    assert out.tokens[0] == script[3:]
    # the first forward drafts only; then every forward accepts its w − 1 drafts and adds the head's token
    assert [len(s.committed_positions) for s in out.trace[0]] == [1] + [w] * (16 // w) + ([16 % w] if 16 % w else [])
    assert out.nfe == 1 + -(-16 // w)


def test_eos_stop_strings_and_max_new_tokens_end_rows_as_the_ar_decode():
    model, ar = _pair(seed=2, tokenizer=CharTokenizer())
    prompts = ["the cat", "dogs", "a", "hello there"]
    free = generate(ar, prompts, max_new_tokens=16, ignore_eos=True)
    eos, stop = free.tokens[1][5], free.texts[0][4:6]
    reasons = set()
    for knobs in [dict(eos_token_id=eos), dict(ignore_eos=True, stop=[stop, "zz"]),
                  dict(eos_token_id=eos, stop=[stop]), dict(ignore_eos=True)]:
        for n in (3, 16):
            ref = generate(ar, prompts, max_new_tokens=n, **knobs)
            out = generate(model, prompts, max_new_tokens=n, window=4, speculate="next_token", **knobs)
            _same(out, ref)
            reasons |= set(out.finish_reason)
    assert reasons == {"eos", "stop", "length"}


def test_a_constraint_gives_the_constrained_ar_decode():
    pytest.importorskip("outlines_core")
    from setdlm.data.tokenizers import char_tokenizer
    from setdlm.decoding.structured.constraint import regex

    tok = char_tokenizer(["abcdefghij the cat"])
    m = tiny("setdlm", tok)
    model = Model(m.backbone, dataclasses.replace(m.family, ar_weight=1.0), tok)
    ar = Model(m.backbone, FamilyConfig("ar", m.family.length, tok.mask_token_id), tok)
    c = regex(r"(ab|ba)+c[a-e]{2,4}")
    ref = generate(ar, ["the cat", "a"], max_new_tokens=12, constraint=c)
    out = generate(model, ["the cat", "a"], max_new_tokens=12, window=4, speculate="next_token", constraint=c)
    _same(out, ref)


def test_session_rows_joining_between_steps_decode_as_alone():
    model, ar = _pair()
    s = Session(model, width=40)
    first = s.add(PROMPTS[0], max_new_tokens=12, ignore_eos=True, window=3, speculate="next_token")
    s.step()
    s.step()
    later = s.add(PROMPTS[1], max_new_tokens=12, ignore_eos=True, window=3, speculate="next_token")
    done = session_results(s)
    ref = generate(ar, PROMPTS, max_new_tokens=12, ignore_eos=True)
    assert done[first].tokens == ref.tokens[0] and done[later].tokens == ref.tokens[1]


@pytest.mark.parametrize("call,needle", [
    (lambda m: generate(m, PROMPTS, max_new_tokens=4, speculate="yes"), "speculate must be True, False, None or 'next_token'"),
    (lambda m: generate(m, PROMPTS, max_new_tokens=4, speculate="next_token", threshold=0.5), "threshold does not apply"),
    (lambda m: generate(m, PROMPTS, max_new_tokens=60, speculate="next_token"), r"max_new_tokens <= the context length"),
    (lambda m: fill(m, [[1, 5, MASK, MASK, 7]], speculate="next_token"), "tokens after a MASK"),
    (lambda m: fill(m, [[MASK, MASK, 7]], speculate="next_token"), "at least one token before the first MASK"),
    (lambda m: generate(Model(m.backbone, FamilyConfig("setdlm", 48, MASK, D=2)), PROMPTS, max_new_tokens=4,
                        speculate="next_token"), "was not trained for")])
def test_bad_settings_and_models_raise_clear_errors(call, needle):
    with pytest.raises(ValueError, match=needle):
        call(_pair()[0])


@torch.no_grad()
def test_ar_weight_adds_the_next_token_loss_in_training_only():
    model, _ = _pair()
    x = torch.tensor([[1, 5, 7, 9, 11, 13, 2, 0], [1, 4, 4, 6, 8, 10, 12, 2]])
    att = x != 0
    ctx = torch.zeros_like(att)
    ctx[:, :2] = True
    batch = Batch(x, att, ctx)
    fam0 = dataclasses.replace(model.family, ar_weight=0.0)
    fam = dataclasses.replace(model.family, ar_weight=0.5)
    base = compute_loss(model.backbone, fam0, batch, generator=torch.Generator().manual_seed(3)).loss
    both = compute_loss(model.backbone, fam, batch, generator=torch.Generator().manual_seed(3)).loss
    nt = ar_loss(model.backbone, batch, MASK).loss
    assert float(both) == pytest.approx(float(base + 0.5 * nt), abs=1e-12)
    b0 = compute_loss(model.backbone, fam0, batch, train=False, generator=torch.Generator().manual_seed(3))
    b1 = compute_loss(model.backbone, fam, batch, train=False, generator=torch.Generator().manual_seed(3))
    assert torch.equal(b0.nll, b1.nll) and float(b0.loss) == float(b1.loss)


@pytest.mark.parametrize("bad", [-1.0, float("inf"), float("nan"), "1", True])
def test_ar_weight_is_checked_and_belongs_to_setdlm(bad):
    with pytest.raises((ValueError, TypeError), match="ar_weight"):
        FamilyConfig("setdlm", 48, MASK, D=2, ar_weight=bad)
    with pytest.raises(ValueError, match="ar_weight applies to family 'setdlm' only"):
        FamilyConfig("ar", 48, MASK, ar_weight=1.0)
    with pytest.raises(ValueError, match="ar_weight"):
        TrainConfig(family="bd3lm", ar_weight=1.0, out="run")
    assert TrainConfig(family="setdlm", ar_weight=0.5, out="run").family_config(3).ar_weight == 0.5


def test_a_sweep_adds_the_next_token_decode_of_a_model_with_the_head():
    """``speculate=True`` in a sweep (``setdlm bench --sweep-speculate``) adds, for a SetDLM with a next-token head,
    ``speculate="next_token"`` at every window (w = 1: its AR decode); the table marks those points."""
    from setdlm.evaluation import reports, sweeps

    model, _ = _pair()
    plain = tiny_model("setdlm", D=4)
    kinds = {(s.window, s.speculate) for s in sweeps.sweep_settings(model, [None], [1, 3], speculate=True)}
    assert kinds == {(1, False), (3, False), (3, True), (1, "next_token"), (3, "next_token")}
    assert {s.speculate for s in sweeps.sweep_settings(plain, [None], [1, 3], speculate=True)} == {False, True}
    point = sweeps.BenchPoint(model="m", family="setdlm", task="reasoning", quality=0.5, result={},
                              setting=sweeps.Setting(window=3, speculate="next_token"), tokens_per_second=10.0,
                              tokens_per_second_std=None, nfe=4.0, tokens_per_step=2.0)
    assert "| 3 next-token |" in reports.markdown_table([point])


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_the_shipped_model_gives_its_ar_decode_in_fewer_forwards(dtype):
    """``arith-setdlm-smax8-ar``: the AR decode of its weights, token for token, in under two thirds of the forwards
    (its window drafts word-problem solutions well). float32 and bfloat16 (the batch-32 precision on CPUs with
    AVX512-BF16, docs/decoding.md "Precision"): the same tokens on these prompts (a near-tie could flip one, as for
    ``speculate=True``)."""
    import setdlm

    model = setdlm.load("arith-setdlm-smax8-ar")
    model.backbone.to(dtype)
    ar = Model(model.backbone, FamilyConfig("ar", model.family.length, model.family.mask_token_id), model.tokenizer)
    prompts = ["Q: Tom has 3 apples and buys 5 more. How many apples does Tom have?", "Q: 12 + 7 =",
               "Q: A box holds 6 pens. How many pens are in 4 boxes?"]
    ref = generate(ar, prompts, max_new_tokens=48)
    out = generate(model, prompts, max_new_tokens=48, window=6, speculate="next_token")
    _same(out, ref)
    assert 1.5 * sum(out.row_nfe) < sum(ref.row_nfe)


def test_bench_sweeps_the_next_token_decode_of_the_shipped_model(tmp_path, capsys):
    """``setdlm bench arith-setdlm-smax8-ar --sweep-speculate``: beside the windows and their ``window=1``-verified
    decode, the next-token decode at each window (marked ``next-token``); all of those answer as the AR decode of
    the same weights, the wider ones in fewer forwards per token."""
    import setdlm
    from setdlm.evaluation import TaskSpec, reports, task_examples
    from setdlm.evaluation.reasoning import reasoning

    from support import run

    code, stdout, err = run(["bench", "arith-setdlm-smax8-ar", "--task", "reasoning", "--n", "6", "--warmup", "1",
                             "--thresholds", "off", "--windows", "1,4", "--sweep-speculate", "--out",
                             str(tmp_path / "b")], capsys)
    assert code == 0, err
    pts = {(p.setting.window, p.setting.speculate): p for p in reports.read_json(tmp_path / "b" / "bench.json")}
    assert set(pts) == {(1, False), (4, False), (4, True), (1, "next_token"), (4, "next_token")}
    assert "| 4 next-token |" in stdout and "| 1 next-token |" in stdout
    head1, head4 = pts[1, "next_token"], pts[4, "next_token"]
    assert head1.result["correct"] == head4.result["correct"]
    assert head4.forwards_per_token < head1.forwards_per_token == 1.0
    model = setdlm.load("arith-setdlm-smax8-ar")
    ar = Model(model.backbone, FamilyConfig("ar", model.family.length, model.family.mask_token_id), model.tokenizer)
    examples, _ = task_examples(TaskSpec("reasoning", n=6), [model])
    ref = reasoning(ar, examples, run=EvalRun(progress=False))
    fast = reasoning(model, examples, speculate="next_token", window=4, run=EvalRun(progress=False))
    assert fast.predictions == ref.predictions and ref.to_dict()["correct"] == head4.result["correct"]


@pytest.mark.parametrize("level", ["default", "avx2"])
def test_the_contracts_hold_at_other_cpu_kernel_levels(level):
    """The shipped model's float32 and bfloat16 next-token decodes equal its AR decode, and every verifier and cache
    equals its from-scratch forward, with ATen's vector kernels (and oneDNN) forced to another level, as on an
    AVX2-only machine: the tests above rerun in a subprocess (rounding follows the kernels)."""
    import os
    import subprocess
    import sys

    from support import subprocess_env

    env = {**subprocess_env(), "ATEN_CPU_CAPABILITY": level, "ONEDNN_MAX_CPU_ISA": "AVX2",
           "PYTHONPATH": os.pathsep.join([subprocess_env()["PYTHONPATH"], os.path.dirname(os.path.dirname(__file__))])}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__, "-k",
                           "shipped_model_gives or every_verifier or greedy_output"], env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout and "failed" not in proc.stdout
