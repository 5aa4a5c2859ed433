"""The study's speed protocol (benchmarks/study/evaluate_study.py --respeed): every configuration of a task
decodes the same timed examples interleaved, one example at a time, so that ratios between rows are
measured side by side; the recorded rows keep their qualities and get the new speed fields."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from setdlm import decoding
from setdlm.evaluation import passes
from setdlm.data.tasks import reasoning_split, write_jsonl
from support import subprocess_env

STUDY = Path(__file__).resolve().parents[1] / "benchmarks" / "study"


def _load_study():
    sys.path.insert(0, str(STUDY))
    spec = importlib.util.spec_from_file_location("evaluate_study", STUDY / "evaluate_study.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _train(out: Path, data: Path, *family: str) -> None:
    cmd = [sys.executable, "-m", "setdlm", "train", "--out", str(out), "--data", str(data), "--tokenizer", "char",
           "--length", "192", "--hidden-size", "32", "--n-layers", "1", "--n-heads", "2", "--steps", "2",
           "--batch-size", "4", "--warmup", "1", "--eval-max", "8", "--seed", "0", *family]
    subprocess.run(cmd, check=True, capture_output=True, env=subprocess_env())


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    root = tmp_path_factory.mktemp("study")
    data = root / "reason.jsonl"
    write_jsonl([e.to_prompt_completion() for e in reasoning_split("train", 64, level="medium", seed=0)], data)
    runs = root / "runs"
    _train(runs / "reason-ar", data, "--family", "ar")
    _train(runs / "reason-setdlm-smax4", data, "--family", "setdlm", "--D", "2", "--M", "4")
    return root, runs


def test_respeed_interleaves_configurations_example_by_example(study, monkeypatch):
    root, runs = study
    mod = _load_study()
    out = root / "results"
    out.mkdir(exist_ok=True)
    rows = [{"task": "reason", "run": "reason-ar", "setting": "off", "threshold": None, "accuracy": 0.25,
             "tok_s": -1.0},
            {"task": "reason", "run": "reason-setdlm-smax4", "setting": "off", "threshold": None, "accuracy": 0.5,
             "tok_s": -1.0},
            {"task": "reason", "run": "reason-setdlm-smax4", "setting": "tau=0.9", "threshold": 0.9,
             "accuracy": 0.75, "tok_s": -1.0},
            # a threshold outside the sweep is left as it is
            {"task": "reason", "run": "reason-setdlm-smax4", "setting": "tau=0.5", "threshold": 0.5,
             "accuracy": 0.1, "tok_s": -1.0}]
    (out / "raw.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    monkeypatch.setattr(mod, "RUNS", runs)
    monkeypatch.setattr(mod, "OUT", out)

    calls = []  # (run, threshold, prompt) of every decoding call, in order
    real = decoding.generate
    problems = reasoning_split("test", 14, level="medium", seed=0)

    def spy(model, prompts, settings, **kw):
        run = "reason-ar" if model.family.family == "ar" else "reason-setdlm-smax4"
        assert len(prompts) == 1  # batch 1
        prompt = next(e.prompt for e in problems if passes.prompt_ids(model, e) == list(prompts[0]))
        calls.append((run, settings.threshold, prompt))
        return real(model, prompts, settings, **kw)

    monkeypatch.setattr(decoding, "generate", spy)
    mod.respeed(quick=True)

    configs = [(r["run"], r["threshold"]) for r in rows[:3]]
    problems = [e.prompt for e in problems]
    assert len(calls) == len(configs) * len(problems)
    for i, prompt in enumerate(problems):
        block = calls[3 * i: 3 * i + 3]
        assert {c[2] for c in block} == {prompt}  # example i by every configuration before example i + 1
        assert [c[:2] for c in block] == [configs[(i + k) % 3] for k in range(3)]  # order rotated by i
    new = [json.loads(line) for line in (out / "raw.jsonl").read_text().splitlines()]
    for old, r in zip(rows[:3], new[:3]):
        assert r["accuracy"] == old["accuracy"] and r["speed"] == "interleaved"
        assert r["tok_s"] > 0 and r["tok_s_std"] >= 0 and r["tokens_per_example"] > 0
        assert r["nfe_per_example"] >= r["tokens_per_example"] / r["tokens_per_step"] - 1e-9
    assert new[3] == rows[3]
    # τ off decodes one token per forward; the greedy AR row's tokens/step is exactly 1
    assert new[0]["tokens_per_step"] == 1.0 and new[1]["tokens_per_step"] == 1.0
