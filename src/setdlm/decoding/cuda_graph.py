"""CUDA-graph decode steps (docs/decoding.md, "CUDA graphs"): a backbone wrapper whose cached forwards run over
a static-capacity KV cache, captured once per shape and replayed.

``Model(GraphedBackbone(backbone), family)`` decodes with every decoder unchanged (they only see the backbone
contract). What changes underneath:

* :meth:`GraphedBackbone.new_cache` returns a *static* :class:`setdlm.model.KVCache` whose capacity is rounded
  up to a power of two (the bucket). Every cached forward attends over the whole capacity: the decoder's mask
  (contract coordinates, ``C + T`` columns) is re-indexed to buffer columns on the device
  (:func:`setdlm.model.mask_to_buffer` with ``width = capacity``: no host read), the slots a row does not hold
  are masked, and ``lengths`` is updated in place. On the CPU this is the whole difference (tests check the
  tokens equal the dynamic cache's).
* On CUDA (``capture=True``, the default there) the forward of each (batch, new tokens, logits start,
  capacity, cache storage) is captured in a ``torch.cuda.CUDAGraph`` the second time it comes (the first runs
  eagerly, so one-off shapes such as the prefill are never captured; two warm-up calls on a side stream, then
  the capture, all from the same cache state) and replayed afterwards: a replay copies the
  step's ids, positions, mask and ``keep`` into the graph's buffers and launches the whole forward at once.
  When the cache's storage moves (rows leave the batch, overflow eviction, growth) the next step captures
  anew. The logits are cloned out of the graph's buffer.

Forwards without a cache (MDLM, the likelihood) and the prefill's first call go through the wrapped backbone
as they are: only steps whose inputs the graph owns are captured. The backbone must not read tensors on the
host inside its forward (GPT-2's position check does: graph GPT-2 models eagerly, ``capture=False``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from ..backbone import Backbone
from ..errors import UserError
from ..model import KVCache, mask_to_buffer

if TYPE_CHECKING:
    from torch.cuda import _POOL_HANDLE


def bucket(n: int) -> int:
    """The capacity bucket of ``n`` slots: the next power of two (at least 16)."""
    return max(16, 1 << (max(int(n), 1) - 1).bit_length())


class _Graph:
    """One captured forward and the buffers it reads and writes."""

    graph: torch.cuda.CUDAGraph  # set by GraphedBackbone._capture, which alone makes a _Graph
    out: Tensor  # the logits the graph writes (set with ``graph``)

    def __init__(self, ids: Tensor, pos: Tensor, mask: Tensor, keep: Tensor):
        self.ids, self.pos, self.mask, self.keep = ids.clone(), pos.clone(), mask.clone(), keep.clone()


class GraphedBackbone(nn.Module):
    """A backbone whose cached decoding forwards use a static-capacity cache, captured in CUDA graphs on CUDA
    (module docstring). ``capture``: None = on CUDA devices only; False = static cache, eager (the CPU)."""

    def __init__(self, inner: Backbone, capture: bool | None = None):
        super().__init__()
        self.inner: Backbone = inner  # an nn.Module honouring the contract: registered as a submodule
        self.capture = capture
        self.graphs: dict[tuple, _Graph] = {}
        self.seen: set[tuple] = set()  # shapes run once: a shape is captured the second time it comes
        self.pool: _POOL_HANDLE | None = None  # one memory pool shared by the graphs
        self.replays = 0  # forwards served by a replayed graph (for tests and benchmarks)
        self.train(inner.training)

    def new_cache(self, batch: int, capacity: int = 64) -> KVCache:
        cache = self.inner.new_cache(batch, bucket(capacity))
        cache.static = True
        return cache

    def num_parameters(self) -> int:
        return self.inner.num_parameters()

    @property
    def vocab_size(self):
        config = getattr(self.inner, "config", None)
        return getattr(self.inner, "vocab_size", None) or getattr(config, "vocab_size", None)

    def forward(self, input_ids: Tensor, position_ids: Tensor | None = None, attn_mask: Tensor | None = None,
                cache: KVCache | None = None, *, keep: int | Tensor | None = None, logits_start: int = 0) -> Tensor:
        if cache is None or not cache.static:
            return self.inner(input_ids, position_ids, attn_mask, cache, keep=keep, logits_start=logits_start)
        B, T = input_ids.shape
        if position_ids is None:
            position_ids = torch.arange(T, device=input_ids.device).expand(B, T)
        if attn_mask is None:  # the cache's width (contract coordinates) is read from the mask's shape
            raise UserError("GraphedBackbone: a forward with a static cache needs the decoder's attention mask "
                             f"(B, 1|H, {T}, C+{T})")
        C = attn_mask.shape[-1] - T  # the caller's cache width (contract coordinates), known from the shape
        if C + T > cache.capacity:  # outgrown: the next bucket (the storage moves, so graphs are captured anew)
            cache._ensure(bucket(C + T))
        mask = mask_to_buffer(attn_mask, cache.lengths, C, T, cache.capacity)  # (B, 1|H, T, capacity)
        keep_t = torch.as_tensor(T if keep is None else keep, dtype=torch.long, device=input_ids.device)
        keep_t = keep_t.expand(B).contiguous()  # (B,)
        use_graph = self.capture if self.capture is not None else input_ids.is_cuda
        if not use_graph:
            return self.inner(input_ids, position_ids, mask, cache, keep=keep_t, logits_start=logits_start)
        return self._replay(input_ids, position_ids, mask, keep_t, cache, logits_start)

    def _replay(self, ids: Tensor, pos: Tensor, mask: Tensor, keep: Tensor, cache: KVCache, ls: int) -> Tensor:
        storage = tuple(t.data_ptr() for t in (*cache.k, *cache.v, cache.pos, cache.lengths))  # what a graph reads
        key = (tuple(ids.shape), tuple(mask.shape), ls, cache.capacity, storage)
        g = self.graphs.get(key)
        if g is None:
            if key not in self.seen:  # a one-off shape (the prefill, a last short step) runs eagerly
                self.seen.add(key)
                return self.inner(ids, pos, mask, cache, keep=keep, logits_start=ls)
            # the cache's storage moved (rows left, eviction, growth): graphs over the old one are dropped
            self.graphs = {k: v for k, v in self.graphs.items() if k[-1] == storage}
            self.seen = {k for k in self.seen if k[-1] == storage}
            g = self.graphs[key] = self._capture(ids, pos, mask, keep, cache, ls)
            return g.out.clone()
        g.ids.copy_(ids)
        g.pos.copy_(pos)
        g.mask.copy_(mask)
        g.keep.copy_(keep)
        g.graph.replay()  # reads and updates cache.lengths in place, writes the new K/V into the cache
        self.replays += 1
        return g.out.clone()

    def _capture(self, ids: Tensor, pos: Tensor, mask: Tensor, keep: Tensor, cache: KVCache, ls: int) -> _Graph:
        """Warm up on a side stream, capture, then run the step once for real (all from the same cache state:
        each call writes the same K/V at the same slots, and ``lengths`` is restored before each)."""
        g = _Graph(ids, pos, mask, keep)
        lengths = cache.lengths.clone()

        def run() -> Tensor:
            cache.lengths.copy_(lengths)
            return self.inner(g.ids, g.pos, g.mask, cache, keep=g.keep, logits_start=ls)

        side = torch.cuda.Stream(device=ids.device)
        side.wait_stream(torch.cuda.current_stream(ids.device))
        with torch.cuda.stream(side):
            for _ in range(2):
                run()
        torch.cuda.current_stream(ids.device).wait_stream(side)
        g.graph = torch.cuda.CUDAGraph()
        cache.lengths.copy_(lengths)
        with torch.cuda.graph(g.graph, pool=self.pool):
            g.out = self.inner(g.ids, g.pos, g.mask, cache, keep=g.keep, logits_start=ls)
        self.pool = g.graph.pool()
        cache.lengths.copy_(lengths)
        g.graph.replay()
        return g
