"""Loss weighting across SetDLM conditionals: does moving loss mass to the in-order conditionals help at D = 4?

``python benchmarks/study/weighting.py {finetune,score,commands} [--root DIR] [--lam 0.25]``

The SetDLM loss (paper §3, Eq. 6; docs/method.md §2.5) is a plain mean of cross-entropies over every target of a
sampled reveal order. At D = 4 most targets are *gapped*: some position to their left is still masked when they
are predicted. The error analysis (benchmarks/RESULTS.md, "Why SetDLM trails AR at this size") found the decoder
commits mostly in order and the full-left-context conditional itself weaker than AR's; one hypothesis of issue 22
is that the uniform weighting spends the small model's capacity on gapped conditionals the decoder rarely uses.

This experiment reweights each target's cross-entropy by ``1`` when its whole left context is revealed (gap
``g = 0``) and by ``lam`` otherwise (a per-row weighted mean), fine-tunes SetDLM S<=8 (D = 4, M = 8) from the
protocol's base with the protocol's recipe for the ablation's budget (750 steps), and scores it exactly as the
ablation scores its cells (300 **validation** problems, greedy, τ off, window D; the held-out bound is the usual
unweighted one), and at threshold 0.9 for its tokens per forward. ``--lam 1`` scores the control, the ablation's
D = 4 cell (the uniform loss; the protocol's SetDLM S<=8 run at 750 steps). The weighted loss is not
part of the library: this script swaps the ``setdlm`` entry of ``setdlm.objectives.OBJECTIVES`` for the training
process it runs, so the checkpoint is an ordinary SetDLM that loads and decodes as any other.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import torch
from torch import Tensor

sys.path.insert(0, str(Path(__file__).parent))
import ablation as A  # noqa: E402
import protocol as P  # noqa: E402

OUT = P.RESULTS / "weighting.jsonl"


def gaps(order: Tensor, targets: Tensor) -> Tensor:
    """(B, L) number of targets left of each position that are revealed after it (still masked when it is
    predicted, singleton sets). ``order`` (B, L): original position of each reveal rank; ``targets`` (B, L)."""
    from setdlm.schedules import invert_order

    rank = invert_order(order)  # (B, L)
    L = order.shape[1]
    left = torch.ones(L, L, dtype=torch.bool, device=order.device).tril(-1)  # [i, j]: j < i
    later = rank[:, None, :] > rank[:, :, None]  # (B, L, L) [b, i, j]: j revealed after i
    return (left & later & targets[:, None, :]).sum(-1)  # (B, L)


def weighted_setdlm_loss(model, batch, mask_token_id: int, schedule, *, lam: float, generator=None):
    """The SetDLM loss with weight 1 on in-order targets (g = 0) and ``lam`` on gapped ones; per-row weighted
    mean, then mean over rows. ``lam = 1`` is the library's loss exactly."""
    from setdlm.objectives import LossOutput, setdlm_loss

    out = setdlm_loss(model, batch, mask_token_id, schedule, generator=generator)
    w = torch.where(gaps(out.order, batch.targets) == 0, 1.0, lam).to(out.nll.dtype) * out.mask  # (B, L)
    per_row = (out.nll * w).sum(-1) / w.sum(-1).clamp(min=1e-12)
    return LossOutput(per_row.mean(), out.nll, out.mask, out.order)


def install(lam: float) -> None:
    """Train SetDLM with the weighted loss in this process (evaluation keeps the unweighted bound)."""
    from setdlm import objectives

    plain = objectives.OBJECTIVES["setdlm"]

    def _weighted(model, family, batch, train, *, generator, antithetic):
        if not train:
            return plain(model, family, batch, train, generator=generator, antithetic=antithetic)
        return weighted_setdlm_loss(model, batch, family.mask_token_id, family.schedule(), lam=lam,
                                    generator=generator)

    objectives.OBJECTIVES["setdlm"] = _weighted


def run_name(lam: float) -> str:
    """``lam = 1`` (the uniform loss) is the ablation's D = 4 cell: the protocol's SetDLM S<=8 run, same recipe."""
    return A.run_name("0.8M", "D4") if lam == 1 else f"ft-setdlm-d4-inorder{lam:g}"


def finetune_argv(root: Path, lam: float, steps: int = A.BUDGET) -> list[str]:
    """The ablation's D = 4 cell (the protocol's recipe, ``steps``: a constant rate after warm-up, so a longer
    budget resumes the same run), into its own run folder."""
    cmd = A.finetune_command(root, "0.8M", "D4", name=run_name(lam), steps=steps)
    return cmd[2:]  # without "setdlm train"


def finetune(root: Path, lam: float, steps: int = A.BUDGET) -> None:
    from setdlm.cli.train import main as train_main

    out = root / run_name(lam)
    if (out / "checkpoints" / f"step-{steps:08d}").is_dir():
        return
    install(lam)
    argv = finetune_argv(root, lam, steps)
    train_main(argv + (["--resume"] if (out / "latest").exists() else []))


def score(root: Path, lam: float, steps: int = A.BUDGET) -> None:
    """Validation accuracy, threshold off and 0.9 (tokens per forward), and the unweighted bound."""
    import setdlm
    from setdlm.evaluation.passes import EvalRun
    from setdlm.evaluation.reasoning import reasoning
    from setdlm.data.tasks import reasoning_split

    torch.set_num_threads(1)
    ckpt = root / run_name(lam) / "checkpoints" / f"step-{steps:08d}"
    net = setdlm.load(str(ckpt))
    examples = reasoning_split("validation", A.N_VAL, level="medium", seed=0)
    bound = json.loads(subprocess.run(["setdlm", "eval", str(ckpt)], check=True, capture_output=True,
                                      text=True).stdout).get("ppl")  # unweighted, as the ablation's cells
    row = {"model": "D4", "lam": lam, "steps": steps, "split": "validation", "n": len(examples),
           "bound_ppl": bound, "checkpoint": str(ckpt.relative_to(root))}
    for tau in (None, 0.9):
        r = reasoning(net, examples, run=EvalRun(batch_size=32, seed=0, progress=False), threshold=tau)
        key = "tau_off" if tau is None else "tau_0.9"
        row[f"accuracy_{key}"], row[f"tokens_per_step_{key}"] = r.accuracy, r.run.tokens_per_step
    with open(OUT, "a") as f:
        f.write(json.dumps(row) + "\n")
    print(f"[weighting] lam={lam:g} acc={row['accuracy_tau_off']:.3f} (tau 0.9: {row['accuracy_tau_0.9']:.3f} at "
          f"{row['tokens_per_step_tau_0.9']:.2f} tokens/step) bound={bound:.3f}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("stage", choices=["finetune", "score", "commands"])
    ap.add_argument("--root", default="runs/protocol", help="the protocol's run folders (out of the work tree)")
    ap.add_argument("--lam", type=float, default=0.25, help="weight of a gapped target's cross-entropy")
    ap.add_argument("--steps", type=int, default=A.BUDGET, help="fine-tuning steps (a longer budget resumes the run)")
    args = ap.parse_args()
    root = Path(args.root)
    if args.stage == "commands":
        import shlex
        print("python benchmarks/study/weighting.py finetune --lam", args.lam, "# = setdlm train",
              shlex.join(finetune_argv(root, args.lam, args.steps)), "with the weighted loss")
    elif args.stage == "finetune":
        finetune(root, args.lam, args.steps)
    else:
        score(root, args.lam, args.steps)


if __name__ == "__main__":
    main()
