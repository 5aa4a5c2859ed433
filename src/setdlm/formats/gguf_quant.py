"""Keeping a GGUF file's own quantization: ``setdlm.load(file, quantize="gguf")`` (docs/quantization.md).

A GGUF file stores most linear weights quantized in blocks of 32 input channels. :mod:`setdlm.formats.gguf` converts
the file once into a float32 checkpoint; with ``quantize="gguf"`` each linear layer of the loaded backbone is
then replaced according to the type its tensor has *in the file*:

- ``Q4_0`` (``w = d·(q − 8)``) and ``Q4_1`` (``w = d·q + m``), ``q`` in 0..15, one fp16 ``d`` (and ``m``) per
  block: the file's codes and block scales go as they are into the int4 kernel
  (:class:`setdlm.formats.quantize.Int4Linear`, whose groups are these blocks), so the weights the kernel multiplies
  by are the file's weights (to float32 rounding), not a second quantization of them.
- ``Q8_0`` (``w = d·q``, ``q`` int8, one fp16 ``d`` per block): the int8 kernel
  (:class:`setdlm.formats.quantize.Int8Linear`). fbgemm's int8 GEMM takes one scale per output channel, not per
  block, so a row's blocks are re-rounded to the row's scale (``max |w| / 127``); where a row's blocks share
  one scale this is the file's int8 values exactly.
- anything else (``F32``, ``F16``, ``BF16``, the K-quants ``Q2_K`` … ``Q6_K``, ``Q5_0`` / ``Q5_1``, the
  ``IQ`` types): the dequantized float32 weights, as without ``quantize=``.

The output head stays float32 whatever its type: the file's weights dequantized exactly (a ``Q8_0`` head
through the int8 kernel's 7-bit activations flips SmolLM2's near-tied first answer token). A row the file does
not hold is quantized from its float weights by the same kernel's own rule. Embeddings, norms and the KV cache
stay float32, as for ``quantize="int8"``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import Tensor, nn

from ..errors import UserError
from .gguf import _field, read_header
from .hf_modules import causal_lm
from .quantize import (INT4_GROUP, Int4Linear, Int8Linear, QuantizedLinear, check_cpu, finish, int4_groups, kept_float,
                       linear_layers, replace_layer)

if TYPE_CHECKING:
    from gguf import ReaderTensor

BLOCK = 32  # ggml's block of the legacy quant types (QK4_0 = QK4_1 = QK8_0 = 32)
KERNEL_OF_TYPE = {"Q4_0": "int4", "Q4_1": "int4", "Q8_0": "int8"}  # every other type: dequantized float32


def q4_blocks(raw: np.ndarray, kind: str) -> tuple[Tensor, Tensor, Tensor]:
    """A ``Q4_0`` / ``Q4_1`` tensor's bytes (rows, bytes per row) as ``(q, s, lo)``, ``w = q·s + lo``: codes
    ``q`` (rows, K) in 0..15 and per-block ``s``, ``lo`` (rows, K/32). ggml's block: fp16 ``d`` (and fp16
    ``m`` for Q4_1), then 16 bytes whose low nibbles are elements 0..15 and high nibbles elements 16..31."""
    head = 2 if kind == "Q4_0" else 4
    blocks = raw.reshape(raw.shape[0], -1, head + BLOCK // 2)  # (rows, K/32, 18 | 20)
    d = blocks[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)  # (rows, K/32)
    lo = -8 * d if kind == "Q4_0" else blocks[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32)
    qs = blocks[..., head:]  # (rows, K/32, 16)
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=-1).reshape(raw.shape[0], -1)  # (rows, K)
    return torch.from_numpy(q.astype(np.int32)), torch.from_numpy(d), torch.from_numpy(np.ascontiguousarray(lo))


def file_tensors(path: Path, hf_model: nn.Module) -> dict[str, ReaderTensor]:
    """The GGUF tensor (``gguf.ReaderTensor``) behind each linear weight of ``hf_model``, by the Hugging Face
    name of its module (``model.layers.0.self_attn.q_proj``); a tied output head maps to the embedding."""
    import gguf


    reader, lm = read_header(path), causal_lm(hf_model)
    arch_name = _field(reader, "general.architecture")
    arch = {v: k for k, v in gguf.MODEL_ARCH_NAMES.items()}.get(arch_name or "")
    if arch is None:
        raise UserError(f"{path}: quantize='gguf' does not know this file's architecture ({arch_name!r})",
                        fields=("quantize",))
    names = gguf.get_tensor_name_map(arch, lm.config.num_hidden_layers)
    by_name = {t.name: t for t in reader.tensors}
    out = {}
    for name, _ in linear_layers(hf_model):
        tensor = by_name.get(names.get_name(name + ".weight", try_suffixes=(".weight",)) or "")
        if tensor is None and getattr(lm.config, "tie_word_embeddings", False) and \
                lm.get_output_embeddings() is hf_model.get_submodule(name):
            tensor = by_name.get(f"{gguf.TENSOR_NAMES[gguf.MODEL_TENSOR.TOKEN_EMBD]}.weight")
        if tensor is not None:
            out[name] = tensor
    return out


def _match_rows(weight: Tensor, file_weight: Tensor) -> Tensor:
    """For each row of ``weight`` (out, K), the index of the identical row of ``file_weight`` (rows, K), or −1
    (a row the file does not hold). Matching by value covers the row orders converters permute (llama.cpp
    stores Llama's q/k projections with RoPE's halves interleaved; transformers undoes it on load)."""
    index = {row.tobytes(): i for i, row in enumerate(file_weight.numpy())}
    return torch.tensor([index.get(row.tobytes(), -1) for row in weight.float().numpy()])


def int4_from_file(weight: Tensor, bias: Tensor | None, tensor: ReaderTensor) -> Int4Linear:
    """An :class:`Int4Linear` whose groups are the Q4_0 / Q4_1 blocks of the file's ``tensor``."""
    from gguf import dequantize

    q, s, lo = q4_blocks(np.asarray(tensor.data), tensor.tensor_type.name)
    rows = _match_rows(weight, torch.from_numpy(dequantize(np.asarray(tensor.data), tensor.tensor_type)))
    own = int4_groups(weight)  # rows the file lacks keep the kernel's own rule
    have = rows >= 0
    groups = own[0].clone(), own[1].clone(), own[2].clone()
    for mine, theirs in zip(groups, (q, s, lo)):
        mine[have] = theirs[rows[have]].to(mine.dtype)
    return Int4Linear(weight, bias, groups)


def keep_file_quantization(backbone: nn.Module, path: str | Path) -> nn.Module:
    """Replace each linear layer of ``backbone`` (a GGUF file's model, loaded in float32 from its converted
    checkpoint) by the kernel of its tensor's type in the file at ``path`` (:data:`KERNEL_OF_TYPE`; other
    types stay float). Returns the backbone in eval mode, ``quantization == "gguf"``, with
    ``gguf_types``: the file's type of each replaced layer's tensor, by module name."""
    check_cpu(backbone, "gguf")
    hf_model = getattr(backbone, "hf", None)
    if hf_model is None:
        raise UserError("quantize='gguf' needs a model loaded from a GGUF file", fields=("quantize",))
    tensors = file_tensors(Path(path), hf_model)
    types, keep = {}, kept_float(hf_model, "gguf")
    for name, (weight, bias) in linear_layers(hf_model):
        tensor = None if name in keep else tensors.get(name)
        if tensor is None:
            continue
        kind = tensor.tensor_type.name
        layer: QuantizedLinear
        if KERNEL_OF_TYPE.get(kind) == "int4" and weight.shape[1] % INT4_GROUP == 0:
            layer = int4_from_file(weight, bias, tensor)
        elif KERNEL_OF_TYPE.get(kind) == "int8":
            layer = Int8Linear(weight, bias)  # the exact dequantized blocks, one scale per row
        else:
            continue
        replace_layer(hf_model, name, layer)
        types[name] = kind
    finish(backbone, "gguf")
    backbone.gguf_types = types  # type: ignore[assignment]  # torch types Module.__setattr__ for Tensor | Module only
    return backbone.eval()
