"""The error analysis of issue 22 (benchmarks/study/error_analysis.py): fields of a solution, the first
divergence, and the in-order / gapped commit statistics read from a real decode's trace. The decodes run a
real tiny model whose predictions are scripted (tests/support Scripted): the output is known, so every figure
the analysis reports can be checked by hand."""

from pathlib import Path

import pytest

from setdlm.data import char_tokenizer
from setdlm.data.tasks import ReasoningExample
from support import scripted, study_script, tiny

# a two-line problem short enough for L = 64: "3+4=7\n7*2=14\n#### 14" (20 characters, + EOS)
EX = ReasoningExample(question="3 and 4, twice?", solution="3+4=7\n7*2=14\n#### 14", answer=14)
WRONG = "3+4=7\n7*2=15\n#### 15"  # the second digit of line 1's result (index 11) is wrong


def _module():
    return study_script("error_analysis")


def _model(family: str, completion: str):
    """A tiny model of ``family`` (D = 2 for SetDLM) that writes ``completion`` then EOS after EX's prompt."""
    tok = char_tokenizer([EX.prompt + EX.solution + WRONG])
    m = tiny(family, tok, L=64)
    prompt = [tok.bos_token_id] + tok.encode(EX.prompt)
    return scripted(m, prompt + tok.encode(completion) + [tok.eos_token_id], tok.eos_token_id)


def test_slots_name_every_token_of_a_solution():
    ea = _module()
    s = ea.slots(EX.solution)
    assert len(s) == len(EX.solution) + 1 and s[-1].field == "eos"
    assert [x.field for x in s[:6]] == ["carry", "op", "operand", "eq", "result", "newline"]
    assert s[10] == ea.Slot(1, "result", 0, 2, "*") and s[11] == ea.Slot(1, "result", 1, 2, "*")
    assert [x.field for x in s[13:20]] == ["marker"] * 5 + ["answer"] * 2
    assert s[19] == ea.Slot("final", "answer", 1, 2)
    with pytest.raises(ValueError, match="not a solution line"):
        ea.slots("3+4=7\nso 7\n#### 7")


def test_first_divergence():
    ea = _module()
    assert ea.first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert ea.first_divergence([1, 5, 3], [1, 2, 3]) == 1
    assert ea.first_divergence([1, 2], [1, 2, 3]) == 2  # stopped short
    assert ea.first_divergence([1, 2, 3, 4], [1, 2, 3]) == 3  # ran past the reference's end


def test_a_right_answer_in_sets_of_two_is_half_gapped():
    """Every prediction is certain, so at threshold 0.9 the window (w = D = 2) commits two tokens a step:
    the second of each pair was predicted with its left neighbour masked (gap 1)."""
    ea = _module()
    r = ea.analyse(_model("setdlm", EX.solution), [EX], {"threshold": 0.9}, batch_size=1, seed=0)
    assert r["accuracy"] == 1.0 and r["wrong"] == 0 and r["first_error_field"] == {}
    assert r["tokens_per_step"] == pytest.approx(2.0)
    # 21 tokens (EOS included; the token the last step commits past EOS is not counted): 10 second in a pair
    assert r["gapped_commits"] == pytest.approx(10 / 21)
    assert r["clean_commits"]["gapped"] == {"n": 10, "error_rate": 0.0}
    assert r["clean_commits"]["in-order"] == {"n": 11, "error_rate": 0.0}
    assert r["hazard"]["result"] == {"tokens": 3, "first_errors": 0, "rate": 0.0}  # "7", "14"
    assert set(r["query_by_gap"]) == {"0", "1"} and r["query_by_gap"]["1"]["top1_right"] == 1.0


def test_a_wrong_digit_is_located_and_its_commit_was_gapped():
    ea = _module()
    r = ea.analyse(_model("setdlm", WRONG), [EX], {"threshold": 0.9}, batch_size=1, seed=0)
    assert r["accuracy"] == 0.0 and r["wrong"] == 1
    assert r["first_error_field"] == {"result": 1} and r["first_error_line"] == {"1": 1}
    assert r["first_error_digit"] == {"result digit 2 of 2": 1} and r["first_error_in_reasoning"] == 1.0
    assert r["hazard"]["result"] == {"tokens": 3, "first_errors": 1, "rate": pytest.approx(1 / 3)}
    assert r["result_hazard_by_op"]["*"] == {"tokens": 2, "first_errors": 1, "rate": 0.5}
    assert r["first_wrong_commit_gap"] == {"1": 1}  # index 11: second of the pair (10, 11)
    # the clean commits are the 11 before it (6 pairs but the last cut at the error) and the wrong one itself
    assert r["clean_commits"]["gapped"] == {"n": 6, "error_rate": pytest.approx(1 / 6)}
    assert r["clean_commits"]["in-order"] == {"n": 6, "error_rate": 0.0}


def test_left_to_right_decodes_never_gap():
    ea = _module()
    for family, settings in (("ar", {}), ("setdlm", {"window": 1})):
        r = ea.analyse(_model(family, WRONG), [EX], settings, batch_size=1, seed=0)
        assert r["gapped_commits"] == 0.0 and r["first_wrong_commit_gap"] == {"0": 1}, family
        assert r["clean_commits"]["in-order"] == {"n": 12, "error_rate": pytest.approx(1 / 12)}, family
        assert set(r["query_by_gap"]) == {"0"}, family


def test_the_summary_renders_the_figures():
    ea = _module()
    r = ea.analyse(_model("setdlm", WRONG), [EX], {"threshold": 0.9}, batch_size=1, seed=0)
    md = ea.summary([{"run": "setdlm-smax8", "step": 7, "decode": "w=2, tau 0.9", **r}])
    assert "| setdlm-smax8 | 7 | w=2, tau 0.9 | 0.0% | 2.00 |" in md
    assert "| 100.0% | 1 of 1 |" in md  # first error in a reasoning line; its commit was gapped
    assert "result digit 2 of 2: 1 (of 1)" in md
    assert "| 0.0% (0/1) | — | 50.0% (1/2) | — |" in md  # result digits by operation: "+" right, "*" 1 of 2


def test_main_reads_the_protocol_folders_and_writes_json_and_markdown(tmp_path):
    """Random tiny checkpoints in the protocol's layout (ft-NAME/checkpoints/step-N): the newest SetDLM one
    past --steps is analysed too, and --light keeps w = 1 and w = D."""
    import json

    from setdlm.data.tasks import reasoning_split

    ea = _module()
    texts = [e.prompt + e.completion for e in reasoning_split("validation", 50, level="medium", seed=0)]
    tok = char_tokenizer(texts + ["0123456789+-*/=# \n"])
    for run, family, steps in (("ar", "ar", (10,)), ("setdlm-smax8", "setdlm", (10, 20))):
        for s in steps:
            tiny(family, tok, L=192).save(str(tmp_path / f"ft-{run}" / "checkpoints" / f"step-{s:08d}"))
    out = tmp_path / "ea"
    ea.main(["--root", str(tmp_path), "--n", "3", "--steps", "10", "--batch-size", "2", "--out", str(out)])
    rows = json.loads(out.with_suffix(".json").read_text())["rows"]
    assert [(r["run"], r["step"]) for r in rows] == [("ar", 10)] + [("setdlm-smax8", s)
                                                                   for s in (10, 20) for _ in ea.SETDLM_DECODES]
    assert all(r["n"] == 3 and r["accuracy"] == 0.0 for r in rows)  # random weights solve nothing
    assert "validation split, 3 medium problems" in out.with_suffix(".md").read_text()
    ea.main(["--root", str(tmp_path), "--n", "2", "--steps", "10", "--light", "--out", str(out)])
    rows = json.loads(out.with_suffix(".json").read_text())["rows"]
    assert [(r["step"], r["decode"]) for r in rows] == [(10, "left to right"), (10, "w=1"), (10, "w=4 (D)")]
    with pytest.raises(SystemExit, match="no checkpoint"):
        ea.main(["--root", str(tmp_path / "none"), "--n", "1", "--out", str(out)])
