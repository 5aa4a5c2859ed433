"""What depends on the step alone (docs/method.md §9.6): the learning rate and the data order. Nothing random
is carried from step to step, so a run resumed from step ``s`` continues exactly where it stopped."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ..seeds import derive_seed
from .config import OptimArgs


def lr_at(cfg: OptimArgs, step: int) -> float:
    """Learning rate of optimizer step ``step`` (0-based): linear warm-up, then constant or cosine.
    ``cfg``: the :class:`~setdlm.training.config.OptimArgs` (or a ``TrainConfig``, which reads them)."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    if cfg.lr_schedule == "constant":
        return cfg.lr
    span = max(cfg.steps - cfg.warmup, 1)
    progress = min((step - cfg.warmup) / span, 1.0)
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


class DataOrder:
    """Global batch ``s`` = rows ``s·G .. s·G+G−1`` of an endless stream of epochs, each a permutation of the
    training rows seeded by ``(seed, epoch)``: a pure function of ``s``."""

    def __init__(self, n: int, seed: int):
        self.n, self.seed = n, seed
        self._perms: dict[int, Tensor] = {}

    def perm(self, epoch: int) -> Tensor:
        if epoch not in self._perms:
            if len(self._perms) > 4:
                self._perms.clear()
            g = torch.Generator().manual_seed(derive_seed(self.seed, "data", epoch))
            self._perms[epoch] = torch.randperm(self.n, generator=g)
        return self._perms[epoch]

    def batch(self, step: int, size: int) -> Tensor:
        pos = torch.arange(step * size, (step + 1) * size)
        epochs = pos // self.n
        return torch.cat([self.perm(int(e))[pos[epochs == e] % self.n] for e in epochs.unique()])

    def position(self, step: int, size: int) -> dict:
        done = step * size
        return {"epoch": done // self.n, "offset": done % self.n, "rows_seen": done}


def micro_batch_seed(seed: int, step: int, index: int) -> int:
    """Seed of the randomness (orders, masks, dropout) of micro-batch ``index`` of global batch ``step``,
    where ``index = rank · grad_accum + m`` numbers the micro-batches of the global batch whatever the number
    of processes: 1 process × 2 micro-batches and 2 processes × 1 draw the same. (The constant 0 keeps the
    seeds of one-process runs those of earlier versions, which seeded ``(seed, step, rank, m)``.)"""
    return derive_seed(seed, "step", step, 0, index)
