"""Where a cached decode step's time goes: ``torch.profiler`` over 10 AR steps of SmolLM2-135M at batch 1
and 16 (32-token cache, 2 threads), self CPU time by op (the "Where the time goes" figures of
benchmarks/RESULTS.md).

    PYTHONPATH=src python benchmarks/profile_step.py --quantize int8
"""

from __future__ import annotations

import argparse

import torch
from torch.profiler import ProfilerActivity, profile

from setdlm import load


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quantize", choices=("int8", "int4"), default=None)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    bb = load("smollm2-135m", quantize=args.quantize).backbone
    for B in (1, 16):
        with torch.inference_mode():
            cache = bb.new_cache(B, 128)
            bb(torch.randint(0, 49000, (B, 32)), cache=cache)  # the prompt
            x, pos = torch.randint(0, 49000, (B, 1)), torch.full((B, 1), 32)
            for _ in range(3):  # warm-up; keep=0: every step sees the same cache
                bb(x, pos, cache=cache, keep=0)
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                for _ in range(10):
                    bb(x, pos, cache=cache, keep=0)
        ops = prof.key_averages()
        total = sum(e.self_cpu_time_total for e in ops)
        print(f"batch {B}: {total / 10 / 1000:.1f} ms/step (self CPU time of all ops)")
        for e in sorted(ops, key=lambda e: -e.self_cpu_time_total)[:8]:
            print(f"  {e.key:50s} {100 * e.self_cpu_time_total / total:5.1f}%  calls/step {e.count // 10}")


if __name__ == "__main__":
    main()
