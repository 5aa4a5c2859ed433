"""The real-model study (benchmarks/study/smollm2_families.py): one recipe for every family from one base, the
bound read from the trainer's last held-out evaluation, and a rerun that skips every point already measured."""

import argparse
import json

from support.study import flags as _flags
from support.study import load


def _study():
    return load("smollm2_families")


def _args(tmp_path, **kw):
    base = dict(model="smollm2-135m", root=str(tmp_path / "runs"), out=str(tmp_path / "out.jsonl"), only=None,
                steps=400, batch_size=32, lr=1e-4, n_test=300, eval_batch=100, device="cpu", base_zero_shot=False,
                deadline=None)
    return argparse.Namespace(**{**base, **kw})


def test_every_family_gets_one_recipe_from_one_base(tmp_path):
    s = _study()
    args = _args(tmp_path)
    family_flags = ("--out", "--family", "--D", "--M", "--block-size")
    recipes = []
    for family in s.FAMILIES:
        f = _flags(s.train_command(args, family))
        assert f["--init-from"] == "smollm2-135m" and f["--out"].endswith(f"ft-{family}")
        recipes.append({k: v for k, v in f.items() if k not in family_flags})
    assert all(r == recipes[0] for r in recipes)
    assert recipes[0]["--steps"] == "400" and recipes[0]["--lr"] == "0.0001" and recipes[0]["--length"] == "96"
    assert _flags(s.train_command(args, "setdlm-smax8"))["--D"] == "4"
    assert _flags(s.train_command(args, "mdlm"))["--block-size"] == str(s.L)


def test_bound_and_speed_come_from_the_last_heldout_evaluation(tmp_path):
    s = _study()
    rows = [{"step": 25, "loss": 1.0, "tokens_per_s": 100.0}, {"step": 50, "split": "heldout", "ppl": 1.5},
            {"step": 75, "loss": 0.5, "tokens_per_s": 300.0}, {"step": 100, "loss": 0.4, "tokens_per_s": 200.0},
            {"step": 100, "split": "heldout", "ppl": 1.2}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert s.last_heldout(tmp_path) == {"bound_ppl": 1.2, "train_tokens_per_s": 200.0}


def test_a_rerun_trains_and_scores_nothing_already_measured(tmp_path):
    s = _study()
    done = [{"run": f, "steps": 400, "setting": "tau-off"} for f in s.FAMILIES]
    done += [{"run": f, "steps": 400, "setting": "tau-0.9"} for f in s.FAMILIES if f != "ar"]
    done += [{"run": "setdlm-smax8", "steps": 900, "setting": "tau-off"}]  # another budget: not this run's
    out = tmp_path / "out.jsonl"
    out.write_text("".join(json.dumps(r) + "\n" for r in done))
    # the base does not exist: training or loading any family would fail
    s.run(_args(tmp_path, model=str(tmp_path / "no-such-model")))
    assert out.read_text().count("\n") == len(done)
    assert not any((tmp_path / "runs").glob("ft-*"))
