"""Decoding speed of every decoder on one randomly initialised backbone, side by side (docs/method.md §4.10).

    PYTHONPATH=src python benchmarks/decode_speed.py                      # the RESULTS.md table
    PYTHONPATH=src python benchmarks/decode_speed.py --device cuda --dtype bfloat16

Backbone: the probe-size DiT (d=256, 4 layers, 4 heads, vocab 4096) with random weights
(``init_weights(zero_head=False)``), shared by all decoders; only the family (decoder) changes. Each row
generates ``--new-tokens`` tokens after a random prompt, EOS and stopping off (as the paper's throughput
runs), greedy. Reported per decoder and batch size: NFE (forwards, prefill excluded), tokens per step,
tokens/s (all rows' generated tokens / wall seconds of decoding, prefill included), the share of time
spent outside backbone forwards (sampler overhead; wall clock, and CPU time of the main thread, which
other processes sharing the cores do not inflate; with ``--threads 1`` it is all the work), and the
batch-B speed-up over batch 1. Each configuration runs once to warm up, then ``--repeats`` times,
interleaved with the others; the run with the least CPU time is kept. On CPU, speed-ups are computed
from CPU time (tokens per CPU-second of the main thread, all the work with ``--threads 1``), which stays
steady when other processes share the cores and matches wall-clock tokens/s on a dedicated machine; on
CUDA from wall time.

With random weights the confidences are low and nearly flat, so a threshold τ = 0.9 almost never commits
more than the top-1: tokens/step stays ≈ 1 and τ changes little here. Trained models are needed to see
the parallelism τ buys (docs/method.md §6.1).
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass

import torch
from torch import nn

from setdlm import FamilyConfig, Model, TransformerConfig, Transformer
from setdlm.decoding import generate


class TimedBackbone(nn.Module):
    """The backbone, with the wall time (synchronised on CUDA) and the main thread's CPU time spent inside
    its forwards accumulated."""

    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner
        self.seconds = self.cpu_seconds = 0.0
        self.train(inner.training)

    def forward(self, *args, **kwargs):
        t0, c0 = time.perf_counter(), time.thread_time()
        out = self.inner(*args, **kwargs)
        if out.is_cuda:
            torch.cuda.synchronize()
        self.seconds += time.perf_counter() - t0
        self.cpu_seconds += time.thread_time() - c0
        return out

    def new_cache(self, batch, capacity=64):
        return self.inner.new_cache(batch, capacity)


def decoders(L: int, mask_id: int) -> list[tuple[str, FamilyConfig, dict]]:
    return [
        ("AR", FamilyConfig("ar", L, mask_id), {}),
        ("BD3LM S=4", FamilyConfig("bd3lm", L, mask_id, block_size=4), {}),
        ("BD3LM S=4, τ=0.9", FamilyConfig("bd3lm", L, mask_id, block_size=4), {"threshold": 0.9}),
        ("SetDLM D=4 (M=8, w=4)", FamilyConfig("setdlm", L, mask_id, D=4, M=8), {}),
        ("SetDLM D=4 (M=8, w=4), τ=0.9", FamilyConfig("setdlm", L, mask_id, D=4, M=8), {"threshold": 0.9}),
    ]


@dataclass
class Run:
    out: object  # GenerationOutput
    cpu: float  # CPU seconds of the main thread for the whole call
    outside_wall: float  # share of wall time outside backbone forwards
    outside_cpu: float  # share of CPU time outside backbone forwards

    @property
    def cpu_tokens_per_second(self) -> float:
        return self.out.num_tokens / self.cpu


def run_once(model, prompts, new_tokens, kw) -> Run:
    """One timed ``generate`` call (EOS and stopping off)."""
    timed = model.backbone
    timed.seconds = timed.cpu_seconds = 0.0
    c0 = time.thread_time()
    out = generate(model, prompts, max_new_tokens=new_tokens, ignore_eos=True, **kw)
    cpu = time.thread_time() - c0
    return Run(out, cpu, 1.0 - timed.seconds / out.seconds, 1.0 - timed.cpu_seconds / cpu)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--new-tokens", type=int, default=256)
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 16])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (1 is steadiest on shared cores)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    V = 4096
    mask_id = V - 1
    L = 1024
    backbone = Transformer(TransformerConfig(vocab_size=V, hidden_size=256, n_heads=4, n_layers=4))
    backbone.init_weights(zero_head=False, generator=torch.Generator().manual_seed(args.seed))
    backbone = backbone.to(device=args.device, dtype=getattr(torch, args.dtype)).eval()
    g = torch.Generator().manual_seed(args.seed + 1)
    all_prompts = torch.randint(0, V - 1, (max(args.batch_sizes), args.prompt_len), generator=g).tolist()

    print(f"backbone d=256, 4 layers, 4 heads, vocab {V}, {backbone.num_parameters() / 1e6:.1f}M params, "
          f"{args.device} {args.dtype}, threads {torch.get_num_threads()}; prompt {args.prompt_len}, "
          f"{args.new_tokens} new tokens, greedy, stopping off, best of {args.repeats}\n")
    configs = [(name, B, Model(TimedBackbone(backbone), fam), kw)
               for name, fam, kw in decoders(L, mask_id) for B in args.batch_sizes]
    for name, B, model, kw in configs:  # warm-up
        generate(model, all_prompts[:B], max_new_tokens=args.new_tokens, ignore_eos=True, **kw)
    runs: dict[tuple[str, int], Run] = {}
    for _ in range(args.repeats):  # interleaved, so that load from other processes spreads over all rows
        for name, B, model, kw in configs:
            run = run_once(model, all_prompts[:B], args.new_tokens, kw)
            if (name, B) not in runs or run.cpu < runs[name, B].cpu:  # on CUDA CPU time tracks wall time
                runs[name, B] = run
    B1, Bn = args.batch_sizes[0], args.batch_sizes[-1]
    on_cpu = torch.device(args.device).type == "cpu"
    clock = "CPU" if on_cpu else "wall"

    def rate(name, B):  # tokens per second of the clock the speed-ups use
        r = runs[name, B]
        return r.cpu_tokens_per_second if on_cpu else r.out.tokens_per_second

    print("| decoder | batch | NFE | tokens/step | tokens/s (wall) | tokens/CPU-s | outside forwards (wall / CPU) "
          f"| speed-up vs batch {B1} ({clock}) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, B, _, _ in configs:
        r = runs[name, B]
        print(f"| {name} | {B} | {r.out.nfe} | {r.out.tokens_per_step:.2f} | {r.out.tokens_per_second:.0f} | "
              f"{r.cpu_tokens_per_second:.0f} | {100 * r.outside_wall:.1f}% / {100 * r.outside_cpu:.1f}% | "
              f"{rate(name, B) / rate(name, B1):.2f}x |")
    if Bn != B1:
        ar = rate("AR", Bn) / rate("AR", B1)
        print(f"\nbatch-{Bn} speed-up ({clock}) relative to AR's ({ar:.2f}x):")
        for name, _, _ in decoders(L, mask_id):
            print(f"- {name}: {rate(name, Bn) / rate(name, B1) / ar:.2f}")

if __name__ == "__main__":
    main()
