"""The fused layer: a Llama decoder layer of an int8 or int4 Hugging Face backbone as one compiled op
(docs/quantization.md, "The fused layer").

A decode step of SmolLM2-135M at batch 1 spends about as long between its matrix products as in them: some
230 ATen calls a layer (views, slices, casts, the per-row activation scaling), each parsed and dispatched from
Python. ``fused_layer.cpp`` makes the same ATen calls, in the same order and on tensors of the same shapes and
strides, from C++: the layer's outputs and the KV cache it writes are the same bits as the Python layer's
(``tests/test_fused_int8.py``, ``tests/test_fused_int4.py``), and a step costs less.

The op is compiled once per machine and torch version with PyTorch's C++ extension loader (a C++ compiler and
``ninja`` must be present; about 15 s) into ``$SETDLM_CACHE/kernels``; where it cannot be built the backbone
runs the Python layer (the same numbers, slower) after one log line. ``SETDLM_FUSED=0`` turns it off.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .gguf import cache_root
from .hf import HFBackbone

SOURCE = Path(__file__).with_name("fused_layer.cpp")
log = logging.getLogger("setdlm")


@functools.cache
def fused_ops() -> Any:
    """``torch.ops.setdlm_fused`` (``llama_int8_layer``, ``llama_int4_layer``), built (first use on a machine) and
    loaded (once per process); None where ``SETDLM_FUSED=0`` or it cannot be built."""
    if os.environ.get("SETDLM_FUSED", "1") == "0":
        return None
    try:
        from torch.utils import cpp_extension  # costly to import (setuptools); only quantized backbones need it

        folder = cache_root() / "kernels" / f"fused-torch-{torch.__version__}"
        folder.mkdir(parents=True, exist_ok=True)
        if not any(folder.glob("*.so")):
            log.warning("setdlm: compiling the fused layer once for this machine (about 15 s) into %s", folder)
        cpp_extension.load(name="setdlm_fused", sources=[str(SOURCE)], extra_cflags=["-O2"],
                           build_directory=str(folder), is_python_module=False)
        return torch.ops.setdlm_fused
    except Exception as e:  # no compiler, no ninja, a read-only cache: the Python layer computes the same numbers
        log.warning("setdlm: the fused layer could not be built (%s); int8 and int4 layers run in Python (same "
                    "outputs, slower)", str(e).splitlines()[0][:200] if str(e) else type(e).__name__)
        return None


def prepare(backbone: nn.Module) -> None:
    """Give every int8 or int4 Llama-family :class:`HFBackbone` in ``backbone`` (a drafted model's base too) its
    fused layers (:attr:`HFBackbone.fused_layers`), where each layer is one an op computes: projections fused,
    all int8 or all int4 (bfloat16 path) without bias, no per-head q/k norm (Qwen3), SiLU gate, RMSNorm. Leaves
    any other backbone alone."""
    for m in backbone.modules():
        if isinstance(m, HFBackbone) and m.runner.rotary:
            hf_model: Any = m.hf.model
            hf_layers = hf_model.layers
            args = [_layer_args(layer) for layer in hf_layers]
            ready = [a for a in args if a is not None]
            if len(ready) == len(args) and (ops := fused_ops()) is not None:
                m.fused_layers = [_bind(ops, a) for a in ready]


def _bind(ops: Any, args: tuple) -> Callable:
    """``layer(x, cos, sin, ck, cv, flat, width, mask)``: the layer's op (``llama_int8_layer`` or
    ``llama_int4_layer``) with its own arguments bound."""
    kind, w_in, w_post, eps, products, sizes, scale = args
    op = getattr(ops, f"llama_{kind}_layer").default

    def layer(x, cos, sin, ck, cv, flat, width, mask):
        return op(x, w_in, w_post, eps, *products, sizes, cos, sin, ck, cv, flat, width, mask, scale)
    return layer


def _layer_args(layer: Any) -> tuple | None:  # an HF decoder layer (attributes by name)
    """An op's per-layer arguments (the kind, norm weights, eps, the four products' packed weights, sizes,
    scale), or None where the layer is not one an op computes."""
    a, mlp = layer.self_attn, layer.mlp
    linears = [a._modules.get("qkv_proj"), a._modules.get("o_proj"), mlp._modules.get("gate_up_proj"),
               mlp._modules.get("down_proj")]
    # quantized layers (setdlm.formats.quantize, which calls prepare: asked by their kind, not imported): all
    # int8, or all int4 on the kernel's bfloat16 path (a GGUF file's own Q4 blocks run its float32 path)
    kind = getattr(linears[0], "kind", None)
    if kind not in ("int8", "int4") or "q_norm" in a._modules:
        return None
    if not all(getattr(lin, "kind", None) == kind and lin.bias is None for lin in linears):
        return None
    if kind == "int4" and not all(lin.activations == torch.bfloat16 for lin in linears):
        return None
    norms = (layer.input_layernorm, layer.post_attention_layernorm)
    if any(getattr(n, "variance_epsilon", None) is None or n.weight.dtype != torch.float32 for n in norms):
        return None
    act = getattr(mlp, "act_fn", None)
    if not isinstance(act, nn.SiLU) and type(act).__name__ not in ("SiLU", "SiLUActivation"):
        return None
    eps = norms[0].variance_epsilon
    if norms[1].variance_epsilon != eps or getattr(a, "attention_dropout", 0.0) and a.training:
        return None
    sizes = [*a.qkv_sizes, a.head_dim, norms[0].weight.numel(), mlp.gate_up_proj.out_features]
    scale = getattr(a, "scaling", a.head_dim ** -0.5)
    # the op's product arguments: int8's four packed weights; int4's one list of codes and scales, in turn
    products: tuple = (tuple(lin._packed for lin in linears) if kind == "int8" else
                       ([t for lin in linears for t in (lin._q, lin._sz)],))
    return kind, norms[0].weight, norms[1].weight, float(eps), products, sizes, float(scale)
