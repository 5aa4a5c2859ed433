"""Data-parallel training: `torchrun --nproc_per_node=2` on CPU (gloo) with the single-process command line."""

import json
import subprocess
import sys

import pytest
import torch

import setdlm
from setdlm.formats import checkpoint as ckpt
from setdlm.evaluation.likelihood import likelihood
from setdlm.training import heldout_of

from support import subprocess_env, write_hamlet


def test_torchrun_two_processes(tmp_path):
    data = write_hamlet(tmp_path / "hamlet.txt", 12000)
    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "setdlm.training",
           "--out", str(run), "--data", str(data), "--family", "setdlm", "--D", "2", "--steps", "20",
           "--length", "32", "--hidden-size", "32", "--batch-size", "8", "--grad-accum", "2", "--lr", "3e-3",
           "--warmup", "5", "--eval-every", "10", "--save-every", "0", "--log-every", "5", "--eval-fraction", "0.1",
           "--eval-max", "16", "--dropout", "0.1"]
    proc = subprocess.run(cmd, env=subprocess_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # one checkpoint, written by rank 0, with replicas that never diverged
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-00000020"]
    state = json.loads((run / "checkpoints/step-00000020/training_state.json").read_text())
    assert state["world_size"] == 2 and state["replica_max_abs_diff"] == 0.0
    assert state["data"]["rows_seen"] == 20 * 8
    rows = [json.loads(r) for r in (run / "metrics.jsonl").read_text().splitlines()]
    losses = [r for r in rows if "split" not in r]
    assert [r["step"] for r in losses] == [5, 10, 15, 20]  # logged once, not once per process
    assert losses[-1]["loss"] < losses[0]["loss"]
    assert [r["step"] for r in rows if r.get("split") == "heldout"] == [10, 20]
    model = setdlm.load(run)
    assert all(torch.isfinite(p).all() for p in model.backbone.parameters())
    # the bound the two processes computed together (each a share of the batches) is the one-process bound
    logged = [r for r in rows if r.get("split") == "heldout"][-1]
    args = ckpt.read_config(run)["training"]
    alone = likelihood(model, heldout_of(args, model.tokenizer).batches(args["eval_batch_size"]),
                       seed=args["eval_seed"], progress=False).bound_row()
    assert alone["tokens"] == logged["tokens"] and alone["nelbo"] == pytest.approx(logged["nelbo"], rel=1e-9)
