"""Run the reproduction study: ``python benchmarks/study/study.py train`` (resumable), ``commands``.

Runs go to ``runs/study/<dataset>-<family>``; a finished run (its final checkpoint exists) is skipped, an
interrupted one resumes from its last checkpoint with ``--resume``. Every command is appended to
``runs/study/commands.log`` as it starts.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from runs import ORDER, steps_of, train_command  # noqa: E402

ROOT = Path("runs/study")


def reason_data() -> Path:
    """The reasoning training file: 60,000 medium problems from the train split (seed 0)."""
    from setdlm.data.tasks import reasoning_split, write_jsonl

    path = ROOT / "data" / "reason_medium_train.jsonl"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        write_jsonl([e.to_prompt_completion() for e in reasoning_split("train", 60000, level="medium", seed=0)], tmp)
        tmp.rename(path)
    return path


def finished(out: Path, steps: int) -> bool:
    return (out / "checkpoints" / f"step-{steps:08d}").is_dir()


def train(only: list[str] | None) -> None:
    data = reason_data()
    for dataset, family in ORDER:
        name = f"{dataset}-{family}"
        if only and name not in only:
            continue
        out = ROOT / name
        steps = steps_of(dataset, family)
        if finished(out, steps):
            print(f"[study] {name}: done", flush=True)
            continue
        cmd = train_command(dataset, family, str(out), str(data))
        if (out / "checkpoints").is_dir():
            cmd = ["setdlm", "train", "--out", str(out), "--resume"]
        with open(ROOT / "commands.log", "a") as f:
            f.write(json.dumps({"run": name, "time": time.strftime("%Y-%m-%d %H:%M:%S"), "cmd": shlex.join(cmd)}) + "\n")
        print(f"[study] {name}: {shlex.join(cmd)}", flush=True)
        t0 = time.time()
        subprocess.run(cmd, check=True)
        with open(ROOT / "times.jsonl", "a") as f:
            f.write(json.dumps({"run": name, "seconds": time.time() - t0}) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("stage", choices=["train", "commands"])
    ap.add_argument("--only", nargs="*", help="run names, e.g. reason-ar lm-setdlm-smax8")
    args = ap.parse_args()
    ROOT.mkdir(parents=True, exist_ok=True)
    if args.stage == "commands":
        for dataset, family in ORDER:
            print(shlex.join(train_command(dataset, family, str(ROOT / f"{dataset}-{family}"), str(ROOT / "data/reason_medium_train.jsonl"))))
    else:
        train(args.only)


if __name__ == "__main__":
    main()
