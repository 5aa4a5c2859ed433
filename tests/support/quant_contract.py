"""The quantized exactness contract on SmolLM2-135M, run as a script so that a test can run it under forced
CPU levels (``ATEN_CPU_CAPABILITY``, ``ONEDNN_MAX_CPU_ISA``, ``FBGEMM_ENABLE_INSTRUCTIONS``, a quantized
engine): for each ``quantize=`` named on the command line, each row of a padded ragged batch gets the hidden
states it gets alone bit for bit and logits within TOL (exactly the same where the head is quantized: the test
asserts that), and SetDLM's cached steps equal the from-scratch forward (tests/test_quantize_isa.py).

    python tests/support/quant_contract.py [--engine qnnpack] [--batch-only] [--drafted] int8 int4 gguf

``--drafted``: also the shipped drafter (smollm2-135m-draft) at that quantization: its drafted greedy decode of the
ragged batch equals the base's AR decode token for token (docs/drafter.md).

Prints one line per check and exits 1 on the first broken one."""

import argparse
import sys
from pathlib import Path

import torch

sys.path[0] = str(Path(__file__).resolve().parents[1])  # tests/ (the support package), not this folder

from setdlm import FamilyConfig, Model, load  # noqa: E402
from setdlm.chat import chat_prompt  # noqa: E402
from setdlm.decoding import generate  # noqa: E402
from setdlm.formats.quantize import output_head  # noqa: E402
from setdlm.masks import causal_mask  # noqa: E402

from support import assert_setdlm_steps_exact, recorded  # noqa: E402

NAME, TOL = "smollm2-135m", 5e-4


def prompts_of(tok) -> list[list[int]]:
    """The prompts of tests/test_smollm2.py: a chat question, text after BOS, code without BOS."""
    return [chat_prompt(tok, "What is the capital of France?"), [tok.bos_token_id] + tok.encode("Once upon a time"),
            tok.encode("def fibonacci(n):")]


def batch_vs_alone(q, prompts) -> tuple[float, float]:
    """Largest difference between a row of the padded batch and the same row alone: of the hidden states the
    output head reads (every quantized layer and the float parts between them), and of the logits."""
    seen = []  # the head's input of each forward
    hook = output_head(q.backbone).register_forward_hook(lambda m, inp, out: seen.append(inp[0]))
    width = max(map(len, prompts))
    ids = torch.tensor([p + [0] * (width - len(p)) for p in prompts])
    real = torch.tensor([[True] * len(p) + [False] * (width - len(p)) for p in prompts])
    batch = q.backbone(ids, None, causal_mask(real))  # (3, width, V)
    hidden = seen[-1].reshape(len(prompts), width, -1)  # (3, width, d)
    worst_hidden = worst = 0.0
    for r, p in enumerate(prompts):
        alone = q.backbone(torch.tensor([p]), None, causal_mask(torch.ones(1, len(p), dtype=torch.bool)))[0]
        worst_hidden = max(worst_hidden, (hidden[r, : len(p)] - seen[-1].reshape(len(p), -1)).abs().max().item())
        worst = max(worst, (batch[r, : len(p)] - alone).abs().max().item())
    hook.remove()
    return worst_hidden, worst


def cache_exact(q, prompts) -> None:
    """SetDLM (D = 2) on the quantized backbone, ragged batch: the first row's first two steps equal the
    from-scratch forward (AssertionError otherwise)."""
    mask_id = q.family.mask_token_id
    model, rec = recorded(Model(q.backbone, FamilyConfig("setdlm", 64, mask_id, D=2), q.tokenizer))
    rows = prompts[1:]
    out = generate(model, rows, max_new_tokens=3, ignore_eos=True, trace=True)
    assert_setdlm_steps_exact(model.backbone.inner, rec, out, len(rows[0]), 0, tol=TOL, mask_id=mask_id, steps=2)


def drafted_equals_ar(q, quantize: str, prompts) -> bool:
    """The drafted decode (``speculate="next_token"``) of the ragged batch against the base's AR decode."""
    drafted = load("smollm2-135m-draft", quantize=quantize)
    ref = generate(q, prompts, max_new_tokens=24)
    out = generate(drafted, prompts, max_new_tokens=24, speculate="next_token")
    return out.tokens == ref.tokens


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("quantize", nargs="+", choices=["int8", "int4", "gguf"])
    ap.add_argument("--engine", help="torch.backends.quantized.engine to set before quantizing")
    ap.add_argument("--batch-only", action="store_true", help="skip the (slower) cached-steps check")
    ap.add_argument("--drafted", action="store_true", help="also the shipped drafter's decode against AR")
    args = ap.parse_args()
    torch.set_num_threads(1)
    if args.engine:
        torch.backends.quantized.engine = args.engine
    print("cpu", torch.backends.cpu.get_cpu_capability(), "engine", torch.backends.quantized.engine, flush=True)
    for quantize in args.quantize:
        q = load(NAME, quantize=quantize)
        prompts = prompts_of(q.tokenizer)
        with torch.no_grad():
            hidden, diff = batch_vs_alone(q, prompts)
            print(f"{quantize}: hidden states batched vs alone {hidden:.3g}", flush=True)
            print(f"{quantize}: batched vs alone {diff:.3g}", flush=True)
            if hidden > 0 or diff > TOL:
                print(f"FAIL {quantize}: a row's hidden states depend on its batch by {hidden:.3g} (> 0) or its "
                      f"logits by {diff:.3g} (> {TOL})")
                return 1
            if args.batch_only:
                continue
            cache_exact(q, prompts)
            print(f"{quantize}: cached == recomputed", flush=True)
            if args.drafted:
                if not drafted_equals_ar(q, quantize, prompts):
                    print(f"FAIL {quantize}: the drafted decode differs from the AR decode")
                    return 1
                print(f"{quantize}: drafted == AR", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
