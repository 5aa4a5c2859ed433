"""The KV cache's write, before and after: a scatter along the positions (what ``KVCache.update`` did) against one
row copy per (row, head, new token) into the flat cache (``index_copy_``, what it does), side by side on the
word-problem pair at batch 32, in float32 and bfloat16 (benchmarks/RESULTS.md, "In bfloat16 at batch 32").

    PYTHONPATH=src python benchmarks/cache_write.py --n 256

Both writes put the same bits in the cache (tests/test_model.py); every mode decodes the same batches with each
write in turn (the order alternating by batch), generated tokens per CPU-second of this process.
"""

from __future__ import annotations

import argparse
import time

import torch

import setdlm
import setdlm.model as backbone_module
from setdlm.data.tasks import reasoning_split
from setdlm.decoding import generate
from setdlm.evaluation.passes import prompt_ids

INDEX_COPY = backbone_module.KVCache.update


def scatter_update(self, layer, k, v, step):
    """``KVCache.update`` as it was: a scatter along dim 2 with the index expanded to every element."""
    B, H, T, hd = k.shape
    idx = step.write_idx[:, None, :, None].expand(B, H, T, hd)
    ck, cv = self.k[layer], self.v[layer]
    ck.scatter_(2, idx, k.to(ck.dtype))
    cv.scatter_(2, idx, v.to(cv.dtype))
    return ck[:, :, : step.width].to(k.dtype), cv[:, :, : step.width].to(v.dtype)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=256)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    head = {"speculate": "next_token", "window": 5}
    modes = [(f"{label}{'' if dt == 'float32' else ' ' + dt}", name, dt, knobs) for dt in ("float32", "bfloat16")
             for label, name, knobs in (("AR", "arith-ar-long", {}), ("next_token w=5", "arith-setdlm-smax8-ar", head))]
    models = {(name, dt): setdlm.load(name, dtype=dt) for _, name, dt, _ in modes}
    problems = reasoning_split("test", args.n, level="medium", seed=0)
    prompts = [prompt_ids(models["arith-ar-long", "float32"], e) for e in problems]
    budget = models["arith-ar-long", "float32"].family.length - max(map(len, prompts))
    writes = [("scatter", scatter_update), ("index_copy_", INDEX_COPY)]
    spent: dict[tuple[str, str], list[float]] = {}
    try:
        for i, lo in enumerate(range(0, len(prompts), args.batch)):
            for write, fn in writes if i % 2 == 0 else writes[::-1]:
                backbone_module.KVCache.update = fn
                for label, name, dt, knobs in modes:
                    if i == 0:  # warm-up
                        generate(models[name, dt], prompts[:args.batch], max_new_tokens=budget, **knobs)
                    t0 = time.process_time()
                    out = generate(models[name, dt], prompts[lo:lo + args.batch], max_new_tokens=budget, **knobs)
                    s = spent.setdefault((label, write), [0.0, 0])
                    s[0] += time.process_time() - t0
                    s[1] += sum(len(t) for t in out.tokens)
    finally:
        backbone_module.KVCache.update = INDEX_COPY
    print(f"{args.n} problems in batches of {args.batch}, {args.threads} threads, tokens per CPU-second")
    print("| mode | scatter | index_copy_ | gain |\n|---|---:|---:|---:|")
    for label, *_ in modes:
        (s0, n0), (s1, n1) = spent[label, "scatter"], spent[label, "index_copy_"]
        print(f"| {label} | {n0 / s0:.0f} | {n1 / s1:.0f} | {n1 / s1 / (n0 / s0):.2f}x |")


if __name__ == "__main__":
    main()
