"""FSDP2 (`--strategy fsdp`): `torchrun --nproc_per_node=2` on CPU (gloo). Two processes sharding the model
train the run that one process trains (same data, same seeds per micro-batch: to float rounding); a run killed
with SIGKILL after a sharded checkpoint resumes to the uninterrupted run's weights bitwise; the sharded
checkpoint converts to the single file that `setdlm.load` reads, which gives the trained model's numbers."""

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import setdlm
from setdlm.formats import checkpoint as ckpt, layout
from setdlm.evaluation.likelihood import likelihood
from setdlm.training import TrainConfig, consolidate, heldout_of, train

from support import subprocess_env, write_hamlet
from support.gated_run import gated_run, reached

RUN = dict(family="setdlm", D=2, steps=20, length=32, hidden_size=32, n_layers=2, n_heads=2, batch_size=8, lr=3e-3,
           warmup=2, eval_every=10, save_every=5, log_every=1, eval_fraction=0.1, eval_max=16, eval_batch_size=8,
           dropout=0.1, ema=0.9, keep=5)


def _flags(**kw) -> list[str]:
    out = []
    for k, v in kw.items():
        out += ["--" + (k if k in ("D", "M", "k") else k.replace("_", "-")), str(v)]
    return out


def _torchrun(out, data, *extra) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "setdlm.training",
            "--out", str(out), "--data", data, "--strategy", "fsdp", "--grad-accum", "1", *_flags(**RUN), *extra]


def _descendants(pid: int) -> list[int]:
    """The processes started by ``pid`` (torchrun's workers, which run in process groups of their own)."""
    children = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # ended meanwhile
            continue
        if int(fields[1]) == pid:
            children.append(int(stat.parent.name))
    return children + [d for c in children for d in _descendants(c)]


def _kill_tree(pid: int) -> None:
    for p in [*_descendants(pid), pid]:  # workers first, so that the launcher does not restart or reap them
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, signal.SIGKILL)


def _log(run):
    rows = [json.loads(r) for r in (run / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if "split" not in r], [r for r in rows if r.get("split") == "heldout"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """An uninterrupted 2-process FSDP run, and the same run in one process (2 micro-batches per step)."""
    root = tmp_path_factory.mktemp("fsdp")
    data = write_hamlet(root / "hamlet.txt", 12000)
    proc = subprocess.run(_torchrun(root / "fsdp", data), env=subprocess_env(), capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    alone = train(TrainConfig(out=str(root / "alone"), data=data, grad_accum=2, **RUN))
    return root, data, alone


def test_two_processes_train_the_one_process_run(runs):
    root, _, alone = runs
    fsdp = root / "fsdp"
    state = json.loads((fsdp / "checkpoints/step-00000020/training_state.json").read_text())
    assert state["strategy"] == "fsdp" and state["world_size"] == 2 and state["data"]["rows_seen"] == 20 * 8
    assert sorted(p.name for p in (fsdp / "checkpoints/step-00000020/sharded").iterdir()) == \
        [".metadata", "__0_0.distcp", "__1_0.distcp"]  # one shard file per process, no gathered weights
    assert not (fsdp / "checkpoints/step-00000020" / layout.WEIGHTS).exists()
    losses, heldout = _log(fsdp)
    ref = [r for r in alone.history if "split" not in r]
    assert [r["step"] for r in losses] == list(range(1, 21))  # logged once, not once per process
    assert [r["loss"] for r in losses] == pytest.approx([r["loss"] for r in ref], rel=1e-5)
    assert [r["grad_norm"] for r in losses] == pytest.approx([r["grad_norm"] for r in ref], rel=1e-4)
    ref_heldout = [r for r in alone.history if "split" in r]
    assert [r["nelbo"] for r in heldout] == pytest.approx([r["nelbo"] for r in ref_heldout], rel=1e-5)
    assert losses[-1]["loss"] < losses[0]["loss"]


def test_sharded_checkpoint_converts_to_one_file(runs):
    root, _, alone = runs
    step = root / "fsdp/checkpoints/step-00000020"
    with pytest.raises(ValueError, match="sharded checkpoint of an FSDP run; convert .* setdlm export"):
        setdlm.load(root / "fsdp")
    assert consolidate(root / "fsdp") == step  # the run folder names its latest checkpoint
    model, ema = setdlm.load(root / "fsdp"), setdlm.load(root / "fsdp", ema=True)
    reference = setdlm.load(alone.checkpoint)
    # the trained model's own number: the bound the two processes logged at the end, from the sharded weights
    args = ckpt.read_config(step)["training"]
    rows = heldout_of(args, model.tokenizer).batches(args["eval_batch_size"])
    logged = _log(root / "fsdp")[1][-1]
    mine = likelihood(model, rows, seed=args["eval_seed"], progress=False)
    assert mine.tokens == logged["tokens"] and mine.nats_per_token == pytest.approx(logged["nelbo"], rel=1e-6)
    ids = heldout_of(args, model.tokenizer).input_ids[:4]
    with torch.no_grad():
        for a, b in ((model, reference), (ema, setdlm.load(alone.checkpoint, ema=True))):
            assert torch.allclose(a.backbone(ids), b.backbone(ids), atol=1e-4)
    assert not torch.equal(model.backbone(ids), ema.backbone(ids))


def test_sigkill_then_resume_equals_uninterrupted(runs, tmp_path):
    root, data, _ = runs
    crashed = tmp_path / "crashed"
    script, gate, saved = gated_run(tmp_path, 5)  # the run stops after its step-5 checkpoint until killed
    cmd = _torchrun(crashed, data)
    cmd[cmd.index("-m", 3):cmd.index("setdlm.training") + 1] = [str(script)]  # the gated run instead of -m setdlm.training
    proc = subprocess.Popen(cmd, env=subprocess_env() | gate, stderr=subprocess.DEVNULL)
    reached(proc, saved, 5)  # fails at once if the run exits first; a hang guard of 10 minutes
    _kill_tree(proc.pid)
    assert proc.wait() == -signal.SIGKILL, "the run finished before it could be killed"
    killed_at = int((crashed / "latest").read_text().strip().split("-")[-1])
    assert 5 <= killed_at < 20
    resumed = subprocess.run(_torchrun(crashed, data, "--resume"), env=subprocess_env(), capture_output=True,
                             text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resuming from {crashed}/checkpoints/step-{killed_at:08d} at step {killed_at}" in resumed.stderr
    consolidate(crashed)
    full = root / "fsdp/checkpoints/step-00000020"
    if not (full / layout.WEIGHTS).exists():
        consolidate(full)
    for name in (layout.WEIGHTS, layout.EMA_WEIGHTS):
        a, b = load_file(full / name), load_file(crashed / "checkpoints/step-00000020" / name)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), name
    (la, ea), (lb, eb) = _log(root / "fsdp"), _log(crashed)
    assert [(r["step"], r["loss"], r["grad_norm"]) for r in la] == [(r["step"], r["loss"], r["grad_norm"]) for r in lb]
    assert ea == eb


def test_fsdp_needs_torchrun(tmp_path, monkeypatch):
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    with pytest.raises(ValueError, match="strategy fsdp shards over the processes of torchrun"):
        train(TrainConfig(out=str(tmp_path / "r"), strategy="fsdp"))
    assert not (tmp_path / "r").exists()  # refused before anything was written
