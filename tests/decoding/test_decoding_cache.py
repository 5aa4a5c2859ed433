"""Cache exactness during decoding (float64, 1e-9): at every step of SetDLM, BD3LM and AR decoding, for
every row of a ragged batch (rows leave as they finish), the query logits equal a from-scratch forward
over the same visible tokens with the training-time mask, and every cached K/V equals the clean-stream
K/V recomputed from scratch in insertion order (so no cached entry depends on a MASK input). MDLM's
reordered input gives the logits of a plain natural-order forward. Overflow (docs/method.md §4.5) evicts the
smallest positions."""

import pytest
import torch

from support import (MASK, PROMPTS, active_rows, assert_bd3lm_steps_exact, assert_cache_clean, recorded,
                     setdlm_training_logits, step_logits, tiny_model)
from setdlm.decoding import fill, generate
from setdlm.masks import bidirectional_mask, causal_mask

TOL = 1e-9


GAPPED = [[1, 5, MASK, MASK, MASK, 7, 9, MASK, MASK, 3],  # several gaps, ragged rows
          [1, MASK, MASK, 4, 11, 3, 6, 20, MASK, MASK, MASK, MASK, 2],
          [1, 30, 8, MASK, MASK, MASK, MASK, MASK, MASK, 12, 40]]


def _decode(model, case, **kw):
    """Decode ``PROMPTS`` (generate) or ``GAPPED`` (fill); returns the output and each row's input."""
    if case == "generate":
        out = generate(model, PROMPTS, max_new_tokens=12, ignore_eos=True, trace=True, **kw)
        return out, [p + [MASK] * 12 for p in PROMPTS]
    return fill(model, GAPPED, trace=True, **kw), GAPPED


@pytest.mark.parametrize("case,threshold,cache_order", [("generate", None, "position"), ("generate", 0.3, "position"),
                                                        ("generate", 0.3, "reveal"), ("fill", 0.3, "position")])
def test_setdlm_steps_equal_training_forward(case, threshold, cache_order):
    model, rec = recorded(tiny_model("setdlm", D=3))
    kw = dict(cache_order=cache_order) if case == "generate" else {}
    out, inputs = _decode(model, case, threshold=threshold, seed=[3, 4, 5], **kw)
    bb = model.backbone.inner
    assert len(rec.calls) == 1 + out.nfe
    if threshold is not None:
        assert len(set(out.row_nfe)) > 1 and out.tokens_per_step > 1  # rows leave the batch at different steps
    for r, row in enumerate(inputs):
        seq = out.sequences[r]
        cached = [p for p, t in enumerate(row) if t != MASK]  # prefill: all context, ascending
        n_ctx = len(cached)
        assert_cache_clean(bb, rec.calls[0], r, [seq[p] for p in cached], cached)
        committed = 0
        for k, step in enumerate(out.trace[r]):
            call, b = rec.calls[k + 1], active_rows(out.row_nfe, k).index(r)
            clean = step.input_positions[: len(step.input_positions) - len(step.query_positions)]
            assert sorted(step.input_positions[len(clean):]) == step.query_positions  # masks after clean
            assert step.cache_length == n_ctx + committed  # context + all but the last step's commits
            for q in step.query_positions:
                ref = setdlm_training_logits(bb, seq, cached + clean, q)
                assert torch.allclose(step_logits(call, b, q), ref, atol=TOL, rtol=0), (r, k, q)
            cached += clean
            assert_cache_clean(bb, call, b, [seq[p] for p in cached], cached)
            committed += len(step.committed_positions)


@pytest.mark.parametrize("case,threshold", [("generate", None), ("generate", 0.3), ("fill", 0.3)])
def test_bd3lm_steps_equal_training_forward(case, threshold):
    S = 4
    model, rec = recorded(tiny_model("bd3lm", block_size=S))
    out, inputs = _decode(model, case, threshold=threshold)
    bb = model.backbone.inner
    prefilled = len(rec.calls) - out.nfe  # no prefill call when no row has a full block before its first MASK
    for r, row in enumerate(inputs):
        seq = out.sequences[r]
        resolved = {p for p, t in enumerate(row) if t != MASK}
        full = row.index(MASK) // S * S
        if prefilled:
            assert_cache_clean(bb, rec.calls[0], r, seq[:full], list(range(full)), block_size=S)
        assert_bd3lm_steps_exact(bb, rec, out, r, resolved, block_size=S, prefilled=prefilled, tol=TOL)


def test_ar_steps_equal_full_causal_forward():
    model, rec = recorded(tiny_model("ar"))
    out = generate(model, PROMPTS, max_new_tokens=8, ignore_eos=True, trace=True)
    bb = model.backbone.inner
    assert out.nfe == 8 and out.row_nfe == [8, 8, 8]  # prefill excluded: one forward per token
    for r, prompt in enumerate(PROMPTS):
        seq = out.sequences[r]
        assert_cache_clean(bb, rec.calls[0], r, seq[: len(prompt) - 1], list(range(len(prompt) - 1)))
        for k, step in enumerate(out.trace[r]):
            call, b = rec.calls[k + 1], active_rows(out.row_nfe, k).index(r)
            (q,) = step.query_positions
            assert step.input_positions == [q - 1]
            ids = torch.tensor([seq[:q]])
            ref = bb(ids, None, causal_mask(torch.ones(1, q, dtype=torch.bool)))[0, q - 1]
            assert torch.allclose(step_logits(call, b, q - 1), ref, atol=TOL, rtol=0)
            assert_cache_clean(bb, call, b, seq[:q], list(range(q)))


@pytest.mark.parametrize("case", ["generate", "fill"])
def test_mdlm_reordered_step_equals_natural_order_forward(case):
    bs = 4
    model, rec = recorded(tiny_model("mdlm", block_size=bs))
    out, inputs = _decode(model, case, threshold=0.3)
    bb = model.backbone.inner
    assert all(c.cache is None for c in rec.calls)  # no cache
    for r, row in enumerate(inputs):
        seq = out.sequences[r]
        gaps = [p for p, t in enumerate(row) if t == MASK]
        sub_block = {p: i // bs for i, p in enumerate(gaps)}  # sub-blocks of `bs` masked positions
        resolved = set(range(len(row))) - set(gaps)
        for k, step in enumerate(out.trace[r]):
            call, b = rec.calls[k], active_rows(out.row_nfe, k).index(r)
            current = sub_block[min(set(gaps) - resolved)]
            assert step.query_positions == [p for p in gaps if p not in resolved and sub_block[p] == current]
            xt = torch.tensor([[t if p in resolved else MASK for p, t in enumerate(seq)]])
            ref = bb(xt, None, bidirectional_mask(torch.ones(1, len(seq), dtype=torch.bool)))[0]
            for q in step.query_positions:
                assert torch.allclose(step_logits(call, b, q), ref[q], atol=TOL, rtol=0)
            resolved |= set(step.committed_positions)


def test_ar_overflow_is_a_sliding_window():
    """Prompt + generation > L: before each forward the entries with the smallest positions are evicted so
    that cache + new tokens = L, and the step equals the same forward on the uncropped cache with those
    entries hidden by the mask (eviction changes nothing else)."""
    L = 12
    model, rec = recorded(tiny_model("ar", L=L))
    out = generate(model, PROMPTS[1:2], max_new_tokens=10, ignore_eos=True, trace=True)
    bb, seq = model.backbone.inner, out.sequences[0]
    assert len(out.tokens[0]) == 10 and len(seq) > L
    for k, step in enumerate(out.trace[0]):
        call, (q,) = rec.calls[k + 1], step.query_positions
        lo = max(0, q - L)  # the window: positions lo .. q-1
        assert sorted(call.cache_pos[0, : int(call.lengths[0])].tolist()) == list(range(lo, q))
        if k == 0:
            continue
        cache = rec.calls[k].cache.clone()  # as it was before eviction, i.e. after the previous step
        visible = cache.positions() >= lo  # (1, C)
        mask = torch.cat([visible, torch.ones(1, 1, dtype=torch.bool)], -1)[:, None, None]  # (1, 1, 1, C + 1)
        ref = bb(torch.tensor([[seq[q - 1]]]), torch.tensor([[q - 1]]), mask, cache)[0, 0]
        assert torch.allclose(step_logits(call, 0, q - 1), ref, atol=TOL, rtol=0), k


@pytest.mark.parametrize("family", ["setdlm", "bd3lm"])
def test_overflow_evicts_smallest_positions_within_L(family):
    L = 16
    model, rec = recorded(tiny_model(family, L=L))
    out = generate(model, PROMPTS, max_new_tokens=20, threshold=0.3, ignore_eos=True, trace=True)
    assert [len(t) for t in out.tokens] == [20, 20, 20]
    evicted = False
    for r, prompt in enumerate(PROMPTS):
        ever = list(range(len(prompt) // 4 * 4 if family == "bd3lm" else len(prompt)))  # cached by prefill
        for k, step in enumerate(out.trace[r]):
            call, b = rec.calls[k + 1], active_rows(out.row_nfe, k).index(r)
            clean = [p for p in step.input_positions if p not in step.query_positions
                     and (family == "setdlm" or p < step.query_positions[0] // 4 * 4)]
            before = step.cache_length - len(clean)  # after eviction, before this step's new entries
            assert before + len(step.input_positions) <= L  # cache + new tokens never exceed L
            ever += clean
            kept = call.cache_pos[b, : step.cache_length].tolist()
            assert sorted(kept) == sorted(ever)[len(ever) - step.cache_length:]  # the largest positions
            evicted |= len(ever) > step.cache_length
    assert evicted


def test_mdlm_refuses_overflow():
    with pytest.raises(ValueError, match="MDLM has no cache"):
        generate(tiny_model("mdlm", L=16), PROMPTS, max_new_tokens=16)
