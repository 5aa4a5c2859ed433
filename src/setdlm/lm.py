"""A ready-to-use model: a backbone, the family it was trained as, and its tokenizer (docs/method.md §9.4).

``Model`` is a plain container; the work is done by free functions (``setdlm.decoding.generate``,
``setdlm.decoding.infill``, ``setdlm.objectives.compute_loss``) that accept it. Any backbone honouring the
contract of ``setdlm.model`` works (the DiT, or a Hugging Face causal LM through the adapter).

Tokenizers are duck-typed: ``encode(text) -> list[int]``, ``decode(ids) -> str`` and the attributes
``vocab_size``, ``mask_token_id``, ``bos_token_id``, ``eos_token_id``, ``pad_token_id`` (None when absent).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import nn

from .decoding import fill, generate, infill
from .family import FamilyConfig
from .formats.checkpoint import save


@dataclass
class Model:
    backbone: nn.Module
    family: FamilyConfig
    tokenizer: Any | None = None

    def generate(self, prompts, **kwargs):
        """Decode continuations of ``prompts`` (strings or token-id lists) with the family's decoder."""
        return generate(self, prompts, **kwargs)

    def infill(self, prefixes, suffixes, lengths, **kwargs):
        """Fill ``lengths`` tokens between each prefix and suffix."""
        return infill(self, prefixes, suffixes, lengths, **kwargs)

    def fill(self, sequences, **kwargs):
        """Decode every MASK of ``sequences`` (token-id lists holding ``family.mask_token_id`` anywhere)."""
        return fill(self, sequences, **kwargs)

    def save(self, path, **kwargs):
        """Write a checkpoint folder (config.json, model.safetensors, tokenizer.json, README.md model card;
        ``bench=`` adds a results table, ``push_to_hub="user/repo"`` uploads it); see
        :func:`setdlm.formats.checkpoint.save`. ``setdlm.load(path)`` reads it back."""
        return save(path, self, **kwargs)

    @property
    def dtype(self) -> str:
        """The precision the backbone computes in, e.g. ``"bfloat16"`` (its first parameter's dtype;
        ``setdlm.load(..., dtype=)`` casts it)."""
        return str(next(self.backbone.parameters()).dtype).removeprefix("torch.")

    def eval(self) -> Model:
        self.backbone.eval()
        return self
