"""A set drafter: a few transformer layers that draft a window of tokens in one pass over a frozen base model's
hidden states, for lossless speculative decoding with the base as its own verifier (docs/drafter.md).

The base (a pretrained causal LM, e.g. SmolLM2) is never changed: its clean stream is its own forward, so its
logits, and hence every committed token, are the base's (the verifier of :mod:`setdlm.decoding.speculative_drafter`).
What is trained is the drafter: the SetDLM window of docs/method.md §2.4 read as a *mask stream over the base's
cache*. After each base forward, the window ``[b, MASK, .., MASK]`` (``b`` the token the base just committed at
position ``p``, ``w − 1`` masks at ``p+1 .. p+w−1``) attends to

* a context: for every position ``t < p`` the base has cached, a feature ``c_t = fuse([h_t^{(l)} for l in
  feature_layers])`` (the base's hidden states after a low, a middle and the last layer, concatenated and
  projected to the model width), entered into each drafter layer as keys and values (the layer's own k/v
  projections of ``c_t``, RoPE at ``t``); these are cached next to the base's keys and values, so the cache
  bookkeeping (append, crop to the accepted prefix, select and join rows) is the base's;
* the window itself, bidirectionally (a set: every masked position is drafted at once, given the same context).

The masks' outputs go through the base's final norm weights (a copy the drafter trains) and the rows of the base's
output head that form the *draft vocabulary* (the most frequent tokens of the base's own outputs): a draft outside
it is simply never proposed, which costs acceptance, never exactness.

Training (:func:`window_loss`): the window objective at the noise level the decode asks for (every window position
masked, the first one clean), on the base's own greedy continuations: for anchors ``a`` in a sequence, the window
at ``a .. a+w−1`` sees the features ``c_t, t < a`` and predicts ``x_{a+1} .. x_{a+w−1}``, a later offset weighted
``decay^(j−1)`` (the first draft matters most: a rejection ends the accepted prefix).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .errors import UserError
from .model import apply_rope


@dataclass(frozen=True)
class DrafterConfig:
    """The drafter's shape; the attention geometry (heads, head size) is the base's, so its keys and values share
    the base's cache."""

    hidden_size: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    intermediate_size: int
    feature_layers: tuple[int, ...]  # base layers (0-based) whose outputs make a context feature
    window: int  # w: the committed token and w − 1 masks
    vocab_size: int  # size of the draft vocabulary
    rms_eps: float = 1e-5

    def __post_init__(self):
        if self.n_layers < 1:
            raise UserError(f"the drafter needs at least one layer, got n_layers={self.n_layers}")
        if self.window < 2:
            raise UserError(f"the drafter's window must be >= 2 (a committed token and a mask), got {self.window}")
        if not self.feature_layers or min(self.feature_layers) < 0:
            raise UserError(f"feature_layers must name base layers (0-based), got {self.feature_layers}")
        if self.n_heads % self.n_kv_heads:
            raise UserError(f"n_heads={self.n_heads} must be a multiple of n_kv_heads={self.n_kv_heads}")

    def to_dict(self) -> dict:
        d = asdict(self)
        d["feature_layers"] = list(self.feature_layers)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> DrafterConfig:
        known = {k: v for k, v in d.items() if k in cls.__dataclass_fields__}
        known["feature_layers"] = tuple(int(i) for i in known.get("feature_layers", ()))
        return cls(**known)


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """Llama's RMSNorm, in at least float32, cast back."""
    dt = torch.promote_types(x.dtype, torch.float32)
    y = x.to(dt) * torch.rsqrt(x.to(dt).pow(2).mean(-1, keepdim=True) + eps)
    return (y * weight.to(dt)).to(x.dtype)


class DrafterLayer(nn.Module):
    """A Llama decoder layer (pre-RMSNorm, grouped-query attention, SwiGLU) whose keys and values are those of a
    cached context followed by the window's own."""

    def __init__(self, c: DrafterConfig):
        super().__init__()
        d, hd = c.hidden_size, c.head_dim
        self.c = c
        self.input_norm = nn.Parameter(torch.ones(d))
        self.q_proj = nn.Linear(d, c.n_heads * hd, bias=False)
        self.k_proj = nn.Linear(d, c.n_kv_heads * hd, bias=False)
        self.v_proj = nn.Linear(d, c.n_kv_heads * hd, bias=False)
        self.o_proj = nn.Linear(c.n_heads * hd, d, bias=False)
        self.post_norm = nn.Parameter(torch.ones(d))
        self.gate_proj = nn.Linear(d, c.intermediate_size, bias=False)
        self.up_proj = nn.Linear(d, c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, d, bias=False)

    def kv(self, x: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
        """Keys (RoPE applied) and values of hidden states x (B, T, d): (B, Hkv, T, hd) each."""
        B, T, _ = x.shape
        h = rms_norm(x, self.input_norm, self.c.rms_eps)
        k = self.k_proj(h).view(B, T, -1, self.c.head_dim).transpose(1, 2)
        v = self.v_proj(h).view(B, T, -1, self.c.head_dim).transpose(1, 2)
        return apply_rope(k, cos, sin), v

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, ctx_k: Tensor, ctx_v: Tensor, mask: Tensor) -> Tensor:
        """x (B, T, d) the window; ctx_k/ctx_v (B, Hkv, C, hd) the context's; mask (B, 1, T, C + T) bool."""
        B, T, _ = x.shape
        hd = self.c.head_dim
        h = rms_norm(x, self.input_norm, self.c.rms_eps)
        q = apply_rope(self.q_proj(h).view(B, T, -1, hd).transpose(1, 2), cos, sin)  # (B, H, T, hd)
        k = apply_rope(self.k_proj(h).view(B, T, -1, hd).transpose(1, 2), cos, sin)  # (B, Hkv, T, hd)
        v = self.v_proj(h).view(B, T, -1, hd).transpose(1, 2)
        k, v = torch.cat([ctx_k.to(k.dtype), k], 2), torch.cat([ctx_v.to(v.dtype), v], 2)  # (B, Hkv, C+T, hd)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=self.c.n_heads != self.c.n_kv_heads)
        x = x + self.o_proj(y.transpose(1, 2).reshape(B, T, -1))
        h = rms_norm(x, self.post_norm, self.c.rms_eps)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


class SetDrafter(nn.Module):
    """The trainable part (module docstring): feature fusion, ``n_layers`` layers, a final norm, the MASK
    embedding and the draft vocabulary (``vocab_map``: draft index → token id). The token embeddings, RoPE and
    output head rows come from the base at call time."""

    vocab_map: Tensor  # a buffer (draft vocabulary,) long

    def __init__(self, c: DrafterConfig):
        super().__init__()
        self.config = c
        d = c.hidden_size
        self.fuse = nn.Linear(len(c.feature_layers) * d, d, bias=False)
        self.layers = nn.ModuleList(DrafterLayer(c) for _ in range(c.n_layers))
        self.norm = nn.Parameter(torch.ones(d))
        self.mask_embed = nn.Parameter(torch.zeros(d))
        self.register_buffer("vocab_map", torch.zeros(c.vocab_size, dtype=torch.long))

    @property
    def _blocks(self) -> Sequence[DrafterLayer]:
        return cast(Sequence[DrafterLayer], self.layers)  # the nn.ModuleList (not generic) of DrafterLayers above

    def context(self, feats: list[Tensor]) -> Tensor:
        """The context features (B, T, d) from the base's hidden states at :attr:`DrafterConfig.feature_layers`."""
        return self.fuse(torch.cat(feats, -1))

    def context_kv(self, c: Tensor, cos: Tensor, sin: Tensor) -> list[tuple[Tensor, Tensor]]:
        """Each layer's keys and values of the context features c (B, T, d)."""
        return [layer.kv(c, cos, sin) for layer in self._blocks]

    def window(self, x: Tensor, cos: Tensor, sin: Tensor, ctx: list[tuple[Tensor, Tensor]], mask: Tensor) -> Tensor:
        """The window's hidden states after the final norm (B, T, d). x: (B, T, d) its input embeddings."""
        for layer, (k, v) in zip(self.layers, ctx):
            x = layer(x, cos, sin, k, v, mask)
        return rms_norm(x, self.norm, self.config.rms_eps)

    def draft_index(self, vocab: int) -> Tensor:
        """(vocab,) long: each token id's draft index, −1 outside the draft vocabulary."""
        inv = torch.full((vocab,), -1, dtype=torch.long, device=self.vocab_map.device)
        inv[self.vocab_map] = torch.arange(self.vocab_map.numel(), device=inv.device)
        return inv

    def init_from_base(self, layers: Sequence[nn.Module], final_norm: Tensor, mask_embedding: Tensor) -> None:
        """Start from the base: layer i copies the weights of ``layers[i]`` (HF Llama decoder layers, the base's
        last ones), the fusion passes the last feature through, the final norm and MASK embedding are the base's."""
        d = self.config.hidden_size
        with torch.no_grad():
            for mine, theirs in zip(self._blocks, layers):
                mine.input_norm.copy_(theirs.get_parameter("input_layernorm.weight"))
                mine.post_norm.copy_(theirs.get_parameter("post_attention_layernorm.weight"))
                for name in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                             "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"):
                    getattr(mine, name.split(".")[1]).weight.copy_(theirs.get_parameter(f"{name}.weight"))
            self.fuse.weight.zero_()
            self.fuse.weight[:, -d:].copy_(torch.eye(d))
            self.norm.copy_(final_norm)
            self.mask_embed.copy_(mask_embedding)


def window_mask(anchors: Tensor, valid: Tensor, n_ctx: int, w: int) -> Tensor:
    """The training mask (B, 1, A·w, n_ctx + A·w) bool: the window of anchor ``a`` sees the context positions
    ``t < a`` and its own ``w`` slots. anchors (B, A) long, valid (B, A) bool (an invalid window sees only itself)."""
    B, A = anchors.shape
    t = torch.arange(n_ctx, device=anchors.device)
    ctx = (t[None, None, :] < anchors[:, :, None]) & valid[:, :, None]  # (B, A, n_ctx)
    ctx = ctx.repeat_interleave(w, dim=1)  # (B, A·w, n_ctx)
    blk = torch.arange(A * w, device=anchors.device) // w
    own = (blk[:, None] == blk[None, :]).expand(B, A * w, A * w)  # (B, A·w, A·w)
    return torch.cat([ctx, own], -1)[:, None]


def window_loss(drafter: SetDrafter, feats: list[Tensor], tokens: Tensor, anchors: Tensor, valid: Tensor,
                embed: Callable[[Tensor], Tensor], rotary: Callable[[Tensor, Tensor], tuple[Tensor, Tensor]],
                head_weight: Tensor, decay: float = 0.8) -> tuple[Tensor, dict]:
    """The drafter's objective (module docstring) on a batch.

    feats: the base's hidden states at the feature layers, each (B, N, d) (no gradient needed); tokens (B, N) the
    sequences (the base's own continuations); anchors (B, A) the window starts (each ``< N − 1``), valid (B, A);
    embed / rotary: the base's token embedding and rotary embedding; head_weight (Vd, d) the draft vocabulary's
    rows of the base's output head. Returns the weighted mean cross-entropy and ``{"acc@j": accuracy of the j-th
    draft}`` for logging."""
    c = drafter.config
    w, (B, N) = c.window, tokens.shape
    A = anchors.shape[1]
    pos = torch.arange(N, device=tokens.device).expand(B, N)
    ctx_c = drafter.context(feats)  # (B, N, d)
    cos, sin = rotary(ctx_c, pos)
    ctx = drafter.context_kv(ctx_c, cos[:, None], sin[:, None])
    off = torch.arange(w, device=tokens.device)
    wpos = (anchors[:, :, None] + off).reshape(B, A * w)  # (B, A·w) window positions
    x = embed(tokens.gather(1, wpos.clamp(max=N - 1)))  # (B, A·w, d)
    is_mask = (off > 0).repeat(A)[None, :, None]  # (1, A·w, 1)
    x = torch.where(is_mask, drafter.mask_embed.to(x.dtype), x)
    wcos, wsin = rotary(x, wpos)
    h = drafter.window(x, wcos[:, None], wsin[:, None], ctx, window_mask(anchors, valid, N, w))  # (B, A·w, d)
    h = h.view(B, A, w, -1)[:, :, 1:]  # (B, A, w−1, d) the masks
    logits = h.float() @ head_weight.float().T  # (B, A, w−1, Vd)
    target_pos = wpos.view(B, A, w)[:, :, 1:]
    in_seq = (target_pos < N) & valid[:, :, None]
    target = _draft_targets(drafter, tokens, target_pos.clamp(max=N - 1))  # (B, A, w−1), −1 outside the vocab
    ok = in_seq & (target >= 0)
    weights = decay ** torch.arange(w - 1, device=tokens.device, dtype=torch.float32)  # (w−1,)
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.clamp(min=0).reshape(-1),
                         reduction="none").view(B, A, w - 1)
    wt = ok.float() * weights
    loss = (ce * wt).sum() / wt.sum().clamp(min=1e-6)
    with torch.no_grad():
        hit = (logits.argmax(-1) == target) & in_seq
        stats = {f"acc@{j + 1}": float(hit[..., j].sum() / in_seq[..., j].sum().clamp(min=1)) for j in range(w - 1)}
        run = hit.long().cumprod(-1).sum(-1).float()  # accepted drafts if every draft were verified greedily
        stats["accepted"] = float(run[valid].mean()) if bool(valid.any()) else 0.0
    return loss, stats


def _draft_targets(drafter: SetDrafter, tokens: Tensor, positions: Tensor) -> Tensor:
    """The draft index of the token at each of ``positions`` (B, ...), −1 outside the draft vocabulary."""
    inv = drafter.draft_index(max(int(tokens.max()) + 1, int(drafter.vocab_map.max()) + 1))
    B = tokens.shape[0]
    return inv[tokens.gather(1, positions.reshape(B, -1))].view(positions.shape)


def draft_vocabulary(counts: Tensor, size: int, always: list[int]) -> Tensor:
    """The ``size`` most frequent token ids of ``counts`` (V,) with ``always`` (EOS, ...) included, sorted."""
    size = min(size, counts.numel())
    c = counts.clone().float()
    c[torch.as_tensor(always, dtype=torch.long)] = math.inf
    return c.topk(size).indices.sort().values
