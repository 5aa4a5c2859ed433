"""One front door for loading: resolve a name to a folder, then pick the reader for its layout
(docs/pretrained.md, "Where setdlm.load looks").

``setdlm.load(name)`` tries, in this order:

1. a shipped model's name (:mod:`setdlm.formats.pretrained`), unless a path of that name exists;
2. a GGUF file, or a packaged GGUF model's name such as ``"smollm2-135m"`` (:mod:`setdlm.formats.gguf` converts it
   once into the user's cache; the result is a folder in our format);
3. a Hugging Face Hub id ``"user/repo"`` that is not a local path (:func:`setdlm.formats.hub.snapshot_checkpoint`
   downloads the files loading needs);
4. a local folder: a checkpoint, or a training run folder whose ``latest`` names one
   (:func:`setdlm.formats.layout.resolve`).

The folder found is read by :func:`setdlm.formats.checkpoint.read` (whose parts become a :class:`~setdlm.lm.Model`
here) when it is in our format (``config.json`` with ``"format": "setdlm"``), else by
:func:`setdlm.formats.convert.load_reference_model` when it is in the paper authors'
layout (their ``backbone_config`` / ``noise_config``), else the checkpoint reader names what is missing.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import cast

import torch

from ..data import Tokenizer
from ..errors import UserError
from ..lm import Model
from ..resources import native_bf16, resolve_device
from . import checkpoint, convert, drafted, gguf, hub, pretrained
from .layout import is_checkpoint, resolve
from .safety import PICKLE_SUFFIXES, check_safetensors, refuse_pickle
from .gguf_quant import keep_file_quantization
from .hf import HFBackbone, load_pretrained, setdlm_tokenizer
from .quantize import check_quantize, quantize as quantize_backbone


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "float64": torch.float64}


def check_dtype(dtype: str | torch.dtype | None) -> torch.dtype | None:
    """``dtype`` as a torch dtype (a name of :data:`DTYPES` or a floating torch dtype; None stays None), else a
    UserError naming the choices."""
    if dtype is None or isinstance(dtype, torch.dtype) and dtype in DTYPES.values():
        return dtype
    if isinstance(dtype, str) and dtype.removeprefix("torch.") in DTYPES:
        return DTYPES[dtype.removeprefix("torch.")]
    raise UserError(f"dtype must be one of {', '.join(DTYPES)} (or None: float32 for weights stored in half "
                    f"precision, else as stored), got {dtype!r}", fields=("dtype",))


def locate(path: str | Path, *, revision: str | None = None, ema: bool = False) -> Path:
    """The local folder ``path`` names (steps 1-4 of this module's order): a shipped model, a converted GGUF
    file, a Hub repo in the HF cache (the files loading needs; ``ema``: the EMA weights too), or a local
    checkpoint / run folder."""
    p = Path(path).expanduser()
    if not p.exists() and str(path) in pretrained.available():
        return pretrained.path(str(path))
    if not p.exists() and str(path) in pretrained.drafters():  # a shipped set drafter: loads over its base
        return pretrained.drafters_root() / str(path)
    converted = gguf.resolve(path)  # a GGUF file or a packaged GGUF model's name: its converted folder
    if converted is not None:
        return converted
    if not p.exists() and hub.is_hub_id(str(path)):
        return hub.snapshot_checkpoint(str(path), revision=revision, ema=ema)
    near = None if p.exists() or "/" in str(path) else pretrained.closest(str(path), tuple(gguf.PACKAGED))
    if near is not None:
        raise UserError(f"no model {str(path)!r}: no such folder and no shipped model of that name; did you mean "
                        f"{near!r}? (`setdlm models` lists the shipped models)")
    return resolve(p)


def load(path: str | Path, *, ema: bool = False, family: str | None = None, device=None,
         dtype: str | torch.dtype | None = None, revision: str | None = None, quantize: str | None = None,
         **reference) -> Model:
    """A ready :class:`~setdlm.lm.Model` (backbone, family, tokenizer) in eval mode.

    ``path``: a checkpoint folder, a training run folder (its latest checkpoint), the name of a shipped model
    (:mod:`setdlm.formats.pretrained`), a GGUF file or packaged GGUF model such as ``"smollm2-135m"`` (converted once
    into the user's cache, :mod:`setdlm.formats.gguf`), or a Hugging Face Hub id
    ``"user/repo"`` (downloaded into the HF cache; needs ``huggingface_hub`` and network, unless already
    cached). A folder or Hub id in the paper authors' layout is detected and converted on the fly
    (:func:`setdlm.formats.convert.load_reference_model`; ``reference`` keywords such as ``tokenizer=``, ``D=``,
    ``base=`` go there). ``ema=True`` loads the EMA weights. ``family``: the family you expect (an error
    otherwise). ``dtype``: cast the weights, a torch dtype or its name
    (``"bfloat16"``; weights stored in bf16/fp16 load as float32 unless given; docs/decoding.md "Precision").
    ``revision``: a Hub branch, tag or commit. ``quantize``: ``"int8"`` or ``"int4"`` replaces every linear
    layer by a quantized CPU kernel for decoding (:mod:`setdlm.formats.quantize`, docs/quantization.md); ``"gguf"``
    (a GGUF file only) keeps the file's own Q8_0 / Q4_0 / Q4_1 weights (:mod:`setdlm.formats.gguf_quant`).
    """
    check_quantize(quantize)
    dtype = check_dtype(dtype)
    source = gguf.source_file(path) if quantize == "gguf" else None  # before loading: not a GGUF file, say so
    model = _load(path, ema=ema, family=family, device=device, dtype=dtype, revision=revision, **reference)
    where = next(model.backbone.parameters()).device
    if dtype == torch.bfloat16 and where.type == "cpu" and not native_bf16(where):
        warnings.warn("dtype=bfloat16 on a CPU without AVX512-BF16 or AMX: PyTorch emulates bfloat16 matmuls there, "
                      "slower than float32 (docs/decoding.md \"Precision\")", stacklevel=2)
    if source is not None:  # quantize == "gguf"
        keep_file_quantization(model.backbone, source)
    elif quantize is not None:
        quantize_backbone(model.backbone, quantize)
    return model


def _load(path, *, ema, family, device, dtype, revision, **reference) -> Model:
    if device is not None:
        device = resolve_device(device)
    if not isinstance(path, (str, Path)) or not str(path).strip():
        raise TypeError(f"path must be a checkpoint folder, a shipped model's name or a Hub id, got {path!r}")
    folder = locate(path, revision=revision, ema=ema)
    if drafted.is_drafter_folder(folder):  # a set drafter: its base, loaded by name, with the drafter beside it
        return _load_drafted(folder, family=family, device=device, dtype=dtype)
    if convert.is_reference_folder(folder):  # never one of ours ("format": "setdlm")
        if ema:
            raise UserError(f"{path}: the authors' checkpoints hold one set of weights (EMA already applied "
                            "where the paper used it); drop ema=True")
        model = convert.load_reference_model(folder, name=str(path), dtype=dtype, **reference)
        if family is not None and model.family.family != family:
            raise UserError(f"{path}: a {model.family.family!r} model, but a {family!r} model was expected")
        model.backbone.to(device=device)
        return model.eval()
    if reference:
        raise UserError(f"{path}: is a setdlm checkpoint; {sorted(reference)} apply only to the authors' layout")
    return Model(*checkpoint.read(folder, ema=ema, family=family, device=device, dtype=dtype))


def _load_drafted(folder: Path, *, family, device, dtype) -> Model:
    """A drafter folder (:mod:`setdlm.formats.drafted`) over its base: the base's family and tokenizer, the
    drafter in the base's precision (docs/drafter.md)."""
    base_name, drafter, _ = drafted.read_drafter(folder)
    base = _load(base_name, ema=False, family=family, device=device, dtype=dtype, revision=None)
    p = next(base.backbone.parameters())
    drafter.to(device=p.device, dtype=p.dtype)
    hf = cast(HFBackbone, base.backbone)  # a drafter's base is a Hugging Face model (its config names one)
    return Model(drafted.DraftedBackbone(hf, drafter), base.family, base.tokenizer).eval()


def _is_name(name: str) -> bool:
    """``name`` names a model rather than a local path: a shipped model, a packaged GGUF model or a Hub id."""
    return (name in pretrained.available() or name in pretrained.drafters() or name in gguf.PACKAGED
            or hub.is_hub_id(name))


def load_for_training(name_or_path: str):
    """``(backbone, tokenizer)`` to start training from (``TrainConfig(init_from=...)``, docs/method.md §2.9):
    anything :func:`locate` finds in our format or the authors' layout (any family, DiT or HF backbone), or a
    ``transformers`` causal LM (Llama, Qwen2/3, GPT-2; a local folder, or a Hub id, which needs network), given
    a MASK token when its tokenizer has none. Weights in float32, in training mode."""
    p = Path(name_or_path).expanduser()
    if not p.exists() and not _is_name(str(name_or_path)):
        raise UserError(f"{name_or_path!r}: no such folder, and not a shipped model, a packaged GGUF model or a "
                         "Hub id")
    folder = locate(name_or_path)
    if is_checkpoint(folder) or convert.is_reference_folder(folder):
        model = load(folder, dtype=torch.float32)
        if not isinstance(model.tokenizer, Tokenizer):
            raise UserError(f"{name_or_path!r}: no tokenizer found with the weights")
        return model.backbone.train(), model.tokenizer
    if folder.is_dir():  # a local folder or a Hub snapshot: check the weights before transformers reads them
        weights = sorted(folder.glob("*.safetensors"))
        pickles = [f for f in folder.iterdir() if f.suffix in PICKLE_SUFFIXES]
        if not weights and pickles:
            refuse_pickle(pickles[0])
            raise UserError(f"{pickles[0]}: setdlm loads safetensors weights only; convert it to safetensors")
        for f in weights:
            check_safetensors(f)
    try:
        import transformers  # noqa: F401 (checked here, so the error can say how to install it)
    except ImportError:
        raise UserError(f'{name_or_path!r} is a Hugging Face model, which needs transformers: '
                         'pip install "setdlm[hf]" (in a checkout: pip install -e ".[hf]")') from None
    backbone, tok, _ = load_pretrained(str(folder) if p.exists() else name_or_path, dtype=torch.float32)
    return backbone.train(), setdlm_tokenizer(tok.hf)
