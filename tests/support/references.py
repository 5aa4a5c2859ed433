"""From-scratch references for the decoding tests: a traced decode's logits and cache, step by step, against
the two-stream training forward and a clean prefill (docs/concepts.md, "Two-stream training and the set-causal
mask"; paper Sec. 3)."""

from __future__ import annotations

import torch

from setdlm.masks import bd3lm_two_stream_mask
from setdlm.objectives import Batch, log_probs, setdlm_inputs

from .recording import Recorder
from .tokenizers import MASK


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


def assert_bd3lm_steps_exact(bb, rec: Recorder, out, r: int, resolved, *, block_size: int, prefilled: int,
                             tol: float, mask_id: int = MASK, steps: int | None = None):
    """Row ``r`` of a traced BD3LM decode (``resolved``: its positions visible before decoding; ``prefilled``:
    the recorded calls before the first step): each step (the first ``steps``) queries one block, its logits
    equal the two-stream forward over the sequence so far, and the cache holds the clean blocks before the
    current one, block-causally."""
    S, seq, resolved = block_size, out.sequences[r], set(resolved)
    for k, step in enumerate(out.trace[r][:steps]):
        call, b = rec.calls[k + prefilled], active_rows(out.row_nfe, k).index(r)
        start = step.query_positions[0] // S * S
        assert all(start <= q < start + S for q in step.query_positions)  # one block at a time
        end = min(start + S, len(seq))
        x = torch.tensor([seq[:end]])
        xt = torch.tensor([[t if p in resolved else mask_id for p, t in enumerate(seq[:end])]])
        pos = torch.arange(end)[None]
        ref = bb(torch.cat([x, xt], 1), torch.cat([pos, pos], 1),
                 bd3lm_two_stream_mask(torch.ones(1, end, dtype=torch.bool), S), logits_start=end)[0]
        for q in step.query_positions:
            assert torch.allclose(step_logits(call, b, q), ref[q], atol=tol, rtol=0), (r, k, q)
        assert_cache_clean(bb, call, b, seq[:start], list(range(start)), block_size=S, tol=tol)
        resolved |= set(step.committed_positions)


@torch.no_grad()
def left_to_right_setdlm(backbone, prompt: list[int], n: int, mask_id: int = MASK) -> list[int]:
    """``n`` greedy tokens after ``prompt``, each from a full two-stream training forward in the identity order
    (the reference of SetDLM with D = M = w = 1)."""
    seq = list(prompt)
    for _ in range(n):
        k = len(seq)
        batch = Batch(torch.tensor([seq + [0]]), torch.ones(1, k + 1, dtype=torch.bool),
                      torch.tensor([[True] * k + [False]]))
        inp = setdlm_inputs(batch, torch.arange(k + 1)[None], mask_id)
        logits = backbone(inp.input_ids, inp.position_ids, inp.attn_mask, logits_start=k + 1)[0, k]
        seq.append(int(log_probs(logits, mask_id).argmax()))
    return seq[len(prompt):]


def setdlm_training_logits(backbone, seq, visible, q, mask_id=MASK):
    """Logits of the query at position ``q`` ranked right after ``visible`` (positions in reveal order) in
    the two-stream training input (docs/concepts.md); every other position is padding."""
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


def session_results(session, limit: int = 40) -> dict:
    """Step ``session`` until no row is left (at most ``limit`` steps): each finished row's result, by row."""
    done = {}
    for _ in range(limit):
        for ev in session.step():
            if ev.done is not None:
                done[ev.row] = ev.done
        if not len(session):
            break
    return done
