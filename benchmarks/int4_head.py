"""What makes int4 faster than int8 on SmolLM2-135M (docs/quantization.md, "int4's head"), side by side in one
process: int8, int4 with a float32 output head (the rule before round 5 session 5) and int4 as shipped (the
head's weights in int8, its rows unquantized), each with the fused layer, decoding the same held-out chat
prompts greedily at batch 1 in rotated order (so a drift of the machine's speed touches all alike).

    PYTHONPATH=src python benchmarks/int4_head.py --threads 2 --prompts 8 --new-tokens 64

Prints tokens/s and ms per forward of each, and the share of positions where int4's two heads agree.
"""

from __future__ import annotations

import argparse
import time

import torch

from setdlm import load
from setdlm.chat import chat_prompt
from setdlm.data.chat_prompts import chat_questions
from setdlm.decoding import generate
from setdlm.formats.quantize import head_names, output_head, replace_layer


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--new-tokens", type=int, default=64)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    models = {name: load("smollm2-135m", quantize=q) for name, q in (
        ("int8", "int8"), ("int4, float32 head", "int4"), ("int4 (int8-weight head)", "int4"))}
    exact = load("smollm2-135m").backbone  # the float32 model: its head, as int4 kept it before
    for name in head_names(exact):
        replace_layer(models["int4, float32 head"].backbone, name, output_head(exact))
    prompts = [chat_prompt(models["int8"].tokenizer, q) for q in chat_questions("test", args.prompts)]
    for m in models.values():
        generate(m, prompts[:1], max_new_tokens=8)  # warm-up (and the fused layer's build)
    totals = {name: [0.0, 0, 0] for name in models}
    tokens: dict[str, list[list[int]]] = {name: [] for name in models}
    names = list(models)
    for i, prompt in enumerate(prompts):
        for name in names[i % len(names):] + names[: i % len(names)]:
            t0 = time.perf_counter()
            out = generate(models[name], [prompt], max_new_tokens=args.new_tokens)
            seconds = time.perf_counter() - t0
            acc = totals[name]
            acc[0], acc[1], acc[2] = acc[0] + seconds, acc[1] + len(out.tokens[0]), acc[2] + out.row_nfe[0]
            tokens[name].append(out.tokens[0])
    print(f"| weights | tokens/s | ms/forward | vs int8 |  ({args.threads} threads, {len(prompts)} prompts, "
          f"{args.new_tokens} new tokens, batch 1)")
    print("|---|---:|---:|---:|")
    base = totals["int8"][1] / totals["int8"][0]
    for name, (s, n, f) in totals.items():
        print(f"| {name} | {n / s:.1f} | {1000 * s / f:.2f} | {n / s / base:.2f}x |")
    a, b = tokens["int4, float32 head"], tokens["int4 (int8-weight head)"]
    same = sum(x == y for u, v in zip(a, b) for x, y in zip(u, v)) / max(1, sum(map(len, a)))
    print(f"int4 heads agree on {100 * same:.1f}% of positions")


if __name__ == "__main__":
    main()
