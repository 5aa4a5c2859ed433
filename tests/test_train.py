"""The training loop: every family learns, `eval` reproduces the logged bound, SIGKILL + resume is exact."""

import json
import math
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import setdlm
from setdlm.cli import main as cli
from setdlm.training import DataOrder, TrainConfig, lr_at, train

from support import subprocess_env, write_hamlet
from support.gated_run import gated_run, reached

TINY = dict(length=32, hidden_size=32, n_layers=2, n_heads=2, batch_size=8, lr=3e-3, warmup=5, eval_fraction=0.1,
            eval_max=32, eval_batch_size=8, log_every=5)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_hamlet(tmp_path_factory.mktemp("data") / "hamlet.txt", 12000)


def read_log(run: Path) -> tuple[list[dict], list[dict]]:
    rows = [json.loads(r) for r in (run / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if "loss" in r and "split" not in r], [r for r in rows if r.get("split") == "heldout"]


@pytest.mark.parametrize("family", ["ar", "mdlm", "bd3lm", "setdlm"])
def test_each_family_learns_and_eval_reproduces_the_bound(family, corpus, tmp_path, capsys):
    run = tmp_path / "run"
    kw = dict(D=2) if family == "setdlm" else dict(block_size=4) if family == "bd3lm" else {}
    res = train(TrainConfig(out=str(run), data=corpus, family=family, steps=30, eval_every=0, save_every=0, **kw, **TINY))
    steps, evals = read_log(run)
    assert [r["step"] for r in steps] == [5, 10, 15, 20, 25, 30]
    assert steps[-1]["loss"] < steps[0]["loss"] - 0.5, steps  # learns: from ~ln(V) towards the character statistics
    (ev,) = evals
    assert ev["step"] == 30 and math.isfinite(ev["nelbo"]) and ev["nelbo"] > 0 and res.eval == {k: ev[k] for k in res.eval}
    assert ev["tokens"] > 0 and abs(ev["ppl"] - math.exp(ev["nelbo"])) < 1e-9 * ev["ppl"]
    assert res.checkpoint == run / "checkpoints" / "step-00000030"
    assert (run / "latest").read_text().strip() == "checkpoints/step-00000030"
    # `setdlm eval` on the run folder: same weights, same held-out rows, same seed -> the same bound
    capsys.readouterr()
    assert cli(["eval", str(run)]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["family"] == family and out["tokens"] == ev["tokens"]
    assert out["nelbo"] == pytest.approx(ev["nelbo"], rel=1e-12, abs=0)
    # a different seed gives a different Monte-Carlo estimate (AR is exact and does not move)
    assert cli(["eval", str(run), "--seed", "7"]) == 0
    other = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (other["nelbo"] == out["nelbo"]) == (family == "ar")
    model = setdlm.load(run, family=family)
    assert model.tokenizer.decode(model.tokenizer.encode("Hamlet")) == "Hamlet"


def test_lr_schedule():
    c = TrainConfig(out="x", lr=1.0, warmup=4, steps=14, lr_schedule="cosine", min_lr_ratio=0.1)
    lrs = [lr_at(c, s) for s in range(14)]
    assert lrs[:4] == [0.25, 0.5, 0.75, 1.0]
    assert lrs[4] == pytest.approx(1.0) and lrs[9] == pytest.approx(0.55) and lrs[13] == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.9)))
    assert all(a >= b for a, b in zip(lrs[4:], lrs[5:]))
    c = TrainConfig(out="x", lr=2.0, warmup=0, lr_schedule="constant")
    assert {lr_at(c, s) for s in range(50)} == {2.0}


def test_data_order_is_a_pure_function_of_the_step():
    order = DataOrder(10, seed=3)
    epoch0 = torch.cat([order.batch(s, 5) for s in range(2)])
    assert sorted(epoch0.tolist()) == list(range(10))
    straddle = order.batch(1, 7)  # rows 7..13: the end of epoch 0 and the start of epoch 1
    assert torch.equal(straddle[:3], order.perm(0)[7:]) and torch.equal(straddle[3:], order.perm(1)[:4])
    assert torch.equal(DataOrder(10, seed=3).batch(5, 4), order.batch(5, 4))
    assert not torch.equal(order.perm(0), order.perm(1))


def test_bf16_and_accumulation_and_ema(corpus, tmp_path):
    res = train(TrainConfig(out=str(tmp_path / "r"), data=corpus, family="setdlm", D=2, steps=6, bf16=True,
                            grad_accum=2, ema=0.9, eval_ema=True, save_every=3, eval_every=3, **TINY))
    assert math.isfinite(res.loss) and math.isfinite(res.eval["nelbo"])
    names = sorted(p.name for p in res.checkpoint.iterdir())
    assert names == ["README.md", "config.json", "ema.safetensors", "model.safetensors", "optimizer.safetensors",
                     "tokenizer.json", "tokenizer_config.json", "training_state.json"]
    state = json.loads((res.checkpoint / "training_state.json").read_text())
    assert state["step"] == 6 and state["data"]["rows_seen"] == 48 and state["world_size"] == 1
    raw, ema = setdlm.load(tmp_path / "r"), setdlm.load(tmp_path / "r", ema=True)
    assert not torch.equal(raw.backbone.head.weight, ema.backbone.head.weight)


def test_out_folder_guards(corpus, tmp_path):
    run = str(tmp_path / "r")
    train(TrainConfig(out=run, data=corpus, steps=2, **TINY))
    with pytest.raises(ValueError, match="already holds a training run; pass resume=True"):
        train(TrainConfig(out=run, data=corpus, steps=4, **TINY))
    with pytest.raises(ValueError, match="cannot resume: hidden_size=64 but the checkpoint .* hidden_size=32"):
        train(TrainConfig(out=run, data=corpus, steps=4, resume=True, **{**TINY, "hidden_size": 64}))
    with pytest.raises(ValueError, match="at step 2, which is not below steps=2"):
        train(TrainConfig(out=run, data=corpus, steps=2, resume=True, **TINY))
    res = train(TrainConfig(out=run, data=corpus, steps=4, resume=True, **TINY))
    assert res.resumed_from == 2 and res.step == 4



def test_resume_reads_each_checkpoint_file_once(corpus, tmp_path, monkeypatch):
    """Resuming reads config.json, the weights, the training state and the optimizer once each (the checkpoint
    is read once and passed on: checks, tokenizer and backbone all come from that one read)."""
    from collections import Counter

    from setdlm.formats import checkpoint, layout, optim_state, safety

    run = tmp_path / "r"
    train(TrainConfig(out=str(run), data=corpus, steps=2, **TINY))
    reads = Counter()
    for module in (checkpoint, layout, optim_state, safety):  # each module that reads through them
        for name in ("read_json", "read_tensors"):
            if hasattr(module, name):
                real = getattr(module, name)
                monkeypatch.setattr(module, name, lambda path, *a, _real=real, **k: reads.update([Path(path).name])
                                    or _real(path, *a, **k))
    res = train(TrainConfig(out=str(run), data=corpus, steps=3, resume=True, **TINY))
    assert res.resumed_from == 2 and res.step == 3
    assert reads == Counter({"config.json": 1, "model.safetensors": 1, "training_state.json": 1,
                             "optimizer.safetensors": 1}), reads

# -- SIGKILL, then resume ----------------------------------------------------------------------------------


def _cmd(out, corpus, *extra):
    args = ["--out", str(out), "--data", corpus, "--family", "setdlm", "--D", "2", "--steps", "40",
            "--save-every", "5", "--eval-every", "20", "--dropout", "0.1", "--ema", "0.9", "--grad-accum", "2",
            "--length", "32", "--hidden-size", "32", "--batch-size", "8", "--lr", "3e-3", "--warmup", "5",
            "--eval-fraction", "0.1", "--eval-max", "16", "--log-every", "1", "--keep", "3", *extra]
    return [sys.executable, "-m", "setdlm.training", *args]


def test_the_gate_fails_at_once_when_the_run_exits_first(tmp_path):
    """A gated run that dies before its checkpoint (here at once, with code 3) fails the test when it exits, not
    after the ten-minute hang guard."""
    _, _, saved = gated_run(tmp_path, 1)
    proc = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    with pytest.raises(AssertionError, match="exited with code 3 before its step-1 checkpoint"):
        reached(proc, saved, 1)


def test_sigkill_then_resume_equals_uninterrupted(corpus, tmp_path):
    full, crashed = tmp_path / "full", tmp_path / "crashed"
    ref = subprocess.Popen(_cmd(full, corpus), env=subprocess_env(), stderr=subprocess.PIPE, text=True)
    script, gate, saved = gated_run(tmp_path, 10)  # the run stops after its step-10 checkpoint until killed
    cmd = _cmd(crashed, corpus)
    cmd[1:3] = [str(script)]  # the gated run instead of -m setdlm.training
    proc = subprocess.Popen(cmd, env=subprocess_env() | gate, stderr=subprocess.DEVNULL)
    reached(proc, saved, 10)  # fails at once if the run exits first; a hang guard of 10 minutes
    proc.send_signal(signal.SIGKILL)
    assert proc.wait() == -signal.SIGKILL, "the run finished before it could be killed"
    killed_at = int((crashed / "latest").read_text().strip().split("-")[-1])
    assert killed_at == 10
    resumed = subprocess.run(_cmd(crashed, corpus, "--resume"), env=subprocess_env(), stderr=subprocess.PIPE, text=True)
    assert resumed.returncode == 0, resumed.stderr
    assert f"resuming from {crashed}/checkpoints/step-{killed_at:08d} at step {killed_at}" in resumed.stderr
    assert ref.wait() == 0, ref.stderr.read()
    for name in ("model.safetensors", "ema.safetensors", "optimizer.safetensors"):
        a = load_file(full / "checkpoints/step-00000040" / name)
        b = load_file(crashed / "checkpoints/step-00000040" / name)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), name
    (la, ea), (lb, eb) = read_log(full), read_log(crashed)
    assert [(r["step"], r["loss"], r["grad_norm"]) for r in la] == [(r["step"], r["loss"], r["grad_norm"]) for r in lb]
    assert ea == eb and [r["step"] for r in lb] == list(range(1, 41))
    assert sorted(p.name for p in (crashed / "checkpoints").iterdir()) == ["step-00000030", "step-00000035", "step-00000040"]


@pytest.mark.slow
def test_compile_matches_eager(corpus, tmp_path):
    """`--compile` trains the same model (to float tolerance); slow: compiling takes ~a minute on 2 cores."""
    kw = dict(data=corpus, family="setdlm", D=2, steps=4, eval_every=0, save_every=0, **{**TINY, "log_every": 1})
    eager = train(TrainConfig(out=str(tmp_path / "e"), **kw))
    compiled = train(TrainConfig(out=str(tmp_path / "c"), compile=True, **kw))
    assert [r["loss"] for r in compiled.history if "split" not in r] == pytest.approx(
        [r["loss"] for r in eager.history if "split" not in r], rel=1e-4)
