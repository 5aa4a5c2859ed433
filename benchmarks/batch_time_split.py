"""Where a batch's time goes: the word-problem models decoded in batches of ``--batch`` (the frontier's protocol,
benchmarks/speed_at_accuracy.py), each pass split into its decode steps (the decoder's ``step``: the forward and
the commit) and the rest (the prompts' prefill, the state's setup, dropping finished rows), in CPU time of this
process; a step's cost fitted as ``a + b · rows`` over the steps (rows leave a batch as they finish), and the
batch's occupancy (row-steps over ``batch`` × steps). benchmarks/RESULTS.md, "Where batch 32 goes".

    PYTHONPATH=src python benchmarks/batch_time_split.py --n 256 --batch 32

Modes: ``arith-ar-long`` (AR) and ``arith-setdlm-smax8-ar`` with ``speculate="next_token"`` at ``--windows``, each in
every precision of ``--dtypes`` (default float32); every mode decodes the same problems (the first ``--n`` of the
``medium`` test split, seed 0), one after the other, after a warm-up batch.
"""

from __future__ import annotations

import argparse
import importlib
import time

import numpy as np
import torch

import setdlm
from setdlm.data.tasks import reasoning_split
from setdlm.decoding import generate
from setdlm.evaluation.passes import prompt_ids


def split(name: str, knobs: dict, module: str, problems, batch: int, dtype: str = "float32") -> dict:
    """One mode's pass over the problems, batch by batch: total and step CPU seconds, the per-step fit."""
    decoder = importlib.import_module(module)
    model = setdlm.load(name, dtype=dtype)
    prompts = [prompt_ids(model, e) for e in problems]
    budget = model.family.length - max(map(len, prompts))
    steps: list[tuple[int, float]] = []  # (rows, CPU seconds) of every step
    original = decoder.step

    def timed(backbone, st):
        rows, t0 = st.batch, time.process_time()
        original(backbone, st)
        steps.append((rows, time.process_time() - t0))

    decoder.step = timed
    try:
        generate(model, prompts[:batch], max_new_tokens=budget, **knobs)  # warm-up
        steps.clear()
        tokens = row_steps = forwards = 0
        t0 = time.process_time()
        for lo in range(0, len(prompts), batch):
            out = generate(model, prompts[lo:lo + batch], max_new_tokens=budget, **knobs)
            tokens += sum(len(t) for t in out.tokens)
            row_steps += sum(out.row_nfe)
            forwards += out.nfe
        total = time.process_time() - t0
    finally:
        decoder.step = original
    rows = np.array([r for r, _ in steps], dtype=float)
    secs = np.array([s for _, s in steps])
    (a, b), *_ = np.linalg.lstsq(np.stack([np.ones_like(rows), rows], 1), secs, rcond=None)
    step_s = float(secs.sum())
    return {"tokens": tokens, "cpu_s": total, "steps_cpu_s": step_s, "rest_cpu_s": total - step_s,
            "tokens_per_cpu_s": tokens / total, "forwards": forwards, "tokens_per_row_step": tokens / row_steps,
            "occupancy": row_steps / (batch * forwards), "step_ms_fixed": 1e3 * a, "step_ms_per_row": 1e3 * b}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=256)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--windows", type=int, nargs="+", default=[5, 6])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--dtypes", nargs="+", default=["float32"], help="precisions each mode runs in")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    problems = reasoning_split("test", args.n, level="medium", seed=0)
    modes = [("AR", "arith-ar-long", {}, "setdlm.decoding.ar")]
    modes += [(f"next_token w={w}", "arith-setdlm-smax8-ar", {"speculate": "next_token", "window": w},
               "setdlm.decoding.speculative_next_token") for w in args.windows]
    modes = [(label if dt == "float32" else f"{label} {dt}", name, knobs, module, dt)
             for dt in args.dtypes for label, name, knobs, module in modes]
    print(f"{args.n} problems in batches of {args.batch}, {args.threads} threads, CPU seconds of this process")
    print("| mode | tokens/CPU-s | × AR | steps | rest (prefill, setup, finished rows) | rest share | "
          "forwards | tokens/row-step | occupancy | step ms = a + b·rows |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    ar = None
    for label, name, knobs, module, dtype in modes:
        r = split(name, knobs, module, problems, args.batch, dtype)
        ar = ar or r
        print(f"| {label} | {r['tokens_per_cpu_s']:.0f} | {r['tokens_per_cpu_s'] / ar['tokens_per_cpu_s']:.2f}x | "
              f"{r['steps_cpu_s']:.2f} s | {r['rest_cpu_s']:.2f} s | {r['rest_cpu_s'] / r['cpu_s']:.0%} | "
              f"{r['forwards']} | {r['tokens_per_row_step']:.2f} | {r['occupancy']:.2f} | "
              f"{r['step_ms_fixed']:.1f} + {r['step_ms_per_row']:.3f}·rows |", flush=True)


if __name__ == "__main__":
    main()
