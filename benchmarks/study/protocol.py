"""The paper's protocol at our scale: one pretrained base, every family fine-tuned from it.

``python benchmarks/study/protocol.py {data,base,finetune,curves,commands} [--root DIR] [--only NAMES] [--until STEP]
[--split validation|test] [--steps BUDGETS]``

The paper never trains a diffusion model from scratch: every family is fine-tuned from the same pretrained
base (Qwen3-1.7B-Base) with the same data, steps, batch and learning-rate schedule (paper §5.2, Table 2).
Here, for the arithmetic word problems:

* ``base``: an AR model pretrained on a broad arithmetic corpus the task generators produce: the ``train``
  split of all three levels (easy, medium, hard; rows longer than L dropped). Never the test split.
* ``finetune``: each family (AR, BD3LM S=4, SetDLM S<=8 (D=4, M=8), SetDLM S<=16 (D=8, M=16), MDLM as the floor)
  initialised from the base (``--init-from``) and trained on the ``medium`` train split with one recipe:
  same steps, batch, peak learning rate, warm-up and a *constant* rate after warm-up, so that every saved
  checkpoint is a point of the learning curve (a cosine schedule would make the early checkpoints of a
  long run differ from short runs).
* ``curves``: for every fine-tuned run and every budget in ``BUDGETS``: exact-match accuracy on
  ``N_TEST`` held-out test problems (threshold off and 0.9) and the held-out bound; one JSON line each in
  ``benchmarks/study/results/curves.jsonl`` (resumable: a measured point is skipped).
  Choices (which budget, which model to ship) are made on the ``validation`` split (``--split validation``).

Every run is one ``setdlm train`` command, appended to ``ROOT/commands.log`` as it starts; an interrupted
run continues with ``--resume`` (a finished one, whose final checkpoint exists, is skipped).
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).parent / "results"
L = 192
ARCH = ["--tokenizer", "char", "--length", str(L), "--hidden-size", "128", "--n-layers", "4", "--n-heads", "4"]
BASE_STEPS = 3000
BASE = ["--family", "ar", "--steps", str(BASE_STEPS), "--batch-size", "32", "--lr", "2e-3", "--warmup", "100",
        "--lr-schedule", "cosine", "--min-lr-ratio", "0.1", "--bf16", "--seed", "0", "--save-every", "100",
        "--eval-every", "500", "--eval-max", "512", "--log-every", "20"]
FT_STEPS = 3000
BUDGETS = (375, 750, 1500, 3000)  # fine-tuning steps at which the curve is measured (0.25x..2x the old 1,500)
FINETUNE = ["--steps", str(FT_STEPS), "--batch-size", "32", "--lr", "1e-3", "--warmup", "20",
            "--lr-schedule", "constant", "--bf16", "--seed", "1", "--save-every", "125", "--keep", "100",
            "--eval-every", "375", "--eval-max", "512", "--log-every", "25"]
FAMILIES = {  # name -> family flags; the headline pair first
    "ar": ["--family", "ar"],
    "setdlm-smax8": ["--family", "setdlm", "--D", "4", "--M", "8"],
    "bd3lm-s4": ["--family", "bd3lm", "--block-size", "4"],
    "setdlm-smax16": ["--family", "setdlm", "--D", "8", "--M", "16"],
    "mdlm": ["--family", "mdlm", "--block-size", str(L)],
}
N_TEST = 300
TAUS = (None, 0.9)


def write_data(root: Path) -> tuple[Path, Path]:
    """The base corpus (train split, all levels) and the fine-tuning data (train split, medium)."""
    from setdlm.data.tasks import reasoning_split, write_jsonl

    data = root / "data"
    data.mkdir(parents=True, exist_ok=True)
    base, medium = data / "arith_all_train.jsonl", data / "reason_medium_train.jsonl"
    if not base.exists():
        rows = []
        for level, n in (("easy", 30000), ("medium", 40000), ("hard", 40000)):
            for e in reasoning_split("train", n, level=level, seed=0):
                r = e.to_prompt_completion()
                if len(r["prompt"]) + len(r["completion"]) + 2 <= L:  # + BOS and EOS
                    rows.append(r)
        import random
        random.Random(0).shuffle(rows)
        write_jsonl(rows, base.with_suffix(".tmp"))
        base.with_suffix(".tmp").rename(base)
    if not medium.exists():
        write_jsonl([e.to_prompt_completion() for e in reasoning_split("train", 60000, level="medium", seed=0)],
                    medium.with_suffix(".tmp"))
        medium.with_suffix(".tmp").rename(medium)
    return base, medium


def base_command(root: Path) -> list[str]:
    return ["setdlm", "train", "--out", str(root / "base-ar"), "--data", str(root / "data/arith_all_train.jsonl"),
            *ARCH, *BASE]


def base_of(root: Path) -> Path:
    """The base the fine-tunes start from: this machine's run, else the committed copy of its final weights
    (``results/base-ar``: the pretraining took 94 minutes of a shared 2-core CPU; no need to repeat it)."""
    return root / "base-ar" if (root / "base-ar").is_dir() or not (RESULTS / "base-ar").is_dir() else RESULTS / "base-ar"


def finetune_command(root: Path, family: str) -> list[str]:
    return ["setdlm", "train", "--out", str(root / f"ft-{family}"), "--init-from", str(base_of(root)),
            "--data", str(root / "data/reason_medium_train.jsonl"), "--length", str(L), *FAMILIES[family],
            *FINETUNE]


def finished(out: Path, steps: int) -> bool:
    return (out / "checkpoints" / f"step-{steps:08d}").is_dir()


def run(root: Path, name: str, cmd: list[str], steps: int, until: int | None = None) -> None:
    """Run (or resume) one training run; with ``until``, stop it once that checkpoint is on disk.

    The fine-tuning rate is constant after warm-up, so stopping at a budget and resuming later trains exactly
    the run that was never stopped (checkpoints are written atomically; ``--resume`` restores the data order).
    """
    out = root / name
    if finished(out, until or steps):
        print(f"[protocol] {name}: done", flush=True)
        return
    if (out / "checkpoints").is_dir():
        cmd = ["setdlm", "train", "--out", str(out), "--resume"]
    with open(root / "commands.log", "a") as f:
        f.write(json.dumps({"run": name, "time": time.strftime("%Y-%m-%d %H:%M:%S"), "cmd": shlex.join(cmd)}) + "\n")
    print(f"[protocol] {name}: {shlex.join(cmd)}" + (f" (until step {until})" if until else ""), flush=True)
    proc = subprocess.Popen(cmd)
    while until and proc.poll() is None and not finished(out, until):
        time.sleep(5)  # a driver, not a test: wait for the budget's checkpoint
    if until and proc.poll() is None:
        proc.terminate()
        proc.wait()
        return
    if proc.wait() != 0:
        raise subprocess.CalledProcessError(proc.returncode, cmd)


def curves(root: Path, only: list[str] | None, split: str, steps: list[int] | None = None) -> None:
    """Accuracy (tau off, 0.9) and the held-out bound at every budget (or ``steps``) of every fine-tuned run."""
    import torch

    import setdlm
    from setdlm.evaluation.passes import EvalRun
    from setdlm.evaluation.reasoning import reasoning
    from setdlm.data.tasks import reasoning_split
    from setdlm.decoding import DecodeSettings

    torch.set_num_threads(1)
    out = RESULTS / ("curves.jsonl" if split == "test" else f"curves_{split}.jsonl")
    done = set()
    if out.exists():
        done = {(r["run"], r["step"], r["setting"]) for r in map(json.loads, out.read_text().splitlines())}
    examples = reasoning_split(split, N_TEST, level="medium", seed=0)
    base = root / "base-ar" / "checkpoints" / f"step-{BASE_STEPS:08d}"
    points = [("base-ar", BASE_STEPS, base if base.is_dir() else RESULTS / "base-ar")]  # the start
    points += [(f, step, root / f"ft-{f}" / "checkpoints" / f"step-{step:08d}") for f in FAMILIES for step in BUDGETS]
    for family, step, ckpt in points:
        if (only and family not in only) or (steps and step not in steps) or not ckpt.is_dir():
            continue
        model = None
        for tau in TAUS:
            setting = "tau-off" if tau is None else f"tau-{tau}"
            if (family, step, setting) in done:
                continue
            model = model or setdlm.load(str(ckpt))
            if tau is not None and model.family.family == "ar":
                continue  # AR commits one token per step: tau does not apply
            kw = {} if tau is None else {"threshold": tau}
            if model.family.family == "mdlm":
                kw["block_size"] = 32
            r = reasoning(model, examples, DecodeSettings(**kw), EvalRun(batch_size=32, seed=0, progress=False))
            row = {"run": family, "step": step, "setting": setting, "split": split, "accuracy": r.accuracy,
                   "nfe_per_example": r.run.nfe_per_example, "tokens_per_step": r.run.tokens_per_step}
            if tau is None:
                row["bound_ppl"] = json.loads(subprocess.run(
                    ["setdlm", "eval", str(ckpt)], check=True, capture_output=True, text=True).stdout).get("ppl")
            with open(out, "a") as f:
                f.write(json.dumps(row) + "\n")
            print(f"[curves] {family:14s} step {step:5d} {setting:8s} acc={row['accuracy']:.3f}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("stage", choices=["data", "base", "finetune", "curves", "commands"])
    ap.add_argument("--root", default="runs/protocol", help="run folders (keep them out of the work tree)")
    ap.add_argument("--only", nargs="*", help="family names, e.g. ar setdlm-smax8")
    ap.add_argument("--until", type=int, help="finetune: stop each run at this step (round-robin budgets)")
    ap.add_argument("--split", default="test", choices=["validation", "test"], help="curves: problems scored")
    ap.add_argument("--steps", nargs="*", type=int, help="curves: only these budgets, e.g. 1500 3000")
    args = ap.parse_args()
    root = Path(args.root)
    root.mkdir(parents=True, exist_ok=True)
    if args.stage == "commands":
        print(shlex.join(base_command(root)))
        for family in FAMILIES:
            print(shlex.join(finetune_command(root, family)))
    elif args.stage == "data":
        write_data(root)
    elif args.stage == "base":
        write_data(root)
        if base_of(root) == root / "base-ar":
            run(root, "base-ar", base_command(root), BASE_STEPS)
    elif args.stage == "finetune":
        write_data(root)
        for family in FAMILIES:
            if not args.only or family in args.only:
                run(root, f"ft-{family}", finetune_command(root, family), FT_STEPS, args.until)
    else:
        curves(root, args.only, args.split, args.steps)


if __name__ == "__main__":
    sys.exit(main())
