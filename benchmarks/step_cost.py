"""A SmolLM2-135M int8 decode step, timed for two (or more) source trees side by side: the per-step cost of the
base (docs/quantization.md, "Per-step overhead") before and after a change, on one machine in one run.

    git worktree add /tmp/before 2863115
    PYTHONPATH=src python benchmarks/step_cost.py --trees before=/tmp/before/src after=src --threads 1 2

Each (tree, thread count) runs in a subprocess of its own, in alternation, ``--rounds`` times; each run decodes the
same held-out chat prompts greedily (``--new-tokens`` each, batch 1) with the base's AR decode and with the shipped
drafter (``speculate="next_token"``, ``--window``), and reports ms per forward (wall time of the ``generate`` calls,
prefill included, over the decode steps: base forwards after the prefill) and tokens/s; the best round of each is kept.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

CHILD = r"""
import json, sys, time, torch
from setdlm import load
from setdlm.chat import chat_prompt
from setdlm.data.chat_prompts import chat_questions
from setdlm.decoding import generate
threads, n, new, window, profile = (int(a) for a in sys.argv[1:6])
torch.set_num_threads(threads)
base, drafted = load("smollm2-135m", quantize="int8"), load("smollm2-135m-draft", quantize="int8")
prompts = [chat_prompt(base.tokenizer, q) for q in chat_questions("test", n)]
def run(model, **kw):
    tokens = forwards = 0
    t0 = time.perf_counter()
    for p in prompts:
        out = generate(model, [p], max_new_tokens=new, **kw)
        tokens, forwards = tokens + len(out.tokens[0]), forwards + out.row_nfe[0]
    return time.perf_counter() - t0, tokens, forwards
generate(base, prompts[:1], max_new_tokens=8); generate(drafted, prompts[:1], max_new_tokens=8, speculate="next_token")
out = {}
for name, model, kw in (("AR", base, {}), ("drafted", drafted, {"speculate": "next_token", "window": window})):
    s, t, f = run(model, **kw)
    out[name] = {"ms_per_forward": 1000 * s / f, "tokens_per_s": t / s, "tokens_per_forward": t / f}
if profile:  # where a drafted step's time goes: the int8 products, attention, the drafter's pass, everything else
    from torch.profiler import profile as prof, record_function
    inner = drafted.backbone.draft
    def timed_draft(*a, **k):
        with record_function("drafter pass"):
            return inner(*a, **k)
    drafted.backbone.draft = timed_draft
    with prof() as pr:
        s, t, f = run(drafted, speculate="next_token", window=window)
    ev = pr.key_averages()
    total = sum(e.self_cpu_time_total for e in ev)
    pick = lambda *keys: sum(e.self_cpu_time_total for e in ev if any(k in e.key for k in keys))
    draft = next((e.cpu_time_total for e in ev if e.key == "drafter pass"), 0.0)
    out["profile"] = {"ms_per_forward": 1000 * s / f, "ops_per_forward": sum(e.count for e in ev) / f,
                      "int8 products": pick("quantized::") / total, "attention": pick("scaled_dot_product") / total,
                      "drafter pass (all its ops)": draft / total}
print(json.dumps(out))
"""


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trees", nargs="+", required=True, help="NAME=SRC_DIR (the folder holding the setdlm package)")
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--prompts", type=int, default=6)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--window", type=int, default=3)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--profile", action="store_true", help="also profile the last tree's drafted decode (shares of a step)")
    args = p.parse_args(argv)
    trees = dict(t.split("=", 1) for t in args.trees)
    best: dict = {}
    for r in range(args.rounds):
        for threads in args.threads:
            for name, src in trees.items():
                env = {**os.environ, "PYTHONPATH": os.path.abspath(src), "OMP_NUM_THREADS": str(threads)}
                prof = int(args.profile and r == 0 and name == list(trees)[-1])
                done = subprocess.run([sys.executable, "-c", CHILD, str(threads), str(args.prompts), str(args.new_tokens),
                                       str(args.window), str(prof)], env=env, capture_output=True, text=True, check=True)
                res = json.loads(done.stdout.strip().splitlines()[-1])
                shares = res.pop("profile", None)
                print(f"round {r}, {threads} threads, {name}: {res}", flush=True)
                if shares:
                    print(f"  profile ({threads} threads, {name}, drafted): {shares}", flush=True)
                for kind, v in res.items():
                    key = (threads, kind, name)
                    if key not in best or v["ms_per_forward"] < best[key]["ms_per_forward"]:
                        best[key] = v
    names = list(trees)
    print(f"\n| threads | decode | {' | '.join(f'{n} ms/forward' for n in names)} | {' | '.join(f'{n} tokens/s' for n in names)} "
          f"| tokens/forward |")
    print("|---:|---|" + "---:|" * (2 * len(names) + 1))
    for threads in args.threads:
        for kind in ("AR", "drafted"):
            row = [best[threads, kind, n] for n in names]
            print(f"| {threads} | {kind} | " + " | ".join(f"{v['ms_per_forward']:.1f}" for v in row) + " | "
                  + " | ".join(f"{v['tokens_per_s']:.1f}" for v in row) + f" | {row[-1]['tokens_per_forward']:.2f} |")


if __name__ == "__main__":
    main()
