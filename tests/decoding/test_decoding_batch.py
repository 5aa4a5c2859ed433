"""Batched decoding equals decoding each row alone, for every decoder: greedy and sampled (per-row seeds),
ragged prompts, rows finishing at different steps (EOS, threshold) and leaving the batch."""

import pytest

from setdlm.decoding import applicable, generate

from support import PROMPTS, recorded, tiny_model

FAMILIES = ["ar", "mdlm", "bd3lm", "setdlm"]
SAMPLED = dict(temperature=0.9, top_p=0.9, top_k=20, repetition_penalty=1.3, length_penalty=(4, 1.5))


def _eos_for(model, **kw) -> int:
    """A token that some rows generate and others do not, used as EOS so that rows stop at different steps."""
    out = generate(model, PROMPTS, ignore_eos=True, **kw).tokens
    return next(t for row in out for t in row if not all(t in r for r in out))


def _same(batch, alone):
    assert batch.tokens == [a.tokens[0] for a in alone]
    assert batch.sequences == [a.sequences[0] for a in alone]
    assert batch.finish_reason == [a.finish_reason[0] for a in alone]
    assert batch.row_nfe == [a.row_nfe[0] for a in alone]
    assert batch.row_committed == [a.row_committed[0] for a in alone]


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_batch_equals_rows_alone(family):
    model = tiny_model(family, seed=2)  # a seed whose random model gives every family varied rows
    kw = dict(max_new_tokens=10, **applicable(family, threshold=0.3))
    kw["eos_token_id"] = _eos_for(model, **kw)
    batch = generate(model, PROMPTS, **kw)
    _same(batch, [generate(model, [p], **kw) for p in PROMPTS])
    assert "eos" in batch.finish_reason and len(set(batch.row_nfe)) > 1
    assert batch.nfe == max(batch.row_nfe)


@pytest.mark.parametrize("family", FAMILIES)
def test_sampled_batch_equals_rows_alone_with_per_row_seeds(family):
    model = tiny_model(family)
    seeds = [7, 8, 9]
    kw = dict(max_new_tokens=10, eos_token_id=3, **SAMPLED, **applicable(family, threshold=0.5))
    kw["eos_token_id"] = _eos_for(model, seed=seeds, **kw)
    batch = generate(model, PROMPTS, seed=seeds, **kw)
    assert "eos" in batch.finish_reason
    _same(batch, [generate(model, [p], seed=[s], **kw) for p, s in zip(PROMPTS, seeds)])
    again = generate(model, PROMPTS, seed=seeds, **kw)
    assert again.tokens == batch.tokens  # reproducible
    other = generate(model, PROMPTS, seed=[1, 2, 3], **kw)
    assert other.tokens != batch.tokens  # and actually random


def test_int_seed_applies_to_every_row_and_batch_size_chunks_agree():
    model = tiny_model("setdlm")
    full = generate(model, PROMPTS * 2, max_new_tokens=8, seed=5, eos_token_id=2, ignore_eos=True, **SAMPLED)
    assert full.tokens[:3] == full.tokens[3:]  # same seed, same prompt, same sample
    chunked = generate(model, PROMPTS * 2, max_new_tokens=8, seed=5, eos_token_id=2, ignore_eos=True, batch_size=2,
                       **SAMPLED)
    assert chunked.tokens == full.tokens
    assert chunked.nfe > full.nfe  # three chunks of forwards instead of one batch


def test_finished_rows_leave_the_batch():
    model, rec = recorded(tiny_model("setdlm"))
    eos = _eos_for(tiny_model("setdlm"), max_new_tokens=10, threshold=0.3)
    out = generate(model, PROMPTS, max_new_tokens=10, threshold=0.3, eos_token_id=eos)
    sizes = [c.ids.shape[0] for c in rec.calls[1:]]
    assert sizes == sorted(sizes, reverse=True) and sizes[-1] < 3
    assert sizes == [sum(n > k for n in out.row_nfe) for k in range(out.nfe)]
