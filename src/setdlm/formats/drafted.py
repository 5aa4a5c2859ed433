"""A frozen Hugging Face base with a set drafter beside it, as one backbone (docs/drafter.md).

:class:`DraftedBackbone` honours the backbone contract of :mod:`setdlm.backbone` with the base's own numbers: its
``forward`` *is* the base's forward (the same layers, the same logits), and, when a KV cache is passed, it also
writes the drafter's context keys and values (:mod:`setdlm.drafter`) for the same new tokens into extra layers of
that cache, so every cache operation (append, ``keep=`` crop, the verifier's crop to the accepted prefix, rows
selected and joined) keeps the two in step. :meth:`DraftedBackbone.draft` runs the drafter's window over the
cache and returns draft-vocabulary logits. The plain AR decode never calls it: a drafted model decodes as its base
unless asked for drafts (``speculate="next_token"``, :mod:`setdlm.decoding.speculative_drafter`).

On disk a drafter is a folder holding ``config.json`` (``"format": "setdlm-drafter"``, the base's name and the
:class:`~setdlm.drafter.DrafterConfig`) and ``drafter.safetensors``; :func:`load_drafted` reads it over the base.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor, nn

from ..drafter import DrafterConfig, SetDrafter
from ..errors import UserError
from ..model import CacheStep, KVCache, begin_step, end_step
from .atomic import write_folder
from .hf import HFBackbone, LlamaRunner
from .hf_modules import causal_lm, llama

FORMAT = "setdlm-drafter"


class DraftedBackbone(nn.Module):
    """The base (an :class:`HFBackbone` of the Llama family) and a :class:`SetDrafter` (module docstring)."""

    accepts_mask_rules = True

    def __init__(self, base: HFBackbone, drafter: SetDrafter):
        super().__init__()
        if not base.runner.rotary:
            raise UserError("a set drafter needs a Llama/Qwen base (rotary positions); GPT-2 is not supported")
        c = drafter.config
        check_layers(c.feature_layers, base.n_layers)
        if (c.n_kv_heads, c.head_dim) != (base.n_kv_heads, base.head_dim):
            raise UserError(f"the drafter's attention ({c.n_kv_heads} KV heads of {c.head_dim}) must match the "
                            f"base's ({base.n_kv_heads} of {base.head_dim}): they share one KV cache")
        self.base = base
        self.drafter = drafter
        head = causal_lm(base.hf).get_output_embeddings().weight  # (V, d)
        self.draft_head = nn.Linear(c.hidden_size, c.vocab_size, bias=False, dtype=head.dtype)
        with torch.no_grad():
            self.draft_head.weight.copy_(head[drafter.vocab_map])  # the draft vocabulary's rows of the head
        self.training = False

    # the base's identity, for the code that asks a backbone (quantization, sizes, the chat template)
    hf = property(lambda self: self.base.hf)
    kind = property(lambda self: self.base.kind)
    n_layers = property(lambda self: self.base.n_layers)
    vocab_size = property(lambda self: self.base.vocab_size)
    window = property(lambda self: self.drafter.config.window)

    def fuse_projections(self) -> None:
        self.base.fuse_projections()

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def new_cache(self, batch: int, capacity: int = 64) -> KVCache:
        """The base's layers, then one per drafter layer (its context keys and values)."""
        p = next(self.base.parameters())
        return KVCache(self.base.n_layers + self.drafter.config.n_layers, batch, self.base.n_kv_heads,
                       self.base.head_dim, dtype=p.dtype, device=p.device, capacity=capacity)

    def forward(self, input_ids: Tensor, position_ids: Tensor | None = None, attn_mask: Tensor | None = None,
                cache: KVCache | None = None, *, keep: int | Tensor | None = None,
                logits_start: int = 0) -> Tensor:
        """The base's logits (B, T − logits_start, V); with a cache, the drafter's context is cached too."""
        B, T = input_ids.shape
        if position_ids is None:
            position_ids = torch.arange(T, device=input_ids.device).expand(B, T)
        step = begin_step(cache, position_ids, attn_mask)
        taps: dict[int, Tensor | None] = dict.fromkeys(self.drafter.config.feature_layers)
        x = LlamaRunner.layers(self.base, input_ids, position_ids, step, cache, taps if cache is not None else None)
        if cache is not None:
            self._cache_context(taps, position_ids, step, cache)
        end_step(cache, step, keep)
        hf = llama(self.base.hf)
        return hf.lm_head(hf.model.norm(x[:, logits_start:]))  # (B, T', V)

    def features(self, input_ids: Tensor, attn_mask: Tensor | None = None) -> list[Tensor]:
        """The base's hidden states at the feature layers, each (B, T, d), for training (no cache, no logits)."""
        return base_features(self.base, input_ids, attn_mask, self.drafter.config.feature_layers)

    def _cache_context(self, taps: dict[int, Tensor | None], position_ids: Tensor, step: CacheStep,
                       cache: KVCache) -> None:
        c = self.drafter.context(_tapped(taps, self.drafter.config.feature_layers))  # (B, T, d)
        cos, sin = llama(self.base.hf).model.rotary_emb(c, position_ids)
        for i, (k, v) in enumerate(self.drafter.context_kv(c, cos[:, None], sin[:, None])):
            cache.update(self.base.n_layers + i, k.to(cache.k[0].dtype), v.to(cache.k[0].dtype), step)

    def draft(self, tokens: Tensor, position_ids: Tensor, cache: KVCache) -> Tensor:
        """Draft-vocabulary logits (B, T − 1, Vd) of the window ``tokens`` (B, T): the committed token, then MASKs
        (their ids are ignored), at ``position_ids`` (B, T), over everything the cache holds. Writes nothing."""
        B, T = tokens.shape
        n, C = self.base.n_layers, cache.width
        hf = llama(self.base.hf).model
        x = hf.embed_tokens(tokens)  # (B, T, d)
        x = torch.cat([x[:, :1], self.drafter.mask_embed.to(x.dtype).expand(B, T - 1, -1)], 1)
        cos, sin = hf.rotary_emb(x, position_ids)
        ctx = [(cache.k[n + i][:, :, :C], cache.v[n + i][:, :, :C]) for i in range(self.drafter.config.n_layers)]
        seen = cache.valid()[:, None, None, :].expand(B, 1, T, C)  # (B, 1, T, C)
        mask = torch.cat([seen, torch.ones(B, 1, T, T, dtype=torch.bool, device=x.device)], -1)
        h = self.drafter.window(x, cos[:, None], sin[:, None], ctx, mask)  # (B, T, d)
        return self.draft_head(h[:, 1:])  # (B, T − 1, Vd)


def base_features(base: HFBackbone, input_ids: Tensor, attn_mask: Tensor | None,
                  layers: tuple[int, ...]) -> list[Tensor]:
    """The outputs of the base's decoder layers ``layers``, each (B, T, d): what a drafter's context is made of
    (its layers run up to the last one asked for; positions 0..T−1)."""
    check_layers(layers, base.n_layers)
    B, T = input_ids.shape
    pos = torch.arange(T, device=input_ids.device).expand(B, T)
    taps: dict[int, Tensor | None] = dict.fromkeys(layers)
    hf = llama(base.hf).model
    step = begin_step(None, pos, attn_mask)
    x = hf.embed_tokens(input_ids)
    cos, sin = hf.rotary_emb(x, pos)
    for i, layer in enumerate(hf.layers[: max(layers) + 1]):
        x = LlamaRunner.layer(base, layer, i, x, cos[:, None], sin[:, None], step, None)
        if i in taps:
            taps[i] = x
    return _tapped(taps, layers)


def check_layers(layers: tuple[int, ...], n_layers: int) -> None:
    """A UserError unless every base layer in ``layers`` exists (0..``n_layers`` − 1)."""
    if min(layers) < 0 or max(layers) >= n_layers:
        raise UserError(f"the drafter reads base layers {list(layers)}; the base's are 0..{n_layers - 1}")


def _tapped(taps: dict[int, Tensor | None], layers: tuple[int, ...]) -> list[Tensor]:
    """The outputs of the base layers ``layers`` that a forward tapped, in that order (each exists:
    :func:`check_layers`)."""
    feats = [t for i in layers if (t := taps[i]) is not None]
    if len(feats) < len(layers):
        raise RuntimeError(f"the forward tapped base layers {[i for i in layers if taps[i] is not None]} of "
                           f"{list(layers)}")
    return feats


def is_drafter_folder(folder: Path) -> bool:
    cfg = Path(folder) / "config.json"
    if not cfg.is_file():
        return False
    try:
        return json.loads(cfg.read_text(encoding="utf-8")).get("format") == FORMAT
    except (json.JSONDecodeError, AttributeError):
        return False


def read_drafter(folder: Path) -> tuple[str, SetDrafter, dict]:
    """(the base's name, the drafter in float32, the folder's config) of a drafter folder; clear errors for a
    missing or corrupt file."""
    folder = Path(folder)
    cfg = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    if cfg.get("format") != FORMAT or "drafter" not in cfg or "base" not in cfg:
        raise UserError(f"{folder}: not a drafter folder (config.json needs format {FORMAT!r}, base, drafter)")
    drafter = SetDrafter(DrafterConfig.from_dict(cfg["drafter"]))
    path = folder / "drafter.safetensors"
    if not path.is_file():
        raise UserError(f"{folder}: drafter.safetensors is missing")
    try:
        state = load_file(str(path))
    except Exception as e:  # safetensors raises its own error types for a torn or foreign file
        raise UserError(f"{path}: not a readable safetensors file ({e})") from None
    missing, unexpected = drafter.load_state_dict({k: v.float() if v.is_floating_point() else v
                                                   for k, v in state.items()}, strict=False)
    if missing or unexpected:
        raise UserError(f"{path}: does not match the drafter config (missing {missing[:3]}, unexpected "
                        f"{unexpected[:3]})")
    return cfg["base"], drafter, cfg


def save_drafter(drafter: SetDrafter, base: str, folder: str | Path, *, dtype: torch.dtype = torch.bfloat16,
                 extra: dict | None = None) -> Path:
    """Write a drafter folder atomically (weights in ``dtype``; the draft vocabulary exactly)."""
    state = {k: (v.to(dtype) if v.is_floating_point() else v).contiguous() for k, v in drafter.state_dict().items()}
    cfg = {"format": FORMAT, "base": base, "drafter": drafter.config.to_dict(), **(extra or {})}
    def fill(tmp: Path) -> None:
        save_file(state, str(tmp / "drafter.safetensors"))
        (tmp / "config.json").write_text(json.dumps(cfg, indent=2) + "\n", encoding="utf-8")

    return write_folder(Path(folder), fill, replaceable=is_drafter_folder)
