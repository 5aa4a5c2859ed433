"""The paper's protocol at our scale (benchmarks/study/protocol.py): one recipe for every fine-tuned family,
each initialised from the same AR base, and a learning curve that reads the checkpoints of one run."""


from support.study import flags as _flags
from support.study import load


def _protocol():
    return load("protocol")


def test_every_family_is_fine_tuned_from_the_one_base_with_one_recipe(tmp_path):
    p = _protocol()
    base = _flags(p.base_command(tmp_path))
    assert base["--family"] == "ar" and base["--out"] == str(tmp_path / "base-ar")
    assert base["--data"].endswith("arith_all_train.jsonl")
    recipes = []
    for family, fam_flags in p.FAMILIES.items():
        f = _flags(p.finetune_command(tmp_path, family))
        assert f["--init-from"] == str(p.base_of(tmp_path)) and f["--out"] == str(tmp_path / f"ft-{family}")
        assert f["--data"].endswith("reason_medium_train.jsonl")
        recipe = {k: v for k, v in f.items() if k not in ("--out", *fam_flags[::2])}
        recipes.append(recipe)
    assert p.base_of(tmp_path) == p.RESULTS / "base-ar"  # no run here: the committed base weights
    (tmp_path / "base-ar").mkdir()
    assert p.base_of(tmp_path) == tmp_path / "base-ar"  # this machine's own base run comes first
    assert all(r == recipes[0] for r in recipes)  # same data, steps, batch, lr schedule and seed
    r = recipes[0]
    assert r["--lr-schedule"] == "constant" and int(r["--steps"]) == max(p.BUDGETS) == p.FT_STEPS
    # every budget of the curve is a checkpoint the run keeps
    every, keep = int(r["--save-every"]), int(r["--keep"])
    assert all(b % every == 0 for b in p.BUDGETS) and keep >= p.FT_STEPS // every
