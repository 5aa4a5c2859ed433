"""`setdlm bench` and the task modes of `setdlm eval`: sweeps over decoding settings produce the Markdown
table, the JSON of raw numbers and a PNG that opens; the CLI reports what the library functions give;
bad arguments are one-line errors (exit 2). Also the built-in reasoning sources and Shakespeare infilling."""

import json

import pytest
import torch

import setdlm
import setdlm.cli
from setdlm import evaluation
from setdlm.evaluation import metrics, passes, reports, sweeps, throughput
from setdlm.evaluation.infill import infill
from setdlm.evaluation.reasoning import reasoning
from setdlm.evaluation import TaskSpec
from setdlm.data import read_source, shakespeare_works
from setdlm.data.sources import infill_from_source
from setdlm.data.tasks import infill_examples, reasoning_split, split_of
from setdlm.decoding import DecodeSettings
from setdlm.errors import UserError
from setdlm.evaluation.sweeps import BenchSpec
from setdlm.evaluation.passes import EvalRun

from support import assert_one_line_error, png_size, run, task_tokenizer, tiny

TOK = task_tokenizer()


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    """Two tiny checkpoints: an AR model trained for a few steps on the built-in `reasoning-easy` source (through
    the CLI), and a random SetDLM model with its tokenizer saved with `checkpoint.save`."""
    root = tmp_path_factory.mktemp("bench")
    code = setdlm.cli.main(["train", "--out", str(root / "ar-run"), "--data", "reasoning-easy", "--family", "ar",
                            "--length", "128", "--steps", "3", "--eval-max", "16", "--log-every", "1"])
    assert code == 0
    tok = setdlm.load(root / "ar-run").tokenizer
    m = tiny("setdlm", tok, dtype=__import__("torch").float32)
    m.save(root / "setdlm-rand")
    text = root / "story.txt"  # short sentences, so that 5-sentence windows fit L = 128
    words = ["cat", "dog", "owl", "fox", "bee", "elk", "ant", "yak"]
    text.write_text("\n\n".join(" ".join(f"The {words[(i + j) % 8]} saw {j} {words[(i * j) % 8]}s." for j in range(5))
                                for i in range(60)), encoding="utf-8")
    return {"ar": str(root / "ar-run"), "setdlm": str(root / "setdlm-rand"), "text": str(text), "root": root}


def test_bench_two_checkpoints_writes_table_json_and_png(ckpts, tmp_path, capsys):
    out = tmp_path / "b"
    code, stdout, err = run(["bench", ckpts["ar"], ckpts["setdlm"], "--task", "reasoning", "--level", "easy",
                             "--n", "6", "--warmup", "2", "--thresholds", "off,0.9", "--windows", "D,4",
                             "--batch-sizes", "1,3", "--max-new-tokens", "16", "--out", str(out)], capsys)
    assert code == 0, err
    # AR: τ and w do not apply (one setting per batch size); SetDLM: 2 τ × 2 w × 2 batch sizes
    lines, aup_lines = stdout.split("\n\n")[0].splitlines(), stdout.split("\n\n")[2].splitlines()
    assert lines[0] == "| model | family | τ | w | block | batch | accuracy (%) | tokens/s | NFE | TPF | forwards/token |"
    assert len(lines) == 2 + 2 + 8
    assert sum(line.startswith("| ar-run | ar | off | – | – |") for line in lines) == 2
    assert sum(line.startswith("| setdlm-rand | setdlm |") for line in lines) == 8
    # one AUP per curve over τ: AR at batch 1 and 3, SetDLM at w 2 and 4 and batch 1 and 3
    assert aup_lines[0] == "| model | family | w | block | batch | AUP | points counted | max TPF counted |"
    assert len(aup_lines) == 2 + 2 + 4
    assert (out / "bench.md").read_text() == stdout
    doc = json.loads((out / "bench.json").read_text())
    assert doc["task"] == "reasoning" and doc["examples"] == 6 and doc["warmup"] == 2
    assert doc["checkpoints"] == {"ar-run": ckpts["ar"], "setdlm-rand": ckpts["setdlm"]}
    pts = doc["points"]
    assert len(pts) == 10 and {p["window"] for p in pts if p["family"] == "setdlm"} == {2, 4}
    for p in pts:
        assert 0 <= p["quality"] <= 1 and p["tokens_per_second"] > 0 and p["nfe"] >= 1
        assert p["quality"] == p["result"]["accuracy"] and p["nfe"] == p["result"]["nfe_per_example"]
        if p["batch_size"] == 1:
            assert p["tokens_per_second"] == p["result"]["speed"]["mean"] and p["result"]["speed"]["calls"] == 4
        else:
            assert p["tokens_per_second"] == p["result"]["speed"]["aggregate"] and p["tokens_per_second_std"] is None
    for a in doc["aup"]:  # AR commits one token per forward: its AUP is its accuracy in %
        curve = [p for p in pts if (p["model"], p["window"], p["batch_size"]) == (a["model"], a["window"],
                                                                                   a["batch_size"])]
        assert a["points"] == len(curve) == (1 if a["family"] == "ar" else 2)
        if a["family"] == "ar":
            assert a["aup"] == pytest.approx(100 * curve[0]["quality"]) and a["max_tpf"] == 1.0
        assert a["y_max"] == 100 * max(p["quality"] for p in pts)
    assert png_size(out / "bench.png") == (1200, 450)  # quality vs tokens/s, and vs TPF
    again = reports.read_json(out / "bench.json")  # the points read back plot and tabulate the same
    assert reports.markdown_table(again) == stdout
    assert png_size(reports.plot(again, tmp_path / "again.png", dpi=50)) == (600, 225)
    older = dict(doc, points=[{k: v for k, v in p.items() if k != "block_size"} for p in pts])  # before block sizes
    (tmp_path / "older.json").write_text(json.dumps(older))
    assert [p.setting for p in reports.read_json(tmp_path / "older.json")] == [p.setting for p in again]


def test_bench_runs_each_checkpoint_in_each_precision_side_by_side(ckpts, tmp_path, capsys):
    """``bench --dtype float32,bfloat16``: every checkpoint in each precision is a curve of its own (``NAME
    bfloat16``), timed in the same sweep; bench.json names each curve's precision and checkpoint, and each point
    answers as the library does on the model loaded in that precision."""
    out = tmp_path / "b"
    code, stdout, err = run(["bench", ckpts["ar"], ckpts["setdlm"], "--task", "reasoning", "--level", "easy",
                             "--n", "4", "--warmup", "1", "--thresholds", "off", "--max-new-tokens", "8",
                             "--dtype", "float32,bfloat16", "--out", str(out)], capsys)
    assert code == 0, err
    doc = json.loads((out / "bench.json").read_text())
    assert doc["dtypes"] == {"ar-run float32": "float32", "setdlm-rand float32": "float32",
                             "ar-run bfloat16": "bfloat16", "setdlm-rand bfloat16": "bfloat16"}
    assert doc["checkpoints"]["ar-run bfloat16"] == ckpts["ar"] == doc["checkpoints"]["ar-run float32"]
    assert [p["model"] for p in doc["points"]] == list(doc["dtypes"])
    examples, _ = evaluation.task_examples(TaskSpec("reasoning", level="easy", n=4), [setdlm.load(ckpts["ar"])])
    for p in doc["points"]:
        name, dtype = p["model"].rsplit(" ", 1)
        model = setdlm.load(ckpts["ar" if name == "ar-run" else "setdlm"], dtype=dtype)
        want = reasoning(model, examples, max_new_tokens=8, run=EvalRun(progress=False))
        assert p["result"]["correct"] == want.to_dict()["correct"] and p["nfe"] == want.to_dict()["nfe_per_example"]
    assert "| ar-run bfloat16 | ar |" in stdout


def test_bench_points_match_the_library(ckpts):
    """One sweep point = reasoning at that setting (the deterministic numbers)."""
    models = [("setdlm", setdlm.load(ckpts["setdlm"]))]
    examples, skipped = evaluation.task_examples(TaskSpec("reasoning", level="easy", n=4), [m for _, m in models])
    assert skipped == 0 and examples == reasoning_split("test", 4, level="easy")
    pts = sweeps.sweep(models, "reasoning", examples,
                       bench=BenchSpec(thresholds=[0.5], batch_sizes=[2], warmup=2, progress=False), max_new_tokens=8)
    ref = reasoning(models[0][1], examples, run=EvalRun(batch_size=2, warmup=1, progress=False), threshold=0.5,
                    max_new_tokens=8)
    (p,) = pts
    assert p.setting == sweeps.Setting(threshold=0.5, window=2, batch_size=2)
    assert (p.quality, p.nfe, p.tokens_per_step) == (ref.accuracy, ref.run.nfe_per_example, ref.run.tokens_per_step)
    assert p.result["speed"]["warmup"] == 1  # 2 warm-up examples = 1 call of 2


def test_settings_pareto_and_table():
    tok = TOK
    ar, sd, bd = tiny("ar", tok), tiny("setdlm", tok), tiny("bd3lm", tok)
    assert sweeps.sweep_settings(ar, sweeps.THRESHOLDS, [None, 3], [1, 4]) == [sweeps.Setting(None, None, 1),
                                                                            sweeps.Setting(None, None, 4)]
    assert len(sweeps.sweep_settings(bd, sweeps.THRESHOLDS)) == 10
    assert sweeps.sweep_settings(sd, [None, 0.9], [None, 2]) == [sweeps.Setting(None, 2), sweeps.Setting(0.9, 2)]  # D = 2
    with pytest.raises(ValueError, match=r"thresholds must lie in \(0, 1\]"):
        sweeps.sweep_settings(sd, [1.5])
    with pytest.raises(ValueError, match="windows must be positive integers"):
        sweeps.sweep_settings(sd, [None], [0])
    # block sizes apply to BD3LM (None = its own S = 4) and nowhere else
    assert sweeps.sweep_settings(bd, [None, 0.9], block_sizes=[None, 8]) == [
        sweeps.Setting(None, None, 1, 4), sweeps.Setting(0.9, None, 1, 4), sweeps.Setting(None, None, 1, 8),
        sweeps.Setting(0.9, None, 1, 8)]
    assert sweeps.sweep_settings(sd, [None], block_sizes=[None, 8]) == [sweeps.Setting(None, 2)]
    assert sweeps.Setting(0.9, None, 1, 8).apply(DecodeSettings()) == DecodeSettings(threshold=0.9, block_size=8)
    with pytest.raises(ValueError, match="block sizes must be positive integers"):
        sweeps.sweep_settings(bd, [None], block_sizes=[0])

    def pt(q, v):
        return sweeps.BenchPoint("m", "setdlm", "reasoning", sweeps.Setting(), q, v, None, 1.0, 1.0, {})
    pts = [pt(0.5, 10.0), pt(0.6, 5.0), pt(0.4, 8.0), pt(0.2, 20.0), pt(0.6, 4.0)]
    assert [(p.quality, p.tokens_per_second) for p in sweeps.pareto_front(pts)] == [(0.2, 20.0), (0.5, 10.0), (0.6, 5.0)]
    table = reports.markdown_table(pts)
    assert "| m | setdlm | off | – | – | 1 | 50.0 | 10.0 | 1.0 | 1.00 |" in table
    # all five points at TPF 1: the least parallel one is the most accurate (equal ρ: higher y first), the
    # others are more than 5 points below it and do not count: AUP = 1 × 60
    assert table.count("\n") == 7 + 6 and table.endswith("| m | setdlm | – | – | 1 | 60.0 | 2 of 5 | 1.00 |\n")


def test_bench_infill_and_likelihood(ckpts, tmp_path, capsys):
    out = tmp_path / "i"
    code, stdout, err = run(["bench", ckpts["ar"], ckpts["setdlm"], "--task", "infill", "--data", ckpts["text"],
                             "--split", "train", "--n", "4", "--warmup", "1", "--thresholds", "off,0.5",
                             "--clock", "cpu", "--out", str(out)], capsys)
    assert code == 0, err
    doc = json.loads((out / "bench.json").read_text())
    assert len(doc["points"]) == 3 and all(0 <= p["quality"] <= 1 for p in doc["points"])
    assert doc["decode"]["clock"] == "cpu" and all(p["result"]["clock"] == "cpu" for p in doc["points"])
    assert "| tokens/CPU-s |" in stdout.splitlines()[0]
    assert all(p["quality"] == p["result"]["rougeL"] for p in doc["points"])
    assert "ROUGE-L (×100)" in stdout and png_size(out / "bench.png") == (1200, 450)
    out = tmp_path / "l"
    code, stdout, err = run(["bench", ckpts["ar"], ckpts["setdlm"], "--task", "likelihood", "--data", ckpts["text"],
                             "--out", str(out)], capsys)
    assert code == 0, err
    doc = json.loads((out / "bench.json").read_text())
    assert [p["model"] for p in doc["points"]] == ["ar-run", "setdlm-rand"]
    ref = run(["eval", ckpts["setdlm"], "--data", ckpts["text"]], capsys)
    assert doc["points"][1]["quality"] == json.loads(ref[1])["nelbo"]
    assert "nats/token" in stdout and png_size(out / "bench.png") == (700, 450)


def test_python_entry_points_are_what_the_cli_runs(ckpts, tmp_path, capsys):
    """``setdlm eval``/``bench`` only parse and print: evaluation.evaluate_checkpoint and bench_checkpoints give
    the same numbers from Python, and check their arguments themselves (ValueError before any loading)."""
    code, stdout, err = run(["eval", ckpts["ar"], "--data", ckpts["text"], "--seed", "3"], capsys)
    assert code == 0, err
    got = evaluation.evaluate_checkpoint(ckpts["ar"], data=ckpts["text"], seed=3)
    assert got == json.loads(stdout) and got["task"] == "likelihood" and got["nelbo"] > 0
    held = evaluation.evaluate_checkpoint(ckpts["ar"])  # the run's own held-out rows, seed and batch size
    assert held["tokens"] == 278 and held["nelbo"] != got["nelbo"]
    res = evaluation.evaluate_checkpoint(ckpts["setdlm"], "reasoning", level="easy", n=3, max_new_tokens=8, threshold=0.5)
    ref = reasoning(setdlm.load(ckpts["setdlm"]), reasoning_split("test", 3, level="easy"),
                             threshold=0.5, max_new_tokens=8, run=EvalRun(progress=False))
    assert res["accuracy"] == ref.accuracy and res["decode"] == {"threshold": 0.5, "max_new_tokens": 8}
    assert {k: res[k] for k in DETERMINISTIC} == {k: ref.to_dict()[k] for k in DETERMINISTIC}
    made = evaluation.bench_checkpoints([ckpts["ar"], ckpts["setdlm"]], "likelihood", tmp_path / "l", data=ckpts["text"],
                                   seed=3)
    assert made.points[0].quality == got["nelbo"] and [p.model for p in made.points] == ["ar-run", "setdlm-rand"]
    assert made.files[0].read_text() == made.table and all(f.exists() for f in made.files)
    for call, needle in [(lambda: evaluation.evaluate_checkpoint(ckpts["ar"], "bogus"), "unknown task 'bogus'"),
                         (lambda: evaluation.evaluate_checkpoint(ckpts["ar"], "reasoning", window=2),
                          "window applies to setdlm models, not to this 'ar' model"),
                         (lambda: evaluation.bench_checkpoints([ckpts["ar"]], "likelihood", tmp_path / "x",
                                                               bench=BenchSpec(warmup=1)),
                          "apply to the decoding tasks")]:
        with pytest.raises(ValueError, match=needle):
            call()
    assert not (tmp_path / "x").exists()
    assert evaluation.labels(["a/run", "b/run", "c/run/checkpoints/step-1"]) == ["run#1", "run#2", "run#3"]


def test_one_settings_object_through_evaluate_and_bench(ckpts, tmp_path):
    """reasoning / infill / throughput, sweeps.sweep, evaluate_checkpoint and bench_checkpoints take one
    DecodeSettings (or its fields as keywords, not both); the budget and the swept fields come from it."""
    model = setdlm.load(ckpts["setdlm"])
    examples = reasoning_split("test", 3, level="easy")
    s = DecodeSettings(threshold=0.5, max_new_tokens=7, cache_order="reveal")
    a = reasoning(model, examples, s, run=EvalRun(batch_size=1, seed=1, progress=False))
    b = reasoning(model, examples, threshold=0.5, max_new_tokens=7, cache_order="reveal",
                  run=EvalRun(batch_size=1, seed=1, progress=False))
    assert a.max_new_tokens == 7 and a.predictions == b.predictions and a.run.nfe == b.run.nfe
    longest = max(len(passes.prompt_ids(model, e)) for e in examples)
    assert reasoning(model, examples, run=EvalRun(progress=False)).max_new_tokens == model.family.length - longest
    with pytest.raises(ValueError, match="give settings= or the keyword settings"):
        reasoning(model, examples, s, threshold=0.9, run=EvalRun(progress=False))
    stories = infill_from_source(ckpts["text"], "train", 2, sentences=5, hidden=1)
    with pytest.raises(ValueError, match="max_new_tokens applies to generate only"):
        infill(model, stories, DecodeSettings(max_new_tokens=4), run=EvalRun(progress=False))
    stats = throughput.throughput(model, examples, DecodeSettings(max_new_tokens=5, ignore_eos=True),
                                  run=EvalRun(warmup=1, progress=False))
    assert stats.tokens == 2 * 5  # two timed calls of one example, 5 tokens each

    pts = sweeps.sweep([("m", model)], "reasoning", examples, DecodeSettings(max_new_tokens=7, cache_order="reveal"),
                      bench=BenchSpec(thresholds=[0.5], warmup=1, progress=False), seed=1)
    (p,) = pts
    assert p.result["max_new_tokens"] == 7 and {k: p.result[k] for k in DETERMINISTIC} == {
        k: a.to_dict()[k] for k in DETERMINISTIC}
    with pytest.raises(ValueError, match=r"the sweep sets threshold: give it as thresholds=\[...\]"):
        sweeps.sweep([("m", model)], "reasoning", examples, s, bench=BenchSpec(thresholds=[0.5], progress=False))
    res = evaluation.evaluate_checkpoint(ckpts["setdlm"], "reasoning", DecodeSettings(threshold=0.5, max_new_tokens=7),
                                    level="easy", n=3)
    kw = evaluation.evaluate_checkpoint(ckpts["setdlm"], "reasoning", level="easy", n=3, threshold=0.5, max_new_tokens=7)
    untimed = [k for k in res if k not in ("seconds", "speed")]
    assert {k: res[k] for k in untimed} == {k: kw[k] for k in untimed} and set(res) == set(kw)
    assert res["decode"] == {"threshold": 0.5, "max_new_tokens": 7}
    with pytest.raises(ValueError, match="temperature applies to task reasoning/infill/parallel, not likelihood"):
        evaluation.bench_checkpoints([ckpts["ar"]], "likelihood", tmp_path / "x", DecodeSettings(temperature=0.5))
    with pytest.raises(ValueError, match="the sweep sets window"):  # before any model is loaded
        evaluation.bench_checkpoints(["no-such-checkpoint"], "reasoning", tmp_path / "x", window=2)
    assert not (tmp_path / "x").exists()


# ---------------------------------------------------------------------------------------------------------
# setdlm eval --task reasoning / infill
# ---------------------------------------------------------------------------------------------------------

DETERMINISTIC = ("nfe", "nfe_per_example", "tokens_per_step", "generated_tokens", "n", "batch_size")


def test_eval_reasoning_matches_the_library(ckpts, tmp_path, capsys):
    preds = tmp_path / "p.jsonl"
    code, stdout, err = run(["eval", ckpts["setdlm"], "--task", "reasoning", "--level", "easy", "--n", "5",
                             "--batch-size", "2", "--threshold", "0.5", "--max-new-tokens", "12",
                             "--predictions", str(preds), "--output", str(tmp_path / "r.json")], capsys)
    assert code == 0, err
    got = json.loads(stdout)
    assert got == json.loads((tmp_path / "r.json").read_text())
    model = setdlm.load(ckpts["setdlm"])
    examples = reasoning_split("test", 5, level="easy", seed=0)
    ref = reasoning(model, examples, run=EvalRun(batch_size=2, progress=False), threshold=0.5, max_new_tokens=12)
    assert got["task"] == "reasoning" and got["data"] == "generated:easy" and got["split"] == "test"
    assert (got["accuracy"], got["correct"], got["max_new_tokens"]) == (ref.accuracy, ref.correct, 12)
    assert {k: got[k] for k in DETERMINISTIC} == {k: ref.to_dict()[k] for k in DETERMINISTIC}
    rows = [json.loads(r) for r in preds.read_text().splitlines()]
    assert [r["prediction"] for r in rows] == list(ref.predictions)
    assert [r["answer"] for r in rows] == [e.answer for e in examples]


def test_eval_reasoning_reads_gsm8k_jsonl(ckpts, tmp_path, capsys):
    data = tmp_path / "gsm.jsonl"
    examples = reasoning_split("validation", 3, level="easy", seed=5)
    data.write_text("".join(json.dumps(e.to_dict()) + "\n" for e in examples))
    code, stdout, err = run(["eval", ckpts["ar"], "--task", "reasoning", "--data", str(data)], capsys)
    assert code == 0, err
    ref = reasoning(setdlm.load(ckpts["ar"]), examples, run=EvalRun(progress=False))
    got = json.loads(stdout)
    assert got["n"] == 3 and got["data"] == str(data) and got["accuracy"] == ref.accuracy
    assert got["generated_tokens"] == ref.run.generated_tokens


def test_eval_in_bfloat16_decodes_with_bfloat16_weights(ckpts, tmp_path, capsys):
    """``--dtype bfloat16`` casts the weights before decoding: the accuracy and tokens are those of the library
    on the model loaded with ``dtype="bfloat16"``, and the result names the precision."""
    data = tmp_path / "probs.jsonl"
    examples = reasoning_split("validation", 3, level="easy", seed=5)
    data.write_text("".join(json.dumps(e.to_dict()) + "\n" for e in examples))
    code, stdout, err = run(["eval", ckpts["ar"], "--task", "reasoning", "--data", str(data), "--dtype", "bfloat16"],
                            capsys)
    assert code == 0, err
    model = setdlm.load(ckpts["ar"], dtype="bfloat16")
    assert next(model.backbone.parameters()).dtype == torch.bfloat16
    ref = reasoning(model, examples, run=EvalRun(progress=False))
    got = json.loads(stdout)
    assert got["dtype"] == "bfloat16" and got["accuracy"] == ref.accuracy
    assert got["generated_tokens"] == ref.run.generated_tokens
    assert json.loads(run(["eval", ckpts["ar"], "--task", "reasoning", "--data", str(data)], capsys)[1])["dtype"] == \
        "float32"
    with pytest.raises(UserError, match="dtype must be one of float32, bfloat16, float16, float64.*'bf16'"):
        setdlm.load(ckpts["ar"], dtype="bf16")


def test_eval_infill_matches_the_library(ckpts, tmp_path, capsys):
    preds = tmp_path / "p.jsonl"
    code, stdout, err = run(["eval", ckpts["setdlm"], "--task", "infill", "--data", ckpts["text"], "--split", "train",
                             "--n", "4", "--hidden", "3", "--window", "3", "--predictions", str(preds)], capsys)
    assert code == 0, err
    got = json.loads(stdout)
    model = setdlm.load(ckpts["setdlm"])
    examples = infill_from_source(ckpts["text"], "train", 4, sentences=5, hidden=3)
    ref = infill(model, examples, window=3, run=EvalRun(progress=False))
    assert (got["rouge1"], got["rouge2"], got["rougeL"]) == (ref.rouge1, ref.rouge2, ref.rougeL)
    assert {k: got[k] for k in DETERMINISTIC} == {k: ref.to_dict()[k] for k in DETERMINISTIC}
    assert got["decode"]["window"] == 3 and got["skipped_too_long"] == 0
    rows = [json.loads(r) for r in preds.read_text().splitlines()]
    assert [r["reference"] for r in rows] == [e.middle for e in examples]
    assert [r["prediction"] for r in rows] == list(ref.predictions)


@pytest.mark.parametrize("cmd, args, needles", [
    ("eval", ["--task", "infill", "--level", "easy"], ["--level applies to --task reasoning, not infill"]),
    ("eval", ["--task", "reasoning", "--hidden", "3"], ["--hidden applies to --task infill, not reasoning"]),
    ("eval", ["--task", "likelihood", "--threshold", "0.9"], ["--threshold applies to --task reasoning/infill/parallel"]),
    ("eval", ["--task", "reasoning", "--threshold", "1.5"], ["--threshold must lie in (0, 1] or be left out (off), got 1.5"]),
    ("eval", ["--task", "reasoning", "--data", "MISSING"], ["GSM8K file", "does not exist"]),
    ("eval", ["--task", "reasoning", "--data", "MISSING", "--level", "easy"], ["--level applies to generated"]),
    ("eval", ["--task", "reasoning", "--level", "hard", "--n", "2"], ["problems fit the context length L=128"]),
    ("eval", ["--task", "infill", "--data", "MISSING"], ["neither an existing file or folder nor a built-in"]),
    ("eval", ["--task", "infill", "--n", "1000"], ["of 149 infill examples fit the context length L=128; ask for --n <="]),
    ("eval", ["--task", "reasoning", "--block-size", "4"], ["--block-size applies to bd3lm/mdlm models, not to this 'setdlm' model"]),
    ("eval", ["--task", "infill", "--stop", "x"], ["--stop applies to --task reasoning/parallel, not infill"]),
    ("eval", ["--task", "reasoning", "--max-new-tokens", "0"], ["--max-new-tokens must be a positive integer, got 0"]),
    ("bench", ["--task", "infill", "--max-new-tokens", "4", "--out", "OUT"],
     ["--max-new-tokens applies to --task reasoning/parallel, not infill"]),
    ("eval", ["--task", "reasoning", "--n", "0"], ["--n: must be a positive integer, got '0'"]),
    ("eval", ["--task", "bogus"], ["--task: invalid choice: 'bogus'"]),
    ("eval", ["--task", "infill", "--hidden", "2"], ["--hidden: invalid choice: 2"]),
    ("bench", ["--task", "likelihood", "--thresholds", "0.9", "--out", "OUT"], ["--thresholds, --windows, --block-sizes, --batch-sizes, --warmup and --sweep-speculate apply"]),
    ("bench", ["--task", "reasoning", "--thresholds", "0.9,x", "--out", "OUT"], ["'x' is not a number"]),
    ("bench", ["--task", "reasoning", "--thresholds", "1.5", "--level", "easy", "--n", "2", "--out", "OUT"],
     [r"thresholds must lie in (0, 1]"]),
    ("bench", ["--task", "reasoning", "--batch-sizes", "0", "--level", "easy", "--n", "2", "--out", "OUT"],
     ["batch sizes must be positive integers, got 0"]),
    ("bench", ["--task", "parallel", "--block-sizes", "0", "--n", "2", "--out", "OUT"],
     ["block sizes must be positive integers (or None for the model's), got 0"]),
    ("eval", ["--task", "parallel", "--level", "easy"], ["--level applies to --task reasoning, not parallel"]),
    ("eval", ["--task", "parallel", "--data", "x.jsonl"], ["--data does not apply to --task parallel"]),
    ("bench", ["--task", "reasoning", "--level", "easy", "--n", "2", "--warmup", "2", "--out", "OUT"],
     ["warmup=2 examples leave none of the 2 examples to time at batch size 1"]),
    ("bench", ["--out", "OUT"], ["the following arguments are required: --task"]),
])
def test_bad_task_arguments_are_one_line_errors(cmd, args, needles, ckpts, tmp_path, capsys):
    args = [str(tmp_path / "missing.jsonl") if a == "MISSING" else str(tmp_path / "out") if a == "OUT" else a
            for a in args]
    code, _, err = run([cmd, ckpts["setdlm"], *args], capsys)
    assert_one_line_error(code, err, *needles)
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------------------------------------------------
# built-in task sources
# ---------------------------------------------------------------------------------------------------------


def test_builtin_reasoning_sources_are_train_problems():
    corpus = read_source("reasoning-easy")
    assert corpus.name == "reasoning-easy" and len(corpus) == 60_000
    first = reasoning_split("train", 100, level="easy", seed=0)
    assert corpus.pairs[:100] == [(e.prompt, e.completion) for e in first]
    assert all(split_of(p[:-1]) == "train" for p, _ in corpus.pairs[::97])  # the question is the prompt minus "\n"


def test_infill_from_the_builtin_shakespeare():
    text = "\n\n".join(w["text"] for w in shakespeare_works())
    got = infill_from_source("shakespeare", "test", 5, hidden=3, seed=1)
    assert got == infill_examples(text, "test", 5, hidden=3, seed=1)
    assert all(" ".join(e.text.split()) in " ".join(text.split()) for e in got)
    with pytest.raises(ValueError, match="holds prompt/completion pairs"):
        infill_from_source("reasoning-easy", "test")


def test_shakespeare_train_holds_no_heldout_window():
    from setdlm.data.tasks import without_heldout_windows

    text = "\n\n".join(w["text"] for w in shakespeare_works())
    kept = without_heldout_windows(text)
    assert infill_examples(kept, "test") == [] and infill_examples(kept, "validation") == []
    assert set(infill_examples(kept, "train")) <= set(infill_examples(text, "train"))
    assert len(infill_examples(kept, "train")) > 0.9 * len(infill_examples(text, "train"))
    flat = " ".join(kept.split())
    assert not any(e.text in flat for e in infill_examples(text, "test"))
    corpus = read_source("shakespeare-train")
    assert corpus.texts == [without_heldout_windows(w["text"]) for w in shakespeare_works()]


# ---------------------------------------------------------------------------------------------------------
# AUP (d3LLM's accuracy under parallelism)
# ---------------------------------------------------------------------------------------------------------


def test_aup_on_hand_computed_points():
    """AUP = ρ1·y1 + ½ Σ (ρi − ρi−1)(yi·W(yi) + yi−1·W(yi−1)), W(y) = min(exp(−3(1 − y/y_max)), 1), over the
    points sorted by ρ whose y is at least y1 − 5."""
    from math import exp

    # (4, 70) is more than 5 points below y1 = 80 and does not count; y_max = 80 (the best y given)
    w78, w76 = exp(-3 * (1 - 78 / 80)), exp(-3 * (1 - 76 / 80))  # 0.92774, 0.86071
    want = 1 * 80 + 0.5 * (2 - 1) * (78 * w78 + 80 * 1) + 0.5 * (3 - 2) * (76 * w76 + 78 * w78)
    assert want == pytest.approx(225.0709, abs=1e-4)
    assert metrics.aup([1, 2, 3, 4], [80, 78, 76, 70]) == pytest.approx(want)
    assert metrics.aup([3, 1, 4, 2], [76, 80, 70, 78]) == pytest.approx(want)  # any input order: sorted by ρ
    assert metrics.aup_points([3, 1, 4, 2], [76, 80, 70, 78]) == [(1, 80), (2, 78), (3, 76)]
    # y_max is the best accuracy on the task (another method's 90): every W < 1, the first term unweighted
    w = {y: exp(-3 * (1 - y / 90)) for y in (80, 78, 76)}
    assert metrics.aup([1, 2, 3, 4], [80, 78, 76, 70], y_max=90) == pytest.approx(
        80 + 0.5 * (80 * w[80] + 78 * w[78]) + 0.5 * (78 * w[78] + 76 * w[76]))
    # a dip below y1 − 5 drops that point; the trapezoid joins its neighbours (ρ 1 → 3)
    assert metrics.aup([1, 2, 3], [80, 60, 79]) == pytest.approx(80 + 0.5 * 2 * (79 * exp(-3 / 80) + 80))
    # y1 is the least parallel point's accuracy: a more accurate faster point is weighted W = 1 and counts
    assert metrics.aup([1, 2], [70, 80]) == pytest.approx(70 + 0.5 * (80 + 70 * exp(-3 * (1 - 70 / 80))))
    # one point (AR: one token per forward): ρ·y; equal ρ: the more accurate point is y1
    assert metrics.aup([1.0], [42.0]) == 42.0
    assert metrics.aup([1, 1], [50, 60]) == 60 and metrics.aup([2, 2], [0, 0]) == 0
    for args, needle in [(([], []), "at least one"), (([1, 2], [50]), "as many"), (([0], [50]), "positive"),
                         (([1], [150]), r"percentages in \[0, 100\]"),
                         (([1], [50], 40), "y_max must be the highest accuracy")]:
        with pytest.raises(ValueError, match=needle):
            metrics.aup(*args)


def test_aup_scores_group_curves_and_share_y_max():
    def pt(model, family, q, tpf, tau, window=None, block=None):
        return sweeps.BenchPoint(model, family, "reasoning", sweeps.Setting(tau, window, 1, block), q, 100.0, None, 10.0,
                                tpf, {})
    pts = [pt("ar", "ar", 0.40, 1.0, None),
           pt("sd", "setdlm", 0.30, 1.0, None, 4), pt("sd", "setdlm", 0.28, 1.5, 0.9, 4),
           pt("sd", "setdlm", 0.20, 2.0, 0.6, 4),
           pt("bd", "bd3lm", 0.35, 1.0, None, None, 4), pt("bd", "bd3lm", 0.34, 1.2, 0.9, None, 8)]
    scores = {(a.model, a.block_size): a for a in metrics.aup_scores(pts)}
    assert set(scores) == {("ar", None), ("sd", None), ("bd", 4), ("bd", 8)}  # one curve per block size
    assert all(a.y_max == 40.0 for a in scores.values())  # the best of the sweep, AR's
    assert scores["ar", None].aup == pytest.approx(40.0)
    sd = scores["sd", None]
    assert (sd.counted, sd.points, sd.max_tpf) == (2, 3, 1.5)  # 20% is more than 5 points below 30%
    assert sd.aup == pytest.approx(metrics.aup([1.0, 1.5], [30.0, 28.0], 40.0))
    assert metrics.aup_scores([sweeps.likelihood_point("m", tiny("ar", TOK), {"nelbo": 1.0})]) == []


def test_points_are_set_against_the_ar_model_at_the_same_batch_size():
    """The sweep's table gives each decoding point's accuracy and tokens/s as multiples of the AR point of its
    batch size (timed side by side); a batch size without an AR point gets none. With several AR points (models
    or precisions) each axis takes AR at its best: the highest accuracy, the highest tokens/s."""
    def pt(family, batch, q, v, window=None, spec=False):
        return sweeps.BenchPoint(family, family, "reasoning", sweeps.Setting(None, window, batch, None, speculate=spec),
                                q, v, None, 10.0, 1.0, {})

    points = [pt("ar", 1, 0.90, 100.0), pt("setdlm", 1, 0.88, 250.0, 4, True), pt("setdlm", 32, 0.88, 900.0, 4, True),
              pt("ar", 8, 0.90, 400.0), pt("setdlm", 8, 0.45, 200.0, 4)]
    ratios = sweeps.against_ar(points)
    assert ratios[0] == (1.0, 1.0) and 2 not in ratios
    assert ratios[1] == pytest.approx((0.88 / 0.90, 2.5)) and ratios[4] == pytest.approx((0.5, 0.5))
    table = reports.markdown_table(points)
    assert "× AR quality | × AR tok/s |" in table
    assert "| 0.98x | 2.50x |" in table and "| 0.50x | 0.50x |" in table and "| – | – |" in table
    assert "× AR" not in reports.markdown_table(points[1:3])  # no AR point: no such columns
    two = [pt("ar", 1, 0.90, 100.0), pt("ar", 1, 0.95, 80.0), pt("ar", 1, 0.85, 120.0), pt("setdlm", 1, 0.95, 240.0)]
    assert sweeps.against_ar(two)[3] == pytest.approx((1.0, 2.0))  # against 95% and 120 tok/s
    assert sweeps.against_ar(two)[0] == pytest.approx((0.90 / 0.95, 100.0 / 120.0))
