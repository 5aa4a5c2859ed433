"""One batch of examples: token ids, padding and context masks (docs/method.md §2.1).

Every row is ``[BOS] context targets [EOS]`` right-padded to ``L``: ``attention_mask`` is False on padding
(invisible to the model), ``context_mask`` is True on BOS and prompt tokens (never masked, never in a loss).
The data layer (:mod:`setdlm.data.dataset`) builds batches, the objectives (:mod:`setdlm.objectives`) and
the evaluators consume them; this module sits below both and imports only torch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class Batch:
    input_ids: Tensor  # (B, L) long
    attention_mask: Tensor  # (B, L) bool, False on padding
    context_mask: Tensor | None = None  # (B, L) bool, True on prompt tokens
    unpadded: bool | None = None  # no padding slot, when known on the host (None = unknown; see to())

    def __post_init__(self):
        self.attention_mask = self.attention_mask.bool()
        if self.context_mask is None:
            self.context_mask = torch.zeros_like(self.attention_mask)
        self.context_mask = self.context_mask.bool()
        if self.input_ids.shape != self.attention_mask.shape or self.input_ids.shape != self.context_mask.shape:
            raise ValueError("input_ids, attention_mask and context_mask must share one (B, L) shape")

    @property
    def targets(self) -> Tensor:
        """(B, L) bool: tokens to be generated and scored."""
        assert self.context_mask is not None  # __post_init__ makes it a tensor
        return self.attention_mask & ~self.context_mask

    def to(self, device) -> Batch:
        """The batch on ``device``; a batch leaving the CPU records whether it has padding (read on the host, so
        the training step's attention kernel is chosen without a device sync, docs/training.md)."""
        assert self.context_mask is not None  # __post_init__ makes it a tensor
        unpadded = self.unpadded
        if unpadded is None and self.attention_mask.device.type == "cpu":
            unpadded = bool(self.attention_mask.all())
        return Batch(self.input_ids.to(device), self.attention_mask.to(device), self.context_mask.to(device), unpadded)
