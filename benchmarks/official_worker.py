"""The authors' sampler (kuleshov-group/setdlms) as a worker process for ``benchmarks/official_sampler.py``.

Runs in the benchmark-only environment that holds their code (torch 2.13, transformers 4.52.4, hydra-core,
einops; ``PYTHONPATH`` = their checkout, none of their files edited), never in setdlm's environment. It
builds their ``SetDLM`` / ``BD3LM`` denoiser around their DiT, loads a state dict in their key layout, and
answers JSON lines on stdin, one per line on stdout:

* ``{"op": "decode", "prompts": [[...], ...], "max_new_tokens": N}`` -> ``{"tokens": [[...], ...]}``;
* ``{"op": "time", "prompts": [...], "max_new_tokens": N, "reps": R}`` -> ``{"seconds": [...]}``, one wall time
  per rep for decoding every prompt, one at a time (their ``generate`` asserts batch size 1);
* ``{"op": "forward", "ids": [[...]], "calls": C}`` -> ``{"ms": m}``, the mean time of their DiT's raw forward.
"""

from __future__ import annotations

import json
import sys
import time

import torch
from safetensors.torch import load_file


def build(spec: dict):
    """Their denoiser for ``spec`` (family, sizes, schedule) with the weights of ``spec["weights"]``."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    from src.denoiser.bd3lm import BD3LM, BD3LMConfig
    from src.denoiser.setdlm import SetDLM

    V, L = spec["vocab_size"], spec["length"]
    words = {f"t{i}": i for i in range(V)}
    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(words, unk_token="t0")),
                                  pad_token="t0", bos_token="t1", eos_token="t2", mask_token=f"t{V - 1}")
    block = L if spec["family"] == "setdlm" else spec["S"]
    backbone = {"_target_": "src.backbone.dit.DIT", "length": L, "causal_attention": False, "adaln": False,
                "hidden_size": spec["hidden_size"], "cond_dim": 128, "n_heads": spec["n_heads"],
                "num_layers": spec["num_layers"], "dropout": 0.0, "tie_word_embeddings": True,
                "attn_backend": "sdpa", "vocab_size": V, "block_size": block,
                "pretrained_model_name_or_path": None}
    if spec["family"] == "setdlm":
        noise = {"_target_": "src.noise_schedule.noise_schedules.StaggeredNoise", "eps": 1e-3,
                 "block_size": L, "desired_block_size": spec["D"], "max_block_size": min(2 * spec["D"], L),
                 "length": L}
    else:
        noise = {"_target_": "src.noise_schedule.noise_schedules.LinearNoise"}
    config = BD3LMConfig(length=L, block_size=block, eval_block_size=block, backbone_config=backbone,
                         noise_config=noise, vocab_size=V, mask_token_id=V - 1, pad_token_id=0, bos_token_id=1,
                         eos_token_id=2, attn_backend="sdpa", keep_clean_bos=False)
    model = (SetDLM if spec["family"] == "setdlm" else BD3LM)(config, tokenizer=tok)
    sd = load_file(spec["weights"])
    missing, unexpected = model.load_state_dict(sd, strict=False)
    weights_missing = [k for k in missing if k not in ("static_attention_mask", "backbone.rotary_emb.inv_freq")]
    if weights_missing or unexpected:
        raise SystemExit(f"official worker: weights do not fit: missing {weights_missing}, unexpected {unexpected}")
    return model.eval()


def generation_config(spec: dict):
    """Greedy, threshold off, their YAML defaults otherwise (configs/generation/*.yaml)."""
    from src.denoiser.diffusion_config import DiffusionGenerationConfig, SetDiffusionGenerationConfig

    common = dict(first_hitting=True, sampling_strategy="predict_and_noise", noise_removal=False,
                  confidence_based_noising=True, confidence_threshold=1e6, nucleus_p=1.0, do_sample=False,
                  use_cache=True, linear_unmasking=True, pad_token_id=spec["vocab_size"] - 1)
    if spec["family"] == "setdlm":
        return SetDiffusionGenerationConfig(max_window_size=spec["window"], block_size=spec["length"],
                                            align_inputs_to_blocks=False, num_steps=1000, **common)
    return DiffusionGenerationConfig(block_size=spec["S"], align_inputs_to_blocks=True, num_steps=spec["S"],
                                     **common)


@torch.no_grad()
def decode_one(model, gen, prompt: list[int], max_new_tokens: int) -> list[int]:
    inputs = torch.tensor([prompt])                                  # (1, P)
    out = model.generate(inputs=inputs, generation_config=gen, max_new_tokens=max_new_tokens, device="cpu",
                         disable_pbar=True)  # their progress bars off
    seq = out.sequences if hasattr(out, "sequences") else out        # (1, P + N)
    return seq[0, len(prompt):len(prompt) + max_new_tokens].tolist()


@torch.no_grad()
def forward_ms(backbone, ids: list[list[int]], calls: int) -> float:
    """Mean ms of their DiT's forward on ``ids`` (no cache, full attention, positions 0..T-1) over ``calls``."""
    x = torch.tensor(ids)                                             # (B, T)
    B, T = x.shape
    pos, mask = torch.arange(T).expand(B, T), torch.ones(B, 1, T, T, dtype=torch.bool)
    t0 = time.perf_counter()
    for _ in range(calls):
        backbone(x, attention_mask=mask, position_ids=pos)
    return (time.perf_counter() - t0) / calls * 1e3


def main() -> None:
    torch.set_num_threads(int(sys.argv[2]) if len(sys.argv) > 2 else 1)
    spec = json.loads(sys.argv[1])
    model, gen = build(spec), generation_config(spec)
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        if req["op"] == "decode":
            reply = {"tokens": [decode_one(model, gen, p, req["max_new_tokens"]) for p in req["prompts"]]}
        elif req["op"] == "time":
            seconds = []
            for _ in range(req["reps"]):
                t0 = time.perf_counter()
                for p in req["prompts"]:
                    decode_one(model, gen, p, req["max_new_tokens"])
                seconds.append(time.perf_counter() - t0)
            reply = {"seconds": seconds}
        elif req["op"] == "forward":
            reply = {"ms": forward_ms(model.backbone, req["ids"], req["calls"])}
        else:
            raise SystemExit(f"official worker: unknown op {req['op']!r}")
        print(json.dumps(reply), flush=True)


if __name__ == "__main__":
    main()
