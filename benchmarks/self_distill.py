"""Self-distillation of the SetDLM window: fine-tune ``arith-setdlm-smax8`` on its own greedy window-1 outputs, so
that its window's far guesses agree more often with what its verifier commits (more tokens accepted per
speculative forward), and measure what that buys and what it costs (benchmarks/RESULTS.md, "Self-distillation
of the window"; docs/decoding.md, "Self-speculative decoding").

    PYTHONPATH=src python benchmarks/self_distill.py data --n 4096 [--correct-only]  # its own completions
    PYTHONPATH=src python benchmarks/self_distill.py train --steps 300  # fine-tune on them (resumable)
    PYTHONPATH=src python benchmarks/self_distill.py compare --n 300    # validation split: both models
    ... --model arith-ar                                                 # the same recipe for the AR baseline
    ... --model arith-setdlm-smax8-ar [--schedule cooldown]            # a model with a next-token head

``data``: the first ``--n`` problems of the built-in ``reasoning-medium`` corpus (train split, the ones the model
was trained on), each completed by the model's greedy decode (a SetDLM's lossless speculative decode: token for
token its ``window=1`` output; a model with a next-token head: its head's, ``speculate="next_token"``) into
``OUT/data.jsonl`` as prompt/completion pairs; ``--correct-only`` keeps the completions whose answer is right (the
model is not taught its own mistakes: rejection-sampled self-training). ``train``: ``setdlm train``'s recipe from
the shipped weights (``init_from``: architecture and tokenizer included) on that file, the shipped model's own
settings (family, D, M, ``ar_weight``, L=192, batch 32, bf16) at a lower constant learning rate (``--schedule
cooldown``: that rate cosine to 0). ``compare``: on the validation split (never trained on), the shipped and the
fine-tuned model's accuracy and, for a SetDLM, tokens per forward of the speculative decode at each ``--windows``,
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
from setdlm.evaluation.metrics import answer_matches
from setdlm.evaluation.passes import EvalRun
from setdlm.evaluation.reasoning import reasoning
from setdlm.training import TrainConfig, knobs_for, train

SHIPPED = "arith-setdlm-smax8"


def lossless(model, window: int) -> dict:
    """The decode settings of ``model``'s lossless fast decode at ``window``: AR's own decode, a SetDLM's
    self-speculative one (its ``window=1`` output), verified by its next-token head if it has one (its AR output)."""
    if model.family.family != "setdlm":
        return {}
    return {"speculate": "next_token" if model.family.ar_weight > 0 else True, "window": window}


def make_data(out: Path, shipped: str, n: int, batch_size: int, correct_only: bool) -> Path:
    model = setdlm.load(shipped)
    problems = reasoning_split("train", n, level="medium", seed=0)  # the corpus reasoning-medium's first n
    fast = lossless(model, 6 if model.family.ar_weight > 0 else 4)
    result = reasoning(model, problems, DecodeSettings(**fast), EvalRun(batch_size=batch_size))
    kept = [(e, p) for e, p in zip(problems, result.predictions) if not correct_only or answer_matches(p, e.answer)]
    path = out / "data.jsonl"
    with path.open("w") as f:
        for e, p in kept:
            f.write(json.dumps({"prompt": e.prompt, "completion": p}) + "\n")
    print(f"{n} completions ({100 * result.accuracy:.1f}% correct), {len(kept)} kept -> {path}")
    return path


def finetune(out: Path, shipped: str, steps: int, lr: float, schedule: str = "constant") -> Path:
    """``schedule``: "constant" at ``lr``, or "cooldown" (``lr`` cosine to 0)."""
    fam = setdlm.load(shipped).family
    knobs = knobs_for(fam.family, D=fam.D, M=fam.M, block_size=fam.block_size, ar_weight=fam.ar_weight)
    sched = dict(lr_schedule="cosine", min_lr_ratio=0.0) if schedule == "cooldown" else dict(lr_schedule="constant")
    cfg = TrainConfig(init_from=shipped, data=str(out / "data.jsonl"), family=fam.family, **knobs, length=fam.length,
                      steps=steps, batch_size=32, lr=lr, warmup=20, **sched, bf16=True, seed=1,
                      eval_every=steps, save_every=50, log_every=25, out=str(out / "run"), resume=True)
    return Path(train(cfg).checkpoint)


def compare(out: Path, shipped: str, checkpoint: str, n: int, windows: list[int], batch_size: int) -> dict:
    problems = reasoning_split("validation", n, level="medium", seed=0)
    report = {"n": n, "split": "validation", "models": {}}
    for name in (shipped, checkpoint):
        model = setdlm.load(name)
        rows = {}
        for w in (windows if model.family.family == "setdlm" else [1]):
            r = reasoning(model, problems, DecodeSettings(**lossless(model, w)),
                          EvalRun(batch_size=batch_size, clock="cpu", progress=False))
            rows[w] = {"accuracy": r.accuracy, "tokens_per_forward": r.run.tokens_per_step}
            print(f"{name}: window {w}: accuracy {100 * r.accuracy:.1f}%, "
                  f"{r.run.tokens_per_step:.2f} tokens per forward")
        report["models"][name] = rows
    (out / "compare.json").write_text(json.dumps(report, indent=1) + "\n")
    return report


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("stage", choices=("data", "train", "compare"))
    p.add_argument("--model", default=SHIPPED, help=f"the shipped model to distil (default {SHIPPED}; arith-ar: "
                   "the same recipe for the AR baseline)")
    p.add_argument("--out", default="runs/self_distill")
    p.add_argument("--n", type=int, default=None, help="problems (data: 4096, compare: 300)")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--schedule", choices=("constant", "cooldown"), default="constant",
                   help="train: constant --lr, or --lr cosine to 0")
    p.add_argument("--windows", type=int, nargs="+", default=[4, 6])
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--checkpoint", default=None, help="compare: the distilled checkpoint (default: the run's latest)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--correct-only", action="store_true", help="data: keep only the completions whose answer is "
                   "right (the model is not taught its own mistakes)")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.stage == "data":
        make_data(out, args.model, args.n or 4096, args.batch_size, args.correct_only)
    elif args.stage == "train":
        print(f"checkpoint: {finetune(out, args.model, args.steps, args.lr, args.schedule)}")
    else:
        compare(out, args.model, args.checkpoint or str(out / "run"), args.n or 300, args.windows, args.batch_size)


if __name__ == "__main__":
    main()
