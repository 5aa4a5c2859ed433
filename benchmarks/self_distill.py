"""Self-distillation of the SetDLM window: fine-tune ``arith-setdlm-smax8`` on its own greedy window-1 outputs, so
that its window's far guesses agree more often with what its verifier commits (more tokens accepted per
speculative forward), and measure what that buys and what it costs (benchmarks/RESULTS.md, "Faster than AR at
AR's accuracy"; docs/decoding.md, "Self-speculative decoding").

    PYTHONPATH=src python benchmarks/self_distill.py data --n 1536      # its own completions of train problems
    PYTHONPATH=src python benchmarks/self_distill.py train --steps 300  # fine-tune on them (resumable)
    PYTHONPATH=src python benchmarks/self_distill.py compare --n 300    # validation split: both models

``data``: the first ``--n`` problems of the built-in ``reasoning-medium`` corpus (train split, the ones the model
was trained on), each completed by the shipped model's lossless speculative decode (token for token its
``window=1`` greedy output) into ``OUT/data.jsonl`` as prompt/completion pairs. ``train``: ``setdlm train``'s
recipe from the shipped weights (``init_from``: architecture and tokenizer included) on that file, the shipped
model's own settings (D=4, M=8, L=192, batch 32, bf16) at a lower constant learning rate. ``compare``: on the
validation split (never trained on), the shipped and the distilled model's accuracy (their window-1 output,
through the lossless speculative decode) and tokens per forward of the speculative decode at each ``--windows``,
into ``OUT/compare.json``.
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


def make_data(out: Path, n: int, batch_size: int) -> Path:
    model = setdlm.load(SHIPPED)
    problems = reasoning_split("train", n, level="medium", seed=0)  # the corpus reasoning-medium's first n
    result = reasoning(model, problems, DecodeSettings(speculate=True, window=4), batch_size=batch_size)
    path = out / "data.jsonl"
    with path.open("w") as f:
        for e, p in zip(problems, result.predictions):
            f.write(json.dumps({"prompt": e.prompt, "completion": p}) + "\n")
    print(f"{n} completions ({100 * result.accuracy:.1f}% correct) -> {path}")
    return path


def finetune(out: Path, steps: int, lr: float) -> Path:
    cfg = TrainConfig(init_from=SHIPPED, data=str(out / "data.jsonl"), family="setdlm", D=4, M=8, length=192,
                      steps=steps, batch_size=32, lr=lr, warmup=20, lr_schedule="constant", bf16=True, seed=1,
                      eval_every=steps, save_every=50, log_every=25, out=str(out / "run"), resume=True)
    return Path(train(cfg).checkpoint)


def compare(out: Path, checkpoint: str, n: int, windows: list[int], batch_size: int) -> dict:
    problems = reasoning_split("validation", n, level="medium", seed=0)
    report = {"n": n, "split": "validation", "models": {}}
    for name in (SHIPPED, checkpoint):
        model = setdlm.load(name)
        rows = {}
        for w in windows:
            r = reasoning(model, problems, DecodeSettings(speculate=True, window=w), batch_size=batch_size,
                          clock="cpu", progress=False)
            rows[w] = {"accuracy": r.accuracy, "tokens_per_forward": r.run.tokens_per_step}
            print(f"{name}: window {w}: accuracy {100 * r.accuracy:.1f}%, "
                  f"{r.run.tokens_per_step:.2f} tokens per forward")
        report["models"][name] = rows
    (out / "compare.json").write_text(json.dumps(report, indent=1) + "\n")
    return report


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("stage", choices=("data", "train", "compare"))
    p.add_argument("--out", default="runs/self_distill")
    p.add_argument("--n", type=int, default=None, help="problems (data: 1536, compare: 300)")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--windows", type=int, nargs="+", default=[4, 6])
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--checkpoint", default=None, help="compare: the distilled checkpoint (default: the run's latest)")
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.stage == "data":
        make_data(out, args.n or 1536, args.batch_size)
    elif args.stage == "train":
        print(f"checkpoint: {finetune(out, args.steps, args.lr)}")
    else:
        compare(out, args.checkpoint or str(out / "run"), args.n or 300, args.windows, args.batch_size)


if __name__ == "__main__":
    main()
