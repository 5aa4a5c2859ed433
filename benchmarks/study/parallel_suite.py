"""Where parallel decoding breaks: train AR, SetDLM S<=8 and BD3LM S=4 on the parallel-dependency suite, then
sweep thresholds, windows and block sizes (docs/evaluation.md, "The parallel-dependency suite").

``python benchmarks/study/parallel_suite.py {train,bench,commands} [--root DIR]``

The sweep only says something once the models solve the tasks when they commit one token per step; the first
run (2 layers, 1,500 steps) left every model at the floor. These runs use the protocol's backbone (d = 128,
4 layers, characters) for 4,000 steps of 32 rows on ``--data parallel`` (copy, reverse, sort, a 4x4 Latin square,
all four tasks in turn), one recipe for the three families. ``train`` resumes unfinished runs; ``bench``
runs ``setdlm bench --task parallel`` on 200 test examples (50 per task, batch 1, CPU clock) over
τ in {off, 0.9, 0.7, 0.5, 0.3}, SetDLM windows w in {D, 8} and BD3LM blocks S in {4, 8}, into
``results/parallel/bench.{md,json,png}``: accuracy per task against tokens per forward, and AUP.
"""

from __future__ import annotations

import argparse
import shlex
import shutil
import subprocess
from pathlib import Path

RESULTS = Path(__file__).parent / "results" / "parallel"
STEPS = 4000
RECIPE = ["--data", "parallel", "--length", "64", "--hidden-size", "128", "--n-heads", "4", "--n-layers", "4",
          "--steps", str(STEPS), "--batch-size", "32", "--lr", "2e-3", "--warmup", "100", "--lr-schedule", "cosine",
          "--eval-max", "64", "--eval-every", "1000", "--save-every", "500", "--seed", "1"]
RUNS = {"ar": ["--family", "ar"], "setdlm-d4": ["--family", "setdlm", "--D", "4", "--M", "8"],
        "bd3lm-s4": ["--family", "bd3lm", "--block-size", "4"]}
BENCH = ["--task", "parallel", "--n", "200", "--thresholds", "off,0.9,0.7,0.5,0.3", "--windows", "D,8",
         "--block-sizes", "D,8", "--warmup", "20", "--clock", "cpu"]


def train_command(root: Path, name: str) -> list[str]:
    return ["setdlm", "train", "--out", str(root / name), *RUNS[name], *RECIPE]


def bench_command(root: Path, out: Path) -> list[str]:
    return ["setdlm", "bench", *(str(root / name) for name in RUNS), *BENCH, "--out", str(out)]


def train(root: Path) -> None:
    for name in RUNS:
        if (root / name / "checkpoints" / f"step-{STEPS:08d}").is_dir():
            continue
        cmd = train_command(root, name) + (["--resume"] if (root / name / "latest").exists() else [])
        print(shlex.join(cmd), flush=True)
        subprocess.run(cmd, check=True)


def bench(root: Path) -> None:
    out = root / "bench-parallel"
    subprocess.run(bench_command(root, out), check=True)
    RESULTS.mkdir(parents=True, exist_ok=True)
    for f in ("bench.md", "bench.json", "bench.png"):
        if (out / f).exists():
            shutil.copy(out / f, RESULTS / f)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("stage", choices=["train", "bench", "commands"])
    ap.add_argument("--root", default="runs/parallel", help="run folders (out of the work tree)")
    args = ap.parse_args()
    root = Path(args.root)
    if args.stage == "commands":
        for name in RUNS:
            print(shlex.join(train_command(root, name)))
        print(shlex.join(bench_command(root, root / "bench-parallel")))
    elif args.stage == "train":
        train(root)
    else:
        bench(root)


if __name__ == "__main__":
    main()
