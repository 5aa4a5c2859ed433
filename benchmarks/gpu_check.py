"""Every device check in one command, JSON out: exactness on the device, training speed and MFU against a plain
transformers loop, decoding speed against transformers ``generate`` (benchmarks/RESULTS.md, "GPU check").

    PYTHONPATH=src python benchmarks/gpu_check.py --out gpu_check.json              # one GPU, <= 8 minutes
    PYTHONPATH=src python benchmarks/gpu_check.py --tiny --device cpu --out x.json  # tests/test_gpu_check.py

Model: a random-weight Llama built from a config (no download): SmolLM2-135M's shape on a GPU (d=576, 30
layers, 9 heads, 3 KV heads, vocab 49,152), a tiny one with ``--tiny``; setdlm drives it through
:class:`setdlm.formats.hf.HFBackbone`, transformers through the same weights' own ``forward`` and ``generate``. The
MASK token is the last vocabulary id.

Sections, each written to the JSON as soon as it is done (a run cut short keeps what it measured); a
section whose estimate (``SECTIONS``) does not fit in what is left of ``--budget`` (470 s) is recorded as
skipped, with the ``--only`` flag that runs it:

``--only exactness,decoding`` runs some sections (a rerun of what a cut-short run missed).

1. ``exactness`` (float32 on a GPU, float64 on the CPU): cache == recompute (AR and SetDLM ``window=1``:
   every generated token is the argmax of a from-scratch teacher-forced forward, up to ``tol`` on near-ties),
   batched == alone (AR, BD3LM, SetDLM with a threshold), speculate == window 1, flex == dense training
   loss, and CUDA-graph decoding == eager for every cached decoder (on the CPU: the static-capacity cache
   without capture).
2. ``training`` (bf16 autocast on a GPU): per family, the steady-state ms/step, data tokens/s and MFU of
   :meth:`setdlm.training.state.TrainState.train_step` (the real step: loss, backward, clipping, AdamW),
   warm-up steps excluded, against a plain transformers loop (``model(ids, labels=ids)``, backward,
   clipping, fused AdamW) on the same model shape and batch; the held-out evaluation and the checkpoint
   write are timed apart. MFU counts the matrix-product FLOPs the backbone runs (6 per parameter per input
   position, 12·layers·d·T per position for attention; SetDLM and BD3LM run 2L positions per row) over the
   device's dense bf16 peak (H100/H200 989 TFLOP/s, A100 312; unknown devices and the CPU: null).
3. ``training_long`` (GPU): AR, SetDLM and the plain loop at L=2048 (the MFU target).
4. ``compile`` (GPU): AR with ``--compile``: the first steps (compilation included), the steady step, and the
   steps after which compiling pays back.
5. ``decoding``: tokens/s at batch 1 and 64 (``--tiny``: 1 and 3) for AR, BD3LM, SetDLM ``w=4`` with the
   threshold off and at 0.5, each also through CUDA graphs (``setdlm.decoding.cuda_graph``; the CPU: the
   static cache without capture), transformers ``generate`` with its dynamic and its static cache; greedy, EOS
   ignored, one warm-up call per configuration.
6. ``generate_compiled`` (GPU): transformers ``generate`` with its static cache and its automatic
   ``torch.compile`` (the warm-up call's seconds include the compilation).
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch

from setdlm import FamilyConfig, Model
from setdlm.batch import Batch
from setdlm.data.dataset import TokenDataset
from setdlm.data.tokenizers import char_tokenizer
from setdlm.decoding import generate
from setdlm.decoding.cuda_graph import GraphedBackbone
from setdlm.formats.hf import HFBackbone
from setdlm.mask_rules import kernel
from setdlm.masks import causal_mask
from setdlm.objectives import compute_loss, setdlm_inputs
from setdlm.training.config import TrainConfig, knobs_for
from setdlm.training.data import Setup
from setdlm.training.distributed import Dist
from setdlm.training.state import TrainState

LLAMA = {  # SmolLM2-135M's architecture (HuggingFaceTB/SmolLM2-135M config.json), random weights
    "full": dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                 num_key_value_heads=3, vocab_size=49152, max_position_embeddings=8192, rope_theta=100000.0,
                 rms_norm_eps=1e-5, tie_word_embeddings=True),
    "tiny": dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=96, max_position_embeddings=512, rope_theta=10000.0,
                 rms_norm_eps=1e-5, tie_word_embeddings=True),
}
PLAN = {  # sizes of every section
    "full": dict(train_L=512, train_B=32, warmup=5, steps=20, long_L=2048, long_B=8, long_steps=8,
                 compile_steps=20, prompt=22, new=128, batches=(1, 64), exact_prompts=(22, 9, 15), exact_new=32),
    "tiny": dict(train_L=16, train_B=4, warmup=1, steps=2, long_L=0, long_B=0, long_steps=0,
                 compile_steps=0, prompt=5, new=6, batches=(1, 3), exact_prompts=(5, 3, 7), exact_new=6),
}
# in the order they run, with a generous estimate of each one's seconds on one H200: a section starts only if
# it fits in what is left of --budget
SECTIONS = {"exactness": 90, "training": 150, "decoding": 120, "training_long": 60, "compile": 150,
            "generate_compiled": 150}
PEAK_BF16 = {"H200": 989e12, "H100": 989e12, "A100": 312e12}  # dense bf16 FLOP/s (vendor data sheets)


def llama(size: str, device, dtype, seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(**LLAMA[size], attn_implementation="sdpa")
    return LlamaForCausalLM(cfg).to(device=device, dtype=dtype)


def sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def peak_flops(device) -> float | None:
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((v for k, v in PEAK_BF16.items() if k in name), None)


def step_flops(hf, B: int, L: int, two_stream: bool) -> float:
    """Matrix-product FLOPs of one training step (forward + backward = 3x forward): ``T`` input positions per
    row (2L for two streams), the output head on L of them, attention over T keys (docs in the module)."""
    c = hf.config
    T = 2 * L if two_stream else L
    head = c.vocab_size * c.hidden_size
    body = sum(p.numel() for n, p in hf.named_parameters() if "embed" not in n and "lm_head" not in n and p.dim() > 1)
    return 6.0 * B * (T * body + L * head) + 12.0 * c.num_hidden_layers * c.hidden_size * T * T * B


# ---------------------------------------------------------------------------------------------------------
# 1. exactness
# ---------------------------------------------------------------------------------------------------------


def families(n: int, mask_id: int) -> dict[str, FamilyConfig]:
    """The four families at a context length of at least ``n`` (a multiple of the block size 4)."""
    L = -(-n // 8) * 8
    return {"ar": FamilyConfig("ar", L, mask_id), "mdlm": FamilyConfig("mdlm", L, mask_id),
            "bd3lm": FamilyConfig("bd3lm", L, mask_id, block_size=4),
            "setdlm": FamilyConfig("setdlm", L, mask_id, D=4, M=8)}


def _margin_check(logits: torch.Tensor, chosen: list[int], tol: float) -> dict:
    """Each chosen token against the recomputed logits (n, V): the argmax, or within ``tol`` of its logit."""
    best = logits.max(-1)
    got = logits.gather(-1, torch.tensor(chosen, device=logits.device)[:, None])[:, 0]
    gap = (best.values - got).abs()
    differ = int((best.indices.cpu() != torch.tensor(chosen)).sum())
    return {"tokens": len(chosen), "argmax_differs": differ, "max_gap": float(gap.max()) if len(chosen) else 0.0,
            "passed": bool((gap <= tol).all())}


def exactness(hf, mask_id: int, plan: dict, device, tol: float) -> list[dict]:
    bb = HFBackbone(hf).eval()
    V = hf.config.vocab_size
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, V - 1, (n,), generator=g).tolist() for n in plan["exact_prompts"]]
    n_new, L = plan["exact_new"], max(plan["exact_prompts"]) + plan["exact_new"] + 8
    fam = families(L, mask_id)
    out, checks = {}, []

    def run(name, family, **kw):
        out[name] = generate(Model(bb, family), prompts, max_new_tokens=n_new, ignore_eos=True, **kw).tokens
        return out[name]

    with torch.no_grad():
        # cache == recompute: AR, each generated token against one causal forward over prompt + generation
        rows = []
        for p, gen in zip(prompts, run("ar", fam["ar"])):
            ids = torch.tensor([p + gen], device=device)  # (1, n)
            n = ids.shape[1]
            logits = bb(ids, torch.arange(n, device=device)[None], causal_mask(torch.ones(1, n, dtype=torch.bool,
                        device=device)))[0, len(p) - 1:n - 1].double()  # (n_new, V)
            rows.append(_margin_check(logits.index_fill(-1, torch.tensor([mask_id], device=device), -math.inf),
                                      gen, tol))
        checks.append({"name": "cache == recompute (AR)", **_merge(rows)})
        # SetDLM window 1: position p given every position before it = the query stream of one two-stream
        # forward in natural order (docs/method.md §2.4)
        rows = []
        for p, gen in zip(prompts, run("w1", fam["setdlm"], window=1)):
            ids = torch.tensor([p + gen], device=device)
            n = ids.shape[1]
            ctx = torch.zeros(1, n, dtype=torch.bool, device=device)
            ctx[0, :len(p)] = True
            inp = setdlm_inputs(Batch(ids, torch.ones_like(ctx), ctx), torch.arange(n, device=device)[None], mask_id)
            logits = bb(inp.input_ids, inp.position_ids, inp.attn_mask, logits_start=n)[0, len(p):].double()
            rows.append(_margin_check(logits.index_fill(-1, torch.tensor([mask_id], device=device), -math.inf),
                                      gen, tol))
        checks.append({"name": "cache == recompute (SetDLM window 1)", **_merge(rows)})
        # batched == alone
        for name, family, kw in (("AR", fam["ar"], {}), ("BD3LM", fam["bd3lm"], {"threshold": 0.5}),
                                 ("SetDLM w=4 threshold 0.5", fam["setdlm"], {"window": 4, "threshold": 0.5})):
            batched = generate(Model(bb, family), prompts, max_new_tokens=n_new, ignore_eos=True, **kw).tokens
            alone = [generate(Model(bb, family), [p], max_new_tokens=n_new, ignore_eos=True, **kw).tokens[0]
                     for p in prompts]
            same = sum(a == b for a, b in zip(batched, alone))
            checks.append({"name": f"batched == alone ({name})", "rows": len(prompts), "equal_rows": same,
                           "passed": same == len(prompts)})
        spec = run("spec", fam["setdlm"], window=4, speculate=True)
        same = sum(a == b for a, b in zip(spec, out["w1"]))
        checks.append({"name": "speculate == window 1 (SetDLM w=4)", "rows": len(prompts), "equal_rows": same,
                       "passed": same == len(prompts)})
    checks.append(flex_check(hf, mask_id, device, fam))
    checks.append(graph_check(bb, prompts, n_new, fam, device))
    return checks


def graph_check(bb, prompts, n_new: int, fam: dict, device) -> dict:
    """CUDA-graph decoding (setdlm.decoding.cuda_graph) against eager, every cached decoder; on the CPU the
    static-capacity cache without capture (the capture needs CUDA)."""
    graphed = GraphedBackbone(bb)
    rows = same = 0
    with torch.no_grad():
        for family, kw in ((fam["ar"], {}), (fam["bd3lm"], {"threshold": 0.5}), (fam["setdlm"], {"window": 4}),
                           (fam["setdlm"], {"window": 4, "threshold": 0.5}),
                           (fam["setdlm"], {"window": 4, "speculate": True})):
            a = generate(Model(bb, family), prompts, max_new_tokens=n_new, ignore_eos=True, **kw).tokens
            b = generate(Model(graphed, family), prompts, max_new_tokens=n_new, ignore_eos=True, **kw).tokens
            rows, same = rows + len(a), same + sum(x == y for x, y in zip(a, b))
    name = "CUDA graph == eager" if device.type == "cuda" else "static cache == dynamic cache (CPU: no capture)"
    return {"name": name, "rows": rows, "equal_rows": same, "replays": graphed.replays, "passed": same == rows}


def _merge(rows: list[dict]) -> dict:
    return {"tokens": sum(r["tokens"] for r in rows), "argmax_differs": sum(r["argmax_differs"] for r in rows),
            "max_gap": max(r["max_gap"] for r in rows), "passed": all(r["passed"] for r in rows)}


def flex_check(hf, mask_id: int, device, fam: dict) -> dict:
    """The training loss and gradients of each family with the rule kernels (flex on CUDA) against the dense
    masks, on a padded batch (padding makes every family take the flex path)."""
    bb = HFBackbone(hf).train()
    V = hf.config.vocab_size
    L = 24
    g = torch.Generator().manual_seed(7)
    ids = torch.randint(0, V - 1, (3, L), generator=g)
    valid = torch.ones(3, L, dtype=torch.bool)
    valid[1, L - 5:] = False
    ctx = torch.zeros(3, L, dtype=torch.bool)
    ctx[:, 0] = True
    batch = Batch(ids, valid, ctx).to(device)
    worst_loss = worst_grad = 0.0
    for name, f in fam.items():
        f = FamilyConfig(f.family, L, mask_id, **({"block_size": 4} if name == "bd3lm" else
                                                   {"D": 4, "M": 8} if name == "setdlm" else {}))
        res = []
        for policy in ("dense", "flex"):  # the CPU runs flex_attention eagerly, forward only
            bb.zero_grad(set_to_none=True)
            grad = device.type == "cuda"  # flex_attention has no backward on the CPU (torch 2.13)
            with kernel(policy), torch.set_grad_enabled(grad):
                out = compute_loss(bb, f, batch, generator=torch.Generator(device).manual_seed(3))
            if grad:
                out.loss.backward()
            grads = [p.grad.detach().clone() for p in bb.parameters() if p.grad is not None] if grad else []
            res.append((out.loss.detach().double(), grads))
        (ld, gd), (lf, gf) = res
        worst_loss = max(worst_loss, float((ld - lf).abs()))
        for a, b in zip(gd, gf):
            worst_grad = max(worst_grad, float((a.double() - b.double()).abs().max() / b.double().abs().max().clamp(min=1e-30)))
    tol = 1e-4 if hf.dtype == torch.float32 else 1e-9
    bb.eval()
    return {"name": "flex == dense training loss (every family, padded batch)", "max_loss_diff": worst_loss,
            "max_grad_rel_diff": worst_grad if device.type == "cuda" else None, "tol": tol,
            "passed": worst_loss <= tol and worst_grad <= 10 * tol}


# ---------------------------------------------------------------------------------------------------------
# 2-4. training
# ---------------------------------------------------------------------------------------------------------


def _state(hf, family: str, L: int, B: int, mask_id: int, device, bf16: bool, out: str, compile_: bool = False):
    cfg = TrainConfig.from_preset("tiny", out=out, family=family, batch_size=B, length=L, bf16=bf16, steps=10**6,
                                  warmup=0, eval_every=0, save_every=0, eval_batch_size=B,
                                  **knobs_for(family, D=4, block_size=4), device=str(device), compile=compile_)
    V = hf.config.vocab_size
    g = torch.Generator().manual_seed(11)
    n = 4 * B
    ids = torch.randint(0, V - 1, (n, L), generator=g)
    ctx = torch.zeros(n, L, dtype=torch.bool)
    ctx[:, 0] = True  # BOS
    data = TokenDataset(ids, torch.ones(n, L, dtype=torch.bool), ctx)
    tok = char_tokenizer(["the checkpoint records a tokenizer"])  # the rows are random ids: any tokenizer will do
    setup = Setup(tok, cfg.family_config(mask_id), data, data.subset(range(B)))
    return TrainState(cfg, Dist(device=device), setup, None, init=HFBackbone(hf))


def _timed(fn, n: int, device) -> float:
    sync(device)
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    sync(device)
    return time.perf_counter() - t0


def _row(seconds: float, steps: int, B: int, L: int, flops: float, peak: float | None) -> dict:
    per = seconds / steps
    return {"ms_per_step": 1000 * per, "tokens_per_s": B * L / per, "steps": steps,
            "mfu": flops / per / peak if peak else None}


def train_setdlm(size, family, L, B, plan, mask_id, device, bf16, peak, *, steps=None, timed_apart=False,
                 compile_=False) -> dict:
    hf = llama(size, device, torch.float32)
    flops = step_flops(hf, B, L, family in ("setdlm", "bd3lm"))
    with tempfile.TemporaryDirectory() as out:
        state = _state(hf, family, L, B, mask_id, device, bf16, out, compile_)
        warm = _timed(state.train_step, plan["warmup"], device)
        row = _row(_timed(state.train_step, steps or plan["steps"], device), steps or plan["steps"], B, L, flops, peak)
        row["warmup_steps"], row["warmup_s"] = plan["warmup"], warm
        if timed_apart:  # evaluation and checkpoint, apart from the steps
            row["eval_s"] = _timed(state.evaluate, 1, device)
            row["save_s"] = _timed(lambda: state.save(Path(out), {"loss": None}), 1, device)
    return row


def train_plain(size, L, B, plan, device, bf16, peak, *, steps=None) -> dict:
    """The loop people write with transformers: same shape and batch, fused AdamW, bf16 autocast."""
    hf = llama(size, device, torch.float32).train()
    flops = step_flops(hf, B, L, False)
    ids = torch.randint(0, hf.config.vocab_size - 1, (B, L), generator=torch.Generator().manual_seed(11)).to(device)
    params = list(hf.parameters())
    opt = torch.optim.AdamW(params, lr=1e-4, fused=device.type == "cuda" or None)
    amp = torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16)

    def step():
        with amp:
            loss = hf(input_ids=ids, labels=ids).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    warm = _timed(step, plan["warmup"], device)
    n = steps or plan["steps"]
    row = _row(_timed(step, n, device), n, B, L, flops, peak)
    row["warmup_steps"], row["warmup_s"] = plan["warmup"], warm
    return row


def training(size, plan, mask_id, device, bf16, peak, L, B, fams, steps=None) -> dict:
    res = {"L": L, "batch": B, "bf16": bf16, "plain_transformers": train_plain(size, L, B, plan, device, bf16, peak,
                                                                                 steps=steps)}
    for i, f in enumerate(fams):
        res[f] = train_setdlm(size, f, L, B, plan, mask_id, device, bf16, peak, steps=steps, timed_apart=i == 0)
    plain = res["plain_transformers"]["tokens_per_s"]
    res["vs_plain"] = {f: res[f]["tokens_per_s"] / plain for f in fams}
    if "ar" in fams:
        res["per_token_cost_vs_ar"] = {f: res["ar"]["tokens_per_s"] / res[f]["tokens_per_s"] for f in fams}
    return res


def compile_payback(size, plan, mask_id, device, bf16, peak) -> dict:
    L, B, n = plan["train_L"], plan["train_B"], plan["compile_steps"]
    eager = train_setdlm(size, "ar", L, B, {**plan, "warmup": plan["warmup"]}, mask_id, device, bf16, peak, steps=n)
    comp = train_setdlm(size, "ar", L, B, {**plan, "warmup": 3}, mask_id, device, bf16, peak, steps=n, compile_=True)
    gain = eager["ms_per_step"] - comp["ms_per_step"]  # ms saved per steady step
    extra = 1000 * comp["warmup_s"] - 3 * eager["ms_per_step"]  # compilation's cost over 3 eager steps
    return {"eager": eager, "compiled": comp, "first_3_steps_s": comp["warmup_s"],
            "pays_back_after_steps": math.ceil(extra / gain) + 3 if gain > 0 else None}


# ---------------------------------------------------------------------------------------------------------
# 5. decoding
# ---------------------------------------------------------------------------------------------------------


def decoding(hf, mask_id: int, plan: dict, device) -> list[dict]:
    bb = HFBackbone(hf).eval()
    V = hf.config.vocab_size
    n_new, P = plan["new"], plan["prompt"]
    L = P + n_new + 8
    fam = families(L, mask_id)
    configs = [("AR", fam["ar"], {}), ("BD3LM S=4", fam["bd3lm"], {}),
               ("SetDLM w=4, threshold off", fam["setdlm"], {"window": 4}),
               ("SetDLM w=4, threshold 0.5", fam["setdlm"], {"window": 4, "threshold": 0.5})]
    graphs = "CUDA graphs" if device.type == "cuda" else "static cache"  # the CPU cannot capture
    graphed = GraphedBackbone(bb)
    configs += [(f"{name} + {graphs}", family, {**kw, "backbone": graphed}) for name, family, kw in configs]
    rows = []
    g = torch.Generator().manual_seed(3)
    for B in plan["batches"]:
        prompts = torch.randint(0, V - 1, (B, P), generator=g)
        for name, family, kw in configs:
            kw = dict(kw)
            model = Model(kw.pop("backbone", bb), family)
            with torch.no_grad():
                generate(model, prompts.tolist(), max_new_tokens=min(n_new, 8), ignore_eos=True, **kw)  # warm-up
                sync(device)
                t0 = time.perf_counter()
                out = generate(model, prompts.tolist(), max_new_tokens=n_new, ignore_eos=True, **kw)
                sync(device)
            s = time.perf_counter() - t0
            rows.append({"decoder": f"setdlm {name}", "batch": B, "new_tokens": n_new, "nfe": out.nfe,
                         "tokens_per_s": B * n_new / s, "ms_per_forward": 1000 * s / max(out.nfe, 1)})
        rows += [hf_generate(hf, prompts, n_new, mode, device) for mode in ("dynamic", "static")]
    base = {r["batch"]: r["tokens_per_s"] for r in rows if r["decoder"] == "transformers generate (dynamic cache)"}
    for r in rows:
        if "tokens_per_s" in r and r["batch"] in base:
            r["vs_generate"] = r["tokens_per_s"] / base[r["batch"]]
    return rows


def hf_generate(hf, prompts: torch.Tensor, n_new: int, mode: str, device) -> dict:
    """transformers ``generate``, greedy, exactly ``n_new`` tokens: ``mode`` "dynamic" (its default cache),
    "static" (static cache, not compiled) or "static, compiled" (static cache, transformers' automatic
    ``torch.compile`` of the forward on CUDA; the warm-up call pays the compilation)."""
    B, P = prompts.shape
    ids = prompts.to(device)
    kw = dict(max_new_tokens=n_new, min_new_tokens=n_new, do_sample=False, pad_token_id=0,
              attention_mask=torch.ones_like(ids))
    if mode != "dynamic":
        kw.update(cache_implementation="static", disable_compile=mode == "static")
    name = f"transformers generate ({mode} cache)"
    try:
        with torch.no_grad():
            sync(device)
            t0 = time.perf_counter()
            hf.generate(ids, **{**kw, "max_new_tokens": min(n_new, 8), "min_new_tokens": min(n_new, 8)})
            sync(device)
            warm = time.perf_counter() - t0
            t0 = time.perf_counter()
            out = hf.generate(ids, **kw)
            sync(device)
        s = time.perf_counter() - t0
    except Exception as e:  # a mode this transformers or device lacks: recorded, not fatal
        return {"decoder": name, "batch": B, "error": f"{type(e).__name__}: {e}"[:300]}
    n = out.shape[1] - P
    return {"decoder": name, "batch": B, "new_tokens": n, "nfe": n, "tokens_per_s": B * n / s,
            "ms_per_forward": 1000 * s / max(n, 1), "warmup_s": warm}


def generate_compiled(hf, plan: dict, device) -> list[dict]:
    g = torch.Generator().manual_seed(3)
    return [hf_generate(hf, torch.randint(0, hf.config.vocab_size - 1, (B, plan["prompt"]), generator=g),
                        plan["new"], "static, compiled", device) for B in plan["batches"]]


# ---------------------------------------------------------------------------------------------------------


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="JSON file to write")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--tiny", action="store_true", help="tiny random Llama and sizes (the CPU test)")
    p.add_argument("--budget", type=float, default=470.0,
                   help="seconds for the whole run: a section starts only if its estimate fits in what is left")
    p.add_argument("--only", default=",".join(SECTIONS), help=f"comma-separated sections (default all: {','.join(SECTIONS)})")
    args = p.parse_args(argv)
    device = torch.device(args.device)
    size = "tiny" if args.tiny else "full"
    plan = PLAN[size]
    cuda = device.type == "cuda"
    bf16, peak = cuda, peak_flops(device)
    mask_id = LLAMA[size]["vocab_size"] - 1
    import transformers

    report = {"environment": {"torch": torch.__version__, "transformers": transformers.__version__,
                              "python": platform.python_version(), "device": str(device),
                              "device_name": torch.cuda.get_device_name(device) if cuda else platform.processor(),
                              "peak_bf16_flops": peak, "model": {"llama": LLAMA[size]}, "plan": plan},
              "sections": {}, "seconds": {}}
    t_start = time.perf_counter()

    only = args.only.split(",")
    if set(only) - set(SECTIONS):
        p.error(f"--only: unknown sections {sorted(set(only) - set(SECTIONS))}; choose from {', '.join(SECTIONS)}")

    def section(name: str, fn, needs_cuda: bool = False):
        if name not in only:
            report["sections"][name] = {"skipped": "not in --only"}
        elif needs_cuda and not cuda:
            report["sections"][name] = {"skipped": "needs CUDA"}
        elif time.perf_counter() - t_start + (SECTIONS[name] if cuda else 0) > args.budget:
            report["sections"][name] = {"skipped": f"its estimate of {SECTIONS[name]} s does not fit in what is "
                                                   f"left of the {args.budget:.0f} s budget (rerun with --only {name})"}
        else:
            t0 = time.perf_counter()
            try:
                report["sections"][name] = fn()
            except Exception as e:  # one device run must not lose the other sections: recorded, and on
                report["sections"][name] = {"error": f"{type(e).__name__}: {e}"[:500],
                                            "traceback": traceback.format_exc()[-3000:]}
            report["seconds"][name] = time.perf_counter() - t0
        Path(args.out).write_text(json.dumps(report, indent=2))
        print(f"{name}: {json.dumps(report['sections'][name])[:400]}", file=sys.stderr)

    exact_dtype = torch.float32 if cuda else torch.float64
    tol = 1e-3 if cuda else 1e-9
    section("exactness", lambda: exactness(llama(size, device, exact_dtype), mask_id, plan, device, tol))
    section("training", lambda: training(size, plan, mask_id, device, bf16, peak, plan["train_L"], plan["train_B"],
                                         ["ar", "mdlm", "bd3lm", "setdlm"]))
    section("decoding", lambda: decoding(llama(size, device, torch.bfloat16 if cuda else torch.float32), mask_id,
                                         plan, device))
    section("training_long", lambda: training(size, plan, mask_id, device, bf16, peak, plan["long_L"],
                                              plan["long_B"], ["ar", "setdlm"], steps=plan["long_steps"]),
            needs_cuda=True)
    section("compile", lambda: compile_payback(size, plan, mask_id, device, bf16, peak), needs_cuda=True)
    section("generate_compiled", lambda: generate_compiled(llama(size, device, torch.bfloat16), plan, device),
            needs_cuda=True)
    report["total_seconds"] = time.perf_counter() - t_start
    exact = report["sections"]["exactness"]
    report["exactness_passed"] = all(c["passed"] is not False for c in exact) if isinstance(exact, list) else None
    Path(args.out).write_text(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    main()
