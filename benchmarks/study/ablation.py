"""Accuracy against the parallelism D and the model size, and a curriculum in D (issue 22's hypotheses).

``python benchmarks/study/ablation.py {base,finetune,score,table,commands} [--root DIR]``

Every run follows the paper's protocol as ``protocol.py`` runs it: one AR base per size, pretrained with the
protocol's base recipe on the same corpus, then fine-tuned on the ``medium`` train split with the protocol's
fine-tuning recipe (constant rate after warm-up, so a run stopped at ``BUDGET`` steps is the first ``BUDGET``
steps of the protocol's 3,000-step runs and can be continued later):

* sizes: ``0.8M`` (d = 128, 4 layers: the protocol's own base and fine-tunes are reused: AR, D = 4 is SetDLM
  S<=8, D = 8 is SetDLM S<=16) and ``0.2M`` (d = 64, 4 layers, 4 heads: its own base, ``base-ar-d64``);
* D in 1, 2, 4, 8 with M = 2D (SetDLM S<=2D, paper §3): how much of the AR fine-tune's accuracy a SetDLM keeps as
  its sets grow, and whether that share rises with the model size (the paper's 1.7B result suggests it must);
* a curriculum in D at 0.8M: D = 1, then 2, then 4, ``BUDGET / 3`` steps each, each stage starting from the
  previous stage's weights (fresh optimiser and warm-up: ``--init-from``; data-order seeds 1, 2, 3), against D = 4 for the whole budget.

Every model is scored on the **validation** split (``N_VAL`` ``medium`` problems, greedy, threshold off, the
default window, which is D), never on the test split; with the trainer's held-out bound. ``score`` appends one
JSON line per run to ``results/ablation.jsonl`` (resumable); ``table`` writes ``results/ablation.md``.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import protocol as P  # noqa: E402

BUDGET = 750  # fine-tuning steps of every cell: 0.5x the old 1,500-step runs, where the D effect is already large
N_VAL = 300
DS = (1, 2, 4, 8)
SIZES = {"0.8M": {"hidden": 128, "base": "base-ar", "prefix": "ft-"},
         "0.2M": {"hidden": 64, "base": "base-ar-d64", "prefix": "ft-d64-"}}
REUSED = {("0.8M", "ar"): "ft-ar", ("0.8M", "D4"): "ft-setdlm-smax8", ("0.8M", "D8"): "ft-setdlm-smax16"}
CURRICULUM = ("cur-d1", "cur-d2", "cur-d4")  # D = 1 -> 2 -> 4 at 0.8M, BUDGET // 3 steps each
OUT = P.RESULTS / "ablation.jsonl"


def family_flags(model: str) -> list[str]:
    """``ar`` or ``D<n>`` -> the train flags (SetDLM with M = 2D)."""
    if model == "ar":
        return ["--family", "ar"]
    d = int(model[1:])
    return ["--family", "setdlm", "--D", str(d), "--M", str(2 * d)]


def base_command(root: Path, size: str) -> list[str]:
    arch = [a if prev != "--hidden-size" else str(SIZES[size]["hidden"]) for prev, a in zip([""] + P.ARCH, P.ARCH)]
    return ["setdlm", "train", "--out", str(root / SIZES[size]["base"]), "--data",
            str(root / "data/arith_all_train.jsonl"), *arch, *P.BASE]


def base_of(root: Path, size: str) -> Path:
    return P.base_of(root) if size == "0.8M" else root / SIZES[size]["base"]


def run_name(size: str, model: str) -> str:
    return REUSED.get((size, model)) or SIZES[size]["prefix"] + ("ar" if model == "ar" else f"setdlm-d{model[1:]}")


def finetune_command(root: Path, size: str, model: str, init: Path | None = None, name: str | None = None,
                     **override: int) -> list[str]:
    """The protocol's fine-tuning recipe; ``override`` replaces flags of it (the curriculum's steps and seed)."""
    recipe = list(P.FINETUNE)
    for flag, value in override.items():
        recipe[recipe.index(f"--{flag}") + 1] = str(value)
    return ["setdlm", "train", "--out", str(root / (name or run_name(size, model))), "--init-from",
            str(init or base_of(root, size)), "--data", str(root / "data/reason_medium_train.jsonl"),
            "--length", str(P.L), *family_flags(model), *recipe]


def curriculum_commands(root: Path) -> list[list[str]]:
    """Each stage from the previous one's weights; its own data-order seed, so the stages see different rows."""
    stage, prev = BUDGET // len(CURRICULUM), None
    cmds = []
    for i, (name, model) in enumerate(zip(CURRICULUM, ("D1", "D2", "D4"))):
        cmds.append(finetune_command(root, "0.8M", model, init=prev, name=name, steps=stage, seed=1 + i))
        prev = root / name
    return cmds


def cells() -> list[tuple[str, str]]:
    return [(size, model) for size in SIZES for model in ("ar", *(f"D{d}" for d in DS))]


def score(root: Path) -> None:
    """Validation accuracy and the bound of every cell (at ``BUDGET``) and of the curriculum's last stage."""
    import torch

    import setdlm
    from setdlm.evaluation.passes import EvalRun
    from setdlm.evaluation.reasoning import reasoning
    from setdlm.data.tasks import reasoning_split

    torch.set_num_threads(1)
    done = {(r["size"], r["model"]) for r in map(json.loads, OUT.read_text().splitlines())} if OUT.exists() else set()
    examples = reasoning_split("validation", N_VAL, level="medium", seed=0)
    points = [(s, m, root / run_name(s, m) / "checkpoints" / f"step-{BUDGET:08d}") for s, m in cells()]
    stage = BUDGET // len(CURRICULUM)
    points.append(("0.8M", "D1>D2>D4", root / CURRICULUM[-1] / "checkpoints" / f"step-{stage:08d}"))
    for size, model, ckpt in points:
        if (size, model) in done or not ckpt.is_dir():
            continue
        net = setdlm.load(str(ckpt))
        r = reasoning(net, examples, run=EvalRun(batch_size=32, seed=0, progress=False))
        bound = json.loads(subprocess.run(["setdlm", "eval", str(ckpt)], check=True, capture_output=True,
                                          text=True).stdout).get("ppl")
        row = {"size": size, "model": model, "params": sum(p.numel() for p in net.backbone.parameters()),
               "steps": BUDGET, "split": "validation", "n": len(examples), "accuracy": r.accuracy,
               "bound_ppl": bound, "checkpoint": str(ckpt.relative_to(root))}
        with open(OUT, "a") as f:
            f.write(json.dumps(row) + "\n")
        print(f"[ablation] {size} {model:9s} acc={r.accuracy:.3f} bound={bound:.3f}", flush=True)


def table(rows: list[dict]) -> str:
    """Markdown: size x (AR, D = 1, 2, 4, 8) accuracy and bound, each D's share of AR, and D = 4 / D = 1."""
    at = {(r["size"], r["model"]): r for r in rows}
    cols = ["ar", *(f"D{d}" for d in DS)]
    head = ["size (parameters)", "AR", *(f"D = {d} (S≤{2 * d})" for d in DS), "D = 4 / D = 1"]
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    for size in SIZES:
        got = [at.get((size, c)) for c in cols]
        if not any(got):
            continue
        params = next(r["params"] for r in got if r)
        ar = at.get((size, "ar"))
        cell = []
        for c, r in zip(cols, got):
            if r is None:
                cell.append("—")
                continue
            share = f", {r['accuracy'] / ar['accuracy']:.2f}x AR" if ar and c != "ar" and ar["accuracy"] else ""
            cell.append(f"{100 * r['accuracy']:.1f}%{share} (≤ {r['bound_ppl']:.3f})")
        d1, d4 = at.get((size, "D1")), at.get((size, "D4"))
        ratio = f"{d4['accuracy'] / d1['accuracy']:.2f}" if d1 and d4 and d1["accuracy"] else "—"
        lines.append(f"| {size} ({params / 1e6:.2f}M) | " + " | ".join(cell) + f" | {ratio} |")
    cur = at.get(("0.8M", "D1>D2>D4"))
    if cur:
        d4 = at.get(("0.8M", "D4"))
        vs = f" (D = 4 for all {BUDGET} steps: {100 * d4['accuracy']:.1f}%, ≤ {d4['bound_ppl']:.3f})" if d4 else ""
        lines += ["", f"Curriculum D = 1 → 2 → 4 ({BUDGET // len(CURRICULUM)} steps each, 0.8M): "
                      f"{100 * cur['accuracy']:.1f}% (≤ {cur['bound_ppl']:.3f}){vs}."]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("stage", choices=["base", "finetune", "score", "table", "commands"])
    ap.add_argument("--root", default="runs/protocol", help="the protocol's run folders (out of the work tree)")
    ap.add_argument("--only", nargs="*", help="finetune: sizes and/or 'curriculum', e.g. 0.2M")
    args = ap.parse_args()
    root = Path(args.root)
    want = lambda key: not args.only or key in args.only  # noqa: E731
    if args.stage == "commands":
        for size in SIZES:
            if size != "0.8M":
                print(shlex.join(base_command(root, size)))
            for _, model in filter(lambda c: c[0] == size, cells()):
                print(shlex.join(finetune_command(root, size, model)))
        for cmd in curriculum_commands(root):
            print(shlex.join(cmd))
    elif args.stage == "base":
        P.write_data(root)
        for size in SIZES:
            if size != "0.8M" and want(size):
                P.run(root, SIZES[size]["base"], base_command(root, size), P.BASE_STEPS)
    elif args.stage == "finetune":
        P.write_data(root)
        for size, model in cells():
            if want(size):
                P.run(root, run_name(size, model), finetune_command(root, size, model), P.FT_STEPS, BUDGET)
        if want("curriculum"):
            for cmd in curriculum_commands(root):
                name = Path(cmd[cmd.index("--out") + 1]).name
                P.run(root, name, cmd, BUDGET // len(CURRICULUM))
    elif args.stage == "score":
        score(root)
    else:
        rows = [json.loads(line) for line in OUT.read_text().splitlines()]
        (P.RESULTS / "ablation.md").write_text(table(rows))
        print(table(rows))


if __name__ == "__main__":
    sys.exit(main())
