"""What decoders and objectives call on a backbone: the :class:`Backbone` protocol (docs/method.md §3, §9.3).

The objectives (``setdlm.objectives``) call ``backbone(input_ids, position_ids, attn_mask)`` (SetDLM's two
streams with ``logits_start=L``, the query stream only); the decoders (``setdlm.decoding``) also pass a
:class:`~setdlm.model.KVCache` from ``backbone.new_cache(batch, capacity)`` and ``keep=`` (how many of the new
tokens each row's cache keeps), switch ``train``/``eval`` mode and read the device from ``parameters()``.
Nothing else is used, so any ``nn.Module`` that honours this works: our DiT (:class:`setdlm.model.Transformer`)
and the Hugging Face adapter (:class:`setdlm.formats.hf.HFBackbone`) both do. The backbone knows nothing about
families, MASK tokens or orders.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from torch import Tensor, nn

if TYPE_CHECKING:
    from .mask_rules import MaskRule
    from .model import KVCache


@runtime_checkable
class Backbone(Protocol):
    """A network mapping token ids at position ids under a boolean attention mask to logits."""

    training: bool

    def __call__(self, input_ids: Tensor, position_ids: Tensor | None = None,
                 attn_mask: Tensor | MaskRule | None = None,
                 cache: KVCache | None = None, *, keep: int | Tensor | None = None,
                 logits_start: int = 0) -> Tensor:
        """Logits (B, T − logits_start, V) for ``input_ids`` (B, T) at ``position_ids`` (B, T) (None: 0..T-1).

        ``attn_mask``: (B, 1|H, T, C+T) bool, ``C`` the cache's width (0 without a cache), True = attend;
        None = full attention; in training also a :class:`~setdlm.mask_rules.MaskRule` (the mask by its rule,
        :func:`setdlm.mask_rules.training_mask`). With a cache the new keys/values are appended to each row,
        then each row is cropped to its old length + ``keep`` (int or (B,); None keeps all ``T``)."""
        ...

    def new_cache(self, batch: int, capacity: int = 64) -> KVCache:
        """An empty KV cache for ``batch`` rows (it grows past ``capacity`` when needed)."""
        ...

    def parameters(self, recurse: bool = True) -> Iterator[nn.Parameter]: ...

    def train(self, mode: bool = True): ...

    def eval(self): ...

    def num_parameters(self) -> int: ...
