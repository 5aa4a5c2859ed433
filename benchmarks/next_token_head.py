"""A next-token head for the shipped word-problem SetDLM: fine-tune it with ``ar_weight`` (docs/method.md §2.10), so
that one network drafts (its window) and verifies as an AR model (its clean stream), and pick the checkpoint on
the validation split (benchmarks/RESULTS.md, "Faster than AR at AR's accuracy"; docs/decoding.md, "Verifying with
the next-token head").

    PYTHONPATH=src python benchmarks/next_token_head.py train --out runs/ar_head              # 1000 steps, resumable
    PYTHONPATH=src python benchmarks/next_token_head.py train --ar-control --out runs/ar_control  # AR, same steps
    PYTHONPATH=src python benchmarks/next_token_head.py train --init runs/ar_head/run/checkpoints/step-00001000 \
        --schedule cooldown --steps 600 --seed 3 --out runs/cool_nt                                 # then cool down
    PYTHONPATH=src python benchmarks/next_token_head.py train --ar-control --schedule cooldown --steps 600 --seed 3 \
        --init runs/ar_control/run/checkpoints/step-00001000 --out runs/cool_ar
    PYTHONPATH=src python benchmarks/next_token_head.py select --runs runs/cool_nt --every 100 --windows 5 6 --out runs/sel_nt
    PYTHONPATH=src python benchmarks/next_token_head.py ship --out runs/sel_nt --checkpoint runs/cool_nt/run/checkpoints/step-00000500

``train``: ``setdlm train``'s recipe of the shipped models (the paper's protocol: L = 192, batch 32, lr 1e-3
constant after 20 warm-up steps, bf16, the ``reasoning-medium`` corpus they were trained on), from ``--init``
(default the shipped ``arith-setdlm-smax8``) with ``--ar-weight`` (default 1); ``--ar-control`` trains the shipped
``arith-ar`` on the same data for the same steps with its own (AR) loss, so that extra training is not what the
comparison measures. ``select``: every saved checkpoint of the runs on the first ``--n`` validation problems (never
trained on), greedy: a model with a next-token head by its AR decode (``speculate="next_token"``, so its accuracy is
its head's) and its tokens per forward at ``--windows``; an AR model by its own decode; written to
``OUT/select.json`` with the best checkpoint of each run (highest accuracy, then the later step), every ``--every``
steps. ``ship``: the chosen checkpoint into the package as ``arith-setdlm-smax8-ar`` (an AR control's as
``arith-ar-long``; bf16, as every shipped model; its model card records the commands and the validation numbers of
``OUT/select.json``). ``--schedule cooldown`` (with ``--init`` a checkpoint of a constant-rate run, ``--seed`` a new
data order) cools a run down: 1e-3 cosine to 0, the recipe of the shipped pair.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

import setdlm
from setdlm.data.tasks import reasoning_split
from setdlm.decoding import DecodeSettings
from setdlm.evaluation.passes import EvalRun
from setdlm.evaluation.reasoning import reasoning
from setdlm.training import TrainConfig, train

SHIPPED = "arith-setdlm-smax8"
SHIP_AS = "arith-setdlm-smax8-ar"
SHIP_AR_AS = "arith-ar-long"  # the AR control of the same training, the baseline of the comparison


def step_of(checkpoint: Path) -> int:
    """The training step of a checkpoint folder ``.../step-00001000``."""
    return int(checkpoint.name.split("-")[1])


def finetune(out: Path, init: str | None, steps: int, ar_weight: float, ar_control: bool, schedule: str = "constant",
             seed: int = 2) -> Path:
    """``schedule``: "constant" (1e-3 after 20 warm-up steps, the shipped recipe) or "cooldown" (1e-3 cosine to 0:
    a cool-down of weights trained at the constant rate, from ``init``, on a new data order ``seed``)."""
    family = dict(family="ar") if ar_control else dict(family="setdlm", D=4, M=8, ar_weight=ar_weight)
    init = init or ("arith-ar" if ar_control else SHIPPED)
    lr = dict(lr_schedule="cosine", min_lr_ratio=0.0) if schedule == "cooldown" else dict(lr_schedule="constant")
    cfg = TrainConfig(init_from=init, data="reasoning-medium", **family, length=192,
                      steps=steps, batch_size=32, lr=1e-3, warmup=20, **lr, bf16=True, seed=seed,
                      eval_every=250, eval_max=512, save_every=100, keep=100, log_every=25, out=str(out / "run"),
                      resume=True)
    return Path(train(cfg).checkpoint)


def select(runs: list[Path], n: int, windows: list[int], batch_size: int, every: int) -> dict:
    problems = reasoning_split("validation", n, level="medium", seed=0)
    report = {"n": n, "split": "validation", "runs": {}}
    for run in runs:
        rows = {}
        for ck in sorted((run / "run" / "checkpoints").glob("step-*")):
            if step_of(ck) % every:
                continue
            model = setdlm.load(str(ck))
            head = model.family.family == "setdlm" and model.family.ar_weight > 0
            row = {}
            for w in (windows if head else [1]):
                knobs = {"speculate": "next_token", "window": w} if head else {}
                r = reasoning(model, problems, DecodeSettings(**knobs), EvalRun(batch_size=batch_size, progress=False))
                row["accuracy"] = r.accuracy  # the same at every window (the head's AR decode)
                row[f"tokens_per_forward_w{w}"] = r.run.tokens_per_step
            rows[ck.name] = row
            print(f"{ck}: " + ", ".join(f"{k} {v:.3f}" for k, v in row.items()), flush=True)
        best = max(rows, key=lambda name: (rows[name]["accuracy"], name))
        report["runs"][str(run)] = {"checkpoints": rows, "best": best}
        print(f"{run}: best {best} ({100 * rows[best]['accuracy']:.1f}%)")
    return report


def lineage(checkpoint: Path) -> list[tuple[Path, dict]]:
    """The fine-tuning runs from the shipped SetDLM to ``checkpoint``, oldest first: (checkpoint, its training
    arguments) each, following ``init_from`` while it names a checkpoint of an earlier run."""
    from setdlm.formats.checkpoint import read_config

    chain = [(checkpoint, read_config(checkpoint)["training"])]
    while Path(chain[-1][1]["init_from"]).is_dir():
        ck = Path(chain[-1][1]["init_from"])
        chain.append((ck, read_config(ck)["training"]))
    return chain[::-1]


def ship(checkpoint: Path, report: dict) -> Path:
    """``checkpoint`` into the package: a SetDLM with the head as ``arith-setdlm-smax8-ar``, an AR control as
    ``arith-ar-long``; bf16, the model card naming the runs that made it and its validation numbers."""
    from setdlm.formats.pretrained import root

    run = checkpoint.parent.parent.parent  # OUT of the train stage: OUT/run/checkpoints/step-N
    row = report["runs"][str(run)]["checkpoints"][checkpoint.name]
    chain = lineage(checkpoint)
    steps = sum(step_of(ck) for ck, _ in chain)
    model = setdlm.load(str(checkpoint))
    model.backbone.to(torch.bfloat16)
    ar = model.family.family == "ar"
    training = dict(chain[-1][1], out=str(run / "run"))
    parts, commands = [], []
    for i, (ck, t) in enumerate(chain):
        n, cooldown = step_of(ck), t["lr_schedule"] == "cosine"
        of = f"the first {n} of {t['steps']}" if n < t["steps"] else f"{n}"
        parts.append(f"{of} steps at {t['lr']:g} " + ("cosine to 0" if cooldown else "constant"))
        out = ck.parent.parent.parent
        commands.append(f"python benchmarks/next_token_head.py train --out {out}" + (" --ar-control" if ar else "") + (
            f" --init {t['init_from']} --schedule cooldown --steps {t['steps']} --seed {t['seed']}" if i else ""))
    start = "arith-ar" if ar else SHIPPED
    bench = {f"fine-tuning steps (from {start})": steps,
             f"medium validation accuracy ({'AR decode' if ar else 'next-token head'}, 300 problems)": round(row["accuracy"], 4)}
    bench.update({f"tokens per forward (speculate='next_token', w = {k.rsplit('w', 1)[1]})": round(v, 2)
                  for k, v in row.items() if k.startswith("tokens_per_forward") and not ar})
    name = (f"arith-ar trained further on its own data, its own loss: {', then '.join(parts)} (the AR baseline of "
            f"{SHIP_AS})" if ar else
            f"arith-setdlm-smax8 with a next-token head: ar_weight 1, {', then '.join(parts)} (docs/method.md §2.10)")
    dest = root() / (SHIP_AR_AS if ar else SHIP_AS)
    model.save(dest, training_args=training, bench=bench, source={
        "name": name, "layout": model.family.family, "command": " && ".join(commands)})
    return dest


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("stage", choices=("train", "select", "ship"))
    p.add_argument("--checkpoint", default=None, help="ship: the checkpoint chosen by select")
    p.add_argument("--out", default="runs/next_token")
    p.add_argument("--init", default=None, help=f"train: the weights to start from (default {SHIPPED}, "
                   "arith-ar with --ar-control)")
    p.add_argument("--schedule", choices=("constant", "cooldown"), default="constant",
                   help="train: constant 1e-3 (the shipped recipe) or cooldown (1e-3 cosine to 0)")
    p.add_argument("--seed", type=int, default=2, help="train: the data order and training randomness")
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
        checkpoint = finetune(out, args.init, args.steps, args.ar_weight, args.ar_control, args.schedule, args.seed)
        print(f"checkpoint: {checkpoint}")
    elif args.stage == "ship":
        print(f"shipped: {ship(Path(args.checkpoint), json.loads((out / 'select.json').read_text()))}")
    else:
        report = select([Path(r) for r in args.runs], args.n, args.windows, args.batch_size, args.every)
        (out / "select.json").write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
