"""The real backbone wrapped for tests (not mocks: each wrapper runs the model it wraps): recording every call
(inputs, logits, cache after the call), scripting its predictions, counting its forwards, slowing down its
first forwards (a cold start), or gating each forward on a permit the test hands out."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import torch
from torch import nn

from setdlm import Model
from setdlm.model import KVCache


@dataclass
class Call:
    ids: torch.Tensor  # (B, T)
    pos: torch.Tensor  # (B, T)
    mask: torch.Tensor  # (B, 1, T, C + T)
    logits: torch.Tensor  # (B, T − logits_start, V)
    logits_start: int
    keep: object
    cache: KVCache | None  # a clone of the cache right after the call

    @property
    def lengths(self):
        return self.cache.lengths

    @property
    def cache_pos(self):
        return self.cache.positions()


class Recorder(nn.Module):
    """The real backbone with every call recorded (not a mock: it runs the wrapped model)."""

    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner
        self.calls: list[Call] = []
        self.train(inner.training)  # same mode as the wrapped model (generate restores the wrapper's mode)

    def forward(self, ids, pos, mask, cache=None, *, keep=None, logits_start=0):
        out = self.inner(ids, pos, mask, cache, keep=keep, logits_start=logits_start)
        self.calls.append(Call(ids.clone(), pos.clone(), mask.clone(), out.clone(), logits_start, keep,
                               cache.clone() if cache is not None else None))
        return out

    def new_cache(self, batch, capacity=64):
        return self.inner.new_cache(batch, capacity)


def recorded(model: Model) -> tuple[Model, Recorder]:
    rec = Recorder(model.backbone)
    return Model(rec, model.family, model.tokenizer), rec


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


class Gated(Counting):
    """The backbone, each forward waiting for a permit the test hands out (:meth:`allow`): a decode advances
    exactly as far as the test lets it, whatever the machine's speed. :meth:`open` lets every forward run."""

    def __init__(self, inner: nn.Module):
        super().__init__(inner)
        self._permits = threading.Semaphore(0)
        self._done = threading.Condition()
        self.arrived = 0  # forwards that reached the gate
        self.returned = 0  # forwards finished

    def allow(self, n: int = 1) -> None:
        self._permits.release(n)

    def open(self) -> None:
        self._permits.release(1_000_000)

    def wait_held(self, n: int, timeout: float = 60.0) -> None:
        """Block until ``n`` forwards have returned and the next one waits at the gate (the timeout only
        guards against a hang)."""
        with self._done:
            if not self._done.wait_for(lambda: self.returned >= n and self.arrived > n, timeout):
                raise TimeoutError(f"the backbone finished {self.returned} forwards, {self.arrived} arrived; "
                                   f"expected {n} and one more held")

    def forward(self, *args, **kwargs):
        with self._done:
            self.arrived += 1
            self._done.notify_all()
        self._permits.acquire()
        out = super().forward(*args, **kwargs)
        with self._done:
            self.returned += 1
            self._done.notify_all()
        return out


def gated(model: Model) -> tuple[Model, Gated]:
    g = Gated(model.backbone)
    return Model(g, model.family, model.tokenizer), g


class Failing(Counting):
    """The backbone, raising ``RuntimeError`` in a forward for which ``when(call, ids, pos)`` holds (``call``
    counts from 1, ``ids`` (B, T) are its inputs at canvas positions ``pos`` (B, T); a padding slot sits at
    the trash column, the canvas width, and its id is a leftover): a decode that fails for some rows only."""

    def __init__(self, inner: nn.Module, when):
        super().__init__(inner)
        self.when = when

    def forward(self, ids, pos, *args, **kwargs):
        if self.when(self.calls + 1, ids, pos):
            self.calls += 1
            raise RuntimeError(f"forward {self.calls} failed (as the test asked)")
        return super().forward(ids, pos, *args, **kwargs)


def failing(model: Model, when) -> Model:
    return Model(Failing(model.backbone, when), model.family, model.tokenizer)


def committed_only_by(model: Model, rows, bad: int, first_step: int = 0) -> tuple[int, int]:
    """A (canvas position, token) that row ``bad`` of ``rows`` ((prompt, generate's keywords) each, decoded
    alone) commits before its last step, at step ``first_step`` or later, and no other row ever holds: a
    :class:`Failing` backbone that raises on inputs holding it fails the steps of that row only (a committed
    token is an input of the row's next forwards)."""
    from setdlm.decoding import generate

    outs = [generate(model, p, trace=True, **kw) for p, kw in rows]
    others = {(k, t) for i, o in enumerate(outs) if i != bad for k, t in enumerate(o.sequences[0])}
    steps = outs[bad].trace[0][first_step:-1]
    early = [(k, t) for s in steps for k, t in zip(s.committed_positions, s.committed_tokens)]
    return next(kt for kt in early if kt not in others)
