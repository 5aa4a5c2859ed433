"""Quantized decoding on the CPU: int8 and int4 weights for every linear layer of a backbone
(docs/quantization.md).

``setdlm.load(path, quantize="int8" | "int4")`` (or :func:`quantize` on a loaded backbone) replaces each
linear layer of the DiT or of a Hugging Face backbone (q/k/v/o projections, MLPs, output head; GPT-2's
``Conv1D`` too) by one that runs a PyTorch CPU kernel on quantized weights. Embeddings, norms and the
attention product stay in the model's precision; the KV cache keeps its dtype.

- ``"int8"``: symmetric int8 weights per output channel through fbgemm's int8 GEMM, activations quantized to
  (7-bit) uint8 **per row**. fbgemm's dynamic linear (``torch.ops.quantized.linear_dynamic``) picks one
  activation range for the whole input tensor, so a row's output would depend on the other rows of the batch
  and on how many tokens a step feeds; here each row is first divided by its own absolute maximum, quantized
  with the range fixed at [-1, 1] (``quantized.linear_with_input_q_dq_qweight_dq_output_fp32``, the same GEMM
  with the activation scale given), and the result is multiplied back by the row's maximum: the quantization
  of a row is a function of that row alone.
- ``"int4"``: asymmetric 4-bit weights in groups of 32 input channels (the layout of GGUF's Q4_1), packed two
  per byte, through PyTorch's weight-only int4 kernel (``aten._weight_int4pack_mm_for_cpu``) on its vectorized
  path: activations, scales and outputs in bfloat16 (a GGUF file's own 4-bit weights take its float32 path).
  The output head gets int8 weights per output channel, weight-only (``aten._weight_int8pack_mm``, bfloat16
  activations): 4-bit or activation-quantized heads move near-tied logits (docs/quantization.md).

Either way each output row is a function of its own input row only, so the exactness contract of the
decoders holds within the quantized model (docs/method.md §3.3): cached logits equal recomputed ones, and a
row decoded in a batch equals the row decoded alone. Quantized backbones decode; they do not train or save.
"""

from __future__ import annotations

import contextlib
import logging
import warnings

import torch
from torch import Tensor, nn

from ..errors import InputWarning, UserError
from .fused import prepare as prepare_fused

QUANTIZATIONS = ("int8", "int4", "gguf")  # "gguf": the file's own types (setdlm.formats.gguf_quant)
INT4_GROUP = 32
# int8 activations: a row divided by its absolute maximum lies in [-1, 1], quantized to uint8 with step 2/127 and
# zero point 64 (levels 0..128, the 7-bit range fbgemm's dynamic linear keeps on x86), then fbgemm's int8 GEMM
# with a float32 output: torch.ops.quantized.linear_dynamic's arithmetic with the range fixed instead of read
# from the tensor, in one op (no pinning row, no slicing).
ACT_SCALE, ACT_ZERO = 2 / 127, 64
# the overload itself, not the packet: a packet whose op takes a packed-weight object checks every call's
# arguments for fake script objects in Python first (about 15 µs a call, 121 calls a SmolLM2 step)
_INT8_GEMM = torch.ops.quantized.linear_with_input_q_dq_qweight_dq_output_fp32.default
_TINY = torch.finfo(torch.float32).tiny
# The engine the int8 kernel packs for, chosen here rather than inherited from torch.backends.quantized.engine
# (whose default, "x86", and the alternatives "onednn" / "qnnpack" pack weights for other kernels, some without
# the fixed-range op above); int4 runs an ATen op, engine-free.
INT8_ENGINE = "fbgemm"
log = logging.getLogger("setdlm")


def check_quantize(quantize: str | None) -> str | None:
    """``quantize`` if it names a supported scheme (or is None), else a ValueError naming the choices."""
    if quantize is not None and quantize not in QUANTIZATIONS:
        raise UserError(f"quantize must be one of {', '.join(QUANTIZATIONS)} (or None), got {quantize!r}",
                        fields=("quantize",))
    return quantize


def linear_layers(module: nn.Module) -> list[tuple[str, tuple[Tensor, Tensor | None]]]:
    """``(name, (weight (out, in), bias))`` of every linear layer inside ``module``."""
    return [(name, w) for name, m in module.named_modules() if (w := _weight_of(m)) is not None]


def output_head(module: nn.Module) -> nn.Module | None:
    """The layer that maps hidden states to logits: a Hugging Face model's output embeddings (``lm_head``,
    SmolLM2's tied to its input embedding), the DiT's ``head``."""
    hf = getattr(module, "hf", module)
    getter = getattr(hf, "get_output_embeddings", None)
    if callable(getter):
        return getter()
    head = getattr(module, "head", None)
    return head if isinstance(head, nn.Module) else None


def head_names(module: nn.Module) -> set[str]:
    """Names of the output head (:func:`output_head`) inside ``module`` (empty where it has none)."""
    head = output_head(module)
    return set() if head is None else {name for name, m in module.named_modules() if m is head}


def kept_float(module: nn.Module, quantize: str) -> set[str]:
    """Names of the linear layers of ``module`` that ``quantize`` leaves in float: the output head under "gguf"
    (docs/quantization.md: a head quantized with its activations, or to 4 bits, flips near-tied logits, e.g.
    SmolLM2's first answer token), none under "int8" and "int4" ("int4" gives the head
    :class:`Int8WeightLinear`)."""
    return head_names(module) if quantize == "gguf" else set()


def replace_layer(root: nn.Module, name: str, layer: nn.Module) -> None:
    """Put ``layer`` where the submodule ``name`` of ``root`` is."""
    parent, _, attr = name.rpartition(".")
    setattr(root.get_submodule(parent) if parent else root, attr, layer)


def check_cpu(backbone: nn.Module, quantize: str) -> None:
    """A ValueError unless ``backbone`` is unquantized and on the CPU (where the kernels run)."""
    if getattr(backbone, "quantization", None):
        raise UserError(f"the backbone is already {backbone.quantization}-quantized")
    p = next(backbone.parameters())
    if p.device.type != "cpu":
        raise UserError(f"quantize={quantize!r} runs on the CPU; the backbone is on {p.device}",
                        fields=("quantize",))


def _weight_of(module: nn.Module) -> tuple[Tensor, Tensor | None] | None:
    """(weight (out, in), bias) of a linear layer (``nn.Linear`` or transformers' ``Conv1D``), else None."""
    if isinstance(module, nn.Linear):
        return module.weight.detach(), None if module.bias is None else module.bias.detach()
    weight, bias = getattr(module, "weight", None), getattr(module, "bias", None)
    if type(module).__name__ == "Conv1D" and hasattr(module, "nf") and isinstance(weight, Tensor) \
            and isinstance(bias, Tensor):  # GPT-2: weight stored (in, out)
        return weight.detach().t(), bias.detach()
    return None


class QuantizedLinear(nn.Module):
    """A linear layer ``y = x Wᵀ + b`` on quantized weights; :attr:`weight` returns the dequantized ``W`` (what
    the kernel multiplies by) for inspection and tests. Subclasses set ``kind`` and implement ``_matmul``."""

    kind: str
    bias: Tensor | None  # a buffer

    def __init__(self, weight: Tensor, bias: Tensor | None):
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.register_buffer("bias", None if bias is None else bias.float().clone())
        self.train(False)

    def forward(self, x: Tensor) -> Tensor:
        if self.training:
            raise RuntimeError(f"a {self.kind}-quantized backbone decodes only; train the unquantized model")
        shape, dtype = x.shape, x.dtype
        x = x.reshape(-1, self.in_features)
        y = self._matmul(x if dtype == torch.float32 else x.float())  # (N, out); no cast op when already float32
        if self.bias is not None:
            y = y + self.bias
        return (y if dtype == torch.float32 else y.to(dtype)).view(*shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, {self.kind} ({self.engine})"

    @property
    def engine(self) -> str:
        return describe_engine(self.kind)

    @property
    def weight(self) -> Tensor:
        raise NotImplementedError

    def _matmul(self, x: Tensor) -> Tensor:  # x (N, in) float32 → (N, out)
        raise NotImplementedError


class Int8Linear(QuantizedLinear):
    """int8 weights per output channel, activations quantized per row; fbgemm's int8 GEMM."""

    kind = "int8"

    def __init__(self, weight: Tensor, bias: Tensor | None):
        super().__init__(weight, bias)
        w = weight.float()
        scale = (w.abs().amax(1) / 127).clamp(min=1e-12).double()  # (out,)
        with warnings.catch_warnings(), _quantized_engine(INT8_ENGINE):
            warnings.filterwarnings("ignore", message=".*quantized tensor creation.*")  # deprecated in torch 2.13,
            qw = torch.quantize_per_channel(w, scale, torch.zeros_like(scale, dtype=torch.long), 0, torch.qint8)
            self._packed = torch.ops.quantized.linear_prepack(qw, None)  # fbgemm's packing still needs one

    @property
    def weight(self) -> Tensor:
        return torch.ops.quantized.linear_unpack(self._packed)[0].dequantize()

    def _matmul(self, x: Tensor) -> Tensor:  # x (N, in) float32 → (N, out)
        m = x.abs().amax(1, keepdim=True).clamp_(min=_TINY)  # (N, 1) row maxima (linalg.vector_norm: slower)
        return _INT8_GEMM(x / m, ACT_SCALE, ACT_ZERO, self._packed) * m  # 7-bit activations, fp32 output


def int4_groups(weight: Tensor, scales: torch.dtype = torch.float32) -> tuple[Tensor, Tensor, Tensor]:
    """``weight`` (out, in) in :class:`Int4Linear`'s layout: codes ``q`` (out, in) in 0..15 and per-group scale
    ``s`` and minimum ``lo`` (out, in / :data:`INT4_GROUP`), ``w ≈ q·s + lo`` (the group's range in 15 steps).
    ``scales=torch.bfloat16``: ``s`` and the kernel's offset ``lo + 8·s`` are bfloat16 values (the kernel's
    fast path stores them so), and the codes are rounded against those, so the weights the kernel multiplies by
    are the ones these groups describe."""
    N, K = weight.shape
    if K % INT4_GROUP:
        raise UserError(f"int4 needs the input width of every linear layer to be a multiple of {INT4_GROUP}, "
                        f"got {K}")
    g = weight.float().view(N, K // INT4_GROUP, INT4_GROUP)
    lo, hi = g.amin(-1), g.amax(-1)  # (N, K/G)
    s = ((hi - lo) / 15).clamp(min=1e-12)
    if scales != torch.float32:
        s = s.to(scales).float()
        lo = (lo + 8 * s).to(scales).float() - 8 * s  # the offset rounded, lo read back from it (exact in float32)
    q = torch.round((g - lo[..., None]) / s[..., None]).clamp(0, 15).to(torch.int32).view(N, K)
    return q, s, lo


class Int4Linear(QuantizedLinear):
    """4-bit weights in groups of :data:`INT4_GROUP` input channels, ``w = (q − 8)·s + z`` with ``q`` in
    0..15 and a scale/offset ``(s, z)`` per group; PyTorch's weight-only int4 CPU kernel. Output channels
    are padded to a multiple of 16 (the kernel's tile) with zero rows, dropped from the result.

    Two paths of that kernel: its vectorized one (``quantize="int4"``) takes bfloat16 activations, scales and
    offsets, so a row enters each product rounded to bfloat16 and leaves it rounded to bfloat16 (weights as
    :func:`int4_groups` makes them with bfloat16 scales); its float32 one is scalar code, slower than float32
    itself, and serves ``groups`` taken as they are (a GGUF file's Q4_0 / Q4_1 blocks,
    :mod:`setdlm.formats.gguf_quant`, whose float16 block scales bfloat16 cannot hold exactly). Either way a
    row's output depends on that row alone."""

    kind = "int4"

    def __init__(self, weight: Tensor, bias: Tensor | None, groups: tuple[Tensor, Tensor, Tensor] | None = None):
        super().__init__(weight, bias)
        self.activations = torch.bfloat16 if groups is None else torch.float32
        if groups is None:
            groups = int4_groups(weight, torch.bfloat16)
        else:
            warnings.warn(INT4_SLOW, stacklevel=2)  # once a process (the warnings registry): the moment it matters
        q, s, lo = groups
        N, K = q.shape
        pad = -(-N // 16) * 16 - N
        q, s, lo = (torch.cat([t, t.new_zeros(pad, t.shape[1])]) for t in (q.to(torch.int32), s.float(), lo.float()))
        self.register_buffer("_q", torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1))  # (Np, K/2) uint8
        sz = torch.stack([s, lo + 8 * s], -1).transpose(0, 1).contiguous()  # (K/G, Np, 2)
        self.register_buffer("_sz", sz.to(self.activations))

    @property
    def weight(self) -> Tensor:  # the kernel's float32 path applied to the identity: the weights, unrounded
        eye = torch.eye(self.in_features)
        return torch.ops.aten._weight_int4pack_mm_for_cpu(eye, self._q, INT4_GROUP, self._sz.float()).t()[
            : self.out_features]

    @property
    def engine(self) -> str:
        return describe_engine("int4" if self.activations == torch.bfloat16 else "int4-float32")

    def _matmul(self, x: Tensor) -> Tensor:  # x (N, in) float32 → (N, out)
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(x.to(self.activations), self._q, INT4_GROUP, self._sz)
        return y[:, : self.out_features].float()  # (N, out) of (N, Np)


class Int8WeightLinear(QuantizedLinear):
    """int4's output head: symmetric int8 weights per output channel, bfloat16 scales, and the activations not
    quantized (weight-only): ATen's ``_weight_int8pack_mm`` on bfloat16 rows, its output rounded to bfloat16.
    Half the bytes of a bfloat16 head and a quarter of a float32 one; unlike :class:`Int8Linear`'s per-row 7-bit
    activations (which move SmolLM2's logits by tenths of a nat where outlier channels dominate a row) it keeps
    the model's answers (docs/quantization.md, "int4's head"). Each output row depends on its own input row."""

    kind = "int8w"
    _q: Tensor  # (out, in) int8 codes, a buffer
    _s: Tensor  # (out,) bfloat16 scales, a buffer

    def __init__(self, weight: Tensor, bias: Tensor | None):
        super().__init__(weight, bias)
        w = weight.float()
        s = (w.abs().amax(1) / 127).clamp(min=1e-12).to(torch.bfloat16)  # (out,) the kernel's scales
        self.register_buffer("_q", torch.round(w / s.float()[:, None]).clamp(-127, 127).to(torch.int8))  # (out, in)
        self.register_buffer("_s", s)

    @property
    def weight(self) -> Tensor:
        return self._q.float() * self._s.float()[:, None]

    def _matmul(self, x: Tensor) -> Tensor:  # x (N, in) float32 → (N, out)
        return torch.ops.aten._weight_int8pack_mm(x.to(torch.bfloat16), self._q, self._s).float()


# PyTorch's int4 CPU kernel runs float32 activations on a scalar path (docs/quantization.md, "Why these kernels"):
# a GGUF file's own 4-bit weights, whose float16 block scales its vectorized (bfloat16) path cannot hold exactly,
# decoded SmolLM2-135M at batch 1 (2 cores, AVX-512) at 3.8 tokens/s against int8's 30 and float32's ~15.
INT4_SLOW = InputWarning("quantize='gguf' keeps a GGUF file's own 4-bit weights exactly (float16 block scales), "
                         "which PyTorch's int4 kernel runs on float32 activations, slower than float32 itself on a "
                         "CPU (SmolLM2-135M: about 4 tokens/s against int8's 30): it saves memory, not time; use "
                         "quantize='int4' (or quantize='int8') for speed (docs/quantization.md)", fields=("quantize",))
KERNELS = {"int8": Int8Linear, "int4": Int4Linear}


def kernel_of(quantize: str, head: bool) -> type[QuantizedLinear]:
    """The layer class :func:`quantize` gives a linear layer under ``quantize`` ("int8", "int4"): the scheme's
    own, but :class:`Int8WeightLinear` for the output head (``head``) under "int4"."""
    return Int8WeightLinear if quantize == "int4" and head else KERNELS[quantize]


@contextlib.contextmanager
def _quantized_engine(engine: str):
    """``torch.backends.quantized.engine`` set to ``engine`` inside the block (prepacking picks the kernel family
    by the engine in force when it runs), restored after."""
    if engine not in torch.backends.quantized.supported_engines:
        raise UserError(f"quantize='int8' needs PyTorch's {engine} engine, which this build lacks "
                        f"(supported: {', '.join(torch.backends.quantized.supported_engines)})", fields=("quantize",))
    before = torch.backends.quantized.engine
    torch.backends.quantized.engine = engine
    try:
        yield
    finally:
        torch.backends.quantized.engine = before


def describe_engine(kind: str) -> str:
    """The kernel behind ``kind`` ("int8", "int4") and the CPU level it runs at, in words."""
    cpu = torch.backends.cpu.get_cpu_capability()
    if kind == "int8":
        return f"fbgemm u8s8 GEMM, per-row 7-bit activations, CPU {cpu}"
    if kind == "int4":
        return f"aten int4 weight-only GEMM, bfloat16 activations, CPU {cpu}"
    if kind == "int8w":
        return f"aten int8 weight-only GEMM, bfloat16 activations, CPU {cpu}"
    return f"aten int4 weight-only GEMM, float32 activations (scalar), CPU {cpu}"


def self_check(layer: QuantizedLinear, rows: int = 5) -> float:
    """The largest difference between ``layer``'s output for a few random rows fed together and each row fed
    alone or in a smaller group (0.0 when each output row depends on its own input row only, as every kernel
    here should give on every CPU)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(rows, layer.in_features, generator=g) * torch.logspace(-2, 2, rows)[:, None]  # (rows, in)
    with torch.no_grad():
        together = layer(x)  # (rows, out)
        parts = torch.cat([layer(x[:1]), layer(x[1:3]), layer(x[3:])])  # other row counts
    return (together - parts).abs().max().item()


def check_kernels(backbone: nn.Module) -> None:
    """Run :func:`self_check` on one layer of each kind and shape in ``backbone``; a layer whose rows depend on
    each other is put back in float32 (its dequantized weights) with one warning line naming the kernel, so the
    decoders' contract (a row decoded in a batch equals the row decoded alone) holds either way."""
    checked: dict[tuple, float] = {}
    for name, m in list(backbone.named_modules()):
        if not isinstance(m, QuantizedLinear):
            continue
        key = (type(m), m.in_features, m.out_features)
        if key not in checked:
            checked[key] = self_check(m)
        if checked[key] != 0.0:
            fallback = nn.Linear(m.in_features, m.out_features, bias=m.bias is not None)
            with torch.no_grad():
                fallback.weight.copy_(m.weight)
                if m.bias is not None:
                    fallback.bias.copy_(m.bias)
            replace_layer(backbone, name, fallback.eval())
            warnings.warn(f"quantize: the {m.kind} kernel ({m.engine}) gave a {m.in_features}->{m.out_features} "
                          f"layer's rows different numbers batched and alone (by {checked[key]:.2e}); {name} "
                          f"runs in float32 instead", RuntimeWarning, stacklevel=3)


def quantize(backbone: nn.Module, quantize: str) -> nn.Module:
    """Replace every linear layer of ``backbone`` (in place) by its ``quantize`` ("int8" or "int4") version;
    returns the backbone, in eval mode. CPU only. The output head too (a tied head, SmolLM2's, as the head: the
    embedding it shares keeps full precision); under "int4" with int8 weights (:class:`Int8WeightLinear`)."""
    if check_quantize(quantize) == "gguf":
        raise UserError("quantize='gguf' keeps a GGUF file's own quantization: load the file with "
                         "setdlm.load(path, quantize='gguf')")
    check_cpu(backbone, quantize)
    fuse = getattr(backbone, "fuse_projections", None)
    if callable(fuse):  # HF backbones: q/k/v and gate/up as one product each, same numbers
        fuse()
    keep, head = kept_float(backbone, quantize), head_names(backbone)
    for name, (weight, bias) in linear_layers(backbone):
        if name not in keep:
            replace_layer(backbone, name, kernel_of(quantize, name in head)(weight, bias))
    finish(backbone, quantize)
    return backbone.eval()


def finish(backbone: nn.Module, quantize: str) -> None:
    """What every quantized backbone gets after its layers are replaced: the kernels checked
    (:func:`check_kernels`), float64 attention (:func:`widen_attention`), ``quantization`` set and one log
    line naming the engines that run."""
    check_kernels(backbone)
    widen_attention(backbone)
    prepare_fused(backbone)
    backbone.quantization = quantize  # type: ignore[assignment]  # torch types Module.__setattr__ for Tensor | Module
    engines = sorted({f"{m.kind}: {m.engine}" for m in backbone.modules() if isinstance(m, QuantizedLinear)})
    backbone.quantization_engine = "; ".join(engines)  # type: ignore[assignment]  # (as above)
    log.info("quantize=%r: %s", quantize, backbone.quantization_engine)


def widen_attention(backbone: nn.Module) -> None:
    """Attention in float64 in every layer of ``backbone`` (:func:`setdlm.model.attention`'s ``wide``): the
    float parts of a quantized model then give a row the same float32 numbers whatever else its step holds,
    so the int8 activation quantizer sees the same inputs batched and alone, cached and recomputed."""
    for m in backbone.modules():
        if hasattr(m, "wide_attention"):
            m.wide_attention = True  # type: ignore[assignment]  # (as in finish)


def quantization_of(backbone: nn.Module) -> str | None:
    """"int8", "int4", "gguf" or None: how :func:`quantize` (or :mod:`setdlm.formats.gguf_quant`) left ``backbone``."""
    return getattr(backbone, "quantization", None)
