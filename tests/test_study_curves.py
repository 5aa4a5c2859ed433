"""The learning-curve report of the paper's protocol (benchmarks/study/learning_curves.py): a synthetic
curves.jsonl -> the table's cells, the SetDLM / AR ratio per budget, the budget at which SetDLM S<=8 reaches
0.85x AR (or its best ratio), the labelled extrapolation, and the PNG."""

import json
import math
from pathlib import Path

import pytest

from support import png_size, study_script

pytest.importorskip("matplotlib")


def _module():
    return study_script("learning_curves")


def _row(run, step, setting, accuracy, **kw):
    return {"run": run, "step": step, "setting": setting, "split": "test", "accuracy": accuracy, **kw}


ROWS = [_row("base-ar", 3000, "tau-off", 0.80, tokens_per_step=1.0, bound_ppl=1.05),
        _row("ar", 100, "tau-off", 0.50, tokens_per_step=1.0, bound_ppl=1.04),
        _row("ar", 200, "tau-off", 0.80, tokens_per_step=1.0, bound_ppl=1.02),
        _row("setdlm-smax8", 100, "tau-off", 0.20, tokens_per_step=1.0, bound_ppl=1.50),
        _row("setdlm-smax8", 100, "tau-0.9", 0.25, tokens_per_step=2.0),
        _row("setdlm-smax8", 200, "tau-off", 0.72, tokens_per_step=1.0, bound_ppl=1.20),
        _row("setdlm-smax8", 200, "tau-0.9", 0.70, tokens_per_step=2.5),
        _row("bd3lm-s4", 200, "tau-off", 0.60, tokens_per_step=1.0, bound_ppl=1.30)]


def _write(path: Path, rows) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_table_ratio_budget_and_png(tmp_path):
    lc = _module()
    curves = _write(tmp_path / "curves.jsonl", ROWS)
    md = lc.write(curves, tmp_path / "out")
    assert "| SetDLM S≤8 (D=4, M=8) | 200 | 72.0% | 70.0% | 2.50 | ≤ 1.200 |" in md
    assert "| SetDLM S≤8 (D=4, M=8) | 100 | 20.0% | 25.0% | 2.00 | ≤ 1.500 |" in md
    assert "| AR | 200 | 80.0% | — (one token a step) | — | 1.020 |" in md  # AR's bound is exact, no "≤"
    assert "| base AR (pretrained 3,000 steps) | 0 | 80.0% |" in md
    assert "| BD3LM S=4 | 200 | 60.0% | — | — | ≤ 1.300 |" in md
    rows = lc.load(curves)
    assert lc.ratios(rows) == pytest.approx({100: 0.4, 200: 0.9})  # 0.20/0.50, 0.72/0.80
    assert "| 0.40x | 0.90x |" in md
    assert lc.reached(rows) == (200, pytest.approx(0.9), 200)
    assert "first reaches 0.85x the AR fine-tune's accuracy at **200 steps**" in md
    assert "BD3LM S=4 there: 60.0%, so SetDLM S≤8 is above it" in md
    assert "*Extrapolation, not a measurement*" in md
    w, h = png_size(tmp_path / "out" / "learning_curves.png")
    assert w > 600 and h > 300
    assert (tmp_path / "out" / "learning_curves.md").read_text() == md


def test_best_ratio_when_the_target_is_never_reached(tmp_path):
    lc = _module()
    rows = [r for r in ROWS if not (r["run"] == "setdlm-smax8" and r["step"] == 200)]
    rows.append(_row("setdlm-smax8", 200, "tau-off", 0.48, bound_ppl=1.3))  # 0.60x
    md = lc.write(_write(tmp_path / "curves.jsonl", rows), tmp_path)
    assert lc.reached(lc.load(tmp_path / "curves.jsonl")) == (None, pytest.approx(0.6), 200)
    assert "does not reach 0.85x the AR fine-tune's accuracy at any measured budget; the best ratio is **0.60x** " \
           "at 200 steps (48.0% vs 80.0%)" in md


def test_logit_fit_recovers_a_line_and_inverts_it(tmp_path):
    lc = _module()
    a, b = -4.0, 0.8  # logit(acc) = a + b ln(steps)
    rows = [_row("setdlm-smax8", s, "tau-off", 1 / (1 + math.exp(-(a + b * math.log(s))))) for s in (100, 400, 1600)]
    f = lc.fit(lc.load(_write(tmp_path / "c.jsonl", rows)), "setdlm-smax8")
    assert (f.a, f.b, f.points) == (pytest.approx(a), pytest.approx(b), 3)
    assert f.steps_to(f.accuracy(5000.0)) == pytest.approx(5000.0)
    assert lc.LogitFit(a=0.0, b=-0.1, points=2).steps_to(0.9) is None  # a falling line never gets there
    assert lc.fit(lc.load(_write(tmp_path / "one.jsonl", rows[:1])), "setdlm-smax8") is None


def test_a_row_without_its_accuracy_is_named(tmp_path):
    lc = _module()
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"run": "ar", "step": 1, "setting": "tau-off"}) + "\n")
    with pytest.raises(ValueError, match=r"bad.jsonl:1: a curves row needs 'accuracy'"):
        lc.load(bad)
