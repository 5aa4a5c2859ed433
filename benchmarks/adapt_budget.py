"""What adapting a pretrained model into a SetDLM / BD3LM costs: one training step measured here, the
paper's GSM8K budget estimated from FLOPs.

    PYTHONPATH=src python benchmarks/adapt_budget.py                      # the RESULTS.md / docs table

Measured: seconds per optimizer step of the real training loop (``setdlm.training.train``, ``--init-from
smollm2-135m``) on this machine at a small size (``--length``, ``--batch-size``), fp32, with and without
gradient checkpointing; the median of the steps after the first. The achieved FLOP/s follow from the
FLOP count of a step (:func:`step_flops`). Estimated, not measured: the same count for the paper's GSM8K
setting (L = 1024, batch 16, 75k steps; docs/pretrained.md) and the hours on a GPU at an assumed
sustained rate (``--gpu-tflops``: a 135M model with d = 576 keeps a large GPU far from its peak).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile

import torch

from setdlm.training import TrainConfig, knobs_for, train


def step_flops(n_params: int, n_layers: int, d: int, rows: int, length: int, two_stream: bool,
               checkpointing: bool) -> float:
    """FLOPs of one training step: 6·N per position for the weights (forward 2, backward 4) plus dense
    attention (4·T²·d per layer and row forward, ×3 with the backward, the boolean mask saves nothing);
    BD3LM and SetDLM feed two streams (T = 2L); checkpointing adds one forward (×4/3)."""
    T = 2 * length if two_stream else length
    dense = 6 * n_params * rows * T
    attention = 3 * 4 * T * T * d * n_layers * rows
    return (dense + attention) * (4 / 3 if checkpointing else 1)


def measure(family: str, length: int, batch: int, steps: int, checkpointing: bool) -> float:
    """Median seconds per optimizer step after the first."""
    with tempfile.TemporaryDirectory() as out:
        cfg = TrainConfig(out=out, init_from="smollm2-135m", family=family, **knobs_for(family, D=4, M=8, block_size=4),
                          data="reasoning-medium", length=length, batch_size=batch, steps=steps + 1, lr=1e-5,
                          warmup=1, log_every=1, eval_every=0, save_every=0, eval_max=4, eval_batch_size=4,
                          grad_checkpointing=checkpointing)
        res = train(cfg)
    rates = [r["tokens_per_s"] for r in res.history if "tokens_per_s" in r][1:]
    return batch * length / statistics.median(rates)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--length", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=2)
    ap.add_argument("--steps", type=int, default=2, help="timed steps (after one untimed)")
    ap.add_argument("--families", default="setdlm", help="comma-separated; bd3lm has the same FLOPs (two streams)")
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--gpu-tflops", type=float, nargs="+", default=[100.0, 250.0],
                    help="assumed sustained bf16 TFLOP/s of the GPU (e.g. ~100 on an A100, ~250 on an H100)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from setdlm import load

    hf = load("smollm2-135m").backbone.hf
    n, layers, d = sum(p.numel() for p in hf.parameters()), hf.config.num_hidden_layers, hf.config.hidden_size
    load_before = os.getloadavg()[0]
    print(f"SmolLM2-135M ({n / 1e6:.1f}M parameters), CPU fp32, {args.threads} threads, L={args.length}, "
          f"batch {args.batch_size}, median of {args.steps} steps after one; load average before "
          f"{load_before:.1f}\n")
    print("| family | grad checkpointing | s / step (measured) | FLOPs / step | achieved GFLOP/s |")
    print("|---|---|---:|---:|---:|")
    for family in args.families.split(","):
        for ckpt in (False, True):
            s = measure(family, args.length, args.batch_size, args.steps, ckpt)
            f = step_flops(n, layers, d, args.batch_size, args.length, True, ckpt)
            print(f"| {family} | {'on' if ckpt else 'off'} | {s:.1f} | {f:.2e} | {f / s / 1e9:.1f} |", flush=True)
    print(f"\nload average after {os.getloadavg()[0]:.1f}")
    steps, rows, L = 75_000, 16, 1024
    f = step_flops(n, layers, d, rows, L, True, True)
    print(f"\nPaper GSM8K setting (L={L}, batch {rows}, {steps:,} steps, two streams, grad checkpointing): "
          f"{f:.2e} FLOPs / step, {f * steps:.2e} in all, {steps * rows * L / 1e9:.2f}B data tokens")
    for t in args.gpu_tflops:
        print(f"- at {t:.0f} TFLOP/s sustained: {f / (t * 1e12):.2f} s / step, {f * steps / (t * 1e12) / 3600:.1f} GPU hours")


if __name__ == "__main__":
    main()
