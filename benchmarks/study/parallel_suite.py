"""Where parallel decoding breaks: train AR, SetDLM S<=8 and BD3LM S=4 on the parallel-dependency suite, then
sweep thresholds, windows and block sizes (docs/evaluation.md, "The parallel-dependency suite").

``python benchmarks/study/parallel_suite.py {train,finetune,bench,commands} [--root DIR]``

The sweep only says something once the models solve the tasks when they commit one token per step; the first
run (2 layers, 1,500 steps) left every model at the floor. These runs use the protocol's backbone (d = 128,
4 layers, characters) for 4,000 steps of 32 rows on ``--data parallel`` (copy, reverse, sort, a 4x4 Latin square,
all four tasks in turn), one recipe for the three families. From scratch BD3LM learns the suite far more slowly
than the others, so ``finetune`` also runs the paper's protocol on it: SetDLM S<=8 and BD3LM S=4 fine-tuned from
the AR run (1,500 steps, lr 1e-3, constant after 20 warm-up steps). ``train`` and ``finetune`` resume
unfinished runs; ``bench`` runs ``setdlm bench --task parallel`` on 200 test examples (50 per task, batch 1, CPU
clock) over τ in {off, 0.9, 0.7, 0.5, 0.3}, SetDLM windows w in {D, 8} and BD3LM blocks S in {4, 8}, for the
runs from scratch and for the fine-tunes, into ``results/parallel/{scratch,finetuned}.{md,json,png}``:
accuracy per task against tokens per forward, and AUP.
"""

from __future__ import annotations

import argparse
import shlex
import shutil
import subprocess
from pathlib import Path

RESULTS = Path(__file__).parent / "results" / "parallel"
STEPS = 4000
DATA = ["--data", "parallel", "--length", "64", "--batch-size", "32", "--eval-max", "64", "--save-every", "500",
        "--seed", "1"]  # what both stages share
RECIPE = [*DATA, "--hidden-size", "128", "--n-heads", "4", "--n-layers", "4", "--steps", str(STEPS), "--lr", "2e-3",
          "--warmup", "100", "--lr-schedule", "cosine", "--eval-every", "1000"]
RUNS = {"ar": ["--family", "ar"], "setdlm-d4": ["--family", "setdlm", "--D", "4", "--M", "8"],
        "bd3lm-s4": ["--family", "bd3lm", "--block-size", "4"]}
FT_STEPS = 1500
FINETUNE = [*DATA, "--steps", str(FT_STEPS), "--lr", "1e-3", "--warmup", "20", "--lr-schedule", "constant",
            "--eval-every", "500"]
FINETUNED = {"ft-setdlm-d4": RUNS["setdlm-d4"], "ft-bd3lm-s4": RUNS["bd3lm-s4"]}  # from the AR run
BENCH = ["--task", "parallel", "--n", "200", "--thresholds", "off,0.9,0.7,0.5,0.3", "--windows", "D,8",
         "--block-sizes", "D,8", "--warmup", "20", "--clock", "cpu"]


def train_command(root: Path, name: str) -> list[str]:
    if name in FINETUNED:
        return ["setdlm", "train", "--out", str(root / name), "--init-from", str(root / "ar"), *FINETUNED[name],
                *FINETUNE]
    return ["setdlm", "train", "--out", str(root / name), *RUNS[name], *RECIPE]


def bench_command(root: Path, names, out: Path) -> list[str]:
    return ["setdlm", "bench", *(str(root / name) for name in names), *BENCH, "--out", str(out)]


BENCHES = {"scratch": tuple(RUNS), "finetuned": ("ar", *FINETUNED)}  # the AR run is the base of the fine-tunes


def train(root: Path, names, steps: int) -> None:
    for name in names:
        if (root / name / "checkpoints" / f"step-{steps:08d}").is_dir():
            continue
        cmd = train_command(root, name) + (["--resume"] if (root / name / "latest").exists() else [])
        print(shlex.join(cmd), flush=True)
        subprocess.run(cmd, check=True)


def bench(root: Path) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    for which, names in BENCHES.items():
        out = root / f"bench-{which}"
        if not (out / "bench.json").exists():
            subprocess.run(bench_command(root, names, out), check=True)
        for f in ("md", "json", "png"):
            if (out / f"bench.{f}").exists():
                shutil.copy(out / f"bench.{f}", RESULTS / f"{which}.{f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("stage", choices=["train", "finetune", "bench", "commands"])
    ap.add_argument("--root", default="runs/parallel", help="run folders (out of the work tree)")
    args = ap.parse_args()
    root = Path(args.root)
    if args.stage == "commands":
        for name in (*RUNS, *FINETUNED):
            print(shlex.join(train_command(root, name)))
        for which, names in BENCHES.items():
            print(shlex.join(bench_command(root, names, root / f"bench-{which}")))
    elif args.stage == "train":
        train(root, RUNS, STEPS)
    elif args.stage == "finetune":
        train(root, FINETUNED, FT_STEPS)
    else:
        bench(root)


if __name__ == "__main__":
    main()
