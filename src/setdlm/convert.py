"""Convert the authors' DiT checkpoints (``kuleshov-group/setdlms``) to setdlm's layout (SPEC.md §3.1, §5.7).

Key map (official → ours)::

    backbone.vocab_embed.embedding                 → embed.weight
    backbone.blocks.N.{norm1,attn_qkv,attn_out,norm2}.weight, .mlp.{0,2}.{weight,bias}
                                                   → blocks.N.<same>
    backbone.output_layer.norm_final.weight        → norm_final.weight
    backbone.output_layer.linear.{weight,bias}     → head.{weight,bias}
    static_attention_mask, backbone.rotary_emb.inv_freq   (buffers, not weights: checked, dropped)

The schedule is rebuilt the way their loader does (SPEC §5.7, pitfall 9): ``D`` from the config's
``desired_block_size`` or from ``d{N}`` / ``tgt{N}`` / ``smax{2N}`` in the name, ``M = min(2D, L)``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch
from torch import Tensor

from .family import FamilyConfig
from .model import ModelConfig, Transformer

_BLOCK_PARAMS = ("norm1.weight", "attn_qkv.weight", "attn_out.weight", "norm2.weight",
                 "mlp.0.weight", "mlp.0.bias", "mlp.2.weight", "mlp.2.bias")
_BUFFERS = ("static_attention_mask", "backbone.rotary_emb.inv_freq")


def reference_key_map(n_layers: int) -> dict[str, str]:
    """Official key → setdlm key for a DiT with ``n_layers`` blocks."""
    m = {"backbone.vocab_embed.embedding": "embed.weight",
         "backbone.output_layer.norm_final.weight": "norm_final.weight",
         "backbone.output_layer.linear.weight": "head.weight",
         "backbone.output_layer.linear.bias": "head.bias"}
    for i in range(n_layers):
        for p in _BLOCK_PARAMS:
            m[f"backbone.blocks.{i}.{p}"] = f"blocks.{i}.{p}"
    return m


def is_reference_state_dict(sd: dict) -> bool:
    return "backbone.vocab_embed.embedding" in sd


def convert_reference_state_dict(sd: dict[str, Tensor], config: ModelConfig) -> dict[str, Tensor]:
    """Map an official state dict onto ours. Raises ``ValueError`` naming the first missing key, unknown
    key or wrong shape; legacy adaLN (time-conditioned) DiTs are refused with a clear message."""
    ada = [k for k in sd if "adaLN" in k]
    if ada:
        raise ValueError(f"checkpoint has time-conditioning (adaLN) weights, e.g. {ada[0]!r}: legacy "
                         "BD3LM/MDLM DiT checkpoints are not supported, only the SetDLM DiT without adaLN")
    kmap = reference_key_map(config.n_layers)
    expected = {k: tuple(v.shape) for k, v in Transformer(config).state_dict().items()}
    out: dict[str, Tensor] = {}
    for key in sd:
        if key in _BUFFERS:
            continue
        if key not in kmap:
            raise ValueError(f"unknown key {key!r} in the reference checkpoint (not part of a "
                             f"{config.n_layers}-layer DiT)")
    for src, dst in kmap.items():
        if src not in sd:
            raise ValueError(f"missing key {src!r} in the reference checkpoint")
        t = sd[src]
        if tuple(t.shape) != expected[dst]:
            raise ValueError(f"wrong shape for {src!r}: expected {list(expected[dst])}, got {list(t.shape)}")
        out[dst] = t
    inv = sd.get("backbone.rotary_emb.inv_freq")
    if inv is not None:
        hd = config.head_dim
        ours = 1.0 / (config.rope_base ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
        if inv.shape != ours.shape or not torch.allclose(inv.float(), ours, rtol=1e-5):
            raise ValueError("backbone.rotary_emb.inv_freq does not match rotary base "
                             f"{config.rope_base} with head_dim {hd}")
    return out


def infer_D(name: str) -> int | None:
    """D from a run or Hub name: ``d4``, ``tgt4`` or ``smax8`` (= 2D) → 4; None if absent."""
    base = name.rstrip("/").split("/")[-1].lower()
    m = re.search(r"smax(\d+)", base)
    if m:
        return int(m.group(1)) // 2
    m = re.search(r"(?:^|[-_])(?:tgt|d)(\d+)(?:$|[-_])", base)
    return int(m.group(1)) if m else None


def _pick(d: dict, *names, default=None):
    for n in names:
        if n in d and d[n] is not None:
            return d[n]
    return default


def reference_configs(cfg: dict, name: str = "") -> tuple[ModelConfig, FamilyConfig]:
    """Our (ModelConfig, FamilyConfig) from an official config dict (the fixture's ``config.json`` layout,
    or a flat HF-style config with the same field names)."""
    bb = cfg.get("backbone_config_passed", cfg)
    if _pick(bb, "adaln", default=False):
        raise ValueError("config has adaln=true: legacy time-conditioned DiTs are not supported")
    hidden = _pick(bb, "hidden_size", "hidden_dim")
    mc = ModelConfig(vocab_size=int(_pick(bb, "vocab_size")), hidden_size=int(hidden),
                     n_heads=int(_pick(bb, "n_heads", "num_attention_heads")),
                     n_layers=int(_pick(bb, "num_layers", "n_blocks", "num_hidden_layers")),
                     dropout=float(_pick(bb, "dropout", default=0.0)))
    L = int(_pick(cfg, "length", "model_length", default=_pick(bb, "length")))
    noise = cfg.get("setdlm", {}).get("noise", cfg.get("noise", {}))
    D = _pick(noise, "desired_block_size") or infer_D(name)
    if D is None:
        raise ValueError(f"cannot tell D for {name or 'this checkpoint'}: no noise.desired_block_size in its "
                         "config and no d{N}/tgt{N}/smax{2N} in its name; pass D explicitly")
    mask_id = _pick(cfg, "mask_token_id", "mask_index", default=mc.vocab_size - 1)
    fam = FamilyConfig("setdlm", length=L, mask_token_id=int(mask_id), D=int(D), M=min(2 * int(D), L))
    return mc, fam


def load_reference(path: str | Path, *, D: int | None = None) -> tuple[Transformer, FamilyConfig]:
    """Load a folder in the authors' layout (``config.json`` + one ``*.safetensors``) as (backbone, family)."""
    from safetensors.torch import load_file

    path = Path(path)
    cfg_file = path / "config.json"
    if not cfg_file.is_file():
        raise ValueError(f"{cfg_file}: missing (a reference checkpoint folder needs config.json)")
    cfg = json.loads(cfg_file.read_text())
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ValueError(f"{path}: no .safetensors weights found")
    mc, fam = reference_configs(cfg, name=path.name)
    if D is not None:
        fam = FamilyConfig("setdlm", length=fam.length, mask_token_id=fam.mask_token_id, D=D, M=min(2 * D, fam.length))
    sd: dict[str, Tensor] = {}
    for f in files:
        try:
            sd.update(load_file(str(f)))
        except Exception as e:  # safetensors raises its own error types for corrupt files
            raise ValueError(f"{f}: cannot read safetensors weights ({e})") from None
    model = Transformer(mc)
    model.load_state_dict(convert_reference_state_dict(sd, mc))
    return model.eval(), fam
