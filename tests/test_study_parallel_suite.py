"""The parallel-dependency study (benchmarks/study/parallel_suite.py): one recipe for the three families from
scratch, one for the fine-tunes from the AR run, and benches over exactly those runs with the documented sweep."""

from support.study import flags, load

FAMILY = ("--out", "--family", "--D", "--M", "--block-size")


def test_one_recipe_per_stage_and_the_benches_read_those_runs(tmp_path):
    s = load("parallel_suite")
    scratch = [{k: v for k, v in flags(s.train_command(tmp_path, n)).items() if k not in FAMILY} for n in s.RUNS]
    assert all(r == scratch[0] for r in scratch) and scratch[0]["--data"] == "parallel"
    assert scratch[0]["--steps"] == str(s.STEPS) and scratch[0]["--n-layers"] == "4" and "--init-from" not in scratch[0]
    ft = [{k: v for k, v in flags(s.train_command(tmp_path, n)).items() if k not in FAMILY} for n in s.FINETUNED]
    assert all(r == ft[0] for r in ft) and ft[0]["--init-from"] == str(tmp_path / "ar")
    assert ft[0]["--steps"] == str(s.FT_STEPS) and "--n-layers" not in ft[0]  # the architecture is the AR run's
    assert flags(s.train_command(tmp_path, "ft-bd3lm-s4"))["--block-size"] == "4"
    assert flags(s.train_command(tmp_path, "ft-setdlm-d4"))["--D"] == "4"
    for which, names in s.BENCHES.items():
        cmd = s.bench_command(tmp_path, names, tmp_path / which)
        assert cmd[2:2 + len(names)] == [str(tmp_path / n) for n in names]
        b = flags(cmd)
        assert b["--task"] == "parallel" and b["--thresholds"] == "off,0.9,0.7,0.5,0.3" and b["--out"] == str(tmp_path / which)
    assert s.BENCHES["finetuned"][0] == "ar" and set(s.BENCHES["scratch"]) == set(s.RUNS)
