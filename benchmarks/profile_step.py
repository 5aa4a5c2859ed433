"""Where a decode step's time goes, for each family: SmolLM2-135M decoded by AR, BD3LM S=4 and SetDLM w=4 at
batch 1 and 16 (the chat prompts of benchmarks/cpu_decode.py), ``torch.profiler`` over a whole ``generate``
call after a warm-up: ms per step (per backbone forward), the share of it inside the backbone's forward (the
rest is the decoder's own work: sampling, masks, cache bookkeeping), ops per step, and the ops taking the most
self CPU time (the "Where the time goes" figures of benchmarks/RESULTS.md).

    PYTHONPATH=src python benchmarks/profile_step.py --quantize int8 --threads 1
"""

from __future__ import annotations

import argparse
import time

import torch
from torch.profiler import ProfilerActivity, profile

from decode_speed import TimedBackbone  # benchmarks/ is the script's folder, hence on sys.path
from hf_decode_speed import QUESTIONS
from setdlm import FamilyConfig, Model, load
from setdlm.decoding import generate
from setdlm.chat import chat_prompt


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quantize", choices=("int8", "int4"), default=None)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--new-tokens", type=int, default=16)
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 16])
    p.add_argument("--top", type=int, default=6)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    model = load("smollm2-135m", quantize=args.quantize)
    tok, mask_id, L = model.tokenizer, model.family.mask_token_id, model.family.length
    prompts = [chat_prompt(tok, q) for q in QUESTIONS] * 2
    families = {"AR": (FamilyConfig("ar", L, mask_id), {}),
                "BD3LM S=4": (FamilyConfig("bd3lm", L, mask_id, block_size=4), {}),
                "SetDLM w=4": (FamilyConfig("setdlm", L, mask_id, D=4, M=8), {"window": 4})}
    print(f"SmolLM2-135M {args.quantize or 'fp32'}, {args.threads} threads, {args.new_tokens} new tokens per row")
    for B in args.batch_sizes:
        for name, (fam, kw) in families.items():
            timed = TimedBackbone(model.backbone)
            m = Model(timed, fam, tok)
            run = lambda: generate(m, prompts[:B], max_new_tokens=args.new_tokens, ignore_eos=True, **kw)  # noqa: E731
            run()  # warm-up
            timed.seconds = 0.0
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                t0 = time.perf_counter()
                out = run()
                wall = time.perf_counter() - t0
            steps = out.nfe  # decode forwards (the prefill is not counted, its time is)
            ops = prof.key_averages()
            total = sum(e.self_cpu_time_total for e in ops)
            print(f"\n{name}, batch {B}: {1000 * wall / steps:.1f} ms/step (profiled), {100 * timed.seconds / wall:.0f}% "
                  f"inside the backbone's forward, {sum(e.count for e in ops) // steps} ops/step")
            for e in sorted(ops, key=lambda e: -e.self_cpu_time_total)[:args.top]:
                print(f"  {e.key:58s} {100 * e.self_cpu_time_total / total:5.1f}%  calls/step {e.count / steps:.0f}")


if __name__ == "__main__":
    main()
