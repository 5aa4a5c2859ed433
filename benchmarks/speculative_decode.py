"""Lossless self-speculative SetDLM decoding against the left-to-right decode it reproduces (w = 1), the
default window decode (w = D) and the AR model, side by side on the shipped models (docs/decoding.md,
"Self-speculative decoding").

    PYTHONPATH=src python benchmarks/speculative_decode.py                 # the RESULTS.md table
    PYTHONPATH=src python benchmarks/speculative_decode.py --n 8 --warmup 2   # a smoke run

Tasks: ``arith`` (the shipped word-problem models; the first ``--n`` test problems of the built-in level
``medium``, decoded until EOS) and ``shakespeare`` (the shipped Shakespeare models; 64 new tokens after the
first 16 tokens of each held-out infilling window's prefix, EOS ignored, as the study's LM speed runs).
Greedy, batch 1, float32, one torch thread. Every prompt is decoded by every configuration in turn (the
order rotated each prompt), so that a drift of the shared machine's speed hits all alike; speed is tokens
per CPU-second of the main thread (``time.thread_time``), the first ``--warmup`` prompts untimed. Reported:
forwards per generated token, tokens per forward (for speculation: the mean accepted length), tokens/CPU-s
(mean ± std over prompts), and whether every speculative output equals the w = 1 output token for token.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import setdlm
from setdlm.data.prompt import encode_prompt
from setdlm.decoding import generate
from setdlm.evaluation.passes import prompt_ids
from setdlm.evaluation import TaskSpec, task_examples

MODELS = {"arith": ("arith-setdlm-smax8", "arith-ar"), "shakespeare": ("shakespeare-setdlm-smax8", "shakespeare-ar")}


def prompts(task: str, model, n: int) -> tuple[list[list[int]], dict]:
    """Token-id prompts of the task and the generate settings they are decoded with."""
    if task == "arith":
        examples, _ = task_examples(TaskSpec("reasoning", n=n), [model])
        return [prompt_ids(model, e) for e in examples], {"max_new_tokens": 96}  # at most what the prompt leaves
    examples, _ = task_examples(TaskSpec("infill"), [model])
    return [encode_prompt(model.tokenizer, e.prefix)[:16] for e in examples[:n]], {"max_new_tokens": 64,
                                                                                      "ignore_eos": True}


def configs(D: int) -> list[tuple[str, str, dict]]:
    """(label, which model, settings) of every configuration."""
    return [("SetDLM w=1 (left to right)", "setdlm", dict(window=1)),
            (f"SetDLM w=D={D} (window, τ off)", "setdlm", dict(window=D)),
            ("SetDLM speculative w=2", "setdlm", dict(window=2, speculate=True)),
            (f"SetDLM speculative w=D={D}", "setdlm", dict(window=D, speculate=True)),
            ("SetDLM speculative w=8", "setdlm", dict(window=8, speculate=True)),
            ("AR", "ar", {})]


def run(task: str, n: int, warmup: int) -> list[dict]:
    sd, ar = (setdlm.load(name) for name in MODELS[task])
    models = {"setdlm": sd, "ar": ar}
    items, kw = prompts(task, sd, n)
    cfgs = configs(sd.family.D)
    rows = [dict(label=label, forwards=0, tokens=0, rates=[], outputs=[]) for label, _, _ in cfgs]
    for i, p in enumerate(items):
        for j in [(i + k) % len(cfgs) for k in range(len(cfgs))]:  # rotated order
            label, which, settings = cfgs[j]
            c0 = time.thread_time()
            budget = min(kw["max_new_tokens"], sd.family.length - len(p))
            out = generate(models[which], [p], **{**kw, "max_new_tokens": budget}, **settings)
            cpu = time.thread_time() - c0
            r = rows[j]
            r["forwards"] += out.nfe
            r["tokens"] += sum(out.row_committed)
            r["outputs"].append(out.tokens[0])
            if i >= warmup:
                r["rates"].append(len(out.tokens[0]) / cpu)
    ref = rows[0]["outputs"]
    for r, (_, _, settings) in zip(rows, cfgs):
        r["same_as_w1"] = (sum(a == b for a, b in zip(r["outputs"], ref)), len(ref)) if settings.get("speculate") else None
    return rows


def table(task: str, rows: list[dict]) -> str:
    out = [f"| {task} | forwards/token | tokens/forward | tokens/CPU-s | vs w=1 | vs AR | output = w=1 |",
           "|---|---:|---:|---:|---:|---:|---|"]
    w1, ar = statistics.mean(rows[0]["rates"]), statistics.mean(rows[-1]["rates"])
    for r in rows:
        rate = statistics.mean(r["rates"])
        same = "–" if r["same_as_w1"] is None else f"{r['same_as_w1'][0]}/{r['same_as_w1'][1]}"
        out.append(f"| {r['label']} | {r['forwards'] / r['tokens']:.3f} | {r['tokens'] / r['forwards']:.2f} | "
                   f"{rate:.0f} ± {statistics.stdev(r['rates']):.0f} | {rate / w1:.2f}x | {rate / ar:.2f}x | {same} |")
    return "\n".join(out) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=40, help="prompts per task (default 40)")
    ap.add_argument("--warmup", type=int, default=5, help="prompts decoded but not timed (default 5)")
    ap.add_argument("--tasks", default="arith,shakespeare")
    args = ap.parse_args()
    torch.set_num_threads(1)
    for task in args.tasks.split(","):
        print(table(task, run(task, args.n, args.warmup)))


if __name__ == "__main__":
    main()
