"""Copy the study's chosen models into the package as the embedded default (``setdlm.formats.pretrained``):
``python benchmarks/study/ship.py`` (the first study's runs), or ``python benchmarks/study/ship.py --protocol
ROOT`` for the word-problem models of the paper's protocol (every family fine-tuned from one AR base,
``protocol.py``): each family's latest budget on disk, the choice the validation split supports (accuracy
rose with every budget for every family measured there: ``results/error_trend.md``). Weights are stored in bf16 (they load as float32); each folder's
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
from setdlm.formats.checkpoint import read_config  # noqa: E402
from setdlm.formats.layout import resolve  # noqa: E402
from setdlm.formats.pretrained import root  # noqa: E402

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


PROTOCOL = {"arith-ar": "ar", "arith-setdlm-smax8": "setdlm-smax8", "arith-bd3lm-s4": "bd3lm-s4"}


def protocol_numbers(family: str, step: int) -> dict:
    """The protocol's measurements of ``family`` at ``step`` (``results/curves.jsonl``) for the model card."""
    raw = Path(__file__).parent / "results" / "curves.jsonl"
    out = {"fine-tuning steps": step}
    for r in map(json.loads, raw.read_text().splitlines()) if raw.exists() else []:
        if r["run"] != family or r["step"] != step:
            continue
        tau = "τ off" if r["setting"] == "tau-off" else f"τ {r['setting'].split('-')[1]}"
        out[f"medium test accuracy ({tau}, 300 problems)"] = round(r["accuracy"], 4)
        out[f"tokens per step ({tau})"] = round(r["tokens_per_step"], 2)
        if r.get("bound_ppl"):
            out["held-out bound PPL"] = round(r["bound_ppl"], 4)
    return out


def portable(training: dict) -> dict:
    """The training arguments as shipped: no path of this machine (the medium data file is the built-in corpus
    ``reasoning-medium``, row for row; other paths relative to the working folder)."""
    out = dict(training)
    for k, v in training.items():
        if isinstance(v, str) and Path(v).is_absolute():
            out[k] = "reasoning-medium" if v.endswith("reason_medium_train.jsonl") else v.replace(f"{Path.cwd()}/", "")
    return out


def ship_protocol(runs: Path) -> None:
    from protocol import BUDGETS, finetune_command

    for name, family in PROTOCOL.items():
        steps = [b for b in BUDGETS if (runs / f"ft-{family}" / "checkpoints" / f"step-{b:08d}").is_dir()]
        if not steps:
            print(f"{name}: no budget of ft-{family} on disk yet; kept as it is")
            continue
        folder = runs / f"ft-{family}" / "checkpoints" / f"step-{steps[-1]:08d}"
        model = setdlm.load(folder)
        model.backbone.to(torch.bfloat16)
        cmd = shlex.join(finetune_command(Path("runs/protocol"), family)).replace(f"{Path.cwd()}/", "")
        dest = root() / name
        model.save(dest, training_args=portable(read_config(folder)["training"]),
                   source={"name": f"setdlm study, the paper's protocol: {family} fine-tuned from the AR base for "
                                   f"{steps[-1]} steps", "layout": "setdlm", "command": cmd},
                   bench=protocol_numbers(family, steps[-1]))
        size = sum(f.stat().st_size for f in dest.iterdir())
        print(f"{name}: {size / 2**20:.1f} MiB from {folder}")


def main() -> None:
    if "--protocol" in sys.argv:
        return ship_protocol(Path(sys.argv[sys.argv.index("--protocol") + 1]))
    for name, (dataset, family) in SHIP.items():
        run = f"{dataset}-{family}"
        folder = resolve(RUNS / run)
        model = setdlm.load(folder)
        model.backbone.to(torch.bfloat16)
        cmd = shlex.join(train_command(dataset, family, str(RUNS / run), str(RUNS / "data/reason_medium_train.jsonl")))
        dest = root() / name
        model.save(dest, training_args=portable(read_config(folder)["training"]),
                   source={"name": f"setdlm reproduction study, run {run}", "layout": "setdlm", "command": cmd},
                   bench=study_numbers(run) or None)
        size = sum(f.stat().st_size for f in dest.iterdir())
        print(f"{name}: {size / 2**20:.1f} MiB from {folder}")


if __name__ == "__main__":
    main()
