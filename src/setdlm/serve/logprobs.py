"""Log-probabilities of the OpenAI-compatible API (docs/serve.md, "Logprobs").

* A generated token's log-probability is that of the distribution it was committed from, as the decoder
  formed it (the processed distribution of ``setdlm.decoding.sampling``: temperature, top-k/top-p, penalties
  and a constraint applied; greedy: the model's own): for AR and ``speculate="next_token"`` the next-token
  distribution, exactly; for a set decoder the conditional of the step that committed it (the step is in the
  answer's ``setdlm`` field, ``token_steps``). The alternatives (``top_logprobs``) come from the same
  distribution (:attr:`setdlm.decoding.state.DecodeConfig.top_logprobs`).
* A prompt's log-probabilities (completions' ``echo`` with ``logprobs``) are left-to-right conditionals
  ``log p(x_i | x_<i)`` computed in one forward (:func:`prompt_logprobs`): exact for AR; for SetDLM the
  two-stream forward with the reveal order set to the positions' (each token predicted from the tokens
  before it, docs/method.md §2.3), which is what the model was trained on when it draws that order. MDLM and
  BD3LM predict no token from its left context alone and are refused (``schemas``). The first token has
  nothing before it: its entry is null, as OpenAI's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from ..batch import Batch
from ..decoding.api import device_of
from ..mask_rules import MaskRule, training_mask
from ..objectives import log_probs, setdlm_inputs


@dataclass
class TokenLogprob:
    """One token of an answer with its log-probability (None: a prompt's first token) and its alternatives."""

    token: int
    logprob: float | None
    top: list[tuple[int, float]] = field(default_factory=list)  # (token, log-probability), most probable first
    step: int | None = None  # the decoding step that committed it (None: a prompt token)


@torch.inference_mode()
def prompt_logprobs(model, prompts: list[list[int]], k: int) -> list[list[TokenLogprob]]:
    """The left-to-right log-probabilities of each prompt's tokens and their ``k`` most probable alternatives,
    all prompts in one forward (padding is invisible to every row: a row's figures do not depend on the others)."""
    fam, backbone = model.family, model.backbone
    B, T = len(prompts), max(len(p) for p in prompts)
    device = device_of(backbone)
    pad = 0 if fam.mask_token_id != 0 else 1
    ids = torch.full((B, T), pad, dtype=torch.long)
    valid = torch.zeros(B, T, dtype=torch.bool)
    for b, p in enumerate(prompts):
        ids[b, : len(p)] = torch.tensor(p)
        valid[b, : len(p)] = True
    ids, valid = ids.to(device), valid.to(device)
    lp = _left_to_right(backbone, fam, ids, valid)  # (B, T, V): row i predicts position i from the tokens before it
    chosen = lp.gather(-1, ids[..., None])[..., 0].double().tolist()  # (B, T)
    top_values, top_ids = lp.topk(k, dim=-1) if k else (lp[..., :0], lp[..., :0].long())
    top_v, top_i = top_values.double().tolist(), top_ids.tolist()
    return [[TokenLogprob(t, None if i == 0 else chosen[b][i], [] if i == 0 else list(zip(top_i[b][i], top_v[b][i])))
             for i, t in enumerate(p)] for b, p in enumerate(prompts)]


def _left_to_right(backbone, fam, ids: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Log-probabilities (B, T, V) of each position given the positions before it (position 0's: unused)."""
    if fam.spec.left_to_right:  # AR: the causal forward, position i predicted at i - 1
        B, T = ids.shape
        pos = torch.arange(T, device=ids.device).expand(B, T)
        logits = backbone(ids, pos, training_mask(backbone, MaskRule("causal", valid)))
        lp = log_probs(logits, fam.mask_token_id)
        return torch.cat([lp[:, :1], lp[:, :-1]], 1)
    T = ids.shape[1]  # SetDLM: the two-stream forward in the identity reveal order, every token a query
    order = torch.arange(T, device=ids.device).expand_as(ids)
    inp = setdlm_inputs(Batch(ids, valid), order, fam.mask_token_id, scored=valid)
    logits = backbone(inp.input_ids, inp.position_ids, training_mask(backbone, inp.rule), logits_start=T)
    return log_probs(logits, fam.mask_token_id)


class Committed:
    """The log-probability of each committed position of one row, read from its steps' traces
    (:class:`~setdlm.decoding.output.StepTrace`; ``top`` when the row was decoded with ``top_logprobs``)."""

    def __init__(self, start: int, k: int):
        self.start, self.k = start, k  # the row's first generated position; the alternatives per token
        self.at: dict[int, TokenLogprob] = {}  # position → its token's figures
        self.steps = 0

    def add(self, trace) -> None:
        """Take one step's commits."""
        conf = dict(zip(trace.query_positions, trace.confidences))
        tops = dict(zip(trace.query_positions, trace.top or ()))
        for p, t in zip(trace.committed_positions, trace.committed_tokens):
            top = tops.get(p, [])
            lp = next((v for i, v in top if i == t), None)  # the same figure as its alternatives'
            if lp is None:
                lp = math.log(conf[p]) if conf[p] > 0 else -math.inf
            self.at[p] = TokenLogprob(t, lp, top[: self.k], self.steps)
        self.steps += 1

    def tokens(self, first: int, last: int) -> list[TokenLogprob]:
        """The figures of the generated tokens ``first`` to ``last`` - 1 (offsets from the first generated)."""
        return [self.at[self.start + j] for j in range(first, last)]


def token_text(tokenizer, t: int) -> str:
    """One token as text, a special token by its name."""
    try:
        return tokenizer.decode([t], skip_special_tokens=False)
    except TypeError:  # a duck-typed tokenizer without the flag
        return tokenizer.decode([t])


def _finite(v: float) -> float:
    """JSON has no -inf: a token outside the distribution (top-p cut it) gets -9999.0, as vLLM reports it."""
    return v if math.isfinite(v) else -9999.0


def completion_logprobs(tokenizer, entries: list[TokenLogprob], offset: int = 0) -> dict:
    """The completions API's ``logprobs``: ``tokens``, ``token_logprobs``, ``top_logprobs`` (a dict per token
    of its alternatives and itself, null for a prompt's first token) and ``text_offset`` (from ``offset``)."""
    out: dict[str, list] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for e in entries:
        piece = token_text(tokenizer, e.token)
        out["tokens"].append(piece)
        out["token_logprobs"].append(None if e.logprob is None else _finite(e.logprob))
        top = None
        if e.logprob is not None:
            top = {token_text(tokenizer, i): _finite(v) for i, v in e.top}
            top.setdefault(piece, _finite(e.logprob))
        out["top_logprobs"].append(top)
        out["text_offset"].append(offset)
        offset += len(piece)
    return out


def chat_logprobs(tokenizer, entries: list[TokenLogprob]) -> dict:
    """The chat API's ``logprobs``: ``{"content": [{token, logprob, bytes, top_logprobs}]}``."""
    def one(t: int, v: float) -> dict:
        piece = token_text(tokenizer, t)
        return {"token": piece, "logprob": _finite(v), "bytes": list(piece.encode("utf-8"))}

    content = []
    for e in entries:
        assert e.logprob is not None  # a generated token's (only a prompt's first token has none)
        content.append({**one(e.token, e.logprob), "top_logprobs": [one(i, v) for i, v in e.top]})
    return {"content": content, "refusal": None}
