"""Helpers for the decoding tests: tiny models per family, a real character tokenizer, the real backbone
instrumented to record every call (inputs, logits, cache after the call), and from-scratch references."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from conftest import make_model
from setdlm import FamilyConfig, Model
from setdlm.model import KVCache
from setdlm.objectives import Batch, setdlm_inputs

V = 48
MASK = V - 1
PAD, BOS, EOS = 0, 1, 2
PROMPTS = [[BOS, 5, 7], [BOS, 9, 4, 11, 3, 6, 20], [BOS, 30, 8, 12, 40]]  # ragged on purpose


def tiny_model(family: str, L: int = 48, seed: int = 1, dtype=torch.float64, **fam) -> Model:
    """A float64 random model whose outputs are not all one token (larger embeddings and head)."""
    m = make_model(vocab=V, hidden=32, heads=2, layers=2, seed=seed, dtype=dtype)
    with torch.no_grad():
        m.head.weight.mul_(4)
        m.embed.weight.mul_(4)
    if family == "setdlm":
        fam.setdefault("D", 2)
    if family in ("bd3lm", "mdlm"):
        fam.setdefault("block_size", 4)
    return Model(m, FamilyConfig(family, L, MASK, **fam))


class CharTokenizer:
    """A character tokenizer: 0 PAD, 1 BOS, 2 EOS, 3 unused, letters and punctuation, MASK last."""

    chars = "abcdefghijklmnopqrstuvwxyz .,;:!?'-0123456789"[: V - 5]
    vocab_size, pad_token_id, bos_token_id, eos_token_id, mask_token_id = V, PAD, BOS, EOS, MASK

    def encode(self, text: str) -> list[int]:
        return [4 + self.chars.index(c) for c in text]

    def decode(self, ids) -> str:
        return "".join(self.chars[i - 4] for i in ids if 4 <= i < 4 + len(self.chars))


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


def active_rows(row_nfe: list[int], step: int) -> list[int]:
    """Original rows present in the batch at decoding step ``step``: finished rows leave in order."""
    return [r for r, n in enumerate(row_nfe) if n > step]



def step_logits(call, b: int, q: int):
    """Logits the decoder used for canvas position ``q`` in batch row ``b`` of a recorded call."""
    slots = (call.pos[b] == q).nonzero().flatten().tolist()
    slots = [s for s in slots if s >= call.logits_start]
    assert len(slots) == 1
    return call.logits[b, slots[0] - call.logits_start]


def assert_cache_clean(backbone, call, b, tokens, positions, block_size=None, tol=1e-9):
    """The row's cache equals a from-scratch clean-stream prefill of ``tokens`` at ``positions`` in this
    (insertion) order: causal, or block-causal for BD3LM."""
    n = len(tokens)
    assert int(call.lengths[b]) == n
    if n == 0:
        return
    assert call.cache_pos[b, :n].tolist() == positions
    ref = backbone.new_cache(1)
    pos = torch.tensor([positions])
    blk = torch.arange(n)[None] if block_size is None else pos // block_size  # insertion order / blocks
    mask = (blk[:, None, :] <= blk[:, :, None])[:, None]  # (1, 1, n, n)
    backbone(torch.tensor([tokens]), pos, mask, ref)
    for layer in range(len(ref.k)):
        assert torch.allclose(call.cache.k[layer][b, :, :n], ref.k[layer][0, :, :n], atol=tol, rtol=0)
        assert torch.allclose(call.cache.v[layer][b, :, :n], ref.v[layer][0, :, :n], atol=tol, rtol=0)


def assert_setdlm_steps_exact(bb, rec: Recorder, out, prompt_len: int, r: int, *, tol: float, mask_id: int = MASK,
                              steps: int | None = None):
    """Row ``r`` of a traced SetDLM ``generate`` (its prompt ``prompt_len`` tokens, prefilled by the first
    recorded call): at each step (the first ``steps``), every query's logits equal the from-scratch
    training forward over what was visible, and the cache equals a clean prefill of it."""
    seq, cached = out.sequences[r], list(range(prompt_len))
    for k, step in enumerate(out.trace[r][:steps]):
        call, b = rec.calls[k + 1], active_rows(out.row_nfe, k).index(r)
        clean = step.input_positions[: len(step.input_positions) - len(step.query_positions)]
        for q in step.query_positions:
            ref = setdlm_training_logits(bb, seq, cached + clean, q, mask_id=mask_id)
            assert torch.allclose(step_logits(call, b, q), ref, atol=tol, rtol=0), (r, k, q)
        cached += clean
        assert_cache_clean(bb, call, b, [seq[p] for p in cached], cached, tol=tol)


def setdlm_training_logits(backbone, seq, visible, q, mask_id=MASK):
    """Logits of the query at position ``q`` ranked right after ``visible`` (positions in reveal order) in
    the two-stream training input (SPEC §2.3–2.4); every other position is padding."""
    n_pos = max(visible + [q]) + 1
    ids = torch.zeros(1, n_pos, dtype=torch.long)
    ids[0, visible] = torch.tensor([seq[p] for p in visible])
    att = torch.zeros(1, n_pos, dtype=torch.bool)
    att[0, visible + [q]] = True
    ctx = torch.zeros_like(att)
    ctx[0, visible] = True
    rest = [p for p in range(n_pos) if p not in visible and p != q]
    inp = setdlm_inputs(Batch(ids, att, ctx), torch.tensor([visible + [q] + rest]), mask_id)
    return backbone(inp.input_ids, inp.position_ids, inp.attn_mask, logits_start=n_pos)[0, len(visible)]
