"""SetDLM decoding parity with the authors' code (case ``setdlm_generate_w2_tau_off`` of the tiny reference
DiT fixture): greedy, window 2, threshold off, 8 new tokens. Pins down docs/method.md §4.2 exactly: the positional
window [f, f + w), clean-first-then-masks input order, the tokens of step i cached inside the forward of
step i + 1 with the masks' K/V dropped, and one token per NFE. Runs on each way of reaching the weights (``reference_sources.SOURCES``)."""

import json

import pytest

from setdlm import Model
from setdlm.decoding import generate

from support import recorded
from support.reference_sources import FIX, SOURCES, reference_model

CASE = json.loads((FIX / "expected.json").read_text())["setdlm_generate_w2_tau_off"]


@pytest.fixture(scope="module", params=SOURCES)
def decoded(request, tmp_path_factory):
    backbone, family = reference_model(request.param, tmp_path_factory.mktemp(request.param))
    model, rec = recorded(Model(backbone, family))
    out = generate(model, [CASE["prompt"]], max_new_tokens=CASE["max_new_tokens"],
                   window=CASE["max_window_size"], threshold=None, trace=True)
    return out, rec


def test_tokens_nfe_and_backbone_calls(decoded):
    out, rec = decoded
    assert out.tokens == [CASE["generated"]]
    assert out.sequences == [CASE["sequence"]]
    assert out.nfe == CASE["nfe"] == 8 and out.row_nfe == [8]
    assert len(rec.calls) == CASE["backbone_calls_including_prefill"]
    assert [c.ids.shape[1] for c in rec.calls] == CASE["backbone_input_lengths"]
    assert out.tokens_per_step == CASE["parallelism_factor"] == 1.0
    assert [len(s.committed_positions) for s in out.trace[0]] == CASE["tokens_per_step"]
    assert out.finish_reason == ["length"]


def test_every_step_matches(decoded):
    out, rec = decoded
    steps = out.trace[0]
    assert len(steps) == len(CASE["steps"])
    for i, (ours, ref) in enumerate(zip(steps, CASE["steps"])):
        assert ours.input_positions == ref["backbone_position_ids"], i
        assert rec.calls[i + 1].pos[0].tolist() == ref["backbone_position_ids"], i
        assert ours.query_positions == ref["query_positions"], i
        assert ours.committed_positions == ref["committed_positions"], i
        assert ours.committed_tokens == ref["committed_tokens"], i
        assert ours.confidences == pytest.approx(ref["query_confidence"], abs=1e-5), i
        # the step's candidate for each committed query is what the reference committed
        cand = dict(zip(ours.query_positions, ours.candidates))
        assert [cand[p] for p in ref["committed_positions"]] == ref["committed_tokens"]


def test_cache_holds_prompt_plus_all_but_last_step(decoded):
    out, rec = decoded
    P = len(CASE["prompt"])
    assert rec.calls[0].lengths.tolist() == [P]  # prefill
    committed = 0
    for step in out.trace[0]:
        assert step.cache_length == P + committed  # this step's forward cached the previous commits
        committed += len(step.committed_positions)
