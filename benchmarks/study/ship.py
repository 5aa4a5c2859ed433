"""Copy the study's chosen models into the package as the embedded default (``setdlm.pretrained``):
``python benchmarks/study/ship.py``. Weights are stored in bf16 (they load as float32); each folder's
``config.json`` records the training arguments and its model card the command that trained it and the
study's numbers for it."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from runs import train_command  # noqa: E402

import setdlm  # noqa: E402
from setdlm.checkpoint import read_config, resolve  # noqa: E402
from setdlm.pretrained import root  # noqa: E402

RUNS = Path("runs/study")
SHIP = {  # shipped name -> (dataset, family of the study run)
    "shakespeare-setdlm-smax8": ("lm", "setdlm-smax8"),
    "shakespeare-bd3lm-s4": ("lm", "bd3lm-s4"),
    "shakespeare-ar": ("lm", "ar"),
    "arith-setdlm-smax8": ("reason", "setdlm-smax8"),
    "arith-bd3lm-s4": ("reason", "bd3lm-s4"),
    "arith-ar": ("reason", "ar"),
}


def study_numbers(run: str) -> dict:
    """The study's measurements of ``run`` (threshold off) for the model card."""
    raw = Path(__file__).parent / "results" / "raw.jsonl"
    out = {}
    for r in map(json.loads, raw.read_text().splitlines()) if raw.exists() else []:
        if r["run"] != run or r["setting"] not in ("bound", "off", "speed"):
            continue
        if "nelbo" in r:
            out["held-out bound (nats/token)"] = round(r["nelbo"], 4)
        if "accuracy" in r:
            out["medium test accuracy (τ off)"] = round(r["accuracy"], 4)
        if "rougeL" in r:
            out[f"{r['task']} ROUGE-L"] = round(r["rougeL"], 4)
        if "tok_s" in r:
            out[f"{r['task']} tokens/s (batch 1, 2-core CPU)"] = round(r["tok_s"], 1)
    return out


def main() -> None:
    for name, (dataset, family) in SHIP.items():
        run = f"{dataset}-{family}"
        folder = resolve(RUNS / run)
        model = setdlm.load(folder)
        model.backbone.to(torch.bfloat16)
        cmd = shlex.join(train_command(dataset, family, str(RUNS / run), str(RUNS / "data/reason_medium_train.jsonl")))
        dest = root() / name
        model.save(dest, training_args=read_config(folder)["training"],
                   source={"name": f"setdlm reproduction study, run {run}", "layout": "setdlm", "command": cmd},
                   bench=study_numbers(run) or None)
        size = sum(f.stat().st_size for f in dest.iterdir())
        print(f"{name}: {size / 2**20:.1f} MiB from {folder}")


if __name__ == "__main__":
    main()
