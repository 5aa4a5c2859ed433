"""The fused int8 layer against the Python layer, side by side in one process (docs/quantization.md, "The fused
int8 layer"): SmolLM2-135M int8 with its drafter, each held-out chat prompt decoded greedily by the base's AR
decode and by the drafted decode (``speculate="next_token"``), once with the fused layers and once without, in
the order fused, Python, Python, fused per prompt (so a drift of the machine's speed touches both alike).

    PYTHONPATH=src python benchmarks/fused_layer.py --threads 2 --prompts 8 --new-tokens 64

Prints tokens/s and ms per base forward (prefill included) of each configuration, and checks that the fused and
Python decodes give the same tokens.
"""

from __future__ import annotations

import argparse
import time

import torch

from setdlm import load
from setdlm.chat import chat_prompt
from setdlm.data.chat_prompts import chat_questions
from setdlm.decoding import generate


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--window", type=int, default=3)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    model = load("smollm2-135m-draft", quantize="int8")
    base = model.backbone.base
    fused_layers = base.fused_layers
    if fused_layers is None:
        raise SystemExit("the fused int8 layer is not available here (SETDLM_FUSED=0, or it could not be built)")
    prompts = [chat_prompt(model.tokenizer, q) for q in chat_questions("test", args.prompts)]
    generate(model, prompts[:1], max_new_tokens=8, speculate="next_token")  # warm-up
    totals: dict[tuple[str, str], list[float]] = {}
    tokens: dict[tuple[str, str, int], list[int]] = {}
    for i, prompt in enumerate(prompts):
        for layer in ("fused", "python", "python", "fused"):
            base.fused_layers = fused_layers if layer == "fused" else None
            for decode, kw in (("AR", {}), ("drafted", {"speculate": "next_token", "window": args.window})):
                t0 = time.perf_counter()
                out = generate(model, [prompt], max_new_tokens=args.new_tokens, **kw)
                seconds = time.perf_counter() - t0
                acc = totals.setdefault((layer, decode), [0.0, 0, 0])
                acc[0], acc[1], acc[2] = acc[0] + seconds, acc[1] + len(out.tokens[0]), acc[2] + out.row_nfe[0]
                tokens.setdefault((layer, decode, i), out.tokens[0])
    base.fused_layers = fused_layers
    same = all(tokens["fused", d, i] == tokens["python", d, i] for d in ("AR", "drafted") for i in range(len(prompts)))
    print(f"| layer | decode | tokens/s | ms/forward | tokens/forward |  ({args.threads} threads, {len(prompts)} prompts, "
          f"{args.new_tokens} new tokens, each decoded twice)")
    print("|---|---|---:|---:|---:|")
    for (layer, decode), (s, n, f) in sorted(totals.items()):
        print(f"| {layer} | {decode} | {n / s:.1f} | {1000 * s / f:.1f} | {n / f:.2f} |")
    print(f"fused tokens == Python tokens: {same}")


if __name__ == "__main__":
    main()
