"""Helpers for the task-evaluation and benchmark tests: a real character tokenizer for the task texts, tiny
random models, and the real backbone wrapped to script its predictions, count its forwards or slow down its
first forwards."""

from __future__ import annotations

import time

import torch
from torch import nn

from conftest import make_model
from setdlm import FamilyConfig, Model
from setdlm.data.tasks import reasoning_split
from setdlm.data.tokenizers import char_tokenizer

FAMILY_KW = {"ar": {}, "setdlm": dict(D=2), "bd3lm": dict(block_size=4), "mdlm": dict(block_size=8)}


def task_tokenizer():
    """Characters of the reasoning problems plus plain English text."""
    texts = [e.prompt + e.completion for e in reasoning_split("train", 300, level="easy")]
    return char_tokenizer(texts + ["abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ .,;:'!?-"])


def tiny(family: str, tok, L: int = 128, dtype=torch.float64, seed: int = 0) -> Model:
    """A tiny random model (random head) of ``family`` with the tokenizer ``tok``."""
    backbone = make_model(vocab=tok.vocab_size, seed=seed, dtype=dtype)
    return Model(backbone, FamilyConfig(family, length=L, mask_token_id=tok.mask_token_id, **FAMILY_KW[family]), tok)


class Scripted(nn.Module):
    """The real backbone (so that every cache works as usual) whose logits are replaced by a script: the
    prediction for canvas position ``p`` is ``script[p]`` (``filler`` past its end), at probability ≈ 1.
    AR logits at position ``p`` predict position ``p + 1``."""

    def __init__(self, inner: nn.Module, script: list[int], filler: int, ar: bool):
        super().__init__()
        self.inner, self.script, self.filler, self.shift = inner, script, filler, int(ar)
        self.train(inner.training)

    def forward(self, ids, pos, mask, cache=None, *, keep=None, logits_start=0):
        logits = self.inner(ids, pos, mask, cache, keep=keep, logits_start=logits_start)  # (B, T', V)
        table = torch.tensor(self.script + [self.filler], device=logits.device)
        target = table[(pos[:, logits_start:] + self.shift).clamp(max=len(self.script))]  # (B, T')
        return 30.0 * nn.functional.one_hot(target, logits.shape[-1]).to(logits.dtype)

    def new_cache(self, batch, capacity=64):
        return self.inner.new_cache(batch, capacity)


def scripted(model: Model, script: list[int], filler: int) -> Model:
    return Model(Scripted(model.backbone, script, filler, model.family.family == "ar"), model.family, model.tokenizer)


class Counting(nn.Module):
    """The backbone, counting its forwards (prefill included)."""

    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner, self.calls = inner, 0
        self.train(inner.training)

    def forward(self, *args, **kwargs):
        self.calls += 1
        return self.inner(*args, **kwargs)

    def new_cache(self, batch, capacity=64):
        return self.inner.new_cache(batch, capacity)


class SlowStart(Counting):
    """The backbone, sleeping ``delay`` seconds in each of its first ``slow`` forwards (a cold start)."""

    def __init__(self, inner: nn.Module, slow: int, delay: float):
        super().__init__(inner)
        self.slow, self.delay = slow, delay

    def forward(self, *args, **kwargs):
        if self.calls < self.slow:
            time.sleep(self.delay)
        return super().forward(*args, **kwargs)
