"""The parallel-dependency suite (copy, reverse, sort, a 4x4 Latin square): generated offline with fixed
splits, scored exactly (any valid Latin square with the given first row counts), decoded through the real
decoders by ``parallel`` and swept by ``setdlm bench --task parallel`` (τ, windows, BD3LM block
sizes, TPF and AUP); ``setdlm train --data parallel-...`` trains on it."""

import json

import pytest
import torch

import setdlm
from setdlm import evaluation
from setdlm.evaluation import passes, throughput
from setdlm.evaluation.parallel import parallel
from setdlm.data import read_source
from setdlm.data.parallel import PARALLEL_TASKS, ParallelExample, _latin_squares, parallel_split
from setdlm.data.prompt import encode_prompt
from setdlm.data.tasks import split_of
from setdlm.evaluation.passes import EvalRun

from support import assert_one_line_error, run, scripted, task_tokenizer, tiny

TOK = task_tokenizer()


def test_examples_answers_and_splits():
    ex = parallel_split("test", 40, seed=3)
    assert [e.task for e in ex[:8]] == list(PARALLEL_TASKS) * 2  # the tasks in turn
    assert ex == parallel_split("test", 40, seed=3) and ex[:9] == parallel_split("test", 9, seed=3)  # a prefix
    assert ex != parallel_split("test", 40, seed=4)
    train = parallel_split("train", 400)
    assert all(split_of(e.question) == "test" for e in ex) and all(split_of(e.question) == "train" for e in train)
    assert not {e.prompt for e in ex} & {e.prompt for e in train} and len({e.prompt for e in train}) == 400
    for e in ex + train:
        items = list(e.items)
        assert e.prompt == f"{e.task}: {' '.join(items)}\n" and e.correct(e.completion)
        if e.task == "latin":
            rows = [r.split(" ") for r in e.completion.split("\n")]
            assert rows[0] == items and len(set(items)) == 4
            assert all(sorted(r) == sorted(items) for r in rows)
            assert all(sorted(r[c] for r in rows) == sorted(items) for c in range(4))
        else:
            assert 4 <= len(items) <= 8 and all(i.isdigit() for i in items)
            want = {"copy": items, "reverse": items[::-1], "sort": sorted(items)}[e.task]
            assert e.completion == " ".join(want)
    # training completions of latin are spread over the 24 valid squares of a first row
    assert len(_latin_squares()) == 24
    shapes = {tuple(e.completion.split("\n")[1]) for e in train if e.task == "latin"}
    assert len(shapes) > 20
    with pytest.raises(ValueError, match="tasks must be distinct members"):
        parallel_split("test", 2, tasks=("copy", "shuffle"))
    with pytest.raises(ValueError, match="unknown split"):
        parallel_split("dev", 2)


def test_exact_scoring():
    sort = ParallelExample("sort", ("3", "1", "2", "1"), "1 1 2 3")
    assert sort.correct("1 1 2 3") and sort.correct(" 1 1 2 3\n")
    assert not sort.correct("1 2 3") and not sort.correct("1 1 3 2") and not sort.correct("1 1 2 3 3")
    sq = ParallelExample("latin", ("B", "D", "A", "C"), "B D A C\nA C B D\nC A D B\nD B C A")
    assert sq.correct("B D A C\nD B C A\nC A D B\nA C B D")  # another of the 24: right too
    assert not sq.correct("B D A C\nA C B D\nD B C A\nC A B D")  # a column repeats
    assert not sq.correct("D B C A\nA C B D\nC A D B\nB D A C")  # a Latin square, but not the given first row
    assert not sq.correct("B D A C\nA C B D\nC A D B")  # three rows
    assert not sq.correct("BDAC\nACBD\nCADB\nDBCA")  # not the layout
    assert not sq.correct("B D A C\nA C B E\nC A D B\nD B C A")  # a foreign symbol


@pytest.mark.parametrize("family, threshold", [("ar", None), ("setdlm", None), ("setdlm", 0.5), ("bd3lm", 0.5)])
def test_evaluate_parallel_scores_what_the_decoder_writes(family, threshold):
    """A backbone scripted to write one example's answer: that example is right, the other (a longer
    prompt, so it reads the script past its end) wrong; with τ the confident script commits several tokens
    per forward (TPF > 1) and stays right."""
    sq = ParallelExample("latin", ("B", "D", "A", "C"), "B D A C\nA C B D\nC A D B\nD B C A")
    other = "B D A C\nD B C A\nC A D B\nA C B D"  # a different valid square: the decoder writes this one
    copy = ParallelExample("copy", ("1", "2", "3", "4", "5", "6", "7", "8"), "1 2 3 4 5 6 7 8")
    script = encode_prompt(TOK, sq.prompt) + TOK.encode(other) + [TOK.eos_token_id]
    model = scripted(tiny(family, TOK), script, TOK.eos_token_id)
    res = parallel(model, [sq, copy], threshold=threshold, run=EvalRun(batch_size=1, progress=False))
    assert res.predictions[0] == other and (res.correct, res.accuracy) == (1, 0.5)
    assert res.per_task == {"copy": 0.0, "latin": 1.0}
    assert res.to_dict()["per_task"] == res.per_task and res.to_dict()["accuracy"] == 0.5
    assert (res.run.tokens_per_step > 1.5) == (threshold is not None)
    stats = throughput.throughput(model, [sq, copy], threshold=threshold,
                                  run=EvalRun(warmup=1, progress=False))  # times copy
    alone = parallel(model, [copy], threshold=threshold, run=EvalRun(progress=False))
    assert stats.calls == 1 and stats.tokens == alone.run.generated_tokens
    with pytest.raises(ValueError, match="expected ParallelExample examples"):
        parallel(model, [object()], run=EvalRun(progress=False))


def test_builtin_sources_train_on_the_train_split(tmp_path, capsys):
    corpus = read_source("parallel-latin")
    assert corpus.name == "parallel-latin" and len(corpus) == 60_000
    assert corpus.pairs[:50] == [(e.prompt, e.completion) for e in parallel_split("train", 50, tasks="latin")]
    assert all(split_of(p[:-1]) == "train" for p, _ in corpus.pairs[::997])
    out = tmp_path / "run"
    code, _, err = run(["train", "--out", str(out), "--data", "parallel-sort", "--family", "setdlm", "--D", "2",
                        "--length", "64", "--steps", "2", "--eval-max", "8"], capsys)
    assert code == 0, err
    model = setdlm.load(out)
    ex = parallel_split("test", 4, tasks="sort")
    assert all(passes.fits(model, e) for e in ex)
    assert model.tokenizer.decode(model.tokenizer.encode(ex[0].prompt + ex[0].completion)) == ex[0].prompt + ex[0].completion


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    root = tmp_path_factory.mktemp("parallel")
    for family in ("setdlm", "bd3lm"):
        tiny(family, TOK, dtype=torch.float32).save(root / f"{family}-rand")
    return {f: str(root / f"{f}-rand") for f in ("setdlm", "bd3lm")}


def test_bench_and_eval_parallel(ckpts, tmp_path, capsys):
    out = tmp_path / "b"
    code, stdout, err = run(["bench", ckpts["setdlm"], ckpts["bd3lm"], "--task", "parallel", "--n", "8",
                             "--warmup", "2", "--thresholds", "off,0.5", "--windows", "D,1", "--block-sizes", "D,8",
                             "--max-new-tokens", "12", "--clock", "cpu", "--out", str(out)], capsys)
    assert code == 0, err
    lines = stdout.split("\n\n")[0].splitlines()
    assert lines[0] == ("| model | family | τ | w | block | batch | accuracy (%) | copy (%) | reverse (%) | sort (%) | "
                        "latin (%) | tokens/CPU-s | NFE | TPF | forwards/token |")
    assert len(lines) == 2 + 4 + 4  # SetDLM: 2 τ × w 2, 1; BD3LM: 2 τ × S 4, 8
    assert sum(line.startswith("| bd3lm-rand | bd3lm | 0.5 | – | 8 | 1 |") for line in lines) == 1
    doc = json.loads((out / "bench.json").read_text())
    assert doc["task"] == "parallel" and doc["data"] == "generated:parallel" and doc["block_sizes"] == [None, 8]
    examples = parallel_split("test", 8)
    model = setdlm.load(ckpts["bd3lm"])
    ref = parallel(model, examples, threshold=0.5, block_size=8, max_new_tokens=12, run=EvalRun(progress=False))
    (p,) = [p for p in doc["points"] if p["family"] == "bd3lm" and p["threshold"] == 0.5 and p["block_size"] == 8]
    assert p["result"]["per_task"] == ref.per_task and p["tokens_per_step"] == ref.run.tokens_per_step
    assert {(a["model"], a["window"], a["block_size"]) for a in doc["aup"]} == {
        ("setdlm-rand", 2, None), ("setdlm-rand", 1, None), ("bd3lm-rand", None, 4), ("bd3lm-rand", None, 8)}

    preds = tmp_path / "p.jsonl"
    code, stdout, err = run(["eval", ckpts["bd3lm"], "--task", "parallel", "--n", "8", "--threshold", "0.5",
                             "--block-size", "8", "--max-new-tokens", "12", "--predictions", str(preds)], capsys)
    assert code == 0, err
    got = json.loads(stdout)
    assert got["task"] == "parallel" and got["accuracy"] == ref.accuracy and got["per_task"] == ref.per_task
    assert got["decode"] == {"threshold": 0.5, "block_size": 8, "max_new_tokens": 12}
    rows = [json.loads(r) for r in preds.read_text().splitlines()]
    assert [r["task"] for r in rows] == [e.task for e in examples]
    assert [r["prediction"] for r in rows] == list(ref.predictions)
    assert [r["correct"] for r in rows] == [e.correct(q) for e, q in zip(examples, ref.predictions)]


@pytest.mark.parametrize("args, needles", [
    (["--task", "parallel", "--hidden", "1"], ["--hidden applies to --task infill, not parallel"]),
    (["--task", "parallel", "--window", "2"], ["window applies to setdlm"]),
])
def test_bad_parallel_arguments(args, needles, ckpts, capsys):
    code, _, err = run(["eval", ckpts["bd3lm"], *args], capsys)
    assert_one_line_error(code, err, *needles)


def test_parallel_data_is_refused_before_any_loading(tmp_path):
    for call in (lambda: evaluation.bench_checkpoints(["no-such-checkpoint"], "parallel", tmp_path / "x", data="f.jsonl"),
                 lambda: evaluation.evaluate_checkpoint("no-such-checkpoint", "parallel", data="f.jsonl")):
        with pytest.raises(ValueError, match="data does not apply to task parallel"):
            call()
    assert not (tmp_path / "x").exists()
