"""Hugging Face causal LMs as setdlm backbones (docs/method.md §3.2, §3.3, §7.18).

The paper's GSM8K models are a pretrained ``Qwen3ForCausalLM`` fine-tuned into set diffusion (§2.9). This
module makes any ``transformers`` causal LM of the Llama, Qwen2/Qwen3 or GPT-2 families honour the backbone
contract of :mod:`setdlm.model`::

    backbone(input_ids (B, T), position_ids (B, T), attn_mask (B, 1|H, T, C+T) bool, cache=KVCache|None,
             *, keep=None, logits_start=0) -> logits (B, T - logits_start, V)

How: :class:`HFBackbone` runs the model's **own submodules** (token/position embeddings, norms, q/k/v/o
projections, Qwen3's per-head q/k norms, rotary embedding, MLPs, final norm, ``lm_head``) in a forward
written against that contract, instead of calling the HF decoder layers. HF's layers build their own
masks and caches, and their SDPA/flash paths drop or reinterpret a custom dense mask (docs/method.md §7.18); here the
boolean mask goes to :func:`setdlm.model.attention` unchanged, and the cache bookkeeping is the same code
the DiT uses (:func:`~setdlm.model.begin_step`, :meth:`~setdlm.model.KVCache.update`,
:func:`~setdlm.model.end_step`): per-row lengths, append at each row's offset, ``keep=`` crop. The cache
stores the KV heads (GQA); they are expanded to the query heads only for the attention product. Only the
submodule names (``q_proj``, ``c_attn``, ...), stable across ``transformers`` releases, are relied upon. Each
architecture's forward is one runner (:class:`LlamaRunner`, :class:`GPT2Runner`; :data:`RUNNERS`), chosen once
from ``config.model_type`` when the backbone is built.

Unsupported on purpose (ValueError): sliding-window layers (Qwen2 ``use_sliding_window``), GPT-2 cross
attention, other architectures.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from contextlib import nullcontext

import torch
from tokenizers import Tokenizer as Backend
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from ..data.tokenizers import ROLES, Tokenizer
from ..errors import UserError
from ..mask_rules import MaskRule
from ..model import CacheStep, KVCache, apply_rope, attention, begin_step, end_step
from .hf_modules import GPT2Block, LlamaLayer, Norm, Projection, causal_lm, gpt2, llama
from .hub import HubUnreachableError, hub_reachable, is_connection_failure

LLAMA_LIKE = ("llama", "qwen2", "qwen3")
SUPPORTED_MODEL_TYPES = (*LLAMA_LIKE, "gpt2")
DEFAULT_MASK_TOKEN = "<|mask|>"


class HFBackbone(nn.Module):
    """A ``transformers`` causal LM (``LlamaForCausalLM``, ``Qwen2ForCausalLM``, ``Qwen3ForCausalLM``,
    ``GPT2LMHeadModel``) behind the setdlm backbone contract. The HF model is held as ``self.hf`` and keeps
    its parameters, so ``backbone.hf.save_pretrained(...)`` still works after fine-tuning."""

    accepts_mask_rules = True  # training masks may come as setdlm.mask_rules.MaskRule

    def __init__(self, hf_model: nn.Module):
        super().__init__()
        cfg = causal_lm(hf_model).config
        kind = getattr(cfg, "model_type", None)
        if kind not in SUPPORTED_MODEL_TYPES:
            raise UserError(f"unsupported model_type {kind!r}; the adapter supports "
                            f"{', '.join(SUPPORTED_MODEL_TYPES)}")
        layer_types = getattr(cfg, "layer_types", None) or ()
        if getattr(cfg, "use_sliding_window", False) or "sliding_attention" in layer_types:
            raise UserError(f"{kind} config uses sliding-window attention, which the adapter does not support")
        runner = RUNNERS[kind]
        runner.check(cfg)
        self.hf = hf_model
        self.grad_checkpointing = False  # recompute each layer in the backward pass (setdlm train --grad-checkpointing)
        self.wide_attention = False  # float64 attention (set by setdlm.formats.quantize: see setdlm.model.attention)
        # int8: each decoder layer as one compiled op, the same numbers (set by setdlm.formats.fused.prepare)
        self.fused_layers: list[Callable[..., Tensor]] | None = None
        self.training = hf_model.training  # wrapping changes no mode (dropout stays off for an eval model)
        self.kind = kind
        self.runner = runner  # the forward of this architecture, chosen once (LlamaRunner, GPT2Runner)
        self.n_layers: int = cfg.num_hidden_layers
        self.n_kv_heads, self.head_dim = runner.kv_heads(hf_model)

    @property
    def vocab_size(self) -> int:
        return causal_lm(self.hf).get_output_embeddings().out_features

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def _wide(self, dtype: torch.dtype) -> bool:
        """Whether attention runs in float64 (see :meth:`_attend`): for a quantized backbone
        (:attr:`wide_attention`), and for a half-precision one that decodes (not training): a bfloat16 attention
        product's last bits follow the number of queries and keys of a step, enough to change a greedy token
        between a one-token step and a step that verifies drafts (docs/drafter.md)."""
        return self.wide_attention or (dtype in (torch.bfloat16, torch.float16) and not self.training)

    def new_cache(self, batch: int, capacity: int = 64) -> KVCache:
        """A cache in the model's dtype, float64 under wide attention (see :meth:`_attend`)."""
        p = next(self.parameters())
        dtype = torch.float64 if self._wide(p.dtype) else p.dtype
        return KVCache(self.n_layers, batch, self.n_kv_heads, self.head_dim, dtype=dtype, device=p.device,
                       capacity=capacity)

    def forward(self, input_ids: Tensor, position_ids: Tensor | None = None, attn_mask: Tensor | None = None,
                cache: KVCache | None = None, *, keep: int | Tensor | None = None,
                logits_start: int = 0) -> Tensor:
        """Logits (B, T − logits_start, V); the arguments mean what they mean for
        :meth:`setdlm.model.Transformer.forward`."""
        B, T = input_ids.shape
        if position_ids is None:
            position_ids = torch.arange(T, device=input_ids.device).expand(B, T)
        step = begin_step(cache, position_ids, attn_mask)
        x = self.runner.layers(self, input_ids, position_ids, step, cache)  # (B, T, d)
        end_step(cache, step, keep)
        h = self.runner.final_norm(self, x[:, logits_start:])  # (B, T', d)
        return causal_lm(self.hf).lm_head(h)  # (B, T', V)

    def _attend(self, q: Tensor, k: Tensor, v: Tensor, layer: int, step: CacheStep, cache: KVCache | None,
                scale: float, dropout_p: float) -> Tensor:
        """Cache the new keys/values (KV heads), attend with the step's boolean mask. q: (B, H, T, hd);
        k, v: (B, Hkv, T, hd) → (B, T, H·hd).

        Wide attention (quantized backbones, :func:`setdlm.model.attention`): q, k and v are widened to float64
        *before* the cache, whose layers are float64 then (:meth:`new_cache`), so a step converts its new
        entries only, not the whole cache in every layer; the mask goes in as float64 (0 / −inf), made once per
        step: the same numbers SDPA computes from the boolean mask, without converting it in every layer."""
        B, H, T, hd = q.shape
        dtype, mask = q.dtype, step.mask
        wide = self._wide(dtype)
        if wide and dtype != torch.float64 and not isinstance(mask, MaskRule):
            q, k, v = q.double(), k.double(), v.double()
            mask = step.additive_mask(torch.float64)
        if cache is not None:
            k, v = cache.update(layer, k, v, step)  # (B, Hkv, W, hd)
        y = attention(q, k, v, mask, scale=scale, dropout_p=dropout_p if self.training else 0.0,
                      wide=wide).to(dtype)  # GQA inside
        return y.transpose(1, 2).reshape(B, T, H * hd)  # (B, T, H·hd)

    def fuse_projections(self) -> None:
        """Each Llama/Qwen layer's q/k/v projections become one linear layer (``qkv_proj``) and its MLP's gate
        and up projections another (``gate_up_proj``), the originals removed: fewer, wider matrix products per
        step. Used before quantizing (:func:`setdlm.formats.quantize.quantize`), where each output channel is computed
        from the same quantized input row either way, so the fused layers give the same numbers bit for bit;
        a float model is left unfused (a wider float product may round differently). After this the wrapped
        model decodes through this backbone only (its own ``forward`` would miss the removed layers). GPT-2's
        ``c_attn`` is already fused and its MLP has no gate: nothing to do."""
        self.runner.fuse(self.hf)

    def _fused(self, x: Tensor, cos: Tensor, step: CacheStep,
               cache: KVCache | None) -> tuple[list[Callable[..., Tensor]], KVCache] | None:
        """(:attr:`fused_layers`, the cache) where this forward is one they compute (as :meth:`LlamaRunner.layer`
        would, on the path of fused int8 projections and float64 attention): a decode against a contiguous cache,
        float32 activations, a boolean mask or none; else None."""
        if self.fused_layers is None or cache is None or cache.static or self.training or not self.wide_attention:
            return None
        if x.dtype != torch.float32 or cos.dtype != torch.float32 or isinstance(step.mask, MaskRule):
            return None
        if step.mask is not None and step.mask.dtype != torch.bool:
            return None
        if not all(t.is_contiguous() for t in (*cache.k[: self.n_layers], *cache.v[: self.n_layers])):
            return None
        return self.fused_layers, cache

    def _run_layer(self, fn: Callable[..., Tensor], *args: object) -> Tensor:
        """``fn(*args)``, under activation checkpointing when :attr:`grad_checkpointing` is on, the
        backbone trains and no cache is written (a recomputation would append to the cache twice)."""
        cache = args[-1]
        if self.grad_checkpointing and self.training and cache is None and torch.is_grad_enabled():
            return checkpoint(fn, *args, use_reentrant=False)  # RNG state replayed
        return fn(*args)


class LlamaRunner:
    """The forward of the Llama family (Llama, Qwen2, Qwen3; docs/method.md §3.2, §7.18): token embeddings, rotary
    positions (the model's own variant), RMSNorm, q/k/v/o projections (Qwen3: per-head q/k norms), a gated MLP.
    Its layers can be fused (:meth:`HFBackbone.fuse_projections`) and, int8-quantized, run as one compiled op
    (:mod:`setdlm.formats.fused`); a set drafter reads its layers (:mod:`setdlm.formats.drafted`)."""

    rotary = True  # positions by RoPE: the fused int8 layer and a set drafter apply

    @staticmethod
    def check(cfg) -> None:
        """Nothing beyond what every architecture checks (sliding windows, in :class:`HFBackbone`)."""

    @staticmethod
    def kv_heads(hf_model: nn.Module) -> tuple[int, int]:
        """(KV heads, head size) of the cache."""
        attn = llama(hf_model).model.layers[0].self_attn
        return attn.k_proj.out_features // attn.head_dim, attn.head_dim

    @staticmethod
    def layers(b: HFBackbone, input_ids: Tensor, position_ids: Tensor, step: CacheStep, cache: KVCache | None,
               taps: dict[int, Tensor | None] | None = None) -> Tensor:
        """The decoder layers' output (B, T, d); ``taps``: {layer index: None} filled with those layers' outputs
        (a drafter's features, :mod:`setdlm.formats.drafted`)."""
        base = llama(b.hf).model
        x = base.embed_tokens(input_ids)  # (B, T, d)
        cos, sin = base.rotary_emb(x, position_ids)  # (B, T, hd) each, the model's own RoPE variant
        cos, sin = cos[:, None], sin[:, None]  # (B, 1, T, hd)
        fused = b._fused(x, cos, step, cache)
        if fused is not None:  # the step's cache rows and float64 mask, made once for every layer
            ops, kv = fused
            flat, mask = step.flat_write_idx(b.n_kv_heads, kv.capacity), step.additive_mask(torch.float64)
        for i, layer in enumerate(base.layers):
            if fused is not None:  # the same layer as one op (setdlm.formats.fused), the same bits
                x = ops[i](x, cos, sin, kv.k[i], kv.v[i], flat, step.width, mask)
            else:
                x = b._run_layer(LlamaRunner.layer, b, layer, i, x, cos, sin, step, cache)
            if taps is not None and i in taps:
                taps[i] = x
        return x

    @staticmethod
    def layer(b: HFBackbone, layer: LlamaLayer, i: int, x: Tensor, cos: Tensor, sin: Tensor, step: CacheStep,
              cache: KVCache | None) -> Tensor:
        """One Llama/Qwen decoder layer on x (B, T, d) → (B, T, d)."""
        B, T, _ = x.shape
        a = layer.self_attn
        h = rms_norm(layer.input_layernorm, x)
        # dict lookups: a missed hasattr on a module raises and catches inside nn.Module, in every layer
        fused, qk_norm = "qkv_proj" in a._modules, "q_norm" in a._modules
        if fused and not qk_norm:  # fused (fuse_projections): RoPE on q|k at once
            qkv = a.qkv_proj(h)  # (B, T, (H + 2 Hkv)·hd)
            nq, nk, _ = a.qkv_sizes
            qk = qkv[..., : nq + nk].view(B, T, -1, a.head_dim)  # (B, T, H + Hkv, hd)
            qk = apply_rope(qk, cos.transpose(1, 2), sin.transpose(1, 2)).transpose(1, 2)  # (B, H + Hkv, T, hd)
            H = nq // a.head_dim
            q, k = qk[:, :H], qk[:, H:]  # (B, H, T, hd), (B, Hkv, T, hd)
            v = qkv[..., nq + nk:].view(B, T, -1, a.head_dim).transpose(1, 2)  # (B, Hkv, T, hd)
        else:
            if fused:
                q, k, v = a.qkv_proj(h).split(a.qkv_sizes, dim=-1)
            else:
                q, k, v = a.q_proj(h), a.k_proj(h), a.v_proj(h)
            q = q.view(B, T, -1, a.head_dim)  # (B, T, H, hd)
            k = k.view(B, T, -1, a.head_dim)  # (B, T, Hkv, hd)
            v = v.view(B, T, -1, a.head_dim).transpose(1, 2)  # (B, Hkv, T, hd)
            if qk_norm:  # Qwen3: RMSNorm over each head, before RoPE
                q, k = a.q_norm(q), a.k_norm(k)
            q = apply_rope(q.transpose(1, 2), cos, sin)  # (B, H, T, hd)
            k = apply_rope(k.transpose(1, 2), cos, sin)  # (B, Hkv, T, hd)
        scale = getattr(a, "scaling", a.head_dim ** -0.5)
        y = b._attend(q, k, v, i, step, cache, scale, getattr(a, "attention_dropout", 0.0))
        x = x + a.o_proj(y)
        h, mlp = rms_norm(layer.post_attention_layernorm, x), layer.mlp
        if "gate_up_proj" in mlp._modules:  # fused (fuse_projections): the same as LlamaMLP's forward
            gate, up = mlp.gate_up_proj(h).chunk(2, dim=-1)
            return x + mlp.down_proj(mlp.act_fn(gate) * up)
        return x + mlp(h)

    @staticmethod
    def final_norm(b: HFBackbone, x: Tensor) -> Tensor:
        return rms_norm(llama(b.hf).model.norm, x)

    @staticmethod
    def fuse(hf_model: nn.Module) -> None:
        """q/k/v into ``qkv_proj``, gate/up into ``gate_up_proj`` (:meth:`HFBackbone.fuse_projections`)."""
        for layer in llama(hf_model).model.layers:
            a, mlp = layer.self_attn, layer.mlp
            a.qkv_sizes = [a.q_proj.out_features, a.k_proj.out_features, a.v_proj.out_features]
            a.qkv_proj = _concat_linear(a.q_proj, a.k_proj, a.v_proj)
            mlp.gate_up_proj = _concat_linear(mlp.gate_proj, mlp.up_proj)
            del a.q_proj, a.k_proj, a.v_proj, mlp.gate_proj, mlp.up_proj


class GPT2Runner:
    """The forward of GPT-2 (docs/method.md §3.2): learned absolute positions, LayerNorm, a fused ``c_attn``
    projection, an ungated MLP; its KV heads are its attention heads."""

    rotary = False

    @staticmethod
    def check(cfg) -> None:
        if getattr(cfg, "add_cross_attention", False):
            raise UserError("GPT-2 config has add_cross_attention=True; the adapter supports decoder-only models")

    @staticmethod
    def kv_heads(hf_model: nn.Module) -> tuple[int, int]:
        cfg = causal_lm(hf_model).config
        return cfg.num_attention_heads, cfg.hidden_size // cfg.num_attention_heads

    @staticmethod
    def layers(b: HFBackbone, input_ids: Tensor, position_ids: Tensor, step: CacheStep,
               cache: KVCache | None) -> Tensor:
        base = gpt2(b.hf).transformer
        n_pos = base.wpe.num_embeddings
        if position_ids.numel() and (int(position_ids.max()) >= n_pos or int(position_ids.min()) < 0):
            raise UserError(f"GPT-2 position ids must lie in [0, {n_pos}), got max {int(position_ids.max())}")
        x = base.drop(base.wte(input_ids) + base.wpe(position_ids))  # (B, T, d) learned absolute positions
        for i, block in enumerate(base.h):
            x = b._run_layer(GPT2Runner.block, b, block, i, x, step, cache)
        return x

    @staticmethod
    def block(b: HFBackbone, block: GPT2Block, i: int, x: Tensor, step: CacheStep, cache: KVCache | None) -> Tensor:
        """One GPT-2 block on x (B, T, d) → (B, T, d)."""
        B, T, d = x.shape
        H, hd = d // b.head_dim, b.head_dim
        cfg = causal_lm(b.hf).config
        a = block.attn
        q, k, v = a.c_attn(block.ln_1(x)).split(d, dim=2)  # (B, T, d) each
        q, k, v = (t.view(B, T, H, hd).transpose(1, 2) for t in (q, k, v))  # (B, H, T, hd)
        scale = hd ** -0.5 if cfg.scale_attn_weights else 1.0
        if cfg.scale_attn_by_inverse_layer_idx:
            scale /= float(i + 1)
        y = b._attend(q, k, v, i, step, cache, scale, a.attn_dropout.p)
        x = x + a.resid_dropout(a.c_proj(y))
        return x + block.mlp(block.ln_2(x))

    @staticmethod
    def final_norm(b: HFBackbone, x: Tensor) -> Tensor:
        return gpt2(b.hf).transformer.ln_f(x)

    @staticmethod
    def fuse(hf_model: nn.Module) -> None:
        """GPT-2's ``c_attn`` is already fused; its MLP has no gate."""


# one runner per architecture, chosen once per backbone from config.model_type
RUNNERS: dict[str, type[LlamaRunner] | type[GPT2Runner]] = {**{t: LlamaRunner for t in LLAMA_LIKE}, "gpt2": GPT2Runner}


def rms_norm(norm: Norm, x: Tensor) -> Tensor:
    """``norm(x)`` for a Llama/Qwen RMSNorm module: in float32 as one ``F.rms_norm`` call, which computes what the
    module's own forward does (``x · rsqrt(mean(x²) + eps) · weight``, tested equal bit for bit) in one op
    instead of seven; other dtypes (the module upcasts to float32 inside) and other norms run the module."""
    eps = getattr(norm, "variance_epsilon", None)
    if x.dtype != torch.float32 or eps is None or norm.weight.dtype != torch.float32:
        return norm(x)
    return F.rms_norm(x, (x.shape[-1],), norm.weight, eps)


def _concat_linear(*projections: Projection) -> nn.Linear:
    """One ``nn.Linear`` whose output is the outputs of ``projections`` (same input) side by side."""
    layers = [m for m in projections if isinstance(m, nn.Linear)]
    if len(layers) < len(projections):
        raise UserError("fuse_projections fuses float nn.Linear layers: fuse before quantizing")
    fused = nn.Linear(layers[0].in_features, sum(m.out_features for m in layers), bias=layers[0].bias is not None,
                      device=layers[0].weight.device, dtype=layers[0].weight.dtype)
    with torch.no_grad():
        fused.weight.copy_(torch.cat([m.weight for m in layers]))
        if fused.bias is not None:
            fused.bias.copy_(torch.cat([m.bias for m in layers]))
    return fused


# ---------------------------------------------------------------------------------------------------------
# MASK token, tokenizer, loading
# ---------------------------------------------------------------------------------------------------------


def add_mask_token(model: nn.Module, tokenizer, mask_token: str = DEFAULT_MASK_TOKEN) -> int:
    """Give ``tokenizer`` a MASK token when it has none and make sure ``model``'s embeddings (and its head)
    have a row for it, resizing them when needed; returns the MASK id. A tokenizer that already has a MASK
    token keeps it. Models whose embedding matrix has spare rows (Qwen) need no resize."""
    if tokenizer.mask_token_id is None:
        tokenizer.add_special_tokens({"mask_token": mask_token})
    mask_id, lm = int(tokenizer.mask_token_id), causal_lm(model)
    old = lm.get_input_embeddings().num_embeddings
    if mask_id >= old:
        lm.resize_token_embeddings(len(tokenizer), mean_resizing=False)
        with torch.no_grad():  # new rows start at the mean of the old ones: deterministic, in distribution
            for emb in {id(e): e for e in (lm.get_input_embeddings(), lm.get_output_embeddings())
                        if e is not None}.values():
                emb.weight[old:] = emb.weight[:old].mean(0)
    return mask_id


def adapt(model: nn.Module, tokenizer, mask_token: str = DEFAULT_MASK_TOKEN) -> tuple[HFBackbone, int]:
    """An HF causal LM and its tokenizer → (setdlm backbone, MASK token id). Adds the MASK token if needed."""
    mask_id = add_mask_token(model, tokenizer, mask_token)
    return HFBackbone(model), mask_id


class HFTokenizer:
    """setdlm's duck-typed tokenizer (see :mod:`setdlm.lm`) over a ``transformers`` tokenizer: ``encode``
    adds no special tokens unless asked (a string prompt gets them as ``transformers`` adds them,
    :func:`setdlm.data.prompt.encode_prompt`), ``vocab_size`` counts added tokens."""

    kind, prompt = "hf", "transformers"

    def __init__(self, tokenizer):
        self.hf = tokenizer

    @property
    def chat_template(self):
        return getattr(self.hf, "chat_template", None)

    @property
    def tokens(self) -> dict:
        return {r: getattr(self.hf, f"{r}_token", None) for r in ("bos", "eos", "pad", "mask", "unk")}

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return self.hf.encode(text, add_special_tokens=add_special_tokens)

    def encode_special(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Ids of ``text`` whose special tokens' strings are the special tokens (a rendered chat template)."""
        return self.hf.encode(text, add_special_tokens=add_special_tokens, split_special_tokens=False)

    def decode(self, ids) -> str:
        return self.hf.decode([int(i) for i in ids])

    @property
    def vocab_size(self) -> int:
        return len(self.hf)

    mask_token_id = property(lambda self: self.hf.mask_token_id)
    bos_token_id = property(lambda self: self.hf.bos_token_id)
    eos_token_id = property(lambda self: self.hf.eos_token_id)
    pad_token_id = property(lambda self: self.hf.pad_token_id)


def setdlm_tokenizer(tokenizer):
    """setdlm's :class:`~setdlm.data.Tokenizer` over a copy of a ``transformers`` fast tokenizer: the same
    vocabulary, added tokens and special tokens (BERT's [CLS]/[SEP] play BOS/EOS), and its chat template.
    Use it to train on or checkpoint a model whose tokenizer came from ``transformers``; call
    :func:`add_mask_token` first so that the MASK token is part of it."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        raise UserError(f"{type(tokenizer).__name__} is a slow tokenizer; setdlm needs a fast one (tokenizer.json)")
    names = {r: getattr(tokenizer, f"{r}_token", None) for r in ROLES}
    names["bos"] = names["bos"] or getattr(tokenizer, "cls_token", None)
    names["eos"] = names["eos"] or getattr(tokenizer, "sep_token", None)
    names = {r: (str(n) if n is not None else None) for r, n in names.items()}
    template = getattr(tokenizer, "chat_template", None)
    return Tokenizer(Backend.from_str(backend.to_str()), kind="hf", chat_template=template if isinstance(template, str)
                     else None, **names)


def config_dict(backbone: HFBackbone) -> dict:
    """The wrapped model's ``transformers`` config as plain JSON (what a setdlm checkpoint records)."""
    return json.loads(causal_lm(backbone.hf).config.to_json_string(use_diff=False))


def _no_init():
    """transformers' context that skips random initialisation (the weights are loaded right after)."""
    try:
        from transformers.initialization import no_init_weights  # transformers >= 5
    except ImportError:
        try:
            from transformers.modeling_utils import no_init_weights  # transformers 4.x
        except ImportError:
            return nullcontext()
    return no_init_weights()


def backbone_from_config(config: dict | object, dtype: torch.dtype | None = None) -> HFBackbone:
    """An :class:`HFBackbone` with the architecture ``config`` (a ``transformers`` config or its dict) and
    uninitialised weights, for loading a state dict into; in eval mode."""
    from transformers import AutoConfig, AutoModelForCausalLM

    if isinstance(config, dict):
        d = {k: v for k, v in config.items() if k not in ("transformers_version", "_name_or_path")}
        kind = d.pop("model_type", None)
        if kind not in SUPPORTED_MODEL_TYPES:
            raise UserError(f"unsupported model_type {kind!r}; the adapter supports {', '.join(SUPPORTED_MODEL_TYPES)}")
        config = AutoConfig.for_model(kind, **d)
    with _no_init():
        model = AutoModelForCausalLM.from_config(config)
    if getattr(model.config, "tie_word_embeddings", False):
        model.tie_weights()  # skipped along with the initialisation
    if dtype is not None:
        model = model.to(dtype)
    return HFBackbone(model.eval())


def load_pretrained(name_or_path: str, *, dtype: torch.dtype | None = None, device=None,
                    mask_token: str = DEFAULT_MASK_TOKEN, revision: str | None = None,
                    cache_dir: str | None = None) -> tuple[HFBackbone, HFTokenizer, int]:
    """Load an HF causal LM and its tokenizer from a local folder (never touches the network) or a Hub id
    (needs network unless already in the local HF cache), add the MASK token, wrap it.

    Returns ``(backbone, tokenizer, mask_token_id)``. Without network a Hub id that is not cached raises
    :class:`HubUnreachableError`, saying that it needs network or a local path.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    local = os.path.isdir(os.path.expanduser(name_or_path))
    if not local and (name_or_path.startswith(("/", ".", "~")) or name_or_path.count("/") > 1):
        raise UserError(f"no model folder at {name_or_path!r}")
    path = os.path.expanduser(name_or_path) if local else name_or_path
    offline = not local and not hub_reachable()
    kw = dict(revision=revision, cache_dir=cache_dir, local_files_only=local or offline)
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, **kw)
        model = AutoModelForCausalLM.from_pretrained(path, **kw)
    except OSError as e:
        if not local and (offline or is_connection_failure(e)):
            raise HubUnreachableError(
                f"{name_or_path!r} is not a local folder and the Hugging Face Hub cannot be reached: loading a Hub "
                f"id needs network access; otherwise pass the path of a local folder holding the model (e.g. made "
                f"elsewhere with `hf download {name_or_path} --local-dir DIR`)") from e
        raise
    model = model.to(device=device, dtype=dtype).eval()  # type: ignore[call-arg]  # @wraps stub: self unbound
    backbone, mask_id = adapt(model, tokenizer, mask_token)
    return backbone, HFTokenizer(tokenizer), mask_id
