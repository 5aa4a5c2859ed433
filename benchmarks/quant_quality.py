"""The quality cost of quantized decoding (docs/quantization.md), fp32 vs int8 vs int4 on the same rows.

    PYTHONPATH=src python benchmarks/quant_quality.py --rows 32 --problems 50   # the RESULTS.md table

For every shipped model: the family's likelihood bound (nats/token, docs/method.md §5.1; same rows, same
seed of orders/masks) on the last ``--rows`` rows of the built-in corpus it was trained on (the comparison
is between precisions on identical rows, so overlap with the training data does not matter), and greedy
agreement with fp32 (share of generated positions with the same token, and of rows identical throughout)
on 16-token prompts cut from those rows; for the arith-* models also exact-match accuracy on
``--problems`` generated word problems (level medium, test split, seed 0). For SmolLM2-135M (the GGUF file,
dequantised to fp32, then quantized): next-token NLL and top-1 agreement with fp32 under teacher forcing on
Hamlet (the built-in corpus) in windows of 256 tokens, and greedy agreement on 8 chat prompts.
"""

from __future__ import annotations

import argparse

import torch

from hf_decode_speed import QUESTIONS  # benchmarks/ is the script's folder, hence on sys.path
from setdlm import load
from setdlm.formats import pretrained
from setdlm.decoding import generate

PRECISIONS = ("fp32", "int8", "int4")
CORPUS = {"arith": "reasoning-medium", "shakespeare": "shakespeare"}


def agreement(ref: list[list[int]], got: list[list[int]]) -> tuple[float, float]:
    """(share of positions with equal tokens, share of rows equal throughout)."""
    pos = sum(a == b for x, y in zip(ref, got) for a, b in zip(x, y)) / sum(map(len, ref))
    return pos, sum(x == y for x, y in zip(ref, got)) / len(ref)


def shipped(name: str, args) -> list[str]:
    from setdlm.data import build_dataset, read_source
    from setdlm.evaluation.likelihood import likelihood
    from setdlm.evaluation.passes import EvalRun
    from setdlm.evaluation.reasoning import reasoning
    from setdlm.evaluation import TaskSpec, task_examples

    models = {q: load(name, quantize=None if q == "fp32" else q) for q in PRECISIONS}
    ref = models["fp32"]
    rows = build_dataset(read_source(CORPUS[name.split("-")[0]]), ref.tokenizer, ref.family.length)
    rows = type(rows)(*(t[-args.rows:] for t in (rows.input_ids, rows.attention_mask, rows.context_mask)))
    prompts = [r[:16].tolist() for r in rows.input_ids[: args.prompts]]
    greedy = {q: generate(m, prompts, max_new_tokens=32, ignore_eos=True).tokens for q, m in models.items()}
    if name.startswith("arith"):
        examples, _ = task_examples(TaskSpec("reasoning", n=args.problems, seed=0), [ref])
    out = []
    for q, m in models.items():
        nll = likelihood(m, rows.batches(16), seed=1, progress=False).nats_per_token
        pos, whole = agreement(greedy["fp32"], greedy[q])
        acc = (f"{100 * reasoning(m, examples, run=EvalRun(progress=False)).accuracy:.0f}%"
               if name.startswith("arith") else "-")
        out.append(f"| {name} | {q} | {nll:.4f} | {100 * pos:.1f}% / {100 * whole:.0f}% | {acc} |")
    return out


@torch.no_grad()
def smollm2(args) -> list[str]:
    from setdlm.data import shakespeare_works
    from setdlm.chat import chat_prompt
    from setdlm.masks import causal_mask

    models = {q: load("smollm2-135m", quantize=None if q == "fp32" else q) for q in PRECISIONS}
    tok = models["fp32"].tokenizer
    text = next(w["text"] for w in shakespeare_works() if w["title"] == "Hamlet")
    ids = torch.tensor(tok.encode(text)[: 256 * args.windows]).view(args.windows, 256)
    mask = causal_mask(torch.ones_like(ids, dtype=torch.bool))
    logits = {q: m.backbone(ids, None, mask)[:, :-1, :49152] for q, m in models.items()}  # (W, 255, V)
    prompts = [chat_prompt(tok, q) for q in QUESTIONS]
    greedy = {q: generate(m, prompts, max_new_tokens=32, ignore_eos=True).tokens for q, m in models.items()}
    out = []
    for q in PRECISIONS:
        nll = torch.nn.functional.cross_entropy(logits[q].reshape(-1, 49152), ids[:, 1:].reshape(-1)).item()
        top1 = (logits[q].argmax(-1) == logits["fp32"].argmax(-1)).float().mean().item()
        pos, whole = agreement(greedy["fp32"], greedy[q])
        out.append(f"| smollm2-135m | {q} | {nll:.4f} (top-1 = fp32: {100 * top1:.1f}%) | "
                   f"{100 * pos:.1f}% / {100 * whole:.0f}% | - |")
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=32, help="held-out rows per shipped model")
    p.add_argument("--prompts", type=int, default=16, help="greedy prompts per shipped model")
    p.add_argument("--problems", type=int, default=50, help="word problems per arith model")
    p.add_argument("--windows", type=int, default=4, help="256-token windows of Hamlet for SmolLM2")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--models", nargs="+", default=[*pretrained.available(), "smollm2-135m"])
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    print("| model | weights | NLL or bound (nats/token) | greedy = fp32 (positions / rows) | word problems |")
    print("|---|---|---:|---:|---:|")
    for name in args.models:
        for line in (smollm2(args) if name == "smollm2-135m" else shipped(name, args)):
            print(line, flush=True)


if __name__ == "__main__":
    main()
