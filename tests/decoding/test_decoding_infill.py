"""Infilling (docs/method.md §4.6): prefix and suffix untouched, exactly the requested number of positions filled,
for every family; SetDLM caches prefix and suffix up front and slides its window over the masked middle;
AR conditions on the prefix only; several gaps at arbitrary positions; strings through a tokenizer."""

import pytest

from setdlm import Model
from setdlm.decoding import applicable, fill, generate, infill

from support import MASK, CharTokenizer, recorded, tiny_model

PREFIXES = [[1, 5, 7], [1, 9, 4, 11, 3], [1, 30]]
SUFFIXES = [[6, 20, 2], [8, 2], [12, 40, 33, 21, 2]]
LENGTHS = [5, 3, 8]


@pytest.mark.parametrize("family", ["ar", "mdlm", "bd3lm", "setdlm"])
def test_infill_fills_exactly_the_middle(family):
    out = infill(tiny_model(family), PREFIXES, SUFFIXES, LENGTHS, trace=True, **applicable(family, threshold=0.3))
    for r in range(3):
        seq, mid = out.sequences[r], out.tokens[r]
        assert len(mid) == LENGTHS[r] and MASK not in mid
        assert seq == PREFIXES[r] + mid + SUFFIXES[r]
        assert out.finish_reason[r] == "done"
        filled = sorted(p for s in out.trace[r] for p in s.committed_positions)
        assert filled == list(range(len(PREFIXES[r]), len(PREFIXES[r]) + LENGTHS[r]))
    assert out.texts is None


def test_setdlm_infill_caches_context_up_front_and_windows_the_middle():
    w = 3
    model, rec = recorded(tiny_model("setdlm"))
    out = infill(model, PREFIXES, SUFFIXES, LENGTHS, window=w, trace=True)
    assert rec.calls[0].lengths.tolist() == [len(p) + len(s) for p, s in zip(PREFIXES, SUFFIXES)]
    assert out.row_nfe == LENGTHS  # threshold off: one token per forward
    for r in range(3):
        P, unresolved = len(PREFIXES[r]), set(range(len(PREFIXES[r]), len(PREFIXES[r]) + LENGTHS[r]))
        for step in out.trace[r]:
            f = min(unresolved)
            assert step.query_positions == sorted(p for p in unresolved if p < f + w)
            assert all(P <= p < P + LENGTHS[r] for p in step.input_positions)  # only the middle is fed
            unresolved -= set(step.committed_positions)


def test_ar_infill_conditions_on_the_prefix_only():
    model = tiny_model("ar")
    out = infill(model, PREFIXES, SUFFIXES, LENGTHS)
    for r in range(3):
        alone = generate(model, [PREFIXES[r]], max_new_tokens=LENGTHS[r], ignore_eos=True)
        assert out.tokens[r] == alone.tokens[0]


@pytest.mark.parametrize("family", ["ar", "mdlm", "bd3lm", "setdlm"])
def test_several_gaps_at_arbitrary_positions(family):
    rows = [[1, MASK, MASK, 4, 5, MASK, 6, MASK, MASK, MASK, 7],
            [MASK, 3, 9, MASK, MASK, MASK, MASK, 2]]
    if family == "ar":
        rows[1] = rows[1][1:]  # AR needs a token before its first gap
    out = fill(tiny_model(family), rows, **applicable(family, threshold=0.3))
    for r, row in enumerate(rows):
        seq = out.sequences[r]
        assert len(seq) == len(row) and MASK not in seq
        assert all(s == t for s, t in zip(seq, row) if t != MASK)  # context untouched
        assert out.tokens[r] == [s for s, t in zip(seq, row) if t == MASK]
    with pytest.raises(ValueError, match="before the first MASK"):
        fill(tiny_model("ar"), [[MASK, 3, 4]])


def test_infill_with_strings_and_a_zero_length_refused():
    model = tiny_model("setdlm")
    model = Model(model.backbone, model.family, CharTokenizer())
    out = infill(model, ["the cat", "a"], [" sat.", ""], [4, 1])
    tok = model.tokenizer
    assert out.texts[0] == tok.decode(out.tokens[0]) and len(out.tokens[0]) == 4
    # a string prefix starts with BOS, as every training row does; the suffix is encoded as it is
    assert out.sequences[0] == [tok.bos_token_id] + tok.encode("the cat") + out.tokens[0] + tok.encode(" sat.")
    assert len(out.tokens[1]) == 1 and out.finish_reason[1] == "done"
    with pytest.raises(ValueError, match=r"lengths\[1\] must be a positive integer \(tokens to fill\), got 0"):
        infill(model, ["the cat", "a"], [" sat.", ""], [4, 0])
    ids = infill(model, [[tok.bos_token_id] + tok.encode("the cat")], [tok.encode(" sat.")], 4)
    assert ids.tokens[0] == out.tokens[0]  # strings and the equivalent token ids decode alike
    with pytest.raises(ValueError, match="got 1 lengths for 2 rows"):
        infill(model, ["a", "b"], ["c", "d"], [1])
    with pytest.raises(ValueError, match="more than the context length"):
        infill(model, ["a"], ["b"], model.family.length)
