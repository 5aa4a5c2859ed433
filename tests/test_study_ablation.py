"""The D x size ablation (benchmarks/study/ablation.py): every cell is the protocol's fine-tuning recipe from its
size's base, the curriculum chains its stages, and the table reads the rows it is given."""


from support.study import flags as _flags
from support.study import load


def _ablation():
    return load("ablation")


def test_every_cell_is_the_protocols_recipe_from_its_sizes_base(tmp_path):
    a = _ablation()
    P = a.P
    recipe = {k: v for k, v in _flags(P.finetune_command(tmp_path, "ar")).items() if k not in ("--out", "--family")}
    for size, model in a.cells():
        f = _flags(a.finetune_command(tmp_path, size, model))
        assert f["--init-from"] == str(a.base_of(tmp_path, size))
        assert {k: v for k, v in f.items() if k not in ("--out", "--family", "--D", "--M", "--init-from")} == \
            {k: v for k, v in recipe.items() if k != "--init-from"}
        if model != "ar":
            assert f["--family"] == "setdlm" and int(f["--M"]) == 2 * int(f["--D"]) == 2 * int(model[1:])
    # the protocol's own runs are the 0.8M cells they already are (no second copy trained)
    assert _flags(a.finetune_command(tmp_path, "0.8M", "D4")) == _flags(P.finetune_command(tmp_path, "setdlm-smax8"))
    assert _flags(a.finetune_command(tmp_path, "0.8M", "D8")) == _flags(P.finetune_command(tmp_path, "setdlm-smax16"))
    # the smaller size pretrains its own base with the protocol's base recipe, only narrower
    b, pb = _flags(a.base_command(tmp_path, "0.2M")), _flags(P.base_command(tmp_path))
    assert b["--hidden-size"] == "64" and pb["--hidden-size"] == "128"
    assert {k: v for k, v in b.items() if k not in ("--hidden-size", "--out")} == \
        {k: v for k, v in pb.items() if k not in ("--hidden-size", "--out")}
    assert a.base_of(tmp_path, "0.2M") == tmp_path / "base-ar-d64"
    assert len({a.run_name(s, m) for s, m in a.cells()}) == len(a.cells())  # no two cells share a folder
    # every cell's budget is a checkpoint the run keeps
    assert a.BUDGET % int(recipe["--save-every"]) == 0


def test_the_curriculum_chains_its_stages_with_fresh_data_orders(tmp_path):
    a = _ablation()
    stages = [_flags(c) for c in a.curriculum_commands(tmp_path)]
    assert [s["--D"] for s in stages] == ["1", "2", "4"]
    assert stages[0]["--init-from"] == str(a.base_of(tmp_path, "0.8M"))
    assert [s["--init-from"] for s in stages[1:]] == [s["--out"] for s in stages[:-1]]
    assert sum(int(s["--steps"]) for s in stages) == a.BUDGET
    assert len({s["--seed"] for s in stages}) == 3


def test_table_shares_and_ratio_are_computed_from_the_rows():
    a = _ablation()
    row = lambda model, acc, size="0.8M": {"size": size, "model": model, "params": 812_000, "accuracy": acc,  # noqa
                                           "bound_ppl": 1.1}
    md = a.table([row("ar", 0.8), row("D1", 0.6), row("D4", 0.32), row("D1>D2>D4", 0.45)])
    line = next(x for x in md.splitlines() if x.startswith("| 0.8M"))
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[1] == "80.0% (≤ 1.100)" and cells[2] == "60.0%, 0.75x AR (≤ 1.100)"
    assert cells[3] == "—" and cells[4] == "32.0%, 0.40x AR (≤ 1.100)" and cells[6] == "0.53"
    assert "0.2M" not in md  # a size with no row is left out
    assert "Curriculum D = 1 → 2 → 4" in md and "45.0%" in md and "32.0%" in md
