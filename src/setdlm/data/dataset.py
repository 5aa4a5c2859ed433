"""Token datasets: packing documents into fixed-length rows, padding prompt/completion pairs, and the fixed
held-out split (docs/method.md §2.1, §5.1).

Every example is a row of length ``L`` with the three tensors of :class:`setdlm.batch.Batch`:

* **Documents** (language modelling) are tokenized, each followed by EOS, concatenated into one stream and
  cut into rows of ``L − 1`` tokens, each row starting with BOS (the last row is right-padded). BOS is
  *context*: never masked, never in the loss, so every family scores the same tokens (AR never predicts
  position 0 either).
* **Prompt/completion pairs** become ``[BOS] prompt completion [EOS]`` right-padded to ``L``; BOS and the
  prompt are context. A completion that does not fit is truncated with its last token forced to EOS.

The held-out split is a fixed, seeded choice of rows (independent of the training seed), so that training
and ``setdlm eval`` score exactly the same rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import overload

import numpy as np
import torch
from torch import Tensor

from ..batch import Batch
from ..errors import UserError
from .prompt import check_prompt_fits


@dataclass
class TokenDataset:
    input_ids: Tensor  # (N, L) long
    attention_mask: Tensor  # (N, L) bool, False on padding
    context_mask: Tensor  # (N, L) bool, True on BOS/prompt tokens

    def __post_init__(self):
        if self.input_ids.dim() != 2 or self.input_ids.shape != self.attention_mask.shape \
                or self.input_ids.shape != self.context_mask.shape:
            raise ValueError("input_ids, attention_mask and context_mask must share one (N, L) shape")

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    @property
    def length(self) -> int:
        return self.input_ids.shape[1]

    @property
    def n_targets(self) -> int:
        """Tokens a likelihood bound counts (not context, not padding)."""
        return int((self.attention_mask & ~self.context_mask).sum())

    def subset(self, index) -> TokenDataset:
        index = torch.as_tensor(index, dtype=torch.long)
        return TokenDataset(self.input_ids[index], self.attention_mask[index], self.context_mask[index])

    def batch(self, index) -> Batch:
        index = torch.as_tensor(index, dtype=torch.long)
        return Batch(self.input_ids[index], self.attention_mask[index], self.context_mask[index])

    def batches(self, batch_size: int) -> Batches:
        """Consecutive batches in order (the last may be smaller), built on access: a sequence, so that each
        process of a distributed evaluation builds only its own."""
        return Batches(self, batch_size)


class Batches(Sequence[Batch]):
    """The rows of a :class:`TokenDataset` as consecutive batches of ``size`` rows (:meth:`TokenDataset.batches`)."""

    def __init__(self, data: TokenDataset, size: int):
        self.data, self.size = data, size

    def __len__(self) -> int:
        return -(-len(self.data) // self.size)

    @overload
    def __getitem__(self, i: int) -> Batch: ...

    @overload
    def __getitem__(self, i: slice) -> list[Batch]: ...

    def __getitem__(self, i: int | slice) -> Batch | list[Batch]:
        if isinstance(i, slice):  # a Sequence's slice: the batches it picks, as a list
            return [self[j] for j in range(*i.indices(len(self)))]
        if not 0 <= i < len(self):
            raise IndexError(i)
        return self.data.batch(torch.arange(i * self.size, min((i + 1) * self.size, len(self.data))))


def _filler(pad_id: int | None, eos_id: int | None, mask_id: int) -> int:
    """Token id written on padding (invisible to the model; any valid id works)."""
    return next(i for i in (pad_id, eos_id, mask_id) if i is not None)


def pack_documents(docs: list[list[int]], length: int, *, bos_id: int | None, eos_id: int | None,
                   pad_id: int) -> TokenDataset:
    """Concatenate ``doc + [EOS]`` for every document and cut the stream into rows ``[BOS] + L−1 tokens``
    (``L`` tokens without a BOS). The last row is right-padded with ``pad_id``."""
    head = 1 if bos_id is not None else 0
    if length < head + 1:
        raise UserError(f"context length L must be >= {head + 1}, got {length}")
    tail = [eos_id] if eos_id is not None else []
    parts = [np.asarray(d + tail, dtype=np.int64) for d in docs if d]
    if not parts:
        raise UserError("empty corpus: no tokens after tokenization")
    flat = torch.from_numpy(np.concatenate(parts))  # (n_tokens,) the stream
    body = length - head
    n = -(-len(flat) // body)  # ceil
    ids = torch.full((n, length), pad_id, dtype=torch.long)
    full = len(flat) // body
    ids[:full, head:] = flat[: full * body].view(full, body)  # (full, L − head)
    rest = len(flat) - full * body
    if rest:
        ids[full, head: head + rest] = flat[full * body:]
    attn = torch.ones(n, length, dtype=torch.bool)
    if rest:
        attn[full, head + rest:] = False
    ctx = torch.zeros(n, length, dtype=torch.bool)
    if bos_id is not None:  # head == 1
        ids[:, 0] = bos_id
        ctx[:, 0] = True
    return TokenDataset(ids, attn, ctx)


def pad_pairs(pairs: list[tuple[list[int], list[int]]], length: int, *, bos_id: int | None,
              eos_id: int | None, pad_id: int) -> TokenDataset:
    """``[BOS] prompt completion [EOS]`` per pair, right-padded to ``length``; BOS + prompt are context."""
    n = len(pairs)
    ids = torch.full((n, length), pad_id, dtype=torch.long)
    attn = torch.zeros(n, length, dtype=torch.bool)
    ctx = torch.zeros(n, length, dtype=torch.bool)
    for i, (p, c) in enumerate(pairs):
        prompt = ([bos_id] if bos_id is not None else []) + list(p)
        comp = list(c) + ([eos_id] if eos_id is not None else [])
        check_prompt_fits(len(prompt), length, f"example {i}: prompt")  # room for one completion token at least
        if not comp:
            raise UserError(f"example {i}: empty completion")
        if len(prompt) + len(comp) > length:
            comp = comp[: length - len(prompt)]
            if eos_id is not None:
                comp[-1] = eos_id
        row = prompt + comp
        ids[i, : len(row)] = torch.tensor(row, dtype=torch.long)
        attn[i, : len(row)] = True
        ctx[i, : len(prompt)] = True
    return TokenDataset(ids, attn, ctx)


def build_dataset(corpus, tokenizer, length: int) -> TokenDataset:
    """Tokenize a :class:`~setdlm.data.corpus.Corpus` into rows of ``length`` (packed or padded)."""
    if not isinstance(length, int) or length < 2:
        raise UserError(f"context length L must be an integer >= 2, got {length!r}")
    pad = _filler(tokenizer.pad_token_id, tokenizer.eos_token_id, tokenizer.mask_token_id)
    kw = dict(bos_id=tokenizer.bos_token_id, eos_id=tokenizer.eos_token_id, pad_id=pad)
    if corpus.is_pairs:
        prompts = tokenizer.encode_batch([p for p, _ in corpus.pairs])
        comps = tokenizer.encode_batch([c for _, c in corpus.pairs])
        return pad_pairs(list(zip(prompts, comps)), length, **kw)
    return pack_documents(tokenizer.encode_batch(corpus.texts), length, **kw)


def heldout_split(n: int, eval_fraction: float, *, max_eval: int | None = None,
                  seed: int = 0) -> tuple[Tensor, Tensor]:
    """Fixed split of ``n`` rows: ``(train_index, eval_index)``, each sorted. ``round(n·eval_fraction)``
    rows (at least 1 when the fraction is positive, at most ``max_eval``) are held out, chosen by a
    permutation seeded with ``seed`` alone."""
    if not 0.0 <= eval_fraction < 1.0:
        raise UserError(f"eval_fraction must lie in [0, 1), got {eval_fraction}")
    n_eval = 0 if eval_fraction == 0 else max(1, round(n * eval_fraction))
    if max_eval is not None:
        n_eval = min(n_eval, max_eval)
    if n - n_eval < 1:
        raise UserError(f"corpus too small: {n} row(s) of context length; nothing left to train on after "
                         f"holding out {n_eval} (add text or lower the context length)")
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    return perm[n_eval:].sort().values, perm[:n_eval].sort().values
