"""Typed views of the ``transformers`` modules that setdlm reads by attribute name (docs/method.md §7.18).

A ``transformers`` causal LM is a tree of ``nn.Module`` s whose children are attributes set in ``__init__``; read
through ``nn.Module.__getattr__``, a type checker sees each of them as ``Tensor | Module``. The Protocols below name
what :mod:`setdlm.formats.hf` (the runners), :mod:`setdlm.formats.drafted` and the drafter's training read, as the
Llama / Qwen2 / Qwen3 and GPT-2 modeling files define them (only submodule names, stable across ``transformers``
releases, are relied upon). :func:`llama`, :func:`gpt2` and :func:`causal_lm` view a model through them and check
nothing at run time: the architecture is checked once, from ``config.model_type``, when an
:class:`~setdlm.formats.hf.HFBackbone` is built.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol, cast

from torch import Tensor, nn

if TYPE_CHECKING:
    from transformers import PreTrainedConfig


class Projection(Protocol):
    """An ``nn.Linear``, or the quantized layer that replaces it (:mod:`setdlm.formats.quantize`)."""

    out_features: int

    @property
    def weight(self) -> Tensor: ...  # (out, in); a quantized layer's dequantized

    def __call__(self, x: Tensor, /) -> Tensor: ...


class Unary(Protocol):
    """A module of one tensor (an MLP, a dropout, an activation)."""

    def __call__(self, x: Tensor, /) -> Tensor: ...


class Norm(Unary, Protocol):
    """RMSNorm (Llama family) or LayerNorm (GPT-2)."""

    @property
    def weight(self) -> Tensor: ...


class Embedding(Protocol):
    num_embeddings: int

    @property
    def weight(self) -> Tensor: ...

    def __call__(self, ids: Tensor, /) -> Tensor: ...


class Rotary(Protocol):
    """The model's own RoPE: (cos, sin), each (B, T, hd), of hidden states x (for their dtype) at positions."""

    def __call__(self, x: Tensor, position_ids: Tensor, /) -> tuple[Tensor, Tensor]: ...


class LlamaAttention(Protocol):
    """``LlamaAttention`` / ``Qwen2Attention`` / ``Qwen3Attention``. ``q_norm``/``k_norm`` exist in Qwen3 only;
    ``qkv_proj``/``qkv_sizes`` replace ``q_proj``/``k_proj``/``v_proj`` once fused
    (:meth:`~setdlm.formats.hf.HFBackbone.fuse_projections`): ask ``_modules`` which are there."""

    _modules: dict[str, nn.Module | None]
    head_dim: int
    q_proj: Projection
    k_proj: Projection
    v_proj: Projection
    o_proj: Projection
    q_norm: Norm
    k_norm: Norm
    qkv_proj: Projection
    qkv_sizes: list[int]


class LlamaMLP(Unary, Protocol):
    """The gated MLP; ``gate_up_proj`` replaces ``gate_proj``/``up_proj`` once fused."""

    _modules: dict[str, nn.Module | None]
    gate_proj: Projection
    up_proj: Projection
    down_proj: Projection
    gate_up_proj: Projection
    act_fn: Unary


class LlamaLayer(Protocol):
    self_attn: LlamaAttention
    mlp: LlamaMLP
    input_layernorm: Norm
    post_attention_layernorm: Norm


class LlamaModel(Protocol):
    embed_tokens: Embedding
    rotary_emb: Rotary
    layers: Sequence[LlamaLayer]  # an nn.ModuleList
    norm: Norm


class CausalLM(Protocol):
    """What every supported ``*ForCausalLM`` / ``GPT2LMHeadModel`` has."""

    config: PreTrainedConfig
    lm_head: Projection

    def get_input_embeddings(self) -> Embedding: ...

    def get_output_embeddings(self) -> Projection: ...

    def resize_token_embeddings(self, new_num_tokens: int, *, mean_resizing: bool) -> object: ...


class LlamaForCausalLM(CausalLM, Protocol):
    model: LlamaModel


class GPT2Attention(Protocol):
    c_attn: Projection
    c_proj: Projection
    attn_dropout: nn.Dropout  # its p is the attention dropout
    resid_dropout: Unary


class GPT2Block(Protocol):
    ln_1: Norm
    attn: GPT2Attention
    ln_2: Norm
    mlp: Unary


class GPT2Model(Protocol):
    wte: Embedding
    wpe: Embedding
    drop: Unary
    h: Sequence[GPT2Block]  # an nn.ModuleList
    ln_f: Norm


class GPT2LMHeadModel(CausalLM, Protocol):
    transformer: GPT2Model


def causal_lm(model: nn.Module) -> CausalLM:
    """``model`` (a supported ``transformers`` causal LM) through :class:`CausalLM`."""
    return cast(CausalLM, model)  # a view: transformers' attributes are read by name (module docstring)


def llama(model: nn.Module) -> LlamaForCausalLM:
    """A Llama / Qwen2 / Qwen3 causal LM through :class:`LlamaForCausalLM`."""
    return cast(LlamaForCausalLM, model)  # a view: transformers' attributes are read by name (module docstring)


def gpt2(model: nn.Module) -> GPT2LMHeadModel:
    """A GPT-2 causal LM through :class:`GPT2LMHeadModel`."""
    return cast(GPT2LMHeadModel, model)  # a view: transformers' attributes are read by name (module docstring)
