"""A next-token head for the shipped word-problem SetDLM: fine-tune it with ``ar_weight`` (docs/method.md §2.10), so
that one network drafts (its window) and verifies as an AR model (its clean stream), and pick the checkpoint on
the validation split (benchmarks/RESULTS.md, "Faster than AR at AR's accuracy"; docs/decoding.md, "Verifying with
the next-token head").

    PYTHONPATH=src python benchmarks/next_token_head.py train --out runs/next_token          # 1000 steps, resumable
    PYTHONPATH=src python benchmarks/next_token_head.py train --init arith-ar --out runs/next_token_from_ar
    PYTHONPATH=src python benchmarks/next_token_head.py train --ar-control --out runs/ar_control  # AR, same steps
    PYTHONPATH=src python benchmarks/next_token_head.py select --runs runs/next_token runs/ar_control ...
    PYTHONPATH=src python benchmarks/next_token_head.py ship --checkpoint runs/next_token/run/checkpoints/step-00001000

``train``: ``setdlm train``'s recipe of the shipped models (the paper's protocol: L = 192, batch 32, lr 1e-3
constant after 20 warm-up steps, bf16, the ``reasoning-medium`` corpus they were trained on), from ``--init``
(default the shipped ``arith-setdlm-smax8``) with ``--ar-weight`` (default 1); ``--ar-control`` trains the shipped
``arith-ar`` on the same data for the same steps with its own (AR) loss, so that extra training is not what the
comparison measures. ``select``: every saved checkpoint of the runs on the first ``--n`` validation problems (never
trained on), greedy: a model with a next-token head by its AR decode (``speculate="next_token"``, so its accuracy is
its head's) and its tokens per forward at ``--windows``; an AR model by its own decode; written to
``OUT/select.json`` with the best checkpoint of each run (highest accuracy, then the later step), every ``--every``
steps. ``ship``: the chosen checkpoint into the package as ``arith-setdlm-smax8-ar`` (bf16, as every shipped model;
its model card records the command and the validation numbers of ``OUT/select.json``).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

import setdlm
from setdlm.data.tasks import reasoning_split
from setdlm.decoding import DecodeSettings
from setdlm.evaluation.reasoning import reasoning
from setdlm.training import TrainConfig, train

SHIPPED = "arith-setdlm-smax8"
SHIP_AS = "arith-setdlm-smax8-ar"


def finetune(out: Path, init: str, steps: int, ar_weight: float, ar_control: bool) -> Path:
    family = dict(family="ar") if ar_control else dict(family="setdlm", D=4, M=8, ar_weight=ar_weight)
    cfg = TrainConfig(init_from="arith-ar" if ar_control else init, data="reasoning-medium", **family, length=192,
                      steps=steps, batch_size=32, lr=1e-3, warmup=20, lr_schedule="constant", bf16=True, seed=2,
                      eval_every=250, eval_max=512, save_every=100, keep=100, log_every=25, out=str(out / "run"),
                      resume=True)
    return Path(train(cfg).checkpoint)


def select(runs: list[Path], n: int, windows: list[int], batch_size: int, every: int) -> dict:
    problems = reasoning_split("validation", n, level="medium", seed=0)
    report = {"n": n, "split": "validation", "runs": {}}
    for run in runs:
        rows = {}
        for ck in sorted((run / "run" / "checkpoints").glob("step-*")):
            if int(ck.name.split("-")[1]) % every:
                continue
            model = setdlm.load(str(ck))
            head = model.family.family == "setdlm" and model.family.ar_weight > 0
            row = {}
            for w in (windows if head else [1]):
                knobs = {"speculate": "next_token", "window": w} if head else {}
                r = reasoning(model, problems, DecodeSettings(**knobs), batch_size=batch_size, progress=False)
                row["accuracy"] = r.accuracy  # the same at every window (the head's AR decode)
                row[f"tokens_per_forward_w{w}"] = r.run.tokens_per_step
            rows[ck.name] = row
            print(f"{ck}: " + ", ".join(f"{k} {v:.3f}" for k, v in row.items()), flush=True)
        best = max(rows, key=lambda name: (rows[name]["accuracy"], name))
        report["runs"][str(run)] = {"checkpoints": rows, "best": best}
        print(f"{run}: best {best} ({100 * rows[best]['accuracy']:.1f}%)")
    return report


def ship(checkpoint: Path, report: dict) -> Path:
    from setdlm.formats.checkpoint import read_config
    from setdlm.formats.pretrained import root

    run = checkpoint.parent.parent.parent  # OUT of the train stage: OUT/run/checkpoints/step-N
    row = report["runs"][str(run)]["checkpoints"][checkpoint.name]
    steps = int(checkpoint.name.split("-")[1])
    model = setdlm.load(str(checkpoint))
    model.backbone.to(torch.bfloat16)
    training = read_config(checkpoint)["training"]
    training.update(out=str(run / "run"), init_from=SHIPPED)
    bench = {"fine-tuning steps (from arith-setdlm-smax8)": steps,
             "medium validation accuracy (next-token head, 300 problems)": round(row["accuracy"], 4)}
    bench.update({f"tokens per forward (speculate='next_token', w = {k.rsplit('w', 1)[1]})": round(v, 2)
                  for k, v in row.items() if k.startswith("tokens_per_forward")})
    dest = root() / SHIP_AS
    model.save(dest, training_args=training, bench=bench, source={
        "name": f"arith-setdlm-smax8 with a next-token head: {steps} steps of ar_weight 1 (docs/method.md §2.10)",
        "layout": "setdlm", "command": f"python benchmarks/next_token_head.py train --out {run}"})
    return dest


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("stage", choices=("train", "select", "ship"))
    p.add_argument("--checkpoint", default=None, help="ship: the checkpoint chosen by select")
    p.add_argument("--out", default="runs/next_token")
    p.add_argument("--init", default=SHIPPED, help=f"train: the weights to start from (default {SHIPPED})")
    p.add_argument("--ar-weight", type=float, default=1.0)
    p.add_argument("--ar-control", action="store_true", help="train: arith-ar on the same data, its own loss")
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--runs", nargs="+", default=[], help="select: run folders (their --out)")
    p.add_argument("--n", type=int, default=300, help="select: validation problems")
    p.add_argument("--windows", type=int, nargs="+", default=[6])
    p.add_argument("--every", type=int, default=250, help="select: the checkpoints whose step is a multiple of this")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.stage == "train":
        print(f"checkpoint: {finetune(out, args.init, args.steps, args.ar_weight, args.ar_control)}")
    elif args.stage == "ship":
        print(f"shipped: {ship(Path(args.checkpoint), json.loads((out / 'select.json').read_text()))}")
    else:
        report = select([Path(r) for r in args.runs], args.n, args.windows, args.batch_size, args.every)
        (out / "select.json").write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
