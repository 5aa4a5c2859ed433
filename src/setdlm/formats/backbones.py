"""The backbone formats a setdlm checkpoint records, as a registry (docs/architecture.md, "Backbone formats").

``config.json``'s ``"backbone"`` names one :class:`BackboneFormat` of :data:`REGISTRY`: ``"dit"``, the setdlm DiT
(``architecture`` = a :class:`~setdlm.model.TransformerConfig`), or ``"hf"``, a Hugging Face causal LM behind
:class:`~setdlm.formats.hf.HFBackbone` (``architecture`` = its ``transformers`` config). Each record says how to
recognise such a backbone, write and read its architecture, build it, count its parameters and read its vocabulary;
saving, loading, conversion and the model card read the record instead of comparing the name (the pattern of
:data:`setdlm.family.REGISTRY`). Also here: a backbone's weights as a state dict without aliases, and the memory
check that refuses an architecture too large for the device before anything is allocated.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

from ..errors import UserError
from ..model import Transformer, TransformerConfig
from ..resources import check_fits
from .hf import HFBackbone, backbone_from_config, config_dict
from .layout import check_fields

Architecture = TransformerConfig | dict


@dataclass(frozen=True)
class BackboneFormat:
    """One kind of backbone a checkpoint can hold (docs/architecture.md)."""

    name: str  # config.json's "backbone"
    recognises: Callable[[nn.Module], bool]  # is this module a backbone of this format?
    to_dict: Callable[[nn.Module], dict]  # its architecture as config.json records it
    check: Callable[[Path, dict], None]  # every field of a recorded architecture present, of its type
    from_dict: Callable[[dict], Architecture]  # the recorded architecture parsed (TypeError / ValueError if bad)
    build: Callable[[Architecture, torch.dtype | None], nn.Module]  # untrained, weights to be loaded
    vocab_size: Callable[[Architecture], object]  # what the architecture records (checked by the caller)
    n_layers: Callable[[Architecture], int]  # its depth (a UserError if not a positive integer)
    with_layers: Callable[[Architecture, int], Architecture]  # the same architecture n layers deep
    describe: Callable[[dict], str]  # the recorded architecture in words (the model card)


def _dit_dict(backbone: nn.Module) -> dict:
    assert isinstance(backbone, Transformer)
    return backbone.config.to_dict()


def _hf_dict(backbone: nn.Module) -> dict:
    assert isinstance(backbone, HFBackbone)
    return config_dict(backbone)


def _build_dit(arch: Architecture, dtype: torch.dtype | None) -> nn.Module:
    assert isinstance(arch, TransformerConfig)  # a DiT checkpoint's architecture (from_dict)
    return Transformer(arch).to(dtype) if dtype is not None else Transformer(arch)


def _dit_layers(arch: Architecture) -> int:
    assert isinstance(arch, TransformerConfig)
    return arch.n_layers


def _dit_with_layers(arch: Architecture, n: int) -> Architecture:
    assert isinstance(arch, TransformerConfig)
    return dataclasses.replace(arch, n_layers=n)


def _hf_layer_key(arch: dict) -> str:
    return "n_layer" if "n_layer" in arch else "num_hidden_layers"  # GPT-2's name, the others'


def _hf_layers(arch: Architecture) -> int:
    assert isinstance(arch, dict)
    key = _hf_layer_key(arch)
    given = arch.get(key)
    if not isinstance(given, int) or isinstance(given, bool) or given < 1:
        raise UserError(f"architecture.{key} must be a positive integer, got {given!r}")
    return given


def _hf_with_layers(arch: Architecture, n: int) -> Architecture:
    assert isinstance(arch, dict)
    types = arch.get("layer_types")  # one entry per layer where the config lists them (Qwen3)
    return {**arch, _hf_layer_key(arch): n, **({"layer_types": types[:n]} if isinstance(types, list) else {})}


DIT = BackboneFormat(
    name="dit", recognises=lambda b: isinstance(b, Transformer), to_dict=_dit_dict,
    check=lambda path, d: check_fields(path, "architecture", d, TransformerConfig),
    from_dict=TransformerConfig.from_dict, build=_build_dit,
    vocab_size=lambda a: a.vocab_size if isinstance(a, TransformerConfig) else None,
    n_layers=_dit_layers, with_layers=_dit_with_layers,
    describe=lambda a: (f"setdlm DiT ({a['n_layers']} layers, hidden {a['hidden_size']}, {a['n_heads']} heads, "
                        f"vocabulary {a['vocab_size']})"))
HF = BackboneFormat(
    name="hf", recognises=lambda b: isinstance(b, HFBackbone), to_dict=_hf_dict,
    check=lambda path, d: None, from_dict=dict, build=lambda a, dtype: backbone_from_config(a, dtype=dtype),
    vocab_size=lambda a: a.get("vocab_size") if isinstance(a, dict) else None,
    n_layers=_hf_layers, with_layers=_hf_with_layers,
    describe=lambda a: (f"Hugging Face `{a.get('model_type')}` causal LM ({a.get('num_hidden_layers')} layers, "
                        f"hidden {a.get('hidden_size')}, vocabulary {a.get('vocab_size')})"))
REGISTRY: dict[str, BackboneFormat] = {f.name: f for f in (DIT, HF)}


def format_named(cfg: Mapping, path: Path | str = "config.json") -> BackboneFormat:
    """The format config.json ``cfg`` records (``"dit"`` when it names none: the first checkpoints)."""
    name = cfg.get("backbone", DIT.name)
    if name not in REGISTRY:
        raise UserError(f"{path}: unknown backbone {name!r} (expected {' or '.join(map(repr, REGISTRY))})")
    return REGISTRY[name]


def format_of(backbone: nn.Module) -> BackboneFormat:
    """The format of a backbone object, to save it; a UserError for a module no format recognises."""
    found = next((f for f in REGISTRY.values() if f.recognises(backbone)), None)
    if found is None:
        raise UserError(f"saving a {type(backbone).__name__} backbone is not supported: only the setdlm DiT "
                        "and setdlm.formats.hf.HFBackbone")
    return found


def count_parameters(fmt: BackboneFormat, arch: Architecture) -> int:
    """The backbone's parameter count, computed without allocating it, before anything is built: 1- and
    2-layer copies of the architecture on the meta device give the embeddings and the per-layer count, so
    that ``n_layers: 1000000`` costs no more than ``n_layers: 2``."""
    layers = fmt.n_layers(arch)
    with torch.device("meta"):
        a, b = (sum(p.numel() for p in fmt.build(fmt.with_layers(arch, n), None).parameters()) for n in (1, 2))
    return a + (layers - 1) * (b - a)


def check_model_size(path: Path, fmt: BackboneFormat, arch: Architecture, device=None) -> None:
    """Refuse, before anything is allocated, an architecture whose float32 weights alone exceed the device's
    memory (``n_layers: 1000000``, ``hidden_size: 1000000``, ``vocab_size: 1e11`` in a corrupt or hostile
    ``config.json`` at ``path``): one line instead of an allocation failure or hours of swapping."""
    try:
        n = count_parameters(fmt, arch)
    except (ValueError, TypeError) as e:  # transformers' own check of its config
        raise UserError(f"{path}: bad architecture ({str(e).strip().splitlines()[-1]})") from None
    check_fits(f"{path}: the architecture ({n:,} parameters)", 4 * n,
               torch.device(device) if device is not None else torch.device("cpu"),
               "config.json is corrupt, or the model is too large for this machine")


def unique_state_dict(module: nn.Module) -> dict[str, Tensor]:
    """``module.state_dict()`` without aliases: a tensor reachable under several names (tied input and
    output embeddings) is kept under its first name only, as safetensors requires."""
    out, seen = {}, set()
    for k, v in module.state_dict().items():
        key = (v.untyped_storage().data_ptr(), v.storage_offset(), tuple(v.shape), v.stride())
        if v.numel() and key in seen:
            continue
        seen.add(key)
        out[k] = v
    return out


def expected_shapes(module: nn.Module) -> dict[str, tuple]:
    return {k: tuple(v.shape) for k, v in unique_state_dict(module).items()}


def load_weights(module: nn.Module, sd: dict[str, Tensor]) -> None:
    """Load ``sd`` (alias-free, as :func:`unique_state_dict` makes it) into ``module``; names and shapes
    must match exactly, aliases follow the tensor they share."""
    expected = expected_shapes(module)
    missing, extra = [k for k in expected if k not in sd], [k for k in sd if k not in expected]
    if missing or extra:
        raise UserError(f"weights do not match the model (missing {missing[:3]}, unexpected {extra[:3]})")
    result = module.load_state_dict(sd, strict=False)
    aliases = set(module.state_dict()) - set(expected)
    if set(result.missing_keys) != aliases or result.unexpected_keys:
        raise UserError(f"weights left unset: {sorted(set(result.missing_keys) - aliases)[:3]}")
