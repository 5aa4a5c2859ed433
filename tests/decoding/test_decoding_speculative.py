"""Lossless self-speculative SetDLM decoding (docs/decoding.md, "Self-speculative decoding"): the output is
token for token that of ``generate(window=1, threshold=None)`` (greedy, seeded sampling, penalties, EOS, stop
strings, max_new_tokens, ragged batches, sessions, fill), in fewer forwards; every verifier's logits equal
the left-to-right two-stream training forward and the cache after every step equals a clean prefill of the
committed prefix in position order, i.e. the ``window=1`` cache (float64, 1e-9); the shipped SetDLM models
give the same tokens in float64 and float32."""

import dataclasses

import pytest
import torch

import setdlm
from setdlm import Model
from setdlm.decoding import DecodeSettings, fill, generate
from setdlm.decoding.session import Session
from setdlm.errors import InputWarning
from setdlm.evaluation import TaskSpec, reports, sweeps, task_examples
from setdlm.evaluation.reasoning import reasoning
from setdlm.masks import describe, speculative_step_mask
from setdlm.evaluation.passes import EvalRun

from support import (MASK, PROMPTS, CharTokenizer, active_rows, assert_cache_clean, recorded, run,
                     session_results, setdlm_training_logits, tiny_model)

TOL = 1e-9
SAMPLED = [dict(temperature=1.0, top_p=0.9), dict(temperature=0.7, top_k=5, repetition_penalty=1.2),
           dict(repetition_penalty=1.3, length_penalty=(3, 1.5), eos_token_id=2)]


@pytest.fixture(params=["all", "last"])
def layout(request):
    """The query layout a test decodes with, each in turn (docs/decoding.md, "Self-speculative decoding",
    ``verify_layout``): a window of masks on every horizon, or on the horizon of the whole draft only
    (verifiers alone on the others)."""
    return request.param


def test_auto_layout_follows_the_batch_size_and_never_feeds_the_window_squared():
    from setdlm.decoding import speculative

    assert speculative.windowed_horizons(1, 4) == speculative.windowed_horizons(32, 4) == "last"  # the CPU's choice
    assert speculative.windowed_horizons(1, 4, "all") == speculative.windowed_horizons(32, 4, "all") == "all"
    assert speculative.windowed_horizons(1, 4, "last", all_up_to=1) == "last"
    assert speculative.windowed_horizons(1, 4, all_up_to=1) == "all" and speculative.windowed_horizons(2, 4, all_up_to=1) == "last"
    assert speculative.windowed_horizons(1, 8, all_up_to=1) == "all"
    assert speculative.windowed_horizons(1, 9, all_up_to=1) == "last"  # w² bound


def _same(a, b):
    assert a.tokens == b.tokens and a.sequences == b.sequences and a.finish_reason == b.finish_reason
    assert a.texts == b.texts


def test_step_mask_is_the_two_stream_mask_with_the_draft_in_the_clean_stream():
    """Pending token at 4, draft at 5 and 6; w = 2 masks per horizon 4, 5, 6 (a padding slot in the middle)."""
    clean = torch.tensor([[4, 5, 6, 99]])
    clean_ok = torch.tensor([[True, True, True, False]])
    horizon = torch.tensor([[5, 5, 6, 6, 7, 7]])  # the verifier at 5 (horizon 5), then 6 and 7
    mask = speculative_step_mask(clean, clean_ok, horizon, torch.ones(1, 6, dtype=torch.bool))[0]
    assert describe(mask) == ["1000000000",  # clean: causal by position
                              "1100000000",
                              "1110000000",
                              "0001000000",  # padding sees itself only
                              "1000100000",  # horizon 5: the clean tokens before 5, and itself
                              "1000010000",
                              "1100001000",  # horizon 6
                              "1100000100",
                              "1110000010",  # horizon 7: the whole draft
                              "1110000001"]


@pytest.mark.parametrize("w", [1, 2, 3, 5])
def test_greedy_output_equals_the_left_to_right_decode_in_fewer_forwards(w, layout):
    model = tiny_model("setdlm", D=4)
    ref = generate(model, PROMPTS, max_new_tokens=20, ignore_eos=True, window=1)
    out = generate(model, PROMPTS, max_new_tokens=20, ignore_eos=True, window=w, speculate=True, verify_layout=layout, trace=True)
    _same(out, ref)
    accepted = sum(s.accepted for row in out.trace for s in row)
    assert sum(out.row_committed) == sum(ref.row_committed)
    # each accepted draft saves one forward, bar a row's last step when it had no position left to verify
    unverified = sum(len(s.committed_positions) == s.accepted for row in out.trace for s in row)
    assert unverified <= len(PROMPTS) and all(len(row[-1].committed_positions) > 0 for row in out.trace)
    assert sum(out.row_nfe) == sum(ref.row_nfe) - accepted + unverified
    if w == 1:
        assert out.nfe == ref.nfe and accepted == 0
    else:
        assert accepted > 0 and out.nfe < ref.nfe
    for row in out.trace:
        for s in row:  # the committed set: the accepted drafts, then the verifier's own token
            assert 0 <= s.accepted <= len(s.draft_positions) <= w - 1
            assert s.committed_positions[: s.accepted] == s.draft_positions[: s.accepted]
            assert s.committed_tokens[: s.accepted] == s.draft_tokens[: s.accepted]
            assert len(s.committed_positions) in (s.accepted, s.accepted + 1)


@pytest.mark.parametrize("knobs", SAMPLED)
@pytest.mark.parametrize("w", [2, 4])
def test_seeded_sampling_and_penalties_equal_the_left_to_right_decode(knobs, w, layout):
    model = tiny_model("setdlm", D=4)
    ref = generate(model, PROMPTS, max_new_tokens=16, window=1, seed=[1, 2, 3], **knobs)
    out = generate(model, PROMPTS, max_new_tokens=16, window=w, speculate=True, verify_layout=layout, seed=[1, 2, 3], **knobs)
    _same(out, ref)
    assert out.nfe < ref.nfe
    alone = generate(model, PROMPTS[1:2], max_new_tokens=16, window=w, speculate=True, verify_layout=layout, seed=[2], **knobs)
    assert alone.tokens[0] == out.tokens[1]  # batched == alone, with the row's seed


@pytest.mark.parametrize("case", ["generate", "fill"])
def test_every_step_verifies_with_the_left_to_right_conditional_and_caches_what_it_caches(case, layout):
    """Each verifier's logits equal the training forward with every position before it visible (left to
    right); after every step each row's cache is a clean causal prefill of its committed prefix (cached ==
    recomputed), so it equals the cache the window=1 decode holds at that point."""
    plain = tiny_model("setdlm", D=3)
    model, rec = recorded(plain)
    w = 3
    if case == "generate":
        inputs = [p + [MASK] * 12 for p in PROMPTS]
        out = generate(model, PROMPTS, max_new_tokens=12, ignore_eos=True, window=w, speculate=True, verify_layout=layout, trace=True)
        ref = generate(plain, PROMPTS, max_new_tokens=12, ignore_eos=True, window=1)
    else:
        inputs = [[1, 5, MASK, MASK, MASK, 7, 9, MASK, MASK, 3], [1, MASK, MASK, 4, 11, 3, 6, 20, MASK, MASK, MASK, 2]]
        out = fill(model, inputs, window=w, speculate=True, verify_layout=layout, trace=True)
        ref = fill(plain, inputs, window=1)
    _same(out, ref)
    bb = model.backbone.inner
    assert len(rec.calls) == 1 + out.nfe
    for r, row in enumerate(inputs):
        seq = out.sequences[r]
        context = [p for p, t in enumerate(row) if t != MASK]
        assert_cache_clean(bb, rec.calls[0], r, [seq[p] for p in context], context)
        done = set(context)
        for k, step in enumerate(out.trace[r]):
            call, b = rec.calls[k + 1], active_rows(out.row_nfe, k).index(r)
            drafted = list(seq)  # the sequence as this step's draft has it (a rejected draft too)
            for p, t in zip(step.draft_positions, step.draft_tokens):
                drafted[p] = t
            for i, q in enumerate(step.query_positions):  # verifier i: query slot i·w ("all") or i ("last")
                # insertion order: the context (one prefill), then the committed tokens and the draft, left to right
                visible = context + sorted(done - set(context)) + step.draft_positions[:i]
                ref_logits = setdlm_training_logits(bb, drafted, visible, q)
                slot = i * w if layout == "all" else i
                assert torch.allclose(call.logits[b, slot], ref_logits, atol=TOL, rtol=0), (r, k, q)
            done |= set(step.committed_positions)
            if k + 1 == len(out.trace[r]):
                break
            # the cache after this step = the first entries of the next forward's, which appends its clean
            # tokens (keep) right after them; the last committed token is not cached yet
            last = max(step.committed_positions)
            cached = context + sorted(p for p in done - set(context) if p < last)
            nxt, b2 = rec.calls[k + 2], active_rows(out.row_nfe, k + 1).index(r)
            assert int(nxt.lengths[b2]) == len(cached) + int(nxt.keep[b2])
            assert_cache_clean(bb, _cropped(nxt, b2, len(cached)), b2, [seq[p] for p in cached], cached)


def _cropped(call, b, n):
    """``call`` with row ``b`` of its cache cropped to its first ``n`` entries."""
    cache = call.cache.clone()
    cache.lengths[b] = n
    return dataclasses.replace(call, cache=cache)


def test_eos_stop_strings_and_max_new_tokens_end_rows_as_the_left_to_right_decode(layout):
    m = tiny_model("setdlm", D=4, seed=2)
    model = Model(m.backbone, m.family, CharTokenizer())
    prompts = ["the cat", "dogs", "a", "hello there"]
    free = generate(model, prompts, max_new_tokens=16, ignore_eos=True, window=1)
    eos = free.tokens[1][5]  # a token the model generates
    stop = free.texts[0][4:6]
    reasons = set()
    for knobs in [dict(eos_token_id=eos), dict(ignore_eos=True, stop=[stop, "zz"]),
                  dict(eos_token_id=eos, stop=[stop]), dict(ignore_eos=True)]:
        for n in (3, 16):
            ref = generate(model, prompts, max_new_tokens=n, window=1, **knobs)
            out = generate(model, prompts, max_new_tokens=n, window=4, speculate=True, verify_layout=layout, **knobs)
            _same(out, ref)
            reasons |= set(out.finish_reason)
    assert reasons == {"eos", "stop", "length"}


def test_session_rows_joining_between_steps_decode_as_alone(layout):
    model = tiny_model("setdlm", D=4)
    s = Session(model, width=40)
    first = s.add(PROMPTS[0], max_new_tokens=12, ignore_eos=True, window=3, speculate=True, verify_layout=layout)
    s.step()
    s.step()
    later = s.add(PROMPTS[1], max_new_tokens=12, ignore_eos=True, window=3, speculate=True, verify_layout=layout)
    plain = s.add(PROMPTS[2], max_new_tokens=12, ignore_eos=True)  # another group: the window decode
    done = session_results(s)
    ref = generate(model, PROMPTS, max_new_tokens=12, ignore_eos=True, window=1)
    assert done[first].tokens == ref.tokens[0] and done[later].tokens == ref.tokens[1]
    assert done[plain].tokens == generate(model, PROMPTS[2:], max_new_tokens=12, ignore_eos=True).tokens[0]
    assert done[later].nfe < 12


@pytest.mark.parametrize("name,prompts", [
    ("arith-setdlm-smax8", ["Q: Tom has 3 apples and buys 5 more. How many apples does Tom have?\nA:", "Q: 12 + 7 =",
                            "Q: A box holds 6 pens. How many pens are in 4 boxes?\nA:"]),
    ("shakespeare-setdlm-smax8", ["ROMEO:", "First Citizen:\nBefore we proceed", "KING"])])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_shipped_models_give_the_left_to_right_tokens(name, prompts, dtype, layout):
    """float64: exact. float32: the verifiers' logits differ from the window=1 decode's by the rounding of
    differently shaped kernels (~1e-6), so a near-tie could flip a token; on these prompts none does."""
    model = setdlm.load(name)
    model.backbone.to(dtype)
    ref = generate(model, prompts, max_new_tokens=32, window=1)
    out = generate(model, prompts, max_new_tokens=32, speculate=True, verify_layout=layout)  # the default window, D = 4
    _same(out, ref)
    assert out.nfe < ref.nfe


@pytest.mark.parametrize("knobs,needle", [
    (dict(speculate=True, threshold=0.5), "threshold does not apply"),
    (dict(speculate=True, cache_order="reveal"), "cache_order='reveal' does not apply"),
    (dict(speculate=True, reveal_times=[[0.5] * 4] * 3), "reveal_times do not apply"),
    (dict(speculate=True, max_new_tokens=60), r"prompt \+ max_new_tokens <= the context length"),
    (dict(speculate="yes"), "speculate must be True, False, None or 'next_token'")])
def test_bad_settings_raise_clear_errors(knobs, needle):
    knobs.setdefault("max_new_tokens", 4)
    with pytest.raises((ValueError, TypeError), match=needle):
        generate(tiny_model("setdlm"), PROMPTS, **knobs)


@pytest.mark.parametrize("family", ["ar", "bd3lm", "mdlm"])
def test_other_families_refuse_speculate(family, layout):
    with pytest.raises(ValueError, match="speculate applies to setdlm models"):
        generate(tiny_model(family), PROMPTS, max_new_tokens=4, speculate=True, verify_layout=layout)
    generate(tiny_model(family), PROMPTS, max_new_tokens=2, speculate=False)  # off is fine everywhere


def test_bench_sweeps_speculation_beside_the_windows(tmp_path, capsys, layout):
    """``setdlm bench --sweep-speculate`` adds each SetDLM window's speculative decode (w > 1) beside w = 1, the
    default window and AR, side by side in one run; its accuracy is w = 1's, in fewer forwards per token."""
    code, stdout, err = run(["bench", "arith-setdlm-smax8", "arith-ar", "--task", "reasoning", "--n", "6",
                             "--warmup", "1", "--thresholds", "off", "--windows", "1,D", "--sweep-speculate",
                             "--out", str(tmp_path / "b")], capsys)
    assert code == 0, err
    lines = stdout.strip().splitlines()
    assert lines[0].endswith("| NFE | TPF | forwards/token | × AR quality | × AR tok/s |")  # AR in the sweep
    rows = lines[2:lines.index("")] if "" in lines else lines[2:]  # the AUP table follows a blank line
    assert [line.split(" | ")[3] for line in rows] == ["1", "4", "4 spec", "–"]  # w column
    pts = {(p.family, p.setting.window, p.setting.speculate): p for p in reports.read_json(tmp_path / "b" / "bench.json")}
    w1, spec, window = pts["setdlm", 1, False], pts["setdlm", 4, True], pts["setdlm", 4, False]
    assert spec.quality == w1.quality and spec.result["correct"] == w1.result["correct"]
    assert spec.forwards_per_token < w1.forwards_per_token == 1.0 == window.forwards_per_token
    assert spec.tokens_per_step == pytest.approx(1 / spec.forwards_per_token)
    model = setdlm.load("arith-setdlm-smax8")
    examples, _ = task_examples(TaskSpec("reasoning", n=6), [model])
    a = reasoning(model, examples, window=1, run=EvalRun(progress=False))
    b = reasoning(model, examples, speculate=True, verify_layout=layout, run=EvalRun(progress=False))
    assert a.predictions == b.predictions and b.run.nfe_per_example < a.run.nfe_per_example
    with pytest.raises(ValueError, match="give speculate=True to the sweep"):
        sweeps.sweep([("m", model)], "reasoning", examples, DecodeSettings(speculate=True, verify_layout=layout))


def test_verify_layout_is_a_setting_of_the_call_the_command_line_and_the_request(capsys):
    """The query layout is the decode's own setting, not module state: two decodes in one process can differ
    ("all" feeds a window on every horizon, "last" on the whole draft's only; the same tokens either way), the
    command line spells it --verify-layout, a bad value or one without speculate=True is refused, and a value
    with nothing speculating says that it is ignored."""
    model = tiny_model("setdlm", D=4)
    ref = generate(model, PROMPTS[:1], max_new_tokens=16, ignore_eos=True, window=1)
    fed = {}
    for layout in ("all", "last"):
        out = generate(model, PROMPTS[:1], max_new_tokens=16, ignore_eos=True, window=4, speculate=True,
                       verify_layout=layout, trace=True)
        assert out.tokens == ref.tokens
        fed[layout] = max(len(s.input_positions) for s in out.trace[0])
    assert fed["all"] > fed["last"]
    with pytest.raises(ValueError, match="verify_layout must be one of auto, all, last, got 'wide'"):
        DecodeSettings(speculate=True, verify_layout="wide")
    with pytest.raises(ValueError, match="applies with speculate=True only"):
        DecodeSettings(speculate="next_token", verify_layout="all")
    with pytest.warns(InputWarning, match="this decode does not speculate, so it is ignored"):
        generate(model, PROMPTS[:1], max_new_tokens=2, verify_layout="last")
    code, out, err = run(["generate", "arith-setdlm-smax8", "--prompt", "Ann has 5 eggs.", "--max-new-tokens", "12",
                          "--speculate", "--verify-layout", "all"], capsys)
    assert code == 0, err
    code2, out2, err2 = run(["generate", "arith-setdlm-smax8", "--prompt", "Ann has 5 eggs.", "--max-new-tokens", "12",
                             "--window", "1"], capsys)
    assert code2 == 0 and out == out2, err2
    code, _, err = run(["generate", "arith-setdlm-smax8", "--prompt", "x", "--verify-layout", "all",
                        "--speculate-next-token"], capsys)
    assert code != 0 and "--verify-layout all" in err and "--speculate" in err


def test_a_wide_window_feeds_about_three_windows_a_forward_not_its_square(monkeypatch):
    """"auto" gives a window wider than 8 the "last" layout even alone: at w = 12 a forward feeds at most
    2(w − 1) + w + 1 = 35 positions per row, where every horizon's window would be w + w² = 156."""
    model = tiny_model("setdlm", D=4)
    w = 12
    out = generate(model, PROMPTS[:1], max_new_tokens=24, ignore_eos=True, window=w, speculate=True, trace=True)
    assert out.tokens == generate(model, PROMPTS[:1], max_new_tokens=24, ignore_eos=True, window=1).tokens
    fed = [len(s.input_positions) for s in out.trace[0]]
    assert max(fed) <= 2 * (w - 1) + w + 1 and max(fed) > w  # drafts were verified, the square never fed
