"""The transformer backbone and its KV cache (docs/method.md §3.1, §3.3, §9.3).

The default architecture is the authors' DiT exactly, so their checkpoints convert weight for weight:
pre-LayerNorm without bias (computed in at least float32), fused QKV without bias, RoPE (rotate-half,
base 10000) on q and k at the given position ids, output projection without bias, MLP ``d → 4d → d`` with
biases and tanh-GELU, final LayerNorm, untied zero-initialised output head with bias, no time
conditioning.

Contract (the :class:`setdlm.backbone.Backbone` protocol, which the Hugging Face adapter honours too)::

    forward(input_ids (B, T), position_ids (B, T), attn_mask (B, 1|H, T, C+T) bool, cache=None) -> (B, T, V)

``C`` is the cache's width (its longest row) at call time; the first ``C`` mask columns address cache
entries ``0..C-1`` of each row, the last ``T`` the new tokens. Entries past a row's own length are ignored
whatever the mask says. The backbone knows nothing about families, MASK tokens or orders.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, fields

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from .errors import UserError
from .mask_rules import MaskRule, attend


@dataclass
class TransformerConfig:
    """Every architecture field of the backbone. Round-trips through JSON (``to_json`` / ``from_json``)."""

    vocab_size: int
    hidden_size: int = 256
    n_heads: int = 4
    n_layers: int = 4
    mlp_ratio: int = 4
    dropout: float = 0.0
    rope_base: float = 10000.0
    norm_eps: float = 1e-5

    def __post_init__(self):
        for name in ("vocab_size", "hidden_size", "n_heads", "n_layers", "mlp_ratio"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise UserError(f"TransformerConfig.{name} must be a positive integer, got {v!r}")
        if self.vocab_size < 2:
            raise UserError(f"TransformerConfig.vocab_size must be >= 2, got {self.vocab_size}")
        if self.hidden_size % self.n_heads:
            raise UserError(f"hidden_size={self.hidden_size} is not divisible by n_heads={self.n_heads}")
        if self.head_dim % 2:
            raise UserError(f"head_dim={self.head_dim} must be even for rotary embeddings")
        if not 0.0 <= self.dropout < 1.0:
            raise UserError(f"TransformerConfig.dropout must lie in [0, 1), got {self.dropout}")
        if self.rope_base <= 0 or self.norm_eps <= 0:
            raise UserError("TransformerConfig.rope_base and norm_eps must be positive")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.n_heads

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> TransformerConfig:
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise UserError(f"unknown TransformerConfig fields: {sorted(unknown)}")
        return cls(**d)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, s: str) -> TransformerConfig:
        return cls.from_dict(json.loads(s))


# ---------------------------------------------------------------------------------------------------------
# KV cache (docs/method.md §3.3)
# ---------------------------------------------------------------------------------------------------------


class KVCache:
    """Keys (RoPE already applied) and values per layer, with a valid length per row.

    Storage: ``k[l], v[l]``: (B, H, capacity, hd); ``pos``: (B, capacity) the position id of each entry;
    ``lengths``: (B,) long. Row ``b`` holds entries ``0..lengths[b]-1``; anything beyond is garbage that no
    forward reads. A forward appends its ``T`` new tokens at each row's own offset; :meth:`crop` moves the
    lengths back, so "append then crop to keep a prefix" costs nothing extra.
    """

    def __init__(self, n_layers: int, batch: int, n_heads: int, head_dim: int, *, dtype=torch.float32,
                 device=None, capacity: int = 64):
        capacity = max(int(capacity), 1)
        shape = (batch, n_heads, capacity, head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)]
        self.pos = torch.zeros(batch, capacity, dtype=torch.long, device=device)
        self.lengths = torch.zeros(batch, dtype=torch.long, device=device)
        # static: every forward attends over the whole capacity, its mask given in buffer coordinates
        # (B, 1|H, T, capacity), lengths updated in place: no host read in the step (CUDA graphs,
        # setdlm.decoding.cuda_graph)
        self.static = False

    @classmethod
    def for_model(cls, model: Transformer, batch: int, capacity: int = 64) -> KVCache:
        p = next(model.parameters())
        c = model.config
        return cls(c.n_layers, batch, c.n_heads, c.head_dim, dtype=p.dtype, device=p.device, capacity=capacity)

    @property
    def batch(self) -> int:
        return self.lengths.shape[0]

    @property
    def capacity(self) -> int:
        return self.pos.shape[1]

    @property
    def width(self) -> int:
        """Length of the longest row: the ``C`` of the mask contract."""
        return int(self.lengths.max()) if self.batch else 0

    def _ensure(self, need: int) -> None:
        if need <= self.capacity:
            return
        new = max(need, 2 * self.capacity)
        grow = new - self.capacity
        self.k = [F.pad(t, (0, 0, 0, grow)) for t in self.k]
        self.v = [F.pad(t, (0, 0, 0, grow)) for t in self.v]
        self.pos = F.pad(self.pos, (0, grow))

    def crop(self, lengths: int | Tensor) -> None:
        """Crop every row back to ``lengths`` (an int or a (B,) tensor); never lengthens a row."""
        lengths = torch.as_tensor(lengths, dtype=torch.long, device=self.lengths.device).expand_as(self.lengths)
        if (lengths < 0).any():
            raise ValueError("cannot crop a cache to a negative length")
        if self.static:  # in place: a captured graph reads this very tensor
            self.lengths.copy_(torch.minimum(self.lengths, lengths))
        else:
            self.lengths = torch.minimum(self.lengths, lengths).clone()

    def select_rows(self, rows: Tensor) -> None:
        """Keep only the given rows (a (B',) index or a (B,) bool), e.g. to drop finished sequences."""
        self.k = [t[rows] for t in self.k]
        self.v = [t[rows] for t in self.v]
        self.pos = self.pos[rows]
        self.lengths = self.lengths[rows]

    def cat_rows(self, other: KVCache) -> None:
        """Append the rows of ``other`` (capacities padded to the larger one), e.g. rows joining a batch."""
        cap = max(self.capacity, other.capacity)

        def pad(t: Tensor, dim: int) -> Tensor:  # garbage columns past a row's length are never read
            return torch.nn.functional.pad(t, (0, 0) * (t.dim() - 1 - dim) + (0, cap - t.shape[dim]))

        self.k = [torch.cat([pad(a, 2), pad(b, 2)]) for a, b in zip(self.k, other.k)]  # (B + B', H, cap, hd)
        self.v = [torch.cat([pad(a, 2), pad(b, 2)]) for a, b in zip(self.v, other.v)]
        self.pos = torch.cat([pad(self.pos, 1), pad(other.pos, 1)])  # (B + B', cap)
        self.lengths = torch.cat([self.lengths, other.lengths])

    def keep_entries(self, index: Tensor, lengths: Tensor) -> None:
        """Rebuild each row from the entries ``index[b, :lengths[b]]`` (in that order), e.g. to evict the
        oldest entries or those with the smallest positions on overflow. ``index``: (B, n) long."""
        B, n = index.shape
        self.k = [t.gather(2, index[:, None, :, None].expand(B, t.shape[1], n, t.shape[3])) for t in self.k]
        self.v = [t.gather(2, index[:, None, :, None].expand(B, t.shape[1], n, t.shape[3])) for t in self.v]
        self.pos = self.pos.gather(1, index)
        self.lengths = lengths.to(torch.long).clone()

    def update(self, layer: int, k: Tensor, v: Tensor, step: CacheStep) -> tuple[Tensor, Tensor]:
        """Write this step's new keys/values (B, H, T, hd) at each row's offset; return the layer's keys and
        values over the step's buffer width (B, H, W, hd), in the dtype of ``k``."""
        B, H, T, hd = k.shape
        ck, cv = self.k[layer], self.v[layer]
        if ck.is_contiguous() and cv.is_contiguous():
            # one row copy per (row, head, new token) into the flat (B·H·capacity, hd) buffer: the same writes
            # as a scatter along dim 2, several times faster on the CPU (a scatter reads an index per element,
            # and is not vectorized for bfloat16)
            flat = step.flat_write_idx(H, self.capacity)  # (B·H·T,)
            ck.view(-1, hd).index_copy_(0, flat, k.to(ck.dtype).reshape(B * H * T, hd))
            cv.view(-1, hd).index_copy_(0, flat, v.to(cv.dtype).reshape(B * H * T, hd))
        else:
            assert step.write_idx is not None, "a cache write needs a step begun with the cache (begin_step)"
            idx = step.write_idx[:, None, :, None].expand(B, H, T, hd)
            ck.scatter_(2, idx, k.to(ck.dtype))
            cv.scatter_(2, idx, v.to(cv.dtype))
        return ck[:, :, : step.width].to(k.dtype), cv[:, :, : step.width].to(v.dtype)

    def valid(self) -> Tensor:
        """(B, width) bool: which cache columns hold an entry of their row."""
        return torch.arange(self.width, device=self.lengths.device)[None, :] < self.lengths[:, None]

    def positions(self) -> Tensor:
        """(B, width) position ids of the entries (garbage where not :meth:`valid`)."""
        return self.pos[:, : self.width]

    def clone(self) -> KVCache:
        new = KVCache.__new__(KVCache)
        new.k, new.v = [t.clone() for t in self.k], [t.clone() for t in self.v]
        new.pos, new.lengths, new.static = self.pos.clone(), self.lengths.clone(), self.static
        return new


# ---------------------------------------------------------------------------------------------------------
# layers
# ---------------------------------------------------------------------------------------------------------


class LayerNorm(nn.Module):
    """LayerNorm with a weight and no bias, computed in at least float32, cast back (docs/method.md §3.1)."""

    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps
        self.dim = dim

    def forward(self, x: Tensor) -> Tensor:
        if x.dtype == self.weight.dtype and x.dtype in (torch.float32, torch.float64) and \
                not torch.is_autocast_enabled(x.device.type):  # decoding: nothing to cast, no context to enter
            return F.layer_norm(x, [self.dim], weight=self.weight, eps=self.eps)
        dt = torch.promote_types(x.dtype, torch.float32)
        with torch.autocast(device_type=x.device.type, enabled=False):
            y = F.layer_norm(x.to(dt), [self.dim], weight=self.weight.to(dt), eps=self.eps)
        return y.to(x.dtype)


def rope_cos_sin(position_ids: Tensor, head_dim: int, base: float, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """cos/sin of the rotary angles at arbitrary position ids, rotate-half layout: (B, 1, T, hd) each."""
    even = torch.arange(0, head_dim, 2, dtype=torch.float64, device=position_ids.device)
    inv_freq = 1.0 / (base ** (even / head_dim))
    ang = position_ids.to(torch.float64)[..., None] * inv_freq  # (B, T, hd/2)
    ang = torch.cat([ang, ang], dim=-1)[:, None]  # (B, 1, T, hd)
    return ang.cos().to(dtype), ang.sin().to(dtype)


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """``x·cos + rotate_half(x)·sin`` with ``rotate_half(x) = cat(−x2, x1)``. x: (B, H, T, hd)."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


def attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | MaskRule | None, *, scale: float | None = None,
              dropout_p: float = 0.0, wide: bool = False) -> Tensor:
    """The one place the attention kernel is chosen: PyTorch SDPA with a boolean mask, scale 1/√hd unless
    given, optional dropout on the attention probabilities (pretrained backbones that train with it).
    q: (B, H, T, hd); k, v: (B, Hkv, S, hd) with H a multiple of Hkv (grouped-query attention: query head h
    reads KV head h // (H / Hkv), transformers' ``repeat_kv``); mask: (B, 1|H, T, S) bool, or a training mask
    by its rule (:class:`setdlm.mask_rules.MaskRule`: is_causal SDPA, FlexAttention or the dense mask).

    Grouped KV heads: on the CPU SDPA reads them in place (``enable_gqa``: the same numbers as repeating them,
    without copying the whole cache every layer and step); elsewhere they are repeated first (on CUDA a
    boolean mask selects the memory-efficient kernel, which has no grouped-query support).

    ``wide``: compute in float64 and round once to q's dtype. Float32 attention differs in its last bits with
    the number of keys (padding, cache length) and queries of a step, since the kernel's blocking, vector tails
    and BLAS path follow the shape; the result rounded from float64 does not (to float32 rounding). Quantized
    backbones use it (docs/quantization.md): their per-row int8 activation quantizer would turn a one-ulp
    difference into a whole quantization level, and a row's logits would then depend on its batch."""
    if isinstance(mask, MaskRule):  # a training mask by its rule: the kernel follows it (setdlm.mask_rules)
        if not wide:
            return attend(q, k, v, mask, scale=scale, dropout_p=dropout_p,
                          sdpa=lambda q, k, v, m, causal: _sdpa(q, k, v, m, causal, scale, dropout_p))
        mask = mask.fixed()
    if wide and q.dtype != torch.float64:  # float64 inside, one rounding to q's dtype at the end
        return attention(q.double(), k.double(), v.double(), mask, scale=scale, dropout_p=dropout_p).to(q.dtype)
    return _sdpa(q, k, v, mask, False, scale, dropout_p)


def _sdpa(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, is_causal: bool, scale: float | None,
          dropout_p: float) -> Tensor:
    """SDPA with grouped KV heads (see :func:`attention`)."""
    groups = q.shape[1] // k.shape[1]
    if groups > 1 and q.device.type != "cpu":
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)  # (B, H, S, hd)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, scale=scale,
                                          is_causal=is_causal, enable_gqa=groups > 1)


class Block(nn.Module):
    """Pre-LN transformer block: ``x + attn(LN1 x)``, ``x + mlp(LN2 x)`` with residual dropout."""

    def __init__(self, c: TransformerConfig):
        super().__init__()
        d = c.hidden_size
        self.n_heads, self.head_dim = c.n_heads, c.head_dim
        self.norm1 = LayerNorm(d, c.norm_eps)
        self.attn_qkv = nn.Linear(d, 3 * d, bias=False)
        self.attn_out = nn.Linear(d, d, bias=False)
        self.norm2 = LayerNorm(d, c.norm_eps)
        self.mlp = nn.Sequential(nn.Linear(d, c.mlp_ratio * d), nn.GELU(approximate="tanh"),
                                 nn.Linear(c.mlp_ratio * d, d))
        self.dropout = nn.Dropout(c.dropout)
        self.wide_attention = False  # float64 attention (set by setdlm.formats.quantize: see attention())

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, mask: Tensor | MaskRule | None, layer: int,
                cache: KVCache | None, step: CacheStep, kv_only: bool = False) -> Tensor:
        """``kv_only``: write this step's keys and values to ``cache`` and stop (x is returned unchanged): the
        last block of a forward that asks for no logits (a prefill) needs nothing else."""
        B, T, d = x.shape
        H, hd = self.n_heads, self.head_dim
        qkv = self.attn_qkv(self.norm1(x)).view(B, T, 3, H, hd)  # 'b s (three h d) -> b s three h d'
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # each (B, H, T, hd)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if cache is not None:
            k, v = cache.update(layer, k, v, step)  # (B, H, W, hd): cached entries + this step's
            if kv_only:
                return x
        y = attention(q, k, v, mask, wide=self.wide_attention)  # (B, H, T, hd)
        y = y.transpose(1, 2).reshape(B, T, d)
        y = self.attn_out(y)
        x = x + (self.dropout(y) if self.training else y)  # no dropout module call in eval
        y = self.mlp(self.norm2(x))
        return x + (self.dropout(y) if self.training else y)


class Transformer(nn.Module):
    """The DiT backbone of docs/method.md §3.1 (no time conditioning)."""

    accepts_mask_rules = True  # training masks may come as setdlm.mask_rules.MaskRule

    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.hidden_size)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layers))
        self.norm_final = LayerNorm(config.hidden_size, config.norm_eps)
        self.head = nn.Linear(config.hidden_size, config.vocab_size, bias=True)
        self.grad_checkpointing = False  # recompute each block in the backward pass (setdlm train --grad-checkpointing)
        self.init_weights()

    @torch.no_grad()
    def init_weights(self, *, zero_head: bool = True, generator: torch.Generator | None = None) -> Transformer:
        """Reference init: Kaiming-uniform(a=√5) embedding, ``nn.Linear`` defaults, unit LayerNorms and a
        zero output head. ``zero_head=False`` gives the head a random init too (random-weight tests and
        benchmarks, where a zero head would make every logit tie)."""
        g = generator
        nn.init.kaiming_uniform_(self.embed.weight, a=math.sqrt(5), generator=g)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.kaiming_uniform_(m.weight, a=math.sqrt(5), generator=g)
                if m.bias is not None:
                    bound = 1 / math.sqrt(m.in_features)
                    nn.init.uniform_(m.bias, -bound, bound, generator=g)
            elif isinstance(m, LayerNorm):
                m.weight.fill_(1.0)
        if zero_head:
            self.head.weight.zero_()
            self.head.bias.zero_()
        return self

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def new_cache(self, batch: int, capacity: int = 64) -> KVCache:
        return KVCache.for_model(self, batch, capacity)

    def forward(self, input_ids: Tensor, position_ids: Tensor | None = None, attn_mask: Tensor | None = None,
                cache: KVCache | None = None, *, keep: int | Tensor | None = None,
                logits_start: int = 0) -> Tensor:
        """Logits (B, T − logits_start, V) for ``input_ids`` (B, T) at ``position_ids`` (B, T).

        ``attn_mask``: (B, 1|H, T, C+T) bool with ``C = cache.width`` (``C = 0`` without a cache); None =
        full attention. With a cache the new K/V are appended to each row; ``keep`` (int or (B,)) then crops
        each row to its old length + ``keep`` (default: keep all ``T``).
        """
        B, T = input_ids.shape
        if position_ids is None:
            position_ids = torch.arange(T, device=input_ids.device).expand(B, T)
        x = self.embed(input_ids)  # (B, T, d)
        cos, sin = rope_cos_sin(position_ids, self.config.head_dim, self.config.rope_base, x.dtype)
        step = begin_step(cache, position_ids, attn_mask)
        last = len(self.blocks) - 1 if cache is not None and logits_start >= T else None  # no logits: a prefill
        for i, block in enumerate(self.blocks):
            if self.grad_checkpointing and self.training and cache is None and torch.is_grad_enabled():
                x = checkpoint(block, x, cos, sin, step.mask, i, cache, step, use_reentrant=False)
            else:  # the last block of a prefill only caches its keys and values (about a quarter of the work)
                x = block(x, cos, sin, step.mask, i, cache, step, kv_only=i == last)
        end_step(cache, step, keep)
        h = self.norm_final(x[:, logits_start:])
        return self.head(h)


@dataclass
class CacheStep:
    """Bookkeeping of one forward against a cache (shared by every backbone that honours the contract)."""

    mask: Tensor | MaskRule | None  # (B, 1|H, T, W) bool in buffer coordinates, a rule, or None (full attention)
    start: Tensor | None = None  # (B,) row lengths before the step
    write_idx: Tensor | None = None  # (B, T) buffer column of each new token
    width: int = 0  # W: buffer columns the step attends over
    T: int = 0
    _flat: Tensor | None = None  # flat_write_idx, made by the first layer, reused by the others
    _additive: Tensor | None = None  # additive_mask, made by the first layer, reused by the others

    def additive_mask(self, dtype: torch.dtype) -> Tensor | MaskRule | None:
        """:attr:`mask` as 0 / −inf in ``dtype`` (SDPA's own reading of a boolean mask), made once per step."""
        if not isinstance(self.mask, Tensor) or self.mask.dtype != torch.bool:  # None, a rule, already additive
            return self.mask
        if self._additive is None or self._additive.dtype != dtype:
            self._additive = torch.zeros(self.mask.shape, dtype=dtype, device=self.mask.device).masked_fill_(
                ~self.mask, float("-inf"))
        return self._additive

    def flat_write_idx(self, n_heads: int, capacity: int) -> Tensor:
        """(B·H·T,) long: the row of each new key/value in a cache layer viewed as (B·H·capacity, hd), in
        (row, head, token) order (:meth:`KVCache.update`)."""
        assert self.write_idx is not None, "a cache write needs a step begun with the cache (begin_step)"
        if self._flat is None or self._flat.numel() != self.write_idx.numel() * n_heads:
            B = self.write_idx.shape[0]
            base = torch.arange(B * n_heads, device=self.write_idx.device).view(B, n_heads, 1) * capacity
            self._flat = (base + self.write_idx[:, None, :]).reshape(-1)  # (B, H, T) -> (B·H·T,)
        return self._flat


def begin_step(cache: KVCache | None, position_ids: Tensor, attn_mask: Tensor | MaskRule | None) -> CacheStep:
    """Translate a contract mask (B, 1|H, T, C+T) to buffer coordinates, reserve room and record the new
    tokens' positions. Without a cache the mask passes through. Rows with no visible key see everything
    (their output is garbage but finite; callers ignore it)."""
    B, T = position_ids.shape
    if cache is not None and cache.static:
        return _static_step(cache, position_ids, attn_mask)
    if isinstance(attn_mask, MaskRule):
        if cache is None:  # a training forward: the rule goes to attention() as it is
            return CacheStep(attn_mask, width=T, T=T)
        attn_mask = attn_mask.dense()
    if cache is None:
        step = CacheStep(attn_mask, width=T, T=T)
    else:
        if cache.batch != B:
            raise ValueError(f"cache holds {cache.batch} rows but the input has {B}")
        start = cache.lengths.clone()  # (B,)
        C = int(start.max()) if B else 0  # cache.width, read once (one host sync per step on a GPU)
        width = C + T
        cache._ensure(width)
        write_idx = start[:, None] + torch.arange(T, device=start.device)  # (B, T)
        cache.pos.scatter_(1, write_idx, position_ids.to(torch.long))
        if attn_mask is not None:
            mask = mask_to_buffer(attn_mask, start, C, T, width)
        else:
            cols = torch.arange(width, device=start.device)
            mask = (cols[None, :] < (start + T)[:, None])[:, None, None, :]  # (B, 1, 1, W)
        step = CacheStep(mask, start, write_idx, width, T)
    if isinstance(step.mask, Tensor):  # not None (a rule was returned above)
        step.mask = step.mask | ~step.mask.any(-1, keepdim=True)  # a row with no visible key would give NaN
    return step


def _static_step(cache: KVCache, position_ids: Tensor, attn_mask: Tensor | MaskRule | None) -> CacheStep:
    """:func:`begin_step` for a static cache: ``attn_mask`` (B, 1|H, T, capacity) is already in buffer
    coordinates (:func:`mask_to_buffer` with ``width = capacity``), the step attends over the whole capacity,
    and nothing is read on the host. The caller guarantees ``lengths + T <= capacity``."""
    B, T = position_ids.shape
    if not isinstance(attn_mask, Tensor) or attn_mask.shape[-1] != cache.capacity or attn_mask.shape[-2] != T:
        raise ValueError(f"a static cache needs a (B, 1|H, {T}, {cache.capacity}) mask in buffer coordinates")
    start = cache.lengths.clone()  # (B,)
    write_idx = start[:, None] + torch.arange(T, device=start.device)  # (B, T)
    cache.pos.scatter_(1, write_idx, position_ids.to(torch.long))
    mask = attn_mask | ~attn_mask.any(-1, keepdim=True)  # a row with no visible key would give NaN
    return CacheStep(mask, start, write_idx, cache.capacity, T)


def end_step(cache: KVCache | None, step: CacheStep, keep: int | Tensor | None) -> None:
    """Persist the first ``keep`` (int or (B,)) of the step's new tokens per row (default all)."""
    if cache is None:
        return
    assert step.start is not None, "end_step with a cache needs a step begun with it (begin_step)"
    n_keep = step.T if keep is None else keep
    lengths = step.start + torch.as_tensor(n_keep, dtype=torch.long, device=step.start.device).clamp(0, step.T)
    if cache.static:
        cache.lengths.copy_(lengths)  # in place: a captured graph reads and writes this very tensor
    else:
        cache.lengths = lengths


def mask_to_buffer(mask: Tensor, start: Tensor, C: int, T: int, width: int) -> Tensor:
    """Re-index a mask from contract coordinates (``C`` cache columns then ``T`` new) to buffer columns,
    where row b's new tokens sit at ``start[b]..start[b]+T-1``. Columns a row does not hold become False.
    ``width > C + T`` (a static cache's capacity) always gathers, reading nothing on the host."""
    if mask.shape[-1] != C + T:
        raise ValueError(f"attention mask has {mask.shape[-1]} key columns; expected cache width {C} + {T} new")
    if width == C + T and bool((start == C).all()):
        return mask  # rows share one length: the two coordinate systems coincide
    B = start.shape[0]
    c = torch.arange(width, device=start.device)[None, :]  # (1, W)
    s = start[:, None]  # (B, 1)
    src = torch.where(c < s, c, C + (c - s))  # (B, W)
    ok = c < s + T
    src = src.clamp(max=C + T - 1)
    m = mask.expand(B, mask.shape[1], T, C + T).gather(-1, src[:, None, None, :].expand(B, mask.shape[1], T, width))
    return m & ok[:, None, None, :]
