"""Training throughput (tokens/s) of each family at a preset, fp32 and bf16, through the real training loop.

    PYTHONPATH=src python benchmarks/train_speed.py --preset small --steps 12 --warmup 3

Each (family, precision) trains ``warmup + steps`` optimizer steps of ``setdlm.training.train`` on the built-in
Shakespeare corpus, logging every step; the figure is the median of the per-step tokens/s after the
warm-up. Tokens are data tokens (B·L per step, padding excluded): SetDLM and BD3LM run two streams (2L
positions) per row, so they cost about twice the compute per data token. Prints a Markdown table and the
machine's load average, since other work on the cores changes the numbers.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile

import torch

from setdlm.resources import native_bf16
from setdlm.training import TrainConfig, train


def measure(preset: str, family: str, bf16: bool, steps: int, warmup: int) -> float:
    with tempfile.TemporaryDirectory() as out:
        cfg = TrainConfig.from_preset(preset, out=out, family=family, bf16=bf16, steps=warmup + steps, log_every=1,
                                      eval_every=0, save_every=0, eval_max=8)
        res = train(cfg)
    rates = [r["tokens_per_s"] for r in res.history if "tokens_per_s" in r][warmup:]
    return statistics.median(rates)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="small")
    ap.add_argument("--families", default="ar,mdlm,bd3lm,setdlm")
    ap.add_argument("--steps", type=int, default=12, help="timed steps")
    ap.add_argument("--warmup", type=int, default=3, help="untimed first steps")
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    load_before = os.getloadavg()
    rows = []
    for family in args.families.split(","):
        fp32 = measure(args.preset, family, False, args.steps, args.warmup)
        bf16 = measure(args.preset, family, True, args.steps, args.warmup)
        rows.append((family, fp32, bf16))
        print(f"{family}: fp32 {fp32:,.0f} tokens/s, bf16 {bf16:,.0f} tokens/s", file=sys.stderr)
    load_after = os.getloadavg()
    cfg = TrainConfig.from_preset(args.preset, out="-")
    native = native_bf16(torch.device("cpu"))
    print(f"\npreset {args.preset}: d={cfg.hidden_size}, {cfg.n_layers} layers, {cfg.n_heads} heads, L={cfg.length}, "
          f"batch {cfg.batch_size}, tokenizer {cfg.tokenizer} {cfg.vocab_size}; torch {torch.__version__}, "
          f"{args.threads} threads, CPU capability {torch.backends.cpu.get_cpu_capability()}, native bf16 "
          f"{'yes' if native else 'no (AVX512-BF16/AMX absent: bf16 is emulated)'}; "
          f"load average before {load_before[0]:.2f}, after {load_after[0]:.2f}\n")
    print("| family | fp32 tokens/s | bf16 tokens/s | bf16 speed-up |")
    print("|---|---:|---:|---:|")
    for family, a, b in rows:
        print(f"| {family} | {a:,.0f} | {b:,.0f} | {b / a:.2f}x |")


if __name__ == "__main__":
    main()
