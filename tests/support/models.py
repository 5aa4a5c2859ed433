"""Tiny random models on CPU (float64 where exactness is asserted): our backbone, a model of each family over
the decoding vocabulary or a task tokenizer, a saved checkpoint for the CLI, and tiny transformers LMs."""

from __future__ import annotations

import torch

from setdlm import FamilyConfig, Model
from setdlm.data import char_tokenizer
from setdlm.model import TransformerConfig, Transformer

from .tokenizers import MASK, V

FAMILY_KW = {"ar": {}, "setdlm": dict(D=2), "bd3lm": dict(block_size=4), "mdlm": dict(block_size=8)}


def make_model(vocab=32, hidden=32, heads=2, layers=2, seed=0, dtype=torch.float64) -> Transformer:
    """A tiny backbone with every weight random (head too), in eval mode."""
    torch.manual_seed(seed)
    m = Transformer(TransformerConfig(vocab_size=vocab, hidden_size=hidden, n_heads=heads, n_layers=layers))
    m.init_weights(zero_head=False, generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():  # make layer norms non-trivial so that they are exercised
        g = torch.Generator().manual_seed(seed + 1)
        for p in m.parameters():
            if p.dim() == 1:
                p.add_(0.1 * torch.randn(p.shape, generator=g))
    return m.to(dtype).eval()


def tiny_model(family: str, L: int = 48, seed: int = 1, dtype=torch.float64, **fam) -> Model:
    """A float64 random model over the decoding vocabulary (``V`` ids, MASK last) whose outputs are not all
    one token (larger embeddings and head)."""
    m = make_model(vocab=V, hidden=32, heads=2, layers=2, seed=seed, dtype=dtype)
    with torch.no_grad():
        m.head.weight.mul_(4)
        m.embed.weight.mul_(4)
    if family == "setdlm":
        fam.setdefault("D", 2)
    if family in ("bd3lm", "mdlm"):
        fam.setdefault("block_size", 4)
    return Model(m, FamilyConfig(family, L, MASK, **fam))


def tiny(family: str, tok, L: int = 128, dtype=torch.float64, seed: int = 0) -> Model:
    """A tiny random model (random head) of ``family`` with the tokenizer ``tok``."""
    backbone = make_model(vocab=tok.vocab_size, seed=seed, dtype=dtype)
    return Model(backbone, FamilyConfig(family, length=L, mask_token_id=tok.mask_token_id, **FAMILY_KW[family]), tok)


def save_tiny(path, family="setdlm"):
    """A float32 tiny model (L=16, lowercase character tokenizer) saved at ``path``; returns the path."""
    tok = char_tokenizer(["abcdefghijklmnopqrstuvwxyz ."])
    kw = {"setdlm": dict(D=2), "bd3lm": dict(block_size=4), "mdlm": {}, "ar": {}}[family]
    Model(make_model(vocab=tok.vocab_size, dtype=torch.float32), FamilyConfig(family, length=16,
          mask_token_id=tok.mask_token_id, **kw), tok).save(path)
    return str(path)


def tiny_hf(kind: str, seed: int = 0, vocab: int = 100, dtype=torch.float64):
    """A tiny random transformers causal LM (GQA: 4 query heads over 2 KV heads for the Llama family)."""
    import transformers

    torch.manual_seed(seed)
    common = dict(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    if kind == "llama":
        m = transformers.LlamaForCausalLM(transformers.LlamaConfig(**common))
    elif kind == "qwen2":
        m = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**common))
    elif kind == "qwen3":
        m = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**common, head_dim=16))
    else:
        m = transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=vocab, n_embd=32, n_layer=2, n_head=4,
                                                                 n_positions=128, bos_token_id=0, eos_token_id=0))
    with torch.no_grad():  # non-trivial norms, so that their weights are exercised
        g = torch.Generator().manual_seed(seed + 1)
        for name, p in m.named_parameters():
            if p.dim() == 1:
                p.add_(0.1 * torch.randn(p.shape, generator=g))
    return m.to(dtype).eval()
