"""The parallel-dependency study (benchmarks/study/parallel_suite.py): one recipe for the three families, and
a bench over exactly those runs with the documented sweep."""

from support.study import flags, load


def test_one_recipe_for_every_family_and_the_bench_reads_those_runs(tmp_path):
    s = load("parallel_suite")
    family = ("--out", "--family", "--D", "--M", "--block-size")
    recipes = [{k: v for k, v in flags(s.train_command(tmp_path, n)).items() if k not in family} for n in s.RUNS]
    assert all(r == recipes[0] for r in recipes) and recipes[0]["--data"] == "parallel"
    assert recipes[0]["--steps"] == str(s.STEPS) and recipes[0]["--n-layers"] == "4"
    cmd = s.bench_command(tmp_path, tmp_path / "out")
    assert cmd[2:5] == [str(tmp_path / n) for n in s.RUNS]
    b = flags(cmd)
    assert b["--task"] == "parallel" and b["--thresholds"] == "off,0.9,0.7,0.5,0.3" and b["--out"] == str(tmp_path / "out")
